//! Where the request path leaves what each response said, for the next refresh to fold
//! in: one slot per candidate, written with plain atomic stores and adds (no lock, no
//! allocation), read and drained off the request path.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::band::{BandKey, LIVE_ROOM_FRESH_MS, LiveRoom, MAX_BANDS_TRACKED};
use super::headers::FlowObservation;
use crate::reading::CandidateKey;

/// Bits of the packed slot holding the stamp (ms since the Unix epoch; good to 2109).
const STAMP_BITS: u32 = 42;
/// Bits holding the headroom ([`super::MAX_HEADROOM_REQUESTS`] fits in 20).
const HEADROOM_BITS: u32 = 20;
const STAMP_MASK: u64 = (1 << STAMP_BITS) - 1;
const HEADROOM_MASK: u64 = (1 << HEADROOM_BITS) - 1;
const HAS_HEADROOM: u64 = 1 << (STAMP_BITS + HEADROOM_BITS);
const SATURATED: u64 = 1 << (STAMP_BITS + HEADROOM_BITS + 1);

/// What a slot held when the refresh drained it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveEvidence {
    /// The newest room signal recorded for each band the slot tracks (not cleared: its
    /// age says what it is worth), in no particular order.
    pub bands: [Option<(BandKey, LiveRoom)>; MAX_BANDS_TRACKED],
    /// Serving failures since the last drain: a reset, a timeout, a 5xx.
    pub failures: u32,
    /// Answers that were not failures since the last drain.
    pub answers: u32,
    /// How long the answers that ended since the last drain held their slot, where known
    /// (see [`LiveSlot::record_served`] and [`LiveSlot::record_plain_answer`]).
    pub served: Durations,
    /// How long plain answers whose flow-control wait was not stated (a site without flow
    /// control; see [`LiveSlot::record_plain_answer`]) took from sending to their head,
    /// since the last drain.
    pub unstated: Durations,
    /// The time to first byte less the flow-control wait of streamed answers whose first
    /// byte came since the last drain (see [`LiveSlot::record_first_byte`]).
    pub first_bytes: Durations,
    /// Exchanges failed in a row, as of the drain (not cleared: an answer ends it).
    pub streak: u32,
    /// Probes of the site (while it was ejected) answered since the last drain.
    pub probes_answered: u32,
    /// Until when the site said it is full (a 429's Retry-After), ms since the Unix
    /// epoch; 0 when it never did (not cleared: its time says what it is worth).
    pub full_until_ms: u64,
    /// This gateway's requests at the site as of the drain: sent and not yet ended
    /// (see [`LiveSlot::record_sent`]; not cleared).
    pub outstanding: u32,
}

/// Fraction bits of the fixed-point logarithms a slot sums.
pub const LOG_FIXED_BITS: u32 = 20;

/// How long a site that answered 429 without a Retry-After is read as full: a second,
/// the order of a request's turnover; each 429 renews it.
pub const DEFAULT_FULL_HOLD_MS: u64 = 1_000;
/// The longest a site's 429 keeps it read as full, whatever Retry-After it states: past
/// this its polled readings and its next answers speak for it again (a site's clock or
/// its Retry-After policy cannot keep it out of selection for long).
pub const MAX_FULL_HOLD_MS: u64 = 30_000;

impl LiveEvidence {
    /// The newest room signal of any band.
    pub fn room(&self) -> Option<LiveRoom> {
        self.bands
            .iter()
            .flatten()
            .map(|&(_, r)| r)
            .max_by_key(|r| r.stamp_ms)
    }

    /// The newest room signal of `band`, if the slot tracks it.
    pub fn room_of(&self, band: BandKey) -> Option<LiveRoom> {
        self.bands
            .iter()
            .flatten()
            .find(|(k, _)| *k == band)
            .map(|&(_, r)| r)
    }
}

/// Durations summed as their natural logarithms (of ms, under a millisecond read as
/// one), fixed point in units of 2^-[`LOG_FIXED_BITS`]: their geometric mean and the
/// spread about it, without keeping each one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Durations {
    /// How many.
    pub count: u32,
    /// Sum of their logarithms.
    pub log_sum: u64,
    /// Sum of the squares of their logarithms.
    pub log_sq_sum: u64,
}

impl Durations {
    /// The mean of their logarithms; `None` when there are none.
    pub fn log_mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.log_sum as f64 / LOG_UNIT / f64::from(self.count))
    }

    /// Their geometric mean (ms); `None` when there are none.
    pub fn geometric_mean_ms(&self) -> Option<f64> {
        self.log_mean().map(f64::exp)
    }

    /// The squared deviations of their logarithms from those logarithms' own mean,
    /// summed: with `count - 1` degrees of freedom, what they say of the spread of the
    /// durations they came from. Zero for fewer than two.
    pub fn log_squared_deviations(&self) -> f64 {
        match self.log_mean() {
            Some(mean) if self.count > 1 => {
                (self.log_sq_sum as f64 / LOG_UNIT - f64::from(self.count) * mean * mean).max(0.0)
            }
            _ => 0.0,
        }
    }
}

/// `elapsed_ms` less the stated `wait_ms`; `None` when the wait is not shorter than the
/// whole exchange (the header cannot be true, so the time says nothing).
fn less_wait(elapsed_ms: u64, wait_ms: u64) -> Option<u64> {
    elapsed_ms.checked_sub(wait_ms).filter(|&held| held > 0)
}

/// One in fixed point ([`LOG_FIXED_BITS`]).
const LOG_UNIT: f64 = (1u64 << LOG_FIXED_BITS) as f64;

/// [`Durations`] as a slot counts them: three atomic adds per duration.
#[derive(Debug, Default)]
struct DurationCells {
    count: AtomicU32,
    log_sum: AtomicU64,
    log_sq_sum: AtomicU64,
}

impl DurationCells {
    /// Counts one duration of `ms`. The adds are not one atomic step, so a drain racing
    /// them can see the count without its logarithms or the other way round: one sample
    /// off in a mean (and a spread) over many, accepted for a lock-free request path.
    fn add(&self, ms: u64) {
        let log = (ms.max(1) as f64).ln();
        self.log_sum
            .fetch_add((log * LOG_UNIT) as u64, Ordering::Relaxed);
        self.log_sq_sum
            .fetch_add((log * log * LOG_UNIT) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// What was counted since the last drain (reset).
    fn drain(&self) -> Durations {
        Durations {
            count: self.count.swap(0, Ordering::Relaxed),
            log_sum: self.log_sum.swap(0, Ordering::Relaxed),
            log_sq_sum: self.log_sq_sum.swap(0, Ordering::Relaxed),
        }
    }
}

/// One band's cell of a slot: the band's raw key (0: empty) and its newest room signal,
/// packed (0: none yet).
#[derive(Debug, Default)]
struct BandCell {
    band: AtomicU64,
    room: AtomicU64,
}

/// One candidate's slot.
#[derive(Debug, Default)]
pub struct LiveSlot {
    bands: [BandCell; MAX_BANDS_TRACKED],
    failures: AtomicU32,
    answers: AtomicU32,
    served: DurationCells,
    unstated: DurationCells,
    first_bytes: DurationCells,
    streak: AtomicU32,
    probes_answered: AtomicU32,
    full_until: AtomicU64,
    sent: AtomicU64,
    ended: AtomicU64,
}

impl LiveSlot {
    /// An empty slot.
    pub fn new() -> Self {
        Self::default()
    }

    /// Request path: what one response to a request of `band` said, read at `now_ms`.
    /// A response without any room signal leaves the band's newest one as it was
    /// (absence is no signal). The band's own cell takes it; a band not tracked yet
    /// takes an empty cell, else the cell of the least recently seen band (its next
    /// answer teaches it again).
    ///
    /// Lock-free: a band already tracked is one load per cell and one store. Taking a
    /// cell is three stores a drain can tell apart from a finished one (see
    /// [`LiveSlot::drain`]); a writer of the evicted band racing the eviction can still
    /// leave one room signal under the new band, one sample off until that band's next
    /// answer, accepted for a lock-free request path (eviction needs more bands answering
    /// at once than [`MAX_BANDS_TRACKED`]).
    pub fn record_room(&self, now_ms: u64, band: BandKey, observation: &FlowObservation) {
        if !observation.has_room_signal() {
            return;
        }
        let mut packed = now_ms.clamp(1, STAMP_MASK);
        if let Some(h) = observation.headroom {
            packed |= HAS_HEADROOM | (h.min(HEADROOM_MASK) << STAMP_BITS);
        }
        if observation.saturated() {
            packed |= SATURATED;
        }
        let raw = band.raw();
        if let Some(cell) = self.cell_of(raw) {
            cell.room.store(packed, Ordering::Release);
            return;
        }
        for cell in &self.bands {
            match cell
                .band
                .compare_exchange(0, raw, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    cell.room.store(packed, Ordering::SeqCst);
                    return;
                }
                // Another answer of this band took the cell first.
                Err(now) if now == raw => {
                    cell.room.store(packed, Ordering::Release);
                    return;
                }
                Err(_) => {}
            }
        }
        let lru = self
            .bands
            .iter()
            .min_by_key(|c| c.room.load(Ordering::Relaxed) & STAMP_MASK)
            .unwrap_or(&self.bands[0]);
        lru.room.store(0, Ordering::SeqCst);
        lru.band.store(raw, Ordering::SeqCst);
        lru.room.store(packed, Ordering::SeqCst);
    }

    fn cell_of(&self, raw: u64) -> Option<&BandCell> {
        self.bands
            .iter()
            .find(|c| c.band.load(Ordering::Relaxed) == raw)
    }

    /// The headroom to restate to the client of an answer from this site to a request of
    /// `band`, at `now_ms`: what the answer itself said of its band (0 when it said
    /// "full"), else the band's newest room signal here while at most
    /// [`LIVE_ROOM_FRESH_MS`] old; never another band's, never another site's.
    /// Call it after [`LiveSlot::record_room`] of the same answer. Lock-free.
    pub fn restated_headroom(
        &self,
        now_ms: u64,
        band: BandKey,
        observation: &FlowObservation,
    ) -> Option<u64> {
        if observation.has_room_signal() {
            return observation
                .headroom
                .or(observation.saturated().then_some(0));
        }
        let room = unpack(self.cell_of(band.raw())?.room.load(Ordering::Acquire))?;
        if now_ms.saturating_sub(room.stamp_ms) > LIVE_ROOM_FRESH_MS {
            return None;
        }
        room.headroom.or(room.saturated.then_some(0))
    }

    /// Request path: a request was sent to the site (its first byte is about to leave).
    /// Every call is matched by one [`LiveSlot::record_ended`] when the exchange is over,
    /// however it ends; [`LiveSlot::in_flight`] pairs them by a guard.
    pub fn record_sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Request path: an exchange [`LiveSlot::record_sent`] counted is over: its answer's
    /// last byte, a refusal, a failure, or the client gone.
    pub fn record_ended(&self) {
        self.ended.fetch_add(1, Ordering::Relaxed);
    }

    /// Request path: counts a request sent now, and its end when the guard is dropped.
    pub fn in_flight(self: &Arc<Self>) -> InFlight {
        self.record_sent();
        InFlight(Arc::clone(self))
    }

    /// Request path: the site answered (any status below 500).
    pub fn record_answer(&self) {
        self.answers.fetch_add(1, Ordering::Relaxed);
        self.streak.store(0, Ordering::Relaxed);
    }

    /// Request path: the exchange failed (reset, timeout) or the site answered 5xx.
    pub fn record_failure(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.streak.fetch_add(1, Ordering::Relaxed);
    }

    /// Request path: the site refused a request because it is full (a 429) at `now_ms`,
    /// for `hold_ms` (its Retry-After, bounded by [`MAX_FULL_HOLD_MS`]; without one,
    /// [`DEFAULT_FULL_HOLD_MS`]). A site that answers is not failing: the streak
    /// ends as for any answer.
    pub fn record_full(&self, now_ms: u64, hold_ms: Option<u64>) {
        let hold = hold_ms
            .unwrap_or(DEFAULT_FULL_HOLD_MS)
            .min(MAX_FULL_HOLD_MS);
        self.full_until
            .fetch_max(now_ms.saturating_add(hold), Ordering::Relaxed);
        self.record_answer();
    }

    /// A probe of the ejected site (the daemon's, off the request path) answered
    /// (`answered`), or failed.
    pub fn record_probe(&self, answered: bool) {
        if answered {
            self.probes_answered.fetch_add(1, Ordering::Relaxed);
            self.streak.store(0, Ordering::Relaxed);
        }
    }

    /// Request path: a streamed answer held its slot `held_ms`, from its first byte to its
    /// last.
    pub fn record_served(&self, held_ms: u64) {
        self.served.add(held_ms);
    }

    /// Request path: a plain answer's head came `elapsed_ms` after the request went out.
    /// Its head comes when it is done, so with the flow-control wait its header stated
    /// (`stated_wait_ms`) taken out, the time is how long it held its slot; with none
    /// stated (the site runs no flow control) it is the slot and the wait for one
    /// together, which only the site knew, and is kept apart (`grid_score::live`,
    /// "turnover", says when it counts). A stated wait not shorter than the whole
    /// exchange cannot be true: nothing is learned.
    pub fn record_plain_answer(&self, elapsed_ms: u64, stated_wait_ms: Option<u64>) {
        match stated_wait_ms {
            None => self.unstated.add(elapsed_ms),
            Some(wait) => {
                if let Some(held) = less_wait(elapsed_ms, wait) {
                    self.served.add(held);
                }
            }
        }
    }

    /// Request path: a streamed answer's first byte came `elapsed_ms` after the request
    /// went out. Only with the flow-control wait its header stated (`stated_wait_ms`)
    /// taken out is that time the site's speed and not its queue (a queue read as a
    /// slowdown feeds back on itself): without one, or with one not shorter than the
    /// whole time, nothing is learned.
    pub fn record_first_byte(&self, elapsed_ms: u64, stated_wait_ms: Option<u64>) {
        if let Some(ms) = stated_wait_ms.and_then(|wait| less_wait(elapsed_ms, wait)) {
            self.first_bytes.add(ms);
        }
    }

    /// Refresh: each band's newest room signal, and the counts since the last drain
    /// (reset). A cell read while a band was taking it (its key changed between two
    /// reads, or its room not yet set) is left for the next drain.
    pub fn drain(&self) -> LiveEvidence {
        let mut bands = [None; MAX_BANDS_TRACKED];
        for (out, cell) in bands.iter_mut().zip(&self.bands) {
            let before = cell.band.load(Ordering::SeqCst);
            let packed = cell.room.load(Ordering::SeqCst);
            let after = cell.band.load(Ordering::SeqCst);
            if before == after
                && let Some(key) = BandKey::from_raw(before)
                && let Some(room) = unpack(packed)
            {
                *out = Some((key, room));
            }
        }
        LiveEvidence {
            bands,
            failures: self.failures.swap(0, Ordering::Relaxed),
            answers: self.answers.swap(0, Ordering::Relaxed),
            served: self.served.drain(),
            unstated: self.unstated.drain(),
            first_bytes: self.first_bytes.drain(),
            streak: self.streak.load(Ordering::Relaxed),
            probes_answered: self.probes_answered.swap(0, Ordering::Relaxed),
            full_until_ms: self.full_until.load(Ordering::Relaxed),
            outstanding: self.outstanding(),
        }
    }

    /// The gateway's requests sent here and not yet ended, read without draining
    /// anything. The end is read first: a request both sent and ended between the two
    /// reads counts as outstanding, never as less than none.
    pub fn outstanding(&self) -> u32 {
        let ended = self.ended.load(Ordering::Acquire);
        let sent = self.sent.load(Ordering::Acquire);
        u32::try_from(sent.saturating_sub(ended)).unwrap_or(u32::MAX)
    }
}

/// One request of this gateway's in flight at a site: its end is recorded when the guard
/// is dropped, however the exchange ends.
#[derive(Debug)]
pub struct InFlight(Arc<LiveSlot>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.record_ended();
    }
}

/// A packed room signal; `None` for an empty one.
fn unpack(packed: u64) -> Option<LiveRoom> {
    (packed & STAMP_MASK != 0).then(|| LiveRoom {
        stamp_ms: packed & STAMP_MASK,
        headroom: (packed & HAS_HEADROOM != 0).then_some((packed >> STAMP_BITS) & HEADROOM_MASK),
        saturated: packed & SATURATED != 0,
    })
}

/// Every candidate's slot, built once from the candidate list; the request path holds
/// the `Arc` of its candidate's slot, the refresh walks them all.
#[derive(Clone, Debug, Default)]
pub struct LiveBoard {
    slots: Vec<(CandidateKey, Arc<LiveSlot>)>,
}

impl LiveBoard {
    /// One slot per distinct key.
    pub fn new<'a>(keys: impl IntoIterator<Item = &'a CandidateKey>) -> Self {
        let mut slots: Vec<(CandidateKey, Arc<LiveSlot>)> = Vec::new();
        for key in keys {
            if !slots.iter().any(|(k, _)| k == key) {
                slots.push((key.clone(), Arc::new(LiveSlot::new())));
            }
        }
        Self { slots }
    }

    /// One slot per distinct key, `previous`'s where it has the key (a reload).
    pub fn carrying_over<'a>(
        keys: impl IntoIterator<Item = &'a CandidateKey>,
        previous: &LiveBoard,
    ) -> Self {
        let mut slots: Vec<(CandidateKey, Arc<LiveSlot>)> = Vec::new();
        for key in keys {
            if !slots.iter().any(|(k, _)| k == key) {
                let slot = previous
                    .slot(key)
                    .map_or_else(|| Arc::new(LiveSlot::new()), Arc::clone);
                slots.push((key.clone(), slot));
            }
        }
        Self { slots }
    }

    /// The slot of `key`, for the request path to hold.
    pub fn slot(&self, key: &CandidateKey) -> Option<&Arc<LiveSlot>> {
        self.slots.iter().find(|(k, _)| k == key).map(|(_, s)| s)
    }

    /// Every key and its slot.
    pub fn iter(&self) -> impl Iterator<Item = (&CandidateKey, &Arc<LiveSlot>)> {
        self.slots.iter().map(|(k, s)| (k, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::headers::DropReason;

    #[test]
    fn a_request_is_outstanding_from_its_guard_until_the_guard_drops_and_a_drain_keeps_the_count() {
        let slot = Arc::new(LiveSlot::new());
        let first = slot.in_flight();
        let second = slot.in_flight();
        assert_eq!(slot.drain().outstanding, 2);
        assert_eq!(slot.drain().outstanding, 2, "not cleared by a drain");
        drop(first);
        assert_eq!(slot.drain().outstanding, 1);
        drop(second);
        assert_eq!(slot.drain().outstanding, 0);
        // An end counted without its send (a caller's bug) never reads below none.
        slot.record_ended();
        assert_eq!(slot.drain().outstanding, 0);
    }

    #[test]
    fn a_slot_round_trips_the_newest_room_and_drains_its_counts() {
        let slot = LiveSlot::new();
        assert_eq!(slot.drain(), LiveEvidence::default());
        let t = 1_764_000_000_000;
        slot.record_room(
            t,
            BandKey::DEFAULT,
            &FlowObservation {
                headroom: Some(19),
                ..FlowObservation::default()
            },
        );
        slot.record_room(t + 5, BandKey::DEFAULT, &FlowObservation::default()); // no signal: kept
        slot.record_failure();
        slot.record_answer();
        slot.record_answer();
        let e = slot.drain();
        assert_eq!(
            e.room(),
            Some(LiveRoom {
                stamp_ms: t,
                headroom: Some(19),
                saturated: false
            })
        );
        assert_eq!((e.failures, e.answers), (1, 2));
        let again = slot.drain();
        assert_eq!((again.failures, again.answers), (0, 0));
        assert_eq!(
            again.room(),
            e.room(),
            "the room stays; its age decides its worth"
        );
    }

    #[test]
    fn durations_drain_their_geometric_mean_and_the_spread_about_it() {
        let slot = LiveSlot::new();
        assert_eq!(slot.drain().served.geometric_mean_ms(), None);
        slot.record_served(1_000);
        let one = slot.drain().served;
        assert!((one.geometric_mean_ms().unwrap() - 1_000.0).abs() < 0.1);
        assert!(
            one.log_squared_deviations().abs() < f64::EPSILON,
            "one sample shows no spread"
        );
        // ln 7,389 - ln 1,000 = 2: each lies 1 from their mean.
        slot.record_served(1_000);
        slot.record_served(7_389);
        let two = slot.drain().served;
        assert_eq!(two.count, 2);
        assert!((two.geometric_mean_ms().unwrap() - 2_718.3).abs() < 1.0);
        assert!((two.log_squared_deviations() - 2.0).abs() < 1e-3);
        for _ in 0..100 {
            slot.record_first_byte(250, Some(0));
        }
        let same = slot.drain().first_bytes;
        assert!(
            same.log_squared_deviations() < 1e-3,
            "equal samples do not spread"
        );
        assert_eq!(slot.drain().first_bytes, Durations::default(), "drained");
    }

    #[test]
    fn a_plain_answer_is_a_held_time_with_its_wait_stated_kept_apart_without_and_nothing_past_the_exchange()
     {
        let slot = LiveSlot::new();
        slot.record_plain_answer(1_200, Some(200));
        let e = slot.drain();
        assert_eq!((e.served.count, e.unstated.count), (1, 0));
        assert!((e.served.geometric_mean_ms().unwrap() - 1_000.0).abs() < 0.1);
        slot.record_plain_answer(1_200, None);
        let e = slot.drain();
        assert_eq!((e.served.count, e.unstated.count), (0, 1));
        assert!((e.unstated.geometric_mean_ms().unwrap() - 1_200.0).abs() < 0.1);
        slot.record_plain_answer(1_200, Some(1_200));
        slot.record_plain_answer(1_200, Some(1_500));
        assert_eq!(
            slot.drain(),
            LiveEvidence::default(),
            "a wait as long as the exchange"
        );
    }

    #[test]
    fn a_first_byte_is_a_speed_only_with_its_wait_stated_and_shorter_than_it() {
        let slot = LiveSlot::new();
        slot.record_first_byte(300, Some(100));
        let e = slot.drain();
        assert_eq!(e.first_bytes.count, 1);
        assert!((e.first_bytes.geometric_mean_ms().unwrap() - 200.0).abs() < 0.1);
        slot.record_first_byte(300, None);
        slot.record_first_byte(300, Some(300));
        assert_eq!(
            slot.drain(),
            LiveEvidence::default(),
            "no wait, or one past the time"
        );
    }

    #[test]
    fn the_largest_headroom_and_a_saturated_drop_survive_packing() {
        let slot = LiveSlot::new();
        let t = 1_764_000_000_000;
        slot.record_room(
            t,
            BandKey::DEFAULT,
            &FlowObservation {
                headroom: Some(crate::live::MAX_HEADROOM_REQUESTS),
                ..FlowObservation::default()
            },
        );
        assert_eq!(
            slot.drain().room().unwrap().headroom,
            Some(crate::live::MAX_HEADROOM_REQUESTS)
        );
        slot.record_room(
            t + 1,
            BandKey::DEFAULT,
            &FlowObservation {
                dropped: Some(DropReason::RejectedSaturated),
                ..FlowObservation::default()
            },
        );
        let room = slot.drain().room().unwrap();
        assert!(room.saturated && room.headroom.is_none());
        assert_eq!(room.stamp_ms, t + 1);
    }

    fn headroom(h: u64) -> FlowObservation {
        FlowObservation {
            headroom: Some(h),
            ..FlowObservation::default()
        }
    }

    fn objective(i: usize) -> BandKey {
        BandKey::named(Some(format!("objective-{i}").as_bytes()))
    }

    #[test]
    fn a_slot_keeps_max_bands_tracked_bands_and_one_more_forgets_the_least_recently_seen() {
        let slot = LiveSlot::new();
        let t = 1_764_000_000_000;
        for i in 0..MAX_BANDS_TRACKED {
            slot.record_room(t + i as u64, objective(i), &headroom(i as u64 + 1));
        }
        // The first band answers again: the second is now the least recently seen.
        slot.record_room(t + 100, objective(0), &headroom(50));
        let e = slot.drain();
        assert_eq!(e.bands.iter().flatten().count(), MAX_BANDS_TRACKED);
        for i in 1..MAX_BANDS_TRACKED {
            assert_eq!(
                e.room_of(objective(i)).unwrap().headroom,
                Some(i as u64 + 1)
            );
        }
        assert_eq!(e.room_of(objective(0)).unwrap().headroom, Some(50));
        slot.record_room(t + 200, BandKey::DEFAULT, &headroom(7));
        let e = slot.drain();
        assert_eq!(e.bands.iter().flatten().count(), MAX_BANDS_TRACKED);
        assert_eq!(
            e.room_of(objective(1)),
            None,
            "the least recently seen went"
        );
        assert_eq!(e.room_of(BandKey::DEFAULT).unwrap().headroom, Some(7));
        assert_eq!(e.room_of(objective(0)).unwrap().headroom, Some(50));
        assert_eq!(
            e.room().unwrap().stamp_ms,
            t + 200,
            "the newest of any band"
        );
    }

    #[test]
    fn the_restated_headroom_is_the_answers_own_band_else_that_bands_fresh_room_never_anothers() {
        let slot = LiveSlot::new();
        let t = 1_764_000_000_000;
        let critical = objective(0);
        slot.record_room(t, critical, &headroom(3));
        assert_eq!(slot.restated_headroom(t, critical, &headroom(3)), Some(3));
        let silent = FlowObservation::default();
        assert_eq!(
            slot.restated_headroom(t + 1, BandKey::DEFAULT, &silent),
            None,
            "the default band showed nothing here"
        );
        assert_eq!(slot.restated_headroom(t + 1, critical, &silent), Some(3));
        let fresh = t + LIVE_ROOM_FRESH_MS;
        assert_eq!(slot.restated_headroom(fresh, critical, &silent), Some(3));
        assert_eq!(
            slot.restated_headroom(fresh + 1, critical, &silent),
            None,
            "stale"
        );
        let dropped = FlowObservation {
            dropped: Some(DropReason::RejectedSaturated),
            ..FlowObservation::default()
        };
        slot.record_room(t + 2, critical, &dropped);
        assert_eq!(slot.restated_headroom(t + 2, critical, &dropped), Some(0));
        assert_eq!(slot.restated_headroom(t + 3, critical, &silent), Some(0));
    }
}
