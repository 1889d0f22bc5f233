//! The ingest-feedback contract: a gateway tells its operator which readings it had to
//! reject for implausible ages, and the operator never loses such a report.
//!
//! # I/O boundary
//!
//! Pure state machines in the quinn-proto shape: `handle(now, input)` feeds them and
//! `poll_*` says what to send or persist. The daemons own sockets, files, clocks and the
//! random source: the gateway draws its [`Epoch`] and passes it in, the operator decides
//! [`Caller`] from the verified TLS certificate, performs each [`Write`] and feeds back the
//! outcome, and enforces [`INGEST_BUDGET`] on its I/O. Nothing here reads a clock: the
//! receiver's `now` is wall-clock milliseconds since the Unix epoch (it is persisted),
//! the reporter's `now` is milliseconds on any monotonic clock (it only makes deadlines).
//!
//! # Data flow
//!
//! ```text
//! gateway:  committed ingest --Cycle--> Reporter --poll_transmit--> POST /v1/site/signals/ingest
//! operator: request --Receiver::handle--> poll_write: "persist this state" --> file / status
//!           write result --Receiver::handle--> poll_response: 204 echo (only now) or refusal
//! gateway:  204 echo --Reporter::handle--> pending evidence cleared only if it names it exactly
//! ```
//!
//! # One report, end to end
//!
//! ```
//! use grid_feedback::{
//!     Caller, Cycle, Epoch, Outcome, Receiver, ReceiverInput, ReceiverMetrics, Replica, Reply,
//!     Reporter, ReporterInput, ReporterMetrics, Request, RequestId, WriteOutcome, deadline_for,
//! };
//!
//! let now = 1_700_000_000_000;
//! // Gateway: an ingest committed with three skew drops; a report is due.
//! let mut reporter = Reporter::new(
//!     Epoch::new(0x9e37_79b9).unwrap(), // the daemon draws it from the OS
//!     Replica::new("gateway-a-0")?,
//!     ReporterMetrics::default(),
//! );
//! reporter.handle(now, ReporterInput::Cycle(Cycle::Committed { skew_drops: 3 }));
//! let transmit = reporter.poll_transmit(now).expect("bad evidence is reported");
//! let headers = transmit.report.headers();
//! let wire: Vec<(&[u8], &[u8])> =
//!     headers.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())).collect();
//!
//! // Operator: the POST arrives over the site's own certificate.
//! let mut receiver = Receiver::new(now, ReceiverMetrics::default());
//! let request = Request {
//!     id: RequestId(1),
//!     caller: Caller::Local,
//!     headers: &wire,
//!     body: b"",
//!     deadline_ms: deadline_for(now),
//! };
//! receiver.handle(now, ReceiverInput::Request(request));
//! // Nothing is answered before the state is persisted...
//! assert!(receiver.poll_response().is_none());
//! let write = receiver.poll_write().expect("persist first");
//! receiver.handle(now, ReceiverInput::WriteResult { write: write.id, outcome: WriteOutcome::Persisted });
//! // ...then the 204 echoes the report.
//! let response = receiver.poll_response().expect("answered once persisted");
//! assert!(matches!(response.reply, Reply::Acknowledge(_)));
//! let status = response.reply.status();
//! let echoed = response.reply.headers();
//! let echoed: Vec<(&[u8], &[u8])> =
//!     echoed.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())).collect();
//!
//! // Gateway: the exact echo clears the evidence.
//! reporter.handle(now, ReporterInput::Response {
//!     exchange: transmit.exchange,
//!     outcome: Outcome::Http { status, headers: &echoed },
//! });
//! assert!(reporter.pending().is_none());
//! # Ok::<(), grid_feedback::Error>(())
//! ```
//!
//! The wire contract, bounds, statuses and metrics are written down in `docs/feedback.md`.
#![deny(clippy::disallowed_methods)]

mod ack;
mod condition;
mod epoch;
mod error;
mod headers;
mod metrics;
mod receiver;
mod record;
mod replica;
mod report;
mod reporter;
mod state;

pub use ack::Ack;
pub use condition::{CONDITION_TYPE, Condition, ConditionReason, ConditionStatus};
pub use epoch::Epoch;
pub use error::{Error, MAX_REPORTED_NAME_BYTES, RefusalReason};
pub use headers::{
    EPOCH_HEX_LEN, HEADER_CLEAN, HEADER_EPOCH, HEADER_PREFIX, HEADER_REFUSAL, HEADER_REJECTED,
    HEADER_REPLICA, HEADER_SEQUENCE, HEADER_VERSION, INGEST_METHOD, INGEST_PATH, MAX_CLEAN_LEN,
    MAX_DECIMAL_LEN, MAX_REPLICA_LEN, WIRE_VERSION,
};
pub use metrics::{Event, FailureReason, ReceiverMetrics, ReporterMetrics};
pub use receiver::{
    Caller, HeaderList, INGEST_BUDGET, MAX_QUEUED_REQUESTS, MAX_REPORTERS, MAX_WRITE_ATTEMPTS,
    Receiver, ReceiverInput, Reply, Request, RequestId, Response, Write, WriteId, WriteOutcome,
    deadline_for,
};
pub use record::{RESOLVED_RETENTION_MS, ReporterRecord, UNRESOLVED_RETENTION_MS};
pub use replica::Replica;
pub use report::{Report, parse_report};
pub use reporter::{
    Cycle, ExchangeId, Outcome, REPORT_BUDGET, Reporter, ReporterHandover, ReporterInput, Transmit,
};
pub use state::ReceiverState;
