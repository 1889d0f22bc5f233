//! Carrying fences across restarts.

use super::Store;
use crate::batch::{FenceRecord, FenceSet, MAX_KEY_BYTES, check_bounded};

/// What [`Store::import_fences`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FenceImport {
    /// Records applied (a fence raised or a new entry created).
    pub applied: usize,
    /// Records refused: names out of bounds, or no room under the provider caps.
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
    pub fn import_fences(&mut self, set: &FenceSet, now_ms: u64) -> FenceImport {
        let mut outcome = FenceImport::default();
        for record in &set.records {
            let valid = check_bounded("grid_site", &record.site, MAX_KEY_BYTES).is_ok()
                && check_bounded("grid_provider", &record.provider, MAX_KEY_BYTES).is_ok();
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
