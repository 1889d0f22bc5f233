//! The driver: owns the runtime pieces (listener, clients, poller task) and wires the
//! pure crates between them.
//!
//! Order matters: the listener is bound first, then the poller starts (a gateway polls
//! only while serving); on shutdown the poller stops first, then the listener drains.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::catalog::Catalog;
use crate::config::Config;
use crate::gateway_tls::Identity;
use crate::http_api::Api;
use crate::request_metrics::RequestMetrics;
use crate::routing::{Published, RoutingView};
use crate::{Error, server, upstream};

/// A running gateway.
#[derive(Debug)]
pub struct Running {
    local_addr: SocketAddr,
    published: Published,
    stop: watch::Sender<bool>,
    server: JoinHandle<()>,
}

impl Running {
    /// The address the API listens on (useful when the config asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The routing slot requests read, for inspection.
    pub fn published(&self) -> &Published {
        &self.published
    }

    /// Stops polling, then drains open requests and returns once the listener is closed.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.server.await;
    }
}

/// Loads the TLS identity, binds the listener and starts serving.
pub async fn start(config: Config) -> Result<Running, Error> {
    let identity = Identity::load(&config.tls)?;
    let connect_timeout = Duration::from_millis(config.connect_timeout_ms);
    let sites = upstream::site_client(identity.client_config("sites")?, connect_timeout);

    let catalog = Arc::new(Catalog::from_config(&config));
    let published: Published = Arc::new(ArcSwap::from_pointee(RoutingView::unmeasured(
        Arc::clone(&catalog),
        config.unavailable_retry_after_s,
    )));

    let mut registry = Registry::default();
    let request_metrics = RequestMetrics::register(&mut registry);
    let registry = Arc::new(registry);

    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| Error::Bind {
            addr: config.listen,
            source,
        })?;
    let local_addr = listener.local_addr().map_err(|source| Error::Bind {
        addr: config.listen,
        source,
    })?;
    let api = Api::new(
        Arc::clone(&published),
        sites,
        config.body_limit_bytes,
        request_metrics,
        registry,
    );

    let (stop, mut stopped) = watch::channel(false);
    let server = tokio::spawn(server::serve(listener, api, async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    tracing::info!(%local_addr, site = %config.site, "gateway serving");
    Ok(Running {
        local_addr,
        published,
        stop,
        server,
    })
}
