//! One candidate's learned state: bounds, pressure, exclusion and saturation history,
//! fed one reading at a time.

use crate::capacity::Bounds;
use crate::headroom::Pace;
use crate::live::{LiveEvidence, LiveState};
use crate::reading::Reading;
use crate::rho::{Pressure, instant_rho};

grid_signals::label_values! {
    /// Why a candidate is out of selection until a newer reading says otherwise.
    pub enum ExcludeReason {
        /// `grid_provider_ready` read 0.
        NotReady,
        /// The EPP's ready-endpoint count read 0.
        NoReadyEndpoints,
        /// The per-unit series stopped while the ready-endpoint count kept stamping: the EPP
        /// lost its endpoints' metrics, so the averages it still stamps are frozen.
        UnitSeriesStopped,
        /// Its exchanges failed (in a row, or most of the recent ones): ejected until a
        /// probe answers or its ejection runs out (`live::outlier`).
        Ejected,
    }
}

/// What feeding one reading did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observed {
    /// The reading was newer than the last one and was learned from.
    NewSample,
    /// The reading's stamp was not newer: nothing changed (a refresh that re-reads the
    /// same store window leaves rho alone).
    NotNewer,
}

/// Learned state of one candidate (site/provider).
#[derive(Clone, Debug, Default)]
pub(crate) struct Learner {
    bounds: Bounds,
    pressure: Pressure,
    last_stamp: Option<u64>,
    last_load_stamp: Option<u64>,
    /// The gateway's own requests at the site when the newest loaded sample was taken
    /// (`None` when its stamp was older than the kept counts): what the change since is
    /// measured against once the sample is older than them.
    own_at_load: Option<u32>,
    /// Unsmoothed rho of the newest loaded sample: what the site held at its stamp, which
    /// headroom reads (the smoothed rho lags a 5 s-apart remote reading by a whole poll).
    instant: f64,
    /// Smoothed gap between loaded samples (ms): how long one reading stands.
    interval_ms: f64,
    pace: Pace,
    waiting: f64,
    /// Why the site is out and the stamp of the newest reading that said so.
    excluded: Option<(ExcludeReason, u64)>,
    had_units: bool,
    full_since: Option<u64>,
    last_full: Option<u64>,
    full: bool,
    live: LiveState,
}

/// What the ordering step reads from a learner at one instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LearnerView {
    /// What the site has shown it holds (the lesser bound, no headroom), as selection
    /// reads it: calm holds only in the soft bound.
    pub(crate) capacity: f64,
    /// What it has shown it holds, calm or at a limit: the capacity reported.
    pub(crate) shown_capacity: f64,
    /// What selection reads it at: the shown capacity with exploration headroom on a
    /// soft bound (see [`crate::SOFT_BOUND_HEADROOM`]).
    pub(crate) reach: f64,
    /// Smoothed rho and recent worst, present only when a fresh loaded sample exists.
    pub(crate) load: Option<(f64, f64)>,
    /// Unsmoothed rho of the newest loaded sample; read only with `load`.
    pub(crate) instant: f64,
    /// Smoothed gap between loaded samples (ms); 0 before the second.
    pub(crate) interval_ms: f64,
    /// Stamp of the newest loaded sample, if any.
    pub(crate) load_stamp: Option<u64>,
    pub(crate) pace: f64,
    pub(crate) waiting: f64,
    pub(crate) full: bool,
    pub(crate) full_since: Option<u64>,
    pub(crate) last_full: Option<u64>,
    pub(crate) excluded: Option<ExcludeReason>,
    /// The stamp of the reading that excluded it, while `excluded` holds.
    pub(crate) excluded_at: Option<u64>,
    /// The learned bounds as they stand: what it held without queueing (soft), what it
    /// held at its limit (hard).
    pub(crate) soft_bound: Option<f64>,
    pub(crate) hard_bound: Option<f64>,
    pub(crate) live: crate::live::LiveView,
    /// How many more of this gateway's own requests are at the site now than when the
    /// newest loaded sample was taken; `None` without one, or when its stamp was older
    /// than the gateway's kept counts when it arrived.
    pub(crate) own_change: Option<f64>,
    /// How many more of this gateway's own requests are at the site now than at the
    /// stamp of the live queue its answers showed (`live.queue`); `None` without one or
    /// past the kept counts.
    pub(crate) own_change_live: Option<f64>,
    /// How many of this gateway's own requests are at the site now.
    pub(crate) own_now: f64,
}

/// What one reading says about whether the site can serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// The reading says the site is out (see [`ExcludeReason`]).
    Out(ExcludeReason),
    /// The reading says the site serves: a positive ready-endpoint count with its
    /// per-unit series where it has had them, or the operator's verdict 1.
    Ready,
    /// The reading carries no readiness at all (vLLM's own `/metrics`, a capped or
    /// partial scrape): it neither excludes nor clears an exclusion.
    Unknown,
}

impl Learner {
    /// Feeds one already-validated reading. `hold_ms` is how long an exclusion outlives
    /// the reading that made it when later readings say nothing about readiness (the
    /// scorer passes its freshness window): an old zero never outlives its reading.
    pub(crate) fn observe(&mut self, r: &Reading, hold_ms: u64) -> Observed {
        if self.last_stamp.is_some_and(|last| r.stamp_ms <= last) {
            return Observed::NotNewer;
        }
        self.last_stamp = Some(r.stamp_ms);
        let stamp = r.stamp_ms;
        if let Some(held) = r.flow_held {
            // What flow control held tells which bands' sizes still stand.
            self.live.polled(held, stamp);
        }
        match self.verdict(r) {
            Verdict::Out(reason) => {
                self.excluded = Some((reason, stamp));
                self.live.readiness(true);
            }
            Verdict::Ready => {
                self.excluded = None;
                self.live.readiness(false);
            }
            Verdict::Unknown => {
                if self
                    .excluded
                    .is_some_and(|(_, at)| stamp.saturating_sub(at) > hold_ms)
                {
                    self.excluded = None;
                }
            }
        }
        self.had_units |= r.units.is_some();
        if self.excluded.is_some() {
            // An excluded site is not serving: what it reads now (frozen averages, flow
            // control holding everything at zero endpoints) is no evidence of its size or
            // its pace, and learning from it collapsed a 12-slot site to the floor for
            // 18 minutes after a 6 s blip. Bounds, pressure and pace wait for it to rejoin.
            self.full = false;
            self.full_since = None;
            return Observed::NewSample;
        }

        if r.learning_allowed
            && let Some(n) = r.in_flight
        {
            if !r.something_queued() {
                self.bounds.held_unqueued(n, stamp);
            }
            if r.at_limit() {
                self.bounds.held_at_limit(r.in_service(n), stamp);
            }
        }
        let capacity = self.bounds.reach(stamp);
        self.waiting = r.queue_depth.unwrap_or(0.0) + r.flow_held.unwrap_or(0.0);
        let instant = instant_rho(r.in_flight, capacity, r.kv_pressure());
        let rho = instant.map(|instant| {
            if let Some(prev) = self.last_load_stamp {
                // A reading older than the freshness window is not load at all; a gap
                // past it (a peer back from an outage) says nothing about the cadence.
                let gap = (stamp - prev).min(crate::DEFAULT_FRESH_FOR_MS);
                self.interval_ms = if self.interval_ms > 0.0 {
                    0.5 * (gap as f64 + self.interval_ms)
                } else {
                    gap as f64
                };
                self.pace.update(self.waiting / capacity, gap);
            }
            self.last_load_stamp = Some(stamp);
            self.own_at_load = self.live.own_at(stamp);
            self.instant = instant;
            self.pressure.push(instant, stamp)
        });
        // "Full" is what this sample shows, not the smoothed rho: smoothing kept a site
        // reading full for several samples after its burst was over, and shedding went on
        // past room_after_ms of the last sample that was saturated.
        self.full = rho.is_some() && instant.is_some_and(|i| i >= 1.0) && r.work_waiting();
        if self.full {
            self.full_since.get_or_insert(stamp);
            self.last_full = Some(stamp);
        } else {
            self.full_since = None;
        }
        Observed::NewSample
    }

    fn verdict(&self, r: &Reading) -> Verdict {
        // A verdict the operator reached without reading the EPP is its monitoring
        // failing, not the site: no verdict at all.
        let ready = r.ready.filter(|_| !r.verdict_unread);
        if ready == Some(false) {
            Verdict::Out(ExcludeReason::NotReady)
        } else if r.ready_endpoints == Some(0) {
            Verdict::Out(ExcludeReason::NoReadyEndpoints)
        } else if r.ready_endpoints.is_some() && self.had_units && r.units.is_none() {
            Verdict::Out(ExcludeReason::UnitSeriesStopped)
        } else if r.ready_endpoints.is_some() || ready == Some(true) {
            Verdict::Ready
        } else {
            Verdict::Unknown
        }
    }

    /// Folds in what the responses said since the last refresh; says when that ejected
    /// the candidate for failing or brought it back.
    pub(crate) fn observe_live(
        &mut self,
        evidence: &LiveEvidence,
        now_ms: u64,
    ) -> Option<crate::live::OutlierChange> {
        self.live.observe(evidence, now_ms)
    }

    /// Since when the candidate is ejected for failing, while it is.
    pub(crate) fn ejected_since(&self) -> Option<u64> {
        self.live.ejected_since()
    }

    /// Whether a probe of the candidate, ejected for failing, is due at `now_ms`.
    pub(crate) fn probe_due(&mut self, now_ms: u64) -> bool {
        self.live.probe_due(now_ms)
    }

    /// A revision changed: forget bounds, load and congestion history. The last stamp,
    /// the exclusion verdict and the live evidence stay: a replayed older reading must
    /// not count as new, and readiness and serving failures are about the site, not the
    /// revision.
    pub(crate) fn reset(&mut self) {
        *self = Self {
            last_stamp: self.last_stamp,
            excluded: self.excluded,
            live: self.live,
            ..Self::default()
        };
    }

    /// The learner as the ordering step sees it at `now_ms`; load counts only when its
    /// newest sample is at most `fresh_for_ms` old, and an exclusion only while the
    /// newest reading that made it is (a site that fell silent after reading zero is
    /// unmeasured, least preferred, not excluded for ever).
    pub(crate) fn view(&self, now_ms: u64, fresh_for_ms: u64) -> LearnerView {
        let fresh = self
            .last_load_stamp
            .is_some_and(|s| now_ms.saturating_sub(s) <= fresh_for_ms);
        let load = if fresh {
            self.pressure.rho().zip(self.pressure.recent_worst(now_ms))
        } else {
            None
        };
        let excluded = self
            .excluded
            .filter(|(_, at)| now_ms.saturating_sub(*at) <= fresh_for_ms);
        let live = self.live.view(now_ms);
        let own_change_live = live
            .queue
            .and_then(|(_, at)| self.live.own_change_since(at));
        LearnerView {
            capacity: self.bounds.capacity(now_ms),
            shown_capacity: self.bounds.shown(now_ms),
            reach: self.bounds.reach(now_ms),
            load,
            instant: self.instant,
            interval_ms: self.interval_ms,
            load_stamp: self.last_load_stamp,
            pace: self.pace.get(),
            waiting: self.waiting,
            full: fresh && self.full,
            full_since: self.full_since.filter(|_| fresh),
            last_full: self.last_full,
            excluded: excluded.map(|(reason, _)| reason),
            excluded_at: excluded.map(|(_, at)| at),
            soft_bound: self.bounds.soft(now_ms),
            hard_bound: self.bounds.hard(now_ms),
            own_now: f64::from(self.live.own_now()),
            live,
            own_change_live,
            own_change: self
                .last_load_stamp
                .and_then(|stamp| self.live.own_change_since(stamp))
                .or_else(|| {
                    self.own_at_load
                        .map(|then| f64::from(self.live.own_now()) - f64::from(then))
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::CAPACITY_FLOOR;
    use crate::reading::UnitQueues;

    const FRESH: u64 = 15_000;

    fn load(stamp: u64, in_flight: f64, queued: f64) -> Reading {
        Reading {
            in_flight: Some(in_flight),
            queue_depth: Some(queued),
            ready_endpoints: Some(2),
            ..Reading::new(stamp)
        }
    }

    fn saturated(stamp: u64, in_flight: f64) -> Reading {
        Reading {
            units: Some(UnitQueues {
                units: 2,
                waiting: 2,
            }),
            ..load(stamp, in_flight, 4.0)
        }
    }

    #[test]
    fn a_site_ejected_while_it_read_zero_ready_endpoints_is_back_when_a_reading_says_it_serves() {
        use crate::live::{CONSECUTIVE_FAILURES, OutlierChange, Rejoin};
        let failing = |streak| LiveEvidence {
            failures: CONSECUTIVE_FAILURES,
            streak,
            ..LiveEvidence::default()
        };
        let zero = |stamp| Reading {
            ready_endpoints: Some(0),
            ..load(stamp, 0.0, 0.0)
        };
        let mut l = Learner::default();
        l.observe(&load(1_000, 2.0, 0.0), FRESH);
        // Its endpoints go: the requests it held fail, and then a reading says so.
        assert!(matches!(
            l.observe_live(&failing(CONSECUTIVE_FAILURES), 1_100),
            Some(OutlierChange::Ejected { .. })
        ));
        l.observe(&zero(1_500), FRESH);
        assert_eq!(l.observe_live(&LiveEvidence::default(), 1_600), None);
        // Back: the first reading that says it serves ends the ejection, long before a
        // probe is due.
        l.observe(&load(2_000, 0.0, 0.0), FRESH);
        assert_eq!(
            l.observe_live(&LiveEvidence::default(), 2_000),
            Some(OutlierChange::Rejoined {
                cause: Rejoin::Ready
            })
        );
        assert_eq!(l.ejected_since(), None);
        // Failing while every reading says it serves: readings do not bring it back.
        assert!(matches!(
            l.observe_live(&failing(2 * CONSECUTIVE_FAILURES), 3_000),
            Some(OutlierChange::Ejected { .. })
        ));
        for t in 4..10 {
            l.observe(&load(t * 1_000, 0.0, 0.0), FRESH);
            assert_eq!(l.observe_live(&LiveEvidence::default(), t * 1_000), None);
        }
    }

    #[test]
    fn capacity_is_learned_from_unqueued_and_limit_readings() {
        let mut l = Learner::default();
        l.observe(&load(1, 20.0, 0.0), FRESH);
        let v = l.view(1, FRESH);
        assert!((v.reach - 40.0).abs() < 1e-9, "soft bound with headroom");
        assert!((v.capacity - 20.0).abs() < 1e-9, "shown as held");
        // At the limit 12 are in flight but 4 of them wait: the slots hold 8.
        l.observe(&saturated(2, 12.0), FRESH);
        let v = l.view(2, FRESH);
        assert!((v.capacity - 8.0).abs() < 1e-9 && (v.reach - 8.0).abs() < 1e-9);
    }

    #[test]
    fn the_capacity_reported_stays_within_a_fifth_of_the_truth_through_ten_minutes_of_saturation() {
        // A 16-slot site seen calm once, then kept queued for ten minutes (4 waiting, 16
        // in service), a reading a second: what /metrics and the demo report as its
        // capacity stays at what it serves.
        let mut l = Learner::default();
        l.observe(&load(1_000, 16.0, 0.0), FRESH);
        for s in 2..=600 {
            let t = s * 1_000;
            l.observe(&saturated(t, 20.0), FRESH);
            let shown = l.view(t, FRESH).shown_capacity;
            assert!(
                (shown - 16.0).abs() <= 16.0 * 0.2,
                "{shown} after {s} s of saturation"
            );
        }
    }

    #[test]
    fn a_site_that_keeps_a_queue_is_paced_down_and_recovers_once_it_drains() {
        let mut l = Learner::default();
        // Eight slots (shown at a limit), then a queue of 24 (3 per slot) every 5 s.
        let mut t = 0;
        for _ in 0..4 {
            t += 5_000;
            l.observe(
                &Reading {
                    units: Some(UnitQueues {
                        units: 2,
                        waiting: 2,
                    }),
                    ..load(t, 32.0, 24.0)
                },
                FRESH,
            );
        }
        let v = l.view(t, FRESH);
        assert!((v.interval_ms - 5_000.0).abs() < 1e-9, "readings stand 5 s");
        assert!(
            (v.pace - crate::PACE_DOWN.powi(3)).abs() < 1e-9,
            "{}",
            v.pace
        );
        assert!((v.instant - 4.0).abs() < 1e-9, "32 in flight on 8 slots");
        for _ in 0..20 {
            t += 5_000;
            let drained = Reading {
                units: Some(UnitQueues {
                    units: 2,
                    waiting: 0,
                }),
                ..load(t, 4.0, 0.0)
            };
            l.observe(&drained, FRESH);
        }
        assert!((l.view(t, FRESH).pace - 1.0).abs() < 1e-12);
    }

    #[test]
    fn a_reading_that_is_not_newer_leaves_rho_alone() {
        let mut l = Learner::default();
        assert_eq!(l.observe(&load(10, 5.0, 0.0), FRESH), Observed::NewSample);
        let before = l.view(10, FRESH);
        assert_eq!(l.observe(&load(10, 50.0, 9.0), FRESH), Observed::NotNewer);
        assert_eq!(l.observe(&load(9, 50.0, 9.0), FRESH), Observed::NotNewer);
        assert_eq!(l.view(10, FRESH), before);
    }

    #[test]
    fn paused_learning_keeps_bounds_but_still_reads_pressure() {
        let mut l = Learner::default();
        l.observe(&load(1, 10.0, 0.0), FRESH);
        let paused = Reading {
            learning_allowed: false,
            ..load(2, 30.0, 0.0)
        };
        l.observe(&paused, FRESH);
        let v = l.view(2, FRESH);
        assert!(
            (v.reach - 20.0).abs() < 1e-3 && (v.capacity - 10.0).abs() < 1e-3,
            "bounds frozen at soft 10 (1 ms of decay aside)"
        );
        let (rho, _) = v.load.unwrap();
        assert!(
            (rho - (0.5 * 1.5 + 0.5 * 0.5)).abs() < 1e-3,
            "pressure read: {rho}"
        );
    }

    #[test]
    fn reset_forgets_bounds_and_load_but_not_the_last_stamp() {
        let mut l = Learner::default();
        l.observe(&saturated(1, 4.0), FRESH);
        l.reset();
        let v = l.view(1, FRESH);
        assert!((v.capacity - CAPACITY_FLOOR).abs() < 1e-9);
        assert_eq!(v.load, None);
        assert_eq!(v.full_since, None);
        assert_eq!(l.observe(&saturated(1, 4.0), FRESH), Observed::NotNewer);
        assert_eq!(l.observe(&load(2, 3.0, 0.0), FRESH), Observed::NewSample);
        let (rho, worst) = l.view(2, FRESH).load.unwrap();
        assert!(
            (rho - 0.5).abs() < 1e-9 && (worst - 0.5).abs() < 1e-9,
            "first sample as is: 3 against 3 with headroom"
        );
    }

    /// A reading that carries no readiness at all: no verdict, no endpoint count.
    fn silent_on_readiness(stamp: u64) -> Reading {
        Reading {
            ready_endpoints: None,
            in_flight: None,
            queue_depth: None,
            ..Reading::new(stamp)
        }
    }

    #[test]
    fn not_ready_excludes_until_a_newer_reading_says_ready() {
        let mut l = Learner::default();
        l.observe(
            &Reading {
                ready: Some(false),
                ..load(1, 1.0, 0.0)
            },
            FRESH,
        );
        assert_eq!(l.view(1, FRESH).excluded, Some(ExcludeReason::NotReady));
        l.observe(
            &Reading {
                ready: None,
                ..load(2, 1.0, 0.0)
            },
            FRESH,
        );
        assert_eq!(l.view(2, FRESH).excluded, None, "two ready endpoints");
    }

    #[test]
    fn excluded_until_a_later_reading_says_ready_not_merely_until_one_says_nothing() {
        // An exclusion lasts until a reading says ready: a newer reading that does not
        // say 0 but says nothing about readiness (unknown) leaves it as it was.
        let mut l = Learner::default();
        l.observe(
            &Reading {
                ready_endpoints: Some(0),
                ..Reading::new(1_000)
            },
            FRESH,
        );
        l.observe(&silent_on_readiness(2_000), FRESH);
        assert_eq!(
            l.view(2_000, FRESH).excluded,
            Some(ExcludeReason::NoReadyEndpoints),
            "a reading without readiness leaves the exclusion as it was"
        );
        l.observe(&load(3_000, 1.0, 0.0), FRESH);
        assert_eq!(
            l.view(3_000, FRESH).excluded,
            None,
            "a count of 2 says ready"
        );
    }

    #[test]
    fn an_old_zero_never_outlives_its_reading_when_later_ones_carry_no_readiness() {
        // No sticky exclusion: a zero lasts only as long as its reading is fresh, so a
        // site that read zero once and then only batches without the series is not
        // excluded for ever (its model would answer 503 at 10, 40, 600 s).
        let mut l = Learner::default();
        l.observe(
            &Reading {
                ready_endpoints: Some(0),
                ..Reading::new(1_000)
            },
            FRESH,
        );
        let mut t = 1_000;
        while t < 600_000 {
            t += 1_000;
            l.observe(&silent_on_readiness(t), FRESH);
            let want = (t - 1_000 <= FRESH).then_some(ExcludeReason::NoReadyEndpoints);
            assert_eq!(l.view(t, FRESH).excluded, want, "at {t} ms");
        }
        // Exactly at the hold the zero still stands; one past, it has aged out, also when
        // nothing newer arrives at all.
        let mut quiet = Learner::default();
        quiet.observe(
            &Reading {
                ready: Some(false),
                ..Reading::new(1_000)
            },
            FRESH,
        );
        assert!(quiet.view(1_000 + FRESH, FRESH).excluded.is_some());
        assert!(quiet.view(1_001 + FRESH, FRESH).excluded.is_none());
    }

    #[test]
    fn readings_of_an_excluded_site_never_move_a_capacity_bound() {
        // No capacity collapse: at zero ready endpoints flow control holds everything and
        // nothing is in service, which must not read as a hard bound of zero (a 12-slot
        // site would fall to the floor for many minutes). A twin that never saw the blip
        // must end up exactly where the blipped one does.
        let (mut blipped, mut twin) = (Learner::default(), Learner::default());
        let mut t = 0;
        for _ in 0..5 {
            t += 1_000;
            blipped.observe(&saturated(t, 16.0), FRESH); // 12 in service at a limit
            twin.observe(&saturated(t, 16.0), FRESH);
        }
        assert!((blipped.view(t, FRESH).capacity - 12.0).abs() < 1e-6);
        for _ in 0..6 {
            t += 1_000;
            blipped.observe(
                &Reading {
                    ready_endpoints: Some(0),
                    in_flight: Some(20.0),
                    queue_depth: Some(0.0),
                    flow_held: Some(20.0),
                    ..Reading::new(t)
                },
                FRESH,
            );
            assert_eq!(
                blipped.view(t, FRESH).excluded,
                Some(ExcludeReason::NoReadyEndpoints)
            );
        }
        t += 1_000;
        let not_ready = Reading {
            ready: Some(false),
            ..saturated(t, 2.0)
        };
        blipped.observe(&not_ready, FRESH);
        t += 1_000;
        let back = Reading {
            units: Some(UnitQueues {
                units: 2,
                waiting: 0,
            }),
            ..load(t, 3.0, 0.0)
        };
        blipped.observe(&back, FRESH);
        twin.observe(&back, FRESH);
        let (after, want) = (blipped.view(t, FRESH), twin.view(t, FRESH));
        assert_eq!(after.excluded, None);
        assert!(
            (after.capacity - want.capacity).abs() < 1e-9
                && (after.reach - want.reach).abs() < 1e-9,
            "{after:?} against {want:?}"
        );
        assert!((after.pace - want.pace).abs() < 1e-12, "pace untouched");
        assert!(
            (after.reach - 6.0).abs() < 1e-6,
            "hard 12, soft 3 explored to 6"
        );
    }

    #[test]
    fn zero_ready_endpoints_excludes() {
        let mut l = Learner::default();
        l.observe(
            &Reading {
                ready_endpoints: Some(0),
                ..Reading::new(1)
            },
            FRESH,
        );
        assert_eq!(
            l.view(1, FRESH).excluded,
            Some(ExcludeReason::NoReadyEndpoints)
        );
    }

    #[test]
    fn unit_series_that_stop_while_endpoints_stamp_exclude() {
        let mut l = Learner::default();
        l.observe(
            &Reading {
                units: Some(UnitQueues {
                    units: 2,
                    waiting: 0,
                }),
                ..load(1, 1.0, 0.0)
            },
            FRESH,
        );
        l.observe(&load(2, 1.0, 0.0), FRESH);
        assert_eq!(
            l.view(2, FRESH).excluded,
            Some(ExcludeReason::UnitSeriesStopped)
        );
        l.observe(
            &Reading {
                units: Some(UnitQueues {
                    units: 2,
                    waiting: 0,
                }),
                ..load(3, 1.0, 0.0)
            },
            FRESH,
        );
        assert_eq!(l.view(3, FRESH).excluded, None);
    }

    #[test]
    fn a_backend_without_unit_series_is_never_excluded_for_it() {
        let mut l = Learner::default();
        l.observe(&load(1, 1.0, 0.0), FRESH);
        l.observe(&load(2, 1.0, 0.0), FRESH);
        assert_eq!(l.view(2, FRESH).excluded, None);
    }

    #[test]
    fn load_exactly_at_the_freshness_limit_counts_and_one_past_does_not() {
        let mut l = Learner::default();
        l.observe(&load(1_000, 1.0, 0.0), FRESH);
        assert!(l.view(1_000 + FRESH, FRESH).load.is_some());
        assert!(l.view(1_000 + FRESH + 1, FRESH).load.is_none());
    }

    #[test]
    fn saturation_with_work_waiting_starts_a_full_run_that_a_roomy_sample_ends() {
        let mut l = Learner::default();
        l.observe(&load(1, 4.0, 0.0), FRESH); // capacity 8, rho 0.5
        l.observe(&saturated(2, 16.0), FRESH); // rho 0.5 * 2 + 0.5 * 0.5 = 1.25
        l.observe(&saturated(3, 16.0), FRESH);
        let v = l.view(3, FRESH);
        assert!(v.full);
        assert_eq!((v.full_since, v.last_full), (Some(2), Some(3)));
        l.observe(&load(4, 1.0, 0.0), FRESH);
        let v = l.view(4, FRESH);
        assert!(!v.full);
        assert_eq!((v.full_since, v.last_full), (None, Some(3)));
    }
}
