//! The ingest-feedback contract: a gateway tells its operator which readings it had to
//! reject for implausible ages, and the operator never loses such a report.
//!
//! # I/O boundary
//!
//! Pure state machines in the quinn-proto shape: `handle(now, input)` feeds them and
//! `poll_*` says what to send or persist. The daemons own sockets, files and clocks.
//!
//! # Data flow
//!
//! ```text
//! gateway: committed ingest --observation--> Reporter --poll_transmit--> POST /v1/site/signals/ingest
//! operator: request headers --Receiver::handle--> "persist this state, then acknowledge" --> 204 echo
//! ```
#![deny(clippy::disallowed_methods)]
