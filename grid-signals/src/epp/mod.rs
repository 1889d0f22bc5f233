//! What an operator concludes from its EPP scrapes: readiness, in-flight, latency.
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

mod body;
mod failure;
mod in_flight;
mod latency;
mod names;
mod publication;
mod readiness;
mod reading;
mod tracker;

pub use body::{LineRefusals, ScrapeBody};
pub use failure::ScrapeFailure;
pub use in_flight::{InFlightEstimate, InFlightSource, operator_in_flight};
pub use latency::{
    CounterChange, LATENCY_WINDOW_MS, Latency, LatencyWindow, MAX_WINDOW_SNAPSHOTS,
    MIN_WINDOW_REQUESTS, quantile,
};
pub use names::{
    BUCKET_BOUND_LABEL, ENDPOINT_LABEL, EPP_AVERAGE_KV_CACHE, EPP_AVERAGE_QUEUE,
    EPP_AVERAGE_RUNNING, EPP_FLOW_CONTROL_QUEUE, EPP_INFLIGHT_REQUESTS, EPP_PER_ENDPOINT_QUEUE,
    EPP_READY_ENDPOINTS, EPP_REQUEST_ERROR_TOTAL, EPP_REQUEST_STREAMING_TPOT_SECONDS,
    EPP_REQUEST_TOTAL, EPP_REQUEST_TTFT_SECONDS, EPP_STD_DEV_KV_CACHE, EppMetric,
    FLOW_CONTROL_POOL_LABEL, GENERATIONS, Generation, HistogramPart, INFLIGHT_ENDPOINT_LABEL,
    INFLIGHT_NAMESPACE_LABEL, NAME_TABLE, OLD_ENDPOINT_LABEL, POOL_LABEL, Recognized,
    STREAMING_LABEL, endpoint_label, family_of, recognize,
};
pub use publication::{
    ERROR_RATIO, IN_FLIGHT_REQUESTS, PROVIDER_LABEL, PROVIDER_SERIES, PublicationInput,
    PublishedSample, READY, READY_ENDPOINTS, READY_REASON, READY_REASON_LABEL, SITE_LABEL,
    TPOT_SECONDS, TTFT_P50_SECONDS, TTFT_P90_SECONDS, publication,
};
pub use readiness::{
    ENGINE_ANSWER_WINDOW_MS, HYSTERESIS_SCRAPES, Readiness, ReadinessState, ReadyObservation,
    ReadyReason, ReadyReasonLabel, ReadyStatus, ScrapeTiming, StaleWindow,
};
pub use reading::{
    Counters, Histogram, MAX_ENDPOINTS, MAX_HISTOGRAM_BUCKETS, MAX_POOLS, PoolSelector,
    RejectionCounts, SampleRejection, SampleView, ScrapeReading, read_scrape,
};
pub use tracker::{ProviderConfig, ProviderTracker, ScrapeInput, ScrapeSummary};
