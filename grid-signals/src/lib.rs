//! Everything grid knows about load arrives as Prometheus text exposition; this crate
//! decides what of it to believe.
//!
//! # I/O boundary
//!
//! Pure: no sockets, files, clocks, environment or randomness. Callers hand in bytes they
//! already read (capped at [`exposition::MAX_EXPOSITION_BYTES`]) and the current time as a
//! `now` parameter; the crate hands back samples, verdicts, drop counts and events.
//!
//! # Data flow
//!
//! ```text
//! EPP /metrics bytes --exposition--> samples --epp--> readiness, in-flight, latency
//!                                                        |
//!                                                  batch (metadata + samples)
//!                                                        v
//! peer / relay bytes --exposition--> batches --batch (fences)--> store --> ordering (grid-score)
//!                                                                  |
//!                                                                  +--> relay text (exposition writer)
//! ```
//!
//! [`site::Site`] puts the operator's half together: scrape results in, batches into
//! its two stores, peer bodies in, a relay body out for the local gateway or a peer.
//!
//! The store's read API for the ordering step (entries, learning state, latest readings,
//! `window_worst`, reset events) is described in [`store`]; the wire rules of batches in
//! `docs/wire.md`. Randomness comes in through [`rng::Rng`], the trait every grid crate
//! draws from (grid-score's picks, grid-membership's SWIM).
#![deny(clippy::disallowed_methods)]

pub mod batch;
pub mod epp;
mod error;
pub mod exposition;
pub mod labels;
pub mod long_poll;
pub mod rng;
pub mod signature;
pub mod site;
pub mod store;
pub mod wire;

pub use error::Error;

#[doc(hidden)]
/// What [`label_values!`] expands to, so a crate using it names no other dependency.
pub mod __label_support {
    pub use prometheus_client::encoding::{
        EncodeLabelSet, EncodeLabelValue, LabelSetEncoder, LabelValueEncoder,
    };
}
