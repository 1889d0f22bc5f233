//! The mutual-TLS signals listener: accepts, admits into [`crate::slots`], handshakes,
//! identifies the caller from its certificate and hands each request to a [`Handler`].
//!
//! The listener decides who is calling; the handler decides what that caller may see.
//! Nothing a connection does (a failed handshake, a timeout, a shed) stops the accept
//! loop.
//!
//! # HTTP/2 and HTTP/1.1
//!
//! ALPN decides the protocol: `h2` when the client offers it (the local gateway does, so
//! its polls and feedback POSTs share one connection), `http/1.1` otherwise (peers, and
//! any client offering no ALPN). Both carry the same bounds: the handshake timeout, the
//! header-read timeout (for HTTP/2: a connection with no request in flight for that long
//! is closed, which covers a stream whose headers never complete and an idle connection
//! alike, counted as `header_timeout` as for HTTP/1.1), the maximum connection age and
//! the slot table. HTTP/2 adds [`H2_MAX_CONCURRENT_STREAMS`], a header-list bound and
//! keep-alive pings that close a connection whose peer stopped answering.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rustls::ServerConfig;
use tokio::net::TcpListener;

use crate::slots::{HANDSHAKE_TIMEOUT, HEADER_READ_TIMEOUT, MAX_CONNECTION_AGE, ShedReason, Slots};
use grid_daemon::accept::AcceptBackoff;
use grid_daemon::tls::{ALPN_H2, Identity, Trust, peer_identity};

/// Streams one HTTP/2 connection may have open at once. The local gateway needs two (a
/// poll and a feedback POST); a few more absorb a slow exchange without letting one
/// connection multiply the handler's work.
pub const H2_MAX_CONCURRENT_STREAMS: u32 = 8;
/// Largest HTTP/2 header list accepted: the signals API's requests carry a few short
/// headers; hyper's default (16 MiB) would let one stream hold megabytes.
pub const H2_MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// How often an HTTP/2 connection is pinged: a peer that stopped answering (a frozen
/// process, a dead link) is noticed within a request, long before the connection's
/// maximum age.
pub const H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// How long a keep-alive ping may go unanswered before the connection is closed.
pub const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// A response future of a [`Handler`].
pub type HandlerFuture = Pin<Box<dyn Future<Output = Response<Full<Bytes>>> + Send>>;

/// Answers one request whose caller the listener identified (`None`: a trusted
/// certificate that is neither this site nor a configured peer).
pub trait Handler: Send + Sync + 'static {
    /// Builds the response.
    fn handle(&self, caller: Option<Identity>, request: Request<Incoming>) -> HandlerFuture;
}

/// The membership session material of the TLS connection a peer's request arrived on
/// (RFC 5705 export under [`grid_membership::seal::EXPORTER_LABEL`]), carried in the
/// request's extensions; only the two ends of that handshake can compute it.
#[derive(Clone, Copy)]
pub struct SessionMaterial(pub [u8; grid_membership::seal::SESSION_MATERIAL_BYTES]);

impl std::fmt::Debug for SessionMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionMaterial(..)")
    }
}

impl SessionMaterial {
    /// Exports the material from an established connection, either end.
    pub fn export<D>(conn: &rustls::ConnectionCommon<D>) -> Option<Self> {
        conn.export_keying_material(
            [0u8; grid_membership::seal::SESSION_MATERIAL_BYTES],
            grid_membership::seal::EXPORTER_LABEL,
            None,
        )
        .ok()
        .map(Self)
    }
}

/// Timeouts of one listener; tests shorten them.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// See [`HANDSHAKE_TIMEOUT`].
    pub handshake: Duration,
    /// See [`HEADER_READ_TIMEOUT`].
    pub header_read: Duration,
    /// See [`MAX_CONNECTION_AGE`].
    pub max_age: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            handshake: HANDSHAKE_TIMEOUT,
            header_read: HEADER_READ_TIMEOUT,
            max_age: MAX_CONNECTION_AGE,
        }
    }
}

/// The listener's series.
#[derive(Clone, Debug)]
pub struct ListenerMetrics {
    shed: Family<ShedReason, Counter>,
    handshake_failures: Counter,
    open: Gauge,
}

impl ListenerMetrics {
    /// Registers `grid_operator_connections_shed_total{reason}`,
    /// `grid_operator_tls_handshake_failures_total` and `grid_operator_connections_open`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            shed: grid_signals::labels::register_zeroed(
                registry,
                "grid_operator_connections_shed",
                "Signals-listener connections shed, by reason",
            ),
            handshake_failures: Counter::default(),
            open: Gauge::default(),
        };
        registry.register(
            "grid_operator_tls_handshake_failures",
            "Signals-listener TLS handshakes refused (untrusted, expired or malformed certificates)",
            m.handshake_failures.clone(),
        );
        registry.register(
            "grid_operator_connections_open",
            "Signals-listener connections past their handshake",
            m.open.clone(),
        );
        m
    }

    fn shed(&self, reason: ShedReason) {
        self.shed.get_or_create(&reason).inc();
    }

    /// Connections shed for `reason` so far.
    pub fn shed_count(&self, reason: ShedReason) -> u64 {
        self.shed.get_or_create(&reason).get()
    }

    /// Handshakes refused so far.
    pub fn handshake_failures(&self) -> u64 {
        self.handshake_failures.get()
    }
}

/// Everything the accept loop needs.
pub struct Listener<H> {
    /// The bound socket.
    pub tcp: TcpListener,
    /// Server TLS (client certificates required).
    pub tls: Arc<ServerConfig>,
    /// Maps certificates to identities.
    pub trust: Arc<Trust>,
    /// The slot table.
    pub slots: Arc<Slots>,
    /// Series to count into.
    pub metrics: ListenerMetrics,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Answers requests.
    pub handler: Arc<H>,
}

impl<H: Handler> Listener<H> {
    /// Runs the accept loop until the task is dropped.
    pub async fn run(self) {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.tls);
        let mut backoff = AcceptBackoff::default();
        loop {
            let (tcp, _) = backoff
                .accept(&self.tcp, "signals", || {
                    self.metrics.shed(ShedReason::AcceptError);
                })
                .await;
            let slot = match self.slots.admit() {
                Ok(slot) => slot,
                Err(reason) => {
                    self.metrics.shed(reason);
                    continue;
                }
            };
            let conn = Connection {
                acceptor: acceptor.clone(),
                trust: self.trust.clone(),
                metrics: self.metrics.clone(),
                timeouts: self.timeouts,
                handler: self.handler.clone(),
            };
            tokio::spawn(conn.serve(tcp, slot));
        }
    }
}

struct Connection<H> {
    acceptor: tokio_rustls::TlsAcceptor,
    trust: Arc<Trust>,
    metrics: ListenerMetrics,
    timeouts: Timeouts,
    handler: Arc<H>,
}

impl<H: Handler> Connection<H> {
    async fn serve(self, tcp: tokio::net::TcpStream, slot: crate::slots::Slot) {
        let handshake = tokio::time::timeout(self.timeouts.handshake, self.acceptor.accept(tcp));
        let tls = tokio::select! {
            result = handshake => match result {
                Ok(Ok(tls)) => tls,
                Ok(Err(_)) => {
                    self.metrics.handshake_failures.inc();
                    return;
                }
                Err(_) => {
                    self.metrics.shed(ShedReason::HandshakeTimeout);
                    return;
                }
            },
            () = slot.evicted() => {
                self.metrics.shed(ShedReason::Evicted);
                return;
            }
        };
        let caller = peer_identity(tls.get_ref().1, &self.trust);
        // Only a peer may agree a membership session, so only its connections pay for
        // the export.
        let session = match caller {
            Some(Identity::Peer(_)) => SessionMaterial::export(tls.get_ref().1),
            _ => None,
        };
        let slot = match slot.settle(caller.as_ref()) {
            Ok(slot) => slot,
            Err(reason) => {
                self.metrics.shed(reason);
                return;
            }
        };
        self.metrics.open.inc();
        let h2 = tls.get_ref().1.alpn_protocol() == Some(ALPN_H2);
        let result = if h2 {
            self.serve_h2(TokioIo::new(tls), caller, session).await
        } else {
            self.serve_h1(TokioIo::new(tls), caller, session).await
        };
        if let Err(e) = result
            && e.is_timeout()
        {
            self.metrics.shed(ShedReason::HeaderTimeout);
        }
        self.metrics.open.dec();
        drop(slot);
    }
}

type TlsIo = TokioIo<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>;

impl<H: Handler> Connection<H> {
    async fn serve_h1(
        &self,
        io: TlsIo,
        caller: Option<Identity>,
        session: Option<SessionMaterial>,
    ) -> Result<(), hyper::Error> {
        let handler = self.handler.clone();
        let service = service_fn(move |mut request: Request<Incoming>| {
            if let Some(m) = session {
                request.extensions_mut().insert(m);
            }
            let response = handler.handle(caller.clone(), request);
            async move { Ok::<_, Infallible>(response.await) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.timeouts.header_read)
            .serve_connection(io, service);
        tokio::pin!(conn);
        tokio::select! {
            result = conn.as_mut() => result,
            () = tokio::time::sleep(self.timeouts.max_age) => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        }
    }

    /// HTTP/2 has no header-read timeout of its own: [`InFlight`] closes the connection
    /// once no request has been in flight for `header_read`.
    async fn serve_h2(
        &self,
        io: TlsIo,
        caller: Option<Identity>,
        session: Option<SessionMaterial>,
    ) -> Result<(), hyper::Error> {
        let handler = self.handler.clone();
        let in_flight = Arc::new(InFlight::default());
        let counted = in_flight.clone();
        let service = service_fn(move |mut request: Request<Incoming>| {
            if let Some(m) = session {
                request.extensions_mut().insert(m);
            }
            let guard = counted.start();
            let response = handler.handle(caller.clone(), request);
            async move {
                let response = response.await;
                drop(guard);
                Ok::<_, Infallible>(response)
            }
        });
        let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .max_concurrent_streams(H2_MAX_CONCURRENT_STREAMS)
            .max_header_list_size(H2_MAX_HEADER_LIST_BYTES)
            .keep_alive_interval(Some(H2_KEEP_ALIVE_INTERVAL))
            .keep_alive_timeout(H2_KEEP_ALIVE_TIMEOUT)
            .serve_connection(io, service);
        tokio::pin!(conn);
        tokio::select! {
            result = conn.as_mut() => result,
            () = tokio::time::sleep(self.timeouts.max_age) => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
            () = in_flight.idle_for(self.timeouts.header_read) => {
                self.metrics.shed(ShedReason::HeaderTimeout);
                conn.as_mut().graceful_shutdown();
                // A client that ignores GOAWAY is still cut at the connection's age.
                tokio::time::timeout(self.timeouts.max_age, conn).await.unwrap_or(Ok(()))
            }
        }
    }
}

/// Requests in flight on one HTTP/2 connection and when the last one ended.
#[derive(Debug)]
struct InFlight {
    state: std::sync::Mutex<(usize, tokio::time::Instant)>,
    changed: tokio::sync::Notify,
}

impl Default for InFlight {
    fn default() -> Self {
        Self {
            state: std::sync::Mutex::new((0, tokio::time::Instant::now())),
            changed: tokio::sync::Notify::new(),
        }
    }
}

/// One request in flight; dropping it ends the request.
struct Started(Arc<InFlight>);

impl Drop for Started {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.0 = state.0.saturating_sub(1);
        state.1 = tokio::time::Instant::now();
        drop(state);
        self.0.changed.notify_waiters();
    }
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, (usize, tokio::time::Instant)> {
        // Each critical section is two plain assignments: a poisoned lock is still whole.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn start(self: &Arc<Self>) -> Started {
        self.lock().0 += 1;
        self.changed.notify_waiters();
        Started(self.clone())
    }

    /// Returns once no request has been in flight for `bound`. Each turn of the loop
    /// waits for a change or for the deadline; the caller bounds the whole wait by the
    /// connection's maximum age.
    async fn idle_for(&self, bound: Duration) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let (open, since) = *self.lock();
            if open == 0 {
                let deadline = since + bound;
                if tokio::time::Instant::now() >= deadline {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => {}
                    () = changed => {}
                }
            } else {
                changed.await;
            }
        }
    }
}
