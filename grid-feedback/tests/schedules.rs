//! Random schedules of the whole exchange: a gateway reporter and an operator receiver
//! joined by a network that loses, delays and duplicates requests and acknowledgments,
//! storage that conflicts, fails, or fails after writing, poller reloads, gateway process
//! restarts and operator restarts (the receiver serialized and reloaded).
//!
//! Invariants checked after every step:
//! - no loss: while a gateway process lives, every skew drop it folded is either in the
//!   persisted store (its counter reached) or held by a pending rejected report;
//! - no stale clearing: a reporter with nothing pending agrees exactly with the store, so
//!   an acknowledgment of an older clean report never cleared newer bad evidence;
//! - genuineness: every record the receiver holds is a report its process really sent, so
//!   a forged decreasing counter, changed duplicate or replay never got in;
//! - monotonicity: the receiver's per-process sequence and counter never go backwards and
//!   a sequence never changes content;
//! - every 204 is sent only when the store holds the report it names.

use std::collections::{HashMap, HashSet};

use grid_feedback::{Caller, MAX_REPORTERS};
use grid_feedback::{
    ConditionStatus, Cycle, Epoch, ExchangeId, Outcome, Receiver, ReceiverInput, ReceiverMetrics,
    ReceiverState, RefusalReason, Replica, Reply, Report, Reporter, ReporterInput, ReporterMetrics,
    Request, RequestId, Write, WriteOutcome, deadline_for,
};
use proptest::prelude::*;

const T0: u64 = 1_700_000_000_000;

#[derive(Clone, Copy, Debug)]
enum Fate {
    Persisted,
    Conflict,
    Failed,
    /// Storage kept the write but the daemon could not verify it.
    FailedButWritten,
}

#[derive(Clone, Copy, Debug)]
enum Forge {
    ChangedDuplicate,
    DecreasingCounter,
    Replay,
}

#[derive(Clone, Debug)]
enum Step {
    Cycle(u64),
    FetchFailed,
    Send,
    Deliver { pick: usize, keep_copy: bool },
    DropRequest(usize),
    Write(Fate),
    Return { pick: usize, keep_copy: bool },
    DropResponse(usize),
    Advance(u64),
    ReporterReload,
    ReporterRestart,
    OperatorRestart,
    Forge { kind: Forge, pick: usize },
}

fn step() -> impl Strategy<Value = Step> {
    let drops = prop_oneof![
        4 => Just(0u64),
        3 => 1u64..=5,
        1 => (u64::MAX / 2)..=u64::MAX,
    ];
    let fate = prop_oneof![
        5 => Just(Fate::Persisted),
        2 => Just(Fate::Conflict),
        1 => Just(Fate::Failed),
        1 => Just(Fate::FailedButWritten),
    ];
    let forge = prop_oneof![
        Just(Forge::ChangedDuplicate),
        Just(Forge::DecreasingCounter),
        Just(Forge::Replay),
    ];
    prop_oneof![
        6 => drops.prop_map(Step::Cycle),
        1 => Just(Step::FetchFailed),
        6 => Just(Step::Send),
        6 => (any::<usize>(), prop::bool::weighted(0.2))
            .prop_map(|(pick, keep_copy)| Step::Deliver { pick, keep_copy }),
        1 => any::<usize>().prop_map(Step::DropRequest),
        6 => fate.prop_map(Step::Write),
        6 => (any::<usize>(), prop::bool::weighted(0.2))
            .prop_map(|(pick, keep_copy)| Step::Return { pick, keep_copy }),
        1 => any::<usize>().prop_map(Step::DropResponse),
        2 => (0u64..8_000).prop_map(Step::Advance),
        1 => Just(Step::ReporterReload),
        1 => Just(Step::ReporterRestart),
        1 => Just(Step::OperatorRestart),
        1 => (forge, any::<usize>()).prop_map(|(kind, pick)| Step::Forge { kind, pick }),
    ]
}

/// A request on its way to the operator.
#[derive(Clone, Debug)]
struct Outbound {
    epoch: Epoch,
    exchange: ExchangeId,
    headers: Vec<(String, String)>,
}

/// A response on its way back to the gateway.
#[derive(Clone, Debug)]
struct Inbound {
    epoch: Epoch,
    exchange: ExchangeId,
    status: u16,
    headers: Vec<(String, String)>,
}

struct World {
    now: u64,
    /// What storage really holds, serialized as a daemon would write it.
    store: Option<String>,
    receiver: Receiver,
    receiver_metrics: ReceiverMetrics,
    write: Option<Write>,
    reporter: Reporter,
    reporter_metrics: ReporterMetrics,
    processes: u64,
    to_operator: Vec<Outbound>,
    to_gateway: Vec<Inbound>,
    routes: HashMap<RequestId, (Epoch, ExchangeId)>,
    forged: HashSet<RequestId>,
    next_request: u64,
    /// Per epoch: the largest cumulative count folded from a bad cycle.
    max_bad: HashMap<Epoch, u64>,
    /// Every report each process transmitted: (sequence, rejected, clean).
    sent: HashMap<Epoch, HashSet<(u64, u64, bool)>>,
    /// Per epoch: the newest durable (sequence, rejected, clean) the receiver has shown.
    durable_seen: HashMap<Epoch, (u64, u64, bool)>,
    forged_refused: u64,
}

fn epoch_of(process: u64) -> Epoch {
    // Distinct nonzero values spread over the range, like random draws would be.
    Epoch::new(process.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1).unwrap()
}

fn headers_of(report: &Report) -> Vec<(String, String)> {
    report
        .headers()
        .iter()
        .map(|(n, v)| ((*n).to_owned(), v.clone()))
        .collect()
}

fn borrowed(headers: &[(String, String)]) -> Vec<(&[u8], &[u8])> {
    headers
        .iter()
        .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
        .collect()
}

impl World {
    fn new() -> Self {
        let receiver_metrics = ReceiverMetrics::default();
        let reporter_metrics = ReporterMetrics::default();
        Self {
            now: T0,
            store: None,
            receiver: Receiver::new(T0, receiver_metrics.clone()),
            receiver_metrics,
            write: None,
            reporter: Reporter::new(
                epoch_of(1),
                Replica::new("gw-1").unwrap(),
                reporter_metrics.clone(),
            ),
            reporter_metrics,
            processes: 1,
            to_operator: Vec::new(),
            to_gateway: Vec::new(),
            routes: HashMap::new(),
            forged: HashSet::new(),
            next_request: 0,
            max_bad: HashMap::new(),
            sent: HashMap::new(),
            durable_seen: HashMap::new(),
            forged_refused: 0,
        }
    }

    fn stored(&self) -> Option<ReceiverState> {
        self.store
            .as_ref()
            .map(|json| serde_json::from_str(json).expect("the store holds valid state"))
    }

    fn cycle(&mut self, cycle: Cycle) {
        self.reporter.handle(self.now, ReporterInput::Cycle(cycle));
        if let Cycle::Committed { skew_drops } = cycle
            && skew_drops > 0
        {
            self.max_bad
                .insert(self.reporter.epoch(), self.reporter.cumulative());
        }
    }

    fn send(&mut self) {
        if let Some(transmit) = self.reporter.poll_transmit(self.now) {
            let r = &transmit.report;
            self.sent
                .entry(r.epoch())
                .or_default()
                .insert((r.sequence(), r.rejected(), r.clean()));
            self.to_operator.push(Outbound {
                epoch: r.epoch(),
                exchange: transmit.exchange,
                headers: headers_of(r),
            });
        }
    }

    /// Hands a request to the receiver; `route` says where its answer goes.
    fn receive(&mut self, headers: &[(String, String)], route: Option<(Epoch, ExchangeId)>) {
        let id = RequestId(self.next_request);
        self.next_request += 1;
        match route {
            Some(route) => {
                self.routes.insert(id, route);
            }
            None => {
                self.forged.insert(id);
            }
        }
        let pairs = borrowed(headers);
        self.receiver.handle(
            self.now,
            ReceiverInput::Request(Request {
                id,
                caller: Caller::Local,
                headers: &pairs,
                body: b"",
                deadline_ms: deadline_for(self.now),
            }),
        );
        self.after_receiver();
    }

    fn deliver(&mut self, pick: usize, keep_copy: bool) {
        if self.to_operator.is_empty() {
            return;
        }
        let index = pick % self.to_operator.len();
        let outbound = if keep_copy {
            self.to_operator[index].clone()
        } else {
            self.to_operator.remove(index)
        };
        self.receive(&outbound.headers, Some((outbound.epoch, outbound.exchange)));
    }

    fn finish_write(&mut self, fate: Fate) {
        let Some(write) = self.write.take() else {
            return;
        };
        let outcome = match fate {
            Fate::Persisted => {
                self.store = Some(serde_json::to_string(&write.state).unwrap());
                WriteOutcome::Persisted
            }
            Fate::FailedButWritten => {
                self.store = Some(serde_json::to_string(&write.state).unwrap());
                WriteOutcome::Failed
            }
            Fate::Conflict => WriteOutcome::Conflict,
            Fate::Failed => WriteOutcome::Failed,
        };
        self.receiver.handle(
            self.now,
            ReceiverInput::WriteResult {
                write: write.id,
                outcome,
            },
        );
        self.after_receiver();
    }

    /// Collects what the receiver wants done; checks every answer as it leaves.
    fn after_receiver(&mut self) {
        if let Some(write) = self.receiver.poll_write() {
            assert!(self.write.is_none(), "one write at a time");
            self.write = Some(write);
        }
        while let Some(response) = self.receiver.poll_response() {
            if self.forged.remove(&response.request) {
                match &response.reply {
                    Reply::Refuse(error) => {
                        let reason = error.refusal().unwrap();
                        assert!(
                            matches!(
                                reason,
                                RefusalReason::Replay
                                    | RefusalReason::ChangedDuplicate
                                    | RefusalReason::DecreasingCounter
                                    | RefusalReason::Deadline
                            ),
                            "forged request refused for {reason:?}"
                        );
                        self.forged_refused += 1;
                    }
                    Reply::Acknowledge(ack) => panic!("forged report acknowledged: {ack:?}"),
                }
                continue;
            }
            if let Reply::Acknowledge(ack) = &response.reply {
                let stored = self.stored().expect("a 204 implies a store");
                let record = stored
                    .reporter(ack.epoch)
                    .expect("a 204 implies the process's record is stored");
                assert!(
                    record.sequence >= ack.sequence,
                    "204 for {ack:?} while the store holds sequence {}",
                    record.sequence
                );
            }
            let Some((epoch, exchange)) = self.routes.remove(&response.request) else {
                continue;
            };
            let reply = &response.reply;
            self.to_gateway.push(Inbound {
                epoch,
                exchange,
                status: reply.status(),
                headers: reply
                    .headers()
                    .into_iter()
                    .map(|(n, v)| (n.to_owned(), v))
                    .collect(),
            });
        }
    }

    fn give_back(&mut self, pick: usize, keep_copy: bool) {
        if self.to_gateway.is_empty() {
            return;
        }
        let index = pick % self.to_gateway.len();
        let inbound = if keep_copy {
            self.to_gateway[index].clone()
        } else {
            self.to_gateway.remove(index)
        };
        if inbound.epoch != self.reporter.epoch() {
            return; // that process is gone
        }
        let pairs = borrowed(&inbound.headers);
        self.reporter.handle(
            self.now,
            ReporterInput::Response {
                exchange: inbound.exchange,
                outcome: Outcome::Http {
                    status: inbound.status,
                    headers: &pairs,
                },
            },
        );
    }

    fn advance(&mut self, ms: u64) {
        self.now += ms;
        if self.reporter.poll_timeout().is_some_and(|t| t <= self.now) {
            self.reporter.handle(self.now, ReporterInput::Timeout);
        }
        if self.receiver.poll_timeout().is_some_and(|t| t <= self.now) {
            self.receiver.handle(self.now, ReceiverInput::Timeout);
            self.after_receiver();
        }
    }

    fn restart_operator(&mut self) {
        self.receiver_metrics = ReceiverMetrics::default();
        self.receiver = match self.stored() {
            Some(state) => Receiver::restore(state, self.now, self.receiver_metrics.clone())
                .expect("the receiver reloads what it wrote"),
            None => Receiver::new(self.now, self.receiver_metrics.clone()),
        };
        // The old process's connections and its write die with it.
        self.write = None;
        self.routes.clear();
        self.forged.clear();
    }

    fn restart_reporter(&mut self) {
        if self.processes as usize >= MAX_REPORTERS / 2 {
            return; // stay clear of capacity eviction, which has its own unit tests
        }
        self.processes += 1;
        let old = self.reporter.epoch();
        self.to_operator.retain(|o| o.epoch != old);
        self.reporter = Reporter::new(
            epoch_of(self.processes),
            Replica::new(&format!("gw-{}", self.processes)).unwrap(),
            self.reporter_metrics.clone(),
        );
    }

    fn forge(&mut self, kind: Forge, pick: usize) {
        let state = self.receiver.state().clone();
        if state.reporters.is_empty() {
            return;
        }
        let record = &state.reporters[pick % state.reporters.len()];
        let (sequence, rejected) = match kind {
            Forge::ChangedDuplicate => (
                record.sequence,
                if record.rejected == 0 {
                    1
                } else {
                    record.rejected - 1
                },
            ),
            Forge::DecreasingCounter if record.sequence < u64::MAX && record.rejected > 0 => {
                (record.sequence + 1, record.rejected - 1)
            }
            Forge::Replay if record.sequence > 0 => (record.sequence - 1, record.rejected),
            _ => return,
        };
        let report = Report::new(
            record.epoch,
            sequence,
            rejected,
            false,
            record.replica.clone(),
        )
        .unwrap();
        self.receive(&headers_of(&report), None);
    }

    fn apply(&mut self, step: &Step) {
        match *step {
            Step::Cycle(skew_drops) => self.cycle(Cycle::Committed { skew_drops }),
            Step::FetchFailed => self.cycle(Cycle::FetchFailed),
            Step::Send => self.send(),
            Step::Deliver { pick, keep_copy } => self.deliver(pick, keep_copy),
            Step::DropRequest(pick) => {
                if !self.to_operator.is_empty() {
                    let index = pick % self.to_operator.len();
                    self.to_operator.remove(index);
                }
            }
            Step::Write(fate) => self.finish_write(fate),
            Step::Return { pick, keep_copy } => self.give_back(pick, keep_copy),
            Step::DropResponse(pick) => {
                if !self.to_gateway.is_empty() {
                    let index = pick % self.to_gateway.len();
                    self.to_gateway.remove(index);
                }
            }
            Step::Advance(ms) => self.advance(ms),
            Step::ReporterReload => {
                // `into_handover` consumes the reporter, as a committed reload does.
                let placeholder = Reporter::new(
                    Epoch::new(u64::MAX).unwrap(),
                    Replica::new("placeholder").unwrap(),
                    ReporterMetrics::default(),
                );
                let handover = std::mem::replace(&mut self.reporter, placeholder).into_handover();
                self.reporter = Reporter::resume(handover, self.reporter_metrics.clone());
            }
            Step::ReporterRestart => self.restart_reporter(),
            Step::OperatorRestart => self.restart_operator(),
            Step::Forge { kind, pick } => self.forge(kind, pick),
        }
    }

    fn check(&mut self) {
        let stored = self.stored();
        let live = self.reporter.epoch();
        let stored_live = stored.as_ref().and_then(|s| s.reporter(live)).cloned();

        // No loss.
        if let Some(&max_bad) = self.max_bad.get(&live) {
            let covered = stored_live
                .as_ref()
                .is_some_and(|r| r.rejected >= max_bad || r.is_terminal());
            let retained = self.reporter.pending().is_some_and(|p| !p.clean())
                && self.reporter.cumulative() >= max_bad;
            assert!(
                covered || retained,
                "drops up to {max_bad} neither stored ({stored_live:?}) nor pending ({:?})",
                self.reporter.pending()
            );
        }

        // No stale clearing: nothing pending means the store says exactly what the
        // last acknowledged report said.
        if self.reporter.pending().is_none()
            && let Some(acked) = self.reporter.acknowledged()
        {
            let record = stored_live.as_ref().expect("acknowledged implies stored");
            assert_eq!(
                (record.sequence, record.rejected, record.clean),
                (acked.sequence(), acked.rejected(), acked.clean())
            );
            assert_eq!(record.unresolved_since_ms.is_some(), !acked.clean());
            if !self.reporter.is_latched() {
                assert_eq!(record.rejected, self.reporter.cumulative());
            }
        }

        // Genuineness, monotonicity and the condition, on the durable state.
        let durable = self.receiver.state();
        for record in &durable.reporters {
            let key = (record.sequence, record.rejected, record.clean);
            assert!(
                self.sent
                    .get(&record.epoch)
                    .is_some_and(|sent| sent.contains(&key)),
                "durable record {record:?} was never sent"
            );
            if let Some(&(sequence, rejected, clean)) = self.durable_seen.get(&record.epoch) {
                assert!(record.sequence >= sequence && record.rejected >= rejected);
                if record.sequence == sequence {
                    assert_eq!((record.rejected, record.clean), (rejected, clean));
                }
            }
            self.durable_seen.insert(record.epoch, key);
        }
        let unresolved = durable
            .reporters
            .iter()
            .filter(|r| r.unresolved_since_ms.is_some())
            .count();
        assert_eq!(durable.condition.unresolved_replicas as usize, unresolved);
        assert_eq!(
            durable.condition.status == ConditionStatus::True,
            unresolved > 0
        );
    }

    /// A calm network and healthy storage until everything settles.
    fn drain(&mut self) {
        for _ in 0..8 {
            while self.write.is_some() {
                self.finish_write(Fate::Persisted);
            }
            while !self.to_operator.is_empty() {
                self.deliver(0, false);
                while self.write.is_some() {
                    self.finish_write(Fate::Persisted);
                }
            }
            while !self.to_gateway.is_empty() {
                self.give_back(0, false);
            }
            self.advance(10_000);
            self.cycle(Cycle::Committed { skew_drops: 0 });
            self.send();
            self.check();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn no_schedule_loses_evidence_or_lets_a_stale_or_forged_report_win(
        steps in prop::collection::vec(step(), 1..160)
    ) {
        let mut world = World::new();
        for step in &steps {
            world.apply(step);
            world.check();
        }
        let dead_before: Vec<_> = world
            .receiver
            .state()
            .reporters
            .iter()
            .filter(|r| r.epoch != world.reporter.epoch())
            .map(|r| r.epoch)
            .collect();
        world.drain();

        // Settled: the live process has nothing pending and its evidence (if any) is
        // resolved unless latched; silent dead processes keep whatever they left.
        prop_assert!(world.reporter.pending().is_none());
        let live = world.reporter.epoch();
        let state = world.receiver.state().clone();
        if let Some(record) = state.reporter(live) {
            prop_assert!(record.unresolved_since_ms.is_none() || record.is_terminal());
        }
        let dead_unresolved = state
            .reporters
            .iter()
            .filter(|r| r.epoch != live && r.unresolved_since_ms.is_some())
            .count();
        prop_assert_eq!(
            state.condition.status == ConditionStatus::True,
            dead_unresolved > 0 || state.reporter(live).is_some_and(grid_feedback::ReporterRecord::is_terminal)
        );
        for epoch in dead_before {
            prop_assert!(state.reporter(epoch).is_some(), "dead process's record kept");
        }
    }
}

#[test]
fn a_dead_process_keeps_its_unresolved_evidence_through_silence_and_operator_restarts() {
    let mut world = World::new();
    world.cycle(Cycle::Committed { skew_drops: 3 });
    world.send();
    world.deliver(0, false);
    world.finish_write(Fate::Persisted);
    world.restart_reporter();
    for _ in 0..5 {
        world.drain();
        world.restart_operator();
    }
    let state = world.receiver.state();
    let dead = state.reporter(epoch_of(1)).unwrap();
    assert!(dead.unresolved_since_ms.is_some());
    assert_eq!(state.condition.status, ConditionStatus::True);
    assert_eq!(state.condition.unresolved_replicas, 1);
    assert!(state.condition.message.contains("gw-1"));
}

#[test]
fn forged_reports_are_refused_in_a_settled_world() {
    let mut world = World::new();
    world.cycle(Cycle::Committed { skew_drops: 2 });
    world.drain();
    for kind in [
        Forge::ChangedDuplicate,
        Forge::DecreasingCounter,
        Forge::Replay,
    ] {
        world.forge(kind, 0);
        world.check();
    }
    assert_eq!(world.forged_refused, 3);
    assert!(world.write.is_none());
}
