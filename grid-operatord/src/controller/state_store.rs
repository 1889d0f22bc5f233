//! [`StateStore`] on the API server: the publisher-epoch high-water mark and the batch
//! fences in the site's `ConfigMap`, the gateway-feedback evidence with its
//! `GatewayAgesRejected` condition in the `GridNetwork` status, written together.
//!
//! The mark is a compare-and-swap: it is written with the resourceVersion it was read at,
//! so of two operators racing from the same mark, one wins and the other's start fails
//! with a conflict (and Kubernetes restarts it above the winner's mark). The trait is
//! synchronous (the driver calls it on a blocking thread), so each call runs its API
//! requests on the runtime it was built on, each bounded by
//! [`super::api::API_CALL_TIMEOUT`].

use std::collections::BTreeMap;
use std::future::Future;

use grid_feedback::{ConditionStatus, ReceiverState};
use grid_signals::batch::FenceSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::api::{Answer, ControllerMetrics, Operation, bounded};
use super::conditions::{self, Stated};
use super::resources::{GridNetwork, GridNetworkStatus};
use crate::Error;
use crate::clock::Clock;
use crate::state::StateStore;

/// The site's state `ConfigMap` is this prefix followed by the site name.
pub const CONFIGMAP_PREFIX: &str = "grid-site-";
/// Key of the publisher-epoch high-water mark (decimal text: it spans u64).
pub const EPOCH_KEY: &str = "publisherEpochHighWaterMark";
/// Key of the batch fences (JSON).
pub const FENCES_KEY: &str = "fences";
/// Attempts of a fence write that keeps losing resourceVersion races to other writers
/// of the `ConfigMap` (each attempt re-reads first).
pub const FENCE_WRITE_ATTEMPTS: u8 = 3;

/// The operator's state in its namespace.
pub struct KubeStateStore {
    runtime: tokio::runtime::Handle,
    configmaps: Api<ConfigMap>,
    networks: Api<GridNetwork>,
    configmap: String,
    network: String,
    /// The `ConfigMap`'s resourceVersion as this process last read or wrote it: the
    /// precondition of the mark's write.
    seen: Mutex<Option<String>>,
    /// The high-water mark this process wrote at its start: its fencing token. A
    /// `ConfigMap` holding a higher one belongs to a newer process of the site.
    mark: Mutex<Option<u64>>,
    metrics: ControllerMetrics,
    clock: Clock,
}

impl std::fmt::Debug for KubeStateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStateStore")
            .field("configmap", &self.configmap)
            .field("network", &self.network)
            .finish_non_exhaustive()
    }
}

fn failed(operation: &'static str, message: String) -> Error {
    Error::Kube { operation, message }
}

impl KubeStateStore {
    /// The state of `site` in `namespace`, serving `network`. Must be built inside a
    /// tokio runtime; its calls run there.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        site: &str,
        network: &str,
        metrics: ControllerMetrics,
    ) -> Self {
        Self {
            runtime: tokio::runtime::Handle::current(),
            configmaps: Api::namespaced(client.clone(), namespace),
            networks: Api::namespaced(client, namespace),
            configmap: format!("{CONFIGMAP_PREFIX}{site}"),
            network: network.to_owned(),
            seen: Mutex::new(None),
            mark: Mutex::new(None),
            metrics,
            clock: Clock::system(),
        }
    }

    /// This store with its condition times read from `clock`, the operator's (the system
    /// clock unless set).
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The name of the site's state `ConfigMap`.
    pub fn configmap_name(&self) -> &str {
        &self.configmap
    }

    fn seen(&self) -> MutexGuard<'_, Option<String>> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn run<T>(&self, f: impl Future<Output = T>) -> T {
        self.runtime.block_on(f)
    }

    fn read_configmap(&self) -> Result<Option<ConfigMap>, Error> {
        match self.run(bounded(self.configmaps.get(&self.configmap))) {
            Answer::Ok(cm) => {
                self.seen().clone_from(&cm.metadata.resource_version);
                Ok(Some(cm))
            }
            Answer::NotFound => {
                *self.seen() = None;
                Ok(None)
            }
            Answer::Conflict => Err(failed("reading the state ConfigMap", "409".into())),
            Answer::Failed(m) => {
                self.metrics.failed(Operation::StateRead);
                Err(failed("reading the state ConfigMap", m))
            }
        }
    }

    fn data(cm: Option<&ConfigMap>, key: &str) -> Option<String> {
        cm.and_then(|c| c.data.as_ref())
            .and_then(|d| d.get(key))
            .cloned()
    }

    /// Writes `key` = `value` into the `ConfigMap`, on top of `base` (the object as read),
    /// with `base`'s resourceVersion as the precondition; creates it when `base` is None.
    fn write_configmap(
        &self,
        base: Option<ConfigMap>,
        key: &str,
        value: &str,
    ) -> Result<(), Error> {
        let operation = "writing the state ConfigMap";
        let create = base.is_none();
        let mut cm = base.unwrap_or_else(|| ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.configmap.clone()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        });
        cm.data
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        let pp = PostParams::default();
        let answer = if create {
            self.run(bounded(self.configmaps.create(&pp, &cm)))
        } else {
            self.run(bounded(self.configmaps.replace(&self.configmap, &pp, &cm)))
        };
        match answer {
            Answer::Ok(written) => {
                if Self::data(Some(&written), key).as_deref() != Some(value) {
                    self.metrics.failed(Operation::StateWrite);
                    return Err(failed(
                        operation,
                        "the answer does not read back as written".into(),
                    ));
                }
                self.seen().clone_from(&written.metadata.resource_version);
                Ok(())
            }
            Answer::Conflict => Err(Error::KubeConflict { operation }),
            Answer::NotFound => {
                self.metrics.failed(Operation::StateWrite);
                Err(failed(
                    operation,
                    "the ConfigMap was deleted since it was read".into(),
                ))
            }
            Answer::Failed(m) => {
                self.metrics.failed(Operation::StateWrite);
                Err(failed(operation, m))
            }
        }
    }

    fn read_network(&self) -> Result<GridNetwork, Error> {
        match self.run(bounded(self.networks.get(&self.network))) {
            Answer::Ok(n) => Ok(n),
            Answer::NotFound => Err(failed(
                "reading the GridNetwork",
                format!("GridNetwork/{} not found", self.network),
            )),
            Answer::Conflict => Err(failed("reading the GridNetwork", "409".into())),
            Answer::Failed(m) => {
                self.metrics.failed(Operation::StateRead);
                Err(failed("reading the GridNetwork", m))
            }
        }
    }
}

/// The `GridNetwork` condition type saying whether every member met runs this site's
/// signal transport mode.
pub const MODE_AGREED: &str = "SignalTransportAgreed";

/// The `SignalTransportAgreed` condition for `mismatched` members (sorted site names).
fn mode_agreed(own: &str, mismatched: &[String]) -> Stated {
    if mismatched.is_empty() {
        Stated {
            kind: MODE_AGREED,
            status: "True",
            reason: "ModesAgree",
            message: format!("every member met runs signalTransport.mode {own}"),
            transition: None,
        }
    } else {
        Stated {
            kind: MODE_AGREED,
            status: "False",
            reason: "ModeMismatch",
            message: format!(
                "refused at join for running another signalTransport.mode than this site's ({own}): {}",
                mismatched.join(", ")
            ),
            transition: None,
        }
    }
}

/// The `GatewayAgesRejected` condition the receiver's state states.
fn ages_rejected(state: &ReceiverState) -> Stated {
    let c = &state.condition;
    Stated {
        kind: grid_feedback::CONDITION_TYPE,
        status: match c.status {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
        },
        reason: c.reason.as_str(),
        message: c.message.clone(),
        transition: Some(conditions::time_of_ms(c.last_transition_ms)),
    }
}

impl StateStore for KubeStateStore {
    fn load_epoch_hwm(&self) -> Result<Option<u64>, Error> {
        let cm = self.read_configmap()?;
        Self::data(cm.as_ref(), EPOCH_KEY)
            .map(|text| {
                text.parse().map_err(|e| Error::StateCorrupt {
                    path: format!("ConfigMap/{}#{EPOCH_KEY}", self.configmap).into(),
                    reason: format!("{e}"),
                })
            })
            .transpose()
    }

    /// Compare-and-swap against the version [`StateStore::load_epoch_hwm`] read: if
    /// another writer moved the `ConfigMap` since, this write loses with a conflict.
    fn store_epoch_hwm(&self, hwm: u64) -> Result<(), Error> {
        let seen = self.seen().clone();
        let mut current = self.read_configmap()?;
        if current
            .as_ref()
            .and_then(|c| c.metadata.resource_version.clone())
            != seen
        {
            return Err(Error::KubeConflict {
                operation: "writing the publisher-epoch high-water mark (it moved since it was read)",
            });
        }
        if let Some(cm) = current.as_mut() {
            cm.metadata.resource_version.clone_from(&seen);
        }
        self.write_configmap(current, EPOCH_KEY, &hwm.to_string())?;
        *self.mark.lock().unwrap_or_else(PoisonError::into_inner) = Some(hwm);
        Ok(())
    }

    fn load_feedback(&self) -> Result<Option<ReceiverState>, Error> {
        let network = self.read_network()?;
        network
            .status
            .and_then(|s| s.gateway_feedback)
            .map(|v| {
                serde_json::from_value(v).map_err(|e| Error::StateCorrupt {
                    path: format!("GridNetwork/{}.status.gatewayFeedback", self.network).into(),
                    reason: e.to_string(),
                })
            })
            .transpose()
    }

    /// One attempt: a fresh read, then the status written with that read's
    /// resourceVersion. A 409 is [`Error::KubeConflict`], for the receiver to count and
    /// retry; an answer that does not read back as sent is a failure.
    fn store_feedback(&self, state: &ReceiverState) -> Result<(), Error> {
        let operation = "writing the GridNetwork status (GatewayAgesRejected)";
        let mut network = self.read_network()?;
        let evidence = serde_json::to_value(state).map_err(|e| failed(operation, e.to_string()))?;
        let mut status = network.status.clone().unwrap_or_default();
        let generation = network.metadata.generation;
        let now = self.clock.wall_ms();
        if let Some(conditions) = conditions::apply(
            &status.conditions,
            &ages_rejected(state),
            generation,
            conditions::time_of_ms(now),
        ) {
            status.conditions = conditions;
        }
        status.observed_generation = generation;
        status.gateway_feedback = Some(evidence.clone());
        network.status = Some(status);
        let answer = self.run(bounded(self.networks.replace_status(
            &self.network,
            &PostParams::default(),
            &network,
        )));
        match answer {
            Answer::Ok(written) => {
                let back = written
                    .status
                    .and_then(|s: GridNetworkStatus| s.gateway_feedback);
                if back.as_ref() == Some(&evidence) {
                    Ok(())
                } else {
                    Err(failed(
                        operation,
                        "the answer does not read back as written".into(),
                    ))
                }
            }
            Answer::Conflict => Err(Error::KubeConflict { operation }),
            Answer::NotFound => Err(failed(operation, "the GridNetwork is gone".into())),
            Answer::Failed(m) => Err(failed(operation, m)),
        }
    }

    /// One attempt: a fresh read, the condition applied (nothing written when it already
    /// says so), the status written with that read's resourceVersion; a 409 is
    /// [`Error::KubeConflict`], and the caller tries again at its next check.
    fn store_mode_agreement(&self, own: &str, mismatched: &[String]) -> Result<(), Error> {
        let operation = "writing the GridNetwork status (SignalTransportAgreed)";
        let mut network = self.read_network()?;
        let mut status = network.status.clone().unwrap_or_default();
        // Absent means agreed: a healthy grid never writes it (nor races the feedback
        // writes for the status); a stale False from an earlier process is cleared.
        if mismatched.is_empty() && !status.conditions.iter().any(|c| c.type_ == MODE_AGREED) {
            return Ok(());
        }
        let Some(conditions) = conditions::apply(
            &status.conditions,
            &mode_agreed(own, mismatched),
            network.metadata.generation,
            conditions::time_of_ms(crate::clock::wall_ms()),
        ) else {
            return Ok(());
        };
        status.conditions = conditions;
        network.status = Some(status);
        match self.run(bounded(self.networks.replace_status(
            &self.network,
            &PostParams::default(),
            &network,
        ))) {
            Answer::Ok(_) => Ok(()),
            Answer::Conflict => Err(Error::KubeConflict { operation }),
            Answer::NotFound => Err(failed(operation, "the GridNetwork is gone".into())),
            Answer::Failed(m) => Err(failed(operation, m)),
        }
    }

    fn load_fences(&self) -> Result<Option<FenceSet>, Error> {
        let cm = self.read_configmap()?;
        Self::data(cm.as_ref(), FENCES_KEY)
            .map(|text| {
                serde_json::from_str(&text).map_err(|e| Error::StateCorrupt {
                    path: format!("ConfigMap/{}#{FENCES_KEY}", self.configmap).into(),
                    reason: e.to_string(),
                })
            })
            .transpose()
    }

    fn store_fences(&self, fences: &FenceSet) -> Result<(), Error> {
        let text = serde_json::to_string(fences)
            .map_err(|e| failed("writing the batch fences", e.to_string()))?;
        let mark = *self.mark.lock().unwrap_or_else(PoisonError::into_inner);
        let mut last = None;
        for _ in 0..FENCE_WRITE_ATTEMPTS {
            let current = self.read_configmap()?;
            // Compare-and-swap, with or without an elected writer: the fences are
            // written only while the ConfigMap's mark is still this process's (a newer
            // process of the site, a replica without --identity or the successor of a
            // rolling update, raised it and owns them), and only at the resourceVersion
            // just read.
            let held = Self::data(current.as_ref(), EPOCH_KEY).and_then(|m| m.parse::<u64>().ok());
            if let (Some(held), Some(mine)) = (held, mark)
                && held > mine
            {
                self.metrics.failed(Operation::StateWrite);
                return Err(failed(
                    "writing the batch fences",
                    format!(
                        "a newer process of the site owns them: the ConfigMap's mark {held} is above this process's {mine}"
                    ),
                ));
            }
            match self.write_configmap(current, FENCES_KEY, &text) {
                Err(e @ Error::KubeConflict { .. }) => last = Some(e),
                other => return other,
            }
        }
        self.metrics.failed(Operation::StateWrite);
        Err(last.unwrap_or(Error::KubeConflict {
            operation: "writing the batch fences",
        }))
    }
}
