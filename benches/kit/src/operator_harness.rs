//! Whole operators on loopback for grid-operatord's tests: a test CA, per-site
//! certificates and configuration, and clients for a site's gateway or a peer.
#![allow(clippy::missing_panics_doc)] // a test harness: every failure is the test's

use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use grid_daemon::client::{FetchTarget, Fetched, fetch};
use grid_daemon::tls::{Fingerprint, Identity, Trust, client_config};
use grid_operatord::config::{
    Config, DEFAULT_METRICS_PATH, Listen, PeerConfig, ProviderConfig, TlsFiles, TrustMode,
};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::RootCertStore;
use rustls_pki_types::ServerName;
use tempfile::TempDir;

use crate::pki::{Ca, SiteCert};

/// The SPIFFE trust domain of every test grid.
pub const DOMAIN: &str = "grid.test";

/// A test grid: one CA.
pub struct Grid {
    /// The CA all sites chain to.
    pub ca: Ca,
}

/// One site's files.
pub struct Site {
    /// Site name.
    pub name: String,
    /// Holds the certificate, key, CA and state directory.
    pub dir: TempDir,
    /// The site's own certificate (the operator's and its gateway's).
    pub cert: SiteCert,
}

/// A provider entry of a site's configuration.
pub struct ProviderSpec {
    /// Provider name.
    pub name: String,
    /// EPP base URL.
    pub url: String,
    /// Per-scrape timeout in seconds.
    pub timeout_s: f64,
}

impl Default for Grid {
    fn default() -> Self {
        Self::new()
    }
}

impl Grid {
    /// A fresh grid.
    pub fn new() -> Self {
        Self {
            ca: Ca::new("grid-ca"),
        }
    }

    /// A site with its certificate written to disk.
    pub fn site(&self, name: &str) -> Site {
        let dir = tempfile::tempdir().unwrap();
        let cert = self.ca.site(DOMAIN, name);
        cert.write(dir.path(), "site");
        std::fs::write(dir.path().join("ca.crt"), self.ca.pem()).unwrap();
        Site {
            name: name.to_owned(),
            dir,
            cert,
        }
    }

    /// A client presenting `cert` (whose site is `who`) that accepts only a server of
    /// site `server`.
    pub fn client(&self, cert: &SiteCert, who: &str, server: &str) -> Arc<rustls::ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.cert()).unwrap();
        let expected = if who == server {
            Identity::Local
        } else {
            Identity::Peer(server.to_owned())
        };
        let trust = Arc::new(Trust::spiffe(who, DOMAIN, roots));
        client_config(&cert.material(&self.ca), trust, expected).unwrap()
    }
}

impl ProviderSpec {
    /// The provider `name` served by `epp`, scraped with a 1 s timeout.
    pub fn of(name: &str, epp: &crate::epp_server::FakeEpp) -> Self {
        Self {
            name: name.to_owned(),
            url: epp.url(),
            timeout_s: 1.0,
        }
    }
}

impl Site {
    /// This site's operator as the controller runs it: both listeners on loopback ephemeral
    /// ports, its certificate, key and CA from its directory, its state in
    /// `ConfigMap/grid-site-a`.
    pub fn deployment(&self) -> grid_operatord::controller::translate::Deployment {
        let d = self.dir.path();
        grid_operatord::controller::translate::Deployment {
            site: self.name.clone(),
            listen: Listen {
                signals: "127.0.0.1:0".parse().unwrap(),
                metrics: "127.0.0.1:0".parse().unwrap(),
            },
            tls: TlsFiles {
                cert: d.join("site.crt"),
                key: d.join("site.key"),
                ca: Some(d.join("ca.crt")),
            },
            state_label: "ConfigMap/grid-site-a".into(),
        }
    }

    /// Starts this site's operator on [`Site::config`] with default options and a file
    /// state store in its state directory.
    pub async fn start(
        &self,
        peers: &[(&str, String)],
        providers: &[ProviderSpec],
    ) -> grid_operatord::driver::Running {
        let state: Arc<dyn grid_operatord::state::StateStore> =
            Arc::new(grid_operatord::state::FileStateStore::open(self.state_dir()).unwrap());
        grid_operatord::driver::start(
            self.config(peers, providers),
            None,
            state,
            grid_operatord::driver::Options::default(),
        )
        .await
        .unwrap()
    }

    /// The state directory.
    pub fn state_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("state")
    }

    /// A gateway configuration for this site in the file dialect: listening at `listen`,
    /// polling its operator on loopback at `operator_port` every `poll_s` seconds,
    /// presenting this site's certificate, with `model` served by one candidate,
    /// `provider` of this site at `base_url`. The TLS files, the trust and the candidate
    /// are inline tables, as a generated file may write them; `[[models]]` entries
    /// appended after it add models.
    pub fn gateway_text(
        &self,
        (listen, operator_port, poll_s): (&str, u16, f64),
        (model, provider, base_url): (&str, &str, &str),
    ) -> String {
        let d = self.dir.path();
        format!(
            r#"site = "{name}"
listen = "{listen}"
tls = {{ cert = "{cert}", key = "{key}", ca = "{ca}" }}
trust = {{ mode = "spiffe", trustDomain = "{DOMAIN}" }}
[operator]
url = "https://127.0.0.1:{operator_port}"
identity = "127.0.0.1"
pollIntervalSeconds = {poll_s}
[[models]]
name = "{model}"
candidates = [{{ site = "{name}", provider = "{provider}", baseUrl = "{base_url}" }}]
"#,
            name = self.name,
            cert = d.join("site.crt").display(),
            key = d.join("site.key").display(),
            ca = d.join("ca.crt").display(),
        )
    }

    /// Configuration text: SPIFFE trust, loopback listeners on OS-chosen ports, fast
    /// intervals, these peers and providers.
    pub fn config_text(&self, peers: &[(&str, String)], providers: &[ProviderSpec]) -> String {
        let d = self.dir.path();
        let mut text = format!(
            r#"site = "{name}"
network = "test"
stateDir = "{state}"
[listen]
signals = "127.0.0.1:0"
metrics = "127.0.0.1:0"
[tls]
cert = "{cert}"
key = "{key}"
ca = "{ca}"
[trust]
mode = "spiffe"
trustDomain = "{DOMAIN}"
[signalTransport]
mode = "poll"
[intervals]
scrapeSeconds = 0.2
peerPollSeconds = 0.5
"#,
            name = self.name,
            state = self.state_dir().display(),
            cert = d.join("site.crt").display(),
            key = d.join("site.key").display(),
            ca = d.join("ca.crt").display(),
        );
        for (name, url) in peers {
            writeln!(
                text,
                "[[peers]]\nname = \"{name}\"\nurl = \"{url}\"\ntimeoutSeconds = 1"
            )
            .unwrap();
        }
        for p in providers {
            writeln!(
                text,
                "[[providers]]\nname = \"{}\"\nurl = \"{}\"\ntimeoutSeconds = {}\nstaleMetricsSeconds = 5",
                p.name, p.url, p.timeout_s
            )
            .unwrap();
        }
        text
    }

    /// The same configuration as [`Site::config_text`] (which file-source tests write),
    /// built typed: SPIFFE trust, loopback listeners, fast intervals.
    pub fn config(&self, peers: &[(&str, String)], providers: &[ProviderSpec]) -> Config {
        let d = self.dir.path();
        let listen = Listen {
            signals: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let tls = TlsFiles {
            cert: d.join("site.crt"),
            key: d.join("site.key"),
            ca: Some(d.join("ca.crt")),
        };
        let trust = TrustMode::Spiffe {
            trust_domain: DOMAIN.to_owned(),
        };
        let mut config = Config::new(&self.name, "test", listen, tls, trust, self.state_dir());
        config.scrape_interval = Duration::from_millis(200);
        config.peer_poll_interval = Duration::from_millis(500);
        for (name, url) in peers {
            let mut peer = PeerConfig::new(*name, url.parse().unwrap(), Vec::new());
            peer.timeout = Duration::from_secs(1);
            config = config.with_peer(peer);
        }
        for p in providers {
            let url = format!("{}{DEFAULT_METRICS_PATH}", p.url.trim_end_matches('/'));
            let mut provider = ProviderConfig::new(&self.name, &p.name, url.parse().unwrap());
            provider.timeout = Duration::from_secs_f64(p.timeout_s);
            provider.stale_metrics = Some(Duration::from_secs(5));
            config = config.with_provider(provider);
        }
        config.validate().unwrap();
        config
    }

    /// This site's configuration in pin mode: no SPIFFE domain, each peer known by the
    /// fingerprint of its certificate in `pins`.
    pub fn pinned_config(
        &self,
        peers: &[(&str, String)],
        providers: &[ProviderSpec],
        pins: &[(&str, &SiteCert)],
    ) -> Config {
        let mut config = self.config(peers, providers);
        config.trust = TrustMode::Pin;
        for peer in &mut config.peers {
            if let Some((_, cert)) = pins.iter().find(|(n, _)| *n == peer.name) {
                peer.fingerprints = vec![Fingerprint::of_der(&cert.cert)];
            }
        }
        config.validate().unwrap();
        config
    }
}

/// The signals URL of an operator listening at `addr`.
pub fn signals_url(addr: SocketAddr) -> String {
    format!("https://127.0.0.1:{}/v1/site/signals", addr.port())
}

/// What a gateway's `store` makes of one fetched relay body, as the gateway ingests it:
/// the ingest report, and each learning reset it raised, by provider.
pub fn ingest_resets(
    store: &mut grid_signals::store::Store,
    fetched: &Fetched,
) -> (
    grid_signals::store::IngestReport,
    Vec<(String, grid_signals::batch::Revision)>,
) {
    use grid_signals::store::{Sender, StoreEvent};
    let now = grid_operatord::clock::wall_ms();
    let report = store.ingest(
        &fetched.body,
        Sender::Local,
        fetched.date_ms.unwrap_or(now),
        now,
    );
    let resets = std::iter::from_fn(|| store.poll_event())
        .filter_map(|e| match e {
            StoreEvent::Reset {
                provider, revision, ..
            } => Some((provider, revision)),
            _ => None,
        })
        .collect();
    (report, resets)
}

/// GET the signals of the operator at `addr` with `tls`.
pub async fn get_signals(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> Result<Fetched, grid_signals::epp::ScrapeFailure> {
    fetch(&FetchTarget::new(
        signals_url(addr).parse().unwrap(),
        Duration::from_secs(5),
        Some(tls),
    ))
    .await
    .map_err(|f| f.class)
}

/// POST `/v1/site/signals/ingest` with `headers`; returns the status and response headers.
pub async fn post_ingest(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    headers: &[(&str, String)],
) -> (u16, http::HeaderMap) {
    post(
        addr,
        tls,
        grid_signals::wire::INGEST_PATH,
        headers,
        Bytes::new(),
    )
    .await
}

/// POST `body` to `path` on the signals listener at `addr`, presenting `tls`'s
/// certificate, with `headers`; returns the status and response headers.
pub async fn post(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    path: &str,
    headers: &[(&str, String)],
    body: Bytes,
) -> (u16, http::HeaderMap) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut request = http::Request::post(path).header("host", "localhost");
    for (k, v) in headers {
        request = request.header(*k, v.as_str());
    }
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        sender.send_request(request.body(Full::new(body)).unwrap()),
    )
    .await
    .unwrap()
    .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let _ = response.into_body().collect().await;
    (status, headers)
}

/// GET `/metrics` of the operator at `addr` (plain HTTP).
pub async fn get_metrics(addr: SocketAddr) -> String {
    read_metrics(addr).await.unwrap()
}

/// GET `/metrics` at `addr` (plain HTTP, an operator's or the gateway's listener) within
/// 5 s; why not, when it could not be read.
pub async fn read_metrics(addr: SocketAddr) -> Result<String, String> {
    let uri = format!("http://{addr}/metrics")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let fetched = fetch(&FetchTarget::new(uri, Duration::from_secs(5), None))
        .await
        .map_err(|e| format!("{e:?}"))?;
    String::from_utf8(fetched.body).map_err(|e| format!("{e}"))
}

/// Polls `cond` every 50 ms for at most `secs` seconds.
pub async fn eventually<F, Fut>(what: &str, secs: u64, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while tokio::time::Instant::now() < deadline {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out after {secs} s waiting for {what}");
}

/// An EPP exposition with `ready` ready endpoints and `running` average running requests.
pub fn epp_body(ready: u32, running: f64) -> Vec<u8> {
    format!(
        "# TYPE llm_d_epp_ready_endpoints gauge\n\
         llm_d_epp_ready_endpoints{{name=\"pool\"}} {ready}\n\
         # TYPE llm_d_epp_average_running_requests gauge\n\
         llm_d_epp_average_running_requests{{name=\"pool\"}} {running}\n\
         # TYPE llm_d_epp_average_queue_size gauge\n\
         llm_d_epp_average_queue_size{{name=\"pool\"}} 0.5\n\
         # TYPE llm_d_epp_average_kv_cache_utilization gauge\n\
         llm_d_epp_average_kv_cache_utilization{{name=\"pool\"}} 0.25\n"
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_typed_config_equals_the_file_it_stands_for() {
        let grid = Grid::new();
        let site = grid.site("a");
        let peers = [("b", "https://127.0.0.1:9/v1/site/signals".to_owned())];
        let providers = [ProviderSpec {
            name: "llama".into(),
            url: "http://127.0.0.1:8000".into(),
            timeout_s: 0.5,
        }];
        let text = site.config_text(&peers, &providers);
        let parsed = Config::from_toml(&text, std::path::Path::new("t.toml")).unwrap();
        assert_eq!(
            format!("{parsed:?}"),
            format!("{:?}", site.config(&peers, &providers))
        );
    }
}
