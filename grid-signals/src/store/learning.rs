//! Whether a provider's readings may feed learning, and why not.

use crate::batch::{MetaRef, Revision};

/// May the scorer learn from this provider now?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learning<'a> {
    /// Yes: a complete batch of `revision` started the current learning lifetime at
    /// `since_ms` (store clock) and its metadata is fresh.
    Allowed {
        /// The revision the learned history describes.
        revision: &'a Revision,
        /// When the lifetime started (milliseconds since the Unix epoch).
        since_ms: u64,
    },
    /// No; the provider's fresh pressure readings remain usable for ordering.
    Paused(PauseReason),
}

/// Why learning is paused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PauseReason {
    /// No complete batch of the current revision has been held yet (never seen, or the
    /// revision changed and only a rejected payload of the new one arrived).
    MetadataMissing,
    /// The metadata of the current lifetime is older than the TTL.
    MetadataStale,
    /// A zero-sample batch invalidated the lifetime; the next complete batch with rows
    /// starts a fresh one.
    ZeroSamples,
}

/// The learning lifetime the store tracks per provider.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Lifetime {
    /// Nothing to learn from (no complete batch of the current revision).
    #[default]
    None,
    /// Invalidated by a zero-sample batch.
    Invalidated,
    /// Learning from `revision` since `since_ms`.
    Live { revision: Revision, since_ms: u64 },
}

impl Lifetime {
    /// Whether learning is live for the revision of the batch `meta` opened.
    pub(crate) fn is_live_for(&self, meta: &MetaRef<'_>) -> bool {
        matches!(self, Self::Live { revision, .. } if meta.same_revision(revision))
    }
}
