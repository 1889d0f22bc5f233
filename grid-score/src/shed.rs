//! Shedding: per model, a two-threshold state machine so a model near saturation does not
//! flap between 429 and routing.
//!
//! Enter when every healthy site has shown saturation with work waiting continuously for
//! `full_after_ms`, the newest such sample no older than `room_after_ms`. Leave once no
//! site has shown it for more than `room_after_ms`. Between the two, the state holds. A
//! healthy site of unknown state (no fresh reading) forbids shedding outright: the gateway
//! cannot claim every site is full when it cannot see one.

use crate::config::ShedConfig;

/// What the machine reads of one healthy (not excluded) candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SiteSaturation {
    /// No fresh reading: state unknown.
    pub unknown: bool,
    /// Stamp of the first sample of the current saturated-with-work-waiting run.
    pub full_since: Option<u64>,
    /// Stamp of the newest sample that showed saturation with work waiting.
    pub last_full: Option<u64>,
}

/// Shedding state of one model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShedState {
    shedding: bool,
}

impl ShedState {
    /// Whether the model is shedding after the last step.
    pub fn shedding(self) -> bool {
        self.shedding
    }

    /// Advances the machine to `now_ms` over the model's healthy sites; returns whether
    /// the model sheds.
    pub fn step(&mut self, now_ms: u64, config: &ShedConfig, sites: &[SiteSaturation]) -> bool {
        let age = |t: u64| now_ms.saturating_sub(t);
        self.shedding = if !config.enabled || sites.is_empty() || sites.iter().any(|s| s.unknown) {
            false
        } else if self.shedding {
            // Stay until no site has shown saturation for more than room_after_ms.
            sites
                .iter()
                .any(|s| s.last_full.is_some_and(|t| age(t) <= config.room_after_ms))
        } else {
            sites.iter().all(|s| {
                s.full_since.is_some_and(|t| age(t) >= config.full_after_ms)
                    && s.last_full.is_some_and(|t| age(t) <= config.room_after_ms)
            })
        };
        self.shedding
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on() -> ShedConfig {
        ShedConfig {
            enabled: true,
            ..ShedConfig::default()
        }
    }

    fn full(since: u64, last: u64) -> SiteSaturation {
        SiteSaturation {
            unknown: false,
            full_since: Some(since),
            last_full: Some(last),
        }
    }

    #[test]
    fn sheds_exactly_at_full_after_and_not_a_millisecond_before() {
        let c = on();
        let sites = [full(1_000, 1_000 + c.full_after_ms - 1), full(500, 2_000)];
        let mut s = ShedState::default();
        assert!(!s.step(1_000 + c.full_after_ms - 1, &c, &sites));
        assert!(s.step(1_000 + c.full_after_ms, &c, &sites));
    }

    #[test]
    fn routes_again_only_one_past_room_after_with_no_full_sample() {
        let c = on();
        let mut s = ShedState::default();
        assert!(s.step(10_000, &c, &[full(0, 10_000)]));
        let quiet = [SiteSaturation {
            unknown: false,
            full_since: None,
            last_full: Some(10_000),
        }];
        assert!(s.step(10_000 + c.room_after_ms, &c, &quiet));
        assert!(!s.step(10_000 + c.room_after_ms + 1, &c, &quiet));
    }

    #[test]
    fn one_site_with_room_prevents_shedding() {
        let c = on();
        let roomy = SiteSaturation::default();
        let mut s = ShedState::default();
        assert!(!s.step(100_000, &c, &[full(0, 100_000), roomy]));
    }

    #[test]
    fn a_healthy_site_of_unknown_state_never_sheds_even_while_shedding() {
        let c = on();
        let mut s = ShedState::default();
        assert!(s.step(10_000, &c, &[full(0, 10_000)]));
        let unknown = SiteSaturation {
            unknown: true,
            ..SiteSaturation::default()
        };
        assert!(!s.step(10_001, &c, &[full(0, 10_001), unknown]));
    }

    #[test]
    fn disabled_shedding_never_sheds() {
        let mut s = ShedState::default();
        assert!(!s.step(10_000, &ShedConfig::default(), &[full(0, 10_000)]));
    }

    #[test]
    fn an_old_full_sample_from_a_silent_site_does_not_restart_shedding() {
        let c = on();
        let mut s = ShedState::default();
        assert!(s.step(10_000, &c, &[full(0, 10_000)]));
        // The site went silent; its newest sample still says full, but it is old.
        let later = 10_000 + c.room_after_ms + 1;
        assert!(!s.step(later, &c, &[full(0, 10_000)]));
        assert!(!s.step(later + 1, &c, &[full(0, 10_000)]));
    }
}
