//! The store's caps and time bounds, each a named constant with a boundary test.

/// Most (site, provider) entries the store holds in total.
///
/// Past it a batch for a provider the store does not know yet is refused (`cap`): the
/// newcomer's data, never an entry already held.
pub const MAX_PROVIDERS: usize = 1024;

/// Most providers one site (the owner of a batch) may hold, so one site cannot use up the
/// room of the others.
pub const MAX_PROVIDERS_PER_SITE: usize = 64;

/// Most distinct metric names one provider may hold.
pub const MAX_METRICS_PER_PROVIDER: usize = 32;

/// Most series (metric name plus extra labels) one provider may hold; per-endpoint series
/// grow with the pool, so this also bounds endpoint churn within a TTL.
pub const MAX_SERIES_PER_PROVIDER: usize = 256;

/// Most readings one series' window keeps. A window is a ring: the newest reading pushes
/// out the oldest, because the newest is the one that matters.
pub const MAX_SAMPLES_PER_SERIES: usize = 64;

/// How far a row may be stamped after the body's reference time (its HTTP `Date`, which
/// has one-second resolution), in milliseconds. Later than that is `skew`.
pub const MAX_FUTURE_STAMP_MS: u64 = 1_000;

/// How far a row may be stamped before the body's reference time, in milliseconds.
/// Older than that is implausible (a broken clock, not a slow network) and is `skew`.
pub const MAX_SAMPLE_AGE_MS: u64 = 600_000;

/// How long an entry whose readings have all expired keeps its fence, in milliseconds.
///
/// Longer than [`MAX_SAMPLE_AGE_MS`], so by the time a fence is forgotten any batch it
/// would have refused carries stamps too old to be accepted anyway.
pub const FENCE_RETENTION_MS: u64 = 2 * MAX_SAMPLE_AGE_MS;

/// Default signal TTL, in milliseconds: readings older than this expire, and metadata
/// older than this is stale (learning pauses).
pub const DEFAULT_TTL_MS: u64 = 30_000;

/// Most events waiting for [`super::Store::poll_event`]. Events coalesce per provider, so
/// this is reached only when the reader stops polling; the queue then collapses into one
/// [`super::StoreEvent::Resync`].
pub const MAX_PENDING_EVENTS: usize = 2 * MAX_PROVIDERS;
