//! Why ingested data was refused: a closed set of reasons and their counts.

crate::label_values! {
    label "reason";
    /// Why a line of an ingested body was refused.
    ///
    /// Closed, so the `reason` label of `grid_signals_ingest_dropped_total` has a bounded set
    /// of values and every refusal has a test.
    #[derive(PartialOrd, Ord)]
    pub enum DropReason {
        /// The line is not valid exposition text.
        Parse,
        /// The whole body was over [`crate::exposition::MAX_EXPOSITION_BYTES`].
        BodyCap,
        /// Stamped too far after the body's `Date` or implausibly long before it, or the
        /// publisher epoch is too far ahead of the receiver's clock.
        Skew,
        /// At or below the provider's fence and not an exact repeat of the held publication.
        Delayed,
        /// Its batch is not whole (wrong row count, a refused line, or interrupted).
        Incomplete,
        /// A peer sent a batch for a site other than its own verified identity, or, answering
        /// a gossip pull, a batch of a register it was not asked for.
        SiteMismatch,
        /// Over one of the store's caps or a wire size bound.
        Cap,
        /// A `grid_provider_config_generation` line that breaks the metadata rules.
        Metadata,
        /// A sample line outside any batch.
        Unbatched,
        /// A row inside a whole batch that breaks the row rules (no timestamp, NaN, bad name).
        Malformed,
        /// A pulled batch whose signature is missing, malformed or does not verify against
        /// a certificate the declared trust binds to its site (the whole batch), or a
        /// signature or chain comment line that breaks its rules or belongs to no batch.
        Signature,
    }
}

impl DropReason {
    fn index(self) -> usize {
        self as usize
    }
}

/// How many lines were refused, per reason.
///
/// The unit is one exposition line (a metadata line or a sample row); a refused body
/// (`body_cap`) counts once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropCounts {
    counts: [u64; DropReason::ALL.len()],
}

impl DropCounts {
    /// Adds `lines` refused for `reason`.
    pub fn add(&mut self, reason: DropReason, lines: u64) {
        let c = &mut self.counts[reason.index()];
        *c = c.saturating_add(lines);
    }

    /// Lines refused for `reason`.
    pub fn get(&self, reason: DropReason) -> u64 {
        self.counts[reason.index()]
    }

    /// Lines refused for any reason.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Each reason with a non-zero count.
    pub fn iter(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL
            .into_iter()
            .map(|r| (r, self.get(r)))
            .filter(|&(_, n)| n > 0)
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &Self) {
        for (reason, n) in other.iter() {
            self.add(reason, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{DropCounts, DropReason};

    #[test]
    fn labels_are_distinct_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for r in DropReason::ALL {
            assert!(seen.insert(r.as_str()));
            assert!(
                r.as_str()
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'_')
            );
        }
        assert_eq!(DropReason::SiteMismatch.as_str(), "site_mismatch");
    }

    #[test]
    fn all_lists_every_reason_in_index_order() {
        for (i, r) in DropReason::ALL.into_iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }

    #[test]
    fn counts_add_merge_and_saturate() {
        let mut a = DropCounts::default();
        a.add(DropReason::Skew, 2);
        let mut b = DropCounts::default();
        b.add(DropReason::Skew, 1);
        b.add(DropReason::Cap, u64::MAX);
        b.add(DropReason::Cap, 1);
        a.merge(&b);
        assert_eq!(a.get(DropReason::Skew), 3);
        assert_eq!(a.get(DropReason::Cap), u64::MAX);
        assert_eq!(a.iter().count(), 2);
    }
}
