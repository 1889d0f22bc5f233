//! What an operator concludes from its EPP scrapes: readiness, in-flight, latency (issue 5).
//!
//! # Data flow
//!
//! ```text
//! EPP body --body (lenient: bad lines counted, a spoiled family left out)--> samples
//! parsed samples --reading--> ScrapeReading --readiness--> Ready verdict + reason
//!   (or a ScrapeFailure)          |          --in_flight--> grid_provider_in_flight_requests
//!                                 |          --latency----> TTFT p50/p90, TPOT, error ratio
//!                                 v
//!                    publication: contract series + relayed raw EPP series
//! ```
//!
//! The operator keeps one [`ProviderTracker`] per provider, feeds it every scrape outcome
//! with the wall-clock `now` (`u64` milliseconds since the Unix epoch), and reads back the
//! verdict ([`ProviderTracker::readiness`]) and the batch samples
//! ([`ProviderTracker::publication`]). What the gateway concludes from the relayed series
//! (its exclusion and its own in-flight) lives where it runs, in `grid_score::from_store`
//! and the scorer's learner.
//!
//! # I/O boundary
//!
//! None: no clock, socket or file. Samples come in already parsed (anything implementing
//! [`SampleView`]); time comes in as `now`. Names and labels read, every series published
//! and the Ready-condition reasons are listed in `docs/metrics.md`.

pub mod body;
pub mod failure;
pub mod in_flight;
pub mod latency;
pub mod names;
pub mod publication;
pub mod readiness;
pub mod reading;
pub mod tracker;

pub use body::{LineRefusals, ScrapeBody};
pub use failure::ScrapeFailure;
pub use in_flight::{InFlightEstimate, InFlightSource, operator_in_flight};
pub use latency::{CounterChange, Latency, LatencyWindow};
pub use publication::{PublishedSample, publication};
pub use readiness::{Readiness, ReadyReason, ReadyStatus, ScrapeTiming, StaleWindow};
pub use reading::{
    PoolSelector, RejectionCounts, SampleRejection, SampleView, ScrapeReading, read_scrape,
};
pub use tracker::{ProviderConfig, ProviderTracker, ScrapeInput, ScrapeSummary};
