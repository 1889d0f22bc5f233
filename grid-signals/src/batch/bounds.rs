//! The size bounds of the batch wire format (see `docs/wire.md`).
//!
//! Every bound is checked where a batch is built, so a `Batch` in hand is always within
//! them and the store's own caps only have to count entries.

/// Longest site, provider, metric or label name, in bytes.
///
/// Site and provider names are Kubernetes names (at most 63 bytes) plus room; metric and
/// label names from EPP are far shorter.
pub const MAX_KEY_BYTES: usize = 128;

/// Longest `provider_uid`, in bytes. Kubernetes UIDs are 36; the uid is opaque to grid.
pub const MAX_UID_BYTES: usize = 128;

/// Longest label value of a batch row, in bytes (after unescaping).
///
/// Endpoint addresses (`model_server_endpoint`) are the longest values we carry.
pub const MAX_LABEL_VALUE_BYTES: usize = 256;

/// Most labels a batch row carries besides `grid_site` and `grid_provider`.
pub const MAX_EXTRA_LABELS: usize = 8;

/// Most sample rows one batch may announce in `batch_samples`.
///
/// One row per series, and the store holds at most
/// [`crate::store::MAX_SERIES_PER_PROVIDER`] series per provider, so a larger batch could
/// never be stored whole.
pub const MAX_BATCH_SAMPLES: u64 = crate::store::MAX_SERIES_PER_PROVIDER as u64;

/// Largest config generation: generations travel as the sample value (an `f64`), which
/// holds whole numbers exactly only up to 2^53.
pub const MAX_GENERATION: u64 = 1 << 53;
