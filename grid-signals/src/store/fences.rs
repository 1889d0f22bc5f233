//! Carrying fences across restarts.

use super::Store;
use crate::batch::{FenceRecord, FenceSet, MAX_KEY_BYTES, check_bounded, epoch_too_far};

/// What [`Store::import_fences`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FenceImport {
    /// Records applied (a fence raised or a new entry created).
    pub applied: usize,
    /// Records refused: names out of bounds, an epoch more than
    /// [`crate::batch::MAX_EPOCH_LEAD_MS`] ahead of the clock, or no room under the
    /// provider caps.
    pub refused: usize,
}

impl Store {
    /// Every fence held, sorted by (site, provider), for a daemon to persist.
    pub fn export_fences(&self) -> FenceSet {
        FenceSet {
            records: self
                .entries()
                .filter_map(|e| {
                    Some(FenceRecord {
                        site: e.site().to_owned(),
                        provider: e.provider().to_owned(),
                        fence: e.fence()?,
                    })
                })
                .collect(),
        }
    }

    /// Raises fences to persisted ones at `now_ms` (a restart): an entry's fence only
    /// moves up, and an imported entry holds no readings until a newer batch arrives.
    ///
    /// Imported entries count against the caps like any other, and are forgotten after
    /// [`super::FENCE_RETENTION_MS`] without batches.
    ///
    /// A fence whose epoch is more than [`crate::batch::MAX_EPOCH_LEAD_MS`] ahead of
    /// `now_ms` is refused, as admission would refuse its batch: it was admitted under a
    /// clock that has since stepped back, and retaining it would refuse every honest batch
    /// (the site's own, published in an epoch clamped to the clock) until the clock
    /// caught up.
    pub fn import_fences(&mut self, set: &FenceSet, now_ms: u64) -> FenceImport {
        let mut outcome = FenceImport::default();
        for record in &set.records {
            let valid = check_bounded("grid_site", &record.site, MAX_KEY_BYTES).is_ok()
                && check_bounded("grid_provider", &record.provider, MAX_KEY_BYTES).is_ok()
                && !epoch_too_far(record.fence.epoch, now_ms);
            match valid
                .then(|| self.entry_mut_or_create(&record.site, &record.provider, now_ms))
                .flatten()
            {
                Some(entry) => {
                    entry.gate.raise_to(record.fence);
                    outcome.applied += 1;
                }
                None => outcome.refused += 1,
            }
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::super::DropReason;
    use super::super::fixture::{T0, admit, batch, store};
    use super::*;
    use crate::batch::{Fence, MAX_KEY_BYTES};

    #[test]
    fn fences_survive_a_restart_through_serde() {
        let mut before = store();
        admit(
            &mut before,
            batch("b", "m", Fence::new(T0, 7), &[("q", 1.0)], T0),
            T0,
        );
        let json = serde_json::to_string(&before.export_fences()).unwrap();
        let set: FenceSet = serde_json::from_str(&json).unwrap();
        assert_eq!(set, before.export_fences());

        let mut after = store();
        let outcome = after.import_fences(&set, T0 + 1);
        assert_eq!(
            outcome,
            FenceImport {
                applied: 1,
                refused: 0
            }
        );
        // A batch delayed across the restart is still refused.
        let r = admit(
            &mut after,
            batch("b", "m", Fence::new(T0, 6), &[("q", 9.0)], T0),
            T0 + 1,
        );
        assert_eq!(r.dropped.get(DropReason::Delayed), 2);
        let r = admit(
            &mut after,
            batch("b", "m", Fence::new(T0, 8), &[("q", 2.0)], T0),
            T0 + 1,
        );
        assert_eq!(r.batches_stored, 1);
    }

    #[test]
    fn import_never_lowers_a_fence_and_refuses_invalid_records() {
        let mut s = store();
        admit(
            &mut s,
            batch("b", "m", Fence::new(T0, 7), &[("q", 1.0)], T0),
            T0,
        );
        let set = FenceSet {
            records: vec![
                FenceRecord {
                    site: "b".into(),
                    provider: "m".into(),
                    fence: Fence::new(T0, 3),
                },
                FenceRecord {
                    site: "x".repeat(MAX_KEY_BYTES + 1),
                    provider: "m".into(),
                    fence: Fence::new(T0, 3),
                },
                FenceRecord {
                    site: String::new(),
                    provider: "m".into(),
                    fence: Fence::new(T0, 3),
                },
            ],
        };
        assert_eq!(
            s.import_fences(&set, T0),
            FenceImport {
                applied: 1,
                refused: 2
            }
        );
        assert_eq!(s.entry("b", "m").unwrap().fence(), Some(Fence::new(T0, 7)));
    }

    #[test]
    fn a_fence_exactly_at_the_epoch_lead_is_imported_and_one_past_it_is_refused() {
        use crate::batch::MAX_EPOCH_LEAD_MS;
        let record = |provider: &str, epoch: u64| FenceRecord {
            site: "b".into(),
            provider: provider.into(),
            fence: Fence::new(epoch, 40),
        };
        let set = FenceSet {
            records: vec![
                record("at", T0 + MAX_EPOCH_LEAD_MS),
                record("past", T0 + MAX_EPOCH_LEAD_MS + 1),
            ],
        };
        let mut s = store();
        assert_eq!(
            s.import_fences(&set, T0),
            FenceImport {
                applied: 1,
                refused: 1
            }
        );
        assert!(s.entry("b", "past").is_none());
        // The provider whose fence was refused admits the honest batch of its clock.
        let r = admit(
            &mut s,
            batch("b", "past", Fence::new(T0, 1), &[("q", 1.0)], T0),
            T0,
        );
        assert_eq!(r.batches_stored, 1);
    }
}
