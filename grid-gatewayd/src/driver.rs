//! The driver: owns the runtime pieces (listener, clients, poller task) and wires the
//! pure crates between them.
//!
//! Order matters: the listener is bound first, then the poller starts (a gateway polls
//! only while serving); on shutdown the poller stops first, then the listener drains.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use grid_gateway::Error;
use grid_gateway::config::Config;
use grid_gateway::signals::{Handles, PollerTask, Signals};
use grid_gateway::upstream::{self, Published};
use grid_score::catalog::ModelSpec;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::engine::client::connection_metrics::ListenerMetrics;
use crate::engine::client::limits::{
    DRAIN_TIMEOUT, HTTP2_KEEP_ALIVE_INTERVAL, HTTP2_KEEP_ALIVE_TIMEOUT, Limits,
};
use crate::engine::client::listener;
use crate::engine::request_metrics::RequestMetrics;
use crate::engine::site::slots::{SiteSlots, SlotsInUse};
use crate::front_ends::ext_proc::{self, ExtProc, ExtProcMetrics};
use crate::front_ends::http_api::{Api, Inner};

pub use grid_signals::wire::CATALOG_PATH;

/// A running gateway.
#[derive(Debug)]
pub struct Running {
    local_addr: SocketAddr,
    /// Where Envoy's external processor is served, and its task (`extProcListen`).
    ext_proc: Option<(SocketAddr, JoinHandle<()>)>,
    published: Published,
    handles: Handles,
    stop: watch::Sender<bool>,
    poller: PollerTask,
    server: JoinHandle<()>,
    /// The request path's per-site caps, replaced by a model reload.
    site_slots: Arc<ArcSwap<SiteSlots>>,
    /// Samples the request count into the retry budget every second.
    sampler: JoinHandle<()>,
}

/// Every site `config`'s models name, each once per candidate naming it.
fn configured_sites(config: &Config) -> impl Iterator<Item = &str> {
    config
        .models
        .iter()
        .flat_map(|m| &m.candidates)
        .map(|c| c.site.as_str())
}

impl Running {
    /// The address the API listens on (useful when the config asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address Envoy's external processor listens on, when `extProcListen` is set
    /// (useful when it asked for port 0).
    pub fn ext_proc_addr(&self) -> Option<SocketAddr> {
        self.ext_proc.as_ref().map(|(addr, _)| *addr)
    }

    /// The routing slot requests read, for inspection.
    pub fn published(&self) -> &Published {
        &self.published
    }

    /// Metric handles.
    pub fn handles(&self) -> &Handles {
        &self.handles
    }

    /// Replaces the routed models and candidates with `config`'s, keeping what was
    /// learned of every candidate kept (see [`PollerTask::reload_models`]).
    ///
    /// # Errors
    ///
    /// When `config` does not validate.
    ///
    /// Each site keeps its `maxConnectionsPerSite` slots, taken ones included; a site the
    /// reload adds is capped at once with `config`'s value (the cap of a kept site is the
    /// one it started with).
    pub async fn reload_models(&self, config: &Config) -> Result<(), Error> {
        self.poller.reload_models(config).await?;
        let next = SiteSlots::carrying_over(
            configured_sites(config),
            config.max_connections_per_site,
            &self.site_slots.load(),
        );
        self.site_slots.store(Arc::new(next));
        Ok(())
    }

    /// Stops polling, then drains open requests and returns once the listener is closed.
    pub async fn shutdown(self) {
        self.sampler.abort();
        let _ = self.poller.stop().await;
        let _ = self.stop.send(true);
        let _ = self.server.await;
        if let Some((_, mut task)) = self.ext_proc {
            // Envoy holds its processor connection open. A stream past its answer's head
            // ends at once on the stop; one waiting for a head ends with it, which the
            // API's drain bound also bounds.
            if tokio::time::timeout(DRAIN_TIMEOUT, &mut task)
                .await
                .is_err()
            {
                tracing::warn!("the Envoy processor's drain timed out; closing it");
                task.abort();
            }
        }
    }
}

/// Loads the TLS identity, binds the listener, starts serving and then polling.
pub async fn start(config: Config) -> Result<Running, Error> {
    let mut registry = Registry::default();
    let request_metrics = RequestMetrics::register(&mut registry);
    for site in configured_sites(&config) {
        request_metrics.add_site(site);
    }
    let ext_proc_metrics = ExtProcMetrics::register(&mut registry);
    let listener_metrics = ListenerMetrics::register(&mut registry);
    let signals = Signals::new(&config, &mut registry)?;
    let sites = upstream::site_client(
        signals.sites_tls().clone(),
        Duration::from_millis(config.connect_timeout_ms),
    );
    let site_slots = Arc::new(ArcSwap::from_pointee(SiteSlots::new(
        configured_sites(&config),
        config.max_connections_per_site,
    )));
    registry.register_collector(Box::new(SlotsInUse(Arc::clone(&site_slots))));
    let registry = Arc::new(registry);
    let published = Arc::clone(signals.published());
    let handles = signals.handles().clone();

    let listener =
        bind_with_backlog(config.listen, config.listen_backlog).map_err(|source| Error::Bind {
            addr: config.listen,
            source,
        })?;
    let local_addr = listener.local_addr().map_err(|source| Error::Bind {
        addr: config.listen,
        source,
    })?;
    let (stop, mut stopped) = watch::channel(false);
    let ext_proc_listener =
        bind_ext_proc(&config, &signals, &request_metrics, ext_proc_metrics, &stop).await?;
    let retry_budget = Arc::new(grid_score::retry::RetryBudget::new());
    let sampler = sample_retry_budget(Arc::clone(&retry_budget), request_metrics.clone());
    let api = Api::new(Inner {
        routes: Arc::clone(&published),
        live_refresh: Arc::clone(signals.live_refresh()),
        client: sites,
        plain: upstream::plain_connector(Duration::from_millis(config.connect_timeout_ms)),
        body_limit: config.body_limit_bytes,
        body_timeout: Duration::from_millis(config.client_body_timeout_ms),
        metrics: request_metrics,
        score: signals.score_metrics().clone(),
        site_slots: Arc::clone(&site_slots),
        waits: crate::front_ends::http_api::UpstreamWaits {
            slot: Duration::from_millis(config.connect_timeout_ms),
            headers: Duration::from_millis(config.upstream_headers_timeout_ms),
            idle: Duration::from_millis(config.upstream_idle_timeout_ms),
        },
        registry,
        poll: handles.poll.clone(),
        site: config.site.as_str().into(),
        retry_budget: Arc::clone(&retry_budget),
    });
    let ext_proc = ext_proc_listener.map(|(bound, listener, processor)| {
        let task = tokio::spawn(serve_ext_proc(listener, processor));
        tracing::info!(%bound, "Envoy external processor serving");
        (bound, task)
    });
    let server = tokio::spawn(listener::serve(
        listener,
        api,
        limits_of(&config),
        listener_metrics,
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        },
    ));
    tracing::info!(%local_addr, site = %config.site, "gateway serving");
    let (operator, operator_uri) = signals.operator();
    let (operator, operator_uri) = (operator.clone(), operator_uri.clone());
    let poller = signals.spawn();
    if config.operator.catalog {
        let follow = FollowCatalog {
            client: operator,
            uri: operator_uri,
            template: config.clone(),
            reloads: poller.reloads(),
            site_slots: Arc::clone(&site_slots),
        };
        tokio::spawn(follow.run(stop.subscribe()));
    }
    Ok(Running {
        local_addr,
        ext_proc,
        published,
        handles,
        stop,
        poller,
        server,
        site_slots,
        sampler,
    })
}

/// The listener's bounds, from `config`.
fn limits_of(config: &Config) -> Limits {
    Limits {
        max_connections: config.max_connections,
        header_timeout: Duration::from_millis(config.client_header_timeout_ms),
        idle_timeout: Duration::from_millis(config.client_idle_timeout_ms),
        write_timeout: Duration::from_millis(config.client_write_timeout_ms),
    }
}

/// Samples the requests served into `budget` every second, off the request path, so its
/// window knows how many requests each second saw whether or not any was refused.
fn sample_retry_budget(
    budget: Arc<grid_score::retry::RetryBudget>,
    metrics: RequestMetrics,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let every = Duration::from_millis(grid_score::retry::SAMPLE_EVERY_MS);
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            budget.sample(grid_gateway::clock::wall_ms(), metrics.requests_total());
        }
    })
}

/// A listener on `addr` with `backlog` (the kernel caps it at `net.core.somaxconn`), with
/// `SO_REUSEADDR` as tokio's own `bind` sets it.
fn bind_with_backlog(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// Follows the operator's catalog: at every poll interval one `GET /v1/site/catalog`,
/// bounded by the poll timeout; a body unlike the last one read replaces the models as a
/// SIGHUP reload does (learned state of the candidates kept carried over, per-site caps
/// following). A catalog that does not validate is refused whole, said once, and the
/// models in force stay.
struct FollowCatalog {
    client: upstream::HttpClient,
    uri: http::Uri,
    template: Config,
    reloads: mpsc::Sender<Vec<ModelSpec>>,
    site_slots: Arc<ArcSwap<SiteSlots>>,
}

impl FollowCatalog {
    async fn run(self, mut stop: watch::Receiver<bool>) {
        let every = Duration::from_millis(self.template.operator.poll_interval_ms);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: Option<Vec<u8>> = None;
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = tick.tick() => {}
            }
            let Some(body) = self.fetch().await else {
                continue;
            };
            if last.as_ref() == Some(&body) {
                continue;
            }
            match self.template.with_catalog(&body) {
                Ok(next) => {
                    if self.reloads.send(next.catalog_specs()).await.is_err() {
                        return;
                    }
                    let slots = SiteSlots::carrying_over(
                        configured_sites(&next),
                        next.max_connections_per_site,
                        &self.site_slots.load(),
                    );
                    self.site_slots.store(Arc::new(slots));
                    tracing::info!(
                        models = next.models.len(),
                        "the operator's catalog changed; models reloaded"
                    );
                }
                Err(e) => {
                    tracing::error!(error = %e, "the operator's catalog does not validate; keeping the models in force");
                }
            }
            last = Some(body);
        }
    }

    async fn fetch(&self) -> Option<Vec<u8>> {
        let mut parts = self.uri.clone().into_parts();
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static(CATALOG_PATH));
        let uri = http::Uri::from_parts(parts).ok()?;
        let req = http::Request::get(uri)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .ok()?;
        let budget = Duration::from_millis(self.template.operator.poll_timeout_ms);
        let attempt = async {
            let resp = self.client.request(req).await.map_err(|_| {
                grid_daemon::client::Failed::from(grid_signals::epp::ScrapeFailure::Connect)
            })?;
            grid_daemon::client::read_response(resp).await
        };
        match grid_daemon::client::within(budget, attempt).await {
            Ok(fetched) => Some(fetched.body),
            Err(e) => {
                tracing::debug!(class = e.class.as_str(), status = ?e.status, "fetching the operator's catalog failed");
                None
            }
        }
    }
}

/// Binds `extProcListen`, when set, and builds the processor over the gateway's routing
/// slot and metric handles: bound before anything is served, so a taken port fails the
/// start as the API's does.
async fn bind_ext_proc(
    config: &Config,
    signals: &Signals,
    metrics: &RequestMetrics,
    ext_proc: ExtProcMetrics,
    stop: &watch::Sender<bool>,
) -> Result<Option<(SocketAddr, TcpListener, ExtProc)>, Error> {
    let Some(addr) = config.ext_proc_listen else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| Error::Bind { addr, source })?;
    let processor = ExtProc::new(ext_proc::Shared {
        routes: Arc::clone(signals.published()),
        live_refresh: Arc::clone(signals.live_refresh()),
        metrics: metrics.clone(),
        score: signals.score_metrics().clone(),
        ext_proc,
        body_limit: config.body_limit_bytes,
        idle: ext_proc::stream_idle_timeout(Duration::from_millis(
            config.upstream_headers_timeout_ms,
        )),
        stopping: stop.subscribe(),
    });
    Ok(Some((bound, listener, processor)))
}

/// Serves Envoy's external processing API on `listener` until the gateway stops: HTTP/2
/// pings bound a silent Envoy as the API listener's do, each stream bounds its own
/// silence.
async fn serve_ext_proc(listener: TcpListener, processor: ExtProc) {
    let mut stopping = processor.stopping();
    let stop = async move {
        let _ = stopping.wait_for(|s| *s).await;
    };
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let served = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(HTTP2_KEEP_ALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(HTTP2_KEEP_ALIVE_TIMEOUT))
        .serve_with_incoming_shutdown(processor.service(), incoming, stop)
        .await;
    if let Err(e) = served {
        tracing::error!(error = %e, "the Envoy external processor stopped");
    }
}
