//! What the client side counts about its connections: refused at accept, closed by the
//! gateway, HTTP/2 streams reset, and how many are open; each reason a closed label set.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use grid_signals::labels::register_zeroed;

grid_signals::label_values! {
    label "reason";
    /// Why a client connection was not served (`grid_gateway_connections_refused_total`).
    pub enum Refusal {
        /// `maxConnections` were open: closed at accept.
        Limit,
        /// `accept` failed (out of descriptors, reset before accept).
        AcceptError,
    }
}

grid_signals::label_values! {
    label "reason";
    /// Why the gateway closed a client connection (`grid_gateway_connections_closed_total`).
    pub enum Closed {
        /// No first request head within `clientHeaderTimeoutSeconds`.
        HeaderTimeout,
        /// No request in flight for `clientIdleTimeoutSeconds`.
        IdleTimeout,
        /// An HTTP/1.1 client took nothing of its answer for `clientWriteTimeoutSeconds`.
        WriteTimeout,
        /// An HTTP/2 client left a ping unanswered for [`HTTP2_KEEP_ALIVE_TIMEOUT`].
        PingTimeout,
    }
}

grid_signals::label_values! {
    label "reason";
    /// Why the gateway reset a client's HTTP/2 stream (`grid_gateway_streams_reset_total`).
    pub enum StreamReset {
        /// The client took nothing of the stream's answer for `clientWriteTimeoutSeconds`.
        WriteTimeout,
    }
}

/// The listener's metric handles.
#[derive(Clone, Debug, Default)]
pub(crate) struct ListenerMetrics {
    refused: Family<Refusal, Counter>,
    closed: Family<Closed, Counter>,
    reset: Family<StreamReset, Counter>,
    pub(super) open: Gauge,
}

impl ListenerMetrics {
    /// Registers `grid_gateway_connections_refused_total{reason}`,
    /// `grid_gateway_connections_closed_total{reason}` and `grid_gateway_connections_open`,
    /// every reason at 0.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let m = Self {
            refused: register_zeroed(
                registry,
                "grid_gateway_connections_refused",
                "Client connections not served, by reason (limit, accept_error)",
            ),
            closed: register_zeroed(
                registry,
                "grid_gateway_connections_closed",
                "Client connections the gateway closed, by reason (header_timeout, idle_timeout, write_timeout, ping_timeout)",
            ),
            reset: register_zeroed(
                registry,
                "grid_gateway_streams_reset",
                "Client HTTP/2 streams the gateway reset, by reason (write_timeout)",
            ),
            open: Gauge::default(),
        };
        registry.register(
            "grid_gateway_connections_open",
            "Client connections open now",
            m.open.clone(),
        );
        m
    }

    pub(super) fn refused(&self, reason: Refusal) {
        self.refused.get_or_create(&reason).inc();
    }

    pub(super) fn closed(&self, reason: Closed) {
        self.closed.get_or_create(&reason).inc();
    }

    /// The counter of streams reset for `reason`, found once per connection.
    pub(super) fn reset(&self, reason: StreamReset) -> Counter {
        self.reset.get_or_create(&reason).clone()
    }
}
