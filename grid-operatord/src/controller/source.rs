//! [`ConfigSource`] on the API server: kube-runtime reflectors (watch, re-list on 410,
//! backoff) keep the namespace's `GridNetwork`s, `GridSite`s and `InferenceProvider`s in
//! memory, and every load translates what they hold. An API server that goes away
//! leaves the stores as last seen, so the operator keeps serving its last good
//! configuration while the failures are counted.

use std::sync::Arc;

use futures::StreamExt as _;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::watch;

use super::api::{ControllerMetrics, INITIAL_SYNC_TIMEOUT, Operation};
use super::resources::{GridNetwork, GridSite, InferenceProvider};
use super::translate::{self, Deployment, Resources};
use crate::Error;
use crate::config::{Config, ConfigSource};

/// The namespace's resources, followed.
pub struct KubeConfigSource {
    deployment: Deployment,
    networks: Store<GridNetwork>,
    sites: Store<GridSite>,
    providers: Store<InferenceProvider>,
    changes: watch::Receiver<u64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for KubeConfigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeConfigSource")
            .field("site", &self.deployment.site)
            .finish_non_exhaustive()
    }
}

impl Drop for KubeConfigSource {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Follows one resource type into `store`, bumping `changes` on every event.
fn follow<K>(
    api: Api<K>,
    changes: watch::Sender<u64>,
    metrics: ControllerMetrics,
) -> (Store<K>, tokio::task::JoinHandle<()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream =
        reflector::reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => changes.send_modify(|n| *n = n.wrapping_add(1)),
                Err(e) => {
                    metrics.failed(Operation::Watch);
                    tracing::warn!(error = %e, "watching the grid resources failed; serving the last good configuration and retrying");
                }
            }
        }
    });
    (reader, task)
}

impl KubeConfigSource {
    /// Starts following `namespace` and waits (at most [`INITIAL_SYNC_TIMEOUT`]) until
    /// every resource type has been listed once.
    pub async fn start(
        client: kube::Client,
        namespace: &str,
        deployment: Deployment,
        metrics: ControllerMetrics,
    ) -> Result<Self, Error> {
        Self::start_within(client, namespace, deployment, metrics, INITIAL_SYNC_TIMEOUT).await
    }

    /// [`KubeConfigSource::start`] waiting at most `limit` for the first lists.
    pub async fn start_within(
        client: kube::Client,
        namespace: &str,
        deployment: Deployment,
        metrics: ControllerMetrics,
        limit: std::time::Duration,
    ) -> Result<Self, Error> {
        let (tx, changes) = watch::channel(0u64);
        let (networks, a) = follow(
            Api::namespaced(client.clone(), namespace),
            tx.clone(),
            metrics.clone(),
        );
        let (sites, b) = follow(
            Api::namespaced(client.clone(), namespace),
            tx.clone(),
            metrics.clone(),
        );
        let (providers, c) = follow(Api::namespaced(client, namespace), tx, metrics);
        let source = Self {
            deployment,
            networks,
            sites,
            providers,
            changes,
            tasks: vec![a, b, c],
        };
        let ready = async {
            let _ = source.networks.wait_until_ready().await;
            let _ = source.sites.wait_until_ready().await;
            let _ = source.providers.wait_until_ready().await;
        };
        tokio::time::timeout(limit, ready)
            .await
            .map_err(|_| Error::Kube {
                operation: "listing the grid resources",
                message: format!(
                    "not every resource type was listed within {} ms (are the CRDs installed and the RBAC granted?)",
                    limit.as_millis()
                ),
            })?;
        Ok(source)
    }

    /// What the stores hold now.
    pub fn resources(&self) -> Resources {
        fn owned<K: Clone>(items: Vec<Arc<K>>) -> Vec<K> {
            items.into_iter().map(|k| (*k).clone()).collect()
        }
        Resources {
            networks: owned(self.networks.state()),
            sites: owned(self.sites.state()),
            providers: owned(self.providers.state()),
        }
    }

    /// Ticks on every watch event (of any of the three types).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// The deployment the translations are for.
    pub fn deployment(&self) -> &Deployment {
        &self.deployment
    }
}

impl ConfigSource for KubeConfigSource {
    fn load(&self) -> Result<Config, Error> {
        translate::translate(&self.deployment, &self.resources())
    }

    fn declared_mode(&self) -> Result<String, Error> {
        let networks = self.networks.state();
        let owned: Vec<GridNetwork> = networks.iter().map(|n| (**n).clone()).collect();
        translate::the_network(&owned).map(|n| translate::declared_mode(n).to_owned())
    }
}
