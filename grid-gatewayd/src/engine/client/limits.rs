//! Every bound on a client connection: the configured ones (`Limits`, from
//! `maxConnections` and the `client*TimeoutSeconds` settings) and the fixed ones, each a
//! named constant. `listener.rs` says how they combine.

use std::time::Duration;

/// One client connection's share of each site's slots (see the site side's slots).
pub use crate::engine::site::slots::{SITE_SHARE_DIVISOR, site_share};

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
