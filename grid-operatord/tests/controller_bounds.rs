//! The controller's bounds, each at its boundary, against a real kube-apiserver (faults
//! from the proxy in front of it, `grid_kit::kube_cluster`): the
//! attempts of a Ready or fence write that keeps losing races, and the time one API call
//! may take.

use std::sync::Arc;
use std::time::Duration;

use grid_kit::kube_cluster::{Action, Fault, KubeTest, Target};
use grid_operatord::Error;
use grid_operatord::clock::Clock;
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

fn conflicts(k8s: &KubeTest, path: &str, times: u32) {
    k8s.inject(Fault {
        target: Target::Writes(path.into()),
        times,
        action: Action::Conflict,
    });
}

async fn provider(k8s: &KubeTest) -> (Api<InferenceProvider>, ProviderConfig) {
    let made = k8s
        .create(
            "inferenceproviders",
            json!({"metadata": {"name": "llama"}, "spec": {"metricsConfig": {"endpoint": "http://e"}}}),
        )
        .await;
    let mut config = ProviderConfig::new("a", "llama", "http://e/metrics".parse().unwrap());
    config.uid = made["metadata"]["uid"].as_str().unwrap().to_owned();
    let client = operator_client(k8s).await;
    (Api::namespaced(client, &k8s.ns), config)
}

/// The operator's client: its `ServiceAccount`, through the fault proxy.
async fn operator_client(k8s: &KubeTest) -> kube::Client {
    api::client_from(k8s.operator_config().await, &k8s.ns).unwrap()
}

/// A namespace on the API server and the state store of site `a` of network `prod` in it.
async fn site_store() -> (KubeTest, Arc<KubeStateStore>) {
    let k8s = KubeTest::start().await;
    let client = operator_client(&k8s).await;
    let store = KubeStateStore::new(client, &k8s.ns, "a", "prod", ControllerMetrics::new());
    (k8s, Arc::new(store))
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
    let k8s = KubeTest::start().await;
    let (api, config) = provider(&k8s).await;
    let metrics = ControllerMetrics::new();
    let up = verdict(ReadyStatus::Ready, ReadyReason::EndpointsReady);
    conflicts(&k8s, "llama/status", u32::from(READY_WRITE_ATTEMPTS) - 1);
    assert_eq!(
        write_one(&api, &config, up, &metrics, &Clock::system()).await,
        Written::Wrote
    );
    assert_eq!(metrics.failures(Operation::ReadyWrite), 0);
    assert_eq!(
        write_one(&api, &config, up, &metrics, &Clock::system()).await,
        Written::Unchanged
    );
    let down = verdict(ReadyStatus::NotReady, ReadyReason::NoReadyEndpoints);
    conflicts(&k8s, "llama/status", u32::from(READY_WRITE_ATTEMPTS));
    assert_eq!(
        write_one(&api, &config, down, &metrics, &Clock::system()).await,
        Written::Failed
    );
    assert_eq!(metrics.failures(Operation::ReadyWrite), 1);
    let held = k8s.get("inferenceproviders", "llama").await.unwrap();
    assert_eq!(held["status"]["conditions"][0]["reason"], "EndpointsReady");
}

#[tokio::test]
async fn a_ready_verdict_is_never_written_onto_a_same_name_recreation() {
    let k8s = KubeTest::start().await;
    let (api, config) = provider(&k8s).await;
    k8s.delete("inferenceproviders", "llama").await;
    k8s.create(
        "inferenceproviders",
        json!({"metadata": {"name": "llama"}, "spec": {"metricsConfig": {"endpoint": "http://e"}}}),
    )
    .await;
    let up = verdict(ReadyStatus::Ready, ReadyReason::EndpointsReady);
    assert_eq!(
        write_one(
            &api,
            &config,
            up,
            &ControllerMetrics::new(),
            &Clock::system()
        )
        .await,
        Written::NotOurs
    );
    assert_eq!(k8s.writes_to("llama/status"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_write_survives_fewer_conflicts_than_its_attempts_and_reports_the_last_one() {
    let (k8s, store) = site_store().await;
    let s = store.clone();
    // The ConfigMap exists first (the mark is written at every start).
    tokio::task::spawn_blocking(move || s.store_epoch_hwm(1))
        .await
        .unwrap()
        .unwrap();
    conflicts(
        &k8s,
        "configmaps/grid-site-a",
        u32::from(FENCE_WRITE_ATTEMPTS) - 1,
    );
    let s = store.clone();
    tokio::task::spawn_blocking(move || s.store_fences(&FenceSet::default()))
        .await
        .unwrap()
        .unwrap();
    conflicts(
        &k8s,
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
    let (k8s, store) = site_store().await;
    let slow = |by: Duration| Fault {
        target: Target::Path("configmaps".into()),
        times: 1,
        action: Action::Delay(by),
    };
    k8s.inject(slow(
        API_CALL_TIMEOUT.saturating_sub(Duration::from_millis(300)),
    ));
    let s = store.clone();
    let inside = tokio::task::spawn_blocking(move || s.load_epoch_hwm())
        .await
        .unwrap();
    assert_eq!(inside.unwrap(), None);
    k8s.inject(slow(API_CALL_TIMEOUT + Duration::from_millis(300)));
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
    let k8s = KubeTest::start().await;
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
    let client = operator_client(&k8s).await;
    let limit = Duration::from_millis(500);
    let listed = KubeConfigSource::start_within(
        client.clone(),
        &k8s.ns,
        deployment.clone(),
        ControllerMetrics::new(),
        limit,
    )
    .await;
    assert!(listed.is_ok());
    k8s.set_unavailable(true);
    let began = tokio::time::Instant::now();
    let refused = KubeConfigSource::start_within(
        client,
        &k8s.ns,
        deployment,
        ControllerMetrics::new(),
        limit,
    )
    .await;
    assert!(matches!(refused, Err(Error::Kube { .. })));
    assert!(
        began.elapsed() < limit + Duration::from_secs(1),
        "{:?}",
        began.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_or_429_is_not_retried_by_kubes_client_the_operation_fails_at_once() {
    let (k8s, store) = site_store().await;
    for code in [503, 429] {
        k8s.inject(Fault {
            target: Target::Path("configmaps/grid-site-a".into()),
            times: 1,
            action: Action::ServerError(code),
        });
        let asked = |k8s: &KubeTest| {
            k8s.proxy
                .log()
                .iter()
                .filter(|l| l.path.ends_with("configmaps/grid-site-a"))
                .count()
        };
        let before = asked(&k8s);
        let s = store.clone();
        let began = tokio::time::Instant::now();
        let answer = tokio::task::spawn_blocking(move || s.load_epoch_hwm())
            .await
            .unwrap();
        assert!(
            matches!(answer, Err(Error::Kube { .. })),
            "{code}: {answer:?}"
        );
        assert_eq!(asked(&k8s) - before, 1, "{code}: asked once, not retried");
        assert!(
            began.elapsed() < API_CALL_TIMEOUT,
            "{code}: failed at once, after {:?}",
            began.elapsed()
        );
    }
}
