//! grid-pingora's whole proxy (`grid_pingora::proxy::server`) run in this process on a
//! thread of its own, until the test stops it: the binary runs the same server until a
//! signal.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use async_trait::async_trait;
use grid_gateway::Config;
use pingora_core::server::{RunArgs, ShutdownSignal, ShutdownSignalWatch};
use tokio::sync::Notify;

/// A running grid-pingora proxy; stopped (fast, its connections dropped) when dropped.
#[derive(Debug)]
pub struct PingoraProxy {
    listen: SocketAddr,
    stop: Arc<Notify>,
    thread: Option<JoinHandle<()>>,
}

/// The test's own shutdown signal, in place of the binary's SIGTERM.
struct StopWhenNotified(Arc<Notify>);

#[async_trait]
impl ShutdownSignalWatch for StopWhenNotified {
    async fn recv(&self) -> ShutdownSignal {
        self.0.notified().await;
        ShutdownSignal::FastShutdown
    }
}

impl PingoraProxy {
    /// Builds the proxy for `config` and runs it; it listens on `config.listen` once its
    /// services have started (shortly after this returns).
    ///
    /// # Errors
    ///
    /// What `grid_pingora::proxy::server` refuses.
    ///
    /// # Panics
    ///
    /// When the operating system will not start a thread.
    pub fn start(config: &Config) -> Result<Self, grid_pingora::Error> {
        let server = grid_pingora::proxy::server(config)?;
        let stop = Arc::new(Notify::new());
        let signal = StopWhenNotified(Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("grid-pingora".into())
            .spawn(move || {
                server.run(RunArgs {
                    shutdown_signal: Box::new(signal),
                });
            })
            .expect("spawning the proxy's thread");
        Ok(Self {
            listen: config.listen,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens (`config.listen`).
    #[must_use]
    pub fn listen(&self) -> SocketAddr {
        self.listen
    }
}

impl Drop for PingoraProxy {
    fn drop(&mut self) {
        // A permit is stored if the server is not waiting yet, so the stop is never lost.
        self.stop.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
