//! The signals side of a gateway on its own: the operator client, store, scorer and
//! feedback reporter, the certificate checks, and the routing slot they publish into.
//!
//! The daemon starts one beside its servers; a proxy that keeps its own HTTP server
//! (grid-pingora, `examples/embedded_proxy.rs`) embeds one directly and loads each
//! request's routing view from [`Signals::published`].
//!
//! # I/O boundary
//!
//! [`Signals::new`] reads the TLS files and builds the clients; [`Signals::spawn`]
//! starts the poll loop and the certificate checks on the caller's tokio runtime.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use grid_daemon::tls::{CertSlot, ReloadMetrics, Trust};
use grid_feedback::{Reporter, ReporterMetrics};
use grid_score::ScoreMetrics;
use grid_score::catalog::ModelSpec;
use grid_score::refresh::Refresher;
use grid_signals::store::{IngestMetrics, StoreConfig};
use prometheus_client::registry::Registry;
use rustls_pki_types::ServerName;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::Error;
use crate::config::Config;
use crate::poller::{self, PollMetrics, Poller, PollerConfig};
use crate::upstream::{self, Published};

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

/// The signals side on its own: operator client, store, scorer, reporter and the routing
/// slot they publish into. The daemon's driver uses it; a proxy that keeps its own HTTP server
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

    /// Where model lists go to be reloaded between two polls (what
    /// [`PollerTask::reload_models`] sends to, for a caller that follows a catalog).
    pub fn reloads(&self) -> mpsc::Sender<Vec<ModelSpec>> {
        self.reloads.clone()
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
            refresher.refresh(crate::clock::wall_ms()).view,
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

    /// The operator's client and base URL, for further requests to it (its catalog).
    pub fn operator(&self) -> (&upstream::HttpClient, &http::Uri) {
        (&self.operator.0, &self.operator.1)
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
