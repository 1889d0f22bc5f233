//! The demo's scripted scenarios: what happens to which site, and when, as a pure list of
//! steps scaled to the run's duration.

use std::fmt;

/// The demo's three sites: the gateway's own first, then two seen through peer operators.
/// (name, endpoints, slots per endpoint): unequal capacities of 16, 8 and 4 slots.
pub const SITES: [(&str, usize, usize); 3] = [("a", 4, 4), ("b", 2, 4), ("c", 2, 2)];

/// How much slower every request on the degraded site gets.
pub const DEGRADE_FACTOR: f64 = 3.0;
/// How much the offered load grows during the burst.
pub const BURST_FACTOR: f64 = 3.5;

/// Which script runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Everything in turn: a site degrades, one loses all endpoints and recovers, a burst
    /// saturates the grid and is shed.
    Full,
    /// Steady load, nothing happens: routing by capacity alone.
    Steady,
    /// Only the degraded site.
    Degrade,
    /// Only the outage and recovery.
    Outage,
    /// Only the burst.
    Burst,
}

impl Scenario {
    /// The flag spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Steady => "steady",
            Self::Degrade => "degrade",
            Self::Outage => "outage",
            Self::Burst => "burst",
        }
    }
}

/// What a step does.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Every request the site starts from now on takes `factor` times longer.
    Degrade {
        /// The site.
        site: &'static str,
        /// The slowdown.
        factor: f64,
    },
    /// The site loses every endpoint: its EPP reads zero ready endpoints.
    DropAll {
        /// The site.
        site: &'static str,
    },
    /// The site's endpoints and speed come back.
    Restore {
        /// The site.
        site: &'static str,
    },
    /// The offered load becomes `factor` times the base load.
    Load {
        /// Multiple of the base load.
        factor: f64,
    },
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Degrade { site, factor } => {
                write!(f, "{site} degrades: every request takes {factor}x longer")
            }
            Self::DropAll { site } => write!(f, "{site} loses all its endpoints"),
            Self::Restore { site } => write!(f, "{site} is restored"),
            Self::Load { factor } if *factor > 1.0 => {
                write!(f, "burst: offered load x{factor}")
            }
            Self::Load { factor } => write!(f, "load back to x{factor}"),
        }
    }
}

impl Action {
    /// A few words for the plot's step marker: the full sentence does not fit between two
    /// steps a few seconds apart.
    pub fn label(&self) -> String {
        match self {
            Self::Degrade { site, .. } => format!("{site} degrades"),
            Self::DropAll { site } => format!("{site} loses endpoints"),
            Self::Restore { site } => format!("{site} restored"),
            Self::Load { factor } if *factor > 1.0 => "burst".to_owned(),
            Self::Load { .. } => "load back".to_owned(),
        }
    }
}

/// One scripted step.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// When, in milliseconds since the load started.
    pub at_ms: u64,
    /// What.
    pub action: Action,
}

/// The steps of `scenario` over a run of `duration_ms`, in time order. Times are
/// fractions of the run so a shorter run keeps the same story.
pub fn steps(scenario: Scenario, duration_ms: u64) -> Vec<Step> {
    let at = |fraction: f64| (duration_ms as f64 * fraction).round() as u64;
    let degrade = [
        (
            0.13,
            Action::Degrade {
                site: "b",
                factor: DEGRADE_FACTOR,
            },
        ),
        (0.33, Action::Restore { site: "b" }),
    ];
    let outage = [
        (0.40, Action::DropAll { site: "a" }),
        (0.53, Action::Restore { site: "a" }),
    ];
    let burst = [
        (
            0.64,
            Action::Load {
                factor: BURST_FACTOR,
            },
        ),
        (0.84, Action::Load { factor: 1.0 }),
    ];
    let chosen: Vec<(f64, Action)> = match scenario {
        Scenario::Full => degrade.into_iter().chain(outage).chain(burst).collect(),
        Scenario::Steady => Vec::new(),
        Scenario::Degrade => degrade.into_iter().collect(),
        Scenario::Outage => outage.into_iter().collect(),
        Scenario::Burst => burst.into_iter().collect(),
    };
    chosen
        .into_iter()
        .map(|(fraction, action)| Step {
            at_ms: at(fraction),
            action,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_scenario_degrades_then_drops_then_bursts_in_time_order() {
        let s = steps(Scenario::Full, 90_000);
        assert_eq!(s.len(), 6);
        assert!(s.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        assert_eq!(s[2].action, Action::DropAll { site: "a" });
        assert_eq!(s[2].at_ms, 36_000);
        assert!(matches!(s[4].action, Action::Load { factor } if factor > 1.0));
        assert!(s.last().unwrap().at_ms < 90_000);
    }

    #[test]
    fn steps_scale_with_the_duration_and_steady_has_none() {
        let long = steps(Scenario::Outage, 100_000);
        let short = steps(Scenario::Outage, 10_000);
        assert_eq!(long[0].at_ms, 10 * short[0].at_ms);
        assert!(steps(Scenario::Steady, 90_000).is_empty());
    }

    #[test]
    fn every_step_names_a_site_of_the_demo() {
        for step in steps(Scenario::Full, 1_000) {
            if let Action::Degrade { site, .. }
            | Action::DropAll { site }
            | Action::Restore { site } = step.action
            {
                assert!(SITES.iter().any(|(name, _, _)| *name == site), "{site}");
            }
        }
    }

    #[test]
    fn every_step_of_the_full_scenario_has_its_own_short_label() {
        let labels: Vec<String> = steps(Scenario::Full, 90_000)
            .iter()
            .map(|s| s.action.label())
            .collect();
        assert_eq!(
            labels,
            [
                "b degrades",
                "b restored",
                "a loses endpoints",
                "a restored",
                "burst",
                "load back"
            ]
        );
    }
}
