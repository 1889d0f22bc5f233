//! Which flow-control band an answer's room describes, and what the gateway keeps of
//! each band.
//!
//! A site's router states the headroom of the band that admitted the request (llm-d's
//! advisory band headroom): its capacity less its length, nothing else. The answer does
//! not name the band; the request did. In llm-d the band is the priority of the request's
//! `InferenceObjective`, named by its [`BAND_REQUEST_HEADER`], and a request naming none
//! (or one whose band is not provisioned) is served in the default band. The gateway
//! cannot resolve an objective's priority (that lives in the site's cluster), so it keys
//! a band by the objective the request named: two objectives of one priority are two
//! keys that each read the same band truthfully, never two bands read as one.
//!
//! Per band and (site, provider) the gateway keeps the newest room and the largest
//! headroom the band has shown (its capacity as far as it showed); the band's queue is
//! that less the band's own newest headroom, never another band's. The largest headroom
//! is forgotten when the band's capacity drops: once no answer has reached it for
//! [`BAND_MAX_FORGET_MS`] (and no polled reading agreed with the queue it implies), it
//! falls to the largest headroom shown in that time.

use crate::hash::WordHash;
use std::hash::Hasher as _;

/// A room signal older than this carries nothing (and is not counted in the grid's
/// headroom header): one peer poll, by which time a polled reading has replaced it.
pub const LIVE_ROOM_FRESH_MS: u64 = 5_000;

/// The newest room signal a candidate's responses carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveRoom {
    /// When the response was read (the gateway's clock, ms since the Unix epoch).
    pub stamp_ms: u64,
    /// The band's headroom, when the response carried one.
    pub headroom: Option<u64>,
    /// The response was evidence the site is full now (zero headroom, or dropped as
    /// `rejected-saturated`).
    pub saturated: bool,
}

/// The request header naming the inference objective, whose priority is the band that
/// admits the request (the Gateway API Inference Extension's `InferenceObjective`).
pub const BAND_REQUEST_HEADER: &str = "x-gateway-inference-objective";

/// The most bands kept per (site, provider): far above the handful of objectives a pool
/// serves; past it the least recently seen band is forgotten (its next answer teaches
/// it again).
pub const MAX_BANDS_TRACKED: usize = 8;

/// How long a band's largest headroom stands without an answer reaching it or a polled
/// reading agreeing with the queue it implies: a minute, long against a burst (the band
/// empties between them) and short against how often a band is reconfigured. Past it
/// the largest headroom shown since stands instead, so a lowered capacity stops reading
/// as a queue.
pub const BAND_MAX_FORGET_MS: u64 = 60_000;

/// A flow-control band as the gateway knows it: the objective a request named, or the
/// default band. Never zero (zero marks an empty slot cell).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BandKey(u64);

impl Default for BandKey {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl BandKey {
    /// The band of a request that names no objective.
    pub const DEFAULT: Self = Self(1);

    /// The band of a request whose [`BAND_REQUEST_HEADER`] is `name` (surrounding
    /// whitespace ignored); an absent or empty name is the default band.
    pub fn named(name: Option<&[u8]>) -> Self {
        let name = name.map_or(&[][..], |n| n.trim_ascii());
        if name.is_empty() {
            return Self::DEFAULT;
        }
        let mut h = WordHash::default();
        h.write(name);
        // Even hashes of names, odd the default: a name never reads as the default.
        let v = h.finish() << 1;
        Self(if v == 0 { 2 } else { v })
    }

    /// The raw value a slot stores (never zero).
    pub(crate) fn raw(self) -> u64 {
        self.0
    }

    /// The key of a raw value a slot stored; `None` for an empty cell.
    pub(crate) fn from_raw(raw: u64) -> Option<Self> {
        (raw != 0).then_some(Self(raw))
    }
}

/// What the gateway keeps of one band of one candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BandState {
    pub(crate) key: BandKey,
    /// The band's newest room signal.
    pub(crate) room: LiveRoom,
    /// The largest headroom the band has shown, as it stands.
    max: u64,
    /// When an answer last reached `max` (or a polled reading agreed with its queue).
    confirmed_ms: u64,
    /// The largest headroom shown since then (0: none).
    since: u64,
}

impl BandState {
    pub(crate) fn new(key: BandKey, room: LiveRoom) -> Self {
        let h = room.headroom.unwrap_or(0);
        Self {
            key,
            room,
            max: h,
            confirmed_ms: room.stamp_ms,
            since: 0,
        }
    }

    /// Folds in a newer room signal of this band.
    pub(crate) fn observe(&mut self, room: LiveRoom) {
        self.room = room;
        let Some(h) = room.headroom else { return };
        if h >= self.max {
            self.max = h;
            self.confirmed_ms = room.stamp_ms;
            self.since = 0;
            return;
        }
        self.since = self.since.max(h);
        if room.stamp_ms.saturating_sub(self.confirmed_ms) > BAND_MAX_FORGET_MS {
            // Nothing reached it for the whole window: the band is smaller now.
            self.max = self.since;
            self.confirmed_ms = room.stamp_ms;
            self.since = 0;
        }
    }

    /// A polled reading at `stamp_ms` showed flow control holding `held` requests in
    /// all: where this band implies a queue and that covers it, the band's size stands
    /// (a band implying none says nothing of its size: any reading covers it).
    pub(crate) fn polled(&mut self, held: f64, stamp_ms: u64) {
        if let Some(q) = self.queue()
            && q > 0.0
            && held >= q
            && stamp_ms > self.confirmed_ms
            && stamp_ms.abs_diff(self.room.stamp_ms) <= LIVE_ROOM_FRESH_MS
        {
            self.confirmed_ms = stamp_ms;
            self.since = 0;
        }
    }

    /// What the band held at its newest room signal: the largest headroom less the
    /// newest, or, when that signal said "full", the whole of the largest headroom (the
    /// band is as long as it has shown it can be); `None` when it carried no headroom and
    /// did not say "full", or said "full" before the band ever showed its size.
    ///
    /// A full band is the longest queue a band holds, not an unknown one: left out of
    /// the site's sum, a full default band beside a priority band with a few waiting
    /// read as those few, newer than the polled reading and standing in for it, so a
    /// site refusing every default-band request read as draining soonest and took the
    /// other sites' refusals (past saturation with two bands, the retries of a whole
    /// second went to the smallest site and were refused again while larger sites had
    /// room).
    pub(crate) fn queue(&self) -> Option<f64> {
        match self.room.headroom {
            _ if self.room.saturated => (self.max > 0).then_some(self.max as f64),
            Some(h) => Some(self.max.saturating_sub(h) as f64),
            None => None,
        }
    }

    /// The band's largest headroom as it stands (its capacity as far as it showed).
    #[cfg(test)]
    pub(crate) fn max(&self) -> u64 {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_764_000_000_000;

    fn room(stamp_ms: u64, h: u64) -> LiveRoom {
        LiveRoom {
            stamp_ms,
            headroom: Some(h),
            saturated: h == 0,
        }
    }

    #[test]
    fn a_request_naming_no_objective_is_the_default_band_and_names_are_distinct() {
        assert_eq!(BandKey::named(None), BandKey::DEFAULT);
        assert_eq!(BandKey::named(Some(b"  ")), BandKey::DEFAULT);
        let a = BandKey::named(Some(b"critical"));
        assert_eq!(a, BandKey::named(Some(b" critical\t")));
        assert_ne!(a, BandKey::DEFAULT);
        assert_ne!(a, BandKey::named(Some(b"sheddable")));
        assert!(BandKey::from_raw(a.raw()) == Some(a) && BandKey::from_raw(0).is_none());
    }

    #[test]
    fn a_band_that_said_full_holds_its_whole_size_and_one_never_sized_says_nothing() {
        let mut b = BandState::new(BandKey::DEFAULT, room(T, 32));
        b.observe(room(T + 1, 0));
        assert_eq!(b.queue(), Some(32.0), "zero headroom");
        b.observe(LiveRoom {
            stamp_ms: T + 2,
            headroom: None,
            saturated: true,
        });
        assert_eq!(
            b.queue(),
            Some(32.0),
            "dropped as rejected-saturated, no headroom"
        );
        let never_sized = BandState::new(
            BandKey::DEFAULT,
            LiveRoom {
                stamp_ms: T,
                headroom: None,
                saturated: true,
            },
        );
        assert_eq!(never_sized.queue(), None);
    }

    #[test]
    fn the_largest_headroom_stands_for_the_forget_window_and_then_falls_to_what_was_shown() {
        let mut b = BandState::new(BandKey::DEFAULT, room(T, 64));
        b.observe(room(T + 1_000, 16));
        b.observe(room(T + BAND_MAX_FORGET_MS, 10));
        assert_eq!(b.max(), 64, "exactly at the window: it stands");
        assert_eq!(b.queue(), Some(54.0));
        b.observe(room(T + BAND_MAX_FORGET_MS + 1, 10));
        assert_eq!(b.max(), 16, "one past: the largest shown since");
        assert_eq!(b.queue(), Some(6.0));
    }

    #[test]
    fn a_polled_reading_that_covers_the_queue_keeps_the_largest_headroom() {
        // A band shown at 64, then answering 4 of room every 10 s, each followed by a poll
        // of what flow control holds.
        let after_polls_of = |held: f64| {
            let mut b = BandState::new(BandKey::DEFAULT, room(T, 64));
            for s in 1..=10 {
                let t = T + s * 10_000;
                b.observe(room(t, 4));
                b.polled(held, t + 100);
            }
            b
        };
        let b = after_polls_of(60.0);
        assert_eq!(b.max(), 64, "a saturated band keeps its size");
        assert_eq!(b.queue(), Some(60.0));
        let lowered = after_polls_of(2.0);
        assert_eq!(lowered.max(), 4, "the poll never showed the implied queue");
    }
}
