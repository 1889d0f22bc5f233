//! The accept loop: HTTP/1.1 and HTTP/2 (prior knowledge or upgrade-free h2c) on one
//! listener, with bounded waits, a connection cap and graceful draining. A connection's
//! first bytes tell the two apart (the HTTP/2 preface, or anything else); HTTP/1.1 is
//! served by the gateway's own server (`client_h1`), HTTP/2 by hyper's, whose streams
//! the connection's task polls itself (`http2_streams`).
//!
//! # Every client wait is bounded
//!
//! Each connection has a watchdog that knows whether a request is in flight on it (a
//! request counts from its head until its answer body is dropped, sent or not; how it
//! knows without a wake-up per request is in `connection_watch.rs`):
//!
//! - a new connection must deliver its first request head within
//!   `clientHeaderTimeoutSeconds` (a client that connects and sends nothing, or sends
//!   its head byte by byte, is closed);
//! - a connection with no request in flight is closed after `clientIdleTimeoutSeconds`
//!   (an idle keep-alive HTTP/1.1 connection, or an HTTP/2 one with no stream open);
//!   a later HTTP/1.1 head is held to `clientHeaderTimeoutSeconds` from its first bytes;
//! - an HTTP/2 peer that stops answering pings is dropped after
//!   [`HTTP2_KEEP_ALIVE_INTERVAL`] plus [`HTTP2_KEEP_ALIVE_TIMEOUT`].
//!
//! The watchdog bounds HTTP/1.1 and HTTP/2 alike and also the reading of the first
//! bytes that tell them apart, which has no bound of its own. A request in flight is
//! bounded by the upstream bounds (`http_api`) and, once its answer is being written, by
//! the write bound (`clientWriteTimeoutSeconds`, `client_write_bound`): an HTTP/1.1
//! connection whose client takes nothing for that long is closed
//! (`write_timeout`), an HTTP/2 stream reset (`grid_gateway_streams_reset_total`).
//!
//! # No client holds a site alone
//!
//! An HTTP/2 connection carries at most [`HTTP2_MAX_CONCURRENT_STREAMS`] requests at once
//! and at most its share of each site's slots (`site_slots::SITE_SHARE_DIVISOR`).
//!
//! # A cap below the descriptor limit
//!
//! At most `maxConnections` connections are open; one past the cap is closed at accept
//! (counted as `limit`), so a flood of idle connections cannot take the descriptors that
//! upstream and operator sockets need. Accept errors (`EMFILE` when the process is out of
//! descriptors anyway) back off exponentially from [`ACCEPT_BACKOFF_MIN`] to
//! [`ACCEPT_BACKOFF_MAX`] and are logged at most once per [`ACCEPT_ERROR_LOG_INTERVAL`].
//!
//! Past the cap, [`RESERVED_PROBE_CONNECTIONS`] more are taken for one probe each
//! (`GET /metrics`, `/v1/grid/routing`, `/healthz`, `/readyz` over HTTP/1.1, its head within
//! [`PROBE_HEAD_TIMEOUT`], answered and closed), so a gateway flooded with connections can
//! still be scraped and probed; anything else on them is closed unanswered and counted as
//! `limit`.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes, BytesMut};
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, watch};

use crate::client_write_bound::is_client_stalled;
use crate::connection_watch::{Activity, InFlight, watchdog};
use crate::http_api::Api;
use crate::http2_streams::{Served, StreamQueue};
use crate::idle_body::BoxError;
use crate::site_slots::ConnectionShare;
use crate::when_woken::WhenWoken;

pub use crate::site_slots::{SITE_SHARE_DIVISOR, site_share};

/// How long draining waits for open requests (streams included) before closing anyway.
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a connection closed by its watchdog may take to say goodbye (an HTTP/2
/// GOAWAY) before it is dropped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Interval of HTTP/2 keep-alive pings to a client: a peer that vanished without a FIN
/// (a partition, a dead host) is noticed within a minute.
pub const HTTP2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);

/// How long a client has to answer an HTTP/2 ping before its connection is dropped.
pub const HTTP2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// How long an HTTP/1.1 connection the gateway closes after its answer keeps reading
/// (and dropping) what the client still sends: a body it did not read, the rest of a
/// refused head. Closing a socket with bytes unread sends a reset, which can reach the
/// client before the answer and destroy it; nginx's `lingering_close` does the same.
pub const LINGER: Duration = Duration::from_secs(1);

/// The most bytes read and dropped while lingering.
pub const LINGER_MAX_BYTES: usize = 256 * 1024;

/// First pause after a failed accept: a transient error (a connection reset before
/// accept) costs 10 ms.
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);

/// Longest pause after repeated failed accepts: an out-of-descriptors listener retries
/// once a second instead of spinning, and still notices freed descriptors quickly.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Accept errors are logged at most once per this interval (with the count of those not
/// logged), so a listener out of descriptors does not flood the log.
pub const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Most requests one HTTP/2 client connection carries at once (its
/// `SETTINGS_MAX_CONCURRENT_STREAMS`; h2 refuses a stream past it). With the default
/// `maxConnectionsPerSite` it equals one connection's share of a site's slots.
pub const HTTP2_MAX_CONCURRENT_STREAMS: u32 = 128;

/// Connections taken past `maxConnections` for one probe each (`GET /metrics`,
/// `/v1/grid/routing`, `/healthz`, `/readyz` over HTTP/1.1): a scrape, a status read or a
/// kubelet probe still gets through a flood of connections.
pub const RESERVED_PROBE_CONNECTIONS: usize = 4;

/// How long a reserved probe connection has to deliver its request head (at most
/// `clientHeaderTimeoutSeconds`): a scraper or a kubelet sends its request at once, and a
/// silent connection gives its reserved place back within this.
pub const PROBE_HEAD_TIMEOUT: Duration = Duration::from_secs(1);

grid_signals::label_values! {
    /// Why a client connection was not served (`grid_gateway_connections_refused_total`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Refusal {
        /// `maxConnections` were open: closed at accept.
        Limit = "limit",
        /// `accept` failed (out of descriptors, reset before accept).
        AcceptError = "accept_error",
    }
}

grid_signals::label_values! {
    /// Why the gateway closed a client connection (`grid_gateway_connections_closed_total`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Closed {
        /// No first request head within `clientHeaderTimeoutSeconds`.
        HeaderTimeout = "header_timeout",
        /// No request in flight for `clientIdleTimeoutSeconds`.
        IdleTimeout = "idle_timeout",
        /// An HTTP/1.1 client took nothing of its answer for `clientWriteTimeoutSeconds`.
        WriteTimeout = "write_timeout",
        /// An HTTP/2 client left a ping unanswered for [`HTTP2_KEEP_ALIVE_TIMEOUT`].
        PingTimeout = "ping_timeout",
    }
}

grid_signals::label_values! {
    /// Why the gateway reset a client's HTTP/2 stream (`grid_gateway_streams_reset_total`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum StreamReset {
        /// The client took nothing of the stream's answer for `clientWriteTimeoutSeconds`.
        WriteTimeout = "write_timeout",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StreamResetLabels {
    reason: StreamReset,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    reason: Refusal,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClosedLabels {
    reason: Closed,
}

/// The listener's metric handles.
#[derive(Clone, Debug, Default)]
pub(crate) struct ListenerMetrics {
    refused: Family<RefusalLabels, Counter>,
    closed: Family<ClosedLabels, Counter>,
    reset: Family<StreamResetLabels, Counter>,
    open: Gauge,
}

impl ListenerMetrics {
    /// Registers `grid_gateway_connections_refused_total{reason}`,
    /// `grid_gateway_connections_closed_total{reason}` and `grid_gateway_connections_open`,
    /// every reason at 0.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        for reason in Refusal::ALL {
            m.refused.get_or_create(&RefusalLabels { reason }).inc_by(0);
        }
        for reason in Closed::ALL {
            m.closed.get_or_create(&ClosedLabels { reason }).inc_by(0);
        }
        for reason in StreamReset::ALL {
            m.reset
                .get_or_create(&StreamResetLabels { reason })
                .inc_by(0);
        }
        registry.register(
            "grid_gateway_connections_refused",
            "Client connections not served, by reason (limit, accept_error)",
            m.refused.clone(),
        );
        registry.register(
            "grid_gateway_connections_closed",
            "Client connections the gateway closed, by reason (header_timeout, idle_timeout, write_timeout, ping_timeout)",
            m.closed.clone(),
        );
        registry.register(
            "grid_gateway_streams_reset",
            "Client HTTP/2 streams the gateway reset, by reason (write_timeout)",
            m.reset.clone(),
        );
        registry.register(
            "grid_gateway_connections_open",
            "Client connections open now",
            m.open.clone(),
        );
        m
    }

    fn refused(&self, reason: Refusal) {
        self.refused.get_or_create(&RefusalLabels { reason }).inc();
    }

    fn closed(&self, reason: Closed) {
        self.closed.get_or_create(&ClosedLabels { reason }).inc();
    }

    /// The counter of streams reset for `reason`, found once per connection.
    fn reset(&self, reason: StreamReset) -> Counter {
        self.reset
            .get_or_create(&StreamResetLabels { reason })
            .clone()
    }
}

/// The listener's bounds, from the configuration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// `maxConnections`.
    pub(crate) max_connections: usize,
    /// `clientHeaderTimeoutSeconds`.
    pub(crate) header_timeout: Duration,
    /// `clientIdleTimeoutSeconds`.
    pub(crate) idle_timeout: Duration,
    /// `clientWriteTimeoutSeconds`.
    pub(crate) write_timeout: Duration,
}

/// The first bytes of an HTTP/2 connection with prior knowledge (RFC 9113 section 3.4).
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Serves `api` on `listener` until `shutdown` resolves, then stops accepting and lets
/// open connections finish for up to [`DRAIN_TIMEOUT`].
pub(crate) async fn serve(
    listener: TcpListener,
    api: Api,
    limits: Limits,
    metrics: ListenerMetrics,
    shutdown: impl Future<Output = ()>,
) {
    // u32 is what `acquire_many` takes; the configured cap is far below it.
    let cap = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let slots = Arc::new(Semaphore::new(cap as usize));
    let probes = Arc::new(Semaphore::new(RESERVED_PROBE_CONNECTIONS));
    let (draining, drain) = watch::channel(false);
    let mut backoff = AcceptBackoff::default();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => {
                    backoff.on_success();
                    a
                }
                Err(e) => {
                    metrics.refused(Refusal::AcceptError);
                    let (pause, log) = backoff.on_error(grid_gateway::clock::monotonic());
                    if let Some(unlogged) = log {
                        tracing::warn!(error = %e, unlogged, retry_in = ?pause, "accept failed; backing off");
                    }
                    tokio::select! {
                        () = tokio::time::sleep(pause) => continue,
                        () = &mut shutdown => break,
                    }
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            if let Ok(probe) = Arc::clone(&probes).try_acquire_owned() {
                let (api, metrics) = (api.clone(), metrics.clone());
                tokio::spawn(async move {
                    let _probe = probe;
                    if !crate::client_h1::answer_probe(stream, api, limits).await {
                        metrics.refused(Refusal::Limit);
                    }
                });
                continue;
            }
            // Closed at once: the cap is what keeps descriptors for real work.
            metrics.refused(Refusal::Limit);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            api: api.clone(),
            limits,
            metrics: metrics.clone(),
            drain: drain.clone(),
        };
        let open = metrics.open.clone();
        tokio::spawn(async move {
            let _permit = permit;
            open.inc();
            if let Err(e) = connection.run(stream).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            open.dec();
        });
    }
    drop(listener);
    let _ = draining.send(true);
    if tokio::time::timeout(DRAIN_TIMEOUT, slots.acquire_many(cap))
        .await
        .is_err()
    {
        // Logged, not counted: the process is about to exit, and nothing scrapes it again.
        let left = (cap as usize).saturating_sub(slots.available_permits());
        tracing::warn!(left, "drain timed out; closing remaining connections");
    }
}

/// What one client connection is served with.
struct Connection {
    api: Api,
    limits: Limits,
    metrics: ListenerMetrics,
    drain: watch::Receiver<bool>,
}

impl Connection {
    /// Tells HTTP/2 from HTTP/1.1 by the first bytes, then serves the connection with
    /// the gateway's own HTTP/1.1 server or hyper's HTTP/2 one, under one watchdog.
    async fn run(self, mut stream: TcpStream) -> Result<(), BoxError> {
        let activity = Activity::new(grid_gateway::clock::monotonic());
        // Both polled only when their timer or the flag fired, not at every wake-up of
        // this task (`when_woken`).
        let mut watch = WhenWoken::new(watchdog(Arc::clone(&activity), self.limits));
        let mut drained = drained(self.drain.clone());
        let mut read = BytesMut::new();
        let http2 = tokio::select! {
            biased;
            sniffed = sniff(&mut stream, &mut read) => match sniffed? {
                Some(http2) => http2,
                None => return Ok(()),
            },
            reason = &mut watch => {
                self.metrics.closed(reason);
                return Ok(());
            }
            () = &mut drained => return Ok(()),
        };
        if !http2 {
            let served = crate::client_h1::serve(
                stream,
                read,
                self.api,
                activity,
                self.limits.write_timeout,
                (self.drain.clone(), drained),
            );
            return tokio::select! {
                // The connection first: it is what most wake-ups are for.
                biased;
                served = served => match served {
                    Err(e) if is_client_stalled(&e) => {
                        self.metrics.closed(Closed::WriteTimeout);
                        Ok(())
                    }
                    served => served.map_err(Into::into),
                },
                reason = &mut watch => {
                    // The watchdog fires only with no request in flight: nothing is cut.
                    self.metrics.closed(reason);
                    Ok(())
                }
            };
        }
        // The connection's own queue: its streams are polled with it, by this task, each
        // ended at the write bound.
        let queue = StreamQueue::bounded(
            self.limits.write_timeout,
            self.metrics.reset(StreamReset::WriteTimeout),
        );
        let service = {
            let (api, activity, queue) = (self.api, Arc::clone(&activity), queue.clone());
            let share = Arc::new(ConnectionShare::default());
            service_fn(move |req| {
                let (api, share) = (api.clone(), Arc::clone(&share));
                let progress = queue.progress_of_next();
                let guard = InFlight::start(&activity);
                async move {
                    let resp = api.handle(req, Some(&share)).await;
                    Ok::<_, std::convert::Infallible>(guard.hold(resp, progress))
                }
            })
        };
        let io = TokioIo::new(Prefixed {
            prefix: read.freeze(),
            io: stream,
        });
        let mut h2 = http2::Builder::new(queue.clone());
        h2.timer(TokioTimer::new())
            .max_concurrent_streams(HTTP2_MAX_CONCURRENT_STREAMS)
            .keep_alive_interval(Some(HTTP2_KEEP_ALIVE_INTERVAL))
            .keep_alive_timeout(HTTP2_KEEP_ALIVE_TIMEOUT);
        let mut served = Served::new(h2.serve_connection(io, service), queue);
        let ended = tokio::select! {
            biased;
            ended = &mut served => Some(ended),
            reason = &mut watch => {
                self.metrics.closed(reason);
                served.conn().graceful_shutdown();
                tokio::time::timeout(CLOSE_GRACE, &mut served).await.ok()
            }
            () = &mut drained => {
                served.conn().graceful_shutdown();
                Some((&mut served).await)
            }
        };
        match ended {
            // hyper's keep-alive: a ping the client left unanswered.
            Some(Err(e)) if e.is_timeout() => {
                self.metrics.closed(Closed::PingTimeout);
                Ok(())
            }
            Some(Err(e)) => Err(e.into()),
            _ => Ok(()),
        }
    }
}

/// Resolves once draining began (or the listener is gone); polled only when the flag
/// changed ([`WhenWoken`]). Not to be polled again once it resolved.
pub(crate) fn drained(mut drain: watch::Receiver<bool>) -> WhenWoken<impl Future<Output = ()>> {
    WhenWoken::new(async move {
        let _ = drain.wait_for(|d| *d).await;
    })
}

/// Reads until the first bytes tell the protocol: `Some(true)` for the HTTP/2 preface,
/// `Some(false)` as soon as they differ from it, `None` when the client closed first.
async fn sniff(stream: &mut TcpStream, read: &mut BytesMut) -> std::io::Result<Option<bool>> {
    loop {
        let n = read.len().min(HTTP2_PREFACE.len());
        if read[..n] != HTTP2_PREFACE[..n] {
            return Ok(Some(false));
        }
        if n == HTTP2_PREFACE.len() {
            return Ok(Some(true));
        }
        read.reserve(8 * 1024);
        if stream.read_buf(read).await? == 0 {
            return Ok(None);
        }
    }
}

/// A connection whose first bytes were read while sniffing: they are read again first.
struct Prefixed {
    prefix: Bytes,
    io: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.prefix.is_empty() {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let n = self.prefix.len().min(buf.remaining());
        buf.put_slice(&self.prefix[..n]);
        self.prefix.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Pauses after failed accepts: doubling from [`ACCEPT_BACKOFF_MIN`] to
/// [`ACCEPT_BACKOFF_MAX`], reset by a successful accept; says when to log.
#[derive(Debug)]
struct AcceptBackoff {
    next: Duration,
    last_log: Option<Instant>,
    unlogged: u64,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        Self {
            next: ACCEPT_BACKOFF_MIN,
            last_log: None,
            unlogged: 0,
        }
    }
}

impl AcceptBackoff {
    /// The pause after a failed accept at `now`, and `Some(errors not logged since the
    /// last log line)` when this one is to be logged.
    fn on_error(&mut self, now: Instant) -> (Duration, Option<u64>) {
        let pause = self.next;
        self.next = (self.next * 2).min(ACCEPT_BACKOFF_MAX);
        let due = self
            .last_log
            .is_none_or(|at| now.duration_since(at) >= ACCEPT_ERROR_LOG_INTERVAL);
        if due {
            self.last_log = Some(now);
            let unlogged = std::mem::take(&mut self.unlogged);
            (pause, Some(unlogged))
        } else {
            self.unlogged += 1;
            (pause, None)
        }
    }

    fn on_success(&mut self) {
        self.next = ACCEPT_BACKOFF_MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_accept_errors_back_off_to_the_cap_and_log_once_per_interval() {
        let start = grid_gateway::clock::monotonic();
        let mut b = AcceptBackoff::default();
        let (mut now, mut logged, mut pauses) = (start, 0, Vec::new());
        // A minute of a listener out of descriptors.
        while now.duration_since(start) < Duration::from_secs(60) {
            let (pause, log) = b.on_error(now);
            logged += usize::from(log.is_some());
            pauses.push(pause);
            now += pause;
        }
        assert_eq!(pauses[0], ACCEPT_BACKOFF_MIN);
        assert_eq!(pauses[1], ACCEPT_BACKOFF_MIN * 2);
        assert_eq!(*pauses.last().unwrap(), ACCEPT_BACKOFF_MAX, "capped");
        assert!(
            pauses.len() < 80,
            "{} accepts in a minute, not one per 10 ms",
            pauses.len()
        );
        assert!(
            (6..=7).contains(&logged),
            "{logged} log lines in a minute, one per interval"
        );
        b.on_success();
        assert_eq!(b.on_error(now).0, ACCEPT_BACKOFF_MIN, "reset by an accept");
    }
}
