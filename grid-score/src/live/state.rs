//! What the refresh keeps of a candidate's live evidence: the factor its selection
//! weight is multiplied by, what each of its flow-control bands showed last, and its
//! learned turnover.
//!
//! ```text
//! factor  = full x serving
//! full    = 1 - 2^(-age / LIVE_ROOM_HALF_LIFE_MS) after its newest answer (of any band)
//!           said "full" (zero headroom, or dropped as rejected-saturated), else 1
//! serving = 1 / (1 + failures), failures decaying with FAILURE_HALF_LIFE_MS
//! queue   = the sum over its bands with a fresh answer of the band's largest headroom
//!           (its size as far as it showed) less the band's own newest headroom, the
//!           whole of it for a band whose answer said "full", stamped with the oldest of
//!           those answers
//! ```
//!
//! The factor only ever lowers a site's share: a fresh "full" takes it out of the spread
//! at once, which is what moves traffic within one response. The queue is what the
//! bands held when the answers' heads were built, a fraction of a second ago where a
//! polled reading of a remote site is up to six seconds old; the snapshot reads it in
//! place of an older reading's load (`docs/routing.md`, "Live room"). Each band is kept
//! apart ([`super::band`]): one band's size less another band's headroom is no queue.

use super::band::{BandState, LIVE_ROOM_FRESH_MS, LiveRoom, MAX_BANDS_TRACKED};
use super::outlier::{Outlier, OutlierChange};
use super::outstanding::Outstanding;
use super::slot::LiveEvidence;
use super::turnover::Turnover;

/// A response's room signal loses half its weight every this many ms: about one turnover
/// of a short chat completion ([`crate::DEFAULT_TURNOVER_MS`]), the time a full band
/// takes to drain by a request per slot; by a few of these the polled readings, fresher
/// by then, have taken over. A site weighted out this way is probed again as its signal
/// ages, and each answer that still says "full" renews it.
pub const LIVE_ROOM_HALF_LIFE_MS: u64 = 2_000;

/// Serving failures lose half their weight every this many ms (Envoy ejects for 30 s on
/// its first ejection; this is a softer, shorter penalty, since the site is only
/// weighted down, never ejected).
pub const FAILURE_HALF_LIFE_MS: u64 = 10_000;

/// The most failures a penalty counts: bounds how far down a site is weighted (to one
/// seventeenth) so it still gets the odd request that shows its recovery.
pub const MAX_FAILURE_SCORE: f64 = 16.0;

/// The live state of one candidate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct LiveState {
    /// The newest room signal of any band: what the factor and the evidence read.
    room: Option<LiveRoom>,
    /// What is kept of each band, the least recently seen forgotten past
    /// [`MAX_BANDS_TRACKED`].
    bands: [Option<BandState>; MAX_BANDS_TRACKED],
    failures: f64,
    failures_at: u64,
    turnover: Turnover,
    /// Until when its own 429 said it is full.
    full_until: u64,
    outlier: Outlier,
    /// This gateway's own requests at the site over time.
    outstanding: Outstanding,
    /// When the newest answer that was not a failure was drained, if any was: a site
    /// serving, whatever its polled readings say.
    answered_at: Option<u64>,
    /// The newest reading with a verdict said the site could not serve.
    read_out: bool,
}

/// What the snapshot reads of it at one instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LiveView {
    /// The factor the selection weight is multiplied by, in `(0, 1]`.
    pub(crate) factor: f64,
    /// The fresh headroom of its bands summed (a band whose answer said "full" counts
    /// 0; 0 while its 429 holds it full), for the model's grid headroom.
    pub(crate) headroom: Option<u64>,
    /// The serving-failure score now.
    pub(crate) failures: f64,
    /// How long the site's answers have been holding a slot lately (ms), once any ended.
    pub(crate) turnover_ms: Option<f64>,
    /// What its bands held at their fresh room signals (requests waiting: each band's
    /// largest headroom less its own newest one, all of it for a band that said "full",
    /// summed) and the oldest of those signals' stamps.
    pub(crate) queue: Option<(f64, u64)>,
    /// The newest room signal its answers carried, however old (its stamp says what it
    /// is worth): what the routing evidence shows.
    pub(crate) room: Option<LiveRoom>,
    /// Until when its own 429 holds it full, while it does.
    pub(crate) full_until_ms: Option<u64>,
    /// Until when it is ejected for failing, while it is.
    pub(crate) ejected_until_ms: Option<u64>,
    /// When its newest answer that was not a failure was seen, if any was.
    pub(crate) answered_ms: Option<u64>,
}

impl LiveState {
    /// Folds in what a slot held at `now_ms`; says when that ejected the candidate for
    /// failing or brought it back.
    pub(crate) fn observe(&mut self, e: &LiveEvidence, now_ms: u64) -> Option<OutlierChange> {
        for &(key, room) in e.bands.iter().flatten() {
            if self.room.is_none_or(|r| room.stamp_ms > r.stamp_ms) {
                self.room = Some(room);
            }
            self.observe_band(key, room);
        }
        let decayed = self.failures_now(now_ms);
        self.failures = if e.failures > 0 {
            (decayed + f64::from(e.failures)).min(MAX_FAILURE_SCORE)
        } else if e.answers > 0 {
            // Answers without a failure show the site serves again.
            decayed * 0.5
        } else {
            decayed
        };
        self.failures_at = now_ms.max(self.failures_at);
        if e.answers > 0 {
            self.answered_at = Some(now_ms.max(self.answered_at.unwrap_or(0)));
        }
        self.turnover.observe(e, now_ms);
        self.full_until = self.full_until.max(e.full_until_ms);
        self.outstanding.observe(now_ms, e.outstanding);
        self.outlier.observe(e, now_ms)
    }

    /// Folds in a band's newest room signal: into its own state when tracked (an older
    /// signal never replaces a newer one), else into an empty place, else in place of
    /// the least recently seen band's.
    fn observe_band(&mut self, key: super::BandKey, room: LiveRoom) {
        if let Some(b) = self.bands.iter_mut().flatten().find(|b| b.key == key) {
            if room.stamp_ms > b.room.stamp_ms {
                b.observe(room);
            }
            return;
        }
        let place = match self.bands.iter().position(Option::is_none) {
            Some(i) => i,
            None => (0..MAX_BANDS_TRACKED)
                .min_by_key(|&i| self.bands[i].map_or(0, |b| b.room.stamp_ms))
                .unwrap_or(0),
        };
        self.bands[place] = Some(BandState::new(key, room));
    }

    /// A polled reading at `stamp_ms` showed flow control holding `held` requests over
    /// all bands: each band whose queue that covers keeps its size ([`BandState::polled`]).
    pub(crate) fn polled(&mut self, held: f64, stamp_ms: u64) {
        for b in self.bands.iter_mut().flatten() {
            b.polled(held, stamp_ms);
        }
    }

    /// The bands tracked.
    #[cfg(test)]
    pub(crate) fn bands(&self) -> impl Iterator<Item = &BandState> {
        self.bands.iter().flatten()
    }

    /// Since when it is ejected for failing, while it is.
    pub(crate) fn ejected_since(&self) -> Option<u64> {
        self.outlier.ejected_since()
    }

    /// A reading's verdict on the site (see [`Outlier::readiness`]).
    ///
    /// A verdict that brings the site back from "cannot serve" clears its serving
    /// failures: what failed around the outage (streams cut as its endpoints went, its
    /// refusals while it had none) was the outage the readings showed, and that is over.
    /// Kept, they weighed the returned site down to a seventeenth of its share while the
    /// failures decayed, so the sites that had covered for it stayed queued and it stood
    /// idle. A site that still fails once back collects failures afresh.
    pub(crate) fn readiness(&mut self, out: bool) {
        if self.read_out && !out {
            self.failures = 0.0;
        }
        self.read_out = out;
        self.outlier.readiness(out);
    }

    /// Whether a probe of the ejected candidate is due at `now_ms` (scheduling the next).
    pub(crate) fn probe_due(&mut self, now_ms: u64) -> bool {
        self.outlier.probe_due(now_ms)
    }

    fn failures_now(&self, now_ms: u64) -> f64 {
        let age = now_ms.saturating_sub(self.failures_at) as f64;
        self.failures * (-age / FAILURE_HALF_LIFE_MS as f64).exp2()
    }

    /// How many more of this gateway's own requests are at the site now than at
    /// `stamp_ms` (a polled reading's stamp); `None` when that is older than what is kept.
    pub(crate) fn own_change_since(&self, stamp_ms: u64) -> Option<f64> {
        self.outstanding.change_since(stamp_ms)
    }

    /// How many of this gateway's own requests were at the site at `stamp_ms`; `None`
    /// when that is older than what is kept.
    pub(crate) fn own_at(&self, stamp_ms: u64) -> Option<u32> {
        self.outstanding.at(stamp_ms)
    }

    /// How many of this gateway's own requests are at the site now.
    pub(crate) fn own_now(&self) -> u32 {
        self.outstanding.now()
    }

    /// The state as the snapshot reads it at `now_ms`.
    pub(crate) fn view(&self, now_ms: u64) -> LiveView {
        let failures = self.failures_now(now_ms);
        let mut factor = 1.0 / (1.0 + failures);
        let mut headroom: Option<u64> = None;
        let mut queue: Option<(f64, u64)> = None;
        if let Some(room) = self.room
            && room.saturated
        {
            // Full now: out of the spread at once, back in as the signal ages.
            let age = now_ms.saturating_sub(room.stamp_ms);
            let weight = (-(age as f64) / LIVE_ROOM_HALF_LIFE_MS as f64).exp2();
            factor *= 1.0 - weight;
        }
        for b in self.bands.iter().flatten() {
            if now_ms.saturating_sub(b.room.stamp_ms) > LIVE_ROOM_FRESH_MS {
                continue;
            }
            if let Some(h) = b.room.headroom.or(b.room.saturated.then_some(0)) {
                headroom = Some(headroom.unwrap_or(0).saturating_add(h));
            }
            if let Some(q) = b.queue() {
                queue = Some(queue.map_or((q, b.room.stamp_ms), |(sum, at)| {
                    (sum + q, at.min(b.room.stamp_ms))
                }));
            }
        }
        if now_ms < self.full_until {
            // It said so itself (a 429): full until its Retry-After, whatever else says.
            factor = 0.0;
            headroom = Some(0);
        }
        LiveView {
            factor: if factor.is_finite() {
                factor.clamp(0.0, 1.0)
            } else {
                1.0
            },
            headroom,
            failures,
            turnover_ms: self.turnover.estimate(),
            queue,
            room: self.room,
            full_until_ms: (now_ms < self.full_until).then_some(self.full_until),
            ejected_until_ms: self.outlier.ejected_until(),
            answered_ms: self.answered_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::BandKey;

    const T: u64 = 1_764_000_000_000;

    fn room(stamp_ms: u64, headroom: Option<u64>, saturated: bool) -> LiveEvidence {
        band_room(BandKey::DEFAULT, stamp_ms, headroom, saturated)
    }

    fn band_room(
        band: BandKey,
        stamp_ms: u64,
        headroom: Option<u64>,
        saturated: bool,
    ) -> LiveEvidence {
        let mut e = LiveEvidence::default();
        e.bands[0] = Some((
            band,
            LiveRoom {
                stamp_ms,
                headroom,
                saturated,
            },
        ));
        e
    }

    #[test]
    fn a_fresh_full_band_zeroes_the_factor_and_its_weight_halves_per_half_life() {
        let mut s = LiveState::default();
        s.observe(&room(T, Some(20), false), T);
        assert!((s.view(T).factor - 1.0).abs() < 1e-12, "all the band free");
        s.observe(&room(T + 10, Some(0), true), T + 10);
        assert!(s.view(T + 10).factor.abs() < 1e-12);
        let later = s.view(T + 10 + LIVE_ROOM_HALF_LIFE_MS);
        assert!((later.factor - 0.5).abs() < 1e-12, "{later:?}");
        assert_eq!(later.headroom, Some(0));
        assert_eq!(s.view(T + 11 + LIVE_ROOM_FRESH_MS).headroom, None, "stale");
    }

    #[test]
    fn an_older_room_signal_never_replaces_a_newer_one() {
        let mut s = LiveState::default();
        s.observe(&room(T + 5, Some(0), true), T + 5);
        s.observe(&room(T, Some(20), false), T + 6);
        assert_eq!(s.view(T + 6).headroom, Some(0));
    }

    /// Evidence of twelve serving failures.
    fn twelve_failures() -> LiveEvidence {
        LiveEvidence {
            failures: 12,
            ..LiveEvidence::default()
        }
    }

    #[test]
    fn a_reading_that_brings_a_site_back_from_an_outage_clears_its_failures() {
        let failing = twelve_failures();
        let mut s = LiveState::default();
        s.observe(&failing, T);
        s.readiness(true);
        assert!(s.view(T + 1).factor < 0.1, "weighed down while out");
        s.readiness(true);
        assert!(s.view(T + 2).factor < 0.1, "still out");
        s.readiness(false);
        let back = s.view(T + 3);
        assert_eq!((back.failures, back.factor), (0.0, 1.0), "{back:?}");
        s.observe(&failing, T + 4);
        assert!(
            s.view(T + 4).factor < 0.1,
            "failing once back counts afresh"
        );
    }

    #[test]
    fn readings_that_say_a_site_serves_throughout_leave_its_failures_alone() {
        let failing = twelve_failures();
        let mut s = LiveState::default();
        s.readiness(false);
        s.observe(&failing, T);
        s.readiness(false);
        assert!(
            (s.view(T).failures - 12.0).abs() < 1e-12,
            "no outage ended: its failures are its own"
        );
    }

    #[test]
    fn failures_weigh_a_site_down_boundedly_and_decay() {
        let mut s = LiveState::default();
        let failing = LiveEvidence {
            failures: 1_000,
            ..LiveEvidence::default()
        };
        s.observe(&failing, T);
        let v = s.view(T);
        assert!((v.failures - MAX_FAILURE_SCORE).abs() < 1e-12);
        assert!((v.factor - 1.0 / (1.0 + MAX_FAILURE_SCORE)).abs() < 1e-12);
        let half = s.view(T + FAILURE_HALF_LIFE_MS);
        assert!((half.failures - MAX_FAILURE_SCORE / 2.0).abs() < 1e-9);
        let answering = LiveEvidence {
            answers: 3,
            ..LiveEvidence::default()
        };
        s.observe(&answering, T + FAILURE_HALF_LIFE_MS);
        assert!((s.view(T + FAILURE_HALF_LIFE_MS).failures - MAX_FAILURE_SCORE / 4.0).abs() < 1e-9);
    }

    #[test]
    fn the_state_keeps_max_bands_tracked_bands_and_one_more_forgets_the_least_recently_seen() {
        let band = |i: usize| BandKey::named(Some(format!("objective-{i}").as_bytes()));
        let mut s = LiveState::default();
        for i in 0..MAX_BANDS_TRACKED {
            s.observe(&band_room(band(i), T + i as u64, Some(10), false), T + 100);
        }
        assert_eq!(s.bands().count(), MAX_BANDS_TRACKED);
        s.observe(&band_room(band(0), T + 50, Some(10), false), T + 100);
        s.observe(
            &band_room(BandKey::DEFAULT, T + 60, Some(10), false),
            T + 100,
        );
        assert_eq!(s.bands().count(), MAX_BANDS_TRACKED);
        assert!(
            s.bands().all(|b| b.key != band(1)),
            "the least recently seen went"
        );
        assert!(
            s.bands().any(|b| b.key == band(0)) && s.bands().any(|b| b.key == BandKey::DEFAULT)
        );
    }

    #[test]
    fn the_queue_sums_each_fresh_bands_own_and_a_full_band_adds_its_whole_size() {
        let critical = BandKey::named(Some(b"critical"));
        let mut s = LiveState::default();
        s.observe(&band_room(BandKey::DEFAULT, T, Some(64), false), T);
        s.observe(&band_room(critical, T + 1, Some(16), false), T + 1);
        assert_eq!(s.view(T + 1).queue, Some((0.0, T)));
        assert_eq!(s.view(T + 1).headroom, Some(80));
        s.observe(&band_room(BandKey::DEFAULT, T + 2, Some(60), false), T + 2);
        s.observe(&band_room(critical, T + 3, Some(0), true), T + 3);
        let v = s.view(T + 3);
        assert_eq!(
            v.queue,
            Some((20.0, T + 2)),
            "four waiting in the default band, the full band's sixteen in the other"
        );
        assert_eq!(v.headroom, Some(60));
        assert!(v.factor < 1e-12, "the newest answer said full");
        let only_full = T + 3 + LIVE_ROOM_FRESH_MS;
        assert_eq!(s.view(only_full).queue, Some((16.0, T + 3)));
        assert_eq!(
            s.view(only_full + 1).queue,
            None,
            "no fresh band: no live queue"
        );
    }
}
