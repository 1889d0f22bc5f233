//! The gateway's configuration: one TOML file, documented in `docs/gateway.md`.
//!
//! The dialect is the operator's (and the Kubernetes resources'): camelCase keys,
//! durations as `...Seconds` (fractional allowed), names as DNS labels; the shared
//! vocabulary is `grid_daemon::config`. Everything is checked at load, before any socket
//! opens, and a refusal names the key as the file spells it
//! (`models[0].candidates[1].baseUrl`), so a bad rollout fails at start rather than on the
//! first request that reaches the bad entry.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use http::Uri;
use serde::Deserialize;

use crate::Error;
use grid_score::catalog::{CandidateSpec, ModelSpec};
use grid_score::model_field::MAX_MODEL_NAME_BYTES;

/// The example configuration shipped in `docs/examples/gateway.toml`, embedded so the
/// documented example can never rot (a test loads it). The daemon never loads it on its
/// own: it binds `0.0.0.0`, which a gateway started without `--config` must not do.
pub const EXAMPLE_CONFIG_TOML: &str = include_str!("../../../docs/examples/gateway.toml");

/// Smallest accepted request body limit: below 1 KiB not even a short chat request fits.
pub const MIN_BODY_LIMIT_BYTES: usize = 1 << 10;
/// Largest accepted request body limit. Request bodies are held in memory until the
/// upstream is chosen, so this bounds memory per in-flight request; 64 MiB fits
/// base64-encoded images and long contexts.
pub const MAX_BODY_LIMIT_BYTES: usize = 64 << 20;
/// Default request body limit (8 MiB).
pub const DEFAULT_BODY_LIMIT_BYTES: usize = 8 << 20;

/// Fastest accepted poll cadence. The operator scrapes every second; polling much faster
/// only re-reads the same relay.
pub const MIN_POLL_INTERVAL_MS: u64 = 100;
/// Slowest accepted poll cadence: past a minute the store's TTLs expire between polls and
/// every site ranks as unmeasured.
pub const MAX_POLL_INTERVAL_MS: u64 = 60_000;
/// Default poll cadence, the spec's 1 s.
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 1_000;
/// Default budget of one poll exchange; below the interval so polls never overlap.
pub const DEFAULT_POLL_TIMEOUT_MS: u64 = 900;
/// Default and largest budget of one feedback POST: grid-feedback's `REPORT_BUDGET`, the
/// operator's own persist budget plus a second. The POST runs on its own task, so even a
/// slow one never delays a poll; a shorter budget only turns slow persists into `timeout`
/// failures.
pub const MAX_FEEDBACK_TIMEOUT_MS: u64 = grid_feedback::REPORT_BUDGET.as_millis() as u64;
/// Default budget of one feedback POST (see [`MAX_FEEDBACK_TIMEOUT_MS`]).
pub const DEFAULT_FEEDBACK_TIMEOUT_MS: u64 = MAX_FEEDBACK_TIMEOUT_MS;
/// Longest accepted poll or feedback timeout.
pub const MAX_EXCHANGE_TIMEOUT_MS: u64 = 60_000;
/// Default time to establish a connection to a serving site.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Default bound on the wait for a site's answer head after sending
/// (`upstreamHeadersTimeoutSeconds`). A plain completion's head comes only when the whole
/// generation is done, and a site under queueing may hold a request in prefill for long:
/// a minute lets long answers through while an upstream that accepted and went silent is
/// answered 504 instead of holding its client for as long as the client waits.
pub const DEFAULT_UPSTREAM_HEADERS_TIMEOUT_MS: u64 = 60_000;
/// Default bound on the silence between two frames of a site's answer body
/// (`upstreamIdleTimeoutSeconds`). A streaming model server sends a token every few tens
/// of milliseconds and SSE servers send keep-alive comments; 30 s of silence mid-answer
/// is a hung site, and ending the stream frees the client and the gateway's connection.
pub const DEFAULT_UPSTREAM_IDLE_TIMEOUT_MS: u64 = 30_000;
/// Longest accepted upstream header or idle bound: an hour, past which a wait is
/// unbounded in practice.
pub const MAX_UPSTREAM_TIMEOUT_MS: u64 = 3_600_000;
/// Default cap on open client connections (`maxConnections`): half the common 20,000
/// descriptor limit, so the upstream, operator and listener sockets always find a
/// descriptor and an idle-connection flood cannot starve real requests.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Largest accepted `maxConnections`.
pub const MAX_MAX_CONNECTIONS: usize = 1_000_000;
/// Default listen backlog of the API listener (`listenBacklog`): connections the kernel
/// completes and queues before the gateway accepts them. Thousands of clients opening
/// streams at once (a batch job, a reconnect after a restart) overflow a backlog of 128
/// and have their SYNs dropped and retried for seconds; nginx asks for this much. The
/// kernel caps it at `net.core.somaxconn` (4096 by default on current Linux).
pub const DEFAULT_LISTEN_BACKLOG: u32 = 4_096;
/// Largest accepted `listenBacklog` (the kernel's own ceiling for `somaxconn`).
pub const MAX_LISTEN_BACKLOG: u32 = 65_535;
/// Default cap on requests in flight to one site (`maxConnectionsPerSite`), each one
/// upstream connection over HTTP/1.1: far above what a site serves at once (its EPP
/// queues the rest), so only a runaway burst meets it, and it keeps one site from taking
/// every descriptor the client connections leave.
pub const DEFAULT_MAX_CONNECTIONS_PER_SITE: usize = 1_024;
/// Largest accepted `maxConnectionsPerSite`.
pub const MAX_MAX_CONNECTIONS_PER_SITE: usize = 100_000;
/// Default bound on a new client connection's wait for its first request head
/// (`clientHeaderTimeoutSeconds`): a real client sends its request at once; ten seconds
/// covers a slow network while a slow-header connection is closed long before such
/// connections pile up.
pub const DEFAULT_CLIENT_HEADER_TIMEOUT_MS: u64 = 10_000;
/// Default bound on a client connection with no request in flight
/// (`clientIdleTimeoutSeconds`): long enough that a client between requests keeps its
/// connection (and its TLS or TCP setup), short enough that idle connections do not pile
/// up toward the connection cap.
pub const DEFAULT_CLIENT_IDLE_TIMEOUT_MS: u64 = 60_000;
/// Default bound on reading a whole request body once its head arrived
/// (`clientBodyTimeoutSeconds`): a client sends its body right after its head, and even
/// the largest accepted body crosses a slow link in seconds; a client that trickles its
/// body holds a connection, a request slot and a buffer, so past this it gets 408.
pub const DEFAULT_CLIENT_BODY_TIMEOUT_MS: u64 = 30_000;
/// Default bound on a write to a client that makes no progress
/// (`clientWriteTimeoutSeconds`): a client reading a stream takes each event as it comes,
/// and even a congested mobile link drains a socket buffer in seconds; a client that
/// stops reading (its receive window shut, or an HTTP/2 stream held at a zero window)
/// would otherwise hold its answer, the site's generation behind it and one of the
/// site's slots for as long as it likes. Past it the exchange ends and the slot is freed.
pub const DEFAULT_CLIENT_WRITE_TIMEOUT_MS: u64 = 30_000;
/// Longest accepted client header, body or idle bound.
pub const MAX_CLIENT_TIMEOUT_MS: u64 = 3_600_000;
/// Default Retry-After, in seconds, on a 503 (every candidate excluded): grid-score's
/// default, whose reason docs/routing.md gives (a remote site rejoins within one peer
/// poll), so the daemon and the library it embeds agree.
pub const DEFAULT_RETRY_AFTER_S: u64 =
    grid_score::DEFAULT_UNAVAILABLE_RETRY_AFTER_MS.div_ceil(1_000);
/// Longest accepted Retry-After.
pub const MAX_RETRY_AFTER_S: u64 = 3_600;
/// Default `operator.replica`, the diagnostic name of this gateway replica.
pub const DEFAULT_REPLICA: &str = "gateway";

/// Most models one gateway routes.
pub const MAX_MODELS: usize = 1_024;
/// Most candidate (site, provider) pairs for one model.
pub const MAX_CANDIDATES_PER_MODEL: usize = 64;
/// Longest site, provider or replica name, in bytes (a DNS label; the rule both daemons
/// share).
pub const MAX_NAME_BYTES: usize = grid_daemon::config::MAX_NAME_LEN;

/// Longest accepted `routing.turnoverSeconds`: an hour.
pub const MAX_TURNOVER_MS: u64 = 3_600_000;
/// Longest accepted `availability.shedding.fullAfterSeconds` / `roomAfterSeconds`: an
/// hour.
pub const MAX_SHED_WINDOW_MS: u64 = 3_600_000;
/// Shortest accepted exchange timeout (connect, poll, feedback), in milliseconds.
pub const MIN_EXCHANGE_TIMEOUT_MS: u64 = 1;

/// The whole validated configuration; durations in milliseconds.
#[derive(Clone, Debug)]
pub struct Config {
    /// This gateway's site; used in logs and as the feedback replica's default prefix.
    pub site: String,
    /// Where the OpenAI-compatible API and `/metrics` are served (HTTP/1.1 and HTTP/2).
    pub listen: SocketAddr,
    /// Where Envoy's external processing gRPC API is served (`extProcListen`), when
    /// grid also routes for an Envoy in front of it (`docs/envoy.md`). Unset: not served.
    pub ext_proc_listen: Option<SocketAddr>,
    /// Largest request body accepted (`bodyLimitBytes`); bigger bodies get 413.
    pub body_limit_bytes: usize,
    /// Retry-After seconds sent with 503 when every candidate is excluded
    /// (`unavailableRetryAfterSeconds`, whole seconds as the header carries them).
    pub unavailable_retry_after_s: u64,
    /// Time allowed to connect to a serving site before it counts as failed
    /// (`connectTimeoutSeconds`): TCP connect and, for `https` sites, the TLS handshake.
    pub connect_timeout_ms: u64,
    /// Time allowed from sending a request to a site until its answer head arrives
    /// (`upstreamHeadersTimeoutSeconds`); past it the client gets 504.
    pub upstream_headers_timeout_ms: u64,
    /// Longest silence between two frames of a site's answer body
    /// (`upstreamIdleTimeoutSeconds`); past it the answer is cut.
    pub upstream_idle_timeout_ms: u64,
    /// Most client connections open at once (`maxConnections`); more are closed at accept.
    pub max_connections: usize,
    /// The API listener's backlog (`listenBacklog`), capped by the kernel's
    /// `net.core.somaxconn`.
    pub listen_backlog: u32,
    /// Most requests in flight to one site (`maxConnectionsPerSite`); one more waits up
    /// to the connect bound for a slot, then fails over as a failed connect does.
    pub max_connections_per_site: usize,
    /// Time a new client connection has to deliver its first request head
    /// (`clientHeaderTimeoutSeconds`).
    pub client_header_timeout_ms: u64,
    /// Time a client connection may stay open with no request in flight
    /// (`clientIdleTimeoutSeconds`).
    pub client_idle_timeout_ms: u64,
    /// Time a client has to deliver a proxied request's whole body once its head arrived
    /// (`clientBodyTimeoutSeconds`); past it the client gets 408.
    pub client_body_timeout_ms: u64,
    /// Time a write to a client may make no progress before the exchange is ended
    /// (`clientWriteTimeoutSeconds`): the HTTP/1.1 connection is closed, the HTTP/2 stream
    /// reset; either way the site's answer is cancelled and its slot freed.
    pub client_write_timeout_ms: u64,
    /// The local operator whose relay feeds routing.
    pub operator: OperatorConfig,
    /// The gateway's own identity and trust anchors, for the operator and remote sites.
    pub tls: TlsFiles,
    /// How the operator's certificate is trusted (`[trust]`).
    pub trust: OperatorTrust,
    /// Availability knobs.
    pub availability: Availability,
    /// Routing knobs.
    pub routing: RoutingKnobs,
    /// The models served and, for each, where.
    pub models: Vec<ModelConfig>,
}

/// The local operator's signals endpoint.
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    /// `https://host:port` of the operator's mTLS signals listener.
    pub url: String,
    /// The name the operator's certificate must carry (DNS SAN or IP), verified against
    /// `tls.ca`; the connection is refused otherwise and every site ranks as unmeasured.
    pub identity: String,
    /// Cadence of `GET /v1/site/signals` (`pollIntervalSeconds`).
    pub poll_interval_ms: u64,
    /// Budget of one poll exchange, connect to last byte (`pollTimeoutSeconds`).
    pub poll_timeout_ms: u64,
    /// Budget of one `POST /v1/site/signals/ingest` (`feedbackTimeoutSeconds`).
    pub feedback_timeout_ms: u64,
    /// `x-grid-ingest-replica`: a diagnostic name of this gateway replica (a DNS label).
    pub replica: String,
    /// The models and their candidates come from the operator's catalog
    /// (`GET /v1/site/catalog`, the site's Kubernetes resources), followed at every poll
    /// interval, instead of `models` (`catalog`).
    pub catalog: bool,
}

/// PEM files of the gateway's TLS identity. Relative paths are read from the config
/// file's directory.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The site's certificate chain, presented to the operator and to remote sites.
    pub cert: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA bundle that signs the operator's (unless `trust.mode = "pin"`) and remote
    /// sites' certificates; required unless the operator is pinned and no candidate is
    /// `https`.
    pub ca: Option<PathBuf>,
}

/// How the gateway trusts its operator: grid-daemon's trust model, the operator's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OperatorTrust {
    /// `ca` (the default): the operator's certificate chains to `tls.ca` and carries
    /// `operator.identity`.
    Ca,
    /// `pin`: the operator presents this site's own certificate (the one in `tls.cert`,
    /// as the operator's pin mode has it), so no CA is needed to reach it.
    Pin,
    /// `spiffe`: the operator's certificate chains to `tls.ca` and carries
    /// `spiffe://<trustDomain>/site/<site>`.
    Spiffe {
        /// The SPIFFE trust domain.
        trust_domain: String,
    },
}

/// `[availability]`.
#[derive(Clone, Debug, Default)]
pub struct Availability {
    /// `[availability.shedding]`.
    pub shedding: Shedding,
}

/// `[routing]`.
#[derive(Clone, Debug, Default)]
pub struct RoutingKnobs {
    /// How long a request typically holds a slot, ms (`turnoverSeconds`): what a site's
    /// headroom reads until the sites' answers have shown their own turnover (grid-score
    /// learns it per site from answer timing, and reads a site without its own at the
    /// median of the others'; `docs/routing.md`, "Turnover"). Unset: grid-score's
    /// default.
    pub turnover_ms: Option<u64>,
}

/// `[availability.shedding]`: answer 429 when every healthy site of a model is full.
/// Unset durations take grid-score's defaults (see `docs/routing.md`).
#[derive(Clone, Debug, Default)]
pub struct Shedding {
    /// Off by default: a full grid queues rather than refuses.
    pub enabled: bool,
    /// How long every healthy site must have been saturated with work waiting, ms
    /// (`fullAfterSeconds`).
    pub full_after_ms: Option<u64>,
    /// How long no sample may have shown saturation before routing resumes, ms
    /// (`roomAfterSeconds`).
    pub room_after_ms: Option<u64>,
    /// Retry-After seconds sent with 429 (`retryAfterSeconds`, whole seconds).
    pub retry_after_s: Option<u64>,
}

/// One model and its candidates.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// The `model` value clients send.
    pub name: String,
    /// The (site, provider) pairs serving it, each with its serving base URL.
    pub candidates: Vec<Candidate>,
}

/// One place a model is served.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Candidate {
    /// The site, as its operator labels it (`grid_site`).
    pub site: String,
    /// The provider at that site (`grid_provider`).
    pub provider: String,
    /// Where requests go (`baseUrl`): `http://` for the local site, `https://` (with the
    /// gateway's certificate) for remote ones; a path prefix is kept before `/v1/...`.
    pub base_url: String,
}

/// The file as written: camelCase keys, durations in seconds.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConfig {
    site: String,
    listen: SocketAddr,
    ext_proc_listen: Option<SocketAddr>,
    body_limit_bytes: Option<u64>,
    unavailable_retry_after_seconds: Option<u64>,
    connect_timeout_seconds: Option<f64>,
    upstream_headers_timeout_seconds: Option<f64>,
    upstream_idle_timeout_seconds: Option<f64>,
    max_connections: Option<u64>,
    max_connections_per_site: Option<u64>,
    listen_backlog: Option<u64>,
    client_header_timeout_seconds: Option<f64>,
    client_idle_timeout_seconds: Option<f64>,
    client_body_timeout_seconds: Option<f64>,
    client_write_timeout_seconds: Option<f64>,
    operator: RawOperator,
    tls: TlsFiles,
    trust: Option<RawTrust>,
    #[serde(default)]
    availability: RawAvailability,
    #[serde(default)]
    routing: RawRouting,
    #[serde(default)]
    models: Vec<RawModel>,
}

/// The body of the operator's `GET /v1/site/catalog`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCatalog {
    models: Vec<RawModel>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawOperator {
    url: String,
    identity: String,
    poll_interval_seconds: Option<f64>,
    poll_timeout_seconds: Option<f64>,
    feedback_timeout_seconds: Option<f64>,
    replica: Option<String>,
    catalog: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawTrust {
    mode: String,
    trust_domain: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAvailability {
    #[serde(default)]
    shedding: RawShedding,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawShedding {
    #[serde(default)]
    enabled: bool,
    full_after_seconds: Option<f64>,
    room_after_seconds: Option<f64>,
    retry_after_seconds: Option<u64>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawRouting {
    turnover_seconds: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: String,
    candidates: Vec<Candidate>,
}

/// `[trust]`: absent is `ca`, the operator verified by chain and name.
fn trust_of(raw: Option<RawTrust>) -> Result<OperatorTrust, Error> {
    Ok(match raw {
        None => OperatorTrust::Ca,
        Some(t) => match (t.mode.as_str(), t.trust_domain) {
            ("ca", None) => OperatorTrust::Ca,
            ("pin", None) => OperatorTrust::Pin,
            ("spiffe", Some(trust_domain)) => {
                grid_daemon::config::trust_domain("trust.trustDomain", &trust_domain)?;
                OperatorTrust::Spiffe { trust_domain }
            }
            ("spiffe", None) => {
                return Err(field_err("trust.trustDomain", "required in `spiffe` mode"));
            }
            ("ca" | "pin", Some(_)) => {
                return Err(field_err(
                    "trust.trustDomain",
                    "only applies in `spiffe` mode",
                ));
            }
            (other, _) => {
                return Err(field_err(
                    "trust.mode",
                    format!("`{other}` is not a trust mode; use `ca`, `pin` or `spiffe`"),
                ));
            }
        },
    })
}

/// Milliseconds of an optional `...Seconds` value within `min_ms..=max_ms`.
fn ms(field: &str, seconds: Option<f64>, min_ms: u64, max_ms: u64) -> Result<Option<u64>, Error> {
    let Some(s) = seconds else { return Ok(None) };
    let bounds = grid_daemon::config::Bounds { min_ms, max_ms };
    let d = grid_daemon::config::seconds(field, Some(s), std::time::Duration::ZERO, bounds)?;
    Ok(Some(d.as_millis() as u64))
}

/// One bounded duration of the configuration: its key in the file (`...Seconds`), its
/// bounds in milliseconds, where the file gives it and where the typed configuration
/// holds it. [`DURATIONS`] is the one table both the file reader and
/// [`Config::validate`] hold them to, so a typed configuration (an embedder's, a test's)
/// meets exactly the bounds a file does.
struct BoundedDuration {
    key: &'static str,
    min_ms: u64,
    max_ms: u64,
    /// The file's value, in seconds.
    raw: fn(&RawConfig) -> Option<f64>,
    /// The configured value; `None` when unset (the default is decided elsewhere).
    get: fn(&Config) -> Option<u64>,
    set: fn(&mut Config, u64),
}

/// Every bounded duration of the configuration.
const DURATIONS: &[BoundedDuration] = &[
    BoundedDuration {
        key: "operator.pollIntervalSeconds",
        min_ms: MIN_POLL_INTERVAL_MS,
        max_ms: MAX_POLL_INTERVAL_MS,
        raw: |r| r.operator.poll_interval_seconds,
        get: |c| Some(c.operator.poll_interval_ms),
        set: |c, v| c.operator.poll_interval_ms = v,
    },
    BoundedDuration {
        key: "operator.pollTimeoutSeconds",
        min_ms: MIN_EXCHANGE_TIMEOUT_MS,
        max_ms: MAX_EXCHANGE_TIMEOUT_MS,
        raw: |r| r.operator.poll_timeout_seconds,
        get: |c| Some(c.operator.poll_timeout_ms),
        set: |c, v| c.operator.poll_timeout_ms = v,
    },
    BoundedDuration {
        key: "operator.feedbackTimeoutSeconds",
        min_ms: MIN_EXCHANGE_TIMEOUT_MS,
        max_ms: MAX_FEEDBACK_TIMEOUT_MS,
        raw: |r| r.operator.feedback_timeout_seconds,
        get: |c| Some(c.operator.feedback_timeout_ms),
        set: |c, v| c.operator.feedback_timeout_ms = v,
    },
    BoundedDuration {
        key: "connectTimeoutSeconds",
        min_ms: MIN_EXCHANGE_TIMEOUT_MS,
        max_ms: MAX_EXCHANGE_TIMEOUT_MS,
        raw: |r| r.connect_timeout_seconds,
        get: |c| Some(c.connect_timeout_ms),
        set: |c, v| c.connect_timeout_ms = v,
    },
    BoundedDuration {
        key: "upstreamHeadersTimeoutSeconds",
        min_ms: MIN_EXCHANGE_TIMEOUT_MS,
        max_ms: MAX_UPSTREAM_TIMEOUT_MS,
        raw: |r| r.upstream_headers_timeout_seconds,
        get: |c| Some(c.upstream_headers_timeout_ms),
        set: |c, v| c.upstream_headers_timeout_ms = v,
    },
    BoundedDuration {
        key: "upstreamIdleTimeoutSeconds",
        min_ms: MIN_EXCHANGE_TIMEOUT_MS,
        max_ms: MAX_UPSTREAM_TIMEOUT_MS,
        raw: |r| r.upstream_idle_timeout_seconds,
        get: |c| Some(c.upstream_idle_timeout_ms),
        set: |c, v| c.upstream_idle_timeout_ms = v,
    },
    BoundedDuration {
        key: "clientHeaderTimeoutSeconds",
        min_ms: MIN_EXCHANGE_TIMEOUT_MS,
        max_ms: MAX_CLIENT_TIMEOUT_MS,
        raw: |r| r.client_header_timeout_seconds,
        get: |c| Some(c.client_header_timeout_ms),
        set: |c, v| c.client_header_timeout_ms = v,
    },
    BoundedDuration {
        key: "clientIdleTimeoutSeconds",
        min_ms: MIN_EXCHANGE_TIMEOUT_MS,
        max_ms: MAX_CLIENT_TIMEOUT_MS,
        raw: |r| r.client_idle_timeout_seconds,
        get: |c| Some(c.client_idle_timeout_ms),
        set: |c, v| c.client_idle_timeout_ms = v,
    },
    BoundedDuration {
        key: "clientBodyTimeoutSeconds",
        min_ms: MIN_EXCHANGE_TIMEOUT_MS,
        max_ms: MAX_CLIENT_TIMEOUT_MS,
        raw: |r| r.client_body_timeout_seconds,
        get: |c| Some(c.client_body_timeout_ms),
        set: |c, v| c.client_body_timeout_ms = v,
    },
    BoundedDuration {
        key: "clientWriteTimeoutSeconds",
        min_ms: MIN_EXCHANGE_TIMEOUT_MS,
        max_ms: MAX_CLIENT_TIMEOUT_MS,
        raw: |r| r.client_write_timeout_seconds,
        get: |c| Some(c.client_write_timeout_ms),
        set: |c, v| c.client_write_timeout_ms = v,
    },
    BoundedDuration {
        key: "availability.shedding.fullAfterSeconds",
        min_ms: 1,
        max_ms: MAX_SHED_WINDOW_MS,
        raw: |r| r.availability.shedding.full_after_seconds,
        get: |c| c.availability.shedding.full_after_ms,
        set: |c, v| c.availability.shedding.full_after_ms = Some(v),
    },
    BoundedDuration {
        key: "availability.shedding.roomAfterSeconds",
        min_ms: 1,
        max_ms: MAX_SHED_WINDOW_MS,
        raw: |r| r.availability.shedding.room_after_seconds,
        get: |c| c.availability.shedding.room_after_ms,
        set: |c, v| c.availability.shedding.room_after_ms = Some(v),
    },
    BoundedDuration {
        key: "routing.turnoverSeconds",
        min_ms: 1,
        max_ms: MAX_TURNOVER_MS,
        raw: |r| r.routing.turnover_seconds,
        get: |c| c.routing.turnover_ms,
        set: |c, v| c.routing.turnover_ms = Some(v),
    },
];

impl Config {
    /// A configuration with every default the file applies, routing no model yet: the
    /// typed way to build one (tests, embedders), equal to a file that gives only the
    /// required keys. Set fields, add models with [`Config::with_model`], then
    /// [`Config::validate`] as [`Config::from_toml_str`] does.
    ///
    /// ```
    /// use grid_gateway::config::{Candidate, Config, OperatorConfig, TlsFiles};
    ///
    /// let mut config = Config::new(
    ///     "a",
    ///     "127.0.0.1:8080".parse().unwrap(),
    ///     OperatorConfig::new("https://127.0.0.1:9443", "operator.a.example"),
    ///     TlsFiles::new("site.crt", "site.key", Some("ca.crt")),
    /// )
    /// .with_model("m", [Candidate::new("a", "p", "http://127.0.0.1:8000")]);
    /// config.body_limit_bytes = 1 << 20;
    /// config.validate().unwrap();
    /// ```
    pub fn new(
        site: impl Into<String>,
        listen: SocketAddr,
        operator: OperatorConfig,
        tls: TlsFiles,
    ) -> Self {
        Self {
            site: site.into(),
            listen,
            ext_proc_listen: None,
            body_limit_bytes: DEFAULT_BODY_LIMIT_BYTES,
            unavailable_retry_after_s: DEFAULT_RETRY_AFTER_S,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            upstream_headers_timeout_ms: DEFAULT_UPSTREAM_HEADERS_TIMEOUT_MS,
            upstream_idle_timeout_ms: DEFAULT_UPSTREAM_IDLE_TIMEOUT_MS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            listen_backlog: DEFAULT_LISTEN_BACKLOG,
            max_connections_per_site: DEFAULT_MAX_CONNECTIONS_PER_SITE,
            client_header_timeout_ms: DEFAULT_CLIENT_HEADER_TIMEOUT_MS,
            client_idle_timeout_ms: DEFAULT_CLIENT_IDLE_TIMEOUT_MS,
            client_body_timeout_ms: DEFAULT_CLIENT_BODY_TIMEOUT_MS,
            client_write_timeout_ms: DEFAULT_CLIENT_WRITE_TIMEOUT_MS,
            operator,
            tls,
            trust: OperatorTrust::Ca,
            availability: Availability::default(),
            routing: RoutingKnobs::default(),
            models: Vec::new(),
        }
    }

    /// Adds a model served at `candidates`.
    #[must_use]
    pub fn with_model(
        mut self,
        name: impl Into<String>,
        candidates: impl IntoIterator<Item = Candidate>,
    ) -> Self {
        self.models.push(ModelConfig {
            name: name.into(),
            candidates: candidates.into_iter().collect(),
        });
        self
    }
}

impl OperatorConfig {
    /// The operator at `url` whose certificate carries `identity`, polled at the
    /// defaults.
    pub fn new(url: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            identity: identity.into(),
            poll_interval_ms: DEFAULT_POLL_INTERVAL_MS,
            poll_timeout_ms: DEFAULT_POLL_TIMEOUT_MS,
            feedback_timeout_ms: DEFAULT_FEEDBACK_TIMEOUT_MS,
            replica: DEFAULT_REPLICA.to_owned(),
            catalog: false,
        }
    }
}

impl TlsFiles {
    /// The gateway's certificate chain, key and (optionally) CA bundle.
    pub fn new(
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
        ca: Option<impl Into<PathBuf>>,
    ) -> Self {
        Self {
            cert: cert.into(),
            key: key.into(),
            ca: ca.map(Into::into),
        }
    }
}

impl Candidate {
    /// Provider `provider` of `site`, served at `base_url`.
    pub fn new(
        site: impl Into<String>,
        provider: impl Into<String>,
        base_url: impl Into<String>,
    ) -> Self {
        Self {
            site: site.into(),
            provider: provider.into(),
            base_url: base_url.into(),
        }
    }
}

impl Config {
    /// The models and where each is served, as grid-score's catalog.
    ///
    /// # Panics
    ///
    /// Never for a config that passed [`Config::validate`], which checks every base URL.
    pub fn catalog(&self) -> grid_score::catalog::Catalog {
        grid_score::catalog::Catalog::new(&self.catalog_specs())
    }

    /// The models as grid-score's specs (what [`Config::catalog`] is built from, and what a
    /// reload hands the refresher).
    ///
    /// # Panics
    ///
    /// Never for a config that passed [`Config::validate`], which checks every base URL.
    pub fn catalog_specs(&self) -> Vec<ModelSpec> {
        self.models
            .iter()
            .map(|m| ModelSpec {
                name: m.name.clone(),
                candidates: m
                    .candidates
                    .iter()
                    .map(|c| {
                        let uri =
                            parse_base_url("baseUrl", &c.base_url).expect("validated baseUrl");
                        CandidateSpec {
                            site: c.site.clone(),
                            provider: c.provider.clone(),
                            scheme: uri.scheme_str().expect("validated scheme").to_owned(),
                            authority: uri.authority().expect("validated authority").to_string(),
                            prefix: uri.path().trim_end_matches('/').to_owned(),
                        }
                    })
                    .collect(),
            })
            .collect()
    }

    /// grid-score's configuration from `availability.shedding` and the 503 Retry-After;
    /// unset shedding knobs keep grid-score's defaults.
    pub fn score_config(&self) -> grid_score::ScoreConfig {
        let mut c = grid_score::ScoreConfig::default();
        let s = &self.availability.shedding;
        c.shedding.enabled = s.enabled;
        if let Some(v) = s.full_after_ms {
            c.shedding.full_after_ms = v;
        }
        if let Some(v) = s.room_after_ms {
            c.shedding.room_after_ms = v;
        }
        if let Some(v) = s.retry_after_s {
            c.shedding.retry_after_ms = v.saturating_mul(1000);
        }
        c.unavailable_retry_after_ms = self.unavailable_retry_after_s.saturating_mul(1000);
        if let Some(v) = self.routing.turnover_ms {
            c.turnover_ms = v;
        }
        c
    }
}

fn field_err(field: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::ConfigField {
        field: field.into(),
        reason: reason.into(),
    }
}

impl Config {
    /// Parses and validates a TOML document. Relative TLS paths stay relative; see
    /// This configuration with its models replaced by the operator's catalog `body`
    /// (`{"models": [{"name", "candidates": [{"site", "provider", "baseUrl"}]}]}`),
    /// validated as a file's `models` are (the same fields, bounds and messages).
    ///
    /// # Errors
    ///
    /// The body is not a catalog, or its models do not validate.
    pub fn with_catalog(&self, body: &[u8]) -> Result<Self, Error> {
        let raw: RawCatalog = serde_json::from_slice(body).map_err(|e| Error::ConfigField {
            field: "operator catalog".into(),
            reason: e.to_string(),
        })?;
        let mut next = self.clone();
        next.models.clear();
        let next = raw
            .models
            .into_iter()
            .fold(next, |c, m| c.with_model(m.name, m.candidates));
        next.validate()?;
        Ok(next)
    }

    /// [`Config::load`].
    pub fn from_toml_str(text: &str) -> Result<Self, Error> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| Error::ConfigSyntax {
            message: e.to_string(),
        })?;
        let config = Self::from_raw(raw)?;
        config.validate()?;
        Ok(config)
    }

    /// The raw file's values with defaults filled in ([`Config::new`] holds them) and
    /// durations in milliseconds, each `...Seconds` checked against its bounds.
    fn from_raw(raw: RawConfig) -> Result<Self, Error> {
        // Read before the raw file is taken apart below.
        let seconds: Vec<Option<f64>> = DURATIONS.iter().map(|d| (d.raw)(&raw)).collect();
        let o = raw.operator;
        let s = raw.availability.shedding;
        let mut operator = OperatorConfig::new(o.url, o.identity);
        if let Some(r) = o.replica {
            operator.replica = r;
        }
        operator.catalog = o.catalog.unwrap_or(false);
        if operator.catalog && !raw.models.is_empty() {
            return Err(field_err(
                "models",
                "the operator's catalog gives them (`operator.catalog = true`): list none",
            ));
        }
        let mut config = Self::new(raw.site, raw.listen, operator, raw.tls);
        for (d, seconds) in DURATIONS.iter().zip(seconds) {
            if let Some(v) = ms(d.key, seconds, d.min_ms, d.max_ms)? {
                (d.set)(&mut config, v);
            }
        }
        config.ext_proc_listen = raw.ext_proc_listen;
        if let Some(n) = raw.body_limit_bytes {
            config.body_limit_bytes = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(s) = raw.unavailable_retry_after_seconds {
            config.unavailable_retry_after_s = s;
        }
        if let Some(n) = raw.max_connections_per_site {
            config.max_connections_per_site = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(n) = raw.max_connections {
            config.max_connections = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(n) = raw.listen_backlog {
            config.listen_backlog = u32::try_from(n).unwrap_or(u32::MAX);
        }
        config.trust = trust_of(raw.trust)?;
        config.availability.shedding.enabled = s.enabled;
        config.availability.shedding.retry_after_s = s.retry_after_seconds;
        Ok(raw
            .models
            .into_iter()
            .fold(config, |c, m| c.with_model(m.name, m.candidates)))
    }

    /// Reads, parses and validates the file; relative TLS paths are resolved against the
    /// file's directory so a config and its PEM files can move together.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut config = Self::from_toml_str(&text)?;
        if let Some(dir) = path.parent() {
            for p in [&mut config.tls.cert, &mut config.tls.key]
                .into_iter()
                .chain(config.tls.ca.as_mut())
            {
                if p.is_relative() {
                    *p = dir.join(&*p);
                }
            }
        }
        Ok(config)
    }

    /// Every duration of [`DURATIONS`] within its bounds, and the header bound above the
    /// connect bound.
    fn validate_durations(&self) -> Result<(), Error> {
        for d in DURATIONS {
            if let Some(v) = (d.get)(self) {
                check_range(d.key, v, d.min_ms, d.max_ms)?;
            }
        }
        // The header bound counts from sending, and sending starts with connecting: a
        // header bound at or below the connect bound would answer a slow connect 504
        // (not retried) before the connect bound could fail it over to another site.
        if self.upstream_headers_timeout_ms <= self.connect_timeout_ms {
            return Err(field_err(
                "upstreamHeadersTimeoutSeconds",
                format!(
                    "must exceed connectTimeoutSeconds ({} ms): it counts from sending, connect included",
                    self.connect_timeout_ms
                ),
            ));
        }
        Ok(())
    }

    /// Checks every bound and cross-field rule; the error names the first bad field.
    pub fn validate(&self) -> Result<(), Error> {
        check_name("site", &self.site)?;
        // Port 0 asks the kernel for a free port each time: two of them never collide.
        if self.ext_proc_listen == Some(self.listen) && self.listen.port() != 0 {
            return Err(field_err(
                "extProcListen",
                format!(
                    "must differ from listen ({}): the API (HTTP) and Envoy's processor (gRPC) each need their own port",
                    self.listen
                ),
            ));
        }
        check_range(
            "bodyLimitBytes",
            self.body_limit_bytes as u64,
            MIN_BODY_LIMIT_BYTES as u64,
            MAX_BODY_LIMIT_BYTES as u64,
        )?;
        check_range(
            "unavailableRetryAfterSeconds",
            self.unavailable_retry_after_s,
            1,
            MAX_RETRY_AFTER_S,
        )?;
        self.validate_durations()?;
        check_range(
            "maxConnections",
            self.max_connections as u64,
            1,
            MAX_MAX_CONNECTIONS as u64,
        )?;
        check_range(
            "maxConnectionsPerSite",
            self.max_connections_per_site as u64,
            1,
            MAX_MAX_CONNECTIONS_PER_SITE as u64,
        )?;
        check_range(
            "listenBacklog",
            u64::from(self.listen_backlog),
            1,
            u64::from(MAX_LISTEN_BACKLOG),
        )?;
        self.operator.validate()?;
        let needs_ca = match &self.trust {
            OperatorTrust::Pin => None,
            OperatorTrust::Ca => Some("the operator is verified by chain and name"),
            OperatorTrust::Spiffe { .. } => Some("required in `spiffe` mode"),
        }
        .or_else(|| {
            self.models
                .iter()
                .flat_map(|m| &m.candidates)
                .any(|c| c.base_url.starts_with("https://"))
                .then_some("an `https` candidate is verified by chain and name")
        });
        if let (Some(why), None) = (needs_ca, &self.tls.ca) {
            return Err(field_err("tls.ca", why));
        }
        if let Some(v) = self.availability.shedding.retry_after_s {
            check_range(
                "availability.shedding.retryAfterSeconds",
                v,
                1,
                MAX_RETRY_AFTER_S,
            )?;
        }
        if self.models.is_empty() && !self.operator.catalog {
            return Err(field_err("models", "must list at least one model"));
        }
        if self.models.len() > MAX_MODELS {
            return Err(field_err(
                "models",
                format!("lists more than {MAX_MODELS} models"),
            ));
        }
        let mut names = HashSet::new();
        for (i, m) in self.models.iter().enumerate() {
            m.validate(i)?;
            if !names.insert(m.name.as_str()) {
                return Err(field_err(
                    format!("models[{i}].name"),
                    format!("repeats model {:?}", m.name),
                ));
            }
        }
        Ok(())
    }
}

impl OperatorConfig {
    fn validate(&self) -> Result<(), Error> {
        let uri = parse_base_url("operator.url", &self.url)?;
        if uri.scheme_str() != Some("https") {
            return Err(field_err(
                "operator.url",
                "must be https:// (the signals listener is mTLS)",
            ));
        }
        if rustls_pki_types::ServerName::try_from(self.identity.as_str()).is_err() {
            return Err(field_err(
                "operator.identity",
                "is not a DNS name or IP address",
            ));
        }
        check_name("operator.replica", &self.replica)
    }
}

impl ModelConfig {
    fn validate(&self, i: usize) -> Result<(), Error> {
        if self.name.is_empty() || self.name.len() > MAX_MODEL_NAME_BYTES {
            return Err(field_err(
                format!("models[{i}].name"),
                format!("must be 1 to {MAX_MODEL_NAME_BYTES} bytes"),
            ));
        }
        if self.candidates.is_empty() {
            return Err(field_err(
                format!("models[{i}].candidates"),
                "must list at least one candidate",
            ));
        }
        if self.candidates.len() > MAX_CANDIDATES_PER_MODEL {
            return Err(field_err(
                format!("models[{i}].candidates"),
                format!("lists more than {MAX_CANDIDATES_PER_MODEL} candidates"),
            ));
        }
        let mut seen = HashSet::new();
        for (j, c) in self.candidates.iter().enumerate() {
            let at = format!("models[{i}].candidates[{j}]");
            check_name(&format!("{at}.site"), &c.site)?;
            check_name(&format!("{at}.provider"), &c.provider)?;
            parse_base_url(&format!("{at}.baseUrl"), &c.base_url)?;
            if !seen.insert((c.site.as_str(), c.provider.as_str())) {
                return Err(field_err(
                    at,
                    format!("repeats site {:?} provider {:?}", c.site, c.provider),
                ));
            }
        }
        Ok(())
    }
}

/// Parses an `http(s)://host[:port][/prefix]` URL with no query.
pub(crate) fn parse_base_url(field: &str, url: &str) -> Result<Uri, Error> {
    let uri: Uri = url
        .parse()
        .map_err(|e| field_err(field, format!("is not a URL: {e}")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(field_err(field, "must start with http:// or https://"));
    }
    if uri.authority().is_none_or(|a| a.host().is_empty()) {
        return Err(field_err(field, "has no host"));
    }
    if uri.query().is_some() {
        return Err(field_err(field, "must not carry a query"));
    }
    Ok(uri)
}

fn check_name(field: &str, name: &str) -> Result<(), Error> {
    grid_daemon::config::name(field, name).map_err(Error::from)
}

fn check_range(field: &str, v: u64, lo: u64, hi: u64) -> Result<(), Error> {
    grid_daemon::config::range(field, v, lo, hi).map_err(Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::fmt::Write as _;

    const MINIMAL: &str = r#"
        site = "a"
        listen = "127.0.0.1:8080"
        [operator]
        url = "https://127.0.0.1:9443"
        identity = "operator.a.example"
        [tls]
        cert = "gw.crt"
        key = "gw.key"
        ca = "ca.crt"
        [[models]]
        name = "m"
        [[models.candidates]]
        site = "a"
        provider = "p"
        baseUrl = "http://127.0.0.1:8000"
    "#;

    fn refused_field(text: &str) -> String {
        match Config::from_toml_str(text) {
            Err(Error::ConfigField { field, .. }) => field,
            Err(Error::ConfigSyntax { message }) => format!("syntax: {message}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn with_the_operators_catalog_the_file_lists_no_model_and_the_catalog_validates_as_a_file_would()
     {
        let head = MINIMAL.split("[[models]]").next().unwrap().to_owned();
        let following = head.replace(
            "identity = \"operator.a.example\"\n",
            "identity = \"operator.a.example\"\n        catalog = true\n",
        );
        let config = Config::from_toml_str(&following).unwrap();
        assert!(config.operator.catalog && config.models.is_empty());
        // Without the catalog a file must list its models; with it, it lists none.
        assert_eq!(refused_field(&head), "models");
        let both = MINIMAL.replace(
            "identity = \"operator.a.example\"\n",
            "identity = \"operator.a.example\"\n        catalog = true\n",
        );
        assert_eq!(refused_field(&both), "models");
        let catalog = br#"{"models": [{"name": "llama-3", "candidates": [
            {"site": "a", "provider": "llama", "baseUrl": "http://10.0.0.1:8000"},
            {"site": "b", "provider": "llama", "baseUrl": "https://b.example:8443"}]}]}"#;
        let next = config.with_catalog(catalog).unwrap();
        assert_eq!(next.models.len(), 1);
        assert_eq!(next.models[0].candidates.len(), 2);
        assert!(
            config
                .with_catalog(br#"{"models": []}"#)
                .unwrap()
                .models
                .is_empty()
        );
        // The same checks as a file's models, naming the same fields.
        let bad = br#"{"models": [{"name": "m", "candidates": [
            {"site": "a", "provider": "p", "baseUrl": "ftp://x"}]}]}"#;
        match config.with_catalog(bad) {
            Err(Error::ConfigField { field, .. }) => {
                assert_eq!(field, "models[0].candidates[0].baseUrl");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(config.with_catalog(b"not json").is_err());
    }

    #[test]
    fn the_kubernetes_examples_gateway_configuration_loads_and_follows_the_catalog() {
        let yaml = include_str!("../../../docs/examples/kubernetes/gateway.yaml");
        // The ConfigMap's `gateway.toml: |` block, its indentation removed.
        let block = yaml
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("gateway.toml: |"))
            .skip(1)
            .take_while(|l| l.is_empty() || l.starts_with("    "))
            .fold(String::new(), |mut text, l| {
                text.push_str(l.get(4..).unwrap_or_default());
                text.push('\n');
                text
            });
        let config = Config::from_toml_str(&block).unwrap();
        assert!(config.operator.catalog);
        assert!(config.models.is_empty());
        assert_eq!(config.trust, OperatorTrust::Pin);
    }

    #[test]
    fn the_ext_proc_listener_is_optional_and_refused_on_the_api_port() {
        let minimal = Config::from_toml_str(MINIMAL).unwrap();
        assert_eq!(minimal.ext_proc_listen, None, "not served unless asked");
        let on = MINIMAL.replacen(
            "listen = ",
            "extProcListen = \"127.0.0.1:9002\"\nlisten = ",
            1,
        );
        assert_eq!(
            Config::from_toml_str(&on).unwrap().ext_proc_listen,
            Some("127.0.0.1:9002".parse().unwrap())
        );
        let mut same = Config::from_toml_str(MINIMAL).unwrap();
        same.ext_proc_listen = Some(same.listen);
        let err = same.validate().unwrap_err().to_string();
        assert!(err.contains("extProcListen"), "{err}");
        // Port 0 on both: two free ports, no collision.
        same.listen.set_port(0);
        same.ext_proc_listen = Some(same.listen);
        same.validate().unwrap();
        let bad = MINIMAL.replacen("listen = ", "extProcListen = \"nowhere\"\nlisten = ", 1);
        let err = Config::from_toml_str(&bad).unwrap_err().to_string();
        assert!(err.contains("extProcListen"), "{err}");
    }

    #[test]
    fn shipped_example_loads() {
        let c = Config::from_toml_str(EXAMPLE_CONFIG_TOML).unwrap();
        assert_eq!(c.operator.poll_interval_ms, 1_000);
        assert!(c.models.len() >= 2);
    }

    #[test]
    fn the_typed_builder_equals_the_minimal_file() {
        let typed = Config::new(
            "a",
            "127.0.0.1:8080".parse().unwrap(),
            OperatorConfig::new("https://127.0.0.1:9443", "operator.a.example"),
            TlsFiles::new("gw.crt", "gw.key", Some("ca.crt")),
        )
        .with_model("m", [Candidate::new("a", "p", "http://127.0.0.1:8000")]);
        let parsed = Config::from_toml_str(MINIMAL).unwrap();
        assert_eq!(format!("{typed:?}"), format!("{parsed:?}"));
    }

    #[test]
    fn a_typed_config_is_held_to_the_operator_bounds_the_file_has() {
        let base = Config::from_toml_str(MINIMAL).unwrap();
        let field = |tune: &dyn Fn(&mut OperatorConfig)| {
            let mut c = base.clone();
            tune(&mut c.operator);
            match c.validate() {
                Ok(()) => String::new(),
                Err(Error::ConfigField { field, .. }) => field,
                Err(e) => panic!("{e}"),
            }
        };
        for (name, set, lo, hi) in [
            (
                "operator.pollIntervalSeconds",
                (|o: &mut OperatorConfig, v| o.poll_interval_ms = v)
                    as fn(&mut OperatorConfig, u64),
                MIN_POLL_INTERVAL_MS,
                MAX_POLL_INTERVAL_MS,
            ),
            (
                "operator.pollTimeoutSeconds",
                |o, v| o.poll_timeout_ms = v,
                MIN_EXCHANGE_TIMEOUT_MS,
                MAX_EXCHANGE_TIMEOUT_MS,
            ),
            (
                "operator.feedbackTimeoutSeconds",
                |o, v| o.feedback_timeout_ms = v,
                MIN_EXCHANGE_TIMEOUT_MS,
                MAX_FEEDBACK_TIMEOUT_MS,
            ),
        ] {
            assert_eq!(field(&|o| set(o, lo)), "", "{name} at {lo}");
            assert_eq!(field(&|o| set(o, hi)), "", "{name} at {hi}");
            assert_eq!(field(&|o| set(o, lo - 1)), name, "{name} under");
            assert_eq!(field(&|o| set(o, hi + 1)), name, "{name} over");
        }
    }

    #[test]
    fn minimal_config_takes_the_documented_defaults() {
        let c = Config::from_toml_str(MINIMAL).unwrap();
        assert_eq!(c.body_limit_bytes, DEFAULT_BODY_LIMIT_BYTES);
        assert_eq!(c.operator.poll_interval_ms, DEFAULT_POLL_INTERVAL_MS);
        assert_eq!(c.operator.feedback_timeout_ms, DEFAULT_FEEDBACK_TIMEOUT_MS);
        assert!(!c.availability.shedding.enabled);
    }

    #[test]
    fn feedback_timeout_is_capped_at_the_report_budget() {
        let with = |n: u64| {
            MINIMAL.replace(
                "[operator]",
                &format!("[operator]\nfeedbackTimeoutSeconds = {}", n as f64 / 1000.0),
            )
        };
        assert!(Config::from_toml_str(&with(MAX_FEEDBACK_TIMEOUT_MS)).is_ok());
        assert_eq!(
            refused_field(&with(MAX_FEEDBACK_TIMEOUT_MS + 1)),
            "operator.feedbackTimeoutSeconds"
        );
    }

    #[test]
    fn shedding_knobs_reach_the_score_config_and_unset_ones_keep_its_defaults() {
        let text = MINIMAL.to_owned()
            + "[availability.shedding]\nenabled = true\nfullAfterSeconds = 0.7\nretryAfterSeconds = 3\n";
        let c = Config::from_toml_str(&text).unwrap().score_config();
        assert!(c.shedding.enabled);
        assert_eq!(c.shedding.full_after_ms, 700);
        assert_eq!(c.shedding.room_after_ms, grid_score::DEFAULT_ROOM_AFTER_MS);
        assert_eq!(c.shedding.retry_after_ms, 3000);
        assert_eq!(c.unavailable_retry_after_ms, DEFAULT_RETRY_AFTER_S * 1000);
        assert_eq!(
            c.unavailable_retry_after_ms,
            grid_score::DEFAULT_UNAVAILABLE_RETRY_AFTER_MS,
            "the daemon's 503 Retry-After default is the one docs/routing.md gives"
        );
    }

    #[test]
    fn the_turnover_prior_reaches_the_score_config_and_is_refused_past_its_bounds() {
        let with = |v: u64| {
            MINIMAL.to_owned() + &format!("[routing]\nturnoverSeconds = {}\n", v as f64 / 1000.0)
        };
        let c = Config::from_toml_str(&with(8_000)).unwrap().score_config();
        assert_eq!(c.turnover_ms, 8_000);
        assert_eq!(
            Config::from_toml_str(MINIMAL)
                .unwrap()
                .score_config()
                .turnover_ms,
            grid_score::DEFAULT_TURNOVER_MS
        );
        assert!(Config::from_toml_str(&with(1)).is_ok());
        assert!(Config::from_toml_str(&with(MAX_TURNOVER_MS)).is_ok());
        assert_eq!(refused_field(&with(0)), "routing.turnoverSeconds");
        assert_eq!(
            refused_field(&with(MAX_TURNOVER_MS + 1)),
            "routing.turnoverSeconds"
        );
    }

    #[test]
    fn unknown_field_is_refused_by_name() {
        let text = MINIMAL.replace("[operator]", "[operator]\npollIntervallSeconds = 5");
        let err = refused_field(&text);
        assert!(err.contains("pollIntervallSeconds"), "{err}");
    }

    #[test]
    fn missing_field_is_refused_by_name() {
        let text = MINIMAL.replace("identity = \"operator.a.example\"", "");
        let err = refused_field(&text);
        assert!(err.contains("identity"), "{err}");
    }

    #[test]
    fn bad_base_url_is_refused_naming_its_path() {
        let text = MINIMAL.replace("http://127.0.0.1:8000", "ftp://x");
        assert_eq!(refused_field(&text), "models[0].candidates[0].baseUrl");
        let text = MINIMAL.replace("http://127.0.0.1:8000", "http://x/?q=1");
        assert_eq!(refused_field(&text), "models[0].candidates[0].baseUrl");
    }

    #[test]
    fn plain_http_operator_is_refused() {
        let text = MINIMAL.replace("https://127.0.0.1:9443", "http://127.0.0.1:9443");
        assert_eq!(refused_field(&text), "operator.url");
    }

    #[test]
    fn repeated_candidate_and_model_are_refused() {
        let dup = MINIMAL.to_owned()
            + "[[models.candidates]]\nsite = \"a\"\nprovider = \"p\"\nbaseUrl = \"http://x\"\n";
        assert_eq!(refused_field(&dup), "models[0].candidates[1]");
        let dup_model = MINIMAL.to_owned()
            + "[[models]]\nname = \"m\"\n[[models.candidates]]\nsite = \"b\"\nprovider = \"p\"\nbaseUrl = \"http://x\"\n";
        assert_eq!(refused_field(&dup_model), "models[1].name");
    }

    #[test]
    fn body_limit_is_bounded_at_both_ends() {
        let with =
            |n: usize| MINIMAL.replace("listen =", &format!("bodyLimitBytes = {n}\nlisten ="));
        assert!(Config::from_toml_str(&with(MIN_BODY_LIMIT_BYTES)).is_ok());
        assert_eq!(
            refused_field(&with(MIN_BODY_LIMIT_BYTES - 1)),
            "bodyLimitBytes"
        );
        assert!(Config::from_toml_str(&with(MAX_BODY_LIMIT_BYTES)).is_ok());
        assert_eq!(
            refused_field(&with(MAX_BODY_LIMIT_BYTES + 1)),
            "bodyLimitBytes"
        );
    }

    #[test]
    fn poll_interval_is_bounded_at_both_ends() {
        let with = |n: u64| {
            MINIMAL.replace(
                "[operator]",
                &format!("[operator]\npollIntervalSeconds = {}", n as f64 / 1000.0),
            )
        };
        assert!(Config::from_toml_str(&with(MIN_POLL_INTERVAL_MS)).is_ok());
        assert_eq!(
            refused_field(&with(MIN_POLL_INTERVAL_MS - 1)),
            "operator.pollIntervalSeconds"
        );
        assert!(Config::from_toml_str(&with(MAX_POLL_INTERVAL_MS)).is_ok());
        assert_eq!(
            refused_field(&with(MAX_POLL_INTERVAL_MS + 1)),
            "operator.pollIntervalSeconds"
        );
    }

    #[test]
    fn candidates_per_model_are_capped_at_the_boundary() {
        let with = |n: usize| {
            let mut t = MINIMAL.to_owned();
            for k in 1..n {
                let _ = write!(
                    t,
                    "[[models.candidates]]\nsite = \"s{k}\"\nprovider = \"p\"\nbaseUrl = \"http://x\"\n"
                );
            }
            t
        };
        assert!(Config::from_toml_str(&with(MAX_CANDIDATES_PER_MODEL)).is_ok());
        assert_eq!(
            refused_field(&with(MAX_CANDIDATES_PER_MODEL + 1)),
            "models[0].candidates"
        );
    }

    #[test]
    fn names_are_capped_at_the_boundary() {
        let with = |n: usize| {
            MINIMAL.replace(
                "provider = \"p\"",
                &format!("provider = \"{}\"", "p".repeat(n)),
            )
        };
        assert!(Config::from_toml_str(&with(MAX_NAME_BYTES)).is_ok());
        assert_eq!(
            refused_field(&with(MAX_NAME_BYTES + 1)),
            "models[0].candidates[0].provider"
        );
    }

    #[test]
    fn a_name_follows_the_operators_dns_label_rule() {
        // Site_A passed the gateway's old rule and failed the operator's: one rule now.
        let text = MINIMAL.replace(
            "site = \"a\"\n        listen",
            "site = \"Site_A\"\n        listen",
        );
        assert_eq!(refused_field(&text), "site");
        let err = Config::from_toml_str(&text).unwrap_err().to_string();
        assert!(
            err.starts_with("configuration field `site`: `Site_A` is not a DNS label"),
            "{err}"
        );
    }

    #[test]
    fn durations_are_seconds_and_may_be_fractional() {
        let text = MINIMAL.replace(
            "[operator]",
            "connectTimeoutSeconds = 0.25\n[operator]\npollTimeoutSeconds = 0.5",
        );
        let c = Config::from_toml_str(&text).unwrap();
        assert_eq!(c.connect_timeout_ms, 250);
        assert_eq!(c.operator.poll_timeout_ms, 500);
        let text = MINIMAL.replace("[operator]", "connectTimeoutSeconds = 0.0001\n[operator]");
        assert_eq!(refused_field(&text), "connectTimeoutSeconds");
    }

    #[test]
    fn every_wait_is_bounded_at_both_ends() {
        // The header bound must exceed the connect bound: each end of one is tried with
        // the other out of its way.
        let long_headers = "upstreamHeadersTimeoutSeconds = 3600\n";
        for (key, max_ms, other) in [
            ("upstreamHeadersTimeoutSeconds", MAX_UPSTREAM_TIMEOUT_MS, ""),
            ("upstreamIdleTimeoutSeconds", MAX_UPSTREAM_TIMEOUT_MS, ""),
            ("clientHeaderTimeoutSeconds", MAX_CLIENT_TIMEOUT_MS, ""),
            ("clientIdleTimeoutSeconds", MAX_CLIENT_TIMEOUT_MS, ""),
            ("clientBodyTimeoutSeconds", MAX_CLIENT_TIMEOUT_MS, ""),
            ("clientWriteTimeoutSeconds", MAX_CLIENT_TIMEOUT_MS, ""),
            (
                "connectTimeoutSeconds",
                MAX_EXCHANGE_TIMEOUT_MS,
                long_headers,
            ),
        ] {
            let with = |ms: u64| {
                MINIMAL.replace(
                    "[operator]",
                    &format!("{other}{key} = {}\n[operator]", ms as f64 / 1000.0),
                )
            };
            if key == "upstreamHeadersTimeoutSeconds" {
                // Its lowest accepted value is one past the (lowest) connect bound.
                let lowest = |ms: u64| {
                    MINIMAL.replace(
                        "[operator]",
                        &format!(
                            "connectTimeoutSeconds = 0.001\n{key} = {}\n[operator]",
                            ms as f64 / 1000.0
                        ),
                    )
                };
                assert!(Config::from_toml_str(&lowest(MIN_EXCHANGE_TIMEOUT_MS + 1)).is_ok());
                assert_eq!(refused_field(&lowest(MIN_EXCHANGE_TIMEOUT_MS)), key);
                assert!(Config::from_toml_str(&with(max_ms)).is_ok());
                assert_eq!(refused_field(&with(0)), key);
                assert_eq!(refused_field(&with(max_ms + 1)), key);
                continue;
            }
            assert!(Config::from_toml_str(&with(MIN_EXCHANGE_TIMEOUT_MS)).is_ok());
            assert!(Config::from_toml_str(&with(max_ms)).is_ok());
            assert_eq!(refused_field(&with(0)), key);
            assert_eq!(refused_field(&with(max_ms + 1)), key);
        }
    }

    #[test]
    fn the_waits_default_to_the_documented_values() {
        let c = Config::from_toml_str(MINIMAL).unwrap();
        assert_eq!(c.upstream_headers_timeout_ms, 60_000);
        assert_eq!(c.upstream_idle_timeout_ms, 30_000);
        assert_eq!(c.client_header_timeout_ms, 10_000);
        assert_eq!(c.client_idle_timeout_ms, 60_000);
        assert_eq!(c.client_write_timeout_ms, 30_000);
        assert_eq!(c.max_connections, 10_000);
        let text = MINIMAL.replace("[operator]", "upstreamIdleTimeoutSeconds = 0.3\n[operator]");
        assert_eq!(
            Config::from_toml_str(&text)
                .unwrap()
                .upstream_idle_timeout_ms,
            300
        );
    }

    #[test]
    fn the_client_body_bound_defaults_to_thirty_seconds_and_is_read_from_the_file() {
        let c = Config::from_toml_str(MINIMAL).unwrap();
        assert_eq!(c.client_body_timeout_ms, DEFAULT_CLIENT_BODY_TIMEOUT_MS);
        assert_eq!(DEFAULT_CLIENT_BODY_TIMEOUT_MS, 30_000);
        let text = MINIMAL.replace("[operator]", "clientBodyTimeoutSeconds = 0.3\n[operator]");
        assert_eq!(
            Config::from_toml_str(&text).unwrap().client_body_timeout_ms,
            300
        );
    }

    #[test]
    fn a_header_bound_not_above_the_connect_bound_is_refused_naming_the_header_bound() {
        let with = |connect: &str, headers: &str| {
            MINIMAL.replace(
                "[operator]",
                &format!(
                    "connectTimeoutSeconds = {connect}\nupstreamHeadersTimeoutSeconds = {headers}\n[operator]"
                ),
            )
        };
        assert_eq!(
            refused_field(&with("5", "5")),
            "upstreamHeadersTimeoutSeconds"
        );
        assert_eq!(
            refused_field(&with("5", "4")),
            "upstreamHeadersTimeoutSeconds"
        );
        assert!(Config::from_toml_str(&with("5", "5.001")).is_ok());
        let err = Config::from_toml_str(&with("5", "5"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("connectTimeoutSeconds"), "{err}");
        // Built in code, the same rule holds.
        let mut c = Config::from_toml_str(MINIMAL).unwrap();
        c.upstream_headers_timeout_ms = c.connect_timeout_ms;
        assert!(c.validate().is_err());
    }

    #[test]
    fn the_per_site_cap_is_bounded_at_both_ends_and_defaults_to_its_constant() {
        let with = |n: usize| {
            MINIMAL.replace(
                "listen =",
                &format!("maxConnectionsPerSite = {n}\nlisten ="),
            )
        };
        assert_eq!(
            Config::from_toml_str(MINIMAL)
                .unwrap()
                .max_connections_per_site,
            DEFAULT_MAX_CONNECTIONS_PER_SITE
        );
        assert!(Config::from_toml_str(&with(1)).is_ok());
        assert!(Config::from_toml_str(&with(MAX_MAX_CONNECTIONS_PER_SITE)).is_ok());
        assert_eq!(refused_field(&with(0)), "maxConnectionsPerSite");
        assert_eq!(
            refused_field(&with(MAX_MAX_CONNECTIONS_PER_SITE + 1)),
            "maxConnectionsPerSite"
        );
    }

    #[test]
    fn the_connection_cap_is_bounded_at_both_ends() {
        let with =
            |n: usize| MINIMAL.replace("listen =", &format!("maxConnections = {n}\nlisten ="));
        assert!(Config::from_toml_str(&with(1)).is_ok());
        assert!(Config::from_toml_str(&with(MAX_MAX_CONNECTIONS)).is_ok());
        assert_eq!(refused_field(&with(0)), "maxConnections");
        assert_eq!(
            refused_field(&with(MAX_MAX_CONNECTIONS + 1)),
            "maxConnections"
        );
    }

    #[test]
    fn the_listen_backlog_defaults_high_and_is_bounded_at_both_ends() {
        assert_eq!(
            Config::from_toml_str(MINIMAL).unwrap().listen_backlog,
            DEFAULT_LISTEN_BACKLOG
        );
        let with = |n: u64| MINIMAL.replace("listen =", &format!("listenBacklog = {n}\nlisten ="));
        assert_eq!(Config::from_toml_str(&with(1)).unwrap().listen_backlog, 1);
        assert!(Config::from_toml_str(&with(u64::from(MAX_LISTEN_BACKLOG))).is_ok());
        assert_eq!(refused_field(&with(0)), "listenBacklog");
        assert_eq!(
            refused_field(&with(u64::from(MAX_LISTEN_BACKLOG) + 1)),
            "listenBacklog"
        );
    }

    #[test]
    fn every_duration_is_held_to_the_same_bounds_by_the_file_and_by_validate() {
        let base = Config::from_toml_str(MINIMAL).unwrap();
        let refused_by_validate = |d: &BoundedDuration, v: u64| {
            let mut c = base.clone();
            (d.set)(&mut c, v);
            // Keep the one cross-field rule out of the way of the bound under test.
            if d.key == "connectTimeoutSeconds" {
                c.upstream_headers_timeout_ms = MAX_UPSTREAM_TIMEOUT_MS;
            }
            if d.key == "upstreamHeadersTimeoutSeconds" {
                c.connect_timeout_ms = MIN_EXCHANGE_TIMEOUT_MS;
            }
            match c.validate() {
                Ok(()) => None,
                Err(Error::ConfigField { field, .. }) => Some(field),
                Err(e) => panic!("{e}"),
            }
        };
        // The file's key `a.b.cKey` as TOML: a `[a.b]` table holding `cKey`.
        let file_with = |d: &BoundedDuration, ms: u64| {
            let (table, key) = d.key.rsplit_once('.').unwrap_or(("", d.key));
            let line = format!("{key} = {}\n", ms as f64 / 1000.0);
            let mut text = MINIMAL.to_owned();
            if table == "operator" {
                text = text.replace("[operator]\n", &format!("[operator]\n{line}"));
            } else if table.is_empty() {
                text = line + &text;
            } else {
                text = format!("{text}[{table}]\n{line}");
            }
            let other = match d.key {
                "connectTimeoutSeconds" => MAX_UPSTREAM_TIMEOUT_MS,
                "upstreamHeadersTimeoutSeconds" => MIN_EXCHANGE_TIMEOUT_MS,
                _ => return text,
            };
            let other_key = if d.key == "connectTimeoutSeconds" {
                "upstreamHeadersTimeoutSeconds"
            } else {
                "connectTimeoutSeconds"
            };
            format!("{other_key} = {}\n", other as f64 / 1000.0) + &text
        };
        for d in DURATIONS {
            // The header bound must also exceed the connect bound, held here at its least.
            let least = if d.key == "upstreamHeadersTimeoutSeconds" {
                d.min_ms + 1
            } else {
                d.min_ms
            };
            for (ms, ok) in [
                (least, true),
                (d.max_ms, true),
                (d.min_ms - 1, false),
                (d.max_ms + 1, false),
            ] {
                let want = (!ok).then(|| d.key.to_owned());
                assert_eq!(
                    refused_by_validate(d, ms),
                    want,
                    "validate, {} = {ms} ms",
                    d.key
                );
                let by_file = match Config::from_toml_str(&file_with(d, ms)) {
                    Ok(_) => None,
                    Err(Error::ConfigField { field, .. }) => Some(field),
                    Err(e) => panic!("{}: {e}", d.key),
                };
                assert_eq!(by_file, want, "the file, {} = {ms} ms", d.key);
            }
        }
    }

    #[test]
    fn a_typed_config_is_bounded_like_a_file() {
        let mut c = Config::from_toml_str(MINIMAL).unwrap();
        c.upstream_headers_timeout_ms = 0;
        assert!(matches!(
            c.validate(),
            Err(Error::ConfigField { field, .. }) if field == "upstreamHeadersTimeoutSeconds"
        ));
    }

    #[test]
    fn the_shedding_windows_are_bounded_at_both_ends() {
        let with = |v: f64| {
            MINIMAL.to_owned()
                + &format!(
                    "[availability.shedding]\nfullAfterSeconds = {v}\nroomAfterSeconds = {v}\n"
                )
        };
        assert!(Config::from_toml_str(&with(0.001)).is_ok());
        assert!(Config::from_toml_str(&with(MAX_SHED_WINDOW_MS as f64 / 1000.0)).is_ok());
        assert_eq!(
            refused_field(&with(0.0)),
            "availability.shedding.fullAfterSeconds"
        );
        assert_eq!(
            refused_field(&with(MAX_SHED_WINDOW_MS as f64 / 1000.0 + 0.001)),
            "availability.shedding.fullAfterSeconds"
        );
    }

    #[test]
    fn relative_tls_paths_resolve_against_the_config_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, MINIMAL).unwrap();
        let c = Config::load(&path).unwrap();
        assert_eq!(c.tls.ca, Some(dir.path().join("ca.crt")));
    }

    #[test]
    fn a_pinned_operator_needs_no_ca_unless_a_candidate_is_https() {
        let pin = MINIMAL.replace("ca = \"ca.crt\"\n", "") + "[trust]\nmode = \"pin\"\n";
        let c = Config::from_toml_str(&pin).unwrap();
        assert_eq!(c.trust, OperatorTrust::Pin);
        assert_eq!(c.tls.ca, None);
        let https = pin.replace("http://127.0.0.1:8000", "https://site.b.example");
        assert_eq!(refused_field(&https), "tls.ca");
        let ca_mode = MINIMAL.replace("ca = \"ca.crt\"\n", "");
        assert_eq!(refused_field(&ca_mode), "tls.ca");
    }

    #[test]
    fn trust_modes_take_the_operators_spelling() {
        let with = |t: &str| MINIMAL.to_owned() + "[trust]\n" + t;
        let c = Config::from_toml_str(&with("mode = \"spiffe\"\ntrustDomain = \"grid.example\"\n"))
            .unwrap();
        assert_eq!(
            c.trust,
            OperatorTrust::Spiffe {
                trust_domain: "grid.example".into()
            }
        );
        assert_eq!(
            refused_field(&with("mode = \"spiffe\"\n")),
            "trust.trustDomain"
        );
        assert_eq!(
            refused_field(&with("mode = \"pin\"\ntrustDomain = \"x\"\n")),
            "trust.trustDomain"
        );
        assert_eq!(refused_field(&with("mode = \"dns\"\n")), "trust.mode");
        assert_eq!(
            Config::from_toml_str(MINIMAL).unwrap().trust,
            OperatorTrust::Ca
        );
    }

    #[test]
    fn base_url_prefix_is_kept_before_the_request_path() {
        let text =
            EXAMPLE_CONFIG_TOML.replace("http://10.0.0.10:8000", "http://10.0.0.10:8000/site-a/");
        let c = Config::from_toml_str(&text).unwrap();
        let cat = c.catalog();
        let m = cat.get("llama-3.1-8b-instruct").unwrap();
        assert_eq!(
            crate::upstream::uri_for(
                &m.upstreams[0],
                &http::uri::PathAndQuery::from_static("/v1/chat/completions?x=1")
            )
            .unwrap(),
            "http://10.0.0.10:8000/site-a/v1/chat/completions?x=1"
        );
        assert_eq!(
            crate::upstream::uri_for(
                &m.upstreams[1],
                &http::uri::PathAndQuery::from_static("/v1/models")
            )
            .unwrap(),
            "https://gateway.b.example:8443/v1/models"
        );
    }
}
