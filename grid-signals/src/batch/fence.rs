//! The (publisher epoch, batch sequence) fence that orders one provider's batches.

use serde::{Deserialize, Serialize};

/// Where a provider's publication stream stands: the highest (epoch, sequence) admitted.
///
/// Ordered lexicographically: a new publisher epoch (an operator restart) outranks any
/// sequence of an older one, and within an epoch the sequence decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Fence {
    /// The publisher's epoch: wall-clock milliseconds since the Unix epoch at which the
    /// publishing operator's epoch began (kept increasing across restarts by its
    /// persisted high-water mark).
    pub epoch: u64,
    /// The batch's place within that epoch, increasing by publication.
    pub sequence: u64,
}

impl Fence {
    /// The fence of a batch published as `sequence` within `epoch`.
    pub const fn new(epoch: u64, sequence: u64) -> Self {
        Self { epoch, sequence }
    }
}

/// One persisted fence: which provider it orders and where it stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceRecord {
    /// `grid_site` of the provider.
    pub site: String,
    /// `grid_provider` of the provider.
    pub provider: String,
    /// The highest (epoch, sequence) admitted for it.
    pub fence: Fence,
}

/// Every fence a store holds, as a small serde value a daemon can persist across restarts
/// so delayed batches stay refused after it comes back.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceSet {
    /// One record per provider, sorted by (site, provider).
    pub records: Vec<FenceRecord>,
}

#[cfg(test)]
mod tests {
    use super::Fence;

    #[test]
    fn newer_epoch_outranks_any_older_sequence() {
        assert!(Fence::new(2, 0) > Fence::new(1, u64::MAX));
        assert!(Fence::new(1, 5) > Fence::new(1, 4));
        assert_eq!(Fence::new(3, 3), Fence::new(3, 3));
    }
}
