//! The mutual-TLS signals listener: accepts, admits into [`crate::slots`], handshakes,
//! identifies the caller from its certificate and hands each request to a [`Handler`].
//!
//! The listener decides who is calling; the handler decides what that caller may see.
//! Nothing a connection does (a failed handshake, a timeout, a shed) stops the accept
//! loop.

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
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rustls::ServerConfig;
use tokio::net::TcpListener;

use crate::slots::{HANDSHAKE_TIMEOUT, HEADER_READ_TIMEOUT, MAX_CONNECTION_AGE, ShedReason, Slots};
use grid_daemon::tls::{Identity, Trust, peer_identity};

/// A response future of a [`Handler`].
pub type HandlerFuture = Pin<Box<dyn Future<Output = Response<Full<Bytes>>> + Send>>;

/// Answers one request whose caller the listener identified (`None`: a trusted
/// certificate that is neither this site nor a configured peer).
pub trait Handler: Send + Sync + 'static {
    /// Builds the response.
    fn handle(&self, caller: Option<Identity>, request: Request<Incoming>) -> HandlerFuture;
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

/// The label set of `grid_operator_connections_shed_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ShedLabels {
    reason: ShedReason,
}

/// The listener's series.
#[derive(Clone, Debug)]
pub struct ListenerMetrics {
    shed: Family<ShedLabels, Counter>,
    handshake_failures: Counter,
    open: Gauge,
}

impl ListenerMetrics {
    /// Registers `grid_operator_connections_shed_total{reason}`,
    /// `grid_operator_tls_handshake_failures_total` and `grid_operator_connections_open`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            shed: Family::default(),
            handshake_failures: Counter::default(),
            open: Gauge::default(),
        };
        for r in ShedReason::ALL {
            let _ = m.shed.get_or_create(&ShedLabels { reason: r });
        }
        registry.register(
            "grid_operator_connections_shed",
            "Signals-listener connections shed, by reason",
            m.shed.clone(),
        );
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
        self.shed.get_or_create(&ShedLabels { reason }).inc();
    }

    /// Connections shed for `reason` so far.
    pub fn shed_count(&self, reason: ShedReason) -> u64 {
        self.shed.get_or_create(&ShedLabels { reason }).get()
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
        loop {
            let tcp = match self.tcp.accept().await {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of descriptors or a reset before accept: back off, keep serving.
                    tracing::warn!(error = %e, "signals listener accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
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
        let slot = match slot.settle(caller.as_ref()) {
            Ok(slot) => slot,
            Err(reason) => {
                self.metrics.shed(reason);
                return;
            }
        };
        self.metrics.open.inc();
        let handler = self.handler.clone();
        let service = service_fn(move |request| {
            let response = handler.handle(caller.clone(), request);
            async move { Ok::<_, Infallible>(response.await) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.timeouts.header_read)
            .serve_connection(TokioIo::new(tls), service);
        tokio::pin!(conn);
        let result = tokio::select! {
            result = conn.as_mut() => result,
            () = tokio::time::sleep(self.timeouts.max_age) => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        if let Err(e) = result {
            if e.is_timeout() {
                self.metrics.shed(ShedReason::HeaderTimeout);
            }
        }
        self.metrics.open.dec();
        drop(slot);
    }
}
