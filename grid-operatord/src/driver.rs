//! Starts and owns every task of a running operator: the scrape loop, one poller per
//! peer, the mTLS signals listener, the feedback writer, `/metrics` and the mode watcher.
//!
//! Start-up order matters for correctness: the publisher epoch is persisted before the
//! scrape loop (the only publisher) starts, and the feedback state is restored before the
//! listener accepts its first report.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use grid_feedback::Receiver;
use grid_signals::site::{ProviderSpec, Site, SiteConfig};
use grid_signals::store::StoreConfig;
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;

use crate::Error;
pub use crate::bind::{HeldListener, PORT_PAIR_ATTEMPTS};
use crate::bind::{bind, bind_signals};
use crate::clock::Clock;
use crate::config::{Config, ConfigSource, PeerConfig, TransportMode};
use crate::feedback;
use crate::listener::{Listener, Timeouts};
use crate::live::Live;
use crate::metrics::{self, OperatorMetrics};
use crate::peers::PeerPoller;
use crate::providers::{ScrapeLoop, spec_of};
use crate::scrape::Scraper;
use crate::signals::SignalsService;
use crate::site_machine::SharedSignals;
use crate::slots::Slots;
use crate::state::{StartEpoch, StateStore, start_epoch};
use grid_daemon::tls::{self, Identity};

/// How often the declared signal transport mode is re-read.
pub const MODE_CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// How often the batch fences are persisted when they moved. A restart loses at most
/// this much fence progress; a batch admitted in that window could be admitted once more
/// after the restart, never an older one than the persisted fence.
pub const FENCE_PERSIST_INTERVAL: Duration = Duration::from_secs(5);

/// Knobs tests turn; the daemon uses the defaults.
#[derive(Clone, Debug)]
pub struct Options {
    /// Signals-listener timeouts.
    pub timeouts: Timeouts,
    /// How often the declared mode is re-read.
    pub mode_check: Duration,
    /// How often the fences are persisted.
    pub fence_persist: Duration,
    /// How often the certificate files are compared with what is presented.
    pub cert_check: Duration,
    /// The wall clock every stamp, epoch and deadline is read from: the system clock in
    /// the daemon; a stepped one in the fault suite's clock-step rows.
    pub clock: Clock,
    /// Loss and partitions of the membership socket (tests and the scale harness only).
    pub membership_faults: Option<Arc<crate::membership::LinkFaults>>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            timeouts: Timeouts::default(),
            mode_check: MODE_CHECK_INTERVAL,
            fence_persist: FENCE_PERSIST_INTERVAL,
            cert_check: tls::CERT_CHECK_INTERVAL,
            clock: Clock::system(),
            membership_faults: None,
        }
    }
}

/// A running operator. Dropping it stops every task.
#[derive(Debug)]
pub struct Running {
    /// Where the signals listener is bound (the configured port, or the one the OS chose
    /// for port 0).
    pub signals_addr: SocketAddr,
    /// Where `/metrics` is bound.
    pub metrics_addr: SocketAddr,
    /// This process's publisher epoch.
    pub epoch: u64,
    /// The stores.
    pub signals: SharedSignals,
    /// Series handles.
    pub metrics: OperatorMetrics,
    /// The registry `/metrics` renders.
    pub registry: Arc<Registry>,
    /// Certificate reloads (`grid_operator_certificate_reloads_total`).
    pub certificates: tls::ReloadMetrics,
    /// Each provider's latest readiness verdict (index order of the provider list being
    /// scraped), changed on every transition.
    pub verdicts: tokio::sync::watch::Receiver<crate::providers::Verdicts>,
    /// What a change taken over live is applied through.
    live: Live,
    /// Who membership says is live (never changes when membership does not run).
    pub membership: tokio::sync::watch::Receiver<crate::membership::View>,
    /// The membership series.
    pub membership_metrics: grid_membership::MembershipMetrics,
    /// Members refused for running another signal transport mode.
    pub mode_mismatch: crate::membership::ModeMismatch,
    state: Arc<dyn StateStore>,
    /// Held for the whole of every fence write, the blocking part included: an aborted
    /// periodic write still in flight finishes before the final one starts, so the final
    /// (newest) fences are the ones left on disk.
    fence_writes: Arc<tokio::sync::Mutex<()>>,
    tasks: JoinSet<Result<(), Error>>,
}

impl std::fmt::Debug for dyn StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateStore")
    }
}

impl Running {
    /// Waits until a task ends: normally never; the mode watcher ends with
    /// [`Error::ModeChanged`] when the declared mode no longer matches.
    pub async fn wait(&mut self) -> Result<(), Error> {
        match self.tasks.join_next().await {
            Some(Ok(result)) => result,
            Some(Err(e)) => Err(Error::Io {
                path: "task".into(),
                source: std::io::Error::other(e.to_string()),
            }),
            None => Ok(()),
        }
    }
}

impl Running {
    /// Takes `next` over from `running` (the configuration this operator runs) without
    /// restarting anything, in this process's epoch, when
    /// [`Config::takes_over_live`] allows it. Its providers are scraped and published
    /// from the next pass on: each unchanged provider's receivers go on learning, a
    /// changed one's reset on its new revision, a removed one is withdrawn with a last
    /// not-ready batch (grid-signals' `Site::reconfigure`). Under gossip its trust is in
    /// force from the next handshake and certificate check, and its peers are the seeds.
    ///
    /// # Errors
    ///
    /// `next` changes more than what is taken over live (the caller restarts instead),
    /// or material cannot be read (an `https` EPP's CA bundle, the new trust's CA);
    /// nothing changes then.
    pub fn reconfigure(&self, running: &Config, next: &Config) -> Result<(), Error> {
        if !running.takes_over_live(next) {
            return Err(Error::ConfigField {
                field: "(configuration)".into(),
                reason: "changes more than what a running operator takes over live".into(),
            });
        }
        self.live.apply(running, next)
    }

    /// Stops the operator the way the gateway stops: every task ends (scrapes, peer
    /// polls, the signals listener, `/metrics`, the mode watcher and the feedback writer,
    /// whose every persisted write is atomic, so none is left half written), then the
    /// batch fences are persisted once more, so a restart still refuses what this
    /// process admitted.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        self.tasks.shutdown().await;
        let writing = Arc::clone(&self.fence_writes).lock_owned().await;
        let fences = crate::site_machine::lock(&self.signals).export_fences();
        let state = self.state.clone();
        blocking(move || {
            let _writing = writing;
            state.store_fences(&fences)
        })
        .await
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Io {
            path: "state".into(),
            source: std::io::Error::other(e.to_string()),
        })?
}

/// Starts an operator from `config`, persisting through `state`; when `source` is given,
/// the declared mode is watched.
pub async fn start(
    config: Config,
    source: Option<Arc<dyn ConfigSource>>,
    state: Arc<dyn StateStore>,
    options: Options,
) -> Result<Running, Error> {
    start_with(config, source, state, options, Registry::default(), None).await
}

/// [`start`] with a registry already holding the caller's own series (the controller
/// mode's), which `/metrics` then serves beside the operator's, on `metrics` when given
/// (a listener the caller holds across starts, bound at `config.listen.metrics`).
///
/// The steps run in the order correctness needs: the site's identity and sockets first
/// (a bad certificate or a taken port fails before anything is persisted), then the
/// epoch is persisted and the feedback state restored (`restore`) before the scrape
/// loop, the only publisher, starts and before the listener accepts its first report.
pub async fn start_with(
    config: Config,
    source: Option<Arc<dyn ConfigSource>>,
    state: Arc<dyn StateStore>,
    options: Options,
    mut registry: Registry,
    metrics: Option<&HeldListener>,
) -> Result<Running, Error> {
    let identity = SiteIdentity::load(&config)?;
    let sockets = Sockets::bind(&config, metrics).await?;
    let clock = options.clock.clone();
    let restored = restore(&config, &state, &identity, &clock, &mut registry).await?;
    let Restored {
        epoch,
        signals,
        metrics,
        receiver,
    } = restored;
    let certificates =
        tls::ReloadMetrics::register(registry.sub_registry_with_prefix("grid_operator"));
    let mut tasks = JoinSet::new();
    let feedback = spawn_feedback(&mut tasks, receiver, &state, &metrics, &clock);
    let scraping = spawn_scrape_loop(&mut tasks, &config, &identity, &signals, &metrics, &clock);
    let mut peering = spawn_peering(
        &mut tasks,
        &mut registry,
        Peering {
            config: &config,
            identity: &identity,
            epoch,
            signals_addr: sockets.signals_addr,
            gossip_udp: sockets.gossip_udp,
            seeds: scraping.seeds.clone(),
            signals: &signals,
            metrics: &metrics,
            clock: &clock,
            state: &state,
            membership_faults: options.membership_faults.clone(),
        },
    )?;
    let registry = Arc::new(registry);
    let serving = Serving {
        config: &config,
        identity: &identity,
        epoch,
        signals: &signals,
        metrics: &metrics,
        clock: &clock,
        registry: &registry,
    };
    let (signals_addr, metrics_addr) = (sockets.signals_addr, sockets.metrics_addr);
    spawn_listeners(
        &mut tasks,
        &serving,
        sockets.listeners,
        feedback,
        &scraping,
        &mut peering,
        options.timeouts,
    );
    let fence_writes = Arc::new(tokio::sync::Mutex::new(()));
    tasks.spawn(persist_fences(
        signals.clone(),
        (state.clone(), Arc::clone(&fence_writes)),
        options.fence_persist,
        metrics.fence_persist_failures.clone(),
    ));
    watch_declarations(
        &mut tasks,
        (
            Arc::clone(&identity.certificate),
            Arc::clone(&scraping.live.trust),
            certificates.clone(),
        ),
        source.map(|s| (s, config.clone(), scraping.live.clone())),
        &options,
    );
    tracing::info!(site = %config.site, epoch, %signals_addr, %metrics_addr, "operator started");
    Ok(Running {
        signals_addr,
        metrics_addr,
        epoch,
        signals,
        metrics,
        registry,
        certificates,
        verdicts: scraping.verdicts,
        live: scraping.live,
        membership: peering.view,
        membership_metrics: peering.membership_metrics,
        mode_mismatch: peering.mode_mismatch,
        state,
        fence_writes,
        tasks,
    })
}

/// What the two listeners serve from.
struct Serving<'a> {
    config: &'a Config,
    identity: &'a SiteIdentity,
    epoch: u64,
    signals: &'a SharedSignals,
    metrics: &'a OperatorMetrics,
    clock: &'a Clock,
    registry: &'a Arc<Registry>,
}

/// Starts the signals listener (relay, ingest feedback, membership sessions, gossip
/// pulls, catalog) and the metrics listener (`/metrics`, probes, routing evidence).
fn spawn_listeners(
    tasks: &mut JoinSet<Result<(), Error>>,
    serving: &Serving<'_>,
    listeners: TcpListeners,
    feedback: feedback::FeedbackHandle,
    scraping: &Scraping,
    peering: &mut Peers,
    timeouts: Timeouts,
) {
    let Serving {
        config,
        identity,
        epoch,
        signals,
        metrics,
        clock,
        registry,
    } = *serving;
    let listener = Listener {
        tcp: listeners.signals,
        tls: identity.server_tls.clone(),
        trust: Arc::clone(&identity.trust),
        slots: Slots::new(),
        metrics: metrics.listener.clone(),
        timeouts,
        handler: Arc::new(SignalsService {
            signals: signals.clone(),
            feedback,
            metrics: metrics.ingest.clone(),
            refusals: metrics.refusals.clone(),
            served: metrics.served.clone(),
            feedback_metrics: metrics.feedback.clone(),
            clock: clock.clone(),
            membership: peering.endpoint.take(),
            gossip: config.transport == TransportMode::Gossip,
            catalog: scraping.catalog.clone(),
            long_polls: crate::signals::LongPolls::new(metrics.long_polls.clone()),
        }),
    };
    tasks.spawn(async move {
        listener.run().await;
        Ok(())
    });
    let evidence = Arc::new(crate::evidence::EvidenceSource {
        site: config.site.clone(),
        network: config.network.clone(),
        mode: config.transport.as_str(),
        epoch,
        configured: config.peers.iter().map(|p| p.name.clone()).collect(),
        verdicts: scraping.verdicts.clone(),
        scrapes: metrics.scrapes.clone(),
        signals: signals.clone(),
        ledger: metrics.polls.ledger.clone(),
        membership: peering.membership_runs.then(|| peering.view.clone()),
        ages_rejected: metrics.ages_rejected.clone(),
        clock: clock.clone(),
    });
    let (served, scrapes) = (registry.clone(), metrics.scrapes.clone());
    let metrics_tcp = listeners.metrics;
    tasks.spawn(async move {
        metrics::serve(metrics_tcp, served, scrapes, evidence).await;
        Ok(())
    });
}

/// The site's TLS identity and what it is read into: one presented certificate for the
/// listener and every peer poll (renewed in place), the trust the configuration
/// declares, and the providers with their EPP clients.
struct SiteIdentity {
    trust: Arc<tls::Trust>,
    certificate: Arc<tls::CertSlot>,
    server_tls: Arc<rustls::ServerConfig>,
    providers: Vec<crate::providers::ScrapedProvider>,
}

impl SiteIdentity {
    fn load(config: &Config) -> Result<Self, Error> {
        let material = crate::trust::material(&config.tls)?;
        let trust = Arc::new(crate::trust::trust_from_config(config, &material)?);
        let certificate = tls::CertSlot::new(&material, &config.tls.cert, &config.tls.key)?;
        let server_tls = tls::server_config_presenting(Arc::clone(&certificate), trust.clone())?;
        let providers = crate::live::scraped(config, &material)?;
        Ok(Self {
            trust,
            certificate,
            server_tls,
            providers,
        })
    }
}

/// The listeners: the signals TCP listener with its UDP twin (membership) on the same
/// port, and `/metrics`.
struct Sockets {
    listeners: TcpListeners,
    gossip_udp: tokio::net::UdpSocket,
    signals_addr: SocketAddr,
    metrics_addr: SocketAddr,
}

/// The two TCP listeners: signals and `/metrics`.
struct TcpListeners {
    signals: tokio::net::TcpListener,
    metrics: tokio::net::TcpListener,
}

impl Sockets {
    /// Binds what `config` lists; `/metrics` is served on `metrics` instead when it is
    /// given (already bound at `config.listen.metrics`).
    async fn bind(config: &Config, metrics: Option<&HeldListener>) -> Result<Self, Error> {
        let (signals_tcp, gossip_udp, signals_addr) = bind_signals(config.listen.signals).await?;
        let (metrics_tcp, metrics_addr) = match metrics {
            Some(held) => held.share()?,
            None => bind(config.listen.metrics).await?,
        };
        Ok(Self {
            listeners: TcpListeners {
                signals: signals_tcp,
                metrics: metrics_tcp,
            },
            gossip_udp,
            signals_addr,
            metrics_addr,
        })
    }
}

/// What this process resumes from: its publisher epoch (persisted before anything
/// publishes), the site machine with the persisted fences, the metrics, and the
/// feedback receiver restored from the persisted evidence.
struct Restored {
    epoch: u64,
    signals: SharedSignals,
    metrics: OperatorMetrics,
    receiver: Receiver,
}

async fn restore(
    config: &Config,
    state: &Arc<dyn StateStore>,
    identity: &SiteIdentity,
    clock: &Clock,
    registry: &mut Registry,
) -> Result<Restored, Error> {
    let now = clock.wall_ms();
    let Persisted {
        epoch: started,
        feedback: restored,
        fences,
    } = load_persisted(state, now).await?;
    let epoch = started.epoch;
    let signals: SharedSignals = SharedSignals::new(restored_site(config, epoch, now, fences));
    if config.transport == TransportMode::Gossip {
        // Under gossip this site's batches reach others through any member, so each
        // carries this site's signature; a receiver refuses an unsigned one.
        let signer = tls::SiteSigner::new(Arc::clone(&identity.certificate));
        if !signer.can_sign() {
            tracing::error!(
                cert = %config.tls.cert.display(),
                "the site certificate cannot sign batches (an unsupported key, or a chain of \
                 more than 3 certificates or one over 4096 bytes): every member will refuse \
                 this site's batches"
            );
        }
        crate::site_machine::lock(&signals).set_signer(Arc::new(signer));
    }
    let metrics = OperatorMetrics::register(registry, signals.clone(), clock.clone());
    report_epoch(&started, &metrics);
    let receiver = restore_receiver(restored, now, &metrics, config)?;
    Ok(Restored {
        epoch,
        signals,
        metrics,
        receiver,
    })
}

/// Starts the feedback writer on the restored receiver; the handle the listener hands
/// reports to.
fn spawn_feedback(
    tasks: &mut JoinSet<Result<(), Error>>,
    receiver: Receiver,
    state: &Arc<dyn StateStore>,
    metrics: &OperatorMetrics,
    clock: &Clock,
) -> feedback::FeedbackHandle {
    let (handle, task) = feedback::spawn(
        receiver,
        state.clone(),
        metrics.ages_rejected.clone(),
        clock.clone(),
    );
    tasks.spawn(async move {
        let _ = task.await;
        Ok(())
    });
    handle
}

/// What the scrape loop's start hands on: the live-change handles, each provider's
/// readiness verdicts, the membership seeds and the catalog body.
struct Scraping {
    live: Live,
    verdicts: tokio::sync::watch::Receiver<crate::providers::Verdicts>,
    seeds: tokio::sync::watch::Receiver<Vec<crate::live::Seed>>,
    catalog: tokio::sync::watch::Receiver<bytes::Bytes>,
}

fn spawn_scrape_loop(
    tasks: &mut JoinSet<Result<(), Error>>,
    config: &Config,
    identity: &SiteIdentity,
    signals: &SharedSignals,
    metrics: &OperatorMetrics,
    clock: &Clock,
) -> Scraping {
    let providers = identity.providers.clone();
    let (verdicts_tx, verdicts) = tokio::sync::watch::channel(
        providers
            .iter()
            .map(|p| crate::providers::Verdict {
                provider: p.config.clone(),
                readiness: None,
            })
            .collect(),
    );
    let (providers_tx, changes) = tokio::sync::watch::channel(providers.clone());
    let (seeds_tx, seeds) = tokio::sync::watch::channel(crate::live::seeds_of(config));
    let (catalog_tx, catalog) =
        tokio::sync::watch::channel(crate::live::catalog_body(&config.catalog));
    let live = Live {
        providers: Arc::new(providers_tx),
        trust: Arc::clone(&identity.trust),
        seeds: Arc::new(seeds_tx),
        catalog: Arc::new(catalog_tx),
    };
    let scrape_loop = ScrapeLoop {
        verdicts: verdicts_tx,
        changes,
        providers,
        scraper: Scraper::new(),
        signals: signals.clone(),
        metrics: metrics.scrapes.clone(),
        ingest: metrics.ingest.clone(),
        interval: config.scrape_interval,
        clock: clock.clone(),
    };
    tasks.spawn(async move {
        scrape_loop.run().await;
        Ok(())
    });
    Scraping {
        live,
        verdicts,
        seeds,
        catalog,
    }
}

/// Everything membership, gossip and the peer pollers start from.
struct Peering<'a> {
    config: &'a Config,
    identity: &'a SiteIdentity,
    epoch: u64,
    signals_addr: SocketAddr,
    gossip_udp: tokio::net::UdpSocket,
    seeds: tokio::sync::watch::Receiver<Vec<crate::live::Seed>>,
    signals: &'a SharedSignals,
    metrics: &'a OperatorMetrics,
    clock: &'a Clock,
    state: &'a Arc<dyn StateStore>,
    membership_faults: Option<Arc<crate::membership::LinkFaults>>,
}

/// What membership's start hands on: the session endpoint the listener serves (when
/// membership runs), who is live, and membership's series.
struct Peers {
    endpoint: Option<crate::membership::Endpoint>,
    view: tokio::sync::watch::Receiver<crate::membership::View>,
    membership_runs: bool,
    membership_metrics: grid_membership::MembershipMetrics,
    mode_mismatch: crate::membership::ModeMismatch,
}

/// Starts membership (and gossip under gossip mode) and, under poll mode, one poller per
/// configured peer and per member membership adopts.
fn spawn_peering(
    tasks: &mut JoinSet<Result<(), Error>>,
    registry: &mut Registry,
    p: Peering<'_>,
) -> Result<Peers, Error> {
    let Peering {
        config,
        identity,
        signals,
        metrics,
        clock,
        ..
    } = p;
    let membership_metrics = grid_membership::MembershipMetrics::register(registry);
    let mode_mismatch = crate::membership::ModeMismatch::register(registry, config.transport);
    tasks.spawn(state_mode_agreement(mode_mismatch.clone(), p.state.clone()));
    let gossiping = config.transport == TransportMode::Gossip;
    let gossip = gossiping.then(|| {
        crate::gossip::Gossip::new(
            config.site.clone(),
            signals.clone(),
            (metrics.ingest.clone(), metrics.gossip.clone()),
            clock.clone(),
            (Arc::clone(&identity.certificate), identity.trust.clone()),
        )
    });
    let (endpoint, view) = start_membership(
        tasks,
        MembershipStart {
            config,
            signals_addr: p.signals_addr,
            gossip_udp: p.gossip_udp,
            epoch: p.epoch,
            identity,
            seeds: p.seeds,
            metrics: membership_metrics.clone(),
            faults: p.membership_faults,
            modes: mode_mismatch.clone(),
            gossip,
        },
    )?;
    let membership_runs = endpoint.is_some();
    for peer in &config.peers {
        metrics.polls.add_peer(&peer.name);
    }
    if !gossiping {
        // Under gossip nothing is polled: batches are pulled as their versions are heard.
        let peers = config.peers.iter().cloned();
        let poller = peer_poller(config, identity, (signals, metrics, clock));
        let pollers = peers.map(&poller).collect::<Result<Vec<_>, _>>()?;
        let adopt: crate::peers::Adopt =
            Arc::new(move |site, url| poller(PeerConfig::new(site, url, Vec::new())).ok());
        let (peer_view, polls) = (view.clone(), metrics.polls.clone());
        let every = config.peer_poll_interval;
        tasks.spawn(async move {
            crate::peers::run_peer_set(pollers, adopt, peer_view, polls, every).await;
            Ok(())
        });
    }
    Ok(Peers {
        endpoint,
        view,
        membership_runs,
        membership_metrics,
        mode_mismatch,
    })
}

/// What membership starts from.
struct MembershipStart<'a> {
    config: &'a Config,
    signals_addr: SocketAddr,
    gossip_udp: tokio::net::UdpSocket,
    epoch: u64,
    identity: &'a SiteIdentity,
    seeds: tokio::sync::watch::Receiver<Vec<crate::live::Seed>>,
    metrics: grid_membership::MembershipMetrics,
    faults: Option<Arc<crate::membership::LinkFaults>>,
    modes: crate::membership::ModeMismatch,
    gossip: Option<crate::gossip::Gossip>,
}

/// Starts membership when this site has an identity peers can reach; its session
/// endpoint (when it runs) and who is live.
fn start_membership(
    tasks: &mut JoinSet<Result<(), Error>>,
    m: MembershipStart<'_>,
) -> Result<
    (
        Option<crate::membership::Endpoint>,
        tokio::sync::watch::Receiver<crate::membership::View>,
    ),
    Error,
> {
    let Some(own) = membership_identity(m.config, m.signals_addr, m.epoch) else {
        if m.gossip.is_some() {
            return Err(Error::ConfigField {
                field: "listen.advertise".into(),
                reason: "gossip mode needs the host peers reach this site at: set \
                         `listen.advertise` (in controller mode: the `signalsEndpoint` of \
                         the GridSite named after this site) or bind `listen.signals` to a \
                         specific IP"
                    .into(),
            });
        }
        tracing::warn!(
            "the signals listener binds an unspecified address and `listen.advertise` is \
             not set: membership does not run, configured peers are polled at their URLs"
        );
        // The sender goes at once: the peer set then keeps the configured URLs.
        let (_, rx) = tokio::sync::watch::channel(crate::membership::View::default());
        return Ok((None, rx));
    };
    let started = crate::membership::start(
        own,
        m.gossip_udp,
        m.seeds,
        (
            Arc::clone(&m.identity.certificate),
            m.identity.trust.clone(),
        ),
        m.metrics,
        m.gossip,
        (m.faults, m.modes),
    )
    .map_err(|e| Error::ConfigField {
        field: "listen.advertise".into(),
        reason: e.to_string(),
    })?;
    let driver = started.driver;
    tasks.spawn(async move {
        driver.run().await;
        Ok(())
    });
    Ok((Some(started.endpoint), started.view))
}

/// This site's membership identity: the advertised host (or the signals listener's IP
/// when it is a specific one), the advertised port (or the signals port) for both TCP and
/// UDP, and the publisher epoch as the incarnation, which rises on every restart.
fn membership_identity(
    config: &Config,
    signals_addr: SocketAddr,
    epoch: u64,
) -> Option<grid_membership::Member> {
    let host = match &config.advertise_host {
        Some(h) => h.clone(),
        None if !signals_addr.ip().is_unspecified() => signals_addr.ip().to_string(),
        None => return None,
    };
    let port = config.advertise_port.unwrap_or(signals_addr.port());
    Some(grid_membership::Member {
        site: config.site.clone(),
        host,
        signals_port: port,
        gossip_port: port,
        incarnation: epoch,
    })
}

/// Exports this process's epoch and says loudly when the persisted mark forced a clamp:
/// the site would otherwise keep serving with no hint that a clock stepped back.
fn report_epoch(started: &StartEpoch, metrics: &OperatorMetrics) {
    let epoch = started.epoch;
    metrics.epoch.set(epoch as i64);
    metrics
        .epoch_clamped
        .set(i64::from(started.clamped_lead_ms.is_some()));
    metrics
        .epoch_mark_lead
        .set(started.clamped_lead_ms.map_or(0.0, |ms| ms as f64 / 1000.0));
    if let Some(lead_ms) = started.clamped_lead_ms {
        tracing::error!(
            previous_mark = started.previous_mark,
            lead_ms,
            epoch,
            "the persisted publisher-epoch mark is more than 10 minutes ahead of the clock \
             (the clock stepped back across a restart): publishing at the clock plus 10 \
             minutes instead, the highest epoch receivers admit; check the host's clock"
        );
    }
}

/// What a start reads back from the state store.
struct Persisted {
    epoch: StartEpoch,
    feedback: Option<grid_feedback::ReceiverState>,
    fences: Option<grid_signals::batch::FenceSet>,
}

/// Persists this process's epoch (before anything can publish) and reads back the rest.
async fn load_persisted(state: &Arc<dyn StateStore>, now: u64) -> Result<Persisted, Error> {
    let started = {
        let state = state.clone();
        blocking(move || start_epoch(state.as_ref(), now)).await?
    };
    let feedback = {
        let state = state.clone();
        blocking(move || state.load_feedback()).await?
    };
    let fences = {
        let state = state.clone();
        blocking(move || state.load_fences()).await?
    };
    Ok(Persisted {
        epoch: started,
        feedback,
        fences,
    })
}

/// How often the members refused for another signal transport mode are compared with
/// what the state store last stated (controller mode: a `GridNetwork` condition).
pub const MODE_AGREEMENT_INTERVAL: Duration = Duration::from_secs(5);

/// States the mode agreement through the state store whenever the members in mismatch
/// change (and once at start); a failed write is logged and tried again at the next
/// check, and never stops the operator.
async fn state_mode_agreement(
    modes: crate::membership::ModeMismatch,
    state: Arc<dyn StateStore>,
) -> Result<(), Error> {
    let mut stated: Option<Vec<String>> = None;
    let mut tick = tokio::time::interval(MODE_AGREEMENT_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = modes.peers();
        if stated.as_ref() == Some(&now) {
            continue;
        }
        let (store, own, peers) = (state.clone(), modes.own(), now.clone());
        match tokio::task::spawn_blocking(move || store.store_mode_agreement(own, &peers)).await {
            Ok(Ok(())) => stated = Some(now),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "stating the signal transport mode agreement failed");
            }
            Err(e) => {
                tracing::warn!(error = %e, "stating the signal transport mode agreement failed");
            }
        }
    }
}

/// Builds the poller of one peer: a client presenting this site's certificate that
/// accepts only that peer, under the trust in force at each handshake.
fn peer_poller(
    config: &Config,
    identity: &SiteIdentity,
    (signals, metrics, clock): (&SharedSignals, &OperatorMetrics, &Clock),
) -> impl Fn(PeerConfig) -> Result<PeerPoller, Error> + Send + Sync + 'static {
    let (certificate, trust) = (
        Arc::clone(&identity.certificate),
        Arc::clone(&identity.trust),
    );
    let (signals, polls, ingest) = (
        signals.clone(),
        metrics.polls.clone(),
        metrics.ingest.clone(),
    );
    let (clock, interval) = (clock.clone(), config.peer_poll_interval);
    move |peer| {
        Ok(PeerPoller {
            fallback: None,
            tls: tls::client_config_presenting(
                Arc::clone(&certificate),
                trust.clone(),
                Identity::Peer(peer.name.clone()),
            )?,
            peer,
            signals: signals.clone(),
            metrics: polls.clone(),
            ingest: ingest.clone(),
            interval,
            clock: clock.clone(),
        })
    }
}

fn restore_receiver(
    restored: Option<grid_feedback::ReceiverState>,
    now: u64,
    metrics: &OperatorMetrics,
    config: &Config,
) -> Result<Receiver, Error> {
    match restored {
        Some(persisted) => {
            Receiver::restore(persisted, now, metrics.feedback.clone()).map_err(|e| {
                Error::StateCorrupt {
                    path: config.state_dir.join(crate::state::FEEDBACK_FILE),
                    reason: e.to_string(),
                }
            })
        }
        None => Ok(Receiver::new(now, metrics.feedback.clone())),
    }
}

/// The site machine for `config`'s providers, publishing in `epoch`.
fn site(config: &Config, epoch: u64, now: u64) -> Site {
    let providers: Vec<ProviderSpec> = config.providers.iter().map(spec_of).collect();
    let mut site = Site::new(
        SiteConfig {
            site: config.site.clone(),
            epoch,
            scrape_interval_ms: config.scrape_interval.as_millis() as u64,
            store: StoreConfig::default(),
        },
        &providers,
        now,
    );
    for (i, p) in config.providers.iter().enumerate() {
        site.set_unavailable(i, p.unavailable);
    }
    site
}

/// Writes the fences whenever they moved since the last write. A failed write is
/// logged and retried next time; it never stops the operator.
async fn persist_fences(
    signals: SharedSignals,
    (state, writes): (Arc<dyn StateStore>, Arc<tokio::sync::Mutex<()>>),
    every: Duration,
    failures: prometheus_client::metrics::counter::Counter,
) -> Result<(), Error> {
    let mut written = None;
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let fences = crate::site_machine::lock(&signals).export_fences();
        if written.as_ref() == Some(&fences) {
            continue;
        }
        let state = state.clone();
        let copy = fences.clone();
        let writing = Arc::clone(&writes).lock_owned().await;
        let write = move || {
            let _writing = writing;
            state.store_fences(&copy)
        };
        match tokio::task::spawn_blocking(write).await {
            Ok(Ok(())) => written = Some(fences),
            Ok(Err(e)) => {
                failures.inc();
                tracing::warn!(error = %e, "persisting batch fences failed");
            }
            Err(e) => {
                failures.inc();
                tracing::warn!(error = %e, "persisting batch fences failed");
            }
        }
    }
}

/// This site's machine at `epoch`, with the persisted fences (if any) imported.
fn restored_site(
    config: &Config,
    epoch: u64,
    now: u64,
    fences: Option<grid_signals::batch::FenceSet>,
) -> Site {
    let mut held = site(config, epoch, now);
    if let Some(fences) = fences {
        let import = held.import_fences(&fences, now);
        tracing::info!(
            applied = import.applied,
            refused = import.refused,
            "fences restored"
        );
    }
    held
}

/// Spawns what follows the files under a running operator: the certificate (renewed in
/// place, checked against the trust in force at each check) and, with a source, the
/// declared mode and, under poll, trust (either change ends the process for its
/// supervisor to restart), the providers and, under gossip, the trust (taken over live).
fn watch_declarations(
    tasks: &mut JoinSet<Result<(), Error>>,
    (slot, trust, reloads): (Arc<tls::CertSlot>, Arc<tls::Trust>, tls::ReloadMetrics),
    source: Option<(Arc<dyn ConfigSource>, Config, Live)>,
    options: &Options,
) {
    let every = options.cert_check;
    tasks.spawn(async move {
        tls::watch(slot, Some(trust), every, reloads).await;
        Ok(())
    });
    if let Some((source, running, live)) = source {
        tasks.spawn(watch_mode(source, running, live, options.mode_check));
    }
}

/// Ends with [`Error::ModeChanged`] once the source declares another mode than `running`,
/// or, under poll, [`Error::TrustChanged`] once it declares another trust; takes a change
/// [`Config::takes_over_live`] allows over live, the way the controller does.
async fn watch_mode(
    source: Arc<dyn ConfigSource>,
    mut running: Config,
    live: Live,
    every: Duration,
) -> Result<(), Error> {
    let transport = running.transport;
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut changes = Changes::default();
    let mut listed = Twice::default();
    // The CA bundle is followed by its bytes: a Secret update rewrites it in place, with
    // the same path and maybe the same modification time.
    let mut ca_in_force = ca_digest(&running).await;
    let mut ca_read = ca_in_force;
    // A declaration that cannot be read is said once, not at every check: it says so
    // again only once it reads another way.
    let mut unreadable: Option<String> = None;
    loop {
        ticker.tick().await;
        let ca_now = ca_digest(&running).await;
        let ca_changed = ca_now.is_some() && ca_now != ca_in_force;
        // Taken over once two checks in a row read the same new bytes (not half written).
        let ca_steady = ca_changed && ca_now == ca_read;
        ca_read = ca_now;
        let (a, b) = (source.clone(), source.clone());
        let seen = match tokio::task::spawn_blocking(move || a.declared_mode()).await {
            Ok(Ok(mode)) => {
                unreadable = None;
                (mode != transport.as_str()).then(|| Error::ModeChanged {
                    running: transport.as_str(),
                    declared: mode,
                })
            }
            Ok(Err(e)) => {
                let text = e.to_string();
                if unreadable.as_ref() != Some(&text) {
                    tracing::warn!(error = %text, "cannot re-read the declared mode");
                    unreadable = Some(text);
                }
                None
            }
            Err(_) => None,
        };
        // The file is read whole: one being edited fails validation and is read again at
        // the next check, never half applied.
        let loaded = match tokio::task::spawn_blocking(move || b.load()).await {
            Ok(Ok(config)) => Some(config),
            _ => None,
        };
        // Only the poll path restarts on a peer trust change (it judges peers only
        // under the trust it started with): under gossip the trust is taken over live.
        let seen = match (seen, &loaded) {
            (Some(change), _) => Some(change),
            (None, _) if transport == TransportMode::Gossip => None,
            (None, _) if ca_changed => Some(Error::TrustChanged { field: "tls.ca" }),
            (None, Some(config)) => running
                .trust_differs(config)
                .map(|field| Error::TrustChanged { field }),
            (None, None) => None,
        };
        if let Some(change) = changes.observe(seen) {
            return Err(change);
        }
        if ca_steady && transport == TransportMode::Gossip {
            match live.reload_ca(&running) {
                Ok(()) => ca_in_force = ca_now,
                Err(e) => {
                    tracing::warn!(error = %e, "the CA bundle changed in place but cannot be applied; keeping the running trust");
                }
            }
        }
        let next = loaded.filter(|c| running.takes_over_live(c));
        if let Some(next) = listed.observe(next) {
            match live.apply(&running, &next) {
                Ok(()) => {
                    running = next;
                    ca_in_force = ca_digest(&running).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the changed configuration cannot be applied; keeping the running one");
                }
            }
        }
    }
}

/// The SHA-256 of the CA bundle `config` names, when it names one that reads.
async fn ca_digest(config: &Config) -> Option<[u8; 32]> {
    let path = config.tls.ca.clone()?;
    tokio::task::spawn_blocking(move || tls::content_digest(&path).ok())
        .await
        .ok()
        .flatten()
}

/// A value acted on once two checks in a row read it (see [`Changes`]).
#[derive(Debug)]
struct Twice<T> {
    pending: Option<T>,
}

impl<T> Default for Twice<T> {
    fn default() -> Self {
        Self { pending: None }
    }
}

impl<T: PartialEq> Twice<T> {
    fn observe(&mut self, seen: Option<T>) -> Option<T> {
        let Some(seen) = seen else {
            self.pending = None;
            return None;
        };
        if self.pending.as_ref() == Some(&seen) {
            self.pending = None;
            return Some(seen);
        }
        self.pending = Some(seen);
        None
    }
}

/// A declared change is acted on when two checks in a row read it: a file caught half
/// written (an editor's truncate-then-write save reads as an empty file, whose absent
/// mode means gossip) must not stop the operator.
#[derive(Debug, Default)]
struct Changes {
    pending: Option<String>,
}

impl Changes {
    /// What this check read (a change, or none); the change to act on, if any.
    fn observe(&mut self, seen: Option<Error>) -> Option<Error> {
        let Some(change) = seen else {
            self.pending = None;
            return None;
        };
        let key = change.to_string();
        if self.pending.as_deref() == Some(key.as_str()) {
            return Some(change);
        }
        tracing::info!(change = %key, "the declaration changed; acting on it if the next check reads it too");
        self.pending = Some(key);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(declared: &str) -> Error {
        Error::ModeChanged {
            running: "poll",
            declared: declared.into(),
        }
    }

    #[test]
    fn a_change_read_once_is_not_acted_on_and_one_read_twice_in_a_row_is() {
        let mut changes = Changes::default();
        assert!(
            changes.observe(Some(mode("gossip"))).is_none(),
            "a half-written file"
        );
        assert!(changes.observe(None).is_none(), "the file is whole again");
        assert!(changes.observe(Some(mode("gossip"))).is_none());
        assert!(
            changes.observe(Some(mode("gossip"))).is_some(),
            "two checks in a row"
        );
    }

    #[test]
    fn a_different_change_on_the_next_check_starts_over() {
        let mut changes = Changes::default();
        assert!(changes.observe(Some(mode("gossip"))).is_none());
        let trust = Some(Error::TrustChanged { field: "peers" });
        assert!(changes.observe(trust).is_none());
        assert!(
            changes
                .observe(Some(Error::TrustChanged { field: "peers" }))
                .is_some()
        );
    }
}
