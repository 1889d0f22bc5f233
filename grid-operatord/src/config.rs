//! The operator's configuration: one TOML file in the standalone daemon.
//!
//! The rest of the operator sees only the validated [`Config`], obtained through the
//! [`ConfigSource`] trait, so a Kubernetes controller can later build the same value from
//! its custom resources without touching scrape, serve or poll logic. The file format is
//! documented in `docs/operator.md` with an example in `docs/examples/operator.toml`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::Error;
use grid_daemon::tls::Fingerprint;

/// The most peers one operator polls; each holds a connection slot, and the signals
/// listener admits at most [`crate::slots::MAX_PEER_CONNECTIONS`] of them.
pub const MAX_PEERS: usize = 128;
/// The most providers one operator scrapes.
pub const MAX_PROVIDERS: usize = 256;
/// The longest site, peer or provider name (a DNS label; the rule both daemons share).
pub const MAX_NAME_LEN: usize = grid_daemon::config::MAX_NAME_LEN;
/// The shortest interval or timeout accepted, in milliseconds: below it the operator would
/// spend its time on handshakes.
pub const MIN_PERIOD_MS: u64 = 100;
/// The longest interval or timeout accepted, in milliseconds (one hour).
pub const MAX_PERIOD_MS: u64 = 3_600_000;
/// Default EPP scrape interval.
pub const DEFAULT_SCRAPE_INTERVAL: Duration = Duration::from_secs(1);
/// Default peer poll interval.
pub const DEFAULT_PEER_POLL_INTERVAL: Duration = Duration::from_secs(5);
/// Default per-scrape timeout.
pub const DEFAULT_SCRAPE_TIMEOUT: Duration = Duration::from_secs(1);
/// Default per-poll-attempt timeout for a peer.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(2);
/// Default path of an EPP's metrics.
pub const DEFAULT_METRICS_PATH: &str = "/metrics";

/// Where the operator's configuration comes from.
///
/// The standalone daemon reads a file ([`FileConfigSource`]); a Kubernetes controller can
/// implement this from its resources later.
pub trait ConfigSource: Send + Sync {
    /// Reads and validates the whole configuration.
    fn load(&self) -> Result<Config, Error>;
    /// The signal transport mode currently declared, read without validating the rest, so
    /// the driver can notice a changed mode even while other fields are being edited.
    fn declared_mode(&self) -> Result<String, Error>;
}

/// Reads the configuration from one TOML file.
#[derive(Clone, Debug)]
pub struct FileConfigSource {
    path: PathBuf,
}

impl FileConfigSource {
    /// A source reading `path` on every [`ConfigSource::load`].
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    fn read(&self) -> Result<String, Error> {
        std::fs::read_to_string(&self.path).map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })
    }
}

impl ConfigSource for FileConfigSource {
    fn load(&self) -> Result<Config, Error> {
        Config::from_toml(&self.read()?, &self.path)
    }

    fn declared_mode(&self) -> Result<String, Error> {
        declared_mode(&self.read()?, &self.path)
    }
}

/// The signal transport mode declared in TOML text; absent means `gossip`, as in the spec.
pub fn declared_mode(text: &str, path: &Path) -> Result<String, Error> {
    let table: toml::Table = toml::from_str(text).map_err(|e| Error::ConfigSyntax {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(table
        .get("signalTransport")
        .and_then(|t| t.get("mode"))
        .and_then(toml::Value::as_str)
        .unwrap_or(TransportMode::GOSSIP)
        .to_owned())
}

/// The validated configuration of one operator.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// This site's name; its own certificate identifies as it.
    pub site: String,
    /// The one network this operator serves.
    pub network: String,
    /// Directory of the persisted epoch high-water mark and feedback state.
    pub state_dir: PathBuf,
    /// Listener addresses.
    pub listen: Listen,
    /// The site's TLS material.
    pub tls: TlsFiles,
    /// How peers and the local gateway are authenticated.
    pub trust: TrustMode,
    /// How signals cross sites.
    pub transport: TransportMode,
    /// EPP scrape interval.
    pub scrape_interval: Duration,
    /// Peer poll interval.
    pub peer_poll_interval: Duration,
    /// Peer operators polled over mTLS.
    pub peers: Vec<PeerConfig>,
    /// Providers whose EPPs are scraped.
    pub providers: Vec<ProviderConfig>,
    /// The host peers reach this site at (`listen.advertise`): what its SWIM identity
    /// advertises, so peers poll `https://{host}:{signals port}`. Absent, the signals
    /// listener's IP when it is a specific one; with neither, membership does not run.
    pub advertise_host: Option<String>,
    /// The port peers reach this site's signals listener and its SWIM socket at (TCP and
    /// UDP alike), when a Service in front of it maps another port to the one bound:
    /// what its SWIM identity advertises. Absent, the bound signals port. The file mode
    /// never sets it; the controller takes it from this site's own `GridSite`.
    pub advertise_port: Option<u16>,
    /// The models and their candidates this site's gateway routes, served to it at
    /// `GET /v1/site/catalog` (controller mode: from the `InferenceProvider`s and
    /// `GridSite`s; the file mode serves an empty one, its gateways keep their TOML).
    pub catalog: Vec<CatalogModel>,
}

/// One model of the catalog and where it is served.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CatalogModel {
    /// The `model` clients send.
    pub name: String,
    /// Its candidates, sorted by (site, provider).
    pub candidates: Vec<CatalogCandidate>,
}

/// One candidate of a [`CatalogModel`]: the gateway's `models[].candidates[]` shape.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CatalogCandidate {
    /// `grid_site`.
    pub site: String,
    /// `grid_provider`.
    pub provider: String,
    /// Where requests go.
    pub base_url: String,
}

impl Config {
    /// Whether a running operator takes `next` over live, in the same epoch, in both the
    /// file and the controller mode (`Running::reconfigure`): another catalog, another provider list and,
    /// under gossip, another trust (mode, CA bundle, peers: the seeds and pins), and
    /// nothing else. Under poll a trust change restarts the process (a poll-mode operator
    /// judges peers' certificates only under the trust it started with); any other change
    /// restarts the driver.
    pub fn takes_over_live(&self, next: &Self) -> bool {
        // `next` with the fields taken over live set to this configuration's.
        let mut kept = next.clone();
        kept.providers.clone_from(&self.providers);
        kept.catalog.clone_from(&self.catalog);
        if self.transport == TransportMode::Gossip {
            kept.trust.clone_from(&self.trust);
            kept.tls.ca.clone_from(&self.tls.ca);
            kept.peers.clone_from(&self.peers);
        }
        self != next && *self == kept
    }

    /// The first trust field whose declaration differs, as the file spells it: the mode,
    /// the CA bundle, or the peers (name, URL, pins).
    pub fn trust_differs(&self, next: &Self) -> Option<&'static str> {
        let peers = |c: &Self| -> Vec<(String, String, Vec<Fingerprint>)> {
            c.peers
                .iter()
                .map(|p| (p.name.clone(), p.url.to_string(), p.fingerprints.clone()))
                .collect()
        };
        if self.trust != next.trust {
            Some("trust")
        } else if self.tls.ca != next.tls.ca {
            Some("tls.ca")
        } else if peers(self) != peers(next) {
            Some("peers")
        } else {
            None
        }
    }
}

/// The two listeners.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Listen {
    /// `GET /v1/site/signals` and `POST /v1/site/signals/ingest` over mTLS.
    pub signals: SocketAddr,
    /// Prometheus `/metrics`, plain HTTP.
    pub metrics: SocketAddr,
}

/// PEM files of the site's certificate, key and trust anchor.
#[derive(Clone, Debug, PartialEq)]
pub struct TlsFiles {
    /// Certificate chain, leaf first; the local gateway presents the same certificate.
    pub cert: PathBuf,
    /// Private key of the leaf.
    pub key: PathBuf,
    /// CA bundle; required in `spiffe` mode, unused in `pin` mode.
    pub ca: Option<PathBuf>,
}

/// Peer trust mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TrustMode {
    /// Each peer is known by the SHA-256 fingerprints of its leaf certificate (listed per
    /// peer); the local gateway by this site's own certificate.
    Pin,
    /// Certificates chain to the CA and carry `spiffe://<trust_domain>/site/<name>` as a URI
    /// SAN.
    Spiffe {
        /// The SPIFFE trust domain.
        trust_domain: String,
    },
}

/// How signals cross sites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportMode {
    /// Serve `/v1/site/signals` over mTLS and poll peers.
    Poll,
    /// Batch versions ride SWIM; batches are pulled over mTLS from whoever announced
    /// them, and digests are exchanged so a member that missed broadcasts converges. The
    /// default, also what an absent mode means.
    Gossip,
}

impl TransportMode {
    /// The spelling of the gossip mode.
    pub const GOSSIP: &'static str = "gossip";

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Poll => "poll",
            Self::Gossip => Self::GOSSIP,
        }
    }

    /// The mode a declaration spells (`None`: absent, which means gossip); `None` back
    /// for a spelling that is no mode.
    pub fn parse(declared: Option<&str>) -> Option<Self> {
        match declared {
            Some("poll") => Some(Self::Poll),
            None | Some(Self::GOSSIP) => Some(Self::Gossip),
            Some(_) => None,
        }
    }
}

/// One peer operator.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerConfig {
    /// The peer's site name; rows it sends for any other site are dropped.
    pub name: String,
    /// Its `GET /v1/site/signals` URL (https).
    pub url: http::Uri,
    /// Accepted leaf fingerprints (pin mode; several allow rotation).
    pub fingerprints: Vec<Fingerprint>,
    /// Timeout of one poll attempt.
    pub timeout: Duration,
}

/// One provider whose EPP is scraped.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderConfig {
    /// The provider name, `grid_provider` on every series.
    pub name: String,
    /// Full URL of the EPP metrics (base URL joined with `path`).
    pub url: http::Uri,
    /// Per-scrape timeout.
    pub timeout: Duration,
    /// No successful scrape within this long means not ready; `None` means half the
    /// signal TTL.
    pub stale_metrics: Option<Duration>,
    /// `provider_uid` label of its batches; defaults to `<site>/<name>`.
    pub uid: String,
    /// Config generation published as the batch metadata value.
    pub generation: u64,
    /// CA bundle for an `https` EPP; defaults to `tls.ca`.
    pub ca_file: Option<PathBuf>,
    /// The EPP pool (`name` label) this provider is; `None` reads every pool the EPP
    /// reports, combined.
    pub pool: Option<String>,
    /// Unavailable from configuration (the spec's third not-ready case): it is still
    /// scraped, so its load stays visible, but reads not ready with reason `Unavailable`
    /// whatever the EPP says, so an operator can take it out of routing by hand.
    pub unavailable: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConfig {
    site: String,
    network: RawNetwork,
    state_dir: PathBuf,
    listen: RawListen,
    tls: RawTls,
    trust: RawTrust,
    signal_transport: Option<RawTransport>,
    #[serde(default)]
    intervals: RawIntervals,
    #[serde(default)]
    peers: Vec<RawPeer>,
    #[serde(default)]
    providers: Vec<RawProvider>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawNetwork {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListen {
    signals: String,
    metrics: String,
    advertise: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert: PathBuf,
    key: PathBuf,
    ca: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawTrust {
    mode: String,
    trust_domain: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTransport {
    mode: String,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawIntervals {
    scrape_seconds: Option<f64>,
    peer_poll_seconds: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawPeer {
    name: String,
    url: String,
    #[serde(default)]
    fingerprints: Vec<String>,
    timeout_seconds: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawProvider {
    name: String,
    url: String,
    path: Option<String>,
    timeout_seconds: Option<f64>,
    stale_metrics_seconds: Option<f64>,
    uid: Option<String>,
    generation: Option<u64>,
    ca_file: Option<PathBuf>,
    pool: Option<String>,
    #[serde(default)]
    unavailable: bool,
}

fn field_err(field: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::ConfigField {
        field: field.into(),
        reason: reason.into(),
    }
}

impl Config {
    /// Parses and validates TOML text; `path` only labels messages.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, Error> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| Error::ConfigSyntax {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let mut config = Self::from_raw(raw)?;
        if let Some(dir) = path.parent() {
            config.resolve_relative_to(dir);
        }
        config.validate()?;
        Ok(config)
    }

    /// Reads every relative path of the configuration (`stateDir`, `tls.cert`, `tls.key`,
    /// `tls.ca`, `providers[].caFile`) from `dir`, the configuration file's directory, as
    /// the gateway reads its own: the file and what it names move together, whatever the
    /// working directory.
    pub fn resolve_relative_to(&mut self, dir: &Path) {
        let paths = [&mut self.state_dir, &mut self.tls.cert, &mut self.tls.key]
            .into_iter()
            .chain(self.tls.ca.as_mut())
            .chain(self.providers.iter_mut().filter_map(|p| p.ca_file.as_mut()));
        for p in paths {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        }
    }

    /// A configuration with every default the file applies, with no peer and no provider
    /// yet: the typed way to build one (tests, a controller), equal to a file that gives
    /// only the required keys. Add peers and providers, set fields, then
    /// [`Config::validate`] as [`Config::from_toml`] does.
    ///
    /// ```
    /// use grid_operatord::config::{Config, Listen, ProviderConfig, TlsFiles, TrustMode};
    ///
    /// let listen = Listen {
    ///     signals: "127.0.0.1:9443".parse().unwrap(),
    ///     metrics: "127.0.0.1:9090".parse().unwrap(),
    /// };
    /// let tls = TlsFiles { cert: "site.crt".into(), key: "site.key".into(), ca: None };
    /// let config = Config::new("a", "prod", listen, tls, TrustMode::Pin, "/var/lib/grid")
    ///     .with_provider(ProviderConfig::new("a", "llama", "http://127.0.0.1:9100/metrics".parse().unwrap()));
    /// config.validate().unwrap();
    /// ```
    pub fn new(
        site: impl Into<String>,
        network: impl Into<String>,
        listen: Listen,
        tls: TlsFiles,
        trust: TrustMode,
        state_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            site: site.into(),
            network: network.into(),
            state_dir: state_dir.into(),
            listen,
            tls,
            trust,
            transport: TransportMode::Poll,
            scrape_interval: DEFAULT_SCRAPE_INTERVAL,
            peer_poll_interval: DEFAULT_PEER_POLL_INTERVAL,
            peers: Vec::new(),
            providers: Vec::new(),
            advertise_host: None,
            advertise_port: None,
            catalog: Vec::new(),
        }
    }

    /// Adds a peer operator to poll.
    #[must_use]
    pub fn with_peer(mut self, peer: PeerConfig) -> Self {
        self.peers.push(peer);
        self
    }

    /// Adds a provider to scrape.
    #[must_use]
    pub fn with_provider(mut self, provider: ProviderConfig) -> Self {
        self.providers.push(provider);
        self
    }

    /// The file's values converted (addresses, URLs, pins and periods parsed, each
    /// checked against its bounds) with defaults filled in; the cross-field rules are
    /// [`Config::validate`]'s.
    fn from_raw(raw: RawConfig) -> Result<Self, Error> {
        let network = match raw.network {
            RawNetwork::One(n) => n,
            RawNetwork::Many(list) if list.len() == 1 => {
                list.into_iter().next().unwrap_or_default()
            }
            RawNetwork::Many(list) => {
                return Err(field_err(
                    "network",
                    format!(
                        "one operator serves one network and refuses to start on more; {} are listed",
                        list.len()
                    ),
                ));
            }
        };
        let listen = Listen {
            signals: parse_addr("listen.signals", &raw.listen.signals)?,
            metrics: parse_addr("listen.metrics", &raw.listen.metrics)?,
        };
        let tls = TlsFiles {
            cert: raw.tls.cert,
            key: raw.tls.key,
            ca: raw.tls.ca,
        };
        let mut config = Self::new(
            raw.site,
            network,
            listen,
            tls,
            trust_of(&raw.trust)?,
            raw.state_dir,
        );
        config.transport = transport_of(raw.signal_transport.as_ref())?;
        config.advertise_host = raw.listen.advertise;
        config.scrape_interval = period(
            "intervals.scrapeSeconds",
            raw.intervals.scrape_seconds,
            DEFAULT_SCRAPE_INTERVAL,
        )?;
        config.peer_poll_interval = period(
            "intervals.peerPollSeconds",
            raw.intervals.peer_poll_seconds,
            DEFAULT_PEER_POLL_INTERVAL,
        )?;
        for (i, p) in raw.peers.into_iter().enumerate() {
            config.peers.push(peer_of(i, p)?);
        }
        for (i, p) in raw.providers.into_iter().enumerate() {
            let provider = provider_of(i, p, &config.site)?;
            config.providers.push(provider);
        }
        Ok(config)
    }

    /// Checks every bound and cross-field rule; the error names the first bad field as
    /// the file spells it.
    pub fn validate(&self) -> Result<(), Error> {
        check_name("site", &self.site)?;
        check_name("network", &self.network)?;
        if self.state_dir.as_os_str().is_empty() {
            return Err(field_err("stateDir", "must name a directory"));
        }
        if self.listen.signals == self.listen.metrics && self.listen.signals.port() != 0 {
            return Err(field_err(
                "listen.metrics",
                "must differ from listen.signals: /metrics is plain HTTP, signals are mTLS",
            ));
        }
        if let Some(host) = &self.advertise_host {
            let probe = grid_membership::Member {
                site: self.site.clone(),
                host: host.clone(),
                signals_port: 1,
                gossip_port: 1,
                incarnation: 0,
            };
            probe
                .check()
                .map_err(|e| field_err("listen.advertise", e.to_string()))?;
        }
        if let TrustMode::Spiffe { trust_domain } = &self.trust {
            check_trust_domain(trust_domain)?;
            if self.tls.ca.is_none() {
                return Err(field_err("tls.ca", "required in `spiffe` mode"));
            }
        }
        for (field, period) in [
            ("intervals.scrapeSeconds", self.scrape_interval),
            ("intervals.peerPollSeconds", self.peer_poll_interval),
        ] {
            check_period(field, period)?;
        }
        if self.peers.len() > MAX_PEERS {
            return Err(field_err(
                "peers",
                format!("at most {MAX_PEERS} peers, {} listed", self.peers.len()),
            ));
        }
        if self.providers.len() > MAX_PROVIDERS {
            return Err(field_err(
                "providers",
                format!(
                    "at most {MAX_PROVIDERS} providers, {} listed",
                    self.providers.len()
                ),
            ));
        }
        for (i, p) in self.peers.iter().enumerate() {
            p.validate(i, &self.site, &self.trust, &self.peers[..i])?;
        }
        for (i, p) in self.providers.iter().enumerate() {
            p.validate(i, &self.providers[..i])?;
            if p.url.scheme_str() == Some("https") && p.ca_file.is_none() && self.tls.ca.is_none() {
                return Err(field_err(
                    format!("providers[{i}].caFile"),
                    "an https EPP needs `caFile` here or `tls.ca`",
                ));
            }
        }
        Ok(())
    }
}

impl PeerConfig {
    /// Peer `name` polled at `url` (its `GET /v1/site/signals`), known in pin mode by
    /// `fingerprints`, with the default attempt timeout.
    pub fn new(name: impl Into<String>, url: http::Uri, fingerprints: Vec<Fingerprint>) -> Self {
        Self {
            name: name.into(),
            url,
            fingerprints,
            timeout: DEFAULT_PEER_TIMEOUT,
        }
    }

    fn validate(
        &self,
        i: usize,
        site: &str,
        trust: &TrustMode,
        earlier: &[PeerConfig],
    ) -> Result<(), Error> {
        let at = |f: &str| format!("peers[{i}].{f}");
        check_name(&at("name"), &self.name)?;
        if self.name == site {
            return Err(field_err(at("name"), "a peer cannot be this site itself"));
        }
        if earlier.iter().any(|e| e.name == self.name) {
            return Err(field_err(
                at("name"),
                format!("`{}` is listed twice", self.name),
            ));
        }
        check_scheme(&at("url"), &self.url, &["https"])?;
        match trust {
            TrustMode::Pin if self.fingerprints.is_empty() => {
                return Err(field_err(
                    at("fingerprints"),
                    "pin mode needs at least one fingerprint",
                ));
            }
            TrustMode::Spiffe { .. } if !self.fingerprints.is_empty() => {
                return Err(field_err(at("fingerprints"), "only applies in `pin` mode"));
            }
            _ => {}
        }
        check_period(&at("timeoutSeconds"), self.timeout)
    }
}

impl ProviderConfig {
    /// Provider `name` of `site` whose EPP metrics are at `url` (the full URL, path
    /// included), with the file's defaults: uid `<site>/<name>`, generation 1, the
    /// default timeout, staleness half the signal TTL, every pool, available.
    pub fn new(site: &str, name: impl Into<String>, url: http::Uri) -> Self {
        let name = name.into();
        Self {
            uid: format!("{site}/{name}"),
            name,
            url,
            timeout: DEFAULT_SCRAPE_TIMEOUT,
            stale_metrics: None,
            generation: 1,
            ca_file: None,
            pool: None,
            unavailable: false,
        }
    }

    fn validate(&self, i: usize, earlier: &[ProviderConfig]) -> Result<(), Error> {
        let at = |f: &str| format!("providers[{i}].{f}");
        check_name(&at("name"), &self.name)?;
        if earlier.iter().any(|e| e.name == self.name) {
            return Err(field_err(
                at("name"),
                format!("`{}` is listed twice", self.name),
            ));
        }
        check_scheme(&at("url"), &self.url, &["http", "https"])?;
        check_period(&at("timeoutSeconds"), self.timeout)?;
        if let Some(d) = self.stale_metrics {
            check_period(&at("staleMetricsSeconds"), d)?;
        }
        if self.uid.is_empty() || self.uid.len() > 128 || self.uid.chars().any(char::is_control) {
            return Err(field_err(at("uid"), "1 to 128 printable characters"));
        }
        if let Some(pool) = &self.pool
            && (pool.is_empty() || pool.len() > 253)
        {
            return Err(field_err(at("pool"), "1 to 253 bytes"));
        }
        Ok(())
    }
}

fn trust_of(trust: &RawTrust) -> Result<TrustMode, Error> {
    Ok(match trust.mode.as_str() {
        "pin" => {
            if trust.trust_domain.is_some() {
                return Err(field_err(
                    "trust.trustDomain",
                    "only applies in `spiffe` mode",
                ));
            }
            TrustMode::Pin
        }
        "spiffe" => TrustMode::Spiffe {
            trust_domain: trust
                .trust_domain
                .clone()
                .ok_or_else(|| field_err("trust.trustDomain", "required in `spiffe` mode"))?,
        },
        other => {
            return Err(field_err(
                "trust.mode",
                format!("`{other}` is not a trust mode; use `pin` or `spiffe`"),
            ));
        }
    })
}

fn transport_of(t: Option<&RawTransport>) -> Result<TransportMode, Error> {
    let declared = t.map(|t| t.mode.as_str());
    Ok(match TransportMode::parse(declared) {
        Some(mode) => mode,
        None => {
            return Err(field_err(
                "signalTransport.mode",
                format!(
                    "`{}` is not a mode; use `gossip` or `poll`",
                    declared.unwrap_or_default()
                ),
            ));
        }
    })
}

fn peer_of(i: usize, p: RawPeer) -> Result<PeerConfig, Error> {
    let at = |f: &str| format!("peers[{i}].{f}");
    let url = parse_url(&at("url"), &p.url, &["https"])?;
    let fingerprints = p
        .fingerprints
        .iter()
        .enumerate()
        .map(|(j, f)| {
            Fingerprint::parse(f).map_err(|r| field_err(at(&format!("fingerprints[{j}]")), r))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut peer = PeerConfig::new(p.name, url, fingerprints);
    peer.timeout = period(
        &at("timeoutSeconds"),
        p.timeout_seconds,
        DEFAULT_PEER_TIMEOUT,
    )?;
    Ok(peer)
}

fn provider_of(i: usize, p: RawProvider, site: &str) -> Result<ProviderConfig, Error> {
    let at = |f: &str| format!("providers[{i}].{f}");
    let path = p.path.unwrap_or_else(|| DEFAULT_METRICS_PATH.to_owned());
    let url = metrics_url((&at("url"), &p.url), (&at("path"), &path))?;
    let mut provider = ProviderConfig::new(site, p.name, url);
    provider.timeout = period(
        &at("timeoutSeconds"),
        p.timeout_seconds,
        DEFAULT_SCRAPE_TIMEOUT,
    )?;
    provider.stale_metrics = match p.stale_metrics_seconds {
        None => None,
        Some(s) => Some(period(&at("staleMetricsSeconds"), Some(s), Duration::ZERO)?),
    };
    if let Some(uid) = p.uid {
        provider.uid = uid;
    }
    provider.generation = p.generation.unwrap_or(1);
    provider.ca_file = p.ca_file;
    provider.pool = p.pool;
    provider.unavailable = p.unavailable;
    Ok(provider)
}

/// An EPP's metrics URL: its base URL (`http` or `https`, no path) joined with `path`;
/// each part's field name labels its refusal. The controller's resources spell the same
/// two fields (`metricsConfig.endpoint`, `metricsConfig.path`).
pub(crate) fn metrics_url(
    (base_field, base): (&str, &str),
    (path_field, path): (&str, &str),
) -> Result<http::Uri, Error> {
    if !path.starts_with('/') {
        return Err(field_err(path_field, "must start with `/`"));
    }
    let base = parse_url(base_field, base, &["http", "https"])?;
    if base.path() != "/" || base.query().is_some() {
        return Err(field_err(
            base_field,
            "give the base URL only; the path goes in `path`",
        ));
    }
    let joined = format!(
        "{}://{}{}",
        base.scheme_str().unwrap_or("http"),
        base.authority().map_or("", http::uri::Authority::as_str),
        path
    );
    parse_url(path_field, &joined, &["http", "https"])
}

fn check_name(field: &str, name: &str) -> Result<(), Error> {
    grid_daemon::config::name(field, name).map_err(Error::from)
}

fn check_trust_domain(domain: &str) -> Result<(), Error> {
    grid_daemon::config::trust_domain("trust.trustDomain", domain).map_err(Error::from)
}

fn parse_addr(field: &str, text: &str) -> Result<SocketAddr, Error> {
    text.parse()
        .map_err(|e| field_err(field, format!("`{text}` is not an address:port ({e})")))
}

pub(crate) fn parse_url(field: &str, text: &str, schemes: &[&str]) -> Result<http::Uri, Error> {
    let uri: http::Uri = text
        .parse()
        .map_err(|e| field_err(field, format!("`{text}` is not a URL ({e})")))?;
    check_scheme(field, &uri, schemes)?;
    Ok(uri)
}

/// A URL's scheme is one of `schemes` and it names a host.
fn check_scheme(field: &str, uri: &http::Uri, schemes: &[&str]) -> Result<(), Error> {
    let text = uri.to_string();
    match uri.scheme_str() {
        Some(s) if schemes.contains(&s) => {}
        _ => {
            return Err(field_err(
                field,
                format!("`{text}`: scheme must be one of {}", schemes.join(", ")),
            ));
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(field_err(field, format!("`{text}` has no host")));
    }
    Ok(())
}

/// The bounds of every interval and timeout.
const PERIOD: grid_daemon::config::Bounds = grid_daemon::config::Bounds {
    min_ms: MIN_PERIOD_MS,
    max_ms: MAX_PERIOD_MS,
};

pub(crate) fn period(
    field: &str,
    seconds: Option<f64>,
    default: Duration,
) -> Result<Duration, Error> {
    grid_daemon::config::seconds(field, seconds, default, PERIOD).map_err(Error::from)
}

/// A typed period within the bounds [`period`] applies to the file's seconds.
fn check_period(field: &str, d: Duration) -> Result<(), Error> {
    period(field, Some(d.as_secs_f64()), d).map(drop)
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;

    use super::*;

    const PIN: &str = "AB:CD:EF:01:23:45:67:89:ab:cd:ef:01:23:45:67:89:ab:cd:ef:01:23:45:67:89:ab:cd:ef:01:23:45:67:89";

    fn base() -> String {
        format!(
            r#"
site = "a"
network = "prod"
stateDir = "/var/lib/grid"
[listen]
signals = "127.0.0.1:9443"
metrics = "127.0.0.1:9090"
[tls]
cert = "a.pem"
key = "a.key"
[trust]
mode = "pin"
[signalTransport]
mode = "poll"
[[peers]]
name = "b"
url = "https://b.example:9443/v1/site/signals"
fingerprints = ["{PIN}"]
[[providers]]
name = "llama"
url = "http://epp.local:9090"
staleMetricsSeconds = 10
"#
        )
    }

    fn load(text: &str) -> Result<Config, Error> {
        Config::from_toml(text, Path::new("operator.toml"))
    }

    fn refused_field(text: &str) -> String {
        match load(text) {
            Err(Error::ConfigField { field, .. }) => field,
            Err(Error::ConfigSyntax { message, .. }) => format!("syntax: {message}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn example_config_loads_with_defaults() {
        let c = load(&base()).unwrap();
        assert_eq!(c.site, "a");
        assert_eq!(c.scrape_interval, Duration::from_secs(1));
        assert_eq!(c.peer_poll_interval, Duration::from_secs(5));
        assert_eq!(c.transport, TransportMode::Poll);
        assert_eq!(
            c.providers[0].url.to_string(),
            "http://epp.local:9090/metrics"
        );
        assert_eq!(c.providers[0].uid, "a/llama");
        assert_eq!(c.providers[0].stale_metrics, Some(Duration::from_secs(10)));
        assert_eq!(
            c.peers[0].fingerprints[0],
            Fingerprint::parse(&PIN.replace(':', "").to_uppercase()).unwrap()
        );
    }

    #[test]
    fn a_provider_is_available_unless_the_file_says_unavailable_true() {
        assert!(!load(&base()).unwrap().providers[0].unavailable);
        let text = base().replace(
            "staleMetricsSeconds = 10",
            "staleMetricsSeconds = 10\nunavailable = true",
        );
        assert!(load(&text).unwrap().providers[0].unavailable);
        let wrong = base().replace(
            "staleMetricsSeconds = 10",
            "staleMetricsSeconds = 10\nunavailable = \"yes\"",
        );
        assert!(refused_field(&wrong).starts_with("syntax"), "{wrong}");
    }

    #[test]
    fn a_typed_config_meets_the_same_rules_as_a_file() {
        let listen = Listen {
            signals: "127.0.0.1:9443".parse().unwrap(),
            metrics: "127.0.0.1:9090".parse().unwrap(),
        };
        let tls = TlsFiles {
            cert: "a.pem".into(),
            key: "a.key".into(),
            ca: None,
        };
        let pin = Fingerprint::parse(PIN).unwrap();
        let url = || "https://b.example:9443/v1/site/signals".parse().unwrap();
        let typed = Config::new("a", "prod", listen, tls, TrustMode::Pin, "/var/lib/grid")
            .with_peer(PeerConfig::new("b", url(), vec![pin]))
            .with_provider(ProviderConfig::new(
                "a",
                "llama",
                "http://epp.local:9090/metrics".parse().unwrap(),
            ));
        typed.validate().unwrap();
        let mut parsed = load(&base()).unwrap();
        parsed.providers[0].stale_metrics = None;
        assert_eq!(format!("{typed:?}"), format!("{parsed:?}"));
        let field = |c: Config| match c.validate() {
            Err(Error::ConfigField { field, .. }) => field,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert_eq!(
            field(
                typed
                    .clone()
                    .with_peer(PeerConfig::new("a", url(), vec![pin]))
            ),
            "peers[1].name"
        );
        assert_eq!(
            field(
                typed
                    .clone()
                    .with_peer(PeerConfig::new("c", url(), Vec::new()))
            ),
            "peers[1].fingerprints"
        );
        let mut fast = typed.clone();
        fast.scrape_interval = Duration::from_millis(MIN_PERIOD_MS - 1);
        assert_eq!(field(fast), "intervals.scrapeSeconds");
        let mut spiffe = typed;
        spiffe.trust = TrustMode::Spiffe {
            trust_domain: "grid.example".into(),
        };
        assert_eq!(field(spiffe), "tls.ca");
    }

    #[test]
    fn shipped_example_file_loads() {
        let text = include_str!("../../docs/examples/operator.toml");
        let c = load(text).unwrap();
        assert!(!c.providers.is_empty());
    }

    #[test]
    fn gossip_and_an_absent_mode_both_load_as_gossip_and_another_word_is_refused() {
        let gossip = base().replace("mode = \"poll\"", "mode = \"gossip\"");
        assert_eq!(load(&gossip).unwrap().transport, TransportMode::Gossip);
        let absent = base().replace("[signalTransport]\nmode = \"poll\"\n", "");
        assert_eq!(load(&absent).unwrap().transport, TransportMode::Gossip);
        let swim = base().replace("mode = \"poll\"", "mode = \"swim\"");
        let err = load(&swim).unwrap_err().to_string();
        assert!(
            err.contains("signalTransport.mode") && err.contains("`swim` is not a mode"),
            "{err}"
        );
    }

    #[test]
    fn more_than_one_network_is_refused() {
        let two = base().replace("network = \"prod\"", "network = [\"prod\", \"staging\"]");
        assert!(load(&two).unwrap_err().to_string().contains("one network"));
        let one = base().replace("network = \"prod\"", "network = [\"prod\"]");
        assert_eq!(load(&one).unwrap().network, "prod");
    }

    #[test]
    fn bad_values_are_refused_naming_the_field() {
        let cases: &[(&str, &str, &str)] = &[
            ("site = \"a\"", "site = \"A_b\"", "site"),
            (
                "signals = \"127.0.0.1:9443\"",
                "signals = \"nowhere\"",
                "listen.signals",
            ),
            ("mode = \"pin\"", "mode = \"trust-me\"", "trust.mode"),
            ("mode = \"pin\"", "mode = \"spiffe\"", "trust.trustDomain"),
            (
                "url = \"https://b.example:9443/v1/site/signals\"",
                "url = \"http://b.example/v1/site/signals\"",
                "peers[0].url",
            ),
            ("name = \"b\"", "name = \"a\"", "peers[0].name"),
            (
                "url = \"http://epp.local:9090\"",
                "url = \"ftp://epp.local\"",
                "providers[0].url",
            ),
            (
                "staleMetricsSeconds = 10",
                "staleMetricsSeconds = -1",
                "providers[0].staleMetricsSeconds",
            ),
            (
                "staleMetricsSeconds = 10",
                "path = \"metrics\"",
                "providers[0].path",
            ),
            (
                "url = \"http://epp.local:9090\"",
                "url = \"https://epp.local:9090\"",
                "providers[0].caFile",
            ),
        ];
        for (from, to, field) in cases {
            let text = base().replacen(from, to, 1);
            assert_eq!(refused_field(&text), *field, "{to}");
        }
        let bad_pin = base().replace(PIN, "00:11");
        assert_eq!(refused_field(&bad_pin), "peers[0].fingerprints[0]");
        let no_pin = base().replace(&format!("fingerprints = [\"{PIN}\"]"), "");
        assert_eq!(refused_field(&no_pin), "peers[0].fingerprints");
    }

    #[test]
    fn unknown_and_missing_fields_are_refused_naming_them() {
        let unknown = base().replace("stateDir", "stateDirectory");
        let msg = refused_field(&unknown);
        assert!(msg.contains("stateDirectory"), "{msg}");
        let missing = base().replace("key = \"a.key\"\n", "");
        let msg = refused_field(&missing);
        assert!(msg.contains("`key`"), "{msg}");
    }

    #[test]
    fn spiffe_mode_needs_a_ca_and_refuses_pins() {
        let spiffe = base().replace(
            "mode = \"pin\"",
            "mode = \"spiffe\"\ntrustDomain = \"grid.example\"",
        );
        assert_eq!(refused_field(&spiffe), "tls.ca");
        let with_ca = spiffe.replace("key = \"a.key\"", "key = \"a.key\"\nca = \"ca.pem\"");
        assert_eq!(refused_field(&with_ca), "peers[0].fingerprints");
        let ok = with_ca.replace(&format!("fingerprints = [\"{PIN}\"]"), "");
        assert_eq!(
            load(&ok).unwrap().trust,
            TrustMode::Spiffe {
                trust_domain: "grid.example".into()
            }
        );
    }

    #[test]
    fn periods_are_bounded_at_both_ends() {
        let with = |s: &str| {
            base().replace(
                "[signalTransport]",
                &format!("[intervals]\nscrapeSeconds = {s}\n[signalTransport]"),
            )
        };
        assert_eq!(
            load(&with("0.1")).unwrap().scrape_interval,
            Duration::from_millis(MIN_PERIOD_MS)
        );
        assert_eq!(refused_field(&with("0.099")), "intervals.scrapeSeconds");
        assert_eq!(
            load(&with("3600")).unwrap().scrape_interval,
            Duration::from_millis(MAX_PERIOD_MS)
        );
        assert_eq!(refused_field(&with("3600.001")), "intervals.scrapeSeconds");
    }

    fn with_peers(n: usize) -> String {
        let mut text = base();
        for i in 0..n - 1 {
            writeln!(
                text,
                "[[peers]]\nname = \"p{i}\"\nurl = \"https://p{i}.example/v1/site/signals\"\nfingerprints = [\"{PIN}\"]"
            )
            .unwrap();
        }
        text
    }

    #[test]
    fn peer_count_is_capped_at_max_peers() {
        assert_eq!(load(&with_peers(MAX_PEERS)).unwrap().peers.len(), MAX_PEERS);
        assert_eq!(refused_field(&with_peers(MAX_PEERS + 1)), "peers");
    }

    #[test]
    fn provider_count_is_capped_at_max_providers() {
        let with = |n: usize| {
            let mut text = base();
            for i in 0..n - 1 {
                writeln!(
                    text,
                    "[[providers]]\nname = \"m{i}\"\nurl = \"http://e{i}.local\""
                )
                .unwrap();
            }
            text
        };
        assert_eq!(
            load(&with(MAX_PROVIDERS)).unwrap().providers.len(),
            MAX_PROVIDERS
        );
        assert_eq!(refused_field(&with(MAX_PROVIDERS + 1)), "providers");
    }

    #[test]
    fn names_are_capped_at_max_name_len() {
        let name =
            |n: usize| base().replace("site = \"a\"", &format!("site = \"{}\"", "s".repeat(n)));
        assert_eq!(load(&name(MAX_NAME_LEN)).unwrap().site.len(), MAX_NAME_LEN);
        assert_eq!(refused_field(&name(MAX_NAME_LEN + 1)), "site");
    }

    #[test]
    fn declared_mode_is_read_without_validation() {
        let p = Path::new("x.toml");
        assert_eq!(
            declared_mode("[signalTransport]\nmode = \"gossip\"\n", p).unwrap(),
            "gossip"
        );
        assert_eq!(declared_mode("site = 3\n", p).unwrap(), "gossip");
        assert_eq!(declared_mode(&base(), p).unwrap(), "poll");
    }
}
