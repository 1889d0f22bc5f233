//! grid's poller as a Pingora background service: it starts with the server and stops
//! (polling ended, the last feedback sent) on the server's shutdown.

use std::sync::Mutex;

use async_trait::async_trait;
use grid_gateway::Signals;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

/// Runs [`Signals`] on the background service's runtime.
pub struct SignalsService {
    signals: Mutex<Option<Signals>>,
}

impl std::fmt::Debug for SignalsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignalsService").finish_non_exhaustive()
    }
}

impl SignalsService {
    /// The service for `signals` (built with `Signals::new`; spawned when Pingora starts
    /// the service, once).
    pub fn new(signals: Signals) -> Self {
        Self {
            signals: Mutex::new(Some(signals)),
        }
    }
}

#[async_trait]
impl BackgroundService for SignalsService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let signals = self
            .signals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let Some(signals) = signals else {
            return; // started twice: the first start owns the poller
        };
        let poller = signals.spawn();
        // A closed channel is a shutdown too.
        let _ = shutdown.changed().await;
        poller.stop().await;
    }
}
