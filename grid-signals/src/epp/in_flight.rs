//! How many requests a provider holds: the operator's `grid_provider_in_flight_requests`.
//! The gateway's own figure, from the relayed raw series, is `grid_score::from_store`'s
//! (the gateway reads every instant together there, where it runs).

use super::reading::ScrapeReading;

/// Which estimate set the operator's in-flight value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InFlightSource {
    /// The per-endpoint producer count was the larger (or the only) estimate.
    Producer,
    /// (average running + average queued) x ready endpoints was the larger (or only).
    Averages,
}

/// The operator's in-flight conclusion for one scrape, with its parts kept for tests and
/// diagnostics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InFlightEstimate {
    /// The published value: the larger estimate plus what flow control holds.
    pub value: f64,
    /// Per-endpoint `llm_d_epp_inflight_requests` summed (each endpoint at its largest
    /// producer count); `None` without the producer or when the EPP serves several pools.
    pub producer: Option<f64>,
    /// (average running + average queued) x ready endpoints; `None` when either average
    /// is missing.
    pub averages: Option<f64>,
    /// `llm_d_epp_flow_control_queue_size` for the pool (0 when absent).
    pub flow_control: f64,
    /// Which estimate won.
    pub source: InFlightSource,
}

/// The operator's in-flight value from one scrape, or `None` when it publishes nothing.
///
/// Nothing when the pool has no fresh endpoint: the EPP stops updating its averages at
/// zero ready endpoints, so they are frozen, not current. The larger of the two estimates
/// wins so that an EPP restart, which zeroes the producer's count while requests are
/// still running, does not make the site look idle. The per-endpoint count carries no
/// pool label, so with several pools on the EPP only the averages are used.
pub fn operator_in_flight(reading: &ScrapeReading) -> Option<InFlightEstimate> {
    let ready = reading.ready_endpoints.filter(|r| *r > 0.0)?;
    let averages = match (reading.average_running, reading.average_queue) {
        (Some(running), Some(queued)) => Some((running + queued) * ready),
        _ => None,
    };
    let producer = reading
        .inflight_requests
        .filter(|_| reading.pools_seen <= 1);
    let (larger, source) = match (producer, averages) {
        (Some(p), Some(a)) if p >= a => (p, InFlightSource::Producer),
        (Some(p), None) => (p, InFlightSource::Producer),
        (_, Some(a)) => (a, InFlightSource::Averages),
        (None, None) => return None,
    };
    let flow_control = reading.flow_control_queue.unwrap_or(0.0);
    Some(InFlightEstimate {
        value: larger + flow_control,
        producer,
        averages,
        flow_control,
        source,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn reading(
        pools: usize,
        ready: Option<f64>,
        running: Option<f64>,
        queue: Option<f64>,
        inflight: Option<f64>,
        flow: Option<f64>,
    ) -> ScrapeReading {
        ScrapeReading {
            pools_seen: pools,
            ready_endpoints: ready,
            average_running: running,
            average_queue: queue,
            inflight_requests: inflight,
            flow_control_queue: flow,
            ..ScrapeReading::default()
        }
    }

    #[test]
    fn operator_in_flight_rules_table() {
        // (name, reading, expected value, expected source)
        let cases = [
            (
                "the producer count wins when larger",
                reading(1, Some(2.0), Some(1.0), Some(0.5), Some(9.0), None),
                Some((9.0, InFlightSource::Producer)),
            ),
            (
                "the averages win when larger",
                reading(1, Some(4.0), Some(3.0), Some(1.0), Some(2.0), None),
                Some((16.0, InFlightSource::Averages)),
            ),
            (
                "a restart that zeroes the producer count does not look idle",
                reading(1, Some(4.0), Some(3.0), Some(1.0), Some(0.0), None),
                Some((16.0, InFlightSource::Averages)),
            ),
            (
                "flow control is added to the larger estimate",
                reading(1, Some(2.0), Some(1.0), Some(1.0), Some(1.0), Some(5.0)),
                Some((9.0, InFlightSource::Averages)),
            ),
            (
                "without the producer the averages stand alone",
                reading(1, Some(2.0), Some(1.0), Some(1.0), None, None),
                Some((4.0, InFlightSource::Averages)),
            ),
            (
                "without the averages the producer stands alone",
                reading(1, Some(2.0), None, Some(1.0), Some(3.0), None),
                Some((3.0, InFlightSource::Producer)),
            ),
            (
                "several pools fall back to the averages alone",
                reading(2, Some(2.0), Some(1.0), Some(1.0), Some(50.0), None),
                Some((4.0, InFlightSource::Averages)),
            ),
            (
                "several pools without averages publish nothing",
                reading(2, Some(2.0), None, None, Some(50.0), None),
                None,
            ),
            (
                "no fresh endpoint publishes nothing",
                reading(1, Some(0.0), Some(3.0), Some(1.0), Some(7.0), Some(2.0)),
                None,
            ),
            (
                "no ready series publishes nothing",
                reading(1, None, Some(3.0), Some(1.0), Some(7.0), None),
                None,
            ),
        ];
        for (name, r, want) in cases {
            let got = operator_in_flight(&r).map(|e| (e.value, e.source));
            assert_eq!(got, want, "{name}");
        }
    }

    proptest! {
        #[test]
        fn operator_in_flight_is_never_below_either_estimate(
            ready in 0.0f64..64.0,
            running in proptest::option::of(0.0f64..100.0),
            queue in proptest::option::of(0.0f64..100.0),
            inflight in proptest::option::of(0.0f64..10_000.0),
            flow in proptest::option::of(0.0f64..1_000.0),
            pools in 1usize..3,
        ) {
            let r = reading(pools, Some(ready), running, queue, inflight, flow);
            match operator_in_flight(&r) {
                None => prop_assert!(ready <= 0.0 || (running.is_none() || queue.is_none()) && (inflight.is_none() || pools > 1)),
                Some(e) => {
                    if let (Some(run), Some(q)) = (running, queue) {
                        prop_assert!(e.value >= (run + q) * ready);
                    }
                    if pools == 1
                        && let Some(p) = inflight {
                            prop_assert!(e.value >= p);
                        }
                    prop_assert!(e.value >= e.flow_control);
                }
            }
        }
    }
}
