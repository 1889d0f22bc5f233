//! The gateway's exclusion rule, as a function of what its store holds for one site and
//! provider.
//!
//! The gateway does not read `grid_provider_ready`; it reads the relayed
//! `llm_d_epp_ready_endpoints` and the per-unit `llm_d_epp_per_endpoint_queue_size`. A
//! site leaves selection when its newest ready-endpoint count is zero, or when its
//! per-unit series stopped while that count kept stamping (the EPP lost its endpoints'
//! metrics but still reports a frozen count). Because this is a pure function of the
//! store, a site rejoins as soon as a newer reading says otherwise: no state to clear.

use super::in_flight::Stamped;

/// Whether the rule excludes a site, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exclusion {
    /// Selectable (as far as this rule goes).
    Included,
    /// The newest ready-endpoint count is zero.
    ZeroReadyEndpoints,
    /// The per-unit series' newest reading is older than the newest ready-endpoint count.
    PerUnitStopped,
    /// The store holds no ready-endpoint reading: this rule cannot judge the site (it is
    /// scored as maximally loaded elsewhere, not excluded here).
    NoReading,
}

impl Exclusion {
    /// Whether the site must leave selection.
    pub fn excludes(self) -> bool {
        matches!(self, Self::ZeroReadyEndpoints | Self::PerUnitStopped)
    }

    /// A metric label for the reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Included => "included",
            Self::ZeroReadyEndpoints => "zero_ready_endpoints",
            Self::PerUnitStopped => "per_unit_stopped",
            Self::NoReading => "no_reading",
        }
    }
}

/// Applies the rule.
///
/// `ready_endpoints` is every `llm_d_epp_ready_endpoints` reading held for the site (any
/// order); `per_unit_newest_ms` is the newest stamp over all of its per-unit series, or
/// `None` when the store holds none (a site whose EPP never exposed them is not "stopped").
pub fn exclusion(ready_endpoints: &[Stamped], per_unit_newest_ms: Option<u64>) -> Exclusion {
    let Some(newest) = ready_endpoints.iter().max_by_key(|r| r.stamp_ms) else {
        return Exclusion::NoReading;
    };
    if newest.value <= 0.0 {
        return Exclusion::ZeroReadyEndpoints;
    }
    match per_unit_newest_ms {
        Some(per_unit) if per_unit < newest.stamp_ms => Exclusion::PerUnitStopped,
        _ => Exclusion::Included,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(stamp_ms: u64, value: f64) -> Stamped {
        Stamped { stamp_ms, value }
    }

    #[test]
    fn exclusion_rules_table() {
        let cases: &[(&str, &[Stamped], Option<u64>, Exclusion)] = &[
            (
                "a positive count with fresh per-unit series is included",
                &[s(10, 2.0)],
                Some(10),
                Exclusion::Included,
            ),
            (
                "a newest count of zero excludes",
                &[s(10, 2.0), s(20, 0.0)],
                Some(20),
                Exclusion::ZeroReadyEndpoints,
            ),
            (
                "an older zero does not exclude",
                &[s(20, 3.0), s(10, 0.0)],
                Some(20),
                Exclusion::Included,
            ),
            (
                "a newer positive count rejoins",
                &[s(10, 0.0), s(20, 0.0), s(30, 1.0)],
                Some(30),
                Exclusion::Included,
            ),
            (
                "per-unit series that stopped while the count stamps exclude",
                &[s(10, 2.0), s(20, 2.0)],
                Some(10),
                Exclusion::PerUnitStopped,
            ),
            (
                "per-unit series back at the newest stamp rejoin",
                &[s(10, 2.0), s(20, 2.0), s(30, 2.0)],
                Some(30),
                Exclusion::Included,
            ),
            (
                "no per-unit series ever is not a stop",
                &[s(10, 2.0)],
                None,
                Exclusion::Included,
            ),
            (
                "no ready reading cannot judge",
                &[],
                Some(10),
                Exclusion::NoReading,
            ),
        ];
        for (name, ready, per_unit, want) in cases {
            assert_eq!(exclusion(ready, *per_unit), *want, "{name}");
        }
    }

    #[test]
    fn only_the_two_causes_exclude() {
        for e in [
            Exclusion::Included,
            Exclusion::ZeroReadyEndpoints,
            Exclusion::PerUnitStopped,
            Exclusion::NoReading,
        ] {
            assert_eq!(
                e.excludes(),
                matches!(e, Exclusion::ZeroReadyEndpoints | Exclusion::PerUnitStopped),
                "{}",
                e.as_str()
            );
        }
    }
}
