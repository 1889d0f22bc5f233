//! The one bounded GET client of both daemons: the operator's EPP scrapes and peer polls,
//! and the gateway's poll of `GET /v1/site/signals`. One attempt is bounded in time (the
//! target's timeout covers resolve to last byte) and bytes
//! ([`grid_signals::exposition::MAX_EXPOSITION_BYTES`]), reads `Date` as the reference
//! time of the body's ages, and puts every failure in a closed class.
//!
//! Each attempt opens its own connection and resolves the host itself, so a failure can
//! be told apart precisely (`dns`, `connect`, `tls`, `http`, ...) instead of surfacing as
//! one opaque client error. Targets are polled about once a second, so the saved
//! handshake of a pooled connection is not worth the lost diagnosis.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use grid_signals::epp::ScrapeFailure;
use grid_signals::exposition::BodyBuf;
use grid_signals::long_poll::Wait;
use http_body_util::{BodyExt, Empty};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// What to fetch and how long one attempt may take.
#[derive(Clone, Debug)]
pub struct FetchTarget {
    /// Full URL, `http` or `https`.
    pub url: http::Uri,
    /// Budget of the whole attempt: resolve, connect, handshake, request and body.
    pub timeout: Duration,
    /// TLS settings for an `https` URL; `None` makes an `https` fetch fail as `tls`.
    pub tls: Option<Arc<ClientConfig>>,
    /// The TLS name to verify the server under, when it is not the URL's host (a gateway
    /// dials its operator by address but verifies it under its configured identity).
    pub server_name: Option<ServerName<'static>>,
}

impl FetchTarget {
    /// A target verified (for `https`) under the URL's own host.
    pub fn new(url: http::Uri, timeout: Duration, tls: Option<Arc<ClientConfig>>) -> Self {
        Self {
            url,
            timeout,
            tls,
            server_name: None,
        }
    }
}

/// Why a fetch failed: the closed class it counts as and, when the server answered with
/// a refusing status, that status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failed {
    /// The failure class (the `result` label of the scrape and poll counters).
    pub class: ScrapeFailure,
    /// The HTTP status, when the server answered but not with success.
    pub status: Option<u16>,
}

impl From<ScrapeFailure> for Failed {
    fn from(class: ScrapeFailure) -> Self {
        Self {
            class,
            status: None,
        }
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A successful GET: the body (at most [`grid_signals::exposition::MAX_EXPOSITION_BYTES`])
/// and the response's `Date`, the reference time of the ages in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    /// The body.
    pub body: Vec<u8>,
    /// The `Date` header in milliseconds since the Unix epoch, if present and valid.
    pub date_ms: Option<u64>,
    /// The `Content-Type` header, if present.
    pub content_type: Option<String>,
    /// The readiness generation a signals relay states
    /// ([`grid_signals::long_poll::GENERATION_HEADER`]); `None` from a server that states
    /// none (an EPP, an older operator).
    pub readiness_generation: Option<u64>,
}

/// `url` asking a signals relay to hold the poll as `wait` says
/// ([`grid_signals::long_poll::Wait::query`], after any query the URL has); `url` itself
/// for a plain poll. What both daemons' pollers ask with.
pub fn with_wait(url: &http::Uri, wait: Option<Wait>) -> http::Uri {
    let Some(wait) = wait else {
        return url.clone();
    };
    let path_and_query = match url.query() {
        Some(query) => format!("{}?{query}&{}", url.path(), wait.query()),
        None => format!("{}?{}", url.path(), wait.query()),
    };
    let mut parts = url.clone().into_parts();
    parts.path_and_query = path_and_query.parse().ok();
    http::Uri::from_parts(parts).unwrap_or_else(|_| url.clone())
}

/// The budget of one poll: `timeout` for the exchange, plus the wait the server may hold
/// it for.
pub fn poll_budget(timeout: Duration, wait: Option<Wait>) -> Duration {
    timeout + Duration::from_millis(wait.map_or(0, |w| w.wait_ms))
}

/// One bounded GET of `target` (with an mTLS client configuration for a peer or the
/// local operator): the whole exchange within `target.timeout`, the body within the cap,
/// every failure classified.
pub async fn fetch(target: &FetchTarget) -> Result<Fetched, Failed> {
    within(target.timeout, exchange(target)).await
}

/// A transport error after the handshake: `tls` when TLS caused it (with TLS 1.3 a
/// server refuses a client certificate only after the client thinks the handshake is
/// done, so the refusal surfaces here), `http` otherwise.
fn classify_transport(error: &hyper::Error) -> ScrapeFailure {
    let tls = crate::cause::any(error, |e| {
        e.is::<rustls::Error>()
            || e.downcast_ref::<std::io::Error>().is_some_and(|io| {
                io.get_ref()
                    .is_some_and(<dyn std::error::Error + Send + Sync>::is::<rustls::Error>)
            })
    });
    if tls {
        ScrapeFailure::Tls
    } else {
        ScrapeFailure::Http
    }
}

fn host_of(url: &http::Uri) -> Option<&str> {
    let host = url.host()?;
    Some(
        host.strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host),
    )
}

async fn connect(url: &http::Uri, https: bool) -> Result<TcpStream, ScrapeFailure> {
    let host = host_of(url).ok_or(ScrapeFailure::Dns)?;
    let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
    let addrs: Vec<_> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|_| ScrapeFailure::Dns)?
        .collect();
    if addrs.is_empty() {
        return Err(ScrapeFailure::Dns);
    }
    for addr in addrs {
        if let Ok(tcp) = TcpStream::connect(addr).await {
            let _ = tcp.set_nodelay(true);
            return Ok(tcp);
        }
    }
    Err(ScrapeFailure::Connect)
}

async fn exchange(target: &FetchTarget) -> Result<Fetched, Failed> {
    let url = &target.url;
    let https = url.scheme_str() == Some("https");
    let tcp = connect(url, https).await?;
    let io: Box<dyn Io> = if https {
        let tls = target.tls.clone().ok_or(ScrapeFailure::Tls)?;
        let name = match &target.server_name {
            Some(name) => name.clone(),
            None => ServerName::try_from(host_of(url).unwrap_or_default().to_owned())
                .map_err(|_| ScrapeFailure::Tls)?,
        };
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await
            .map_err(|_| ScrapeFailure::Tls)?;
        Box::new(stream)
    } else {
        Box::new(tcp)
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|_| ScrapeFailure::Http)?;
    let request = Request::get(url.path_and_query().map_or("/", |p| p.as_str()))
        .header(
            http::header::HOST,
            url.authority().map_or("", |a| a.as_str()),
        )
        .header(http::header::ACCEPT, "text/plain;version=0.0.4")
        .header(http::header::USER_AGENT, "grid")
        .body(Empty::<Bytes>::new())
        .map_err(|_| ScrapeFailure::Http)?;
    let exchange = async move {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| classify_transport(&e))?;
        read_response(response).await
    };
    tokio::pin!(exchange);
    tokio::pin!(conn);
    tokio::select! {
        result = &mut exchange => result,
        // The connection ended first (closed or failed); the exchange now resolves promptly
        // with whatever it got.
        _ = &mut conn => exchange.await,
    }
}

/// Reads one answer of a signals or metrics GET, whatever connection carried it (the
/// operator's own per attempt, the gateway's one kept-alive connection to its operator):
/// a refusing status classified, `Date` read as the reference time of the body's ages,
/// the body read within [`grid_signals::exposition::MAX_EXPOSITION_BYTES`] (reaching it
/// is `body_cap`).
pub async fn read_response(
    response: http::Response<hyper::body::Incoming>,
) -> Result<Fetched, Failed> {
    let status = Some(response.status().as_u16());
    match response.status() {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            return Err(Failed {
                class: ScrapeFailure::Unauthorized,
                status,
            });
        }
        s if !s.is_success() => {
            return Err(Failed {
                class: ScrapeFailure::Http,
                status,
            });
        }
        _ => {}
    }
    let header = |name| {
        response
            .headers()
            .get(name)
            .and_then(|v: &http::HeaderValue| v.to_str().ok())
            .map(str::to_owned)
    };
    let date_ms = header(http::header::DATE)
        .and_then(|d| httpdate::parse_http_date(&d).ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64);
    let content_type = header(http::header::CONTENT_TYPE);
    let readiness_generation = response
        .headers()
        .get(grid_signals::long_poll::GENERATION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(grid_signals::long_poll::parse_generation);
    let mut body = response.into_body();
    let mut buf = BodyBuf::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| classify_transport(&e))?;
        if let Some(data) = frame.data_ref() {
            buf.push(data).map_err(|_| ScrapeFailure::BodyCap)?;
        }
    }
    Ok(Fetched {
        body: buf.into_vec(),
        date_ms,
        content_type,
        readiness_generation,
    })
}

/// Runs one attempt within `timeout`: past it, the attempt is a `timeout`.
pub async fn within(
    timeout: Duration,
    attempt: impl Future<Output = Result<Fetched, Failed>>,
) -> Result<Fetched, Failed> {
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or_else(|_| Err(ScrapeFailure::Timeout.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_poll_asks_its_wait_after_the_urls_own_query_and_adds_it_to_its_budget() {
        let wait = Wait {
            seen: 3,
            wait_ms: 1_000,
        };
        let plain: http::Uri = "https://op.example:9443/v1/site/signals".parse().unwrap();
        assert_eq!(with_wait(&plain, None), plain);
        assert_eq!(
            with_wait(&plain, Some(wait)).to_string(),
            "https://op.example:9443/v1/site/signals?readiness=3&wait_ms=1000"
        );
        let queried: http::Uri = "https://op.example/v1/site/signals?x=1".parse().unwrap();
        let asked = with_wait(&queried, Some(wait));
        assert_eq!(asked.query(), Some("x=1&readiness=3&wait_ms=1000"));
        assert_eq!(asked.query().and_then(Wait::parse), Some(wait));
        assert_eq!(
            poll_budget(Duration::from_millis(900), Some(wait)),
            Duration::from_millis(1_900)
        );
        assert_eq!(
            poll_budget(Duration::from_millis(900), None),
            Duration::from_millis(900)
        );
    }
}
