//! From what the store holds to what the scorer learns from: one [`Reading`] per
//! (site, provider), read off the request path at each refresh.
//!
//! The gateway concludes a site's load from the raw EPP series its operator relays, not
//! from the operator's own conclusions: in-flight is running plus waiting per endpoint
//! times ready endpoints, plus what flow control holds, each read from the same batch.
//! A series the store does not hold stays `None` (unknown), never 0.

use grid_score::{EppPool, Reading, UnitQueues};
use grid_signals::store::{Entry, Learning};

/// `grid_provider_ready`: the operator's verdict, 1 or 0.
pub const READY: &str = "grid_provider_ready";
/// `llm_d_epp_ready_endpoints`.
pub const READY_ENDPOINTS: &str = "llm_d_epp_ready_endpoints";
/// `llm_d_epp_average_running_requests`.
pub const RUNNING_AVG: &str = "llm_d_epp_average_running_requests";
/// `llm_d_epp_average_queue_size`.
pub const QUEUE_AVG: &str = "llm_d_epp_average_queue_size";
/// `llm_d_epp_average_kv_cache_utilization`.
pub const KV_MEAN: &str = "llm_d_epp_average_kv_cache_utilization";
/// `llm_d_epp_std_dev_kv_cache_utilization`.
pub const KV_SPREAD: &str = "llm_d_epp_std_dev_kv_cache_utilization";
/// `llm_d_epp_per_endpoint_queue_size{model_server_endpoint}`.
pub const PER_ENDPOINT_QUEUE: &str = "llm_d_epp_per_endpoint_queue_size";
/// `llm_d_epp_flow_control_queue_size`.
pub const FLOW_CONTROL_QUEUE: &str = "llm_d_epp_flow_control_queue_size";

/// The newest instant of load the store holds for one provider, or `None` when it holds
/// nothing at all (the candidate then stays unmeasured).
pub fn reading_of(entry: &Entry, now_ms: u64) -> Option<Reading> {
    let stamp_ms = entry.newest_at()?;
    let latest = |metric: &str| entry.latest(metric, &[]);
    let mut r = Reading::new(stamp_ms);
    r.learning_allowed = matches!(entry.learning(now_ms), Learning::Allowed { .. });
    r.ready = latest(READY).map(|v| v.value != 0.0);
    let ready_endpoints = latest(READY_ENDPOINTS);
    r.ready_endpoints = ready_endpoints.map(|v| count(v.value));
    if let (Some(running), Some(queued), Some(ready)) =
        (latest(RUNNING_AVG), latest(QUEUE_AVG), ready_endpoints)
    {
        r = r.with_pool(EppPool {
            running_avg: running.value,
            queued_avg: queued.value,
            ready_endpoints: count(ready.value),
            flow_held: latest(FLOW_CONTROL_QUEUE).map_or(0.0, |v| v.value),
        });
    } else {
        r.flow_held = latest(FLOW_CONTROL_QUEUE).map(|v| v.value);
    }
    r.kv_mean = latest(KV_MEAN).map(|v| v.value);
    r.kv_spread = latest(KV_SPREAD).map(|v| v.value);
    r.units = units(entry, ready_endpoints.map(|v| v.stamp_ms));
    Some(r)
}

/// Per-endpoint queues of the current instant: series stamped at or after the ready-
/// endpoint count (or, without one, the newest of them). Series of endpoints that went
/// away keep their old stamps and are left out; when every series stopped while the count
/// kept stamping the result is `None`, which the scorer reads as "unit series stopped".
fn units(entry: &Entry, ready_stamp: Option<u64>) -> Option<UnitQueues> {
    let since = ready_stamp.or_else(|| entry.metric_newest_at(PER_ENDPOINT_QUEUE))?;
    let mut q = UnitQueues::default();
    for s in entry.series(PER_ENDPOINT_QUEUE) {
        if let Some(v) = s.latest().filter(|v| v.stamp_ms >= since) {
            q.units += 1;
            if v.value > 0.0 {
                q.waiting += 1;
            }
        }
    }
    (q.units > 0).then_some(q)
}

/// A non-negative count from a gauge value (NaN and negatives read as 0).
fn count(v: f64) -> u32 {
    if v.is_finite() && v > 0.0 {
        v.round().min(f64::from(u32::MAX)) as u32
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use grid_signals::store::{Sender, Store, StoreConfig};
    use std::fmt::Write as _;

    const NOW: u64 = 1_700_000_000_000;

    /// One relayed batch for site b / provider p with `rows` (name, labels, value).
    fn body(seq: u64, rows: &[(&str, &str, f64)]) -> String {
        let mut t = format!(
            "grid_provider_config_generation{{grid_site=\"b\",grid_provider=\"p\",provider_uid=\"u\",publisher_epoch=\"{}\",batch_sequence=\"{seq}\",batch_samples=\"{}\"}} 1 {NOW}\n",
            NOW - 60_000,
            rows.len()
        );
        for (name, extra, v) in rows {
            let sep = if extra.is_empty() { "" } else { "," };
            let _ = writeln!(
                t,
                "{name}{{grid_site=\"b\",grid_provider=\"p\"{sep}{extra}}} {v} {NOW}"
            );
        }
        t
    }

    fn store_with(rows: &[(&str, &str, f64)]) -> Store {
        let mut s = Store::new(StoreConfig::default());
        let report = s.ingest(body(1, rows).as_bytes(), Sender::Local, NOW, NOW);
        assert_eq!(report.dropped.total(), 0, "{report:?}");
        s
    }

    #[test]
    fn in_flight_is_running_plus_waiting_times_endpoints_plus_flow_control() {
        let s = store_with(&[
            (READY, "", 1.0),
            (READY_ENDPOINTS, "", 2.0),
            (RUNNING_AVG, "", 3.0),
            (QUEUE_AVG, "", 0.5),
            (FLOW_CONTROL_QUEUE, "", 4.0),
            (KV_MEAN, "", 0.4),
            (KV_SPREAD, "", 0.1),
            (PER_ENDPOINT_QUEUE, "model_server_endpoint=\"e1\"", 1.0),
            (PER_ENDPOINT_QUEUE, "model_server_endpoint=\"e2\"", 0.0),
        ]);
        let r = reading_of(s.entry("b", "p").unwrap(), NOW).unwrap();
        assert_eq!(r.in_flight, Some((3.0 + 0.5) * 2.0 + 4.0));
        assert_eq!(r.queue_depth, Some(1.0));
        assert_eq!(r.ready, Some(true));
        assert_eq!(r.ready_endpoints, Some(2));
        assert_eq!(r.kv_mean, Some(0.4));
        assert_eq!(r.kv_spread, Some(0.1));
        assert_eq!(
            r.units,
            Some(UnitQueues {
                units: 2,
                waiting: 1
            })
        );
        assert!(r.learning_allowed);
        assert_eq!(r.stamp_ms, NOW);
    }

    #[test]
    fn absent_series_stay_unknown_not_zero() {
        let s = store_with(&[(KV_MEAN, "", 0.2)]);
        let r = reading_of(s.entry("b", "p").unwrap(), NOW).unwrap();
        assert_eq!(r.in_flight, None);
        assert_eq!(r.ready, None);
        assert_eq!(r.ready_endpoints, None);
        assert_eq!(r.units, None);
        assert_eq!(r.flow_held, None);
    }

    #[test]
    fn zero_ready_endpoints_and_not_ready_are_read_as_such() {
        let s = store_with(&[(READY, "", 0.0), (READY_ENDPOINTS, "", 0.0)]);
        let r = reading_of(s.entry("b", "p").unwrap(), NOW).unwrap();
        assert_eq!(r.ready, Some(false));
        assert_eq!(r.ready_endpoints, Some(0));
    }

    #[test]
    fn counts_are_clamped_to_non_negative_integers() {
        assert_eq!(count(-1.0), 0);
        assert_eq!(count(f64::NAN), 0);
        assert_eq!(count(2.6), 3);
        assert_eq!(count(1e20), u32::MAX);
    }
}
