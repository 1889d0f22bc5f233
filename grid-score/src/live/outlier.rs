//! Sites that fail are taken out of selection and probed back in: the outlier detection
//! of Envoy's clusters, kept per candidate off the request path.
//!
//! A candidate is ejected when [`CONSECUTIVE_FAILURES`] of its exchanges in a row failed
//! (a reset, a timeout, a 5xx answer), or when at least [`EJECT_FAILURE_RATIO`] of its
//! recent exchanges failed, once there were [`MIN_RATIO_EXCHANGES`] of them (the counts
//! decay with a half-life of [`RATIO_HALF_LIFE_MS`]). It stays out for
//! [`BASE_EJECTION_MS`] times the number of times it was ejected lately, at most
//! [`MAX_EJECTION_MS`]; a candidate not ejected for [`EJECTION_MEMORY_MS`] starts
//! counting again from one. Meanwhile the daemon probes it every [`PROBE_INTERVAL_MS`]
//! ([`Outlier::probe_due`]), and one probe answered brings it back at once, so a site
//! that recovers is back in its share within a probe interval and a refresh.
//!
//! An ejection a reading explains ends with that reading's cause: when a reading said
//! the site was out (no ready endpoints, not ready) while it was ejected, or as it was
//! ejected, its failures were the site going away, and the first reading after that says
//! it serves again brings it back at the next refresh ([`Rejoin::Ready`]), as a passing
//! active health check un-ejects a host in Envoy. A site failing while its readings say
//! it serves is not brought back by them: only a probe or time does that.
//!
//! A weight penalty alone (`FAILURE_HALF_LIFE_MS`) left a site that failed every request
//! about a seventeenth of its share for as long as it failed: a steady few percent of all
//! requests failed with nowhere else to go. Ejection removes it; the snapshot never
//! ejects more than [`MAX_EJECTED_SHARE`] of a model's candidates at once, so a problem
//! common to every site (a bad deployment everywhere, the gateway's own network) cannot
//! eject them all.

use super::slot::LiveEvidence;

/// Exchanges failing in a row that eject a candidate (Envoy's `consecutive_5xx`).
pub const CONSECUTIVE_FAILURES: u32 = 5;

/// The share of recent exchanges failed that ejects a candidate.
pub const EJECT_FAILURE_RATIO: f64 = 0.5;

/// Recent exchanges needed before the ratio is read: a site that served two requests
/// and failed one is not judged by them.
pub const MIN_RATIO_EXCHANGES: f64 = 20.0;

/// The recent exchanges the ratio reads lose half their weight every this many ms.
pub const RATIO_HALF_LIFE_MS: u64 = 10_000;

/// The first ejection's length; each later one (while remembered) is one more of these
/// (Envoy's `base_ejection_time`).
pub const BASE_EJECTION_MS: u64 = 30_000;

/// The longest ejection (Envoy's `max_ejection_time`).
pub const MAX_EJECTION_MS: u64 = 300_000;

/// A candidate back in selection this long without being ejected again has its
/// ejections forgotten.
pub const EJECTION_MEMORY_MS: u64 = 300_000;

/// How often an ejected candidate is probed: small next to the traffic a site takes,
/// short enough that a recovered site is back within seconds.
pub const PROBE_INTERVAL_MS: u64 = 2_000;

/// The most of one model's candidates ejected at once (at least one, never all): with
/// two sites, one can be ejected; with one, none.
pub const MAX_EJECTED_SHARE: f64 = 0.5;

/// How many of a model's `candidates` may be ejected at once.
pub fn max_ejected(candidates: usize) -> usize {
    let share = (candidates as f64 * MAX_EJECTED_SHARE).floor() as usize;
    share.max(1).min(candidates.saturating_sub(1))
}

grid_signals::label_values! {
    /// Why a candidate was ejected (the `reason` of `grid_gateway_score_ejections_total`).
    pub enum EjectReason {
        /// [`CONSECUTIVE_FAILURES`] exchanges in a row failed.
        Consecutive,
        /// At least [`EJECT_FAILURE_RATIO`] of its recent exchanges failed.
        Ratio,
    }
}

grid_signals::label_values! {
    /// What brought an ejected candidate back into selection.
    pub enum Rejoin {
        /// A probe answered.
        Probe,
        /// Its ejection ran out.
        Expired,
        /// A reading said it serves again after one said it was out while it was
        /// ejected: the readiness loss that explained its failures is over.
        Ready,
    }
}

/// What one observation did to a candidate's ejection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutlierChange {
    /// Ejected until `until_ms`.
    Ejected {
        /// Why.
        reason: EjectReason,
        /// When its ejection ends unless a probe answers first.
        until_ms: u64,
    },
    /// Back in selection.
    Rejoined {
        /// What brought it back.
        cause: Rejoin,
    },
}

/// One candidate's ejection state.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Outlier {
    /// Until when it is out, while it is.
    ejected_until: Option<u64>,
    /// Ejections remembered (see [`EJECTION_MEMORY_MS`]).
    ejections: u32,
    /// When it was last ejected.
    last_ejected_ms: u64,
    /// When it last came back.
    rejoined_ms: u64,
    /// When the next probe is due, while ejected.
    next_probe_ms: u64,
    /// The slot's failure streak when this state last acted on it: a streak counts from
    /// there, so one that ejected the candidate does not eject it again when it rejoins.
    streak_base: u32,
    /// Recent failures and exchanges, decayed to `window_at`.
    window_failures: f64,
    window_exchanges: f64,
    window_at: u64,
    /// The newest reading with a verdict said the site was out.
    read_out: bool,
    /// A reading said the site was out during this ejection (or as it began).
    explained: bool,
    /// Since then a reading said it serves: the next observation brings it back.
    ready_again: bool,
}

impl Outlier {
    /// Folds in what a slot held at `now_ms`; says when that ejected the candidate or
    /// brought it back.
    pub(crate) fn observe(&mut self, e: &LiveEvidence, now_ms: u64) -> Option<OutlierChange> {
        let decay =
            (-(now_ms.saturating_sub(self.window_at) as f64) / RATIO_HALF_LIFE_MS as f64).exp2();
        self.window_failures = self.window_failures * decay + f64::from(e.failures);
        self.window_exchanges =
            self.window_exchanges * decay + f64::from(e.failures) + f64::from(e.answers);
        self.window_at = now_ms.max(self.window_at);
        // The slot's streak starts over at each answer; below the base it did.
        if e.streak < self.streak_base {
            self.streak_base = 0;
        }
        let streak = e.streak - self.streak_base;
        if let Some(until) = self.ejected_until {
            let cause = if e.probes_answered > 0 {
                Rejoin::Probe
            } else if self.ready_again {
                Rejoin::Ready
            } else if now_ms >= until {
                Rejoin::Expired
            } else {
                return None;
            };
            self.rejoin(e.streak, now_ms);
            return Some(OutlierChange::Rejoined { cause });
        }
        let reason = if streak >= CONSECUTIVE_FAILURES {
            EjectReason::Consecutive
        } else if self.window_exchanges >= MIN_RATIO_EXCHANGES
            && self.window_failures >= EJECT_FAILURE_RATIO * self.window_exchanges
        {
            EjectReason::Ratio
        } else {
            return None;
        };
        if now_ms.saturating_sub(self.rejoined_ms) >= EJECTION_MEMORY_MS {
            self.ejections = 0;
        }
        self.ejections = self.ejections.saturating_add(1);
        let length = BASE_EJECTION_MS
            .saturating_mul(u64::from(self.ejections))
            .min(MAX_EJECTION_MS);
        let until_ms = now_ms.saturating_add(length);
        self.ejected_until = Some(until_ms);
        self.last_ejected_ms = now_ms;
        self.next_probe_ms = now_ms.saturating_add(PROBE_INTERVAL_MS);
        self.streak_base = e.streak;
        self.explained = self.read_out;
        self.ready_again = false;
        Some(OutlierChange::Ejected { reason, until_ms })
    }

    /// A reading's verdict on the site: `out` when it said the site cannot serve (no
    /// ready endpoints, not ready), else that it serves. Readings that say nothing of
    /// readiness are not passed in.
    pub(crate) fn readiness(&mut self, out: bool) {
        self.read_out = out;
        if self.ejected_until.is_none() {
            return;
        }
        if out {
            self.explained = true;
        } else if self.explained {
            self.ready_again = true;
        }
    }

    fn rejoin(&mut self, streak: u32, now_ms: u64) {
        self.ejected_until = None;
        self.explained = false;
        self.ready_again = false;
        self.rejoined_ms = now_ms;
        self.streak_base = streak;
        self.window_failures = 0.0;
        self.window_exchanges = 0.0;
    }

    /// Whether it is out of selection.
    #[cfg(test)]
    pub(crate) fn is_ejected(&self) -> bool {
        self.ejected_until.is_some()
    }

    /// When it was ejected, while it is (the snapshot keeps the longest-ejected ones when
    /// a model has more than its share out).
    pub(crate) fn ejected_since(&self) -> Option<u64> {
        self.ejected_until.map(|_| self.last_ejected_ms)
    }

    /// Until when it is out, while it is.
    pub(crate) fn ejected_until(&self) -> Option<u64> {
        self.ejected_until
    }

    /// Whether a probe is due at `now_ms`; when it is, the next one is scheduled a
    /// [`PROBE_INTERVAL_MS`] later.
    pub(crate) fn probe_due(&mut self, now_ms: u64) -> bool {
        if self.ejected_until.is_none() || now_ms < self.next_probe_ms {
            return false;
        }
        self.next_probe_ms = now_ms.saturating_add(PROBE_INTERVAL_MS);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_764_000_000_000;

    fn failing(streak: u32, failures: u32) -> LiveEvidence {
        LiveEvidence {
            failures,
            streak,
            ..LiveEvidence::default()
        }
    }

    #[test]
    fn five_failures_in_a_row_eject_and_four_do_not() {
        let mut o = Outlier::default();
        assert_eq!(o.observe(&failing(CONSECUTIVE_FAILURES - 1, 4), T), None);
        assert!(!o.is_ejected());
        assert_eq!(
            o.observe(&failing(CONSECUTIVE_FAILURES, 1), T + 1),
            Some(OutlierChange::Ejected {
                reason: EjectReason::Consecutive,
                until_ms: T + 1 + BASE_EJECTION_MS
            })
        );
        assert!(o.is_ejected());
    }

    #[test]
    fn half_of_twenty_recent_exchanges_failed_ejects_and_just_under_half_does_not() {
        let mixed = |failures: u32, answers: u32| LiveEvidence {
            failures,
            answers,
            ..LiveEvidence::default()
        };
        let mut o = Outlier::default();
        assert_eq!(o.observe(&mixed(9, 11), T), None, "9 of 20");
        let mut o = Outlier::default();
        assert_eq!(o.observe(&mixed(9, 10), T), None, "19 exchanges: too few");
        let mut o = Outlier::default();
        assert!(matches!(
            o.observe(&mixed(10, 10), T),
            Some(OutlierChange::Ejected {
                reason: EjectReason::Ratio,
                ..
            })
        ));
    }

    #[test]
    fn an_answered_probe_brings_a_site_back_at_once_and_time_does_without_one() {
        let mut o = Outlier::default();
        o.observe(&failing(5, 5), T);
        assert!(!o.probe_due(T + PROBE_INTERVAL_MS - 1));
        assert!(o.probe_due(T + PROBE_INTERVAL_MS));
        assert!(!o.probe_due(T + PROBE_INTERVAL_MS), "scheduled once");
        assert_eq!(o.observe(&failing(5, 0), T + 3_000), None, "still out");
        let probed = LiveEvidence {
            streak: 5,
            probes_answered: 1,
            ..LiveEvidence::default()
        };
        assert_eq!(
            o.observe(&probed, T + 4_000),
            Some(OutlierChange::Rejoined {
                cause: Rejoin::Probe
            })
        );
        assert!(!o.probe_due(T + 10_000), "not probed once back");
        // The streak that ejected it does not eject it again.
        assert_eq!(o.observe(&failing(5, 0), T + 5_000), None);
        // Out again by a new streak, and this time back by time alone.
        let Some(OutlierChange::Ejected { until_ms, .. }) = o.observe(&failing(10, 5), T + 6_000)
        else {
            panic!("not ejected again");
        };
        assert_eq!(
            until_ms,
            T + 6_000 + 2 * BASE_EJECTION_MS,
            "longer the second time"
        );
        assert_eq!(o.observe(&failing(10, 0), until_ms - 1), None);
        assert_eq!(
            o.observe(&failing(10, 0), until_ms),
            Some(OutlierChange::Rejoined {
                cause: Rejoin::Expired
            })
        );
    }

    #[test]
    fn a_site_ejected_while_read_out_is_back_at_the_first_reading_that_says_it_serves() {
        // Read out first, then its failures eject it.
        let mut o = Outlier::default();
        o.readiness(true);
        assert!(o.observe(&failing(5, 5), T).is_some());
        assert_eq!(o.observe(&failing(5, 0), T + 100), None, "still out");
        o.readiness(false);
        assert_eq!(
            o.observe(&failing(5, 0), T + 200),
            Some(OutlierChange::Rejoined {
                cause: Rejoin::Ready
            })
        );
        // Ejected first, then a reading says it is out, then that it serves.
        let mut o = Outlier::default();
        o.readiness(false);
        assert!(o.observe(&failing(5, 5), T).is_some());
        o.readiness(true);
        assert_eq!(o.observe(&failing(5, 0), T + 100), None);
        o.readiness(false);
        assert_eq!(
            o.observe(&failing(5, 0), T + 200),
            Some(OutlierChange::Rejoined {
                cause: Rejoin::Ready
            })
        );
    }

    #[test]
    fn a_site_failing_while_its_readings_say_it_serves_is_not_brought_back_by_them() {
        let mut o = Outlier::default();
        o.readiness(false);
        assert!(o.observe(&failing(5, 5), T).is_some());
        for i in 1..10 {
            o.readiness(false);
            assert_eq!(o.observe(&failing(5, 0), T + i * 1_000), None, "{i} s");
        }
        // An old "out" from before this ejection explains nothing: rejoining cleared it.
        let mut o = Outlier::default();
        o.readiness(true);
        o.observe(&failing(5, 5), T);
        o.readiness(false);
        assert!(
            o.observe(&failing(5, 0), T + 100).is_some(),
            "back by readiness"
        );
        o.readiness(false);
        assert!(
            o.observe(&failing(10, 5), T + 200).is_some(),
            "ejected again"
        );
        o.readiness(false);
        assert_eq!(o.observe(&failing(10, 0), T + 300), None);
    }

    #[test]
    fn ejections_grow_to_the_cap_and_are_forgotten_after_a_quiet_spell() {
        let mut o = Outlier::default();
        let mut now = T;
        let mut streak = 0;
        let mut lengths = Vec::new();
        for _ in 0..15 {
            streak += CONSECUTIVE_FAILURES;
            let Some(OutlierChange::Ejected { until_ms, .. }) = o.observe(&failing(streak, 5), now)
            else {
                panic!("not ejected");
            };
            lengths.push(until_ms - now);
            now = until_ms;
            o.observe(&failing(streak, 0), now);
        }
        assert_eq!(lengths[0], BASE_EJECTION_MS);
        assert_eq!(lengths[1], 2 * BASE_EJECTION_MS);
        assert_eq!(*lengths.last().unwrap(), MAX_EJECTION_MS);
        now += EJECTION_MEMORY_MS;
        streak += CONSECUTIVE_FAILURES;
        assert!(matches!(
            o.observe(&failing(streak, 5), now),
            Some(OutlierChange::Ejected { until_ms, .. }) if until_ms == now + BASE_EJECTION_MS
        ));
    }

    #[test]
    fn a_model_ejects_at_most_half_its_candidates_at_least_one_and_never_all() {
        assert_eq!(max_ejected(1), 0);
        assert_eq!(max_ejected(2), 1);
        assert_eq!(max_ejected(3), 1);
        assert_eq!(max_ejected(4), 2);
        assert_eq!(max_ejected(5), 2);
        assert_eq!(max_ejected(10), 5);
    }
}
