//! The EPP scrape client: one HTTP(S) GET per provider per interval, bounded in number,
//! time and bytes, every failure put in a closed class.
//!
//! Each scrape opens its own connection and resolves the host itself, so a failure can be
//! told apart precisely (`dns`, `connect`, `tls`, `http`, ...) instead of surfacing as one
//! opaque client error. EPPs are in-cluster and scraped once a second, so the saved
//! handshake of a pooled connection is not worth the lost diagnosis.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use grid_signals::epp::ScrapeFailure;
use grid_signals::exposition::BodyBuf;
use http_body_util::{BodyExt, Empty};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// The most scrapes in flight at once, across all providers (the spec's bound of 16).
pub const MAX_CONCURRENT_SCRAPES: usize = 16;

/// What to scrape and how long one attempt may take.
#[derive(Clone, Debug)]
pub struct ScrapeTarget {
    /// Full metrics URL, `http` or `https`.
    pub url: http::Uri,
    /// Budget of the whole scrape: resolve, connect, handshake, request and body.
    pub timeout: Duration,
    /// TLS settings for an `https` URL; `None` makes an `https` scrape fail as `tls`.
    pub tls: Option<Arc<ClientConfig>>,
}

/// Scrapes with a shared concurrency bound.
#[derive(Clone, Debug)]
pub struct Scraper {
    permits: Arc<Semaphore>,
}

impl Default for Scraper {
    fn default() -> Self {
        Self::new()
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

impl Scraper {
    /// A scraper allowing [`MAX_CONCURRENT_SCRAPES`] at once.
    pub fn new() -> Self {
        Self {
            permits: Arc::new(Semaphore::new(MAX_CONCURRENT_SCRAPES)),
        }
    }

    /// Scrapes in flight right now.
    pub fn in_flight(&self) -> usize {
        MAX_CONCURRENT_SCRAPES - self.permits.available_permits()
    }

    /// Fetches the target's body, waiting for a permit first; the timeout starts once the
    /// permit is held, so waiting behind slow providers is not charged to this one.
    pub async fn scrape(&self, target: &ScrapeTarget) -> Result<Vec<u8>, ScrapeFailure> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| ScrapeFailure::Connect)?;
        fetch(target).await.map(|f| f.body)
    }
}

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
}

/// One bounded GET of `target` (also used to poll peers, with an mTLS client
/// configuration): the whole exchange within `target.timeout`, the body within the cap,
/// every failure classified.
pub async fn fetch(target: &ScrapeTarget) -> Result<Fetched, ScrapeFailure> {
    match tokio::time::timeout(target.timeout, exchange(target)).await {
        Ok(result) => result,
        Err(_) => Err(ScrapeFailure::Timeout),
    }
}

/// A transport error after the handshake: `tls` when TLS caused it (with TLS 1.3 a
/// server refuses a client certificate only after the client thinks the handshake is
/// done, so the refusal surfaces here), `http` otherwise.
fn classify_transport(error: &hyper::Error) -> ScrapeFailure {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    while let Some(e) = source {
        if e.downcast_ref::<rustls::Error>().is_some() {
            return ScrapeFailure::Tls;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(<dyn std::error::Error + Send + Sync>::is::<rustls::Error>)
            {
                return ScrapeFailure::Tls;
            }
        }
        source = e.source();
    }
    ScrapeFailure::Http
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

async fn exchange(target: &ScrapeTarget) -> Result<Fetched, ScrapeFailure> {
    let url = &target.url;
    let https = url.scheme_str() == Some("https");
    let tcp = connect(url, https).await?;
    let io: Box<dyn Io> = if https {
        let tls = target.tls.clone().ok_or(ScrapeFailure::Tls)?;
        let name = ServerName::try_from(host_of(url).unwrap_or_default().to_owned())
            .map_err(|_| ScrapeFailure::Tls)?;
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
        .header(http::header::USER_AGENT, "grid-operatord")
        .body(Empty::<Bytes>::new())
        .map_err(|_| ScrapeFailure::Http)?;
    let exchange = async move {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| classify_transport(&e))?;
        match response.status() {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                return Err(ScrapeFailure::Unauthorized);
            }
            s if !s.is_success() => return Err(ScrapeFailure::Http),
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
        })
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

/// TLS settings for `https` EPP scrapes: the server certificate must chain to `roots` and
/// name the URL's host. No client certificate is presented.
pub fn scrape_tls_config(roots: rustls::RootCertStore) -> Result<Arc<ClientConfig>, crate::Error> {
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|source| crate::Error::Tls {
                context: "scrape client protocol versions",
                source,
            })?
            .with_root_certificates(roots)
            .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use grid_kit::epp_server::{Behaviour, FakeEpp};
    use grid_signals::exposition::MAX_EXPOSITION_BYTES;

    use super::*;
    use grid_kit::pki::Ca;

    fn target(url: &str, timeout_ms: u64) -> ScrapeTarget {
        ScrapeTarget {
            url: url.parse().unwrap(),
            timeout: Duration::from_millis(timeout_ms),
            tls: None,
        }
    }

    const BODY: &[u8] = b"llm_d_epp_ready_endpoints{name=\"p\"} 2\n";

    #[tokio::test]
    async fn a_changing_exposition_is_scraped_each_time() {
        let epp = FakeEpp::start(Behaviour::Body(BODY.to_vec())).await;
        let s = Scraper::new();
        let t = target(&format!("{}/metrics", epp.url()), 2000);
        assert_eq!(s.scrape(&t).await.unwrap(), BODY);
        epp.set(Behaviour::Body(b"x 1\n".to_vec()));
        assert_eq!(s.scrape(&t).await.unwrap(), b"x 1\n");
        assert_eq!(epp.stats.requests.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn failures_are_classified() {
        let epp = FakeEpp::start(Behaviour::Status(403)).await;
        let s = Scraper::new();
        let t = target(&format!("{}/metrics", epp.url()), 2000);
        assert_eq!(s.scrape(&t).await, Err(ScrapeFailure::Unauthorized));
        epp.set(Behaviour::Status(401));
        assert_eq!(s.scrape(&t).await, Err(ScrapeFailure::Unauthorized));
        epp.set(Behaviour::Status(500));
        assert_eq!(s.scrape(&t).await, Err(ScrapeFailure::Http));
        epp.set(Behaviour::Hang);
        assert_eq!(
            s.scrape(&target(&format!("{}/metrics", epp.url()), 200))
                .await,
            Err(ScrapeFailure::Timeout)
        );
        // A port nobody listens on: bind, learn the port, close.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        assert_eq!(
            s.scrape(&target(&format!("http://{closed}/metrics"), 2000))
                .await,
            Err(ScrapeFailure::Connect)
        );
        assert_eq!(
            s.scrape(&target("http://no-such-host.invalid/metrics", 5000))
                .await,
            Err(ScrapeFailure::Dns)
        );
    }

    #[tokio::test]
    async fn body_exactly_at_the_cap_is_read_and_one_byte_more_is_body_cap() {
        let at = vec![b'#'; MAX_EXPOSITION_BYTES];
        let epp = FakeEpp::start(Behaviour::Body(at.clone())).await;
        let s = Scraper::new();
        let t = target(&format!("{}/metrics", epp.url()), 5000);
        assert_eq!(s.scrape(&t).await.unwrap().len(), MAX_EXPOSITION_BYTES);
        epp.set(Behaviour::Body(vec![b'#'; MAX_EXPOSITION_BYTES + 1]));
        assert_eq!(s.scrape(&t).await, Err(ScrapeFailure::BodyCap));
    }

    #[tokio::test]
    async fn https_scrape_verifies_the_epp_certificate() {
        let ca = Ca::new("epp-ca");
        let leaf = ca.site("grid.test", "epp");
        let server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.cert.clone()], leaf.key())
        .unwrap();
        let epp =
            FakeEpp::start_with_tls(Behaviour::Body(BODY.to_vec()), Some(Arc::new(server))).await;
        let url = format!("https://127.0.0.1:{}/metrics", epp.addr.port());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert()).unwrap();
        let s = Scraper::new();
        let mut t = target(&url, 5000);
        t.tls = Some(scrape_tls_config(roots).unwrap());
        assert_eq!(s.scrape(&t).await.unwrap(), BODY);
        let mut other = rustls::RootCertStore::empty();
        other.add(Ca::new("other").cert()).unwrap();
        t.tls = Some(scrape_tls_config(other).unwrap());
        assert_eq!(s.scrape(&t).await, Err(ScrapeFailure::Tls));
        t.tls = None;
        assert_eq!(s.scrape(&t).await, Err(ScrapeFailure::Tls));
    }

    async fn max_concurrency(n: usize) -> (usize, usize) {
        let epp = FakeEpp::start(Behaviour::Delay(Duration::from_millis(300), BODY.to_vec())).await;
        let s = Scraper::new();
        let t = target(&format!("{}/metrics", epp.url()), 10_000);
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..n {
            let (s, t) = (s.clone(), t.clone());
            tasks.spawn(async move { s.scrape(&t).await });
        }
        let mut ok = 0;
        while let Some(r) = tasks.join_next().await {
            ok += usize::from(r.unwrap().is_ok());
        }
        (ok, epp.stats.max_in_flight.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn at_most_sixteen_scrapes_run_at_once() {
        assert_eq!(max_concurrency(MAX_CONCURRENT_SCRAPES).await, (16, 16));
        assert_eq!(
            max_concurrency(MAX_CONCURRENT_SCRAPES + 1).await,
            (17, MAX_CONCURRENT_SCRAPES)
        );
    }
}
