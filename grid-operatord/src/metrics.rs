//! The operator's Prometheus `/metrics`: one registry nesting every library's series,
//! the provider series read from the store at scrape time, and a plain-HTTP listener.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;

use bytes::Bytes;
use grid_feedback::ReceiverMetrics;
use grid_signals::epp::{
    ERROR_RATIO, IN_FLIGHT_REQUESTS, READY, READY_ENDPOINTS, TPOT_SECONDS, TTFT_P50_SECONDS,
    TTFT_P90_SECONDS,
};
use grid_signals::store::IngestMetrics;
use http::{Method, StatusCode, header};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::listener::ListenerMetrics;
use crate::peers::PollMetrics;
use crate::providers::ScrapeMetrics;
use crate::signals::{RefusalMetrics, SharedSignals, lock};
use crate::slots::HEADER_READ_TIMEOUT;

/// Content type of the `OpenMetrics` answer (what prometheus-client writes), served to
/// callers whose `Accept` names it, as a Prometheus server's does.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Content type of the Prometheus text answer, served to everyone else (`curl`,
/// `promtool check metrics`).
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The provider series exported for every site held, with their help text.
pub const PROVIDER_SERIES: [(&str, &str); 7] = [
    (
        READY,
        "Whether the provider can serve (1) or not (0); absent when unknown",
    ),
    (
        READY_ENDPOINTS,
        "Endpoints with fresh metrics in the provider's EPP pool",
    ),
    (
        IN_FLIGHT_REQUESTS,
        "Requests the provider holds (see docs/metrics.md)",
    ),
    (
        TTFT_P50_SECONDS,
        "Median time to first token over the last 30 s",
    ),
    (
        TTFT_P90_SECONDS,
        "90th percentile time to first token over the last 30 s",
    ),
    (
        TPOT_SECONDS,
        "Mean time per output token over the last 30 s",
    ),
    (ERROR_RATIO, "Failed over all requests over the last 30 s"),
];

/// Reads the provider series out of the store on every scrape, so a series the operator
/// does not hold is absent rather than 0, and a peer's value is what was last polled.
///
/// "Held" is what the relay carries: the newest publication of each provider
/// ([`grid_signals::store::Entry::published`]). A reading still in a window but no longer
/// in the newest publication (the EPP stopped exporting the series) is absent here, as it
/// is on `/v1/site/signals`, never a stale value.
#[derive(Debug)]
pub struct ProviderSeries {
    signals: SharedSignals,
}

impl Collector for ProviderSeries {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let now = crate::clock::wall_ms();
        let signals = lock(&self.signals);
        for (name, help) in PROVIDER_SERIES {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for entry in signals.all().entries() {
                if let Some(reading) = entry.published(name, &[], now) {
                    let labels = [
                        ("grid_site", entry.site()),
                        ("grid_provider", entry.provider()),
                    ];
                    ConstGauge::new(reading.value).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        Ok(())
    }
}

/// Every series handle the operator counts into.
#[derive(Clone, Debug)]
pub struct OperatorMetrics {
    /// Scrape results.
    pub scrapes: ScrapeMetrics,
    /// Peer poll outcomes.
    pub polls: PollMetrics,
    /// Ingest and relay drops (grid-signals).
    pub ingest: IngestMetrics,
    /// Signals-listener connections.
    pub listener: ListenerMetrics,
    /// Feedback events and refusals (grid-feedback).
    pub feedback: ReceiverMetrics,
    /// Refused signals requests.
    pub refusals: RefusalMetrics,
    /// `GatewayAgesRejected` as 1 (True) or 0.
    pub ages_rejected: Gauge,
    /// This process's publisher epoch.
    pub epoch: Gauge,
    /// 1 when the persisted epoch mark was too far ahead of the clock at start and the
    /// epoch was clamped to the clock's lead bound.
    pub epoch_clamped: Gauge,
    /// How far the persisted epoch mark was ahead of the clock at start when it forced
    /// the clamp, in seconds; 0 otherwise.
    pub epoch_mark_lead: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl OperatorMetrics {
    /// Builds the registry: the libraries' series, the operator's own, and the provider
    /// series read from `signals`.
    pub fn register(registry: &mut Registry, signals: SharedSignals) -> Self {
        let ages_rejected = Gauge::default();
        registry.register(
            "grid_operator_gateway_ages_rejected",
            "GatewayAgesRejected: 1 while a local gateway replica's rejected reading ages are unresolved",
            ages_rejected.clone(),
        );
        let epoch = Gauge::default();
        registry.register(
            "grid_operator_publisher_epoch",
            "This process's publisher epoch: wall-clock milliseconds since the Unix epoch, above every persisted one",
            epoch.clone(),
        );
        let epoch_clamped = Gauge::default();
        registry.register(
            "grid_operator_publisher_epoch_clamped",
            "1 when the persisted publisher-epoch mark was more than 10 minutes ahead of the clock at start (the clock stepped back) and the epoch was clamped to the clock plus 10 minutes",
            epoch_clamped.clone(),
        );
        let epoch_mark_lead = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "grid_operator_publisher_epoch_mark_lead_seconds",
            "How far the persisted publisher-epoch mark was ahead of the clock at start when it forced the clamp; 0 otherwise",
            epoch_mark_lead.clone(),
        );
        registry.register_collector(Box::new(ProviderSeries { signals }));
        let ingest = IngestMetrics::register(registry);
        ingest.register_relay(registry);
        Self {
            scrapes: ScrapeMetrics::register(registry),
            polls: PollMetrics::register(registry),
            ingest,
            listener: ListenerMetrics::register(registry),
            feedback: ReceiverMetrics::register(registry),
            refusals: RefusalMetrics::register(registry),
            ages_rejected,
            epoch,
            epoch_clamped,
            epoch_mark_lead,
        }
    }
}

/// The text of `registry` as `/metrics` answers it.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// Rewrites prometheus-client's `OpenMetrics` text as Prometheus text 0.0.4: a counter's
/// `HELP` and `TYPE` name its `_total` samples (`OpenMetrics` names the family without the
/// suffix), and the OpenMetrics-only `# UNIT` and `# EOF` lines are dropped.
pub fn to_text_004(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some(previous) = help.replace(rest) {
                push_line(&mut out, "# HELP ", previous);
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let rename = kind == "counter" && !name.ends_with("_total");
            let suffix = if rename { "_total" } else { "" };
            if let Some(h) = help.take() {
                let (help_name, text) = h.split_once(' ').unwrap_or((h, ""));
                if help_name == name {
                    let _ = writeln!(out, "# HELP {name}{suffix} {text}");
                } else {
                    push_line(&mut out, "# HELP ", h);
                }
            }
            let _ = writeln!(out, "# TYPE {name}{suffix} {kind}");
            continue;
        }
        if let Some(h) = help.take() {
            push_line(&mut out, "# HELP ", h);
        }
        push_line(&mut out, "", line);
    }
    if let Some(h) = help {
        push_line(&mut out, "# HELP ", h);
    }
    out
}

fn push_line(out: &mut String, prefix: &str, line: &str) {
    out.push_str(prefix);
    out.push_str(line);
    out.push('\n');
}

fn wants_openmetrics(request: &Request<hyper::body::Incoming>) -> bool {
    request
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"))
}

/// Serves `GET /metrics` (plain HTTP) until the task is dropped.
pub async fn serve(listener: TcpListener, registry: Arc<Registry>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let registry = registry.clone();
                async move {
                    let mut r = Response::new(Full::new(Bytes::new()));
                    if request.uri().path() != "/metrics" {
                        *r.status_mut() = StatusCode::NOT_FOUND;
                    } else if request.method() != Method::GET {
                        *r.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
                    } else {
                        let openmetrics = render(&registry);
                        let (body, kind) = if wants_openmetrics(&request) {
                            (openmetrics, OPENMETRICS_CONTENT_TYPE)
                        } else {
                            (to_text_004(&openmetrics), TEXT_CONTENT_TYPE)
                        };
                        *r.body_mut() = Full::new(Bytes::from(body));
                        r.headers_mut()
                            .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(kind));
                    }
                    Ok::<_, Infallible>(r)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_renamed_to_their_samples_and_openmetrics_lines_dropped() {
        let om = "# HELP a_events Events.\n# TYPE a_events counter\na_events_total{k=\"v\"} 1\n\
                  # HELP g A gauge.\n# TYPE g gauge\n# UNIT g seconds\ng 2\n# EOF\n";
        assert_eq!(
            to_text_004(om),
            "# HELP a_events_total Events.\n# TYPE a_events_total counter\na_events_total{k=\"v\"} 1\n\
             # HELP g A gauge.\n# TYPE g gauge\ng 2\n"
        );
    }

    #[test]
    fn a_help_without_a_type_is_kept() {
        assert_eq!(
            to_text_004("# HELP x Lonely.\nx 1\n"),
            "# HELP x Lonely.\nx 1\n"
        );
    }
}
