//! Batches, revisions and the epoch/sequence fences that order them.
//!
//! A provider's readings travel as one *batch*: a metadata line
//! (`grid_provider_config_generation{grid_site,grid_provider,provider_uid,publisher_epoch,batch_sequence,batch_samples} <generation> <stamp_ms>`)
//! followed by exactly `batch_samples` rows for the same site and provider. The wire
//! rules are in `docs/wire.md`.
//!
//! This module holds the pure pieces: validated [`BatchMeta`] and [`Row`], the owned
//! [`Batch`], the [`Revision`] a learner's history is valid for, the [`Fence`] that orders
//! one provider's batches and the [`OrderGate`] that admits them (with the
//! [`MAX_EPOCH_LEAD_MS`] bound on future epochs). The store applies them.
//!
//! All stamps are wall-clock milliseconds since the Unix epoch, passed in by the caller.

mod admission;
mod bounds;
mod fence;
mod meta;
mod owned;
mod revision;
mod row;
mod rule;
mod view;
mod write;

pub use admission::{Admission, MAX_EPOCH_LEAD_MS, OrderGate, epoch_too_far};
pub use bounds::{
    MAX_BATCH_SAMPLES, MAX_EXTRA_LABELS, MAX_GENERATION, MAX_KEY_BYTES, MAX_LABEL_VALUE_BYTES,
    MAX_UID_BYTES,
};
pub use fence::{Fence, FenceRecord, FenceSet};
pub(crate) use meta::check_bounded;
pub use meta::{
    BatchMeta, EPOCH_LABEL, METADATA_NAME, PROVIDER_LABEL, SAMPLES_LABEL, SEQUENCE_LABEL,
    SITE_LABEL, UID_LABEL, generation_from_value, parse_decimal_u64,
};
pub use owned::Batch;
pub use revision::Revision;
pub use row::Row;
pub(crate) use row::labels_equal;
pub use rule::BatchRule;
pub(crate) use view::{BatchView, LabelRef, MetaRef, Rows};
pub(crate) use write::write_batch;
