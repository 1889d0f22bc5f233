//! The operator's Prometheus `/metrics`: one registry nesting every library's series,
//! the provider series read from the store at scrape time, and a plain-HTTP listener.

use std::convert::Infallible;
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

use crate::clock::Clock;
use crate::listener::ListenerMetrics;
use crate::peers::PollMetrics;
use crate::providers::ScrapeMetrics;
use crate::signals::RefusalMetrics;
use crate::site_machine::{SharedSignals, lock};
use crate::slots::HEADER_READ_TIMEOUT;
use grid_daemon::accept::AcceptBackoff;
use grid_daemon::{exposition, probe};

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
    clock: Clock,
}

impl Collector for ProviderSeries {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let now = self.clock.wall_ms();
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
    /// Gossip pulls and digests.
    pub gossip: crate::gossip::GossipMetrics,
    /// Ingest and relay drops (grid-signals).
    pub ingest: IngestMetrics,
    /// Signals-listener connections.
    pub listener: ListenerMetrics,
    /// Feedback events and refusals (grid-feedback).
    pub feedback: ReceiverMetrics,
    /// Refused signals requests.
    pub refusals: RefusalMetrics,
    /// Long polls of the signals relay held and refused.
    pub long_polls: crate::signals::LongPollMetrics,
    /// Body bytes the signals listener served.
    pub served: crate::served::ServedMetrics,
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
    /// Periodic fence writes that failed: fences a restart would lose until one succeeds.
    pub fence_persist_failures: prometheus_client::metrics::counter::Counter,
}

impl OperatorMetrics {
    /// Builds the registry: the libraries' series, the operator's own, and the provider
    /// series read from `signals`.
    pub fn register(registry: &mut Registry, signals: SharedSignals, clock: Clock) -> Self {
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
        let fence_persist_failures = prometheus_client::metrics::counter::Counter::default();
        registry.register(
            "grid_operator_fence_persist_failures",
            "Periodic writes of the batch fences to the state directory that failed; until one succeeds a restart loses the fence progress since the last write",
            fence_persist_failures.clone(),
        );
        registry.register_collector(Box::new(ProviderSeries { signals, clock }));
        let ingest = IngestMetrics::register(registry);
        ingest.register_relay(registry);
        let polls = PollMetrics::register(registry);
        let mut gossip = crate::gossip::GossipMetrics::register(registry);
        gossip.ledger = polls.ledger.clone();
        Self {
            scrapes: ScrapeMetrics::register(registry),
            polls,
            gossip,
            ingest,
            listener: ListenerMetrics::register(registry),
            feedback: ReceiverMetrics::register(registry),
            refusals: RefusalMetrics::register(registry),
            long_polls: crate::signals::LongPollMetrics::register(registry),
            served: crate::served::ServedMetrics::register(registry),
            ages_rejected,
            epoch,
            epoch_clamped,
            epoch_mark_lead,
            fence_persist_failures,
        }
    }
}

/// What the listener answers `/readyz` and the routing evidence from.
#[derive(Clone)]
enum Readiness {
    /// A running operator: ready once every provider was scraped once; its evidence.
    Scrapes(ScrapeMetrics, Arc<crate::evidence::EvidenceSource>),
    /// A standby replica waiting for its site's Lease: alive, never ready, no evidence.
    Standby,
}

/// Answers one request of the plain-HTTP metrics listener: `/metrics` and the probes
/// ([`grid_daemon::probe`]); the operator is ready once every provider was scraped once
/// (a complete pass: the signals it serves are then this site's own), a standby never.
fn answer(
    request: &Request<hyper::body::Incoming>,
    registry: &Registry,
    readiness: &Readiness,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    let path = request.uri().path();
    let known = [
        METRICS_PATH,
        probe::HEALTHZ_PATH,
        probe::READYZ_PATH,
        grid_daemon::evidence::ROUTING_PATH,
    ]
    .contains(&path);
    if !known {
        *r.status_mut() = StatusCode::NOT_FOUND;
        return r;
    }
    if request.method() != Method::GET {
        *r.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        return r;
    }
    let (body, kind) = if path == METRICS_PATH {
        exposition::negotiate_for(registry, request.headers())
    } else if let (true, Readiness::Scrapes(_, evidence)) =
        (path == grid_daemon::evidence::ROUTING_PATH, readiness)
    {
        let doc = evidence.document(evidence.clock.wall_ms());
        let text = serde_json::to_string(&doc).unwrap_or_default();
        (text, "application/json")
    } else {
        // A standby's evidence path answers as its readiness does: it concludes nothing.
        let (ready, why_not) = match readiness {
            Readiness::Scrapes(scrapes, _) => (scrapes.passes() > 0, "no complete scrape pass yet"),
            Readiness::Standby => (false, "a standby: another replica holds the site's Lease"),
        };
        let (status, text) = probe::answer(path == probe::HEALTHZ_PATH || ready, why_not);
        *r.status_mut() = status;
        (text, probe::CONTENT_TYPE)
    };
    *r.body_mut() = Full::new(Bytes::from(body));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(kind));
    r
}

const METRICS_PATH: &str = "/metrics";

/// Serves `GET /metrics`, `/healthz`, `/readyz` and the routing evidence
/// (`/v1/grid/routing`) over plain HTTP until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    scrapes: ScrapeMetrics,
    evidence: Arc<crate::evidence::EvidenceSource>,
) {
    serve_as(listener, registry, Readiness::Scrapes(scrapes, evidence)).await;
}

/// Serves a standby replica's metrics listener until the task is dropped: `/healthz`
/// 200 (it is alive), `/readyz` 503 (it serves nothing until it holds the Lease), and
/// `/metrics` with `registry`'s series.
pub async fn serve_standby(listener: TcpListener, registry: Arc<Registry>) {
    serve_as(listener, registry, Readiness::Standby).await;
}

async fn serve_as(listener: TcpListener, registry: Arc<Registry>, readiness: Readiness) {
    let mut backoff = AcceptBackoff::default();
    loop {
        let (tcp, _) = backoff.accept(&listener, "metrics", || {}).await;
        let registry = registry.clone();
        let readiness = readiness.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let r = answer(&request, &registry, &readiness);
                async move { Ok::<_, Infallible>(r) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}
