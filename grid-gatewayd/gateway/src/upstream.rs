//! HTTP clients toward serving sites and toward the operator.
//!
//! A site in the clear (`http://`, the local site) is reached over its own pool of
//! HTTP/1.1 connections driven from the request's task (`site_pool`). TLS sites
//! and the operator are reached over pooled hyper-util clients over rustls presenting
//! the gateway's certificate. Sites
//! are verified under the name in their base URL; the operator under the configured
//! identity, whatever address the URL uses, so a gateway can dial its operator by IP
//! while still refusing any certificate but the operator's.
//!
//! # The connect bound covers TCP and TLS
//!
//! `connectTimeoutSeconds` bounds the whole connector ([`BoundedConnect`]): the TCP
//! connect and, for `https://`, the TLS handshake. A site whose ingress accepts TCP and
//! then stalls (a frozen process behind a live kernel socket) fails as a connect error
//! like a refused port, so the request path's one retry elsewhere applies: nothing of the
//! request was sent.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;

use bytes::Bytes;
use grid_h1_wire::{MAX_ANSWER_HEAD_BYTES, MAX_ANSWER_HEADERS};
use grid_score::catalog::Upstream;
use grid_score::routing::RoutingView;
use http::Uri;
use http::uri::PathAndQuery;
use http_body_util::Full;
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::ClientConfig;
use rustls_pki_types::ServerName;

/// The slot the poller publishes each refresh's view into and requests load from
/// (`ArcSwap::load`: no lock, no allocation).
pub type Published = Arc<ArcSwap<RoutingView>>;

/// The upstream URI for a client's path and query, the base URL's prefix kept. Without
/// a prefix the client's own (already validated, shared) path is reused: nothing is
/// copied or parsed again.
pub fn uri_for(upstream: &Upstream, path_and_query: &PathAndQuery) -> Result<Uri, http::Error> {
    let pq = if upstream.prefix().is_empty() {
        path_and_query.clone()
    } else {
        PathAndQuery::try_from(format!("{}{}", upstream.prefix(), path_and_query.as_str()))?
    };
    Uri::builder()
        .scheme(upstream.scheme())
        .authority(upstream.authority())
        .path_and_query(pq)
        .build()
}

/// The origin-form URI (path and query only) for a site's own pool
/// (`site_pool`), which writes the authority in `Host` itself.
pub fn origin_uri_for(
    upstream: &Upstream,
    path_and_query: &PathAndQuery,
) -> Result<Uri, http::Error> {
    let pq = if upstream.prefix().is_empty() {
        path_and_query.clone()
    } else {
        PathAndQuery::try_from(format!("{}{}", upstream.prefix(), path_and_query.as_str()))?
    };
    Ok(Uri::from(pq))
}

/// A pooled client whose requests carry an in-memory body.
pub type HttpClient = Client<BoundedConnect<HttpsConnector<HttpConnector>>, Full<Bytes>>;

/// A boxed connector error.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The connector ran out of its bound (TCP connect plus TLS handshake).
#[derive(Debug, thiserror::Error)]
#[error("connecting (TCP and TLS) took longer than {0:?}")]
pub struct ConnectTimedOut(pub Duration);

/// Whether `error` (a pooled client's error) is a connect that ran out of its bound.
pub fn is_connect_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    grid_daemon::cause::any(error, <dyn std::error::Error>::is::<ConnectTimedOut>)
}

/// A connector whose every connection attempt, handshakes included, is bounded.
#[derive(Clone, Debug)]
pub struct BoundedConnect<C> {
    inner: C,
    timeout: Duration,
}

impl<C> BoundedConnect<C> {
    /// `inner` with each `call` bounded by `timeout`.
    pub fn new(inner: C, timeout: Duration) -> Self {
        Self { inner, timeout }
    }
}

impl<C> tower_service::Service<Uri> for BoundedConnect<C>
where
    C: tower_service::Service<Uri>,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, connecting).await {
                Ok(done) => done.map_err(Into::into),
                Err(_) => Err(Box::new(ConnectTimedOut(timeout)) as BoxError),
            }
        })
    }
}

/// Idle connections kept per site: enough to absorb a burst without a TLS handshake per
/// request, few enough that an idle gateway does not hold many sockets per site.
pub const MAX_IDLE_PER_SITE: usize = 32;

/// How long an idle pooled connection is kept.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

fn http_connector(connect_timeout: Duration) -> HttpConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    // A request written on a pooled connection into a partition is acknowledged by
    // nobody: the kernel aborts the connection (ETIMEDOUT) once sent bytes stay
    // unacknowledged this long, instead of leaving the request to the header bound.
    // Acknowledgments come from the peer's kernel at round-trip speed however slow its
    // application, so a site that cannot acknowledge within the connect bound is as
    // unreachable as one that cannot complete a handshake within it.
    http.set_tcp_user_timeout(Some(connect_timeout));
    http
}

/// The connector of sites in the clear ([`plain_connector`]).
pub type PlainConnect = BoundedConnect<HttpConnector>;

/// The connector the pool of a site in the clear (`site_pool`) opens connections with:
/// the site client's TCP connector (`TCP_NODELAY`, `TCP_USER_TIMEOUT`, resolution) under
/// the same bound, without TLS. Only the whole bound runs: the connector's own
/// per-address timeout (the bound split across the resolved addresses) would end a
/// stalled connect a moment earlier as a plain I/O error, which [`is_connect_timeout`]
/// does not recognise, so the stall would not be counted as a connect timeout.
pub fn plain_connector(connect_timeout: Duration) -> PlainConnect {
    let mut http = http_connector(connect_timeout);
    http.set_connect_timeout(None);
    BoundedConnect::new(http, connect_timeout)
}

/// Whether `error` is the kernel's `TCP_USER_TIMEOUT` abort (see [`site_client`]):
/// bytes this gateway sent stayed unacknowledged for the connect bound. Over HTTP/1.1
/// those bytes are the request's own, so it never arrived whole and is safe to send
/// elsewhere; over HTTP/2 they may be another stream's, and the connection they died
/// with could not have carried an answer anyway. No other wait of the gateway ends as an
/// I/O `TimedOut`: its own bounds are timers around the exchange.
pub fn is_unacknowledged(error: &(dyn std::error::Error + 'static)) -> bool {
    grid_daemon::cause::any(error, |e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
    })
}

/// The client for serving sites: `http://` base URLs go in the clear (the local site),
/// `https://` ones over TLS with the gateway's certificate, HTTP/2 when the site offers it.
/// As for [`plain_connector`], only the whole bound runs: the TCP connector's own timeout
/// would race it and end a stalled connect as a plain I/O error, not counted as a connect
/// timeout.
pub fn site_client(tls: ClientConfig, connect_timeout: Duration) -> HttpClient {
    let mut http = http_connector(connect_timeout);
    http.set_connect_timeout(None);
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    // A site over TLS answers through hyper, a site in the clear through grid's own
    // codec: both read at most the same head (`grid_h1_wire`'s bounds), so no site's
    // answer is refused or taken by one path and not the other.
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(MAX_IDLE_PER_SITE)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .http1_max_headers(MAX_ANSWER_HEADERS)
        .http1_max_buf_size(MAX_ANSWER_HEAD_BYTES)
        .http2_max_header_list_size(MAX_ANSWER_HEAD_BYTES as u32)
        .build(BoundedConnect::new(connector, connect_timeout))
}

/// How often the gateway pings its operator over their one HTTP/2 connection: a frozen
/// operator is noticed (and the connection replaced at the next poll) within one
/// interval plus [`OPERATOR_KEEP_ALIVE_TIMEOUT`], even between polls.
pub const OPERATOR_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// How long a ping to the operator may go unanswered before the connection is dropped.
pub const OPERATOR_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The client for the local operator: TLS only, its certificate verified as `identity`,
/// and HTTP/2 only (ALPN `h2`), so the spec's "one connection to its operator" holds: a
/// feedback POST that overlaps the next poll is a second stream on the same connection,
/// not a second connection (which an HTTP/1.1 pool must open while one is busy). The
/// pool opens at most one HTTP/2 connection per host at a time and every request waits
/// for it. An operator that does not offer `h2` cannot be polled: every grid operator's
/// signals listener does.
pub fn operator_client(
    tls: ClientConfig,
    identity: ServerName<'static>,
    connect_timeout: Duration,
) -> HttpClient {
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .with_server_name_resolver(FixedServerNameResolver::new(identity))
        .enable_http2()
        .wrap_connector(http_connector(connect_timeout));
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(OPERATOR_KEEP_ALIVE_INTERVAL)
        .http2_keep_alive_timeout(OPERATOR_KEEP_ALIVE_TIMEOUT)
        .pool_max_idle_per_host(1)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .build(BoundedConnect::new(connector, connect_timeout))
}
