//! The EPP scrape loop's client: [`grid_daemon::client::fetch`] (one bounded GET, every
//! failure in a closed class) behind a shared bound of [`MAX_CONCURRENT_SCRAPES`].

use std::sync::Arc;

use grid_daemon::client::{FetchTarget, fetch};
use grid_signals::epp::ScrapeFailure;
use rustls::ClientConfig;
use tokio::sync::Semaphore;

/// The most scrapes in flight at once, across all providers (the spec's bound of 16).
pub(crate) const MAX_CONCURRENT_SCRAPES: usize = 16;

/// Scrapes with a shared concurrency bound.
#[derive(Clone, Debug)]
pub(crate) struct Scraper {
    permits: Arc<Semaphore>,
}

impl Default for Scraper {
    fn default() -> Self {
        Self::new()
    }
}

impl Scraper {
    /// A scraper allowing [`MAX_CONCURRENT_SCRAPES`] at once.
    pub(crate) fn new() -> Self {
        Self {
            permits: Arc::new(Semaphore::new(MAX_CONCURRENT_SCRAPES)),
        }
    }

    /// Fetches the target's body, waiting for a permit first; the timeout starts once the
    /// permit is held, so waiting behind slow providers is not charged to this one.
    pub(crate) async fn scrape(&self, target: &FetchTarget) -> Result<Vec<u8>, ScrapeFailure> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| ScrapeFailure::Connect)?;
        fetch(target).await.map(|f| f.body).map_err(|f| f.class)
    }
}

/// TLS settings for `https` EPP scrapes: the server certificate must chain to `roots` and
/// name the URL's host. No client certificate is presented.
pub(crate) fn scrape_tls_config(
    roots: rustls::RootCertStore,
) -> Result<Arc<ClientConfig>, crate::Error> {
    Ok(Arc::new(grid_daemon::tls::webpki_client(
        roots,
        None,
        "scrape client",
    )?))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use grid_kit::epp_server::{Behaviour, FakeEpp};
    use grid_signals::exposition::MAX_EXPOSITION_BYTES;

    use std::time::Duration;

    use super::*;
    use grid_kit::pki::Ca;

    fn target(url: &str, timeout_ms: u64) -> FetchTarget {
        FetchTarget::new(
            url.parse().unwrap(),
            Duration::from_millis(timeout_ms),
            None,
        )
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
