//! The EPP's `/metrics` as a site model's state would make it read, under the current
//! `llm_d_epp_*` names and the labels `grid_signals::epp` reads (`docs/metrics.md`).
//!
//! Written with grid's own exposition writer, so the text is what the parser expects of a
//! Go client: `# TYPE` lines, labels sorted, `+Inf` bounds.
//!
//! Like the EPP, the pool gauges are averages over ready endpoints, and at zero ready
//! endpoints the averages are frozen at their last value (the EPP's pool collector returns
//! early with no pods). The error counter is exposed only once it has counted something,
//! as a Go counter vector with no children is.

use grid_signals::exposition::{MetricType, write_help, write_sample, write_type};

use crate::site_model::{EndpointView, Histogram, SiteModel};

/// The in-flight producer's name on `llm_d_epp_inflight_requests`.
pub const PRODUCER_NAME: &str = "inflight-load-producer";

/// Who the fake EPP says it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EppIdentity {
    /// The pool (`name` / `inference_pool` label).
    pub pool: String,
    /// The pods' namespace (`namespace` on the in-flight gauge).
    pub namespace: String,
    /// The model served (`model_name`, `target_model_name`).
    pub model: String,
}

impl EppIdentity {
    /// An identity for `pool` in namespace `default`, serving `model`.
    pub fn new(pool: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            pool: pool.into(),
            namespace: "default".into(),
            model: model.into(),
        }
    }
}

/// The pool averages the EPP last computed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct PoolAverages {
    running: f64,
    running_std_dev: f64,
    queue: f64,
    queue_std_dev: f64,
    kv_cache: f64,
    kv_cache_std_dev: f64,
}

/// Renders one site's EPP exposition; keeps the frozen averages between renders.
#[derive(Clone, Debug)]
pub struct FakeEpp {
    identity: EppIdentity,
    last: PoolAverages,
}

fn mean_and_std_dev(values: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let n = values.clone().count() as f64;
    let mean = values.clone().sum::<f64>() / n;
    let var = values.map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

impl FakeEpp {
    /// A fake EPP that has computed no averages yet (they read 0).
    pub fn new(identity: EppIdentity) -> Self {
        Self {
            identity,
            last: PoolAverages::default(),
        }
    }

    /// Who it says it is.
    pub fn identity(&self) -> &EppIdentity {
        &self.identity
    }

    /// The exposition for the model's current state.
    pub fn render(&mut self, model: &SiteModel) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 * 1024);
        self.render_into(model, &mut out);
        out
    }

    /// Appends the exposition for the model's current state to `out`.
    pub fn render_into(&mut self, model: &SiteModel, out: &mut Vec<u8>) {
        let ready: Vec<EndpointView<'_>> = model.endpoints().filter(|e| e.up).collect();
        self.write_pool_gauges(&ready, out);
        self.write_endpoints(&ready, out);
        self.write_model_series(model, out);
    }

    /// The pool gauges: ready endpoints and the averages (frozen at zero ready).
    fn write_pool_gauges(&mut self, ready: &[EndpointView<'_>], out: &mut Vec<u8>) {
        let pool = [("name", self.identity.pool.as_str())];
        if !ready.is_empty() {
            let running = ready.iter().map(|e| e.running as f64);
            let queue = ready.iter().map(|e| e.queued as f64);
            let kv = ready.iter().map(EndpointView::kv_cache_utilization);
            let (running, running_std_dev) = mean_and_std_dev(running);
            let (queue, queue_std_dev) = mean_and_std_dev(queue);
            let (kv_cache, kv_cache_std_dev) = mean_and_std_dev(kv);
            self.last = PoolAverages {
                running,
                running_std_dev,
                queue,
                queue_std_dev,
                kv_cache,
                kv_cache_std_dev,
            };
        }
        let last = self.last;
        let gauges: [(&str, &str, f64); 7] = [
            (
                "llm_d_epp_ready_endpoints",
                "The number of ready endpoints in the pool.",
                ready.len() as f64,
            ),
            (
                "llm_d_epp_average_running_requests",
                "The average number of running requests across model servers in the pool.",
                last.running,
            ),
            (
                "llm_d_epp_std_dev_running_requests",
                "The standard deviation number of running requests across model servers in the pool.",
                last.running_std_dev,
            ),
            (
                "llm_d_epp_average_queue_size",
                "The average number of requests pending in the model server queue.",
                last.queue,
            ),
            (
                "llm_d_epp_std_dev_queue_size",
                "The standard deviation number of requests pending in the model server queue.",
                last.queue_std_dev,
            ),
            (
                "llm_d_epp_average_kv_cache_utilization",
                "The average kv cache utilization for an inference server pool.",
                last.kv_cache,
            ),
            (
                "llm_d_epp_std_dev_kv_cache_utilization",
                "The standard deviation kv cache utilization for an inference server pool.",
                last.kv_cache_std_dev,
            ),
        ];
        for (name, help, value) in gauges {
            write_help(out, name, help);
            write_type(out, name, MetricType::Gauge);
            write_sample(out, name, &pool, value, None);
        }
    }

    /// The per-endpoint series: queue size and in-flight.
    fn write_endpoints(&self, ready: &[EndpointView<'_>], out: &mut Vec<u8>) {
        let id = &self.identity;
        let per_endpoint = "llm_d_epp_per_endpoint_queue_size";
        write_help(
            out,
            per_endpoint,
            "The number of requests pending in each model server's queue.",
        );
        write_type(out, per_endpoint, MetricType::Gauge);
        for e in ready {
            let labels = [
                ("name", id.pool.as_str()),
                ("model_server_endpoint", e.name),
            ];
            write_sample(out, per_endpoint, &labels, e.queued as f64, None);
        }

        let inflight = "llm_d_epp_inflight_requests";
        write_help(
            out,
            inflight,
            "The number of requests dispatched to each endpoint and not yet completed.",
        );
        write_type(out, inflight, MetricType::Gauge);
        for e in ready {
            let labels = [
                ("endpoint_name", e.name),
                ("namespace", id.namespace.as_str()),
                ("producer_name", PRODUCER_NAME),
            ];
            write_sample(out, inflight, &labels, (e.running + e.queued) as f64, None);
        }
    }

    /// The per-model series: flow control, request and error totals, TTFT and TPOT.
    fn write_model_series(&self, model: &SiteModel, out: &mut Vec<u8>) {
        let id = &self.identity;
        let model_labels = [
            ("fairness_id", "default"),
            ("model_name", id.model.as_str()),
            ("priority", "0"),
            ("target_model_name", id.model.as_str()),
        ];
        if model.config().queue_per_endpoint.is_some() {
            let flow = "llm_d_epp_flow_control_queue_size";
            write_help(
                out,
                flow,
                "The number of requests held by flow control before scheduling.",
            );
            write_type(out, flow, MetricType::Gauge);
            // One child per provisioned band, as the EPP labels its queues by priority;
            // a reader summing the children gets everything held.
            for (priority, band) in model.band_snapshots() {
                let priority = priority.to_string();
                let labels = [
                    ("fairness_id", "default"),
                    ("inference_pool", id.pool.as_str()),
                    ("model_name", id.model.as_str()),
                    ("priority", priority.as_str()),
                    ("target_model_name", id.model.as_str()),
                ];
                write_sample(out, flow, &labels, band.len as f64, None);
            }
        }

        let counters = model.counters();
        let total = "llm_d_epp_request_total";
        write_help(
            out,
            total,
            "Counter of requests for each model and target model.",
        );
        write_type(out, total, MetricType::Counter);
        write_sample(out, total, &model_labels, counters.requests as f64, None);
        if counters.errors > 0 {
            let errors = "llm_d_epp_request_error_total";
            write_help(out, errors, "Counter of failed requests.");
            write_type(out, errors, MetricType::Counter);
            let mut labels = model_labels.to_vec();
            labels.push(("error_code", "503"));
            write_sample(out, errors, &labels, counters.errors as f64, None);
        }

        let ttft = "llm_d_epp_request_ttft_seconds";
        write_help(out, ttft, "Time to first token in seconds.");
        write_type(out, ttft, MetricType::Histogram);
        let mut labels = model_labels.to_vec();
        labels.push(("streaming", "true"));
        write_histogram(out, ttft, &labels, &counters.ttft_streaming);
        labels.pop();
        labels.push(("streaming", "false"));
        write_histogram(out, ttft, &labels, &counters.ttft_non_streaming);

        let tpot = "llm_d_epp_request_streaming_tpot_seconds";
        write_help(
            out,
            tpot,
            "Time per output token of streaming requests in seconds.",
        );
        write_type(out, tpot, MetricType::Histogram);
        write_histogram(out, tpot, &model_labels, &counters.tpot);
    }
}

/// Writes `_bucket` lines (with `le`), `_sum` and `_count` for one histogram child.
fn write_histogram(out: &mut Vec<u8>, base: &str, labels: &[(&str, &str)], h: &Histogram) {
    let bucket = format!("{base}_bucket");
    for (bound, cumulative) in h.cumulative() {
        let le = if bound.is_infinite() {
            "+Inf".to_owned()
        } else {
            bound.to_string()
        };
        let mut with_le = labels.to_vec();
        with_le.push(("le", le.as_str()));
        write_sample(out, &bucket, &with_le, cumulative as f64, None);
    }
    write_sample(out, &format!("{base}_sum"), labels, h.sum(), None);
    write_sample(
        out,
        &format!("{base}_count"),
        labels,
        h.count() as f64,
        None,
    );
}

#[cfg(test)]
#[allow(
    clippy::float_cmp,
    reason = "small integers and ratios the writer round-trips exactly"
)]
mod tests {
    use grid_signals::epp::{PoolSelector, read_scrape};
    use grid_signals::exposition::parse_strict;

    use super::*;
    use crate::site_model::{RequestSpec, SiteConfig};

    fn busy_site() -> SiteModel {
        let mut config = SiteConfig::new("a", 3, 2);
        config.queue_per_endpoint = Some(1);
        let mut m = SiteModel::new(config, 1).unwrap();
        for _ in 0..11 {
            m.arrive(
                0,
                RequestSpec {
                    streaming: true,
                    service_ms: Some(1_000),
                },
            )
            .unwrap();
        }
        m
    }

    #[test]
    fn the_rendered_text_parses_strictly_and_reads_back_the_model_state() {
        let m = busy_site();
        let mut epp = FakeEpp::new(EppIdentity::new("pool-a", "llama"));
        let text = epp.render(&m);
        let samples = parse_strict(&text).unwrap();
        let r = read_scrape(&samples, &PoolSelector::Named("pool-a".into()));
        assert_eq!(r.rejected.total(), 0);
        assert_eq!(r.ready_endpoints, Some(3.0));
        assert_eq!(r.average_running, Some(2.0));
        assert_eq!(r.average_queue, Some(1.0));
        assert_eq!(r.average_kv_cache, Some(1.0));
        assert_eq!(r.std_dev_kv_cache, Some(0.0));
        assert_eq!(r.per_endpoint_queue.len(), 3);
        assert!(r.per_endpoint_queue.values().all(|q| *q == 1.0));
        assert_eq!(r.inflight_requests, Some(9.0), "6 running + 3 queued");
        assert_eq!(r.flow_control_queue, Some(2.0), "11 - 9 held");
    }

    #[test]
    fn flow_control_queue_size_has_one_child_per_band_and_they_sum_to_what_is_held() {
        let mut config = SiteConfig::new("a", 1, 1);
        config.queue_per_endpoint = Some(0);
        let mut m = SiteModel::new(config, 1).unwrap();
        let spec = RequestSpec {
            streaming: false,
            service_ms: Some(1_000),
        };
        m.arrive(0, spec).unwrap();
        m.arrive(0, spec).unwrap();
        // Provisioned at runtime: the exposition reads the registry flow control admits
        // through.
        m.set_band(5, Some(10)).unwrap();
        for _ in 0..2 {
            m.arrive_prioritized(0, spec, 5).unwrap();
        }
        let text = FakeEpp::new(EppIdentity::new("pool-a", "llama")).render(&m);
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains(r#"priority="0",target_model_name="llama"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"priority="5",target_model_name="llama"} 2"#),
            "{text}"
        );
        let samples = parse_strict(text.as_bytes()).unwrap();
        let r = read_scrape(&samples, &PoolSelector::Named("pool-a".into()));
        assert_eq!(r.flow_control_queue, Some(3.0));
    }

    #[test]
    fn averages_freeze_when_no_endpoint_is_ready() {
        let mut m = busy_site();
        let mut epp = FakeEpp::new(EppIdentity::new("pool-a", "llama"));
        let _ = epp.render(&m);
        m.take_all_endpoints(10);
        let text = epp.render(&m);
        let samples = parse_strict(&text).unwrap();
        let r = read_scrape(&samples, &PoolSelector::All);
        assert_eq!(r.ready_endpoints, Some(0.0));
        assert_eq!(r.average_running, Some(2.0), "frozen at the last value");
        assert!(r.per_endpoint_queue.is_empty());
        assert_eq!(r.counters.errors, Some(11.0), "9 dropped, 2 held failed");
    }

    #[test]
    fn completed_requests_show_in_the_counters_and_histograms() {
        let mut m = busy_site();
        m.advance(5_000);
        let mut epp = FakeEpp::new(EppIdentity::new("pool-a", "llama"));
        let text = epp.render(&m);
        let samples = parse_strict(&text).unwrap();
        let r = read_scrape(&samples, &PoolSelector::All);
        assert_eq!(r.counters.requests, Some(11.0));
        assert_eq!(
            r.counters.errors, None,
            "no error child before the first error"
        );
        let ttft = r.counters.ttft.expect("streaming TTFT");
        assert!((ttft.count - 11.0).abs() < f64::EPSILON);
        let tpot = r.counters.tpot.expect("TPOT");
        assert!((tpot.count - 11.0).abs() < f64::EPSILON);
    }
}
