//! What the fault suite checks was not lost: every operator's persisted fences and epoch
//! mark, and the gateway's rejection evidence.
//!
//! A fence (per holder, site and provider) or an epoch mark is lost when a later read of
//! the state directory shows it lower than an earlier one: a restart that came back from
//! older state, or a write that went backwards. [`FenceWatch`] reads every operator's
//! state directory every [`FENCE_SAMPLE_EVERY`] while the suite runs and once more after
//! the grid's graceful stop, and counts each such regression.
//!
//! Evidence is lost when the gateway discarded readings for implausible ages (its
//! feedback reporter's cumulative count) and its operator's persisted feedback state
//! never came to hold that count: [`settle_evidence`] waits up to [`EVIDENCE_LIMIT`] for
//! the two to agree.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use grid_operatord::state::{FileStateStore, StateStore};
use grid_signals::batch::Fence;

use grid_kit::clock::Stopwatch;
use grid_kit::local_grid::LocalGrid;

/// How often the state directories are read.
pub const FENCE_SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// How long the gateway's evidence is given to reach its operator's persisted state.
pub const EVIDENCE_LIMIT: Duration = Duration::from_secs(10);
/// How long a True `GatewayAgesRejected` is then given to clear (the gateway's next
/// clean report resolves it).
pub const RESOLVE_LIMIT: Duration = Duration::from_secs(15);

/// Every operator's persisted fences and epoch mark, as read so far.
#[derive(Debug, Default)]
pub struct FenceWatch {
    dirs: Vec<(String, PathBuf)>,
    /// Highest fence read per (holder, site, provider).
    fences: BTreeMap<(String, String, String), Fence>,
    /// Highest epoch mark read per holder.
    marks: BTreeMap<String, u64>,
    /// Reads that went below an earlier one, described.
    pub regressions: Vec<String>,
    /// How many state directory reads were made.
    pub reads: u64,
}

impl FenceWatch {
    /// Watches every site of `grid`.
    pub fn of(grid: &LocalGrid) -> Self {
        Self {
            dirs: grid
                .site_names()
                .filter_map(|s| Some((s.to_owned(), grid.state_dir(s)?.to_path_buf())))
                .collect(),
            ..Self::default()
        }
    }

    /// Reads every state directory once. A file a crashed operator never wrote is absent,
    /// not a regression; an unreadable one is a regression (a restart could not load it).
    pub fn read(&mut self) {
        for (holder, dir) in &self.dirs {
            self.reads += 1;
            let Ok(store) = FileStateStore::open(dir) else {
                self.regressions
                    .push(format!("{holder}: state directory unreadable"));
                continue;
            };
            match store.load_epoch_hwm() {
                Ok(Some(mark)) => {
                    let seen = self.marks.entry(holder.clone()).or_insert(mark);
                    if mark < *seen {
                        self.regressions
                            .push(format!("{holder}: epoch mark {mark} below {seen}"));
                    }
                    *seen = (*seen).max(mark);
                }
                Ok(None) => {}
                Err(e) => self.regressions.push(format!("{holder}: epoch mark: {e}")),
            }
            match store.load_fences() {
                Ok(Some(set)) => {
                    for r in set.records {
                        let key = (holder.clone(), r.site, r.provider);
                        match self.fences.get_mut(&key) {
                            Some(seen) if r.fence < *seen => self.regressions.push(format!(
                                "{}: fence of {}/{} {:?} below {:?}",
                                key.0, key.1, key.2, r.fence, seen
                            )),
                            Some(seen) => *seen = r.fence,
                            None => {
                                self.fences.insert(key, r.fence);
                            }
                        }
                    }
                }
                Ok(None) => {}
                Err(e) => self.regressions.push(format!("{holder}: fences: {e}")),
            }
        }
    }

    /// The fences tracked: (holder, site, provider) triples read at least once.
    pub fn tracked(&self) -> usize {
        self.fences.len()
    }
}

/// The gateway's rejection evidence against what its operator persisted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Evidence {
    /// Readings the gateway discarded for implausible ages: its reporter's cumulative count.
    pub observed: u64,
    /// The cumulative count the local operator's persisted feedback state holds for the
    /// gateway (its newest reporter identity).
    pub persisted: u64,
    /// Whether the persisted `GatewayAgesRejected` was True once the counts agreed
    /// (unresolved evidence).
    pub unresolved: bool,
    /// When it was: how long it then took to clear, if within [`RESOLVE_LIMIT`].
    pub cleared_after: Option<Duration>,
}

impl Evidence {
    /// Observed evidence the operator never came to hold.
    pub fn lost(self) -> u64 {
        self.observed.saturating_sub(self.persisted)
    }
}

/// The newest reporter's persisted cumulative count and whether the condition is True.
fn persisted(grid: &LocalGrid, local: &str) -> (u64, bool) {
    let Some(state) = grid
        .state_dir(local)
        .and_then(|d| FileStateStore::open(d).ok())
        .and_then(|s| s.load_feedback().ok().flatten())
    else {
        return (0, false);
    };
    let rejected = state
        .reporters
        .iter()
        .max_by_key(|r| r.epoch)
        .map_or(0, |r| r.rejected);
    (
        rejected,
        state.condition.status == grid_feedback::ConditionStatus::True,
    )
}

/// Waits up to [`EVIDENCE_LIMIT`] for the gateway's evidence to reach the persisted
/// feedback state of `local` (the gateway's operator); returns both counts then, and
/// when the condition was True, how long it took to clear (up to [`RESOLVE_LIMIT`]).
pub async fn settle_evidence(grid: &LocalGrid, local: &str) -> Evidence {
    let watch = Stopwatch::start();
    let mut e = loop {
        let observed = grid.gateway_skew_drops();
        let (persisted, unresolved) = persisted(grid, local);
        let e = Evidence {
            observed,
            persisted,
            unresolved,
            cleared_after: None,
        };
        if e.lost() == 0 || watch.elapsed() >= EVIDENCE_LIMIT {
            break e;
        }
        tokio::time::sleep(FENCE_SAMPLE_EVERY).await;
    };
    if e.unresolved {
        let clearing = Stopwatch::start();
        while clearing.elapsed() < RESOLVE_LIMIT {
            if !persisted(grid, local).1 {
                e.cleared_after = Some(clearing.elapsed());
                break;
            }
            tokio::time::sleep(FENCE_SAMPLE_EVERY).await;
        }
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use grid_signals::batch::{FenceRecord, FenceSet};

    fn watch_of(dir: &std::path::Path) -> FenceWatch {
        FenceWatch {
            dirs: vec![("a".into(), dir.to_path_buf())],
            ..FenceWatch::default()
        }
    }

    fn fences(epoch: u64, sequence: u64) -> FenceSet {
        FenceSet {
            records: vec![FenceRecord {
                site: "c".into(),
                provider: "pool".into(),
                fence: Fence::new(epoch, sequence),
            }],
        }
    }

    #[test]
    fn a_fence_that_moves_forward_is_not_a_loss_and_one_that_moves_back_is() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::open(dir.path()).unwrap();
        let mut watch = watch_of(dir.path());
        watch.read();
        assert!(watch.regressions.is_empty(), "no files yet is no loss");
        store.store_fences(&fences(5, 1)).unwrap();
        store.store_epoch_hwm(10).unwrap();
        watch.read();
        store.store_fences(&fences(5, 2)).unwrap();
        store.store_epoch_hwm(11).unwrap();
        watch.read();
        assert!(watch.regressions.is_empty(), "{:?}", watch.regressions);
        assert_eq!(watch.tracked(), 1);
        store.store_fences(&fences(5, 1)).unwrap();
        store.store_epoch_hwm(9).unwrap();
        watch.read();
        assert_eq!(watch.regressions.len(), 2, "{:?}", watch.regressions);
    }

    #[test]
    fn evidence_is_lost_only_where_the_persisted_count_falls_short() {
        let e = Evidence {
            observed: 3,
            persisted: 3,
            unresolved: true,
            cleared_after: None,
        };
        assert_eq!(e.lost(), 0);
        assert_eq!(Evidence { persisted: 1, ..e }.lost(), 2);
    }
}
