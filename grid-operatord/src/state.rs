//! What the operator must remember across restarts: the publisher-epoch high-water mark,
//! the batch fences of every provider it holds, and the ingest-feedback state.
//!
//! Both sit behind [`StateStore`], so a Kubernetes controller can keep them in a
//! `ConfigMap` or a status instead; the standalone daemon uses [`FileStateStore`], which
//! replaces each file atomically (write a temporary file, fsync it, rename it over the old
//! one, fsync the directory) so a crash leaves either the old or the new state, never a
//! torn one.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use grid_feedback::ReceiverState;
use grid_signals::batch::{FenceSet, MAX_EPOCH_LEAD_MS};
use serde::{Deserialize, Serialize};

use crate::Error;

/// File name of the publisher-epoch high-water mark under the state directory.
pub const EPOCH_FILE: &str = "publisher-epoch.json";
/// File name of the feedback receiver state under the state directory.
pub const FEEDBACK_FILE: &str = "feedback.json";
/// File name of the store's batch fences (per site and provider) under the state directory.
pub const FENCES_FILE: &str = "fences.json";

/// Durable storage of the operator's state.
pub trait StateStore: Send + Sync {
    /// The highest publisher epoch ever persisted, if any.
    fn load_epoch_hwm(&self) -> Result<Option<u64>, Error>;
    /// Persists `hwm` durably before returning.
    fn store_epoch_hwm(&self, hwm: u64) -> Result<(), Error>;
    /// The last persisted feedback state, if any.
    fn load_feedback(&self) -> Result<Option<ReceiverState>, Error>;
    /// Persists the feedback state durably before returning.
    fn store_feedback(&self, state: &ReceiverState) -> Result<(), Error>;
    /// The last persisted batch fences, if any.
    fn load_fences(&self) -> Result<Option<FenceSet>, Error>;
    /// Persists the batch fences durably before returning.
    fn store_fences(&self, fences: &FenceSet) -> Result<(), Error>;
    /// States whether every member met runs this site's signal transport mode `own`:
    /// `mismatched` names those refused at join for declaring another. A store with
    /// nowhere to state it (the state directory) does nothing; the log line and
    /// `grid_operator_membership_mode_mismatch` say it in every mode.
    fn store_mode_agreement(&self, own: &str, mismatched: &[String]) -> Result<(), Error> {
        let _ = (own, mismatched);
        Ok(())
    }
}

/// The publisher epoch a start chose, and whether the persisted mark forced a clamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartEpoch {
    /// This process's publisher epoch.
    pub epoch: u64,
    /// The mark persisted before this start, if any.
    pub previous_mark: Option<u64>,
    /// How far that mark was ahead of the clock at start, in milliseconds, when it was
    /// more than [`MAX_EPOCH_LEAD_MS`] ahead (the epoch was clamped); `None` otherwise.
    pub clamped_lead_ms: Option<u64>,
}

/// The publisher epoch for this process: wall-clock based, but strictly above every
/// epoch persisted before, so it still moves forward when the clock stepped back across a
/// restart. It is persisted before it is returned, so no batch can carry an epoch a later
/// restart might reuse.
///
/// One exception, when the mark is more than [`MAX_EPOCH_LEAD_MS`] ahead of the clock
/// (the previous process ran with a clock that was far ahead): `mark + 1` would be refused
/// as `skew` by every receiver, this operator's own store included, until the clock
/// catches up, which silently removes the site. The epoch is then `now +
/// MAX_EPOCH_LEAD_MS`, the highest one a receiver with a right clock admits. It is still
/// above every fence such a receiver can hold for this site, since a receiver retains no
/// epoch more than that lead ahead of its own clock at admission, which was before
/// `now`. The mark is lowered to it, so later restarts move up from there.
pub fn start_epoch(store: &dyn StateStore, now_ms: u64) -> Result<StartEpoch, Error> {
    let previous_mark = store.load_epoch_hwm()?;
    let floor = previous_mark.map_or(0, |h| h.saturating_add(1));
    let bound = now_ms.saturating_add(MAX_EPOCH_LEAD_MS);
    let (epoch, clamped_lead_ms) = if floor > bound {
        (bound, previous_mark.map(|h| h.saturating_sub(now_ms)))
    } else {
        (now_ms.max(floor), None)
    };
    store.store_epoch_hwm(epoch)?;
    Ok(StartEpoch {
        epoch,
        previous_mark,
        clamped_lead_ms,
    })
}

/// State kept as files in one directory.
#[derive(Clone, Debug)]
pub struct FileStateStore {
    dir: PathBuf,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct EpochFile {
    /// Decimal text: the value spans u64, which JSON numbers read as doubles cannot hold.
    high_water_mark: String,
}

impl FileStateStore {
    /// A store in `dir`. Nothing is created here: a missing directory reads as empty
    /// and is created (with parents) by the first write, which the driver makes only once
    /// everything else of the configuration was checked (certificate, key, CA,
    /// listeners), so a start that is refused leaves nothing behind. A path that exists
    /// and is not a directory is refused.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, Error> {
        let dir = dir.into();
        match std::fs::metadata(&dir) {
            Ok(m) if !m.is_dir() => Err(Error::Io {
                path: dir,
                source: std::io::Error::new(
                    std::io::ErrorKind::NotADirectory,
                    "stateDir names something that is not a directory",
                ),
            }),
            _ => Ok(Self { dir }),
        }
    }

    fn read(&self, name: &str) -> Result<Option<Vec<u8>>, Error> {
        let path = self.dir.join(name);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::Io { path, source }),
        }
    }

    fn write(&self, name: &str, bytes: &[u8]) -> Result<(), Error> {
        std::fs::create_dir_all(&self.dir).map_err(|source| Error::Io {
            path: self.dir.clone(),
            source,
        })?;
        let path = self.dir.join(name);
        atomic_write(&path, bytes).map_err(|source| Error::Io { path, source })
    }
}

fn corrupt(path: PathBuf, reason: &impl ToString) -> Error {
    Error::StateCorrupt {
        path,
        reason: reason.to_string(),
    }
}

impl StateStore for FileStateStore {
    fn load_epoch_hwm(&self) -> Result<Option<u64>, Error> {
        let Some(bytes) = self.read(EPOCH_FILE)? else {
            return Ok(None);
        };
        let path = self.dir.join(EPOCH_FILE);
        let file: EpochFile =
            serde_json::from_slice(&bytes).map_err(|e| corrupt(path.clone(), &e))?;
        file.high_water_mark
            .parse()
            .map(Some)
            .map_err(|e| corrupt(path, &format!("highWaterMark: {e}")))
    }

    fn store_epoch_hwm(&self, hwm: u64) -> Result<(), Error> {
        let body = serde_json::to_vec(&EpochFile {
            high_water_mark: hwm.to_string(),
        })
        .map_err(|e| corrupt(self.dir.join(EPOCH_FILE), &e))?;
        self.write(EPOCH_FILE, &body)
    }

    fn load_feedback(&self) -> Result<Option<ReceiverState>, Error> {
        let Some(bytes) = self.read(FEEDBACK_FILE)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| corrupt(self.dir.join(FEEDBACK_FILE), &e))
    }

    fn store_feedback(&self, state: &ReceiverState) -> Result<(), Error> {
        let body = serde_json::to_vec_pretty(state)
            .map_err(|e| corrupt(self.dir.join(FEEDBACK_FILE), &e))?;
        self.write(FEEDBACK_FILE, &body)
    }

    fn load_fences(&self) -> Result<Option<FenceSet>, Error> {
        let Some(bytes) = self.read(FENCES_FILE)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| corrupt(self.dir.join(FENCES_FILE), &e))
    }

    fn store_fences(&self, fences: &FenceSet) -> Result<(), Error> {
        let body =
            serde_json::to_vec(fences).map_err(|e| corrupt(self.dir.join(FENCES_FILE), &e))?;
        self.write(FENCES_FILE, &body)
    }
}

/// Replaces `path` with `bytes` so that a crash at any point leaves the old or the new
/// content: write a sibling temporary file, fsync it, rename it over `path`, fsync the
/// directory so the rename itself is durable.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    // A name of its own per write: two writers of one file never share (and rename away)
    // each other's temporary file.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".{}.{n}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_start_uses_the_wall_clock_and_persists_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::open(dir.path()).unwrap();
        assert_eq!(start_epoch(&store, 1_000).unwrap().epoch, 1_000);
        assert_eq!(store.load_epoch_hwm().unwrap(), Some(1_000));
    }

    #[test]
    fn epoch_moves_forward_when_the_clock_steps_back_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let first = start_epoch(&FileStateStore::open(dir.path()).unwrap(), 5_000)
            .unwrap()
            .epoch;
        // Restart: a fresh store on the same directory, clock now behind the old epoch.
        let reopened = FileStateStore::open(dir.path()).unwrap();
        let second = start_epoch(&reopened, 4_000).unwrap().epoch;
        assert_eq!(second, first + 1);
        let third = start_epoch(&FileStateStore::open(dir.path()).unwrap(), 9_000)
            .unwrap()
            .epoch;
        assert_eq!(third, 9_000);
    }

    #[test]
    fn epoch_at_u64_max_saturates_instead_of_wrapping() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::open(dir.path()).unwrap();
        store.store_epoch_hwm(u64::MAX).unwrap();
        assert_eq!(start_epoch(&store, u64::MAX).unwrap().epoch, u64::MAX);
    }

    const NOW: u64 = 1_700_000_000_000;

    #[test]
    fn a_mark_exactly_at_the_lead_bound_is_followed_and_one_past_it_is_clamped() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::open(dir.path()).unwrap();
        // mark + 1 == now + lead: still admitted everywhere, so the mark rules.
        store.store_epoch_hwm(NOW + MAX_EPOCH_LEAD_MS - 1).unwrap();
        let at = start_epoch(&store, NOW).unwrap();
        assert_eq!(at.epoch, NOW + MAX_EPOCH_LEAD_MS);
        assert_eq!(at.clamped_lead_ms, None);
        // mark + 1 one past the bound: clamped to the bound, the lead reported.
        store.store_epoch_hwm(NOW + MAX_EPOCH_LEAD_MS).unwrap();
        let past = start_epoch(&store, NOW).unwrap();
        assert_eq!(past.epoch, NOW + MAX_EPOCH_LEAD_MS);
        assert_eq!(past.clamped_lead_ms, Some(MAX_EPOCH_LEAD_MS));
        assert_eq!(past.previous_mark, Some(NOW + MAX_EPOCH_LEAD_MS));
    }

    #[test]
    fn a_clamped_start_lowers_the_mark_so_the_next_start_moves_up_from_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::open(dir.path()).unwrap();
        store.store_epoch_hwm(NOW + 3_600_000).unwrap();
        let first = start_epoch(&store, NOW).unwrap();
        assert_eq!(first.epoch, NOW + MAX_EPOCH_LEAD_MS);
        assert_eq!(first.clamped_lead_ms, Some(3_600_000));
        assert_eq!(store.load_epoch_hwm().unwrap(), Some(first.epoch));
        // A restart one second later, same clock: above the clamped epoch, not clamped.
        let second = start_epoch(&store, NOW + 1_000).unwrap();
        assert_eq!(second.epoch, first.epoch + 1);
        assert_eq!(second.clamped_lead_ms, None);
    }

    #[test]
    fn corrupt_state_is_refused_not_reset() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(EPOCH_FILE), b"{\"highWaterMark\": \"x\"}").unwrap();
        std::fs::write(dir.path().join(FEEDBACK_FILE), b"not json").unwrap();
        let store = FileStateStore::open(dir.path()).unwrap();
        assert!(matches!(
            store.load_epoch_hwm(),
            Err(Error::StateCorrupt { .. })
        ));
        assert!(matches!(
            store.load_feedback(),
            Err(Error::StateCorrupt { .. })
        ));
        assert!(matches!(
            start_epoch(&store, 1),
            Err(Error::StateCorrupt { .. })
        ));
    }

    #[test]
    fn feedback_state_round_trips_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::open(dir.path()).unwrap();
        assert_eq!(store.load_feedback().unwrap(), None);
        let mut registry = prometheus_client::registry::Registry::default();
        let receiver = grid_feedback::Receiver::new(
            1_000,
            grid_feedback::ReceiverMetrics::register(&mut registry),
        );
        store.store_feedback(receiver.state()).unwrap();
        let back = FileStateStore::open(dir.path())
            .unwrap()
            .load_feedback()
            .unwrap();
        assert_eq!(back.as_ref(), Some(receiver.state()));
    }

    #[test]
    fn fences_round_trip_through_the_file() {
        use grid_signals::batch::{Fence, FenceRecord};
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::open(dir.path()).unwrap();
        assert_eq!(store.load_fences().unwrap(), None);
        let set = FenceSet {
            records: vec![FenceRecord {
                site: "b".into(),
                provider: "m".into(),
                fence: Fence::new(u64::MAX - 1, 7),
            }],
        };
        store.store_fences(&set).unwrap();
        assert_eq!(
            FileStateStore::open(dir.path())
                .unwrap()
                .load_fences()
                .unwrap(),
            Some(set)
        );
    }

    #[test]
    fn concurrent_atomic_writes_of_one_file_all_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let writers: Vec<_> = (0..4)
            .map(|i| {
                let path = path.clone();
                std::thread::spawn(move || {
                    (0..50)
                        .map(|_| atomic_write(&path, format!("writer {i}").as_bytes()))
                        .collect::<Result<Vec<()>, _>>()
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap().expect("every write lands");
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("f")]);
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        atomic_write(&path, b"one").unwrap();
        atomic_write(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("f")]);
    }
}
