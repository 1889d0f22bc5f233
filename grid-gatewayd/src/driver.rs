//! The driver: owns the runtime pieces (listener, clients, poller task) and wires the
//! pure crates between them.
//!
//! Order matters: the listener is bound first, then the poller starts (a gateway polls
//! only while serving); on shutdown the poller stops first, then the listener drains.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use grid_daemon::tls::{CertSlot, ReloadMetrics, Trust};
use grid_feedback::{Reporter, ReporterMetrics};
use grid_score::ScoreMetrics;
use grid_signals::store::{IngestMetrics, StoreConfig};
use prometheus_client::registry::Registry;
use rustls_pki_types::ServerName;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::ext_proc::{self, ExtProc, ExtProcMetrics};
use crate::http_api::{Api, Inner};
use crate::poller::{PollMetrics, Poller, PollerConfig};
use crate::request_metrics::RequestMetrics;
use crate::site_slots::{SiteSlots, SlotsInUse};
use crate::upstream::Published;
use crate::{Error, poller, server, upstream};
use grid_score::catalog::ModelSpec;
use grid_score::refresh::Refresher;

/// Model reloads waiting for the poller (each is a whole model list).
pub const RELOAD_QUEUE: usize = 2;

/// Metric handles a test or an embedder may read directly.
#[derive(Clone, Debug)]
pub struct Handles {
    /// Poll results, shedding and routability per model.
    pub poll: PollMetrics,
    /// `grid_signals_ingest_dropped_total{reason}`.
    pub ingest: IngestMetrics,
    /// `grid_signals_feedback_failures_total{reason}`.
    pub feedback: ReporterMetrics,
}

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
            // Envoy holds its processor connection open; its streams end with their
            // requests, which the API's drain bound also bounds.
            if tokio::time::timeout(server::DRAIN_TIMEOUT, &mut task)
                .await
                .is_err()
            {
                tracing::warn!("the Envoy processor's drain timed out; closing it");
                task.abort();
            }
        }
    }
}

/// The signals side on its own: operator client, store, scorer, reporter and the routing
/// slot they publish into. [`start`] uses it; a proxy that keeps its own HTTP server
/// embeds it directly (see `examples/embedded_proxy.rs`).
pub struct Signals {
    reloads: mpsc::Sender<Vec<ModelSpec>>,
    certificate: Arc<CertSlot>,
    /// The client configuration toward remote sites, built from the same PEM read as
    /// the operator client's.
    sites_tls: rustls::ClientConfig,
    operator_trust: Option<Arc<Trust>>,
    /// `tls.ca`, followed by its bytes.
    ca: Option<Arc<grid_daemon::tls::CaBundle>>,
    cert_reloads: ReloadMetrics,
    published: Published,
    live_refresh: Arc<tokio::sync::Notify>,
    handles: Handles,
    score: ScoreMetrics,
    poller: Poller,
    /// The operator client and its URL, for following its catalog.
    operator: (upstream::HttpClient, http::Uri),
}

impl std::fmt::Debug for Signals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signals")
            .field("poller", &self.poller)
            .finish_non_exhaustive()
    }
}

/// A spawned poller: stop it before draining the listener.
#[derive(Debug)]
pub struct PollerTask {
    reloads: mpsc::Sender<Vec<ModelSpec>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Reporter>,
    certificates: JoinHandle<()>,
    /// The CA bundle's checks, when `tls.ca` is set.
    ca: Option<JoinHandle<()>>,
}

impl PollerTask {
    /// Replaces the routed models and candidates with `config`'s (a SIGHUP reload),
    /// between two polls: candidates kept keep what the gateway learned of them. Only
    /// `models` is reloaded; the rest of a configuration takes a restart.
    ///
    /// # Errors
    ///
    /// When `config` does not validate, or the poller has stopped.
    pub async fn reload_models(&self, config: &Config) -> Result<(), Error> {
        config.validate()?;
        self.reloads
            .send(config.catalog_specs())
            .await
            .map_err(|_| Error::ConfigField {
                field: "models".into(),
                reason: "the poller has stopped; nothing to reload".into(),
            })
    }

    /// Stops polling and the certificate checks, and returns the reporter (its evidence
    /// can be handed to a successor).
    pub async fn stop(self) -> Option<Reporter> {
        self.certificates.abort();
        if let Some(ca) = &self.ca {
            ca.abort();
        }
        let _ = self.stop.send(true);
        self.task.await.ok()
    }
}

impl Signals {
    /// Builds everything from `config` and registers the metrics in `registry`. The routing
    /// slot already holds a view (every candidate unmeasured); nothing runs until
    /// [`Signals::spawn`].
    pub fn new(config: &Config, registry: &mut Registry) -> Result<Self, Error> {
        let material = crate::trust::material(config)?;
        let certificate = crate::trust::certificate(config, &material)?;
        let ca = crate::trust::ca_bundle(config)?;
        let (operator_tls, operator_trust) =
            crate::trust::operator_tls(config, &material, ca.as_ref(), &certificate)?;
        let sites_tls = crate::trust::sites_tls(&material, ca.as_ref(), &certificate)?;
        let connect_timeout = Duration::from_millis(config.connect_timeout_ms);
        let operator_name =
            ServerName::try_from(config.operator.identity.clone()).map_err(|e| {
                Error::ConfigField {
                    field: "operator.identity".into(),
                    reason: e.to_string(),
                }
            })?;
        let operator = upstream::operator_client(operator_tls, operator_name, connect_timeout);
        let operator_uri = crate::config::parse_base_url("operator.url", &config.operator.url)?;

        let score = ScoreMetrics::register(registry.sub_registry_with_prefix("grid_gateway"));
        let cert_reloads =
            ReloadMetrics::register(registry.sub_registry_with_prefix("grid_gateway"));
        let handles = Handles {
            poll: PollMetrics::register(registry),
            ingest: IngestMetrics::register(registry),
            feedback: ReporterMetrics::register(registry),
        };
        let catalog = Arc::new(config.catalog());
        let mut refresher = Refresher::new(
            catalog,
            config.score_config(),
            StoreConfig::default(),
            Some(score.clone()),
        );
        let published: Published = Arc::new(ArcSwap::from_pointee(
            refresher.refresh(crate::clock::now_unix_ms()).view,
        ));
        let reporter = Reporter::new(
            poller::random_epoch()?,
            poller::replica(&config.operator.replica)?,
            handles.feedback.clone(),
        );
        let live_refresh = Arc::new(tokio::sync::Notify::new());
        let catalog_client = (operator.clone(), operator_uri.clone());
        let poller = Poller::new(
            PollerConfig {
                operator: operator_uri,
                interval: Duration::from_millis(config.operator.poll_interval_ms),
                poll_timeout: Duration::from_millis(config.operator.poll_timeout_ms),
                feedback_timeout: Duration::from_millis(config.operator.feedback_timeout_ms),
            },
            operator,
            refresher,
            reporter,
            Arc::clone(&published),
            handles.ingest.clone(),
            handles.poll.clone(),
            Arc::clone(&live_refresh),
        );
        // A few pending reloads at most: each replaces the whole model list, so only the
        // newest matters and a sender waits rather than queueing more.
        let (reloads, reloaded) = mpsc::channel(RELOAD_QUEUE);
        let prober = upstream::site_client(sites_tls.clone(), connect_timeout);
        let poller = poller.with_reloads(reloaded).with_prober(prober);
        Ok(Self {
            reloads,
            certificate,
            sites_tls,
            operator_trust,
            ca,
            cert_reloads,
            published,
            live_refresh,
            handles,
            score,
            poller,
            operator: catalog_client,
        })
    }

    /// What the request path wakes after a response carried live evidence.
    pub fn live_refresh(&self) -> &Arc<tokio::sync::Notify> {
        &self.live_refresh
    }

    /// The slot requests load their routing view from.
    pub fn published(&self) -> &Published {
        &self.published
    }

    /// grid-score's metric handles, for counting decisions on the request path.
    pub fn score_metrics(&self) -> &ScoreMetrics {
        &self.score
    }

    /// Metric handles of the poll loop.
    pub fn handles(&self) -> &Handles {
        &self.handles
    }

    /// The site's certificate as this gateway presents it (to its operator and to remote
    /// sites): build any further client with it so a renewal reaches that client too.
    pub fn certificate(&self) -> &Arc<CertSlot> {
        &self.certificate
    }

    /// The client configuration toward remote sites (the grid CA, the URL's host, the
    /// site's certificate from [`Signals::certificate`]), for a proxy's site client.
    pub fn sites_tls(&self) -> &rustls::ClientConfig {
        &self.sites_tls
    }

    /// Starts polling and checking the certificate files (every
    /// [`grid_daemon::tls::CERT_CHECK_INTERVAL`] and on SIGHUP). Call once the listener is
    /// up: a gateway polls only while serving.
    pub fn spawn(self) -> PollerTask {
        let (stop, stopped) = watch::channel(false);
        let ca = self.ca.map(|bundle| {
            tokio::spawn(grid_daemon::tls::watch_ca(
                bundle,
                self.operator_trust.clone(),
                grid_daemon::tls::CERT_CHECK_INTERVAL,
            ))
        });
        let certificates = tokio::spawn(grid_daemon::tls::watch(
            self.certificate,
            self.operator_trust,
            grid_daemon::tls::CERT_CHECK_INTERVAL,
            self.cert_reloads,
        ));
        PollerTask {
            reloads: self.reloads,
            stop,
            task: tokio::spawn(self.poller.run(stopped)),
            certificates,
            ca,
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
    let listener_metrics = server::ListenerMetrics::register(&mut registry);
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
    let ext_proc_listener =
        bind_ext_proc(&config, &signals, request_metrics.clone(), ext_proc_metrics).await?;
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
        waits: crate::http_api::UpstreamWaits {
            slot: Duration::from_millis(config.connect_timeout_ms),
            headers: Duration::from_millis(config.upstream_headers_timeout_ms),
            idle: Duration::from_millis(config.upstream_idle_timeout_ms),
        },
        registry,
        poll: handles.poll.clone(),
        site: config.site.as_str().into(),
        retry_budget: Arc::clone(&retry_budget),
    });
    let (stop, mut stopped) = watch::channel(false);
    let ext_proc = ext_proc_listener.map(|(bound, listener, processor)| {
        let mut stopped = stop.subscribe();
        let task = tokio::spawn(serve_ext_proc(listener, processor, async move {
            let _ = stopped.wait_for(|s| *s).await;
        }));
        tracing::info!(%bound, "Envoy external processor serving");
        (bound, task)
    });
    let server = tokio::spawn(server::serve(
        listener,
        api,
        limits_of(&config),
        listener_metrics,
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        },
    ));
    tracing::info!(%local_addr, site = %config.site, "gateway serving");
    let catalog_client = signals.operator.clone();
    let poller = signals.spawn();
    if config.operator.catalog {
        let follow = FollowCatalog {
            client: catalog_client.0,
            uri: catalog_client.1,
            template: config.clone(),
            reloads: poller.reloads.clone(),
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
fn limits_of(config: &Config) -> server::Limits {
    server::Limits {
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
            budget.sample(crate::clock::now_unix_ms(), metrics.requests_total());
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

/// Path of the operator's catalog (`operator.catalog = true`).
pub const CATALOG_PATH: &str = "/v1/site/catalog";

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
    metrics: RequestMetrics,
    ext_proc: ExtProcMetrics,
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
        metrics,
        score: signals.score_metrics().clone(),
        ext_proc,
        body_limit: config.body_limit_bytes,
        idle: ext_proc::stream_idle_timeout(Duration::from_millis(
            config.upstream_headers_timeout_ms,
        )),
    });
    Ok(Some((bound, listener, processor)))
}

/// Serves Envoy's external processing API on `listener` until `stop`: HTTP/2 pings bound
/// a silent Envoy as the API listener's do, each stream bounds its own silence.
async fn serve_ext_proc(listener: TcpListener, processor: ExtProc, stop: impl Future<Output = ()>) {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let served = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(server::HTTP2_KEEP_ALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(server::HTTP2_KEEP_ALIVE_TIMEOUT))
        .serve_with_incoming_shutdown(processor.service(), incoming, stop)
        .await;
    if let Err(e) = served {
        tracing::error!(error = %e, "the Envoy external processor stopped");
    }
}
