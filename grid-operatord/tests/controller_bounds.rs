//! The controller's bounds, each at its boundary, against the fake API server: the
//! attempts of a Ready or fence write that keeps losing races, and the time one API call
//! may take.

use std::sync::Arc;
use std::time::Duration;

use grid_kit::fake_kube::{Action, FakeKube, Fault, Target};
use grid_operatord::Error;
use grid_operatord::config::ProviderConfig;
use grid_operatord::controller::api::{self, API_CALL_TIMEOUT, ControllerMetrics, Operation};
use grid_operatord::controller::ready::{READY_WRITE_ATTEMPTS, Written, write_one};
use grid_operatord::controller::resources::InferenceProvider;
use grid_operatord::controller::state_store::{FENCE_WRITE_ATTEMPTS, KubeStateStore};
use grid_operatord::state::StateStore;
use grid_signals::batch::FenceSet;
use grid_signals::epp::{Readiness, ReadyReason, ReadyStatus};
use kube::api::Api;
use serde_json::json;

const NS: &str = "grid";

fn conflicts(fake: &FakeKube, path: &str, times: u32) {
    fake.inject(Fault {
        target: Target::Writes(path.into()),
        times,
        action: Action::Conflict,
    });
}

async fn provider(fake: &FakeKube) -> (Api<InferenceProvider>, ProviderConfig) {
    let made = fake.create(
        "inferenceproviders",
        NS,
        json!({"metadata": {"name": "llama"}, "spec": {"metricsConfig": {"endpoint": "http://e"}}}),
    );
    let mut config = ProviderConfig::new("a", "llama", "http://e/metrics".parse().unwrap());
    config.uid = made["metadata"]["uid"].as_str().unwrap().to_owned();
    let client = api::client(Some(&fake.url()), NS).await.unwrap();
    (Api::namespaced(client, NS), config)
}

/// A fake API server and the state store of site `a` of network `prod` on it.
async fn site_store() -> (FakeKube, Arc<KubeStateStore>) {
    let fake = FakeKube::start().await;
    let client = api::client(Some(&fake.url()), NS).await.unwrap();
    let store = KubeStateStore::new(client, NS, "a", "prod", ControllerMetrics::new());
    (fake, Arc::new(store))
}

fn verdict(status: ReadyStatus, reason: ReadyReason) -> Readiness {
    Readiness {
        status,
        reason,
        stamp_ms: 0,
    }
}

#[tokio::test]
async fn a_ready_write_losing_one_race_fewer_than_the_attempts_lands_and_one_losing_them_all_is_counted()
 {
    let fake = FakeKube::start().await;
    let (api, config) = provider(&fake).await;
    let metrics = ControllerMetrics::new();
    let up = verdict(ReadyStatus::Ready, ReadyReason::EndpointsReady);
    conflicts(&fake, "llama/status", u32::from(READY_WRITE_ATTEMPTS) - 1);
    assert_eq!(write_one(&api, &config, up, &metrics).await, Written::Wrote);
    assert_eq!(metrics.failures(Operation::ReadyWrite), 0);
    assert_eq!(
        write_one(&api, &config, up, &metrics).await,
        Written::Unchanged
    );
    let down = verdict(ReadyStatus::NotReady, ReadyReason::NoReadyEndpoints);
    conflicts(&fake, "llama/status", u32::from(READY_WRITE_ATTEMPTS));
    assert_eq!(
        write_one(&api, &config, down, &metrics).await,
        Written::Failed
    );
    assert_eq!(metrics.failures(Operation::ReadyWrite), 1);
    let held = fake.get("inferenceproviders", NS, "llama").unwrap();
    assert_eq!(held["status"]["conditions"][0]["reason"], "EndpointsReady");
}

#[tokio::test]
async fn a_ready_verdict_is_never_written_onto_a_same_name_recreation() {
    let fake = FakeKube::start().await;
    let (api, config) = provider(&fake).await;
    fake.delete("inferenceproviders", NS, "llama");
    fake.create(
        "inferenceproviders",
        NS,
        json!({"metadata": {"name": "llama"}, "spec": {"metricsConfig": {"endpoint": "http://e"}}}),
    );
    let up = verdict(ReadyStatus::Ready, ReadyReason::EndpointsReady);
    assert_eq!(
        write_one(&api, &config, up, &ControllerMetrics::new()).await,
        Written::NotOurs
    );
    assert_eq!(fake.writes_to("llama/status"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_write_survives_fewer_conflicts_than_its_attempts_and_reports_the_last_one() {
    let (fake, store) = site_store().await;
    let s = store.clone();
    // The ConfigMap exists first (the mark is written at every start).
    tokio::task::spawn_blocking(move || s.store_epoch_hwm(1))
        .await
        .unwrap()
        .unwrap();
    conflicts(
        &fake,
        "configmaps/grid-site-a",
        u32::from(FENCE_WRITE_ATTEMPTS) - 1,
    );
    let s = store.clone();
    tokio::task::spawn_blocking(move || s.store_fences(&FenceSet::default()))
        .await
        .unwrap()
        .unwrap();
    conflicts(
        &fake,
        "configmaps/grid-site-a",
        u32::from(FENCE_WRITE_ATTEMPTS),
    );
    let s = store.clone();
    let last = tokio::task::spawn_blocking(move || s.store_fences(&FenceSet::default()))
        .await
        .unwrap();
    assert!(matches!(last, Err(Error::KubeConflict { .. })), "{last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_call_answering_inside_the_timeout_succeeds_and_one_past_it_fails() {
    let (fake, store) = site_store().await;
    let slow = |by: Duration| Fault {
        target: Target::Path("configmaps".into()),
        times: 1,
        action: Action::Delay(by),
    };
    fake.inject(slow(
        API_CALL_TIMEOUT.saturating_sub(Duration::from_millis(300)),
    ));
    let s = store.clone();
    let inside = tokio::task::spawn_blocking(move || s.load_epoch_hwm())
        .await
        .unwrap();
    assert_eq!(inside.unwrap(), None);
    fake.inject(slow(API_CALL_TIMEOUT + Duration::from_millis(300)));
    let s = store.clone();
    let past = tokio::task::spawn_blocking(move || s.load_epoch_hwm())
        .await
        .unwrap();
    assert!(matches!(past, Err(Error::Kube { .. })), "{past:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_waits_for_the_first_lists_at_most_its_limit() {
    use grid_operatord::controller::source::KubeConfigSource;
    use grid_operatord::controller::translate::Deployment;
    let fake = FakeKube::start().await;
    let deployment = Deployment {
        site: "a".into(),
        listen: grid_operatord::config::Listen {
            signals: "127.0.0.1:0".parse().unwrap(),
            metrics: "127.0.0.1:0".parse().unwrap(),
        },
        tls: grid_operatord::config::TlsFiles {
            cert: "a.crt".into(),
            key: "a.key".into(),
            ca: None,
        },
        state_label: "ConfigMap/grid-site-a".into(),
    };
    let client = api::client(Some(&fake.url()), NS).await.unwrap();
    let limit = Duration::from_millis(500);
    let listed = KubeConfigSource::start_within(
        client.clone(),
        NS,
        deployment.clone(),
        ControllerMetrics::new(),
        limit,
    )
    .await;
    assert!(listed.is_ok());
    fake.set_unavailable(true);
    let began = tokio::time::Instant::now();
    let refused =
        KubeConfigSource::start_within(client, NS, deployment, ControllerMetrics::new(), limit)
            .await;
    assert!(matches!(refused, Err(Error::Kube { .. })));
    assert!(
        began.elapsed() < limit + Duration::from_secs(1),
        "{:?}",
        began.elapsed()
    );
}
