//! The operator's end: admits reports, decides what they mean for each reporter identity,
//! and asks the daemon to persist the result before any 204 goes out.
//!
//! # Driving it
//!
//! ```text
//! request --handle(Request)--> [queue] --(writer idle)--> poll_write: Write { state }
//!                                                             | daemon persists it
//!                    handle(WriteResult { outcome }) <--------+
//!                                 |
//!                          poll_response: 204 echo / refusal
//! poll_timeout --> handle(Timeout): requests past their INGEST_BUDGET deadline are refused
//! ```
//!
//! One write is in flight at a time (the single writer); requests that arrive meanwhile
//! wait in a bounded queue and are folded into the next write together. A 204 is produced
//! only by a `Persisted` result for a write that contains the report, or for an exact
//! duplicate of a report already persisted.

use std::collections::VecDeque;
use std::time::Duration;

use crate::metrics::{Event, ReceiverMetrics};
use crate::record::{RESOLVED_RETENTION_MS, ReporterRecord, UNRESOLVED_RETENTION_MS};
use crate::state::ReceiverState;
use crate::{Ack, Condition, Error, Report, parse_report};

/// Persisted reporter identities. A new identity beyond it evicts the stalest resolved
/// one; if every slot is unresolved it is refused and counted `overflow`.
pub const MAX_REPORTERS: usize = 64;
/// Requests waiting for the writer; matches the signals listener's 256-connection limit.
pub const MAX_QUEUED_REQUESTS: usize = 256;
/// Write attempts per batch when storage reports a resource-version conflict.
pub const MAX_WRITE_ATTEMPTS: u8 = 3;
/// The whole server operation's budget: body read, admission, queueing and every write
/// attempt. The daemon computes each request's deadline with [`deadline_for`] when the
/// request arrives, enforces it on its I/O, and feeds [`ReceiverInput::Timeout`] at
/// [`Receiver::poll_timeout`].
pub const INGEST_BUDGET: Duration = Duration::from_secs(5);

/// The deadline of a request that arrived at `received_ms` (ms since the Unix epoch).
pub fn deadline_for(received_ms: u64) -> u64 {
    received_ms.saturating_add(INGEST_BUDGET.as_millis() as u64)
}

/// The daemon's handle on one request; unique among outstanding requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RequestId(pub u64);

/// Names one write attempt, so a late result of an abandoned attempt is ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WriteId(u64);

/// Who is calling, as the daemon decided from the verified TLS client certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Caller {
    /// The site's own certificate: its gateway.
    Local,
    /// Any other trusted certificate: a peer site, which may poll but not report.
    Peer,
}

/// Header pairs as the daemon collected them (`HeaderName::as_str().as_bytes()`,
/// `HeaderValue::as_bytes()`).
pub type HeaderList<'a> = &'a [(&'a [u8], &'a [u8])];

/// One `POST /v1/site/signals/ingest`.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The daemon's handle, echoed in the [`Response`].
    pub id: RequestId,
    /// Decided from the TLS certificate, never from a header.
    pub caller: Caller,
    /// Every request header.
    pub headers: HeaderList<'a>,
    /// The body read so far; the daemon need read at most one byte.
    pub body: &'a [u8],
    /// [`deadline_for`] the arrival time.
    pub deadline_ms: u64,
}

/// What storage said about a [`Write`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteOutcome {
    /// Written and verified (file: written, fsynced, renamed; Kubernetes: 2xx with the
    /// status read back as sent).
    Persisted,
    /// Kubernetes 409: the resource version moved. The receiver decides whether to retry.
    Conflict,
    /// Any other error, or a response that could not be verified.
    Failed,
}

/// Inputs of [`Receiver::handle`].
#[derive(Clone, Copy, Debug)]
pub enum ReceiverInput<'a> {
    /// A request arrived.
    Request(Request<'a>),
    /// The daemon finished a [`Write`].
    WriteResult {
        /// [`Write::id`].
        write: WriteId,
        /// What storage said.
        outcome: WriteOutcome,
    },
    /// [`Receiver::poll_timeout`] was reached.
    Timeout,
}

/// "Persist this state, then feed back the result": the whole persisted state, reports
/// and condition together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// Feed back in [`ReceiverInput::WriteResult`].
    pub id: WriteId,
    /// 1-based; at most [`MAX_WRITE_ATTEMPTS`]. A retry after a conflict is a new write
    /// with the same state: the daemon re-reads the resource version and writes again.
    pub attempt: u8,
    /// What to store.
    pub state: ReceiverState,
}

/// The answer to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// Which request.
    pub request: RequestId,
    /// What to answer.
    pub reply: Reply,
}

/// A 204 echo or a typed refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// 204 with the report's epoch and sequence echoed: it is persisted.
    Acknowledge(Ack),
    /// The refusal's [`crate::RefusalReason::status`], with `x-grid-ingest-refusal`.
    Refuse(Error),
}

impl Reply {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            Self::Acknowledge(_) => 204,
            Self::Refuse(error) => error.refusal().map_or(500, crate::RefusalReason::status),
        }
    }

    /// The response headers (the body is always empty).
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        match self {
            Self::Acknowledge(ack) => ack.headers().to_vec(),
            Self::Refuse(error) => error
                .refusal()
                .map(|r| (crate::HEADER_REFUSAL, r.as_str().to_owned()))
                .into_iter()
                .collect(),
        }
    }
}

/// A request admitted and waiting for (or riding in) a write.
#[derive(Clone, Debug)]
struct Queued {
    id: RequestId,
    report: Report,
    deadline_ms: u64,
}

/// The one write in flight.
#[derive(Debug)]
struct InFlight {
    id: WriteId,
    attempt: u8,
    state: ReceiverState,
    /// Requests answered 204 when this write is persisted; may be empty once all expired,
    /// but the result still matters: a persisted write becomes the durable state.
    members: Vec<Queued>,
    announced: bool,
    /// Unresolved records this write retires for silence, counted once it is persisted.
    expired: u64,
}

/// How a report changes one reporter's record.
enum Applied {
    Changed,
    Duplicate,
}

/// The operator-side state machine.
#[derive(Debug)]
pub struct Receiver {
    /// The last state storage confirmed: what a restart would reload.
    durable: ReceiverState,
    queue: VecDeque<Queued>,
    write: Option<InFlight>,
    responses: VecDeque<Response>,
    next_write: u64,
    metrics: ReceiverMetrics,
}

impl Receiver {
    /// A receiver with no reporters, for an operator that has never persisted feedback.
    pub fn new(now_ms: u64, metrics: ReceiverMetrics) -> Self {
        Self::with_durable(
            ReceiverState {
                reporters: Vec::new(),
                condition: Condition::derive(&[], None, now_ms, 0),
            },
            metrics,
        )
    }

    /// Resumes from persisted state after an operator restart. The condition is derived
    /// again from the records (keeping its transition time when the status agrees), so a
    /// stored condition can never contradict the evidence it is about.
    pub fn restore(
        state: ReceiverState,
        now_ms: u64,
        metrics: ReceiverMetrics,
    ) -> Result<Self, Error> {
        if state.reporters.len() > MAX_REPORTERS {
            return Err(Error::InvalidState {
                field: "reporters",
                problem: "more records than MAX_REPORTERS",
            });
        }
        if state.reporters.windows(2).any(|w| w[0].epoch >= w[1].epoch) {
            return Err(Error::InvalidState {
                field: "reporters",
                problem: "not strictly sorted by epoch",
            });
        }
        for record in &state.reporters {
            if record.clean && record.is_terminal() {
                return Err(Error::InvalidState {
                    field: "reporters.clean",
                    problem: "clean at the maximum sequence or counter",
                });
            }
            if !record.clean && record.unresolved_since_ms.is_none() {
                return Err(Error::InvalidState {
                    field: "reporters.unresolvedSinceMs",
                    problem: "a rejected report with resolved evidence",
                });
            }
        }
        let condition = Condition::derive(&state.reporters, Some(&state.condition), now_ms, 0);
        Ok(Self::with_durable(
            ReceiverState {
                reporters: state.reporters,
                condition,
            },
            metrics,
        ))
    }

    fn with_durable(durable: ReceiverState, metrics: ReceiverMetrics) -> Self {
        Self {
            durable,
            queue: VecDeque::new(),
            write: None,
            responses: VecDeque::new(),
            next_write: 0,
            metrics,
        }
    }

    /// The last state storage confirmed.
    pub fn state(&self) -> &ReceiverState {
        &self.durable
    }

    /// The persisted `GatewayAgesRejected`.
    pub fn condition(&self) -> &Condition {
        &self.durable.condition
    }

    /// Whether a write is in flight or requests are waiting.
    pub fn is_busy(&self) -> bool {
        self.write.is_some() || !self.queue.is_empty()
    }

    /// Feeds one input. `now_ms` is wall-clock milliseconds since the Unix epoch: it
    /// stamps freshness and the condition's transition time, and is compared with
    /// request deadlines.
    pub fn handle(&mut self, now_ms: u64, input: ReceiverInput<'_>) {
        match input {
            ReceiverInput::Request(request) => self.on_request(now_ms, &request),
            ReceiverInput::WriteResult { write, outcome } => {
                self.on_write_result(now_ms, write, outcome);
            }
            ReceiverInput::Timeout => self.expire(now_ms),
        }
        self.pump(now_ms);
    }

    /// The write to perform now, once per attempt.
    pub fn poll_write(&mut self) -> Option<Write> {
        let write = self.write.as_mut().filter(|w| !w.announced)?;
        write.announced = true;
        Some(Write {
            id: write.id,
            attempt: write.attempt,
            state: write.state.clone(),
        })
    }

    /// The next answer to send.
    pub fn poll_response(&mut self) -> Option<Response> {
        self.responses.pop_front()
    }

    /// The earliest deadline among requests not yet answered.
    pub fn poll_timeout(&self) -> Option<u64> {
        let members = self.write.iter().flat_map(|w| w.members.iter());
        self.queue
            .iter()
            .chain(members)
            .map(|q| q.deadline_ms)
            .min()
    }

    fn on_request(&mut self, now_ms: u64, request: &Request<'_>) {
        if request.caller != Caller::Local {
            self.metrics.event(Event::Unauthorized);
            self.refuse(request.id, Error::Unauthorized);
            return;
        }
        let report = match parse_report(request.headers.iter().copied(), request.body) {
            Ok(report) => report,
            Err(error) => return self.refuse(request.id, error),
        };
        if request.deadline_ms <= now_ms {
            return self.refuse(request.id, deadline_error());
        }
        if self.queue.len() >= MAX_QUEUED_REQUESTS {
            return self.refuse(
                request.id,
                Error::Busy {
                    capacity: MAX_QUEUED_REQUESTS,
                },
            );
        }
        self.queue.push_back(Queued {
            id: request.id,
            report,
            deadline_ms: request.deadline_ms,
        });
    }

    fn on_write_result(&mut self, now_ms: u64, id: WriteId, outcome: WriteOutcome) {
        let Some(write) = self.write.as_mut().filter(|w| w.id == id && w.announced) else {
            return;
        };
        match outcome {
            WriteOutcome::Persisted => {
                let Some(write) = self.write.take() else {
                    return;
                };
                self.durable = write.state;
                self.metrics.expired(write.expired);
                for member in write.members {
                    self.responses.push_back(Response {
                        request: member.id,
                        reply: Reply::Acknowledge(member.report.ack()),
                    });
                }
            }
            WriteOutcome::Conflict => {
                self.metrics.event(Event::Conflict);
                if write.attempt >= MAX_WRITE_ATTEMPTS {
                    self.metrics.event(Event::ConflictExhausted);
                    self.fail_write(&Error::ConflictExhausted {
                        attempts: MAX_WRITE_ATTEMPTS,
                    });
                    return;
                }
                self.expire(now_ms);
                let Some(write) = self.write.as_mut() else {
                    return;
                };
                if write.members.is_empty() {
                    // Nobody is waiting for this state any more; the next request rebuilds it.
                    self.write = None;
                    return;
                }
                write.attempt += 1;
                write.id = WriteId(self.next_write);
                write.announced = false;
                self.next_write += 1;
            }
            WriteOutcome::Failed => {
                self.metrics.event(Event::WriteFailure);
                self.fail_write(&Error::WriteFailure);
            }
        }
    }

    /// Drops the write in flight and refuses everyone riding in it. The durable state stays
    /// as it was: storage may or may not hold the write, and a reporter that got no 204
    /// keeps its evidence and sends it again.
    fn fail_write(&mut self, error: &Error) {
        if let Some(write) = self.write.take() {
            for member in write.members {
                self.refuse(member.id, error.clone());
            }
        }
    }

    /// Refuses every request whose deadline has passed, queued or riding in the write.
    fn expire(&mut self, now_ms: u64) {
        let mut expired = Vec::new();
        self.queue.retain(|q| {
            let live = q.deadline_ms > now_ms;
            if !live {
                expired.push(q.id);
            }
            live
        });
        if let Some(write) = self.write.as_mut() {
            write.members.retain(|q| {
                let live = q.deadline_ms > now_ms;
                if !live {
                    expired.push(q.id);
                }
                live
            });
        }
        for id in expired {
            self.refuse(id, deadline_error());
        }
    }

    /// Starts the next write when the writer is idle: every queued request is judged in
    /// arrival order against the durable state plus the requests before it.
    fn pump(&mut self, now_ms: u64) {
        if self.write.is_some() || self.queue.is_empty() {
            return;
        }
        let mut candidate = self.durable.reporters.clone();
        let expired = retire_silent(&mut candidate, now_ms);
        let mut members = Vec::new();
        while let Some(queued) = self.queue.pop_front() {
            if queued.deadline_ms <= now_ms {
                self.refuse(queued.id, deadline_error());
                continue;
            }
            match apply(&mut candidate, &queued.report, now_ms) {
                Ok(Applied::Changed) => members.push(queued),
                Ok(Applied::Duplicate) => {
                    let epoch = queued.report.epoch();
                    let persisted = self
                        .durable
                        .reporter(epoch)
                        .is_some_and(|r| r.is_exactly(&queued.report));
                    if persisted {
                        // Idempotent: already stored, freshness untouched, no write.
                        self.responses.push_back(Response {
                            request: queued.id,
                            reply: Reply::Acknowledge(queued.report.ack()),
                        });
                    } else {
                        // A duplicate of a change in this very batch: answered with it.
                        members.push(queued);
                    }
                }
                Err(error) => {
                    if matches!(error, Error::Overflow { .. }) {
                        self.metrics.event(Event::Overflow);
                    }
                    self.refuse(queued.id, error);
                }
            }
        }
        if members.is_empty() {
            return;
        }
        let condition =
            Condition::derive(&candidate, Some(&self.durable.condition), now_ms, expired);
        self.write = Some(InFlight {
            id: WriteId(self.next_write),
            attempt: 1,
            state: ReceiverState {
                reporters: candidate,
                condition,
            },
            members,
            announced: false,
            expired: expired as u64,
        });
        self.next_write += 1;
    }

    fn refuse(&mut self, request: RequestId, error: Error) {
        if let Some(reason) = error.refusal() {
            self.metrics.refusal(reason);
        }
        self.responses.push_back(Response {
            request,
            reply: Reply::Refuse(error),
        });
    }
}

fn deadline_error() -> Error {
    Error::Deadline {
        budget_ms: INGEST_BUDGET.as_millis() as u64,
    }
}

/// The per-identity rules. `records` is sorted by epoch.
fn apply(
    records: &mut Vec<ReporterRecord>,
    report: &Report,
    now_ms: u64,
) -> Result<Applied, Error> {
    match records.binary_search_by_key(&report.epoch(), |r| r.epoch) {
        Ok(index) => {
            let record = &mut records[index];
            if report.sequence() < record.sequence {
                return Err(Error::Replay {
                    sequence: report.sequence(),
                    last: record.sequence,
                });
            }
            if report.sequence() == record.sequence {
                return if record.is_exactly(report) {
                    Ok(Applied::Duplicate)
                } else {
                    Err(Error::ChangedDuplicate {
                        sequence: report.sequence(),
                    })
                };
            }
            if report.rejected() < record.rejected {
                return Err(Error::DecreasingCounter {
                    rejected: report.rejected(),
                    last: record.rejected,
                });
            }
            // A counter increase is rejection whatever the flag says; a newer clean
            // report at the same counter resolves this process's evidence only.
            let rejection = report.rejected() > record.rejected || !report.clean();
            record.unresolved_since_ms = if rejection {
                record.unresolved_since_ms.or(Some(now_ms))
            } else {
                None
            };
            record.sequence = report.sequence();
            record.rejected = report.rejected();
            record.clean = report.clean();
            record.replica = report.replica().clone();
            record.last_accepted_ms = now_ms;
            Ok(Applied::Changed)
        }
        Err(mut index) => {
            if records.len() >= MAX_REPORTERS {
                let victim = stalest_resolved(records).ok_or(Error::Overflow {
                    capacity: MAX_REPORTERS,
                })?;
                records.remove(victim);
                if victim < index {
                    index -= 1;
                }
            }
            // The epoch began at zero, so any count is an increase.
            let rejection = report.rejected() > 0 || !report.clean();
            records.insert(
                index,
                ReporterRecord {
                    epoch: report.epoch(),
                    replica: report.replica().clone(),
                    sequence: report.sequence(),
                    rejected: report.rejected(),
                    clean: report.clean(),
                    unresolved_since_ms: rejection.then_some(now_ms),
                    last_accepted_ms: now_ms,
                },
            );
            Ok(Applied::Changed)
        }
    }
}

/// Retires every record silent past its retention at `now_ms` ([`RESOLVED_RETENTION_MS`]
/// for resolved evidence, [`UNRESOLVED_RETENTION_MS`] for unresolved); returns how many
/// unresolved ones went. Terminal evidence expires too: it can never be resolved, so only
/// the bound can end it.
fn retire_silent(records: &mut Vec<ReporterRecord>, now_ms: u64) -> usize {
    let mut expired = 0;
    records.retain(|r| {
        let unresolved = r.unresolved_since_ms.is_some();
        let retention = if unresolved {
            UNRESOLVED_RETENTION_MS
        } else {
            RESOLVED_RETENTION_MS
        };
        let keep = r.last_accepted_ms.saturating_add(retention) >= now_ms;
        if !keep && unresolved {
            expired += 1;
        }
        keep
    });
    expired
}

/// The resolved record accepted longest ago: the only kind that may make room, because
/// unresolved evidence must survive silence and replacement.
fn stalest_resolved(records: &[ReporterRecord]) -> Option<usize> {
    records
        .iter()
        .enumerate()
        .filter(|(_, r)| r.unresolved_since_ms.is_none())
        .min_by_key(|(_, r)| (r.last_accepted_ms, r.epoch))
        .map(|(index, _)| index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ConditionReason, ConditionStatus, Epoch, RefusalReason, Replica};

    const T0: u64 = 1_700_000_000_000;

    fn epoch(n: u64) -> Epoch {
        Epoch::new(n).unwrap()
    }

    fn report(e: u64, sequence: u64, rejected: u64, clean: bool) -> Report {
        Report::new(
            epoch(e),
            sequence,
            rejected,
            clean,
            Replica::new("gw-0").unwrap(),
        )
        .unwrap()
    }

    struct Harness {
        rx: Receiver,
        metrics: ReceiverMetrics,
        now: u64,
        next_id: u64,
    }

    impl Harness {
        fn new() -> Self {
            let metrics = ReceiverMetrics::default();
            Self {
                rx: Receiver::new(T0, metrics.clone()),
                metrics,
                now: T0,
                next_id: 0,
            }
        }

        fn send_raw(
            &mut self,
            caller: Caller,
            headers: &[(String, String)],
            body: &[u8],
        ) -> RequestId {
            let pairs: Vec<(&[u8], &[u8])> = headers
                .iter()
                .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
                .collect();
            let id = RequestId(self.next_id);
            self.next_id += 1;
            self.rx.handle(
                self.now,
                ReceiverInput::Request(Request {
                    id,
                    caller,
                    headers: &pairs,
                    body,
                    deadline_ms: deadline_for(self.now),
                }),
            );
            id
        }

        fn send(&mut self, report: &Report) -> RequestId {
            let headers: Vec<(String, String)> = report
                .headers()
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.clone()))
                .collect();
            self.send_raw(Caller::Local, &headers, b"")
        }

        /// Completes the write in flight (if any) with `outcome`.
        fn finish_write(&mut self, outcome: WriteOutcome) -> Option<Write> {
            let write = self.rx.poll_write()?;
            self.rx.handle(
                self.now,
                ReceiverInput::WriteResult {
                    write: write.id,
                    outcome,
                },
            );
            Some(write)
        }

        fn reply(&mut self, id: RequestId) -> Option<Reply> {
            let mut found = None;
            while let Some(response) = self.rx.poll_response() {
                if response.request == id {
                    found = Some(response.reply);
                }
            }
            found
        }

        /// Sends a report, persists every write it causes, and returns its answer.
        fn submit(&mut self, report: &Report) -> Reply {
            let id = self.send(report);
            while self.finish_write(WriteOutcome::Persisted).is_some() {}
            self.reply(id).expect("every request is answered")
        }
    }

    fn refusal(reply: &Reply) -> Option<RefusalReason> {
        match reply {
            Reply::Refuse(error) => error.refusal(),
            Reply::Acknowledge(_) => None,
        }
    }

    #[test]
    fn a_peer_is_refused_and_counted_unauthorized() {
        let mut h = Harness::new();
        let headers: Vec<(String, String)> = report(1, 1, 1, false)
            .headers()
            .iter()
            .map(|(n, v)| ((*n).to_owned(), v.clone()))
            .collect();
        let id = h.send_raw(Caller::Peer, &headers, b"");
        let reply = h.reply(id).unwrap();
        assert_eq!(reply.status(), 403);
        assert_eq!(refusal(&reply), Some(RefusalReason::Unauthorized));
        assert_eq!(h.metrics.event_count(Event::Unauthorized), 1);
        assert!(h.rx.poll_write().is_none());
        assert!(h.rx.state().reporters.is_empty());
    }

    #[test]
    fn a_peer_is_refused_before_its_headers_are_judged() {
        let mut h = Harness::new();
        let id = h.send_raw(Caller::Peer, &[], b"junk");
        assert_eq!(
            refusal(&h.reply(id).unwrap()),
            Some(RefusalReason::Unauthorized)
        );
    }

    #[test]
    fn a_malformed_request_is_refused_with_a_typed_reason_and_counted() {
        let mut h = Harness::new();
        let id = h.send_raw(Caller::Local, &[], b"");
        let reply = h.reply(id).unwrap();
        assert_eq!(reply.status(), 400);
        assert_eq!(refusal(&reply), Some(RefusalReason::MissingHeader));
        assert_eq!(
            reply.headers(),
            vec![(crate::HEADER_REFUSAL, "missing_header".to_owned())]
        );
        assert_eq!(h.metrics.refusal_count(RefusalReason::MissingHeader), 1);
    }

    #[test]
    fn a_report_is_acknowledged_only_after_its_write_is_persisted() {
        let mut h = Harness::new();
        let r = report(1, 1, 3, false);
        let id = h.send(&r);
        assert!(h.rx.poll_response().is_none(), "no answer before the write");
        let write = h.rx.poll_write().expect("a write is asked for");
        assert_eq!(write.attempt, 1);
        assert_eq!(write.state.reporter(epoch(1)).unwrap().rejected, 3);
        assert_eq!(write.state.condition.status, ConditionStatus::True);
        assert!(
            h.rx.state().reporters.is_empty(),
            "durable only after the result"
        );
        assert!(h.rx.poll_write().is_none(), "one announcement per attempt");
        h.rx.handle(
            h.now,
            ReceiverInput::WriteResult {
                write: write.id,
                outcome: WriteOutcome::Persisted,
            },
        );
        let reply = h.reply(id).unwrap();
        assert_eq!(reply, Reply::Acknowledge(r.ack()));
        assert_eq!(reply.status(), 204);
        assert_eq!(h.rx.state(), &write.state);
    }

    #[test]
    fn a_counter_increase_establishes_rejection_even_when_the_flag_claims_clean() {
        let mut h = Harness::new();
        h.submit(&report(1, 1, 0, true));
        assert_eq!(h.rx.condition().status, ConditionStatus::False);
        h.submit(&report(1, 2, 4, true));
        let record = h.rx.state().reporter(epoch(1)).unwrap();
        assert_eq!(record.unresolved_since_ms, Some(T0));
        assert_eq!(h.rx.condition().status, ConditionStatus::True);
        // A first report that already counts drops is rejection too.
        h.submit(&report(2, 1, 1, true));
        assert!(
            h.rx.state()
                .reporter(epoch(2))
                .unwrap()
                .unresolved_since_ms
                .is_some()
        );
    }

    #[test]
    fn a_newer_clean_report_at_the_same_counter_clears_only_that_process() {
        let mut h = Harness::new();
        h.submit(&report(1, 1, 2, false));
        h.submit(&report(2, 1, 5, false));
        assert_eq!(h.rx.condition().unresolved_replicas, 2);
        h.submit(&report(1, 2, 2, true));
        assert!(
            h.rx.state()
                .reporter(epoch(1))
                .unwrap()
                .unresolved_since_ms
                .is_none()
        );
        assert!(
            h.rx.state()
                .reporter(epoch(2))
                .unwrap()
                .unresolved_since_ms
                .is_some()
        );
        assert_eq!(h.rx.condition().status, ConditionStatus::True);
        assert_eq!(h.rx.condition().unresolved_replicas, 1);
        h.submit(&report(2, 2, 5, true));
        assert_eq!(h.rx.condition().status, ConditionStatus::False);
    }

    #[test]
    fn a_newer_bad_report_at_the_same_counter_keeps_the_evidence_and_its_start() {
        let mut h = Harness::new();
        h.submit(&report(1, 1, 2, false));
        h.now += 1_000;
        h.submit(&report(1, 2, 2, false));
        let record = h.rx.state().reporter(epoch(1)).unwrap();
        assert_eq!(record.unresolved_since_ms, Some(T0));
        assert_eq!(record.last_accepted_ms, T0 + 1_000);
    }

    #[test]
    fn an_exact_duplicate_is_acknowledged_without_a_write_or_new_freshness() {
        let mut h = Harness::new();
        let r = report(1, 1, 2, false);
        h.submit(&r);
        h.now += 60_000;
        let id = h.send(&r);
        assert!(h.rx.poll_write().is_none());
        assert_eq!(h.reply(id), Some(Reply::Acknowledge(r.ack())));
        assert_eq!(
            h.rx.state().reporter(epoch(1)).unwrap().last_accepted_ms,
            T0
        );
    }

    #[test]
    fn a_replay_a_changed_duplicate_and_a_decreasing_counter_are_refused() {
        let mut h = Harness::new();
        h.submit(&report(1, 5, 7, false));
        let cases = [
            (report(1, 4, 7, false), RefusalReason::Replay),
            (report(1, 5, 8, false), RefusalReason::ChangedDuplicate),
            (report(1, 5, 7, true), RefusalReason::ChangedDuplicate),
            (
                Report::new(epoch(1), 5, 7, false, Replica::new("gw-1").unwrap()).unwrap(),
                RefusalReason::ChangedDuplicate,
            ),
            (report(1, 6, 6, false), RefusalReason::DecreasingCounter),
        ];
        for (r, expected) in cases {
            let reply = h.submit(&r);
            assert_eq!(refusal(&reply), Some(expected), "{r:?}");
            assert_eq!(reply.status(), 409);
        }
        let record = h.rx.state().reporter(epoch(1)).unwrap();
        assert_eq!((record.sequence, record.rejected), (5, 7));
    }

    #[test]
    fn a_conflict_is_retried_and_then_acknowledged() {
        let mut h = Harness::new();
        let r = report(1, 1, 1, false);
        let id = h.send(&r);
        let first = h.finish_write(WriteOutcome::Conflict).unwrap();
        let second = h.rx.poll_write().unwrap();
        assert_eq!((first.attempt, second.attempt), (1, 2));
        assert_ne!(first.id, second.id);
        assert_eq!(first.state, second.state);
        h.rx.handle(
            h.now,
            ReceiverInput::WriteResult {
                write: second.id,
                outcome: WriteOutcome::Persisted,
            },
        );
        assert_eq!(h.reply(id), Some(Reply::Acknowledge(r.ack())));
        assert_eq!(h.metrics.event_count(Event::Conflict), 1);
        assert_eq!(h.metrics.event_count(Event::ConflictExhausted), 0);
    }

    #[test]
    fn the_third_conflict_exhausts_the_write_and_refuses_it() {
        let mut h = Harness::new();
        let id = h.send(&report(1, 1, 1, false));
        for attempt in 1..=MAX_WRITE_ATTEMPTS {
            assert_eq!(
                h.finish_write(WriteOutcome::Conflict).unwrap().attempt,
                attempt
            );
        }
        assert!(h.rx.poll_write().is_none(), "no fourth attempt");
        let reply = h.reply(id).unwrap();
        assert_eq!(refusal(&reply), Some(RefusalReason::ConflictExhausted));
        assert_eq!(reply.status(), 503);
        assert_eq!(h.metrics.event_count(Event::Conflict), 3);
        assert_eq!(h.metrics.event_count(Event::ConflictExhausted), 1);
        assert!(h.rx.state().reporters.is_empty());
    }

    #[test]
    fn a_write_failure_refuses_and_keeps_the_durable_state() {
        let mut h = Harness::new();
        let r = report(1, 1, 1, false);
        let id = h.send(&r);
        h.finish_write(WriteOutcome::Failed).unwrap();
        let reply = h.reply(id).unwrap();
        assert_eq!(refusal(&reply), Some(RefusalReason::WriteFailure));
        assert_eq!(h.metrics.event_count(Event::WriteFailure), 1);
        assert!(h.rx.state().reporters.is_empty());
        // The retry of the same report is written again, not waved through as a duplicate.
        let id = h.send(&r);
        assert!(h.rx.poll_response().is_none());
        h.finish_write(WriteOutcome::Persisted).unwrap();
        assert_eq!(h.reply(id), Some(Reply::Acknowledge(r.ack())));
    }

    #[test]
    fn a_stale_write_result_is_ignored() {
        let mut h = Harness::new();
        let id = h.send(&report(1, 1, 1, false));
        let first = h.finish_write(WriteOutcome::Conflict).unwrap();
        h.rx.handle(
            h.now,
            ReceiverInput::WriteResult {
                write: first.id,
                outcome: WriteOutcome::Persisted,
            },
        );
        assert!(h.rx.state().reporters.is_empty());
        assert_eq!(h.reply(id), None);
        assert!(h.rx.poll_write().is_some());
    }

    #[test]
    fn requests_that_arrive_during_a_write_share_the_next_write() {
        let mut h = Harness::new();
        let a = h.send(&report(1, 1, 1, false));
        let b = h.send(&report(2, 1, 1, false));
        let c = h.send(&report(2, 2, 3, false));
        let dup = h.send(&report(2, 2, 3, false));
        let first = h.finish_write(WriteOutcome::Persisted).unwrap();
        assert_eq!(first.state.reporters.len(), 1);
        let second = h.finish_write(WriteOutcome::Persisted).unwrap();
        assert_eq!(second.state.reporter(epoch(2)).unwrap().sequence, 2);
        assert!(
            h.rx.poll_write().is_none(),
            "one write for the three waiting"
        );
        let mut acked = Vec::new();
        while let Some(response) = h.rx.poll_response() {
            assert_eq!(response.reply.status(), 204);
            acked.push(response.request);
        }
        assert_eq!(acked, vec![a, b, c, dup]);
    }

    #[test]
    fn the_queue_takes_exactly_its_capacity_and_refuses_one_more() {
        let mut h = Harness::new();
        h.send(&report(1, 1, 1, false)); // in flight, not queued
        for n in 0..MAX_QUEUED_REQUESTS as u64 {
            h.send(&report(2, n + 1, 1, false));
        }
        assert!(h.rx.poll_response().is_none());
        let id = h.send(&report(3, 1, 1, false));
        let reply = h.reply(id).unwrap();
        assert_eq!(refusal(&reply), Some(RefusalReason::Busy));
        assert_eq!(reply.status(), 503);
    }

    #[test]
    fn a_request_past_its_deadline_is_refused_while_it_waits() {
        let mut h = Harness::new();
        h.send(&report(1, 1, 1, false));
        let waiting = h.send(&report(2, 1, 1, false));
        assert_eq!(h.rx.poll_timeout(), Some(deadline_for(T0)));
        h.now = deadline_for(T0) - 1;
        h.rx.handle(h.now, ReceiverInput::Timeout);
        assert_eq!(h.reply(waiting), None, "one millisecond inside the budget");
        h.now = deadline_for(T0);
        h.rx.handle(h.now, ReceiverInput::Timeout);
        assert_eq!(
            refusal(&h.reply(waiting).unwrap()),
            Some(RefusalReason::Deadline)
        );
        // The write in flight still lands in the durable state when it is persisted.
        h.finish_write(WriteOutcome::Persisted).unwrap();
        assert!(h.rx.state().reporter(epoch(1)).is_some());
        assert!(h.rx.state().reporter(epoch(2)).is_none());
    }

    #[test]
    fn a_request_arriving_after_its_deadline_is_refused_at_once() {
        let mut h = Harness::new();
        let pairs: Vec<(String, String)> = report(1, 1, 1, false)
            .headers()
            .iter()
            .map(|(n, v)| ((*n).to_owned(), v.clone()))
            .collect();
        let borrowed: Vec<(&[u8], &[u8])> = pairs
            .iter()
            .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
            .collect();
        h.rx.handle(
            T0,
            ReceiverInput::Request(Request {
                id: RequestId(9),
                caller: Caller::Local,
                headers: &borrowed,
                body: b"",
                deadline_ms: T0,
            }),
        );
        assert_eq!(
            refusal(&h.reply(RequestId(9)).unwrap()),
            Some(RefusalReason::Deadline)
        );
    }

    #[test]
    fn the_deadline_is_the_arrival_plus_the_ingest_budget() {
        assert_eq!(deadline_for(1_000), 6_000);
        assert_eq!(deadline_for(u64::MAX), u64::MAX);
    }

    #[test]
    fn reporter_capacity_holds_exactly_max_unresolved_identities_and_overflows_past_it() {
        let mut h = Harness::new();
        for e in 1..=MAX_REPORTERS as u64 {
            assert_eq!(h.submit(&report(e, 1, 1, false)).status(), 204);
        }
        assert_eq!(h.rx.state().reporters.len(), MAX_REPORTERS);
        let reply = h.submit(&report(1_000, 1, 1, false));
        assert_eq!(refusal(&reply), Some(RefusalReason::Overflow));
        assert_eq!(reply.status(), 503);
        assert_eq!(h.metrics.event_count(Event::Overflow), 1);
        // Known identities still report.
        assert_eq!(h.submit(&report(3, 2, 1, true)).status(), 204);
    }

    #[test]
    fn unresolved_evidence_of_a_replica_silent_past_the_retention_expires_and_says_so() {
        let mut h = Harness::new();
        // gw-0's process (epoch 1) rejected readings, then went away for good.
        assert_eq!(h.submit(&report(1, 1, 3, false)).status(), 204);
        assert_eq!(h.rx.condition().status, ConditionStatus::True);
        // Its replacement (epoch 2) reports clean, exactly at the retention: still held.
        h.now = T0 + UNRESOLVED_RETENTION_MS;
        assert_eq!(h.submit(&report(2, 1, 0, true)).status(), 204);
        assert_eq!(h.rx.condition().status, ConditionStatus::True);
        assert!(h.rx.state().reporter(epoch(1)).is_some());
        // One millisecond past it, the next report retires the silent evidence.
        h.now += 1;
        assert_eq!(h.submit(&report(2, 2, 0, true)).status(), 204);
        assert!(h.rx.state().reporter(epoch(1)).is_none());
        let condition = h.rx.condition();
        assert_eq!(condition.status, ConditionStatus::False);
        assert_eq!(condition.reason, ConditionReason::UnresolvedEvidenceExpired);
        assert!(
            condition.message.contains("expired"),
            "{}",
            condition.message
        );
        assert_eq!(h.metrics.expired_count(), 1);
        // The reason stays while the status does, and across a restart.
        h.now += 1;
        assert_eq!(h.submit(&report(2, 3, 0, true)).status(), 204);
        assert_eq!(
            h.rx.condition().reason,
            ConditionReason::UnresolvedEvidenceExpired
        );
        let restored = Receiver::restore(h.rx.state().clone(), h.now, h.metrics.clone()).unwrap();
        assert_eq!(
            restored.condition().reason,
            ConditionReason::UnresolvedEvidenceExpired
        );
    }

    #[test]
    fn a_clean_replica_silent_past_its_retention_is_retired_so_overflow_needs_every_slot_unresolved()
     {
        let mut h = Harness::new();
        for e in 1..MAX_REPORTERS as u64 {
            h.submit(&report(e, 1, 0, true));
        }
        // Evidence that is still fresh is kept however long the clean ones were silent.
        h.now = T0 + RESOLVED_RETENTION_MS;
        h.submit(&report(MAX_REPORTERS as u64, 1, 1, false));
        assert_eq!(h.rx.state().reporters.len(), MAX_REPORTERS);
        h.now += 1;
        // Every clean record silent past RESOLVED_RETENTION_MS is retired with the next write.
        h.submit(&report(MAX_REPORTERS as u64, 2, 1, false));
        assert_eq!(h.rx.state().reporters.len(), 1);
        assert_eq!(
            h.metrics.expired_count(),
            0,
            "clean records are not evidence"
        );
        assert_eq!(h.rx.condition().status, ConditionStatus::True);
    }

    #[test]
    fn a_new_identity_at_capacity_evicts_the_stalest_resolved_one() {
        let mut h = Harness::new();
        for e in 1..=MAX_REPORTERS as u64 {
            h.now += 1;
            h.submit(&report(e, 1, 1, false));
        }
        h.now += 1;
        h.submit(&report(7, 2, 1, true));
        h.now += 1;
        h.submit(&report(5, 2, 1, true));
        h.now += 1;
        assert_eq!(h.submit(&report(1_000, 1, 0, true)).status(), 204);
        let state = h.rx.state();
        assert_eq!(state.reporters.len(), MAX_REPORTERS);
        assert!(
            state.reporter(epoch(7)).is_none(),
            "stalest resolved evicted"
        );
        assert!(state.reporter(epoch(5)).is_some());
        assert!(state.reporter(epoch(1_000)).is_some());
        assert_eq!(h.metrics.event_count(Event::Overflow), 0);
    }

    #[test]
    fn terminal_evidence_can_never_be_cleared() {
        let mut h = Harness::new();
        h.submit(&report(1, u64::MAX - 1, 2, false));
        h.submit(&report(1, u64::MAX, 2, false));
        assert!(h.rx.state().reporter(epoch(1)).unwrap().is_terminal());
        // Nothing is newer than the maximum sequence, and clean cannot be sent at it.
        assert_eq!(
            refusal(&h.submit(&report(1, u64::MAX - 1, 2, true))),
            Some(RefusalReason::Replay)
        );
        assert!(Report::new(epoch(1), u64::MAX, 2, true, Replica::new("a").unwrap()).is_err());
        assert_eq!(h.rx.condition().status, ConditionStatus::True);
        // The counter latches the same way.
        h.submit(&report(2, 1, u64::MAX, false));
        assert_eq!(
            refusal(&h.submit(&report(2, 2, u64::MAX - 1, true))),
            Some(RefusalReason::DecreasingCounter)
        );
        assert_eq!(h.submit(&report(2, 2, u64::MAX, false)).status(), 204);
        assert!(
            h.rx.state()
                .reporter(epoch(2))
                .unwrap()
                .unresolved_since_ms
                .is_some()
        );
    }

    #[test]
    fn a_restored_receiver_keeps_unresolved_evidence_and_its_rules() {
        let mut h = Harness::new();
        h.submit(&report(1, 3, u64::MAX - 5, false));
        h.submit(&report(2, 1, 0, true));
        let json = serde_json::to_string(h.rx.state()).unwrap();
        assert!(json.contains("\"18446744073709551610\""), "{json}");
        let state: ReceiverState = serde_json::from_str(&json).unwrap();
        let mut restored = Harness::new();
        restored.rx = Receiver::restore(state, T0 + 5, restored.metrics.clone()).unwrap();
        assert_eq!(restored.rx.state(), h.rx.state());
        assert_eq!(restored.rx.condition().last_transition_ms, T0);
        assert_eq!(
            refusal(&restored.submit(&report(1, 2, 0, true))),
            Some(RefusalReason::Replay)
        );
        assert_eq!(
            restored.submit(&report(1, 3, u64::MAX - 5, false)).status(),
            204,
            "an exact duplicate of persisted evidence"
        );
    }

    #[test]
    fn restore_refuses_state_it_cannot_trust() {
        let mut h = Harness::new();
        h.submit(&report(1, 1, 1, false));
        h.submit(&report(2, 1, 1, false));
        let good = h.rx.state().clone();

        let mut unsorted = good.clone();
        unsorted.reporters.reverse();
        let mut rejected_but_resolved = good.clone();
        rejected_but_resolved.reporters[0].unresolved_since_ms = None;
        let mut terminal_clean = good.clone();
        terminal_clean.reporters[0].sequence = u64::MAX;
        terminal_clean.reporters[0].clean = true;
        let mut too_many = good.clone();
        too_many.reporters = (1..=MAX_REPORTERS as u64 + 1)
            .map(|e| ReporterRecord {
                epoch: epoch(e),
                ..good.reporters[0].clone()
            })
            .collect();
        for bad in [unsorted, rejected_but_resolved, terminal_clean, too_many] {
            assert!(matches!(
                Receiver::restore(bad, T0, ReceiverMetrics::default()),
                Err(Error::InvalidState { .. })
            ));
        }
        let mut at_capacity = good.clone();
        at_capacity.reporters = (1..=MAX_REPORTERS as u64)
            .map(|e| ReporterRecord {
                epoch: epoch(e),
                ..good.reporters[0].clone()
            })
            .collect();
        assert!(Receiver::restore(at_capacity, T0, ReceiverMetrics::default()).is_ok());
    }

    #[test]
    fn a_restored_condition_is_derived_again_from_the_records() {
        let mut h = Harness::new();
        h.submit(&report(1, 1, 1, false));
        let mut state = h.rx.state().clone();
        state.condition.status = ConditionStatus::False;
        state.condition.message = "stale wording".into();
        let rx = Receiver::restore(state, T0 + 9, ReceiverMetrics::default()).unwrap();
        assert_eq!(rx.condition().status, ConditionStatus::True);
        assert_eq!(rx.condition().last_transition_ms, T0 + 9);
        assert!(rx.condition().message.starts_with("1 gateway replica"));
    }
}
