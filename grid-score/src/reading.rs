//! What the caller hands in: one instant of one site/provider's load, plus the key.
//!
//! The reading is a plain struct so `grid-score` does not depend on how the store keeps
//! its windows: the daemon (or the simulator) fills it from whatever it holds. A field
//! the source did not carry is `None`, never 0 — absence means unknown, not idle.

use std::sync::Arc;

use crate::error::{Error, RejectReason};

/// One routable target: a provider serving a model at a site.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CandidateKey {
    /// The site (`grid_site`).
    pub site: Arc<str>,
    /// The provider at that site (`grid_provider`).
    pub provider: Arc<str>,
}

impl CandidateKey {
    /// A key from anything string-like.
    pub fn new(site: impl Into<Arc<str>>, provider: impl Into<Arc<str>>) -> Self {
        Self {
            site: site.into(),
            provider: provider.into(),
        }
    }
}

/// Per serving unit queue state, from `llm_d_epp_per_endpoint_queue_size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct UnitQueues {
    /// Serving units (endpoints) that reported a queue size in this reading.
    pub units: u32,
    /// Of those, how many had work waiting (queue size above zero).
    pub waiting: u32,
}

impl UnitQueues {
    /// Work waits at every serving unit: a demonstrated limit, and half of "full".
    pub const fn all_waiting(self) -> bool {
        self.units > 0 && self.waiting >= self.units
    }
}

/// The EPP pool averages the gateway concludes its own in-flight from (spec: running plus
/// waiting per endpoint times ready endpoints, plus what flow control holds, each instant
/// read together).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct EppPool {
    /// `llm_d_epp_average_running_requests`.
    pub running_avg: f64,
    /// `llm_d_epp_average_queue_size`.
    pub queued_avg: f64,
    /// `llm_d_epp_ready_endpoints`.
    pub ready_endpoints: u32,
    /// `llm_d_epp_flow_control_queue_size` (0 when absent).
    pub flow_held: f64,
}

impl EppPool {
    /// Requests on the site: everything running or waiting at endpoints, plus what flow
    /// control holds before scheduling.
    pub fn in_flight(&self) -> f64 {
        (self.running_avg + self.queued_avg) * f64::from(self.ready_endpoints) + self.flow_held
    }

    /// Requests waiting at endpoints (not counting flow control, which has its own field).
    pub fn queue_depth(&self) -> f64 {
        self.queued_avg * f64::from(self.ready_endpoints)
    }
}

/// One instant of load for one candidate, as the caller read it from the store.
///
/// Stamps are milliseconds since the Unix epoch, the observation time of the values (not
/// the time the gateway received them). A reading whose stamp is not newer than the
/// previous one is not a new sample and changes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Reading {
    /// When the values were observed, ms since the Unix epoch.
    pub stamp_ms: u64,
    /// `grid_provider_ready`: `Some(false)` excludes, unless [`Reading::verdict_unread`];
    /// `None` (unknown) never does.
    pub ready: Option<bool>,
    /// The `grid_provider_ready 0` came with a reason that says the operator could not
    /// read the EPP (`grid_provider_ready_reason`, `ReadyReasonLabel::is_unread`): no
    /// signal, not a site known to be down. It neither excludes nor clears, and the
    /// candidate turns unmeasured as its last load ages out.
    pub verdict_unread: bool,
    /// `llm_d_epp_ready_endpoints`: `Some(0)` excludes.
    pub ready_endpoints: Option<u32>,
    /// Requests on the site as the gateway concludes them (see [`EppPool::in_flight`]).
    pub in_flight: Option<f64>,
    /// Requests waiting at the endpoints (see [`EppPool::queue_depth`]).
    pub queue_depth: Option<f64>,
    /// Per-unit queues; `None` when the per-endpoint series are absent. Series that stop
    /// while the ready-endpoint count keeps stamping exclude the candidate.
    pub units: Option<UnitQueues>,
    /// `llm_d_epp_average_kv_cache_utilization`, a fraction.
    pub kv_mean: Option<f64>,
    /// `llm_d_epp_std_dev_kv_cache_utilization`, a fraction.
    pub kv_spread: Option<f64>,
    /// `llm_d_epp_flow_control_queue_size`: work held before scheduling.
    pub flow_held: Option<f64>,
    /// Whether the provider's revision metadata is present and fresh. When false the
    /// learner keeps its bounds as they are but still reads pressure from this reading.
    pub learning_allowed: bool,
}

impl Reading {
    /// An empty reading at `stamp_ms` that allows learning; fill the fields you hold.
    pub fn new(stamp_ms: u64) -> Self {
        Self {
            stamp_ms,
            learning_allowed: true,
            ..Self::default()
        }
    }

    /// Fills in-flight, queue depth, ready endpoints and flow-control hold from one
    /// instant of EPP pool averages.
    #[must_use]
    pub fn with_pool(mut self, pool: EppPool) -> Self {
        self.in_flight = Some(pool.in_flight());
        self.queue_depth = Some(pool.queue_depth());
        self.ready_endpoints = Some(pool.ready_endpoints);
        self.flow_held = Some(pool.flow_held);
        self
    }

    /// Work is waiting somewhere: at an endpoint or in flow control.
    pub(crate) fn something_queued(&self) -> bool {
        self.queue_depth.is_some_and(|q| q > 0.0)
            || self.flow_held.is_some_and(|h| h > 0.0)
            || self.units.is_some_and(|u| u.waiting > 0)
    }

    /// KV-cache pressure: mean plus spread, when the mean is known.
    pub(crate) fn kv_pressure(&self) -> Option<f64> {
        self.kv_mean.map(|m| m + self.kv_spread.unwrap_or(0.0))
    }

    /// Work waiting everywhere it can wait: every serving unit, or flow control holding.
    pub(crate) fn work_waiting(&self) -> bool {
        self.units.is_some_and(UnitQueues::all_waiting) || self.flow_held.is_some_and(|h| h > 0.0)
    }

    /// Of `in_flight`, the requests in service: what is not waiting in endpoint queues or
    /// held by flow control. At a demonstrated limit this is what the site's slots hold,
    /// the hard bound (counting the queue too read every site above its slots by its
    /// queue, and small sites, whose queues are long against their slots, most).
    pub(crate) fn in_service(&self, in_flight: f64) -> f64 {
        (in_flight - self.queue_depth.unwrap_or(0.0) - self.flow_held.unwrap_or(0.0)).max(0.0)
    }

    /// A demonstrated limit: work waiting at every unit, flow control holding, or the
    /// pool's KV cache full on average. Not the mean plus spread: one endpoint full beside
    /// an idle one reads full by it while the site has room (in the routing simulator a
    /// 16-slot site whose endpoints held 8 and 1 was learned as 9 and kept there for
    /// minutes).
    pub(crate) fn at_limit(&self) -> bool {
        self.work_waiting() || self.kv_mean.is_some_and(|kv| kv >= 1.0)
    }

    /// Refuses a reading that would poison arithmetic; the key only names the error.
    pub fn validate(&self, key: &CandidateKey) -> Result<(), Error> {
        let refuse = |field, reason| Error::Reading {
            site: key.site.clone(),
            provider: key.provider.clone(),
            field,
            reason,
        };
        let fields = [
            ("in_flight", self.in_flight),
            ("queue_depth", self.queue_depth),
            ("kv_mean", self.kv_mean),
            ("kv_spread", self.kv_spread),
            ("flow_held", self.flow_held),
        ];
        for (field, value) in fields {
            if let Some(v) = value {
                if !v.is_finite() {
                    return Err(refuse(field, RejectReason::NonFinite));
                }
                if v < 0.0 {
                    return Err(refuse(field, RejectReason::Negative));
                }
            }
        }
        if let Some(u) = self.units
            && u.waiting > u.units
        {
            return Err(refuse("units", RejectReason::WaitingExceedsUnits));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> CandidateKey {
        CandidateKey::new("a", "p")
    }

    #[test]
    fn pool_in_flight_counts_running_waiting_and_held_work() {
        let pool = EppPool {
            running_avg: 3.0,
            queued_avg: 1.0,
            ready_endpoints: 4,
            flow_held: 2.0,
        };
        assert!((pool.in_flight() - 18.0).abs() < 1e-12);
        assert!((pool.queue_depth() - 4.0).abs() < 1e-12);
        let r = Reading::new(5).with_pool(pool);
        assert_eq!(r.ready_endpoints, Some(4));
        assert!(r.something_queued() && r.work_waiting());
    }

    #[test]
    fn nan_in_flight_is_refused_with_its_field() {
        let r = Reading {
            in_flight: Some(f64::NAN),
            ..Reading::new(1)
        };
        let e = r.validate(&key()).unwrap_err();
        assert!(matches!(
            e,
            Error::Reading {
                field: "in_flight",
                reason: RejectReason::NonFinite,
                ..
            }
        ));
    }

    #[test]
    fn negative_spread_is_refused() {
        let r = Reading {
            kv_spread: Some(-0.1),
            ..Reading::new(1)
        };
        assert_eq!(
            r.validate(&key()).unwrap_err().reason().unwrap(),
            RejectReason::Negative
        );
    }

    #[test]
    fn waiting_units_exactly_at_unit_count_pass_and_one_more_is_refused() {
        let at = Reading {
            units: Some(UnitQueues {
                units: 3,
                waiting: 3,
            }),
            ..Reading::new(1)
        };
        assert!(at.validate(&key()).is_ok());
        assert!(at.work_waiting());
        let past = Reading {
            units: Some(UnitQueues {
                units: 3,
                waiting: 4,
            }),
            ..Reading::new(1)
        };
        assert_eq!(
            past.validate(&key()).unwrap_err().reason().unwrap(),
            RejectReason::WaitingExceedsUnits
        );
    }

    #[test]
    fn a_full_kv_cache_on_average_is_a_limit_and_just_below_is_not() {
        let at = Reading {
            kv_mean: Some(1.0),
            ..Reading::new(1)
        };
        assert!(at.at_limit());
        let below = Reading {
            kv_mean: Some(0.999),
            ..Reading::new(1)
        };
        assert!(!below.at_limit());
    }

    #[test]
    fn one_full_endpoint_beside_an_idle_one_is_not_a_limit() {
        // Endpoints at 8/8 and 1/8: mean 0.5625, spread 0.4375, mean plus spread 1.
        let uneven = Reading {
            kv_mean: Some(0.5625),
            kv_spread: Some(0.4375),
            ..Reading::new(1)
        };
        assert!(!uneven.at_limit());
        assert_eq!(
            uneven.kv_pressure(),
            Some(1.0),
            "rho still reads it as full"
        );
    }

    #[test]
    fn zero_units_never_count_as_all_waiting() {
        assert!(
            !UnitQueues {
                units: 0,
                waiting: 0
            }
            .all_waiting()
        );
    }
}
