//! Writes each `InferenceProvider`'s Ready condition from the scrape loop's verdicts:
//! through the status subresource, with the resourceVersion of a fresh read, only when
//! the condition would change, and never onto a same-name recreation (another UID).

use std::collections::HashMap;
use std::time::Duration;

use grid_signals::epp::{Readiness, ScrapeFailure};
use kube::api::{Api, PostParams};
use tokio::sync::watch;

use super::api::{Answer, ControllerMetrics, Operation, bounded};
use super::conditions::{self, READY, Stated};
use super::resources::InferenceProvider;
use crate::clock::Clock;
use crate::config::ProviderConfig;
use crate::providers::{Verdict, Verdicts};

/// Attempts of one condition write that keeps losing resourceVersion races (each
/// re-reads first), as the feedback writer's bound.
pub const READY_WRITE_ATTEMPTS: u8 = grid_feedback::MAX_WRITE_ATTEMPTS;
/// How often a condition whose write failed is tried again.
pub const READY_RETRY_INTERVAL: Duration = Duration::from_secs(5);

/// The condition a verdict states.
pub fn stated(provider: &str, verdict: Readiness) -> Stated {
    let reason = verdict.reason.as_str();
    let message = match verdict.reason.failure() {
        Some(class) => format!(
            "provider {provider}: {reason}: the scrape failed ({})",
            ScrapeFailure::as_str(class)
        ),
        None => format!("provider {provider}: {reason}"),
    };
    Stated {
        kind: READY,
        status: verdict.status.as_str(),
        reason,
        message,
        transition: None,
    }
}

/// What happened to one provider's condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// Written.
    Wrote,
    /// Already said so: no write made.
    Unchanged,
    /// The object is gone or is a recreation (another UID): nothing written.
    NotOurs,
    /// Every attempt lost a race, or the server failed: counted, tried again later.
    Failed,
}

/// Brings one provider's Ready condition to `verdict`; a transition is stamped on
/// `clock`, the operator's.
pub async fn write_one(
    api: &Api<InferenceProvider>,
    provider: &ProviderConfig,
    verdict: Readiness,
    metrics: &ControllerMetrics,
    clock: &Clock,
) -> Written {
    let stated = stated(&provider.name, verdict);
    let generation = i64::try_from(provider.generation).ok();
    for _ in 0..READY_WRITE_ATTEMPTS {
        let mut object = match bounded(api.get(&provider.name)).await {
            Answer::Ok(o) => o,
            Answer::NotFound => return Written::NotOurs,
            Answer::Conflict | Answer::Failed(_) => {
                metrics.failed(Operation::ReadyWrite);
                return Written::Failed;
            }
        };
        if object.metadata.uid.as_deref() != Some(provider.uid.as_str()) {
            return Written::NotOurs;
        }
        let mut status = object.status.clone().unwrap_or_default();
        let Some(next) = conditions::apply(
            &status.conditions,
            &stated,
            generation,
            conditions::time_of_ms(clock.wall_ms()),
        ) else {
            return Written::Unchanged;
        };
        status.conditions = next;
        status.observed_generation = generation;
        object.status = Some(status);
        match bounded(api.replace_status(&provider.name, &PostParams::default(), &object)).await {
            Answer::Ok(_) => return Written::Wrote,
            Answer::Conflict => {}
            Answer::NotFound => return Written::NotOurs,
            Answer::Failed(e) => {
                tracing::warn!(provider = %provider.name, error = %e, "writing the Ready condition failed");
                metrics.failed(Operation::ReadyWrite);
                return Written::Failed;
            }
        }
    }
    metrics.failed(Operation::ReadyWrite);
    Written::Failed
}

/// Follows `verdicts` forever, writing each provider's condition when its verdict
/// changed, and retrying failed writes every [`READY_RETRY_INTERVAL`]. What was written
/// is remembered per (name, UID, generation), so a provider whose spec changed under the
/// running operator gets its condition written for the new generation.
pub async fn run(
    api: Api<InferenceProvider>,
    mut verdicts: watch::Receiver<Verdicts>,
    metrics: ControllerMetrics,
    clock: Clock,
) {
    let mut written: HashMap<(String, String, u64), Readiness> = HashMap::new();
    let mut retry = tokio::time::interval(READY_RETRY_INTERVAL);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            changed = verdicts.changed() => if changed.is_err() { return },
            _ = retry.tick() => {}
        }
        let now: Verdicts = verdicts.borrow_and_update().clone();
        // Bounded by the provider list: what no longer is listed is forgotten.
        written.retain(|key, _| now.iter().any(|v| key_of(&v.provider) == *key));
        for Verdict {
            provider,
            readiness,
        } in &now
        {
            let Some(verdict) = *readiness else {
                continue;
            };
            let key = key_of(provider);
            let same = written
                .get(&key)
                .is_some_and(|w| w.status == verdict.status && w.reason == verdict.reason);
            if same {
                continue;
            }
            match write_one(&api, provider, verdict, &metrics, &clock).await {
                Written::Wrote | Written::Unchanged | Written::NotOurs => {
                    written.insert(key, verdict);
                }
                Written::Failed => {}
            }
        }
    }
}

fn key_of(provider: &ProviderConfig) -> (String, String, u64) {
    (
        provider.name.clone(),
        provider.uid.clone(),
        provider.generation,
    )
}
