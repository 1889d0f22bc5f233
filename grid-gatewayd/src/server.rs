//! The accept loop: HTTP/1.1 and HTTP/2 (prior knowledge or upgrade-free h2c) on one
//! listener, with graceful draining.

use std::future::Future;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::http_api::Api;

/// How long draining waits for open requests (streams included) before closing anyway.
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `api` on `listener` until `shutdown` resolves, then stops accepting and lets
/// open connections finish for up to [`DRAIN_TIMEOUT`].
pub(crate) async fn serve(listener: TcpListener, api: Api, shutdown: impl Future<Output = ()>) {
    let graceful = GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors or a reset before accept: keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let api = api.clone();
                let service = service_fn(move |req| {
                    let api = api.clone();
                    async move { Ok::<_, std::convert::Infallible>(api.handle(req).await) }
                });
                let conn = builder.serve_connection(TokioIo::new(stream), service).into_owned();
                let watched = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = watched.await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain timed out; closing remaining connections");
    }
}
