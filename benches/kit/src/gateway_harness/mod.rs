//! grid-gatewayd's test harness: fake model servers, a fake operator, a gateway on
//! loopback with its certificates ([`crate::pki`]), and a small HTTP client.
#![allow(clippy::missing_panics_doc)] // a test harness: every failure is the test's

pub mod fake_model;
pub mod fake_operator;

use crate::pki;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use grid_gateway::Config;
use grid_gateway::config::{Candidate, OperatorConfig, TlsFiles};
use grid_gatewayd::driver::{self, Running};

/// Every test exchange is bounded by this, so a hung proxy fails the test instead of CI.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// One candidate of a model in a test config.
pub struct Cand<'a> {
    /// `grid_site`.
    pub site: &'a str,
    /// `grid_provider`.
    pub provider: &'a str,
    /// Its serving base URL.
    pub base_url: String,
}

impl<'a> Cand<'a> {
    /// Provider `p` of `site`, served at `base_url`: the candidate most tests route to.
    pub fn at(site: &'a str, base_url: String) -> Self {
        Self {
            site,
            provider: "p",
            base_url,
        }
    }
}

/// A model served by provider `p` of `site` alone.
pub fn one(site: &str, base_url: String) -> Vec<Cand<'_>> {
    vec![Cand::at(site, base_url)]
}

/// The value of the series whose line starts with `line_prefix` (name and labels) in an
/// exposition, 0 when absent.
pub fn series(text: &str, line_prefix: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(line_prefix))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// A gateway on 127.0.0.1 with its temporary PEM files.
pub struct Harness {
    /// The running gateway (taken by [`Harness::shutdown`]).
    pub gateway: Option<Running>,
    /// Where it serves.
    pub addr: SocketAddr,
    /// Its certificates and configuration.
    pub dir: tempfile::TempDir,
    /// The CA its certificates chain to.
    pub pki: pki::Ca,
}

impl Harness {
    /// The gateway URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Its `/metrics` text (text 0.0.4).
    pub async fn metrics(&self) -> String {
        let m = send(&http1_client(), get(&self.url("/metrics"))).await;
        String::from_utf8(m.body.to_vec()).unwrap()
    }

    /// Stops the gateway gracefully.
    pub async fn shutdown(mut self) {
        if let Some(g) = self.gateway.take() {
            tokio::time::timeout(EXCHANGE_TIMEOUT, g.shutdown())
                .await
                .expect("gateway drains in time");
        }
    }
}

/// A gateway config on 127.0.0.1 (any port) for `models`, its certificate issued by
/// `pki` into `dir`, polling the operator at `operator_url` (identity `operator.a.grid`).
pub fn config(
    dir: &std::path::Path,
    pki: &pki::Ca,
    operator_url: &str,
    models: &[(&str, Vec<Cand<'_>>)],
) -> Config {
    let gw = pki.issue(dir, "gateway", &["gateway.a.grid"]);
    let base = Config::new(
        "a",
        SocketAddr::from(([127, 0, 0, 1], 0)),
        OperatorConfig::new(operator_url, "operator.a.grid"),
        TlsFiles::new(gw.cert, gw.key, Some(gw.ca)),
    );
    models.iter().fold(base, |c, (name, cands)| {
        c.with_model(
            *name,
            cands
                .iter()
                .map(|c| Candidate::new(c.site, c.provider, c.base_url.clone())),
        )
    })
}

/// Starts a gateway routing `models` with `tune` applied to its config; its operator URL
/// points at a closed port.
pub async fn start_gateway(
    tune: impl FnOnce(&mut Config),
    models: &[(&str, Vec<Cand<'_>>)],
) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki::Ca::new("test-grid-ca");
    let mut config = config(dir.path(), &pki, "https://127.0.0.1:9", models);
    tune(&mut config);
    config.validate().unwrap();
    let gateway = driver::start(config).await.unwrap();
    Harness {
        addr: gateway.local_addr(),
        gateway: Some(gateway),
        dir,
        pki,
    }
}

/// An answer read whole.
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Answer {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    /// `x-grid-site`, the site that answered.
    pub fn site(&self) -> Option<&str> {
        self.headers
            .get("x-grid-site")
            .and_then(|v| v.to_str().ok())
    }

    /// The OpenAI-style error code.
    pub fn error_code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

/// A plain HTTP/1.1 client.
pub fn http1_client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// A plain HTTP/2 (prior knowledge) client.
pub fn http2_client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(HttpConnector::new())
}

/// Sends one request and reads the whole answer, bounded by [`EXCHANGE_TIMEOUT`].
pub async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    req: Request<Full<Bytes>>,
) -> Answer {
    tokio::time::timeout(EXCHANGE_TIMEOUT, async {
        let resp = client.request(req).await.expect("gateway answers");
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("answer body").to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    })
    .await
    .expect("exchange within the timeout")
}

/// A JSON POST to `url`.
pub fn post(url: &str, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(body.into()))
        .unwrap()
}

/// A GET of `url`.
pub fn get(url: &str) -> Request<Full<Bytes>> {
    Request::get(url).body(Full::new(Bytes::new())).unwrap()
}

/// A URL on 127.0.0.1 where nothing listens.
pub fn closed_port_url() -> String {
    format!("http://{}", crate::ports::loopback_addr())
}
