//! The accept loop: HTTP/1.1 and HTTP/2 (prior knowledge or upgrade-free h2c) on one
//! listener, with bounded waits, a connection cap and graceful draining. A connection's
//! first bytes tell the two apart (the HTTP/2 preface, or anything else); HTTP/1.1 is
//! served by the gateway's own server (`h1`), HTTP/2 by hyper's, whose streams
//! the connection's task polls itself (`h2_streams`).
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
//! the write bound (`clientWriteTimeoutSeconds`, `write_bound`): an HTTP/1.1
//! connection whose client takes nothing for that long is closed
//! (`write_timeout`), an HTTP/2 stream reset (`grid_gateway_streams_reset_total`).
//!
//! # No client holds a site alone
//!
//! An HTTP/2 connection carries at most [`HTTP2_MAX_CONCURRENT_STREAMS`] requests at once
//! and at most its share of each site's slots (`site::slots::SITE_SHARE_DIVISOR`).
//!
//! # A cap below the descriptor limit
//!
//! At most `maxConnections` connections are open; one past the cap is closed at accept
//! (counted as `limit`), so a flood of idle connections cannot take the descriptors that
//! upstream and operator sockets need. Accept errors (`EMFILE` when the process is out of
//! descriptors anyway) are counted (`accept_error`) and back off as every listener of
//! both daemons does ([`grid_daemon::accept`]).
//!
//! Past the cap, [`RESERVED_PROBE_CONNECTIONS`] more are taken for one probe each
//! (`GET /metrics`, `/v1/grid/routing`, `/healthz`, `/readyz` over HTTP/1.1, its head within
//! [`PROBE_HEAD_TIMEOUT`](super::limits::PROBE_HEAD_TIMEOUT), answered and closed), so a gateway flooded with connections can
//! still be scraped and probed; anything else on them is closed unanswered and counted as
//! `limit`.

use std::future::Future;
use std::sync::Arc;

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes, BytesMut};
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, watch};

use super::connection_metrics::{Closed, ListenerMetrics, Refusal, StreamReset};
use super::limits::{
    CLOSE_GRACE, DRAIN_TIMEOUT, HTTP2_KEEP_ALIVE_INTERVAL, HTTP2_KEEP_ALIVE_TIMEOUT,
    HTTP2_MAX_CONCURRENT_STREAMS, Limits, RESERVED_PROBE_CONNECTIONS,
};
use crate::engine::BoxError;
use crate::engine::client::connection_watch::{Activity, InFlight, watchdog};
use crate::engine::client::h2_streams::{Served, StreamQueue};
use crate::engine::client::write_bound::is_client_stalled;
use crate::engine::site::slots::ConnectionShare;
use crate::engine::timers::when_woken::WhenWoken;
use crate::front_ends::http_api::Api;
use grid_daemon::accept::AcceptBackoff;

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
            accepted = backoff.accept(&listener, "gateway", || metrics.refused(Refusal::AcceptError)) => accepted,
            () = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            if let Ok(probe) = Arc::clone(&probes).try_acquire_owned() {
                let (api, metrics) = (api.clone(), metrics.clone());
                tokio::spawn(async move {
                    let _probe = probe;
                    if !crate::engine::client::h1::answer_probe(stream, api, limits).await {
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
            let served = crate::engine::client::h1::serve(
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

/// The most a connection's task may hold, in bytes (its state, allocated once for the
/// connection's life, whatever step it is at): a streamed answer holds its connection
/// for minutes, so routing's state (the site exchange, the answer head) is boxed for
/// the head's time instead of sizing every open stream's task.
#[cfg(test)]
const CONNECTION_TASK_BUDGET: usize = 4 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of what `f` returns: a future's state, which its task holds.
    fn output_size<A, B, F>(_: impl FnOnce(A, B) -> F) -> usize {
        size_of::<F>()
    }

    #[test]
    fn a_connections_task_is_sized_for_a_streaming_answer_not_for_routing() {
        let size = output_size(Connection::run);
        assert!(
            size <= CONNECTION_TASK_BUDGET,
            "a connection's task holds {size} bytes, over {CONNECTION_TASK_BUDGET}"
        );
    }
}
