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
//! The wire contract, bounds, statuses and metrics are written down in `docs/feedback.md`.
#![deny(clippy::disallowed_methods)]

mod ack;
mod condition;
mod epoch;
mod error;
mod headers;
mod metrics;
mod receiver;
mod replica;
mod report;
mod reporter;
mod state;

pub use ack::Ack;
pub use condition::{CONDITION_TYPE, Condition, ConditionReason, ConditionStatus};
pub use epoch::Epoch;
pub use error::{Error, RefusalReason};
pub use headers::{
    EPOCH_HEX_LEN, HEADER_CLEAN, HEADER_EPOCH, HEADER_PREFIX, HEADER_REFUSAL, HEADER_REJECTED,
    HEADER_REPLICA, HEADER_SEQUENCE, HEADER_VERSION, INGEST_METHOD, INGEST_PATH, MAX_CLEAN_LEN,
    MAX_DECIMAL_LEN, MAX_REPLICA_LEN, MAX_REPORTED_NAME_BYTES, WIRE_VERSION,
};
pub use metrics::{Event, FailureReason, ReceiverMetrics, ReporterMetrics};
pub use receiver::{
    Caller, HeaderList, INGEST_BUDGET, MAX_QUEUED_REQUESTS, MAX_REPORTERS, MAX_WRITE_ATTEMPTS,
    Receiver, ReceiverInput, Reply, Request, RequestId, Response, Write, WriteId, WriteOutcome,
    deadline_for,
};
pub use replica::Replica;
pub use report::{Report, parse_report};
pub use reporter::{
    Cycle, ExchangeId, Outcome, REPORT_BUDGET, Reporter, ReporterHandover, ReporterInput, Transmit,
};
pub use state::{ReceiverState, ReporterRecord};
