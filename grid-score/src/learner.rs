//! One candidate's learned state: bounds, pressure, exclusion and saturation history,
//! fed one reading at a time.

use crate::capacity::Bounds;
use crate::headroom::Pace;
use crate::reading::Reading;
use crate::rho::{Pressure, instant_rho};

/// Why a candidate is out of selection until a newer reading says otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExcludeReason {
    /// `grid_provider_ready` read 0.
    NotReady,
    /// The EPP's ready-endpoint count read 0.
    NoReadyEndpoints,
    /// The per-unit series stopped while the ready-endpoint count kept stamping: the EPP
    /// lost its endpoints' metrics, so the averages it still stamps are frozen.
    UnitSeriesStopped,
}

impl ExcludeReason {
    /// Every reason, for pre-registering labels and exhaustive tests.
    pub const ALL: [Self; 3] = [
        Self::NotReady,
        Self::NoReadyEndpoints,
        Self::UnitSeriesStopped,
    ];

    /// The metric label for this reason.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NotReady => "not_ready",
            Self::NoReadyEndpoints => "no_ready_endpoints",
            Self::UnitSeriesStopped => "unit_series_stopped",
        }
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
    /// Unsmoothed rho of the newest loaded sample: what the site held at its stamp, which
    /// headroom reads (the smoothed rho lags a 5 s-apart remote reading by a whole poll).
    instant: f64,
    /// Smoothed gap between loaded samples (ms): how long one reading stands.
    interval_ms: f64,
    pace: Pace,
    waiting: f64,
    excluded: Option<ExcludeReason>,
    had_units: bool,
    full_since: Option<u64>,
    last_full: Option<u64>,
    full: bool,
}

/// What the ordering step reads from a learner at one instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LearnerView {
    pub(crate) capacity: f64,
    /// Smoothed rho and recent worst, present only when a fresh loaded sample exists.
    pub(crate) load: Option<(f64, f64)>,
    /// Unsmoothed rho of the newest loaded sample; read only with `load`.
    pub(crate) instant: f64,
    /// Smoothed gap between loaded samples (ms); 0 before the second.
    pub(crate) interval_ms: f64,
    pub(crate) pace: f64,
    pub(crate) waiting: f64,
    pub(crate) full: bool,
    pub(crate) full_since: Option<u64>,
    pub(crate) last_full: Option<u64>,
    pub(crate) excluded: Option<ExcludeReason>,
}

impl Learner {
    /// Feeds one already-validated reading.
    pub(crate) fn observe(&mut self, r: &Reading) -> Observed {
        if self.last_stamp.is_some_and(|last| r.stamp_ms <= last) {
            return Observed::NotNewer;
        }
        self.last_stamp = Some(r.stamp_ms);
        self.excluded = self.exclusion(r);
        self.had_units |= r.units.is_some();

        let stamp = r.stamp_ms;
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
        let capacity = self.bounds.capacity(stamp);
        self.waiting = r.queue_depth.unwrap_or(0.0) + r.flow_held.unwrap_or(0.0);
        let rho = instant_rho(r.in_flight, capacity, r.kv_pressure()).map(|instant| {
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
            self.instant = instant;
            self.pressure.push(instant, stamp)
        });
        self.full = rho.is_some_and(|rho| rho >= 1.0) && r.work_waiting();
        if self.full {
            self.full_since.get_or_insert(stamp);
            self.last_full = Some(stamp);
        } else {
            self.full_since = None;
        }
        Observed::NewSample
    }

    fn exclusion(&self, r: &Reading) -> Option<ExcludeReason> {
        if r.ready == Some(false) {
            Some(ExcludeReason::NotReady)
        } else if r.ready_endpoints == Some(0) {
            Some(ExcludeReason::NoReadyEndpoints)
        } else if self.had_units && r.units.is_none() && r.ready_endpoints.is_some() {
            Some(ExcludeReason::UnitSeriesStopped)
        } else {
            None
        }
    }

    /// A revision changed: forget bounds, load and congestion history. The last stamp and
    /// the exclusion verdict stay: a replayed older reading must not count as new, and
    /// readiness is about the site, not the revision.
    pub(crate) fn reset(&mut self) {
        *self = Self {
            last_stamp: self.last_stamp,
            excluded: self.excluded,
            ..Self::default()
        };
    }

    /// The learner as the ordering step sees it at `now_ms`; load counts only when its
    /// newest sample is at most `fresh_for_ms` old.
    pub(crate) fn view(&self, now_ms: u64, fresh_for_ms: u64) -> LearnerView {
        let fresh = self
            .last_load_stamp
            .is_some_and(|s| now_ms.saturating_sub(s) <= fresh_for_ms);
        let load = if fresh {
            self.pressure.rho().zip(self.pressure.recent_worst(now_ms))
        } else {
            None
        };
        LearnerView {
            capacity: self.bounds.capacity(now_ms),
            load,
            instant: self.instant,
            interval_ms: self.interval_ms,
            pace: self.pace.get(),
            waiting: self.waiting,
            full: fresh && self.full,
            full_since: self.full_since.filter(|_| fresh),
            last_full: self.last_full,
            excluded: self.excluded,
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
    fn capacity_is_learned_from_unqueued_and_limit_readings() {
        let mut l = Learner::default();
        l.observe(&load(1, 20.0, 0.0));
        assert!(
            (l.view(1, FRESH).capacity - 40.0).abs() < 1e-9,
            "soft bound with headroom"
        );
        // At the limit 12 are in flight but 4 of them wait: the slots hold 8.
        l.observe(&saturated(2, 12.0));
        assert!((l.view(2, FRESH).capacity - 8.0).abs() < 1e-9);
    }

    #[test]
    fn a_site_that_keeps_a_queue_is_paced_down_and_recovers_once_it_drains() {
        let mut l = Learner::default();
        // Eight slots (shown at a limit), then a queue of 24 (3 per slot) every 5 s.
        let mut t = 0;
        for _ in 0..4 {
            t += 5_000;
            l.observe(&Reading {
                units: Some(UnitQueues {
                    units: 2,
                    waiting: 2,
                }),
                ..load(t, 32.0, 24.0)
            });
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
            l.observe(&load(t, 4.0, 0.0));
        }
        assert!((l.view(t, FRESH).pace - 1.0).abs() < 1e-12);
    }

    #[test]
    fn a_reading_that_is_not_newer_leaves_rho_alone() {
        let mut l = Learner::default();
        assert_eq!(l.observe(&load(10, 5.0, 0.0)), Observed::NewSample);
        let before = l.view(10, FRESH);
        assert_eq!(l.observe(&load(10, 50.0, 9.0)), Observed::NotNewer);
        assert_eq!(l.observe(&load(9, 50.0, 9.0)), Observed::NotNewer);
        assert_eq!(l.view(10, FRESH), before);
    }

    #[test]
    fn paused_learning_keeps_bounds_but_still_reads_pressure() {
        let mut l = Learner::default();
        l.observe(&load(1, 10.0, 0.0));
        let paused = Reading {
            learning_allowed: false,
            ..load(2, 30.0, 0.0)
        };
        l.observe(&paused);
        let v = l.view(2, FRESH);
        assert!(
            (v.capacity - 20.0).abs() < 1e-3,
            "bounds frozen at soft 10 with headroom (1 ms of decay aside)"
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
        l.observe(&saturated(1, 4.0));
        l.reset();
        let v = l.view(1, FRESH);
        assert!((v.capacity - CAPACITY_FLOOR).abs() < 1e-9);
        assert_eq!(v.load, None);
        assert_eq!(v.full_since, None);
        assert_eq!(l.observe(&saturated(1, 4.0)), Observed::NotNewer);
        assert_eq!(l.observe(&load(2, 3.0, 0.0)), Observed::NewSample);
        let (rho, worst) = l.view(2, FRESH).load.unwrap();
        assert!(
            (rho - 0.5).abs() < 1e-9 && (worst - 0.5).abs() < 1e-9,
            "first sample as is: 3 against 3 with headroom"
        );
    }

    #[test]
    fn not_ready_excludes_until_a_newer_reading_clears_it() {
        let mut l = Learner::default();
        l.observe(&Reading {
            ready: Some(false),
            ..load(1, 1.0, 0.0)
        });
        assert_eq!(l.view(1, FRESH).excluded, Some(ExcludeReason::NotReady));
        // Going stale does not clear it.
        assert_eq!(
            l.view(1_000_000, FRESH).excluded,
            Some(ExcludeReason::NotReady)
        );
        l.observe(&Reading {
            ready: None,
            ..load(2, 1.0, 0.0)
        });
        assert_eq!(l.view(2, FRESH).excluded, None);
    }

    #[test]
    fn zero_ready_endpoints_excludes() {
        let mut l = Learner::default();
        l.observe(&Reading {
            ready_endpoints: Some(0),
            ..Reading::new(1)
        });
        assert_eq!(
            l.view(1, FRESH).excluded,
            Some(ExcludeReason::NoReadyEndpoints)
        );
    }

    #[test]
    fn unit_series_that_stop_while_endpoints_stamp_exclude() {
        let mut l = Learner::default();
        l.observe(&Reading {
            units: Some(UnitQueues {
                units: 2,
                waiting: 0,
            }),
            ..load(1, 1.0, 0.0)
        });
        l.observe(&load(2, 1.0, 0.0));
        assert_eq!(
            l.view(2, FRESH).excluded,
            Some(ExcludeReason::UnitSeriesStopped)
        );
        l.observe(&Reading {
            units: Some(UnitQueues {
                units: 2,
                waiting: 0,
            }),
            ..load(3, 1.0, 0.0)
        });
        assert_eq!(l.view(3, FRESH).excluded, None);
    }

    #[test]
    fn a_backend_without_unit_series_is_never_excluded_for_it() {
        let mut l = Learner::default();
        l.observe(&load(1, 1.0, 0.0));
        l.observe(&load(2, 1.0, 0.0));
        assert_eq!(l.view(2, FRESH).excluded, None);
    }

    #[test]
    fn load_exactly_at_the_freshness_limit_counts_and_one_past_does_not() {
        let mut l = Learner::default();
        l.observe(&load(1_000, 1.0, 0.0));
        assert!(l.view(1_000 + FRESH, FRESH).load.is_some());
        assert!(l.view(1_000 + FRESH + 1, FRESH).load.is_none());
    }

    #[test]
    fn saturation_with_work_waiting_starts_a_full_run_that_a_roomy_sample_ends() {
        let mut l = Learner::default();
        l.observe(&load(1, 4.0, 0.0)); // capacity 8, rho 0.5
        l.observe(&saturated(2, 16.0)); // rho 0.5 * 2 + 0.5 * 0.5 = 1.25
        l.observe(&saturated(3, 16.0));
        let v = l.view(3, FRESH);
        assert!(v.full);
        assert_eq!((v.full_since, v.last_full), (Some(2), Some(3)));
        l.observe(&load(4, 1.0, 0.0));
        let v = l.view(4, FRESH);
        assert!(!v.full);
        assert_eq!((v.full_since, v.last_full), (None, Some(3)));
    }
}
