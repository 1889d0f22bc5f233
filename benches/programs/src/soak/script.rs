//! The soak's traffic script: one cycle, repeated for the whole run. Each cycle is the
//! demo's full scenario (a site degrades, the gateway's own site loses every endpoint and
//! recovers, a burst the grid sheds) scaled to the cycle, with the fault suite's faults
//! on the last remote site between its steps: its EPP answering garbage, an oversize
//! body or slowly, its request link resetting every connection, and both its links
//! black-holed (a partition). Every fault ends within the cycle it starts in, so each
//! cycle starts from a healthy grid.

use std::fmt;

use crate::demo::scenario::{self, Action, Scenario};

/// The site every link and EPP fault is injected on: the last remote site.
pub const FAULTED: &str = scenario::SITES[scenario::SITES.len() - 1].0;

/// A fault of the fault suite's, injected on [`FAULTED`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Its EPP answers bytes that are no exposition.
    EppGarbage,
    /// Its request link resets every connection.
    ResettingUpstream,
    /// Both its links drop every byte and answer nothing.
    Partition,
    /// Its EPP answers just over the 1 MiB cap.
    EppOversize,
    /// Its EPP answers after the operator's scrape timeout.
    EppSlow,
}

impl Fault {
    /// As the fault suite names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EppGarbage => "epp-garbage",
            Self::ResettingUpstream => "resetting-upstream",
            Self::Partition => "partition",
            Self::EppOversize => "epp-oversize",
            Self::EppSlow => "epp-slow",
        }
    }
}

/// What a step does.
#[derive(Clone, Debug, PartialEq)]
pub enum Move {
    /// One of the demo's steps.
    Demo(Action),
    /// A fault starts (`true`) or heals (`false`).
    Fault(Fault, bool),
}

impl fmt::Display for Move {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Demo(action) => write!(f, "{}", action.label()),
            Self::Fault(fault, true) => write!(f, "{FAULTED}: {}", fault.as_str()),
            Self::Fault(fault, false) => write!(f, "{FAULTED}: {} healed", fault.as_str()),
        }
    }
}

/// One step of a cycle.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// When, in milliseconds since its cycle started.
    pub at_ms: u64,
    /// What.
    pub what: Move,
}

/// Each fault's start and end, as fractions of the cycle: between the demo's steps
/// (b degraded 0.13 to 0.33, a without endpoints 0.40 to 0.53, the burst 0.64 to 0.84),
/// never two of them on the faulted site at once.
pub const FAULT_SPANS: [(Fault, f64, f64); 5] = [
    (Fault::EppGarbage, 0.04, 0.10),
    (Fault::ResettingUpstream, 0.18, 0.24),
    (Fault::Partition, 0.56, 0.62),
    (Fault::EppOversize, 0.70, 0.76),
    (Fault::EppSlow, 0.88, 0.94),
];

/// The steps of one cycle of `cycle_ms`, in time order.
pub fn cycle(cycle_ms: u64) -> Vec<Step> {
    let at = |fraction: f64| (cycle_ms as f64 * fraction).round() as u64;
    let mut steps: Vec<Step> = scenario::steps(Scenario::Full, cycle_ms)
        .into_iter()
        .map(|s| Step {
            at_ms: s.at_ms,
            what: Move::Demo(s.action),
        })
        .collect();
    for (fault, from, to) in FAULT_SPANS {
        steps.push(Step {
            at_ms: at(from),
            what: Move::Fault(fault, true),
        });
        steps.push(Step {
            at_ms: at(to),
            what: Move::Fault(fault, false),
        });
    }
    steps.sort_by_key(|s| s.at_ms);
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cycle_holds_the_demo_steps_and_every_fault_started_and_healed_in_order() {
        let steps = cycle(30_000);
        assert_eq!(steps.len(), 6 + 2 * FAULT_SPANS.len());
        assert!(steps.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        assert!(steps.iter().all(|s| s.at_ms < 30_000));
        for (fault, _, _) in FAULT_SPANS {
            let on = steps
                .iter()
                .position(|s| s.what == Move::Fault(fault, true));
            let off = steps
                .iter()
                .position(|s| s.what == Move::Fault(fault, false));
            assert!(on.unwrap() < off.unwrap(), "{fault:?}");
        }
    }

    #[test]
    fn the_faults_fall_on_the_last_remote_site_and_never_overlap() {
        assert_eq!(FAULTED, "c");
        for w in FAULT_SPANS.windows(2) {
            assert!(w[0].1 < w[0].2 && w[0].2 < w[1].1, "{w:?}");
        }
    }
}
