//! Flow-control priority bands: where a site holds requests before scheduling, one FIFO
//! per priority, each with an optional request capacity.
//!
//! The registry is the one source both the flow controller (admission, dispatch) and the
//! EPP's readers (the exposition, the response headers) look at, as in llm-d where the
//! flow controller and the response layer share the band registry. Band
//! [`FALLBACK_PRIORITY`] is always provisioned: a request asking for a band that is not
//! provisioned is admitted there instead, as llm-d's flow controller does.
//!
//! Headroom is advisory: `capacity - len`, clamped to 0, read when asked (at response
//! time), never a reservation.

use std::collections::{BTreeMap, VecDeque};

use crate::Error;

/// A band's priority; higher is served first (the llm-d / GIE convention, where
/// objectives carry an integer priority and negative is sheddable).
pub type Priority = i32;

/// The band every site provisions and the one a request for an unprovisioned band falls
/// back to.
pub const FALLBACK_PRIORITY: Priority = 0;
/// The most bands a site may provision: far above the handful of objectives a pool has,
/// and low enough that the per-band exposition stays small.
pub const MAX_BANDS: usize = 64;
/// The largest request capacity a band may have: far above any queue a simulated site
/// holds, so a configuration past it is a mistake.
pub const MAX_BAND_CAPACITY: usize = 1 << 20;

/// One band as configured: its priority and request capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BandConfig {
    /// Its priority.
    pub priority: Priority,
    /// The most requests it holds (`maxRequests`); `None` is unbounded, and its headroom
    /// is never reported. `Some(0)` refuses every request (a band closed to new work).
    pub capacity: Option<usize>,
}

/// A band's state at one instant: what the response layer's capacity reader returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BandSnapshot {
    /// Its request capacity (`None`: unbounded).
    pub capacity: Option<usize>,
    /// Requests it holds now.
    pub len: usize,
}

impl BandSnapshot {
    /// `capacity - len` clamped to 0 (a band whose capacity was lowered below its length
    /// reports 0, not a negative); `None` for an unbounded band, which has no headroom to
    /// advise.
    pub fn headroom(&self) -> Option<u64> {
        self.capacity.map(|c| c.saturating_sub(self.len) as u64)
    }
}

/// How a request went through flow control, known once it left its band (was
/// dispatched). Rejected, expired and cancelled requests never get one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowAdmission {
    /// The band that actually admitted it: the requested one if provisioned at arrival,
    /// else [`FALLBACK_PRIORITY`]. Fixed at admission, never recomputed, so a band
    /// provisioned later does not change it.
    pub band: Priority,
    /// How long it waited in the band, in ms (0: dispatched at once).
    pub queued_ms: u64,
}

/// Why a capacity snapshot could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("band capacity snapshot unavailable")]
pub struct SnapshotError;

/// The narrow, read-only view of the band registry the response layer uses (llm-d's
/// `CapacityReader`): it can read a band, never change one.
pub trait CapacityReader {
    /// The band at `priority` now; `Ok(None)` when it is not provisioned.
    fn capacity_snapshot(&self, priority: Priority) -> Result<Option<BandSnapshot>, SnapshotError>;
}

/// The headroom to advertise for a request admitted to `band`, read from `reader` now.
///
/// `None` (the header is omitted) when there is no reader, the request was not admitted
/// through flow control (`band` is `None`), the band cannot be resolved any more, the
/// snapshot cannot be read, or the band is unbounded. A failed read never fails the
/// request: it only leaves the advisory signal out.
pub fn band_headroom(reader: Option<&dyn CapacityReader>, band: Option<Priority>) -> Option<u64> {
    let band = band?;
    reader?.capacity_snapshot(band).ok()??.headroom()
}

/// Why flow control dropped a request, as llm-d names it in
/// `x-llm-d-request-dropped-reason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// Its band was at capacity (429).
    Saturated,
    /// No endpoint could serve it (503).
    NoEndpoints,
    /// It waited in its band past the flow-control TTL (429, as llm-d answers in practice).
    TtlExpired,
}

impl DropReason {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Saturated => "rejected-saturated",
            Self::NoEndpoints => "rejected-no-endpoints",
            Self::TtlExpired => "rejected-ttl-expired",
        }
    }
}

#[derive(Clone, Debug)]
struct Band<T> {
    capacity: Option<usize>,
    queue: VecDeque<T>,
}

impl<T> Band<T> {
    fn snapshot(&self) -> BandSnapshot {
        BandSnapshot {
            capacity: self.capacity,
            len: self.queue.len(),
        }
    }
}

/// The band registry: bands by priority, each a FIFO of held requests.
#[derive(Clone, Debug)]
pub(super) struct Bands<T> {
    bands: BTreeMap<Priority, Band<T>>,
}

impl<T> Bands<T> {
    /// The configured bands, plus an unbounded fallback band unless one is configured.
    pub(super) fn new(configs: &[BandConfig]) -> Self {
        let mut bands = BTreeMap::new();
        bands.insert(
            FALLBACK_PRIORITY,
            Band {
                capacity: None,
                queue: VecDeque::new(),
            },
        );
        for c in configs {
            bands.insert(
                c.priority,
                Band {
                    capacity: c.capacity,
                    queue: VecDeque::new(),
                },
            );
        }
        Self { bands }
    }

    /// Checks a configuration: within [`MAX_BANDS`] and [`MAX_BAND_CAPACITY`], no
    /// priority twice.
    pub(super) fn validate(configs: &[BandConfig]) -> Result<(), Error> {
        let invalid = |reason| {
            Err(Error::InvalidConfig {
                field: "bands",
                reason,
            })
        };
        let mut priorities: Vec<Priority> = configs.iter().map(|c| c.priority).collect();
        priorities.sort_unstable();
        priorities.dedup();
        if priorities.len() < configs.len() {
            return invalid("must not name a priority twice");
        }
        let fallback_added = usize::from(priorities.binary_search(&FALLBACK_PRIORITY).is_err());
        if priorities.len() + fallback_added > MAX_BANDS {
            return invalid("must be at most MAX_BANDS");
        }
        if configs
            .iter()
            .any(|c| c.capacity.is_some_and(|n| n > MAX_BAND_CAPACITY))
        {
            return invalid("capacity must be at most MAX_BAND_CAPACITY");
        }
        Ok(())
    }

    /// The band that admits a request asking for `requested`: that band if provisioned,
    /// else the fallback band.
    pub(super) fn resolve(&self, requested: Priority) -> Priority {
        if self.bands.contains_key(&requested) {
            requested
        } else {
            FALLBACK_PRIORITY
        }
    }

    /// Whether `band` is bounded and holds its capacity or more.
    pub(super) fn is_full(&self, band: Priority) -> bool {
        self.bands
            .get(&band)
            .is_some_and(|b| b.capacity.is_some_and(|capacity| b.queue.len() >= capacity))
    }

    /// Appends to `band` (resolved by the caller, so provisioned).
    pub(super) fn push(&mut self, band: Priority, item: T) {
        if let Some(b) = self.bands.get_mut(&band) {
            b.queue.push_back(item);
        }
    }

    /// Takes the oldest request of the highest-priority band that holds any.
    pub(super) fn pop_next(&mut self) -> Option<(Priority, T)> {
        self.bands
            .iter_mut()
            .rev()
            .find_map(|(p, b)| b.queue.pop_front().map(|item| (*p, item)))
    }

    /// Removes the first request matching `is` from whichever band holds it.
    pub(super) fn remove(&mut self, is: impl Fn(&T) -> bool) -> Option<T> {
        self.bands.values_mut().find_map(|b| {
            let i = b.queue.iter().position(&is)?;
            b.queue.remove(i)
        })
    }

    /// Every held request, every band emptied.
    pub(super) fn drain(&mut self) -> Vec<T> {
        self.bands
            .values_mut()
            .rev()
            .flat_map(|b| b.queue.drain(..))
            .collect()
    }

    /// The oldest request of each band.
    pub(super) fn fronts(&self) -> impl Iterator<Item = &T> + '_ {
        self.bands.values().filter_map(|b| b.queue.front())
    }

    /// Takes every band's front requests while `expired` holds for them.
    pub(super) fn pop_expired(&mut self, expired: impl Fn(&T) -> bool) -> Vec<T> {
        let mut out = Vec::new();
        for b in self.bands.values_mut() {
            while b.queue.front().is_some_and(&expired) {
                out.extend(b.queue.pop_front());
            }
        }
        out
    }

    /// Requests held over all bands.
    pub(super) fn len(&self) -> usize {
        self.bands.values().map(|b| b.queue.len()).sum()
    }

    /// Whether no band holds anything.
    pub(super) fn is_empty(&self) -> bool {
        self.bands.values().all(|b| b.queue.is_empty())
    }

    /// The band at `priority` now, if provisioned.
    pub(super) fn snapshot(&self, priority: Priority) -> Option<BandSnapshot> {
        self.bands.get(&priority).map(Band::snapshot)
    }

    /// Every band, lowest priority first.
    pub(super) fn snapshots(&self) -> impl Iterator<Item = (Priority, BandSnapshot)> + '_ {
        self.bands.iter().map(|(p, b)| (*p, b.snapshot()))
    }

    /// Provisions `priority` or changes its capacity. A capacity lowered below the
    /// band's length keeps what it holds (the band is over capacity until it drains).
    pub(super) fn set(&mut self, priority: Priority, capacity: Option<usize>) -> Result<(), Error> {
        let refuse = |reason| Err(Error::BandRefused { priority, reason });
        if capacity.is_some_and(|n| n > MAX_BAND_CAPACITY) {
            return refuse("capacity must be at most MAX_BAND_CAPACITY");
        }
        if let Some(b) = self.bands.get_mut(&priority) {
            b.capacity = capacity;
            return Ok(());
        }
        if self.bands.len() >= MAX_BANDS {
            return refuse("the site already has MAX_BANDS bands");
        }
        self.bands.insert(
            priority,
            Band {
                capacity,
                queue: VecDeque::new(),
            },
        );
        Ok(())
    }

    /// Deprovisions an empty band other than the fallback band. Requests it admitted
    /// earlier keep it as their band, which then no longer resolves.
    pub(super) fn unset(&mut self, priority: Priority) -> Result<(), Error> {
        let refuse = |reason| Err(Error::BandRefused { priority, reason });
        if priority == FALLBACK_PRIORITY {
            return refuse("the fallback band is always provisioned");
        }
        match self.bands.get(&priority) {
            None => refuse("is not provisioned"),
            Some(b) if !b.queue.is_empty() => refuse("still holds requests"),
            Some(_) => {
                self.bands.remove(&priority);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Failing;

    impl CapacityReader for Failing {
        fn capacity_snapshot(&self, _: Priority) -> Result<Option<BandSnapshot>, SnapshotError> {
            Err(SnapshotError)
        }
    }

    struct Fixed(Option<BandSnapshot>);

    impl CapacityReader for Fixed {
        fn capacity_snapshot(&self, _: Priority) -> Result<Option<BandSnapshot>, SnapshotError> {
            Ok(self.0)
        }
    }

    fn bounded(capacity: usize, len: usize) -> Fixed {
        Fixed(Some(BandSnapshot {
            capacity: Some(capacity),
            len,
        }))
    }

    #[test]
    fn a_band_of_capacity_100_holding_81_has_a_headroom_of_19() {
        assert_eq!(band_headroom(Some(&bounded(100, 81)), Some(0)), Some(19));
    }

    #[test]
    fn a_full_or_over_capacity_band_has_a_headroom_of_0() {
        assert_eq!(band_headroom(Some(&bounded(100, 100)), Some(0)), Some(0));
        assert_eq!(band_headroom(Some(&bounded(100, 130)), Some(0)), Some(0));
    }

    #[test]
    fn headroom_is_omitted_for_an_unbounded_band_a_missing_band_or_no_admission() {
        let unbounded = Fixed(Some(BandSnapshot {
            capacity: None,
            len: 3,
        }));
        assert_eq!(band_headroom(Some(&unbounded), Some(0)), None);
        assert_eq!(band_headroom(Some(&Fixed(None)), Some(5)), None);
        assert_eq!(band_headroom(Some(&bounded(10, 1)), None), None);
    }

    #[test]
    fn headroom_is_omitted_when_the_snapshot_fails_or_no_reader_is_available() {
        assert_eq!(band_headroom(Some(&Failing), Some(0)), None);
        assert_eq!(band_headroom(None, Some(0)), None);
    }

    #[test]
    fn dispatch_takes_the_highest_priority_band_first_and_each_band_in_order() {
        let mut bands: Bands<u32> = Bands::new(&[
            BandConfig {
                priority: 5,
                capacity: None,
            },
            BandConfig {
                priority: -1,
                capacity: None,
            },
        ]);
        for (band, item) in [(-1, 1), (0, 2), (5, 3), (0, 4), (5, 5)] {
            bands.push(band, item);
        }
        let order: Vec<(Priority, u32)> = std::iter::from_fn(|| bands.pop_next()).collect();
        assert_eq!(order, vec![(5, 3), (5, 5), (0, 2), (0, 4), (-1, 1)]);
    }

    #[test]
    fn the_fallback_band_cannot_be_removed_and_a_band_holding_requests_neither() {
        let mut bands: Bands<u32> = Bands::new(&[]);
        assert!(bands.unset(FALLBACK_PRIORITY).is_err());
        assert!(bands.unset(5).is_err(), "not provisioned");
        bands.set(5, Some(2)).unwrap();
        bands.push(5, 1);
        assert!(bands.unset(5).is_err(), "holds a request");
        bands.pop_next();
        bands.unset(5).unwrap();
        assert_eq!(bands.resolve(5), FALLBACK_PRIORITY);
    }

    #[test]
    fn band_counts_and_capacities_are_accepted_at_their_limits_and_refused_one_past() {
        let configs = |n: usize, capacity| -> Vec<BandConfig> {
            (1..n)
                .map(|p| BandConfig {
                    priority: p as Priority,
                    capacity,
                })
                .collect()
        };
        assert!(Bands::<u32>::validate(&configs(MAX_BANDS, Some(MAX_BAND_CAPACITY))).is_ok());
        assert!(Bands::<u32>::validate(&configs(MAX_BANDS + 1, None)).is_err());
        assert!(Bands::<u32>::validate(&configs(2, Some(MAX_BAND_CAPACITY + 1))).is_err());
        let twice = [configs(2, None), configs(2, None)].concat();
        assert!(Bands::<u32>::validate(&twice).is_err());
        let mut full: Bands<u32> = Bands::new(&configs(MAX_BANDS, None));
        assert!(full.set(-7, None).is_err());
        assert!(full.set(1, Some(MAX_BAND_CAPACITY + 1)).is_err());
        assert!(
            full.set(1, Some(MAX_BAND_CAPACITY)).is_ok(),
            "changes an existing band"
        );
    }
}
