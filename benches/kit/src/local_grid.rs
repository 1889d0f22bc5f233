//! A whole grid on loopback in one process: per site a backend (a simulated site, or any
//! server that answers the OpenAI-style routes and EPP `/metrics`), the REAL `grid-operatord`
//! driver scraping it, and one REAL `grid-gatewayd` driver at the first site.
//!
//! ```text
//! site[0] backend <-scrape- operator[0] <-poll (gateway cadence)- gateway --proxy--> any site
//! site[i] backend <-scrape- operator[i] <-peer poll (peer cadence)- operator[0]
//! ```
//!
//! The first site is the gateway's own ("local"): its readings reach the gateway after one
//! scrape and one gateway poll. Every other site is seen only through its own operator,
//! which the first operator polls as a peer ("remote"), so its readings also wait for a peer poll.
//! Trust is SPIFFE over certificates minted at start into a temporary directory that is
//! removed when the grid is dropped. Everything listens on 127.0.0.1.
//!
//! Started with [`LocalGrid::start_with_links`], every remote site sits behind two
//! [`FaultRelay`]s, a WAN between it and `site[0]`: one in front of its operator's signals
//! listener (`operator[0]`'s peer polls cross it) and one in front of its backend (the
//! gateway's proxied requests cross it). Each site's own operator still scrapes its
//! backend directly, as a co-located operator does. The relays are TCP-level, so TLS
//! passes through; the peer URL names the relay's `127.0.0.1`, which the site
//! certificates carry as an IP SAN.
//!
//! With [`Links::namespaces`], every remote site runs in a network namespace of its own
//! ([`Netns`]): its backend, its operator and its two relays listen on the namespace's end
//! of a veth link, and its operator reaches `operator[0]` through a third relay on the
//! link's outside end. Everything between the site and `site[0]` then crosses the link,
//! so [`LocalGrid::set_link`] can partition the site the way a WAN does: packets
//! dropped, no reset, no refusal.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use grid_gateway::Config as GatewayConfig;
use grid_gateway::config::{
    Candidate, OperatorConfig as GatewayOperator, Shedding as GatewayShedding,
    TlsFiles as GatewayTls,
};
use grid_operatord::clock::Clock;
pub use grid_operatord::config::TransportMode;
use grid_operatord::config::{
    Config as OperatorConfig, DEFAULT_METRICS_PATH, Listen, PeerConfig, ProviderConfig,
    TlsFiles as OperatorTls, TrustMode,
};
use grid_operatord::state::{FileStateStore, StateStore};
use grid_score::CandidateState;
use grid_score::routing::RoutingView;
use tempfile::TempDir;

use crate::Error;
use crate::clock::Stopwatch;
use crate::fault_relay::{Delay, FaultControl, FaultRelay, WAN};
use crate::netns::{Netns, NsRuntime};
use crate::pki::{Ca, LOOPBACK_NAME, SiteFiles, TRUST_DOMAIN};
use crate::sim_site::{SimSite, SimSiteConfig, SimSiteControl};
use grid_sim::fake_epp::EppIdentity;
use grid_sim::site_model::{ServiceTime, SiteConfig};

/// The provider name every site's operator publishes its backend under.
pub const PROVIDER: &str = "pool";

/// How often each daemon looks: the defaults are the spec's, tests use [`Cadence::FAST`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cadence {
    /// Each operator's EPP scrape interval.
    pub scrape_ms: u64,
    /// The first operator's peer poll interval.
    pub peer_poll_ms: u64,
    /// The gateway's operator poll interval.
    pub gateway_poll_ms: u64,
}

impl Cadence {
    /// The daemons' defaults: scrape 1 s, peer poll 5 s, gateway poll 1 s.
    pub const DEFAULT: Self = Self {
        scrape_ms: 1_000,
        peer_poll_ms: 5_000,
        gateway_poll_ms: 1_000,
    };
    /// Short intervals for tests: scrape 200 ms, peer poll 500 ms, gateway poll 200 ms.
    pub const FAST: Self = Self {
        scrape_ms: 200,
        peer_poll_ms: 500,
        gateway_poll_ms: 200,
    };
}

/// The gateway's `[availability.shedding]` when shedding is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shedding {
    /// `full_after_ms`.
    pub full_after_ms: u64,
    /// `room_after_ms`.
    pub room_after_ms: u64,
    /// `retry_after_s`.
    pub retry_after_s: u64,
}

/// What serves a site's requests and `/metrics`.
#[derive(Clone, Debug)]
pub enum Backend {
    /// A simulated site started by the grid.
    Simulated(SimSiteConfig),
    /// A server already running at this `http://host:port` base URL.
    External(String),
}

/// One site of the grid.
#[derive(Clone, Debug)]
pub struct SiteSpec {
    /// The site name (a DNS label).
    pub name: String,
    /// Its backend.
    pub backend: Backend,
}

impl SiteSpec {
    /// A simulated site (named as `site` is) serving `model` in a steady `median_ms` per
    /// request (no spread, eight output tokens, a fifth of the time prefill), its EPP
    /// honest and its capacity read live: the site most end-to-end tests want.
    pub fn simulated(mut site: SiteConfig, model: &str, median_ms: f64, seed: u64) -> Self {
        site.service = ServiceTime {
            median_ms,
            sigma: 0.0,
            prefill_share: 0.2,
            output_tokens: 8,
        };
        Self {
            name: site.name.clone(),
            backend: Backend::Simulated(SimSiteConfig {
                identity: EppIdentity::new(&site.name, model),
                site,
                seed,
                spoof_flow_headers: false,
                capacity_reader: crate::sim_site::CapacityReaderMode::Live,
            }),
        }
    }
}

/// The whole grid.
#[derive(Clone, Debug)]
pub struct GridSpec {
    /// The model every site serves.
    pub model: String,
    /// The sites; the first is the gateway's.
    pub sites: Vec<SiteSpec>,
    /// The daemons' cadences.
    pub cadence: Cadence,
    /// How the operators carry signals between sites: polls (the peer polls a remote
    /// site's relays can delay) or gossip (membership datagrams, which no relay carries).
    pub transport: TransportMode,
    /// Shedding, when on.
    pub shedding: Option<Shedding>,
}

impl GridSpec {
    /// `sites` serving `model` at the daemons' default cadences, signals carried by
    /// `transport`, without shedding.
    pub fn at_default_cadences(
        model: &str,
        sites: Vec<SiteSpec>,
        transport: TransportMode,
    ) -> Self {
        Self {
            model: model.to_owned(),
            sites,
            cadence: Cadence::DEFAULT,
            transport,
            shedding: None,
        }
    }
}

/// The WAN between `site[0]` and every remote site: what [`LocalGrid::start_with_links`]
/// puts in each remote site's two relays at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Links {
    /// The one-way delay each relay adds in each direction.
    pub delay: Delay,
    /// Seeds the relays' jitter (each relay gets its own seed derived from it).
    pub seed: u64,
    /// Whether each remote site runs in a network namespace of its own (needs root and
    /// iproute2): see the module docs.
    pub namespaces: bool,
}

impl Links {
    /// 20-80 ms each way ([`WAN`]), the relays' jitter seeded with 1.
    pub const WAN: Self = Self {
        delay: WAN,
        seed: 1,
        namespaces: false,
    };
}

/// The control handles of a remote site's two relays.
#[derive(Clone, Debug)]
pub struct SiteLink {
    /// In front of the site operator's signals listener: `operator[0]`'s peer polls.
    pub peer: FaultControl,
    /// In front of the site's backend: the gateway's proxied requests.
    pub backend: FaultControl,
}

impl SiteLink {
    /// Applies `f` to both relays.
    pub fn both(&self, f: impl Fn(&FaultControl)) {
        f(&self.peer);
        f(&self.backend);
    }
}

/// A remote site's relays, kept alive with it.
struct RunningLink {
    peer: FaultRelay,
    backend: FaultRelay,
    /// On the outside end of a namespaced site's link, in front of `operator[0]`: the
    /// site's own peer polls cross it.
    uplink: Option<FaultRelay>,
}

/// How many times, 100 ms apart, a restarted operator retries binding the signals port
/// its predecessor held (the aborted predecessor closes its listener asynchronously).
pub const REBIND_ATTEMPTS: u32 = 50;

/// One running site.
struct RunningSite {
    name: String,
    sim: Option<SimSite>,
    base_url: String,
    /// `None` while stopped by [`LocalGrid::stop_operator`].
    operator: Option<grid_operatord::driver::Running>,
    /// The configuration it runs with, its listeners fixed at the addresses first bound,
    /// so a restart serves where peers and relays already point.
    config: OperatorConfig,
    state_dir: PathBuf,
    link: Option<RunningLink>,
    /// Its operator's wall clock, kept across restarts (a restarted process still reads
    /// the host's clock, stepped or not).
    clock: Clock,
    /// A namespaced site's operator runs on a single-threaded runtime of its own, a
    /// process as far as its tasks can tell: [`LocalGrid::freeze_operator`] stops it.
    operator_runtime: Option<NsRuntime>,
    /// The namespace it runs in, if any. Last, so it is dropped after everything that
    /// runs inside it.
    netns: Option<Netns>,
}

/// How long one request takes at a site [`LocalGrid::back_up`] backed up.
pub const BACKED_UP_SERVICE: Duration = Duration::from_secs(4);
/// How many times over [`LocalGrid::back_up`] keeps a site's slots filled: a request
/// queued behind the whole backlog waits this many turns of [`BACKED_UP_SERVICE`] (20 s)
/// and is served in one more, inside the openai client's
/// [`REQUEST_TIMEOUT`](crate::openai_client::REQUEST_TIMEOUT), so a check that allows a
/// few requests onto the backed-up site sees them answered rather than timed out.
pub const BACKLOG_TURNS: u32 = 5;
/// The bound on each request [`LocalGrid::back_up`] holds: past a wait behind the whole
/// backlog and its own turn.
pub const BACKLOG_HELD_FOR: Duration = Duration::from_secs(40);
/// How long [`LocalGrid::back_up`] keeps the backlog up at most (each held request sent
/// again as it ends): past a front end's first sight of the queue
/// ([`SEEN_WITHIN`](crate::front_end_checks::SEEN_WITHIN)) and a whole run of the openai
/// client ([`CLIENT_TIMEOUT`](crate::openai_client::CLIENT_TIMEOUT)). A backlog sent once
/// drains in its turns: a check whose requests outlast it (one drawn onto the site waits
/// behind all of it) measured a slow site with an empty queue instead.
pub const BACKLOG_KEPT_FOR: Duration = Duration::from_secs(120);

/// Where a site stands in the gateway's current routing view.
#[derive(Clone, Debug, PartialEq)]
pub enum SiteRouting {
    /// Healthy: selectable, with the scorer's figures.
    Candidate {
        /// Room, no room, full or unmeasured.
        state: CandidateState,
        /// Latest smoothed rho (infinite when unmeasured).
        rho: f64,
        /// Learned capacity, in requests: what the site has shown it holds, as `/metrics`
        /// reports it.
        capacity: f64,
        /// Recent worst rho, the ordering key.
        score: f64,
    },
    /// Out of selection, with the reason's metric label.
    Excluded(&'static str),
    /// Not in the view at all (model unknown to the view).
    Absent,
}

impl SiteRouting {
    /// Whether a pick can choose this site.
    pub fn selectable(&self) -> bool {
        matches!(self, Self::Candidate { .. })
    }

    /// Whether the site has a fresh reading (measured, or excluded by one).
    pub fn measured(&self) -> bool {
        match self {
            Self::Candidate { state, .. } => *state != CandidateState::Unmeasured,
            Self::Excluded(_) => true,
            Self::Absent => false,
        }
    }
}

/// A running local grid. Dropping it stops every part; [`LocalGrid::shutdown`] also
/// drains the gateway and waits for the simulated sites.
pub struct LocalGrid {
    model: String,
    sites: Vec<RunningSite>,
    gateway: Option<grid_gatewayd::driver::Running>,
    /// The CA every site certificate chains to, kept to mint renewals.
    ca: Ca,
    /// The gateway's configuration in the file dialect, `{listen}` left to fill in.
    gateway_file: String,
    dir: TempDir,
}

impl std::fmt::Debug for LocalGrid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalGrid")
            .field("model", &self.model)
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

fn signals_url(addr: SocketAddr) -> String {
    format!("https://{addr}/v1/site/signals")
}

/// The operator configuration of one site.
fn operator_config(
    site: &str,
    files: &SiteFiles,
    state_dir: &Path,
    signals: SocketAddr,
    cadence: Cadence,
    peers: &[(&str, String)],
    backend_url: &str,
) -> Result<OperatorConfig, Error> {
    let listen = Listen {
        signals,
        metrics: SocketAddr::from((signals.ip(), 0)),
    };
    let tls = OperatorTls {
        cert: files.cert.clone(),
        key: files.key.clone(),
        ca: Some(files.ca.clone()),
    };
    let trust = TrustMode::Spiffe {
        trust_domain: TRUST_DOMAIN.to_owned(),
    };
    let mut config = OperatorConfig::new(site, "local", listen, tls, trust, state_dir);
    config.scrape_interval = Duration::from_millis(cadence.scrape_ms);
    config.peer_poll_interval = Duration::from_millis(cadence.peer_poll_ms);
    for (name, url) in peers {
        let mut peer = PeerConfig::new(*name, uri(url)?, Vec::new());
        peer.timeout = Duration::from_millis(cadence.peer_poll_ms.clamp(1_000, 2_000));
        config = config.with_peer(peer);
    }
    let mut provider = ProviderConfig::new(
        site,
        PROVIDER,
        uri(&format!(
            "{}{}",
            backend_url.trim_end_matches('/'),
            DEFAULT_METRICS_PATH
        ))?,
    );
    provider.timeout = Duration::from_millis(cadence.scrape_ms.clamp(500, 1_000));
    let config = config.with_provider(provider);
    config.validate()?;
    Ok(config)
}

/// `config` carrying signals by `transport`; under gossip its peers are its seeds.
fn with_transport(
    mut config: OperatorConfig,
    transport: TransportMode,
) -> Result<OperatorConfig, Error> {
    config.transport = transport;
    config.validate()?;
    Ok(config)
}

fn uri(text: &str) -> Result<http::Uri, Error> {
    text.parse().map_err(|_| {
        grid_sim::Error::InvalidConfig {
            field: "url",
            reason: "a URL the local grid builds must parse",
        }
        .into()
    })
}

/// The gateway configuration at `site[0]`.
fn gateway_config(
    spec: &GridSpec,
    files: &SiteFiles,
    operator: SocketAddr,
    base_urls: &[(&str, &str)],
) -> Result<GatewayConfig, Error> {
    let mut op = GatewayOperator::new(format!("https://{operator}"), LOOPBACK_NAME);
    op.poll_interval_ms = spec.cadence.gateway_poll_ms;
    let tls = GatewayTls::new(&files.cert, &files.key, Some(&files.ca));
    let mut config = GatewayConfig::new(
        spec.sites[0].name.clone(),
        SocketAddr::from(([127, 0, 0, 1], 0)),
        op,
        tls,
    )
    .with_model(
        spec.model.clone(),
        base_urls
            .iter()
            .map(|(site, url)| Candidate::new(*site, PROVIDER, *url)),
    );
    if let Some(s) = spec.shedding {
        config.availability.shedding = GatewayShedding {
            enabled: true,
            full_after_ms: Some(s.full_after_ms),
            room_after_ms: Some(s.room_after_ms),
            retry_after_s: Some(s.retry_after_s),
        };
    }
    config.validate()?;
    Ok(config)
}

/// The gateway configuration at `site[0]` in the file dialect (`docs/gateway.md`), with
/// `{listen}` where its address goes: what a proxy embedding grid (`grid-pingora`) and the
/// gateway daemon run as a process read.
pub fn gateway_file(
    spec: &GridSpec,
    files: &SiteFiles,
    operator: SocketAddr,
    base_urls: &[(&str, &str)],
) -> String {
    use std::fmt::Write as _;
    let mut text = format!(
        "site = \"{site}\"\nlisten = \"{{listen}}\"\n[operator]\nurl = \"https://{operator}\"\n\
         identity = \"{LOOPBACK_NAME}\"\npollIntervalSeconds = {poll}\n[tls]\ncert = \"{cert}\"\n\
         key = \"{key}\"\nca = \"{ca}\"\n",
        site = spec.sites[0].name,
        poll = spec.cadence.gateway_poll_ms as f64 / 1000.0,
        cert = files.cert.display(),
        key = files.key.display(),
        ca = files.ca.display(),
    );
    if let Some(s) = spec.shedding {
        let _ = write!(
            text,
            "[availability.shedding]\nenabled = true\nfullAfterSeconds = {}\nroomAfterSeconds = {}\nretryAfterSeconds = {}\n",
            s.full_after_ms as f64 / 1000.0,
            s.room_after_ms as f64 / 1000.0,
            s.retry_after_s
        );
    }
    let _ = write!(text, "[[models]]\nname = \"{}\"\n", spec.model);
    for (site, url) in base_urls {
        let _ = write!(
            text,
            "[[models.candidates]]\nsite = \"{site}\"\nprovider = \"{PROVIDER}\"\nbaseUrl = \"{url}\"\n"
        );
    }
    text
}

/// Starts an operator; returns it with its configuration, the listeners fixed at the
/// addresses bound (so a restart binds the same ones).
async fn start_operator(
    mut config: OperatorConfig,
    state_dir: &Path,
    clock: &Clock,
) -> Result<(grid_operatord::driver::Running, OperatorConfig), Error> {
    let state: Arc<dyn StateStore> = Arc::new(FileStateStore::open(state_dir)?);
    let options = grid_operatord::driver::Options {
        clock: clock.clone(),
        ..grid_operatord::driver::Options::default()
    };
    let running = grid_operatord::driver::start(config.clone(), None, state, options).await?;
    config.listen.signals = running.signals_addr;
    config.listen.metrics = running.metrics_addr;
    Ok((running, config))
}

/// Runs `f` where a site lives: on a runtime of its namespace (so every socket it opens
/// is in there), or right here.
async fn run_in<T: Send + 'static>(
    runtime: Option<&tokio::runtime::Handle>,
    f: impl Future<Output = Result<T, Error>> + Send + 'static,
) -> Result<T, Error> {
    match runtime {
        None => f.await,
        Some(rt) => rt
            .spawn(f)
            .await
            .map_err(|e| Error::Request(format!("in a namespace: {e}")))?,
    }
}

/// The address a site's listeners bind: its namespace's end of the link, or loopback.
fn site_ip(netns: Option<&Netns>) -> std::net::Ipv4Addr {
    netns.map_or(std::net::Ipv4Addr::LOCALHOST, Netns::ns_addr)
}

/// Starts every simulated backend, each where its site lives; returns each site's
/// backend and base URL.
async fn start_backends(
    spec: &GridSpec,
    netns: &[Option<Netns>],
) -> Result<Vec<(Option<SimSite>, String)>, Error> {
    let mut backends = Vec::with_capacity(spec.sites.len());
    for (s, ns) in spec.sites.iter().zip(netns) {
        backends.push(match &s.backend {
            Backend::Simulated(config) => {
                let (ip, config) = (site_ip(ns.as_ref()), config.clone());
                let sim = run_in(ns.as_ref().map(Netns::handle), async move {
                    SimSite::start_on(ip, config).await
                })
                .await?;
                let url = sim.url("");
                (Some(sim), url)
            }
            Backend::External(url) => (None, url.clone()),
        });
    }
    Ok(backends)
}

/// Starts remote site `index`'s two relays where the site lives, with the WAN delay in
/// force.
async fn start_link(
    links: Links,
    index: usize,
    signals: SocketAddr,
    backend_url: &str,
    netns: Option<&Netns>,
) -> Result<RunningLink, Error> {
    let seed = links
        .seed
        .wrapping_mul(0x100)
        .wrapping_add(index as u64 * 3);
    let (ip, backend) = (site_ip(netns), socket_addr_of(backend_url)?);
    let (peer, backend) = run_in(netns.map(Netns::handle), async move {
        let peer = FaultRelay::start_on(ip, signals, seed).await?;
        let backend = FaultRelay::start_on(ip, backend, seed + 1).await?;
        Ok((peer, backend))
    })
    .await?;
    peer.control().set_delay_both(links.delay);
    backend.control().set_delay_both(links.delay);
    Ok(RunningLink {
        peer,
        backend,
        uplink: None,
    })
}

/// For a namespaced site: a relay on the outside end of its link in front of
/// `operator[0]` (whose listener is on this loopback, out of the namespace's reach), with
/// the WAN delay; returns it and the URL the site's operator polls.
async fn start_uplink(
    links: Links,
    index: usize,
    netns: &Netns,
    local: SocketAddr,
) -> Result<(FaultRelay, String), Error> {
    let seed = links
        .seed
        .wrapping_mul(0x100)
        .wrapping_add(index as u64 * 3 + 2);
    let relay = FaultRelay::start_on(netns.host_addr(), local, seed).await?;
    relay.control().set_delay_both(links.delay);
    let url = signals_url(relay.addr());
    Ok((relay, url))
}

/// The `host:port` of an `http://host:port` base URL, as a socket address.
fn socket_addr_of(base_url: &str) -> Result<SocketAddr, Error> {
    base_url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .map_err(|_| {
            grid_sim::Error::InvalidConfig {
                field: "backend",
                reason: "a linked backend must be an http://ip:port base URL",
            }
            .into()
        })
}

/// The grid's temporary directory, its CA, and every site's certificate files in it.
fn mint(spec: &GridSpec) -> Result<(TempDir, Ca, Vec<SiteFiles>), Error> {
    let dir = tempfile::Builder::new()
        .prefix("grid-local-")
        .tempdir()
        .map_err(|source| Error::Write {
            path: std::env::temp_dir(),
            source,
        })?;
    let ca = Ca::try_new("grid local CA")?;
    let files = spec
        .sites
        .iter()
        .map(|s| ca.write_site(dir.path(), &s.name))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((dir, ca, files))
}

/// A started operator with what a restart needs: its configuration (listeners fixed),
/// state directory, clock and, for a namespaced site, its own runtime.
type StartedOperator = (
    grid_operatord::driver::Running,
    OperatorConfig,
    PathBuf,
    Clock,
    Option<NsRuntime>,
);

/// Where a remote site sits in the grid being started.
struct RemotePlace<'a> {
    index: usize,
    name: &'a str,
    files: &'a SiteFiles,
    state: PathBuf,
    backend_url: &'a str,
    netns: Option<&'a Netns>,
}

/// What starting one remote site made.
struct Remote {
    operator: StartedOperator,
    link: Option<RunningLink>,
    /// Where `operator[0]` polls it.
    peer_url: String,
    /// Where the gateway sends its requests.
    request_url: String,
}

/// Starts a remote site's operator (listing `operator[0]`, `local`, as its peer) and,
/// with `links`, its relays; in its namespace, if it has one.
async fn start_remote(
    place: RemotePlace<'_>,
    spec: &GridSpec,
    links: Option<Links>,
    (local_name, local_addr): (&str, SocketAddr),
) -> Result<Remote, Error> {
    let (i, ns) = (place.index, place.netns);
    let (uplink, local_url) = match (links, ns) {
        (Some(l), Some(ns)) => {
            let (relay, url) = start_uplink(l, i, ns, local_addr).await?;
            (Some(relay), url)
        }
        _ => (None, signals_url(local_addr)),
    };
    let config = with_transport(
        operator_config(
            place.name,
            place.files,
            &place.state,
            SocketAddr::from((site_ip(ns), 0)),
            spec.cadence,
            &[(local_name, local_url)],
            place.backend_url,
        )?,
        spec.transport,
    )?;
    let clock = Clock::system();
    let operator_runtime = ns.map(Netns::single_threaded).transpose()?;
    let (op, config) = {
        let (state, clock) = (place.state.clone(), clock.clone());
        let start = async move { start_operator(config, &state, &clock).await };
        run_in(operator_runtime.as_ref().map(NsRuntime::handle), start).await?
    };
    let link = match links {
        None => None,
        Some(l) => {
            let mut link = start_link(l, i, op.signals_addr, place.backend_url, ns).await?;
            link.uplink = uplink;
            Some(link)
        }
    };
    let (peer_addr, request_url) = match &link {
        Some(l) => (l.peer.addr(), format!("http://{}", l.backend.addr())),
        None => (op.signals_addr, place.backend_url.to_owned()),
    };
    Ok(Remote {
        operator: (op, config, place.state, clock, operator_runtime),
        link,
        peer_url: signals_url(peer_addr),
        request_url,
    })
}

impl LocalGrid {
    /// Mints the certificates, starts every backend, every operator (peers first) and the
    /// gateway. Returns as soon as the gateway serves; its sites may still be unmeasured
    /// (see [`LocalGrid::wait_measured`]).
    pub async fn start(spec: &GridSpec) -> Result<Self, Error> {
        Self::start_inner(spec, None, |_| {}).await
    }

    /// As [`LocalGrid::start`], then waits up to `within` for every site to be measured
    /// ([`LocalGrid::wait_measured`]): the grid a routing test or benchmark starts from.
    pub async fn start_measured(spec: &GridSpec, within: Duration) -> Result<Self, Error> {
        let grid = Self::start(spec).await?;
        grid.wait_measured(within).await?;
        Ok(grid)
    }

    /// As [`LocalGrid::start`], with the gateway's configuration changed by `tune` before
    /// it starts (e.g. `extProcListen`, for an Envoy in front of the grid).
    pub async fn start_with_gateway(
        spec: &GridSpec,
        tune: fn(&mut GatewayConfig),
    ) -> Result<Self, Error> {
        Self::start_inner(spec, None, tune).await
    }

    /// As [`LocalGrid::start`], with every remote site behind two fault relays (its peer
    /// path and its request path) adding `links.delay`; [`LocalGrid::link`] hands out their
    /// controls.
    pub async fn start_with_links(spec: &GridSpec, links: Links) -> Result<Self, Error> {
        Self::start_inner(spec, Some(links), |_| {}).await
    }

    async fn start_inner(
        spec: &GridSpec,
        links: Option<Links>,
        tune: fn(&mut GatewayConfig),
    ) -> Result<Self, Error> {
        if spec.sites.is_empty() {
            return Err(grid_sim::Error::InvalidConfig {
                field: "sites",
                reason: "a grid needs at least one site",
            }
            .into());
        }
        let (dir, ca, files) = mint(spec)?;
        let namespaced = links.is_some_and(|l| l.namespaces);
        let netns = (0..spec.sites.len())
            .map(|i| (namespaced && i > 0).then(Netns::create).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let backends = start_backends(spec, &netns).await?;
        // `operator[0]` is named in its peers' configurations before it starts (they
        // only admit peers they list), so its address is chosen first.
        let local_addr = crate::ports::loopback_addr();
        let local_name = spec.sites[0].name.as_str();
        // Peers first: each lists operator[0] (so it admits its polls); operator[0] then
        // lists every peer at its real address (or its relay's).
        let mut operators = Vec::with_capacity(spec.sites.len());
        let mut relays = Vec::with_capacity(spec.sites.len());
        operators.push(None);
        relays.push(None);
        let mut peer_urls = Vec::new();
        // What the gateway proxies to: the backend itself, or the relay in front of it.
        let mut request_urls = vec![backends[0].1.clone()];
        for (i, s) in spec.sites.iter().enumerate().skip(1) {
            let place = RemotePlace {
                index: i,
                name: &s.name,
                files: &files[i],
                state: dir.path().join(format!("{}-state", s.name)),
                backend_url: &backends[i].1,
                netns: netns[i].as_ref(),
            };
            let remote = start_remote(place, spec, links, (local_name, local_addr)).await?;
            peer_urls.push((s.name.as_str(), remote.peer_url));
            request_urls.push(remote.request_url);
            operators.push(Some(remote.operator));
            relays.push(remote.link);
        }
        let state = dir.path().join(format!("{local_name}-state"));
        let config = with_transport(
            operator_config(
                local_name,
                &files[0],
                &state,
                local_addr,
                spec.cadence,
                &peer_urls,
                &backends[0].1,
            )?,
            spec.transport,
        )?;
        let clock = Clock::system();
        let (op, config) = start_operator(config, &state, &clock).await?;
        operators[0] = Some((op, config, state, clock, None));

        let base_urls: Vec<(&str, &str)> = spec
            .sites
            .iter()
            .zip(&request_urls)
            .map(|(s, url)| (s.name.as_str(), url.as_str()))
            .collect();
        let gateway_file = gateway_file(spec, &files[0], local_addr, &base_urls);
        let mut config = gateway_config(spec, &files[0], local_addr, &base_urls)?;
        tune(&mut config);
        config.validate()?;
        let gateway = grid_gatewayd::driver::start(config).await?;
        let sites = spec
            .sites
            .iter()
            .zip(backends)
            .zip(operators)
            .zip(relays)
            .zip(netns)
            .filter_map(|((((s, (sim, base_url)), op), link), netns)| {
                op.map(
                    |(operator, config, state_dir, clock, operator_runtime)| RunningSite {
                        name: s.name.clone(),
                        sim,
                        base_url,
                        operator: Some(operator),
                        config,
                        state_dir,
                        link,
                        clock,
                        operator_runtime,
                        netns,
                    },
                )
            })
            .collect();
        Ok(Self {
            model: spec.model.clone(),
            sites,
            gateway: Some(gateway),
            ca,
            gateway_file,
            dir,
        })
    }

    /// Slows simulated `site` to [`BACKED_UP_SERVICE`] a request and keeps its slots filled
    /// [`BACKLOG_TURNS`] times over behind every proxy's back ([`LocalGrid::keep_requests`]:
    /// each held request bounded by [`BACKLOG_HELD_FOR`] and sent again as it ends, for
    /// [`BACKLOG_KEPT_FOR`]): a backlog that outlasts a check's requests however slow the
    /// machine, yet one a request grid still sends there gets through within the openai
    /// client's wait. Returns once the gateway sees `site` without room, within `within`;
    /// dropping the returned set ends the held requests.
    ///
    /// # Errors
    ///
    /// When the site's model refuses the change, or the gateway does not see it full in
    /// time.
    ///
    /// # Panics
    ///
    /// When `site` is not a simulated site of the grid.
    pub async fn back_up(
        &self,
        site: &str,
        within: Duration,
    ) -> Result<tokio::task::JoinSet<()>, Error> {
        let control = self.control(site).expect("a simulated site of the grid");
        let (slots, service) = control.slots_and_service();
        control.degrade(BACKED_UP_SERVICE.as_secs_f64() / service.as_secs_f64())?;
        let held = self.keep_requests(
            site,
            slots * BACKLOG_TURNS as usize,
            BACKLOG_HELD_FOR,
            BACKLOG_KEPT_FOR,
        );
        self.wait_without_room(site, within).await?;
        Ok(held)
    }

    /// Keeps `n` requests for the grid's model open at `site`, bypassing every proxy, each
    /// bounded by `bound` ([`crate::load::keep_sending`]) for `kept_for`: load the grid
    /// learns of only through the site's signals, which unlike
    /// [`LocalGrid::hold_requests`]' does not drain.
    ///
    /// # Panics
    ///
    /// When `site` is not in the grid.
    pub fn keep_requests(
        &self,
        site: &str,
        n: usize,
        bound: Duration,
        kept_for: Duration,
    ) -> tokio::task::JoinSet<()> {
        crate::load::keep_sending(
            &crate::load::LoadClient::new(crate::load::Protocol::Http1, bound),
            &self.completions_uri(site),
            &crate::load::chat_body(&self.model, false),
            n,
            kept_for,
        )
    }

    fn completions_uri(&self, site: &str) -> http::Uri {
        format!(
            "{}/v1/chat/completions",
            self.base_url(site).expect("a site of the grid")
        )
        .parse()
        .expect("a site's base URL")
    }

    /// Sends `n` requests for the grid's model straight to `site`, bypassing every proxy,
    /// and keeps them open (each bounded by `bound`) until they end or the set is dropped:
    /// load the grid learns of only through the site's signals.
    ///
    /// # Panics
    ///
    /// When `site` is not in the grid.
    pub fn hold_requests(&self, site: &str, n: usize, bound: Duration) -> tokio::task::JoinSet<()> {
        let uri = self.completions_uri(site);
        let client = crate::load::LoadClient::new(crate::load::Protocol::Http1, bound);
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..n {
            let (c, uri, body) = (
                client.clone(),
                uri.clone(),
                crate::load::chat_body(&self.model, false),
            );
            set.spawn(async move {
                let _ = c.post_json(&uri, body).await;
            });
        }
        set
    }

    /// The gateway's configuration as a file (`docs/gateway.md`'s dialect) listening on
    /// `listen`: the same operator, certificates, models and shedding, for a second
    /// proxy (an embedding of grid) beside the gateway the grid runs.
    pub fn gateway_toml(&self, listen: SocketAddr) -> String {
        self.gateway_file.replace("{listen}", &listen.to_string())
    }

    /// Renews `site`'s certificate in place (a new leaf and key from the grid's CA, written
    /// over the files its operator, and at `site[0]` the gateway, read), as cert-manager
    /// would: the daemons pick it up at their next certificate check.
    ///
    /// # Errors
    ///
    /// When the certificate cannot be minted or written.
    pub fn renew_certificate(&self, site: &str) -> Result<(), Error> {
        self.ca.write_site(self.dir.path(), site).map(drop)
    }

    /// Renewals `site`'s operator has taken (`grid_operator_certificate_reloads_total`),
    /// by result; `None` while it is stopped.
    pub fn certificate_reloads(&self, site: &str) -> Option<(u64, u64)> {
        use grid_daemon::tls::ReloadResult;
        let op = self.site(site)?.operator.as_ref()?;
        Some((
            op.certificates.count(ReloadResult::Rotated),
            op.certificates.count(ReloadResult::Refused),
        ))
    }

    fn site(&self, site: &str) -> Option<&RunningSite> {
        self.sites.iter().find(|s| s.name == site)
    }

    /// The control handles of a remote site's relays; `None` for `site[0]`, an unknown
    /// site, or a grid started without links.
    pub fn link(&self, site: &str) -> Option<SiteLink> {
        self.site(site)
            .and_then(|s| s.link.as_ref())
            .map(|l| SiteLink {
                peer: l.peer.control(),
                backend: l.backend.control(),
            })
    }

    /// Stops a site's operator the way a crash does: its tasks are aborted, no final
    /// fence write. Returns whether it was running.
    pub fn stop_operator(&mut self, site: &str) -> bool {
        self.sites
            .iter_mut()
            .find(|s| s.name == site)
            .and_then(|s| s.operator.take())
            .is_some()
    }

    /// Starts a stopped site operator again, on the addresses it had and from its state
    /// directory (its epoch high-water mark and fences as last persisted).
    pub async fn start_operator(&mut self, site: &str) -> Result<(), Error> {
        let Some(s) = self.sites.iter_mut().find(|s| s.name == site) else {
            return Err(Error::Timeout {
                what: format!("site {site} (unknown)"),
                limit_ms: 0,
            });
        };
        if s.operator.is_some() {
            return Ok(());
        }
        let mut attempt = 0;
        let running = loop {
            let (config, state, clock) = (s.config.clone(), s.state_dir.clone(), s.clock.clone());
            let start = async move { start_operator(config, &state, &clock).await };
            match run_in(s.operator_runtime.as_ref().map(NsRuntime::handle), start).await {
                Ok((running, _)) => break running,
                Err(Error::Operator(grid_operatord::Error::Bind { .. }))
                    if attempt + 1 < REBIND_ATTEMPTS =>
                {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            }
        };
        s.operator = Some(running);
        Ok(())
    }

    /// Takes a namespaced site's link down (`false`: a partition) or up again. Returns
    /// `Ok(false)` for a site without a namespace.
    ///
    /// # Errors
    ///
    /// When `ip` fails.
    pub fn set_link(&self, site: &str, up: bool) -> Result<bool, Error> {
        match self.site(site).and_then(|s| s.netns.as_ref()) {
            Some(ns) => ns.set_link(up).map(|()| true),
            None => Ok(false),
        }
    }

    /// Stops every thread of a namespaced site's operator for `d`, as `SIGSTOP` then
    /// `SIGCONT` would ([`NsRuntime::freeze`]). Returns whether the site has an operator
    /// of its own runtime to freeze.
    pub fn freeze_operator(&self, site: &str, d: Duration) -> bool {
        self.site(site)
            .and_then(|s| s.operator_runtime.as_ref())
            .map(|rt| rt.freeze(d))
            .is_some()
    }

    /// Steps `site`'s operator wall clock by `delta_ms` (negative: back), as a host clock
    /// step would, leaving every other site's clock alone. Returns whether the site exists.
    pub fn step_clock(&self, site: &str, delta_ms: i64) -> bool {
        self.site(site).map(|s| s.clock.step(delta_ms)).is_some()
    }

    /// A site's state directory: its persisted epoch mark, fences and feedback state.
    pub fn state_dir(&self, site: &str) -> Option<&Path> {
        self.site(site).map(|s| s.state_dir.as_path())
    }

    /// A site operator's signals listener (the real one, not its relay).
    pub fn operator_signals_addr(&self, site: &str) -> Option<SocketAddr> {
        self.site(site)
            .and_then(|s| s.operator.as_ref())
            .map(|o| o.signals_addr)
    }

    /// The gateway's routing slot, for watching the view from another task.
    pub fn published(&self) -> grid_gateway::upstream::Published {
        Arc::clone(self.gateway().published())
    }

    /// Readings the gateway discarded for implausible ages
    /// (`grid_signals_ingest_dropped_total{reason="skew"}`): the evidence its feedback
    /// reporter owes its operator.
    pub fn gateway_skew_drops(&self) -> u64 {
        self.gateway()
            .handles()
            .ingest
            .dropped(grid_signals::store::DropReason::Skew)
    }

    fn gateway(&self) -> &grid_gatewayd::driver::Running {
        self.gateway
            .as_ref()
            .expect("the gateway runs until shutdown consumes the grid")
    }

    /// The model served.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The temporary directory holding the certificates and the operators' state.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Where the gateway serves Envoy's external processor (`extProcListen`), if asked.
    pub fn ext_proc_addr(&self) -> Option<SocketAddr> {
        self.gateway
            .as_ref()
            .and_then(grid_gatewayd::driver::Running::ext_proc_addr)
    }

    /// The gateway's API address.
    pub fn gateway_addr(&self) -> SocketAddr {
        self.gateway().local_addr()
    }

    /// `http://<gateway>/v1/chat/completions`.
    pub fn chat_url(&self) -> String {
        format!("http://{}/v1/chat/completions", self.gateway_addr())
    }

    /// The site names, the gateway's first.
    pub fn site_names(&self) -> impl Iterator<Item = &str> {
        self.sites.iter().map(|s| s.name.as_str())
    }

    /// A simulated site's control handle.
    pub fn control(&self, site: &str) -> Option<SimSiteControl> {
        self.sites
            .iter()
            .find(|s| s.name == site)
            .and_then(|s| s.sim.as_ref())
            .map(SimSite::control)
    }

    /// A site's backend base URL (`http://127.0.0.1:port`), for reaching it directly.
    pub fn base_url(&self, site: &str) -> Option<&str> {
        self.sites
            .iter()
            .find(|s| s.name == site)
            .map(|s| s.base_url.as_str())
    }

    /// A site operator's `/metrics` address.
    pub fn operator_metrics_addr(&self, site: &str) -> Option<SocketAddr> {
        self.site(site)
            .and_then(|s| s.operator.as_ref())
            .map(|o| o.metrics_addr)
    }

    /// The gateway's current routing view.
    pub fn view(&self) -> Arc<RoutingView> {
        self.gateway().published().load_full()
    }

    /// Whether the gateway answers 429 for the model now.
    pub fn shedding(&self) -> bool {
        self.view().is_shedding(&self.model)
    }

    /// Where `site` stands in the gateway's current view.
    pub fn routing(&self, site: &str) -> SiteRouting {
        routing_of(&self.view(), &self.model, site)
    }

    /// Waits, checking every 10 ms, until `cond` holds; returns how long it took, or
    /// [`Error::Timeout`] after `limit`.
    pub async fn wait_until(
        &self,
        what: &str,
        limit: Duration,
        mut cond: impl FnMut(&Self) -> bool,
    ) -> Result<Duration, Error> {
        let watch = Stopwatch::start();
        loop {
            if cond(self) {
                return Ok(watch.elapsed());
            }
            if watch.elapsed() >= limit {
                return Err(Error::Timeout {
                    what: what.to_owned(),
                    limit_ms: limit.as_millis() as u64,
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the gateway routes `site` as a candidate with no room (full, or no
    /// room for another request): what a degraded, backed-up site looks like to routing.
    pub async fn wait_without_room(&self, site: &str, limit: Duration) -> Result<Duration, Error> {
        self.wait_until(&format!("{site} seen without room"), limit, |g| {
            matches!(
                g.routing(site),
                SiteRouting::Candidate {
                    state: CandidateState::Full | CandidateState::NoRoom,
                    ..
                }
            )
        })
        .await
    }

    /// Waits until every site has a fresh reading at the gateway.
    pub async fn wait_measured(&self, limit: Duration) -> Result<Duration, Error> {
        self.wait_until("every site measured", limit, |g| {
            g.site_names().all(|s| g.routing(s).measured())
        })
        .await
    }

    /// Stops polling and drains the gateway, stops the operators, then the simulated
    /// sites, and removes the certificates.
    pub async fn shutdown(mut self) {
        if let Some(gateway) = self.gateway.take() {
            gateway.shutdown().await;
        }
        for site in self.sites.drain(..) {
            // A graceful stop, as SIGTERM gives the daemon: the final fence write included.
            if let Some(op) = site.operator {
                let _ = op.shutdown().await;
            }
            if let Some(sim) = site.sim {
                sim.stop().await;
            }
        }
    }
}

/// Where `site` stands for `model` in `view`.
pub fn routing_of(view: &RoutingView, model: &str, site: &str) -> SiteRouting {
    let Some(snapshot) = view.table().get(model) else {
        return SiteRouting::Absent;
    };
    if let Some(c) = snapshot
        .candidates()
        .iter()
        .find(|c| c.site().as_ref() == site)
    {
        return SiteRouting::Candidate {
            state: c.state(),
            rho: c.rho(),
            capacity: c.evidence().shown_capacity.unwrap_or(c.capacity()),
            score: c.score(),
        };
    }
    snapshot
        .excluded()
        .iter()
        .find(|e| e.key.site.as_ref() == site)
        .map_or(SiteRouting::Absent, |e| {
            SiteRouting::Excluded(e.reason.as_str())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> SiteFiles {
        SiteFiles {
            cert: "/t/a.crt".into(),
            key: "/t/a.key".into(),
            ca: "/t/ca.crt".into(),
        }
    }

    #[test]
    fn a_request_queued_behind_a_whole_backlog_is_answered_within_the_clients_wait() {
        let cleared_behind_it = BACKED_UP_SERVICE * (BACKLOG_TURNS + 1);
        assert!(cleared_behind_it < crate::openai_client::REQUEST_TIMEOUT);
        assert!(cleared_behind_it < BACKLOG_HELD_FOR);
    }

    #[test]
    fn the_backlog_is_kept_up_past_a_front_ends_first_sight_of_it_and_a_whole_client_run() {
        assert!(
            crate::front_end_checks::SEEN_WITHIN + crate::openai_client::CLIENT_TIMEOUT
                < BACKLOG_KEPT_FOR
        );
    }

    #[test]
    fn operator_config_passes_the_daemon_own_validation() {
        let c = operator_config(
            "b",
            &files(),
            Path::new("/t/b-state"),
            "127.0.0.1:0".parse().unwrap(),
            Cadence::DEFAULT,
            &[("a", "https://127.0.0.1:9/v1/site/signals".into())],
            "http://127.0.0.1:8000",
        )
        .unwrap();
        assert_eq!(c.peer_poll_interval, Duration::from_secs(5));
        assert_eq!(c.scrape_interval, Duration::from_secs(1));
        assert_eq!(c.peers.len(), 1);
        assert_eq!(c.providers[0].name, PROVIDER);
        assert_eq!(
            c.providers[0].url.to_string(),
            "http://127.0.0.1:8000/metrics"
        );
    }

    #[test]
    fn gateway_config_is_valid_and_carries_shedding_and_every_site() {
        let spec = GridSpec {
            model: "m".into(),
            sites: vec![
                SiteSpec {
                    name: "a".into(),
                    backend: Backend::External("http://127.0.0.1:1".into()),
                },
                SiteSpec {
                    name: "b".into(),
                    backend: Backend::External("http://127.0.0.1:2".into()),
                },
            ],
            cadence: Cadence::FAST,
            transport: TransportMode::Poll,
            shedding: Some(Shedding {
                full_after_ms: 300,
                room_after_ms: 2_000,
                retry_after_s: 2,
            }),
        };
        let c = gateway_config(
            &spec,
            &files(),
            "127.0.0.1:9".parse().unwrap(),
            &[("a", "http://127.0.0.1:1"), ("b", "http://127.0.0.1:2")],
        )
        .unwrap();
        assert_eq!(c.operator.poll_interval_ms, 200);
        assert!(c.availability.shedding.enabled);
        assert_eq!(c.models[0].candidates.len(), 2);
        assert_eq!(c.site, "a");
        let text = gateway_file(
            &spec,
            &files(),
            "127.0.0.1:9".parse().unwrap(),
            &[("a", "http://127.0.0.1:1"), ("b", "http://127.0.0.1:2")],
        )
        .replace("{listen}", "127.0.0.1:0");
        let f = GatewayConfig::from_toml_str(&text).unwrap();
        assert_eq!(
            format!("{f:?}"),
            format!("{c:?}"),
            "the file says what the typed configuration says"
        );
    }
}
