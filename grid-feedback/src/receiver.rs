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
use crate::state::{ReceiverState, ReporterRecord};
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
                condition: Condition::derive(&[], None, now_ms),
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
        let condition = Condition::derive(&state.reporters, Some(&state.condition), now_ms);
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
        let condition = Condition::derive(&candidate, Some(&self.durable.condition), now_ms);
        self.write = Some(InFlight {
            id: WriteId(self.next_write),
            attempt: 1,
            state: ReceiverState {
                reporters: candidate,
                condition,
            },
            members,
            announced: false,
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
fn apply(records: &mut Vec<ReporterRecord>, report: &Report, now_ms: u64) -> Result<Applied, Error> {
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

