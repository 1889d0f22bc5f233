//! How many requests a provider holds: the operator's `grid_provider_in_flight_requests`
//! and the gateway's own figure from the relayed raw series.

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

/// One stamped value of a relayed series, as a gateway's store holds it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stamped {
    /// When the value was observed (ms since the Unix epoch).
    pub stamp_ms: u64,
    /// The value.
    pub value: f64,
}

/// The relayed raw series a gateway computes its own in-flight from, for one site and
/// provider: whatever readings its store holds, in any order.
#[derive(Clone, Copy, Debug, Default)]
pub struct RelayedLoad<'a> {
    /// `llm_d_epp_ready_endpoints`.
    pub ready_endpoints: &'a [Stamped],
    /// `llm_d_epp_average_running_requests`.
    pub average_running: &'a [Stamped],
    /// `llm_d_epp_average_queue_size`.
    pub average_queue: &'a [Stamped],
    /// `llm_d_epp_flow_control_queue_size`.
    pub flow_control_queue: &'a [Stamped],
}

fn at(series: &[Stamped], stamp_ms: u64) -> Option<f64> {
    series
        .iter()
        .find(|s| s.stamp_ms == stamp_ms)
        .map(|s| s.value)
}

fn newest(series: &[Stamped]) -> Option<Stamped> {
    series.iter().copied().max_by_key(|s| s.stamp_ms)
}

/// The gateway's in-flight for a site: (running + waiting per endpoint) x ready
/// endpoints + flow-control hold, all read at one instant.
///
/// Values are combined only when they share one stamp, the newest instant at which ready
/// endpoints, running and waiting were all observed; flow control from that same instant
/// (0 when that scrape had none). Mixing instants would pair one scrape's averages with
/// another's endpoint count. `None` when the newest ready-endpoint reading is zero (the
/// averages are frozen then and the site is excluded anyway) or no instant has all three.
pub fn gateway_in_flight(load: &RelayedLoad<'_>) -> Option<Stamped> {
    if newest(load.ready_endpoints)?.value <= 0.0 {
        return None;
    }
    let instant = load
        .ready_endpoints
        .iter()
        .filter(|r| r.value > 0.0)
        .filter_map(|r| {
            let running = at(load.average_running, r.stamp_ms)?;
            let waiting = at(load.average_queue, r.stamp_ms)?;
            Some((r.stamp_ms, (running + waiting) * r.value))
        })
        .max_by_key(|(stamp, _)| *stamp)?;
    let flow_control = at(load.flow_control_queue, instant.0).unwrap_or(0.0);
    Some(Stamped {
        stamp_ms: instant.0,
        value: instant.1 + flow_control,
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

    fn s(stamp_ms: u64, value: f64) -> Stamped {
        Stamped { stamp_ms, value }
    }

    #[test]
    fn gateway_in_flight_rules_table() {
        let cases: &[(&str, RelayedLoad<'_>, Option<Stamped>)] = &[
            (
                "one instant with flow control",
                RelayedLoad {
                    ready_endpoints: &[s(10, 2.0)],
                    average_running: &[s(10, 3.0)],
                    average_queue: &[s(10, 1.0)],
                    flow_control_queue: &[s(10, 4.0)],
                },
                Some(s(10, 12.0)),
            ),
            (
                "the newest complete instant is used",
                RelayedLoad {
                    ready_endpoints: &[s(10, 2.0), s(20, 4.0)],
                    average_running: &[s(10, 3.0), s(20, 1.0)],
                    average_queue: &[s(20, 1.0), s(10, 1.0)],
                    flow_control_queue: &[],
                },
                Some(s(20, 8.0)),
            ),
            (
                "values from different instants are never combined",
                RelayedLoad {
                    ready_endpoints: &[s(10, 2.0), s(20, 4.0)],
                    average_running: &[s(10, 3.0), s(20, 1.0)],
                    average_queue: &[s(10, 1.0)],
                    flow_control_queue: &[s(20, 100.0)],
                },
                Some(s(10, 8.0)),
            ),
            (
                "a zero newest ready count gives nothing",
                RelayedLoad {
                    ready_endpoints: &[s(10, 2.0), s(20, 0.0)],
                    average_running: &[s(10, 3.0), s(20, 3.0)],
                    average_queue: &[s(10, 1.0), s(20, 1.0)],
                    flow_control_queue: &[],
                },
                None,
            ),
            (
                "no ready readings give nothing",
                RelayedLoad {
                    ready_endpoints: &[],
                    average_running: &[s(1, 1.0)],
                    average_queue: &[s(1, 1.0)],
                    flow_control_queue: &[],
                },
                None,
            ),
        ];
        for (name, load, want) in cases {
            assert_eq!(gateway_in_flight(load), *want, "{name}");
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
                    if pools == 1 {
                        if let Some(p) = inflight {
                            prop_assert!(e.value >= p);
                        }
                    }
                    prop_assert!(e.value >= e.flow_control);
                }
            }
        }

        #[test]
        fn gateway_in_flight_only_uses_one_instant(
            stamps in proptest::collection::btree_set(0u64..50, 1..8),
            values in proptest::collection::vec((1.0f64..8.0, 0.0f64..10.0, 0.0f64..10.0, 0.0f64..10.0), 8),
            drop_queue in proptest::collection::vec(any::<bool>(), 8),
        ) {
            let stamps: Vec<u64> = stamps.into_iter().collect();
            let ready: Vec<Stamped> = stamps.iter().zip(&values).map(|(&t, v)| s(t, v.0)).collect();
            let running: Vec<Stamped> = stamps.iter().zip(&values).map(|(&t, v)| s(t, v.1)).collect();
            let queue: Vec<Stamped> = stamps.iter().zip(&values).zip(&drop_queue).filter(|(_, d)| !**d).map(|((&t, v), _)| s(t, v.2)).collect();
            let flow: Vec<Stamped> = stamps.iter().zip(&values).map(|(&t, v)| s(t, v.3)).collect();
            let load = RelayedLoad { ready_endpoints: &ready, average_running: &running, average_queue: &queue, flow_control_queue: &flow };
            if let Some(got) = gateway_in_flight(&load) {
                let i = stamps.iter().position(|&t| t == got.stamp_ms).unwrap();
                let v = values[i];
                prop_assert!(!drop_queue[i]);
                prop_assert!((got.value - ((v.1 + v.2) * v.0 + v.3)).abs() < 1e-9);
                prop_assert!(queue.iter().all(|q| q.stamp_ms <= got.stamp_ms));
            } else {
                prop_assert!(queue.is_empty());
            }
        }
    }
}
