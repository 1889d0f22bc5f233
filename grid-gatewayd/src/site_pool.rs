//! Pooled HTTP/1.1 connections to a site in the clear (an `http://` base URL: the local
//! site), driven from the request's own task.
//!
//! hyper-util's pooled client spawns a task per connection and hands each answer's head
//! and every body frame across to the request's task through channels, behind a pool
//! keyed by a hash of `(scheme, authority)`. Profiled per plain answer (callgrind,
//! `docs/benchmarks.md`), that client and its connection task were about a third of the
//! gateway's instructions. Here a connection has no task: the request polls it while it
//! waits for the head, and the answer's body ([`PooledBody`]) polls it while the client
//! side asks for frames, so a site's bytes wake one task, the client connection's. The
//! pool is the site's own (one per configured site, found with its slots), so taking a
//! connection is a lock and a pop.
//!
//! What the hyper-util client did that this keeps:
//! - **Reuse**: a connection goes back when its answer's body ended (or was known to be
//!   empty) and the site did not ask to close it; the most recent is reused first.
//! - **Stale connections**: one taken from the pool is polled before use, so a site that
//!   closed it while idle is noticed and the connection dropped; a request that a closing
//!   pooled connection refused before writing any of it is sent again on a new
//!   connection ([`MAX_STALE_RETRIES`]).
//! - **Bounds**: connections are opened by the site client's own TCP connector under its
//!   connect bound ([`crate::upstream::plain_connector`]: `TCP_NODELAY`,
//!   `TCP_USER_TIMEOUT`), at most
//!   [`MAX_IDLE_PER_SITE`] idle connections are kept per site, and one idle longer than
//!   [`POOL_IDLE_TIMEOUT`] is closed when next seen (the hyper-util client, without a pool
//!   timer, did the same).
//! - **Host**: the site's authority, as the hyper-util client set it (the client's own
//!   `Host` is removed on the way in).
//!
//! `https://` sites keep the hyper-util client: TLS, and HTTP/2 where the site offers it.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower_service::Service;

use crate::upstream::PlainConnect;
pub(crate) use crate::upstream::{MAX_IDLE_PER_SITE, POOL_IDLE_TIMEOUT};

/// A request that a pooled connection refused before writing any of it (the site closed
/// it between the check at checkout and the write) is sent again this many times, on a
/// new connection: once, as the hyper-util client did.
pub(crate) const MAX_STALE_RETRIES: usize = 1;

type Sender = http1::SendRequest<Full<Bytes>>;
type Driver = http1::Connection<TokioIo<TcpStream>, Full<Bytes>>;

/// One connection: the half requests are sent on, the half that does its I/O, and the
/// authority it was opened to.
struct Conn {
    sender: Sender,
    /// Boxed once per connection: a connection moves between the pool, the request and
    /// the answer's body, and the driver is most of its size.
    driver: Box<Driver>,
    authority: Arc<str>,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// Why a request to a site in the clear failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SiteError {
    /// No connection: nothing was sent.
    #[error("connecting to {authority}: {source}")]
    Connect {
        /// The site's `host[:port]`.
        authority: Arc<str>,
        /// What failed: the resolution, the TCP connect, or its bound.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The exchange failed after the request may have been sent.
    #[error("exchange with {authority}: {source}")]
    Exchange {
        /// The site's `host[:port]`.
        authority: Arc<str>,
        /// hyper's error.
        #[source]
        source: hyper::Error,
    },
}

impl SiteError {
    /// Whether nothing was sent (the request may go elsewhere).
    pub(crate) fn is_connect(&self) -> bool {
        matches!(self, Self::Connect { .. })
    }
}

/// One site's idle connections.
#[derive(Default)]
pub(crate) struct SitePool {
    idle: Mutex<Vec<Idle>>,
}

impl std::fmt::Debug for SitePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SitePool")
            .field("idle", &self.idle_count())
            .finish()
    }
}

impl SitePool {
    /// Idle connections held now.
    pub(crate) fn idle_count(&self) -> usize {
        self.idle.lock().map_or(0, |idle| idle.len())
    }

    /// Sends `req` (origin-form URI) to `authority` on an idle connection or a new one
    /// opened by `connector`; the answer's body drives the connection and returns it here
    /// when it ends.
    pub(crate) async fn send(
        self: &Arc<Self>,
        connector: &PlainConnect,
        authority: &str,
        mut req: Request<Full<Bytes>>,
    ) -> Result<Response<PooledBody>, SiteError> {
        if let Ok(host) = HeaderValue::from_str(authority) {
            req.headers_mut().entry(header::HOST).or_insert(host);
        }
        let mut attempts = 0;
        loop {
            attempts += 1;
            let pooled = if attempts == 1 {
                self.take(authority).await
            } else {
                None
            };
            let reused = pooled.is_some();
            let conn = match pooled {
                Some(conn) => conn,
                None => connect(connector, authority).await?,
            };
            match exchange(conn, req).await {
                Ok((resp, conn)) => {
                    let home = Some(Arc::clone(self));
                    return Ok(resp.map(|body| PooledBody { body, conn, home }));
                }
                Err(mut e) => match e.take_message() {
                    Some(back) if sent_again(reused, attempts) => req = back,
                    _ => {
                        return Err(SiteError::Exchange {
                            authority: Arc::from(authority),
                            source: e.into_error(),
                        });
                    }
                },
            }
        }
    }

    /// The most recent idle connection to `authority` that is still open and ready.
    /// Those past [`POOL_IDLE_TIMEOUT`], to another authority (the site's base URL was
    /// reloaded), closed by the site, or not ready are dropped on the way.
    async fn take(&self, authority: &str) -> Option<Conn> {
        loop {
            let idle = {
                let Ok(mut idle) = self.idle.lock() else {
                    return None;
                };
                idle.pop()?
            };
            if expired(idle.since, crate::clock::monotonic()) || *idle.conn.authority != *authority
            {
                continue;
            }
            let mut conn = idle.conn;
            let ready = std::future::poll_fn(|cx| {
                if Pin::new(&mut *conn.driver).poll(cx).is_ready() {
                    return Poll::Ready(false);
                }
                Poll::Ready(matches!(conn.sender.poll_ready(cx), Poll::Ready(Ok(()))))
            })
            .await;
            if ready {
                return Some(conn);
            }
        }
    }

    fn give_back(&self, conn: Conn) {
        if conn.sender.is_closed() {
            return;
        }
        let Ok(mut idle) = self.idle.lock() else {
            return;
        };
        if idle.len() < MAX_IDLE_PER_SITE {
            idle.push(Idle {
                conn,
                since: crate::clock::monotonic(),
            });
        }
    }
}

/// Whether a request refused before any of it was written, on attempt `attempts` (from
/// 1), is sent again: only from a pooled connection (a new one that refuses is not stale
/// but failing), at most [`MAX_STALE_RETRIES`] times.
fn sent_again(reused: bool, attempts: usize) -> bool {
    reused && attempts <= MAX_STALE_RETRIES
}

/// Whether a connection idle since `since` is too old to reuse at `now`.
fn expired(since: Instant, now: Instant) -> bool {
    now.saturating_duration_since(since) > POOL_IDLE_TIMEOUT
}

/// A new connection to `authority` (`host[:port]`, port 80 by default).
async fn connect(connector: &PlainConnect, authority: &str) -> Result<Conn, SiteError> {
    let failed = |source: Box<dyn std::error::Error + Send + Sync>| SiteError::Connect {
        authority: Arc::from(authority),
        source,
    };
    let uri: http::Uri = format!("http://{authority}")
        .parse()
        .map_err(|e| failed(Box::new(e)))?;
    let io = connector.clone().call(uri).await.map_err(failed)?;
    let (sender, driver) = http1::handshake(io)
        .await
        .map_err(|e| failed(Box::new(e)))?;
    Ok(Conn {
        sender,
        driver: Box::new(driver),
        authority: Arc::from(authority),
    })
}

/// Sends `req` on `conn`, driving it until the answer's head: the head and the
/// connection (while it is still open), or hyper's error, with the request when none of
/// it was written.
async fn exchange(
    mut conn: Conn,
    req: Request<Full<Bytes>>,
) -> Result<
    (Response<Incoming>, Option<Conn>),
    hyper::client::conn::TrySendError<Request<Full<Bytes>>>,
> {
    let mut answer = pin!(conn.sender.try_send_request(req));
    let mut driver = Some(conn.driver);
    let head = std::future::poll_fn(|cx| {
        if let Some(d) = driver.as_mut()
            && Pin::new(&mut **d).poll(cx).is_ready()
        {
            // Shut down or failed: the answer future now holds the outcome.
            driver = None;
        }
        answer.as_mut().poll(cx)
    })
    .await?;
    Ok((
        head,
        driver.map(|driver| Conn {
            sender: conn.sender,
            driver,
            authority: conn.authority,
        }),
    ))
}

/// An answer's body from a pooled connection, which it drives while it is read and hands
/// back to its site's pool when it ends.
pub(crate) struct PooledBody {
    body: Incoming,
    conn: Option<Conn>,
    home: Option<Arc<SitePool>>,
}

impl PooledBody {
    fn poll_driver(&mut self, cx: &mut Context<'_>) {
        if let Some(conn) = self.conn.as_mut()
            && Pin::new(&mut *conn.driver).poll(cx).is_ready()
        {
            self.conn = None;
        }
    }

    fn finish(&mut self) {
        if let (Some(conn), Some(home)) = (self.conn.take(), self.home.take()) {
            home.give_back(conn);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let mut polled = Pin::new(&mut this.body).poll_frame(cx);
        if polled.is_pending() {
            // The connection reads what the body waits for; it is polled here, in the
            // client connection's task, instead of in a task of its own.
            this.poll_driver(cx);
            polled = Pin::new(&mut this.body).poll_frame(cx);
        }
        match &polled {
            Poll::Ready(None) => this.finish(),
            Poll::Ready(Some(Err(_))) => this.conn = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for PooledBody {
    /// An answer known to be over (an empty body hyper never asks for) keeps its
    /// connection; one cut short closes it, as the site would still be sending.
    fn drop(&mut self) {
        if self.body.is_end_stream() {
            self.finish();
        }
    }
}

/// A site's answer body, from a pooled connection in the clear or from the hyper-util
/// client (`https://` sites).
pub(crate) enum SiteBody {
    /// Driven from the client connection's task.
    Pooled(PooledBody),
    /// Read from the hyper-util client's connection task.
    Client(Incoming),
}

impl Body for SiteBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            Self::Pooled(b) => Pin::new(b).poll_frame(cx),
            Self::Client(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Pooled(b) => b.is_end_stream(),
            Self::Client(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Pooled(b) => b.size_hint(),
            Self::Client(b) => b.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use std::time::Duration;

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    const WAIT: Duration = Duration::from_secs(5);

    /// How a test site answers each request on a connection.
    #[derive(Clone, Copy)]
    enum Site {
        /// `ok`, and the connection kept open.
        KeepAlive,
        /// `ok`, then the connection closed a little later (the answer did not say so).
        CloseAfterOne,
        /// A head promising 100 bytes, 10 of them, then silence.
        Truncated,
    }

    /// A site on loopback: its authority and how many connections it accepted.
    async fn site(kind: Site) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut seen = Vec::new();
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            seen.drain(..end + 4);
                            let answer: &[u8] = match kind {
                                Site::KeepAlive | Site::CloseAfterOne => {
                                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                                }
                                Site::Truncated => {
                                    b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789"
                                }
                            };
                            if s.write_all(answer).await.is_err() {
                                return;
                            }
                            match kind {
                                Site::KeepAlive => {}
                                Site::CloseAfterOne => {
                                    // After the answer was read and pooled.
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                    return;
                                }
                                Site::Truncated => {
                                    tokio::time::sleep(WAIT).await;
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        (authority, accepted)
    }

    fn get() -> Request<Full<Bytes>> {
        Request::builder()
            .uri("/v1/models")
            .body(Full::new(Bytes::new()))
            .unwrap()
    }

    fn connector() -> PlainConnect {
        crate::upstream::plain_connector(WAIT)
    }

    async fn fetch(pool: &Arc<SitePool>, authority: &str) -> Bytes {
        let resp = tokio::time::timeout(WAIT, pool.send(&connector(), authority, get()))
            .await
            .unwrap()
            .unwrap();
        tokio::time::timeout(WAIT, resp.into_body().collect())
            .await
            .unwrap()
            .unwrap()
            .to_bytes()
    }

    #[tokio::test]
    async fn sequential_requests_to_a_site_reuse_its_one_connection() {
        let (authority, accepted) = site(Site::KeepAlive).await;
        let pool = Arc::new(SitePool::default());
        for _ in 0..3 {
            assert_eq!(fetch(&pool, &authority).await, "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle_count(), 1);
    }

    #[tokio::test]
    async fn a_connection_the_site_closed_while_idle_is_dropped_and_the_request_goes_on_a_new_one()
    {
        let (authority, accepted) = site(Site::CloseAfterOne).await;
        let pool = Arc::new(SitePool::default());
        assert_eq!(fetch(&pool, &authority).await, "ok");
        assert_eq!(
            pool.idle_count(),
            1,
            "the answer did not say it would close"
        );
        // Let the site's close reach this end.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(fetch(&pool, &authority).await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_answer_cut_short_closes_its_connection_instead_of_pooling_it() {
        let (authority, _) = site(Site::Truncated).await;
        let pool = Arc::new(SitePool::default());
        let resp = pool.send(&connector(), &authority, get()).await.unwrap();
        let mut body = resp.into_body();
        let first = tokio::time::timeout(WAIT, body.frame())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(first.into_data().unwrap(), "0123456789");
        drop(body);
        assert_eq!(pool.idle_count(), 0);
    }

    #[tokio::test]
    async fn at_most_max_idle_per_site_connections_are_kept_idle() {
        let (authority, accepted) = site(Site::KeepAlive).await;
        let pool = Arc::new(SitePool::default());
        // Every answer's head is taken before any body is read, so each needs its own
        // connection.
        let mut answers = Vec::new();
        for _ in 0..=MAX_IDLE_PER_SITE {
            answers.push(pool.send(&connector(), &authority, get()).await.unwrap());
        }
        assert_eq!(accepted.load(Ordering::SeqCst), MAX_IDLE_PER_SITE + 1);
        for a in answers {
            a.into_body().collect().await.unwrap();
        }
        assert_eq!(pool.idle_count(), MAX_IDLE_PER_SITE);
    }

    #[tokio::test]
    async fn a_connection_to_the_sites_former_authority_is_not_reused_after_a_reload() {
        let (before, _) = site(Site::KeepAlive).await;
        let (after, accepted) = site(Site::KeepAlive).await;
        let pool = Arc::new(SitePool::default());
        assert_eq!(fetch(&pool, &before).await, "ok");
        assert_eq!(fetch(&pool, &after).await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(
            pool.idle_count(),
            1,
            "the former authority's connection was dropped"
        );
    }

    #[tokio::test]
    async fn a_connect_that_outlasts_its_bound_fails_as_a_connect_timeout() {
        // A listener that never accepts, with the smallest backlog: once its queue is
        // full, the kernel ignores further handshakes, and a connect waits.
        let socket = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
        .unwrap();
        socket
            .bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        socket.listen(0).unwrap();
        let authority = socket
            .local_addr()
            .unwrap()
            .as_socket()
            .unwrap()
            .to_string();
        let bound = Duration::from_millis(200);
        let mut held = Vec::new();
        for _ in 0..8 {
            match tokio::time::timeout(bound, TcpStream::connect(&authority)).await {
                Ok(Ok(s)) => held.push(s),
                _ => break,
            }
        }
        let pool = Arc::new(SitePool::default());
        let slow = crate::upstream::plain_connector(bound);
        let Err(e) = pool.send(&slow, &authority, get()).await else {
            panic!("connected past a full backlog");
        };
        assert!(e.is_connect(), "{e}");
        assert!(crate::upstream::is_connect_timeout(&e), "{e}");
    }

    #[tokio::test]
    async fn a_request_on_a_connection_that_is_gone_is_handed_back_unwritten() {
        let (authority, _) = site(Site::KeepAlive).await;
        let gone = connect(&connector(), &authority).await.unwrap();
        let live = connect(&connector(), &authority).await.unwrap();
        drop(gone.driver);
        let conn = Conn {
            sender: gone.sender,
            driver: live.driver,
            authority: gone.authority,
        };
        let Err(mut e) = exchange(conn, get()).await else {
            panic!("a connection without its driver answered");
        };
        assert!(e.take_message().is_some());
    }

    #[test]
    fn a_refused_request_is_sent_again_once_and_only_from_a_pooled_connection() {
        assert!(sent_again(true, MAX_STALE_RETRIES));
        assert!(!sent_again(true, MAX_STALE_RETRIES + 1));
        assert!(!sent_again(false, 1));
    }

    #[test]
    fn a_connection_idle_for_the_idle_timeout_is_reused_and_one_idle_longer_is_not() {
        let since = crate::clock::monotonic();
        assert!(!expired(since, since + POOL_IDLE_TIMEOUT));
        assert!(expired(
            since,
            since + POOL_IDLE_TIMEOUT + Duration::from_nanos(1)
        ));
        assert!(
            !expired(since, since),
            "a clock read before `since` is not an age"
        );
    }
}
