//! Which EPP series grid reads, under every name an EPP release has given them.
//!
//! The EPP renamed its metrics (`inference_pool_*` / `inference_objective_*` /
//! `inference_model_*` became `llm_d_epp_*`, and later llm-d-router builds use
//! `llm_d_router_epp_*`), and during the deprecation it emits both spellings of the same
//! value. Everything downstream works on [`EppMetric`] and, when a scrape carries several
//! spellings of one metric, uses only the most current ([`Generation`]) so a value is never
//! counted twice.

/// One EPP metric grid reads, independent of how the scraped EPP spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EppMetric {
    /// Endpoints with fresh metrics in the pool (gauge, label `name`).
    ReadyEndpoints,
    /// Average running requests per ready endpoint (gauge, label `name`).
    AverageRunning,
    /// Average queued requests per ready endpoint (gauge, label `name`).
    AverageQueue,
    /// Average KV-cache utilization, 0..1 (gauge, label `name`).
    AverageKvCache,
    /// Standard deviation of KV-cache utilization (gauge, label `name`).
    StdDevKvCache,
    /// Queued requests on one endpoint: the per-unit series (gauge, labels `name` and the
    /// endpoint label).
    PerEndpointQueue,
    /// In-flight requests per endpoint per in-flight load producer (gauge, labels
    /// `endpoint_name`, `namespace`, `producer_name`; no pool label).
    InflightRequests,
    /// Requests held by flow control (gauge, label `inference_pool` plus fairness/priority/
    /// model labels that are summed away).
    FlowControlQueue,
    /// Time to first token (histogram, label `streaming` on current names).
    Ttft,
    /// Time per output token of streaming requests (histogram).
    Tpot,
    /// Requests seen by the EPP (counter).
    RequestTotal,
    /// Requests that failed (counter).
    RequestErrorTotal,
}

/// How current a spelling is; a lower value wins when one scrape carries several.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Generation {
    /// `llm_d_epp_*`: the names grid relays (the fixtures' current names).
    Current = 0,
    /// `llm_d_router_epp_*`: the subsystem later llm-d-router builds use.
    Router = 1,
    /// `inference_pool_*`, `inference_objective_*`, `inference_model_*`,
    /// `inference_extension_*`: deprecated names older EPPs still emit.
    Old = 2,
}

/// How many [`Generation`]s exist; sizes per-generation accumulators.
pub const GENERATIONS: usize = 3;

/// Which sample of a histogram family a sample line is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HistogramPart {
    /// `_bucket{le=...}`: cumulative count at or below the bound.
    Bucket,
    /// `_sum`: sum of observations.
    Sum,
    /// `_count`: number of observations.
    Count,
}

/// A recognized sample name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recognized {
    /// The metric it carries.
    pub metric: EppMetric,
    /// Which spelling the EPP used.
    pub generation: Generation,
    /// For histogram families, which part; `None` for gauges and counters.
    pub part: Option<HistogramPart>,
}

/// Every spelling grid reads, with its metric and generation. Histogram families are
/// listed by base name; [`recognize`] strips `_bucket`/`_sum`/`_count`.
pub const NAME_TABLE: &[(&str, EppMetric, Generation)] = &[
    (
        "llm_d_epp_ready_endpoints",
        EppMetric::ReadyEndpoints,
        Generation::Current,
    ),
    (
        "llm_d_router_epp_ready_endpoints",
        EppMetric::ReadyEndpoints,
        Generation::Router,
    ),
    (
        "inference_pool_ready_pods",
        EppMetric::ReadyEndpoints,
        Generation::Old,
    ),
    (
        "llm_d_epp_average_running_requests",
        EppMetric::AverageRunning,
        Generation::Current,
    ),
    (
        "llm_d_router_epp_average_running_requests",
        EppMetric::AverageRunning,
        Generation::Router,
    ),
    (
        "inference_pool_average_running_requests",
        EppMetric::AverageRunning,
        Generation::Old,
    ),
    (
        "llm_d_epp_average_queue_size",
        EppMetric::AverageQueue,
        Generation::Current,
    ),
    (
        "llm_d_router_epp_average_queue_size",
        EppMetric::AverageQueue,
        Generation::Router,
    ),
    (
        "inference_pool_average_queue_size",
        EppMetric::AverageQueue,
        Generation::Old,
    ),
    (
        "llm_d_epp_average_kv_cache_utilization",
        EppMetric::AverageKvCache,
        Generation::Current,
    ),
    (
        "llm_d_router_epp_average_kv_cache_utilization",
        EppMetric::AverageKvCache,
        Generation::Router,
    ),
    (
        "inference_pool_average_kv_cache_utilization",
        EppMetric::AverageKvCache,
        Generation::Old,
    ),
    (
        "llm_d_epp_std_dev_kv_cache_utilization",
        EppMetric::StdDevKvCache,
        Generation::Current,
    ),
    (
        "llm_d_router_epp_std_dev_kv_cache_utilization",
        EppMetric::StdDevKvCache,
        Generation::Router,
    ),
    (
        "llm_d_epp_per_endpoint_queue_size",
        EppMetric::PerEndpointQueue,
        Generation::Current,
    ),
    (
        "llm_d_router_epp_per_endpoint_queue_size",
        EppMetric::PerEndpointQueue,
        Generation::Router,
    ),
    (
        "inference_pool_per_pod_queue_size",
        EppMetric::PerEndpointQueue,
        Generation::Old,
    ),
    (
        "llm_d_epp_inflight_requests",
        EppMetric::InflightRequests,
        Generation::Current,
    ),
    (
        "llm_d_epp_flow_control_queue_size",
        EppMetric::FlowControlQueue,
        Generation::Current,
    ),
    (
        "llm_d_router_epp_flow_control_queue_size",
        EppMetric::FlowControlQueue,
        Generation::Router,
    ),
    (
        "inference_extension_flow_control_queue_size",
        EppMetric::FlowControlQueue,
        Generation::Old,
    ),
    (
        "llm_d_epp_request_ttft_seconds",
        EppMetric::Ttft,
        Generation::Current,
    ),
    (
        "llm_d_router_epp_request_ttft_seconds",
        EppMetric::Ttft,
        Generation::Router,
    ),
    (
        "inference_objective_request_ttft_seconds",
        EppMetric::Ttft,
        Generation::Old,
    ),
    (
        "inference_model_request_ttft_seconds",
        EppMetric::Ttft,
        Generation::Old,
    ),
    (
        "llm_d_epp_request_streaming_tpot_seconds",
        EppMetric::Tpot,
        Generation::Current,
    ),
    (
        "llm_d_epp_request_tpot_seconds",
        EppMetric::Tpot,
        Generation::Current,
    ),
    (
        "llm_d_router_epp_request_streaming_tpot_seconds",
        EppMetric::Tpot,
        Generation::Router,
    ),
    (
        "inference_objective_request_tpot_seconds",
        EppMetric::Tpot,
        Generation::Old,
    ),
    (
        "inference_model_request_tpot_seconds",
        EppMetric::Tpot,
        Generation::Old,
    ),
    (
        "llm_d_epp_request_total",
        EppMetric::RequestTotal,
        Generation::Current,
    ),
    (
        "llm_d_router_epp_request_total",
        EppMetric::RequestTotal,
        Generation::Router,
    ),
    (
        "inference_objective_request_total",
        EppMetric::RequestTotal,
        Generation::Old,
    ),
    (
        "inference_model_request_total",
        EppMetric::RequestTotal,
        Generation::Old,
    ),
    (
        "llm_d_epp_request_error_total",
        EppMetric::RequestErrorTotal,
        Generation::Current,
    ),
    (
        "llm_d_router_epp_request_error_total",
        EppMetric::RequestErrorTotal,
        Generation::Router,
    ),
    (
        "inference_objective_request_error_total",
        EppMetric::RequestErrorTotal,
        Generation::Old,
    ),
    (
        "inference_model_request_error_total",
        EppMetric::RequestErrorTotal,
        Generation::Old,
    ),
];

/// The names grid relays the EPP series it reads under, on the signals wire: their
/// current (`llm_d_epp_*`) spelling, whatever spelling the scraped EPP wrote
/// ([`EppMetric::current_name`]). One home for them: the operator writes relayed rows
/// under these names and the gateway's reader looks them up by the same constants. They
/// are the EPP's series relayed, not the operator's conclusions (`grid_provider_*`).
/// Endpoints with fresh metrics in the pool.
pub const EPP_READY_ENDPOINTS: &str = "llm_d_epp_ready_endpoints";
/// Average running requests per ready endpoint.
pub const EPP_AVERAGE_RUNNING: &str = "llm_d_epp_average_running_requests";
/// Average queued requests per ready endpoint.
pub const EPP_AVERAGE_QUEUE: &str = "llm_d_epp_average_queue_size";
/// Average KV-cache utilization, 0..1.
pub const EPP_AVERAGE_KV_CACHE: &str = "llm_d_epp_average_kv_cache_utilization";
/// Standard deviation of KV-cache utilization.
pub const EPP_STD_DEV_KV_CACHE: &str = "llm_d_epp_std_dev_kv_cache_utilization";
/// Queued requests on one endpoint, one series per endpoint.
pub const EPP_PER_ENDPOINT_QUEUE: &str = "llm_d_epp_per_endpoint_queue_size";
/// In-flight requests per endpoint per load producer.
pub const EPP_INFLIGHT_REQUESTS: &str = "llm_d_epp_inflight_requests";
/// Requests held by flow control before scheduling.
pub const EPP_FLOW_CONTROL_QUEUE: &str = "llm_d_epp_flow_control_queue_size";
/// Time to first token (histogram).
pub const EPP_REQUEST_TTFT_SECONDS: &str = "llm_d_epp_request_ttft_seconds";
/// Time per output token of streaming requests (histogram).
pub const EPP_REQUEST_STREAMING_TPOT_SECONDS: &str = "llm_d_epp_request_streaming_tpot_seconds";
/// Requests seen by the EPP (counter).
pub const EPP_REQUEST_TOTAL: &str = "llm_d_epp_request_total";
/// Requests that failed (counter).
pub const EPP_REQUEST_ERROR_TOTAL: &str = "llm_d_epp_request_error_total";

impl EppMetric {
    /// The current (`llm_d_epp_*`) name: the one grid relays and documents.
    pub fn current_name(self) -> &'static str {
        match self {
            Self::ReadyEndpoints => EPP_READY_ENDPOINTS,
            Self::AverageRunning => EPP_AVERAGE_RUNNING,
            Self::AverageQueue => EPP_AVERAGE_QUEUE,
            Self::AverageKvCache => EPP_AVERAGE_KV_CACHE,
            Self::StdDevKvCache => EPP_STD_DEV_KV_CACHE,
            Self::PerEndpointQueue => EPP_PER_ENDPOINT_QUEUE,
            Self::InflightRequests => EPP_INFLIGHT_REQUESTS,
            Self::FlowControlQueue => EPP_FLOW_CONTROL_QUEUE,
            Self::Ttft => EPP_REQUEST_TTFT_SECONDS,
            Self::Tpot => EPP_REQUEST_STREAMING_TPOT_SECONDS,
            Self::RequestTotal => EPP_REQUEST_TOTAL,
            Self::RequestErrorTotal => EPP_REQUEST_ERROR_TOTAL,
        }
    }

    /// Whether the family is a histogram (its samples carry `_bucket`/`_sum`/`_count`).
    pub fn is_histogram(self) -> bool {
        matches!(self, Self::Ttft | Self::Tpot)
    }

    /// The label naming the pool, for the metrics that carry one. The in-flight count
    /// and the latency families carry none, which is why a multi-pool EPP cannot split them.
    pub fn pool_label(self) -> Option<&'static str> {
        match self {
            Self::ReadyEndpoints
            | Self::AverageRunning
            | Self::AverageQueue
            | Self::AverageKvCache
            | Self::StdDevKvCache
            | Self::PerEndpointQueue => Some(POOL_LABEL),
            Self::FlowControlQueue => Some(FLOW_CONTROL_POOL_LABEL),
            Self::InflightRequests
            | Self::Ttft
            | Self::Tpot
            | Self::RequestTotal
            | Self::RequestErrorTotal => None,
        }
    }
}

/// The EPP's pool label on the pool gauges (replaced by `grid_site`/`grid_provider` when
/// relayed).
pub const POOL_LABEL: &str = "name";
/// The pool label on the flow-control gauges.
pub const FLOW_CONTROL_POOL_LABEL: &str = "inference_pool";
/// The endpoint label of the per-unit series under current names (and the label grid
/// relays it under).
pub const ENDPOINT_LABEL: &str = "model_server_endpoint";
/// The endpoint label of the per-unit series under the old `inference_pool_per_pod_*` name.
pub const OLD_ENDPOINT_LABEL: &str = "model_server_pod";
/// The in-flight gauge's endpoint name label.
pub const INFLIGHT_ENDPOINT_LABEL: &str = "endpoint_name";
/// The in-flight gauge's endpoint namespace label.
pub const INFLIGHT_NAMESPACE_LABEL: &str = "namespace";
/// The label marking streaming requests on the current TTFT histogram.
pub const STREAMING_LABEL: &str = "streaming";
/// A histogram bucket's upper-bound label.
pub const BUCKET_BOUND_LABEL: &str = "le";

/// The endpoint label of the per-unit series for a generation.
pub fn endpoint_label(generation: Generation) -> &'static str {
    match generation {
        Generation::Current | Generation::Router => ENDPOINT_LABEL,
        Generation::Old => OLD_ENDPOINT_LABEL,
    }
}

/// Names the sample, or `None` when grid does not read it.
///
/// Cheap enough to call on every sample of a scrape: one prefix test rejects most
/// foreign names before the table is scanned.
pub fn recognize(name: &str) -> Option<Recognized> {
    if !(name.starts_with("llm_d_") || name.starts_with("inference_")) {
        return None;
    }
    if let Some(found) = lookup(name)
        && !found.0.is_histogram()
    {
        return Some(Recognized {
            metric: found.0,
            generation: found.1,
            part: None,
        });
    }
    for (suffix, part) in [
        ("_bucket", HistogramPart::Bucket),
        ("_sum", HistogramPart::Sum),
        ("_count", HistogramPart::Count),
    ] {
        if let Some(base) = name.strip_suffix(suffix)
            && let Some((metric, generation)) = lookup(base)
            && metric.is_histogram()
        {
            return Some(Recognized {
                metric,
                generation,
                part: Some(part),
            });
        }
    }
    None
}

/// The family a sample name or a `# TYPE`/`# HELP` name belongs to, if grid reads it:
/// [`recognize`], and histogram families by their base name as well.
pub fn family_of(name: &str) -> Option<(EppMetric, Generation)> {
    recognize(name)
        .map(|r| (r.metric, r.generation))
        .or_else(|| lookup(name))
}

fn lookup(name: &str) -> Option<(EppMetric, Generation)> {
    NAME_TABLE
        .iter()
        .find(|(spelled, _, _)| *spelled == name)
        .map(|&(_, metric, generation)| (metric, generation))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_is_recognized_with_its_metric_and_generation() {
        type Want = Option<(EppMetric, Generation, Option<HistogramPart>)>;
        let cases: &[(&str, Want)] = &[
            (
                "llm_d_epp_ready_endpoints",
                Some((EppMetric::ReadyEndpoints, Generation::Current, None)),
            ),
            (
                "inference_pool_ready_pods",
                Some((EppMetric::ReadyEndpoints, Generation::Old, None)),
            ),
            (
                "inference_pool_average_queue_size",
                Some((EppMetric::AverageQueue, Generation::Old, None)),
            ),
            (
                "inference_pool_per_pod_queue_size",
                Some((EppMetric::PerEndpointQueue, Generation::Old, None)),
            ),
            (
                "llm_d_epp_request_ttft_seconds_bucket",
                Some((
                    EppMetric::Ttft,
                    Generation::Current,
                    Some(HistogramPart::Bucket),
                )),
            ),
            (
                "inference_model_request_ttft_seconds_count",
                Some((EppMetric::Ttft, Generation::Old, Some(HistogramPart::Count))),
            ),
            (
                "inference_model_request_tpot_seconds_sum",
                Some((EppMetric::Tpot, Generation::Old, Some(HistogramPart::Sum))),
            ),
            (
                "llm_d_epp_request_total",
                Some((EppMetric::RequestTotal, Generation::Current, None)),
            ),
            (
                "inference_objective_request_total",
                Some((EppMetric::RequestTotal, Generation::Old, None)),
            ),
            (
                "llm_d_router_epp_flow_control_queue_size",
                Some((EppMetric::FlowControlQueue, Generation::Router, None)),
            ),
            // Not read: a gauge's name with a histogram suffix, foreign names, near misses.
            ("llm_d_epp_ready_endpoints_count", None),
            ("llm_d_epp_request_ttft_seconds", None),
            ("vllm:num_requests_running", None),
            ("llm_d_epp_std_dev_queue_size", None),
            ("inference_objective_running_requests", None),
        ];
        for (name, want) in cases {
            let got = recognize(name).map(|r| (r.metric, r.generation, r.part));
            assert_eq!(got, *want, "{name}");
        }
    }

    #[test]
    fn every_table_entry_is_unique_and_round_trips() {
        for (i, (name, metric, generation)) in NAME_TABLE.iter().enumerate() {
            assert!(
                NAME_TABLE[i + 1..]
                    .iter()
                    .all(|(other, _, _)| other != name),
                "{name} twice"
            );
            let probe = if metric.is_histogram() {
                format!("{name}_count")
            } else {
                (*name).to_owned()
            };
            let got = recognize(&probe).expect(name);
            assert_eq!(
                (got.metric, got.generation),
                (*metric, *generation),
                "{name}"
            );
        }
    }

    #[test]
    fn every_current_name_is_in_the_table_as_current() {
        for (_, metric, _) in NAME_TABLE {
            let current = metric.current_name();
            assert!(
                NAME_TABLE
                    .iter()
                    .any(|(n, m, g)| *n == current && m == metric && *g == Generation::Current),
                "{current}"
            );
        }
    }
}
