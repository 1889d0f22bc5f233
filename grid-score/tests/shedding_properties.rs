//! Shedding hysteresis: transitions happen only when the raw sample history justifies
//! them, so the model never flaps between the two thresholds.

use grid_score::{ShedConfig, ShedState, SiteSaturation};
use proptest::prelude::*;

/// Per-site sample history kept independently of the learner: (stamp, full) in order.
#[derive(Default, Clone)]
struct History(Vec<(u64, bool)>);

impl History {
    fn saturation(&self) -> SiteSaturation {
        let last_full = self.0.iter().rev().find(|s| s.1).map(|s| s.0);
        let run_start = self.0.iter().rev().take_while(|s| s.1).last().map(|s| s.0);
        SiteSaturation {
            unknown: self.0.is_empty(),
            full_since: run_start,
            last_full,
        }
    }

    /// Full continuously over at least the last `span` ms up to `now`.
    fn full_for(&self, now: u64, span: u64) -> bool {
        self.saturation()
            .full_since
            .is_some_and(|t| now.saturating_sub(t) >= span)
    }

    /// A full sample within the last `span` ms.
    fn full_within(&self, now: u64, span: u64) -> bool {
        self.0
            .iter()
            .any(|&(t, full)| full && now.saturating_sub(t) <= span)
    }
}

fn config() -> ShedConfig {
    ShedConfig {
        enabled: true,
        full_after_ms: 2_000,
        room_after_ms: 5_000,
        retry_after_ms: 1_000,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn shedding_changes_state_only_when_the_history_crosses_a_threshold(
        // Each case draws how often samples are full, so some runs mostly enter and
        // others mostly leave.
        events in (0.2..0.95f64).prop_flat_map(|p| proptest::collection::vec(
            (0u64..2_500, 0usize..3, proptest::bool::weighted(p)), 1..200)),
    ) {
        let c = config();
        let mut sites = vec![History::default(); 3];
        let mut state = ShedState::default();
        let mut now = 0;
        let mut last_exit: Option<u64> = None;
        for (dt, site, full) in events {
            now += dt;
            sites[site].0.push((now, full));
            let before = state.shedding();
            let sat: Vec<_> = sites.iter().map(History::saturation).collect();
            let after = state.step(now, &c, &sat);
            if !before && after {
                // Entry: every site full continuously for full_after, recently.
                prop_assert!(sites.iter().all(|h| h.full_for(now, c.full_after_ms)
                    && h.full_within(now, c.room_after_ms)));
                // No flapping: re-entry after an exit needs new evidence from every site,
                // a full sample that arrived after the exit.
                if let Some(exit) = last_exit {
                    prop_assert!(sites.iter().all(|h| h.0.iter().any(|&(t, full)| full && t > exit)));
                }
            }
            if before && !after {
                // Exit: no site showed full within room_after.
                prop_assert!(sites.iter().all(|h| !h.full_within(now, c.room_after_ms)));
                last_exit = Some(now);
            }
            if before == after && after {
                // Staying: some site showed full recently.
                prop_assert!(sites.iter().any(|h| h.full_within(now, c.room_after_ms)));
            }
        }
    }

    /// Load oscillating faster than either threshold never moves the state.
    #[test]
    fn oscillating_load_between_thresholds_never_flaps(period in 100u64..1_900, start_shedding in any::<bool>()) {
        let c = config();
        let mut state = ShedState::default();
        let mut now = 100_000;
        if start_shedding {
            let steady = SiteSaturation { unknown: false, full_since: Some(0), last_full: Some(now) };
            prop_assert!(state.step(now, &c, &[steady]));
        }
        let mut run_start = None;
        let mut last_full = start_shedding.then_some(now);
        for i in 0..200 {
            now += period;
            let full = i % 2 == 0;
            if full {
                run_start.get_or_insert(now);
                last_full = Some(now);
            } else {
                run_start = None;
            }
            let sat = SiteSaturation { unknown: false, full_since: run_start, last_full };
            prop_assert_eq!(state.step(now, &c, &[sat]), start_shedding);
        }
    }
}
