//! The one place the controller talks to the API server: the client (kube's own retry
//! layer off, every call bounded by [`API_CALL_TIMEOUT`]), the classification of what an
//! answer means to the operator, and the failure counter.

use std::future::Future;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::Error;

/// The longest one API call may take (connect, request, answer). It is well inside the
/// ingest's five-second budget, so a slow server fails a write (counted, and the
/// gateway retries) instead of holding the exchange past its budget.
pub const API_CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a start waits for the first complete list of every watched resource.
pub const INITIAL_SYNC_TIMEOUT: Duration = Duration::from_secs(10);

grid_signals::label_values! {
    label "operation";
    /// Which API operation failed: the closed set of
    /// `grid_operator_kube_failures_total{operation}`.
    pub enum Operation {
        /// A watch or list of the resources (the watcher backs off and retries).
        Watch,
        /// The resources changed into a configuration that does not validate; the
        /// operator keeps serving its last good configuration.
        InvalidConfig,
        /// Reading the site's `ConfigMap` or the `GridNetwork` status.
        StateRead,
        /// Writing the site's `ConfigMap` (high-water mark, fences).
        StateWrite,
        /// Writing an `InferenceProvider`'s Ready condition.
        ReadyWrite,
    }
}

/// The controller's series.
#[derive(Clone, Debug, Default)]
pub struct ControllerMetrics {
    failures: Family<Operation, Counter>,
}

impl ControllerMetrics {
    /// The series, every operation at 0.
    pub fn new() -> Self {
        Self {
            failures: grid_signals::labels::zeroed(),
        }
    }

    /// Registers `grid_operator_kube_failures_total{operation}` in `registry` (each
    /// driver start's own; the counts carry over, being shared).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "grid_operator_kube_failures",
            "Kubernetes API operations that failed, by operation; gateway-feedback writes are counted in grid_gateway_feedback_events_total instead",
            self.failures.clone(),
        );
    }

    /// Counts one failure.
    pub fn failed(&self, operation: Operation) {
        self.failures.get_or_create(&operation).inc();
    }

    /// Failures of `operation` so far.
    pub fn failures(&self, operation: Operation) -> u64 {
        self.failures.get_or_create(&operation).get()
    }
}

/// A client for the API server at `url` (plain or TLS, as the URL says), or the one the
/// pod's environment names (in-cluster service account, else `KUBECONFIG`) when `None`.
pub async fn client(url: Option<&str>, namespace: &str) -> Result<kube::Client, Error> {
    let config = match url {
        Some(url) => kube::Config::new(url.parse().map_err(|e| Error::ConfigField {
            field: "--api-server".into(),
            reason: format!("`{url}` is not a URL ({e})"),
        })?),
        None => kube::Config::infer().await.map_err(|e| Error::Kube {
            operation: "finding the API server",
            message: e.to_string(),
        })?,
    };
    client_from(config, namespace)
}

/// A client from `config` (a kubeconfig's, say), with the operator's bounds put on it:
/// kube's retry layer off, every connect and write bounded by [`API_CALL_TIMEOUT`].
pub fn client_from(mut config: kube::Config, namespace: &str) -> Result<kube::Client, Error> {
    namespace.clone_into(&mut config.default_namespace);
    // kube retries 429/503/504 up to 15 times with a backoff growing to 1000 s: an
    // unbounded wait inside a five-second exchange. Every call is bounded here instead.
    config.default_retry = false;
    config.connect_timeout = Some(API_CALL_TIMEOUT);
    config.read_timeout = None; // watches stream; each plain call is bounded by `bounded`
    config.write_timeout = Some(API_CALL_TIMEOUT);
    kube::Client::try_from(config).map_err(|e| Error::Kube {
        operation: "building the API client",
        message: e.to_string(),
    })
}

/// What one bounded call said.
#[derive(Debug)]
pub(crate) enum Answer<T> {
    /// 2xx.
    Ok(T),
    /// 404.
    NotFound,
    /// 409 (a resourceVersion precondition failed, or the name exists).
    Conflict,
    /// Anything else: another status, a transport error, [`API_CALL_TIMEOUT`].
    Failed(String),
}

/// Runs one API call within [`API_CALL_TIMEOUT`].
pub(crate) async fn bounded<T>(call: impl Future<Output = Result<T, kube::Error>>) -> Answer<T> {
    match tokio::time::timeout(API_CALL_TIMEOUT, call).await {
        Ok(Ok(v)) => Answer::Ok(v),
        Ok(Err(kube::Error::Api(status))) if status.code == 404 => Answer::NotFound,
        Ok(Err(kube::Error::Api(status))) if status.code == 409 => Answer::Conflict,
        Ok(Err(e)) => Answer::Failed(e.to_string()),
        Err(_) => Answer::Failed(format!(
            "no answer within {} ms",
            API_CALL_TIMEOUT.as_millis()
        )),
    }
}
