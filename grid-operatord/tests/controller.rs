//! The operator in controller mode against a real kube-apiserver and etcd
//! (`grid_kit::kube_cluster`), running as the example RBAC's `ServiceAccount`: resources
//! in, the same driver as the file mode out, conditions and state written back the way
//! the design texts say. Faults the real server will not produce on demand come from the
//! proxy in front of it.

use std::sync::Arc;
use std::time::Duration;

use grid_kit::epp_server::{Behaviour, FakeEpp};
use grid_kit::kube_cluster::{Action, Fault, KubeTest, Target};
use grid_kit::operator_harness::{
    Grid, Site, epp_body, eventually, get_metrics, get_signals, ingest_resets, post_ingest,
};
use grid_operatord::Error;
use grid_operatord::config::Listen;
use grid_operatord::controller::api::{self, ControllerMetrics};
use grid_operatord::controller::run::{self, StartedDriver};
use grid_operatord::controller::source::KubeConfigSource;
use grid_operatord::controller::state_store::KubeStateStore;
use grid_operatord::controller::translate::Deployment;
use grid_operatord::driver::Options;
use grid_operatord::state::StateStore;
use serde_json::{Value, json};
use tokio::sync::{oneshot, watch};

fn network(mode: &str) -> Value {
    json!({
        "metadata": {"name": "prod"},
        "spec": {
            "signalTransport": {"mode": mode},
            "peerTrust": {"mode": "spiffe", "trustDomain": grid_kit::operator_harness::DOMAIN},
            "intervals": {"scrapeSeconds": 0.2, "peerPollSeconds": 0.5},
        },
    })
}

fn provider(name: &str, epp: &FakeEpp) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "metricsConfig": {
                "endpoint": format!("http://{}", epp.addr),
                "timeoutSeconds": 0.5,
                "staleMetricsSeconds": 1.0,
            },
        },
    })
}

async fn client(k8s: &KubeTest) -> kube::Client {
    api::client_from(k8s.operator_config().await, &k8s.ns).unwrap()
}

fn options() -> Options {
    Options {
        mode_check: Duration::from_millis(200),
        fence_persist: Duration::from_millis(200),
        ..Options::default()
    }
}

/// A controller-mode operator running in the background.
struct Controller {
    started: watch::Receiver<Option<StartedDriver>>,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<Result<(), Error>>,
    metrics: ControllerMetrics,
}

impl Controller {
    async fn start(k8s: &KubeTest, site: &Site) -> Self {
        Self::start_with(k8s, site, None).await
    }

    async fn start_with(k8s: &KubeTest, site: &Site, election: Option<run::Election>) -> Self {
        Self::start_full(k8s, site.deployment(), election, options()).await
    }

    async fn start_full(
        k8s: &KubeTest,
        deployment: Deployment,
        election: Option<run::Election>,
        options: Options,
    ) -> Self {
        let client = client(k8s).await;
        let metrics = ControllerMetrics::new();
        let source = Arc::new(
            KubeConfigSource::start(client.clone(), &k8s.ns, deployment, metrics.clone())
                .await
                .unwrap(),
        );
        let (tx, started) = watch::channel(None);
        let (stop, stopped) = oneshot::channel::<()>();
        let m = metrics.clone();
        let namespace = k8s.ns.clone();
        let done = tokio::spawn(async move {
            let setup = run::Setup {
                client,
                namespace,
                source,
                options,
                metrics: m,
                election,
            };
            run::run(setup, tx, async {
                let _ = stopped.await;
            })
            .await
        });
        Self {
            started,
            stop: Some(stop),
            done,
            metrics,
        }
    }

    /// The driver start after `restarts` in-process restarts, once it is up.
    async fn driver(&mut self, restarts: u64) -> StartedDriver {
        let wait = self
            .started
            .wait_for(|s| s.as_ref().is_some_and(|s| s.restarts == restarts));
        tokio::time::timeout(Duration::from_secs(15), wait)
            .await
            .expect("the driver started")
            .unwrap()
            .clone()
            .unwrap()
    }

    /// The running driver once `until` holds of it (a live reconfiguration moves its
    /// `config` and `reconfigured`, and nothing else).
    async fn configured(&mut self, until: impl Fn(&StartedDriver) -> bool) -> StartedDriver {
        let wait = self.started.wait_for(|s| s.as_ref().is_some_and(&until));
        tokio::time::timeout(Duration::from_secs(15), wait)
            .await
            .expect("the driver took the configuration")
            .unwrap()
            .clone()
            .unwrap()
    }

    async fn stop(mut self) -> Result<(), Error> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.done.await.unwrap()
    }

    async fn ended(self) -> Result<(), Error> {
        let started = self.started.clone();
        match tokio::time::timeout(Duration::from_secs(15), self.done).await {
            Ok(r) => r.unwrap(),
            Err(tokio::time::error::Elapsed { .. }) => panic!(
                "the operator did not end by itself within 15 s; its last driver start: {:?}",
                started.borrow()
            ),
        }
    }
}

async fn ready_condition(k8s: &KubeTest, name: &str) -> Option<Value> {
    let p = k8s.get("inferenceproviders", name).await?;
    p["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .cloned()
}

async fn ready_reason(k8s: &KubeTest, name: &str, reason: &str) -> Value {
    eventually(&format!("Ready reason {reason}"), 15, || async {
        ready_condition(k8s, name)
            .await
            .is_some_and(|c| c["reason"] == reason)
    })
    .await;
    ready_condition(k8s, name).await.unwrap()
}

/// A `GridSite` named `b` at an address nothing answers: a peer trust change.
fn site_b() -> Value {
    json!({"metadata": {"name": "b"}, "spec": {"signalsEndpoint": "https://127.0.0.1:9/v1/site/signals"}})
}

async fn seeded() -> (KubeTest, FakeEpp, Grid, Site) {
    seeded_with(network("poll")).await
}

/// [`seeded`] with `network` as the one `GridNetwork`.
async fn seeded_with(network: Value) -> (KubeTest, FakeEpp, Grid, Site) {
    let k8s = KubeTest::start().await;
    let epp = FakeEpp::start(Behaviour::Body(epp_body(2, 1.0))).await;
    let grid = Grid::new();
    let site = grid.site("a");
    k8s.create("gridnetworks", network).await;
    k8s.create("inferenceproviders", provider("llama", &epp))
        .await;
    (k8s, epp, grid, site)
}

/// Writes a status on provider `name` through the status subresource, as another
/// controller might: its spec, and so its generation, stay as they are.
async fn status_only_update(k8s: &KubeTest, name: &str) {
    let mut with_status = k8s.get("inferenceproviders", name).await.unwrap();
    with_status["status"] = json!({"observedGeneration": 1});
    k8s.replace_status("inferenceproviders", with_status).await;
}

fn text(body: &[u8]) -> String {
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_scrapes_the_declared_provider_and_publishes_its_uid_and_generation() {
    let (k8s, _epp, grid, site) = seeded().await;
    let uid = k8s.get("inferenceproviders", "llama").await.unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut op = Controller::start(&k8s, &site).await;
    let d = op.driver(0).await;
    assert_eq!(d.config.providers[0].uid, uid);
    let gateway = grid.client(&site.cert, "a", "a");
    eventually("the provider's batch is served", 10, || {
        let tls = gateway.clone();
        let uid = uid.clone();
        async move {
            let body = text(&get_signals(d.signals_addr, tls).await.unwrap().body);
            body.lines().any(|l| {
                l.starts_with("grid_provider_config_generation{")
                    && l.contains(&format!("provider_uid=\"{uid}\""))
                    && l.split_whitespace().nth(1) == Some("1")
            })
        }
    })
    .await;
    op.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_conditions_carry_each_verdicts_reason_and_are_not_rewritten_when_unchanged() {
    let (k8s, epp, _grid, site) = seeded().await;
    let mut op = Controller::start(&k8s, &site).await;
    op.driver(0).await;
    let ready = ready_reason(&k8s, "llama", "EndpointsReady").await;
    assert_eq!(ready["status"], "True");
    assert_eq!(ready["observedGeneration"], 1);
    let first_transition = ready["lastTransitionTime"].clone();
    // Nothing changes: no more status writes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let writes = k8s.writes_to("inferenceproviders/llama/status");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(k8s.writes_to("inferenceproviders/llama/status"), writes);
    // A failed scrape, past the stale window: False, with the failure's class.
    epp.set(Behaviour::Status(500));
    let failed = ready_reason(&k8s, "llama", "ScrapeHttp").await;
    assert_eq!(failed["status"], "False");
    assert_ne!(failed["lastTransitionTime"], first_transition);
    // Back, confirmed over two scrapes.
    epp.set(Behaviour::Body(epp_body(2, 1.0)));
    let back = ready_reason(&k8s, "llama", "EndpointsReady").await;
    assert_eq!(back["status"], "True");
    // Our own status writes are status-only updates: the driver never restarted.
    assert_eq!(op.started.borrow().as_ref().unwrap().restarts, 0);
    op.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_change_publishes_the_new_generation_and_a_recreation_the_new_uid() {
    let (k8s, epp, _grid, site) = seeded().await;
    let mut op = Controller::start(&k8s, &site).await;
    let first = op.driver(0).await;
    assert_eq!(first.config.providers[0].generation, 1);
    // A status-only update (as another controller might make) changes nothing.
    status_only_update(&k8s, "llama").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let now = op.started.borrow().clone().unwrap();
    assert_eq!((now.restarts, now.reconfigured), (0, 0));
    // The spec says Unavailable: generation 2, taken over live in the same epoch, and
    // the verdict follows.
    let mut spec = provider("llama", &epp);
    spec["spec"]["unavailable"] = json!(true);
    k8s.replace("inferenceproviders", spec).await;
    let second = op
        .configured(|d| d.config.providers[0].generation == 2)
        .await;
    assert_eq!((second.restarts, second.epoch), (0, first.epoch));
    let unavailable = ready_reason(&k8s, "llama", "Unavailable").await;
    assert_eq!(unavailable["observedGeneration"], 2);
    // Deleted and created again under the same name: a new UID, generation 1.
    let old_uid = second.config.providers[0].uid.clone();
    k8s.delete("inferenceproviders", "llama").await;
    k8s.create("inferenceproviders", provider("llama", &epp))
        .await;
    let third = op
        .configured(|d| d.config.providers.first().is_some_and(|p| p.uid != old_uid))
        .await;
    assert_eq!(third.config.providers[0].generation, 1);
    assert_eq!((third.restarts, third.epoch), (0, first.epoch));
    op.stop().await.unwrap();
}

/// The publisher-epoch high-water mark in site `a`'s `ConfigMap`.
async fn mark(k8s: &KubeTest) -> u64 {
    k8s.get("configmaps", "grid-site-a").await.unwrap()["data"]["publisherEpochHighWaterMark"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_high_water_mark_in_the_configmap_survives_an_operator_restart() {
    let (k8s, _epp, _grid, site) = seeded().await;
    let mut op = Controller::start(&k8s, &site).await;
    let first = op.driver(0).await;
    assert_eq!(mark(&k8s).await, first.epoch);
    op.stop().await.unwrap();
    // A mark a minute ahead of the clock (a clock that stepped back across the restart):
    // the new process publishes above it.
    let ahead = grid_operatord::clock::wall_ms() + 60_000;
    let mut cm = k8s.get("configmaps", "grid-site-a").await.unwrap();
    cm["data"]["publisherEpochHighWaterMark"] = json!(ahead.to_string());
    k8s.replace("configmaps", cm).await;
    let mut again = Controller::start(&k8s, &site).await;
    let second = again.driver(0).await;
    assert_eq!(second.epoch, ahead + 1);
    assert_eq!(mark(&k8s).await, ahead + 1);
    again.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_operators_racing_from_the_same_mark_never_both_win() {
    let k8s = KubeTest::start().await;
    k8s.create("gridnetworks", network("poll")).await;
    let client = client(&k8s).await;
    let store = || {
        Arc::new(KubeStateStore::new(
            client.clone(),
            &k8s.ns,
            "a",
            "prod",
            ControllerMetrics::new(),
        ))
    };
    let (one, two) = (store(), store());
    let outcome = tokio::task::spawn_blocking(move || {
        one.store_epoch_hwm(5).unwrap(); // creates the ConfigMap
        two.load_epoch_hwm().unwrap();
        one.load_epoch_hwm().unwrap();
        // Both read mark 5 at the same version; both try to move it.
        let a = one.store_epoch_hwm(10);
        let b = two.store_epoch_hwm(11);
        (
            a.is_ok(),
            matches!(b, Err(Error::KubeConflict { .. })),
            two.load_epoch_hwm().unwrap(),
        )
    })
    .await
    .unwrap();
    assert_eq!(outcome, (true, true, Some(10)));
}

fn report(sequence: u64, rejected: u64) -> Vec<(&'static str, String)> {
    vec![
        ("x-grid-ingest-version", "1".into()),
        ("x-grid-ingest-epoch", "00000000000000ab".into()),
        ("x-grid-ingest-sequence", sequence.to_string()),
        ("x-grid-ingest-rejected", rejected.to_string()),
        ("x-grid-ingest-clean", "false".into()),
        ("x-grid-ingest-replica", "gw-0".into()),
    ]
}

fn events(metrics: &str, event: &str) -> u64 {
    metrics
        .lines()
        .find(|l| {
            l.starts_with(&format!(
                "grid_gateway_feedback_events_total{{event=\"{event}\"}}"
            ))
        })
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn ages_rejected(k8s: &KubeTest) -> Option<Value> {
    let n = k8s.get("gridnetworks", "prod").await?;
    n["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "GatewayAgesRejected")
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_conflict_is_retried_with_a_fresh_read_and_the_report_acknowledged() {
    let (k8s, _epp, grid, site) = seeded().await;
    let mut op = Controller::start(&k8s, &site).await;
    let d = op.driver(0).await;
    k8s.inject(Fault {
        target: Target::Writes("gridnetworks/prod/status".into()),
        times: 1,
        action: Action::Conflict,
    });
    let gateway = grid.client(&site.cert, "a", "a");
    let (status, headers) = post_ingest(d.signals_addr, gateway, &report(1, 3)).await;
    assert_eq!(status, 204);
    assert_eq!(headers["x-grid-ingest-sequence"], "1");
    let condition = ages_rejected(&k8s).await.expect("written before the 204");
    assert_eq!(condition["status"], "True");
    assert_eq!(condition["reason"], "ReadingsRejected");
    let network = k8s.get("gridnetworks", "prod").await.unwrap();
    assert_eq!(
        network["status"]["gatewayFeedback"]["reporters"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let m = get_metrics(d.metrics_addr).await;
    assert_eq!(
        (events(&m, "conflict"), events(&m, "conflict_exhausted")),
        (1, 0),
        "{m}"
    );
    op.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_conflicts_exhaust_the_write_and_nothing_is_acknowledged() {
    let (k8s, _epp, grid, site) = seeded().await;
    let mut op = Controller::start(&k8s, &site).await;
    let d = op.driver(0).await;
    k8s.inject(Fault {
        target: Target::Writes("gridnetworks/prod/status".into()),
        times: 3,
        action: Action::Conflict,
    });
    let gateway = grid.client(&site.cert, "a", "a");
    let (status, headers) = post_ingest(d.signals_addr, gateway.clone(), &report(1, 3)).await;
    assert_ne!(status, 204);
    assert!(headers.get("x-grid-ingest-sequence").is_none());
    assert_eq!(headers["x-grid-ingest-refusal"], "conflict_exhausted");
    assert!(ages_rejected(&k8s).await.is_none(), "nothing was persisted");
    let m = get_metrics(d.metrics_addr).await;
    assert_eq!(
        (events(&m, "conflict"), events(&m, "conflict_exhausted")),
        (3, 1),
        "{m}"
    );
    // A slow API server past the budget is a write failure, not a hang.
    k8s.inject(Fault {
        target: Target::Path("gridnetworks/prod".into()),
        times: 1,
        action: Action::Delay(Duration::from_secs(6)),
    });
    let (status, _) = post_ingest(d.signals_addr, gateway, &report(1, 3)).await;
    assert_ne!(status, 204);
    let m = get_metrics(d.metrics_addr).await;
    assert_eq!(events(&m, "write_failure"), 1, "{m}");
    op.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_than_one_grid_network_is_refused_at_start() {
    let (k8s, _epp, _grid, site) = seeded().await;
    let mut second = network("poll");
    second["metadata"]["name"] = json!("staging");
    k8s.create("gridnetworks", second).await;
    let op = Controller::start(&k8s, &site).await;
    match op.ended().await {
        Err(Error::NetworkCount { count: 2, names }) => assert_eq!(names, ["prod", "staging"]),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_mode_other_than_the_running_one_ends_the_operator() {
    let (k8s, _epp, _grid, site) = seeded().await;
    let mut op = Controller::start(&k8s, &site).await;
    op.driver(0).await;
    k8s.replace("gridnetworks", network("gossip")).await;
    match op.ended().await {
        Err(Error::ModeChanged {
            running: "poll",
            declared,
        }) => assert_eq!(declared, "gossip"),
        other => panic!("expected a mode change, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_trust_change_under_poll_ends_the_operator() {
    let (k8s, _epp, _grid, site) = seeded().await;
    let mut op = Controller::start(&k8s, &site).await;
    op.driver(0).await;
    k8s.create("gridsites", site_b()).await;
    match op.ended().await {
        Err(Error::TrustChanged { field: "peers" }) => {}
        other => panic!("expected a trust change, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_gossip_a_peer_trust_change_is_taken_over_live_in_the_same_epoch() {
    // An absent mode: gossip.
    let mut absent = network("gossip");
    absent["spec"]
        .as_object_mut()
        .unwrap()
        .remove("signalTransport");
    let (k8s, _epp, _grid, site) = seeded_with(absent).await;
    let mut op = Controller::start(&k8s, &site).await;
    let first = op.driver(0).await;
    k8s.create("gridsites", site_b()).await;
    // The new trust (and seed) is in force in the running driver; nothing restarted.
    let now = op
        .configured(|d| d.config.peers.iter().any(|p| p.name == "b"))
        .await;
    assert_eq!(
        (now.restarts, now.reconfigured, now.epoch),
        (0, 1, first.epoch)
    );
    assert_eq!(
        now.config.transport,
        grid_operatord::config::TransportMode::Gossip
    );
    op.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_that_goes_away_leaves_the_last_good_configuration_serving() {
    let (k8s, _epp, grid, site) = seeded().await;
    let mut op = Controller::start(&k8s, &site).await;
    let d = op.driver(0).await;
    k8s.set_unavailable(true);
    let metrics = op.metrics.clone();
    eventually("the watch failures counted", 15, || {
        let m = metrics.clone();
        async move { m.failures(api::Operation::Watch) > 0 }
    })
    .await;
    let gateway = grid.client(&site.cert, "a", "a");
    let body = text(&get_signals(d.signals_addr, gateway).await.unwrap().body);
    assert!(body.contains("grid_provider_config_generation{"), "{body}");
    let m = get_metrics(d.metrics_addr).await;
    assert!(
        m.contains("grid_operator_kube_failures_total{operation=\"watch\"}"),
        "{m}"
    );
    k8s.set_unavailable(false);
    assert_eq!(op.started.borrow().as_ref().unwrap().restarts, 0);
    op.stop().await.unwrap();
}

fn election(identity: &str) -> run::Election {
    run::Election {
        identity: identity.into(),
        timing: grid_operatord::controller::lease::Timing {
            duration: Duration::from_secs(1),
            renew: Duration::from_millis(200),
        },
    }
}

async fn lease_holder(k8s: &KubeTest) -> Option<String> {
    k8s.get("leases", "grid-operator-a").await?["spec"]["holderIdentity"]
        .as_str()
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_replica_never_publishes_and_takes_over_within_the_lease_when_the_writer_dies() {
    let (k8s, _epp, _grid, site) = seeded().await;
    let mut one = Controller::start_with(&k8s, &site, Some(election("one"))).await;
    let first = one.driver(0).await;
    assert_eq!(lease_holder(&k8s).await.as_deref(), Some("one"));
    let mut two = Controller::start_with(&k8s, &site, Some(election("two"))).await;
    // Longer than the lease: the writer renews, so the standby never starts publishing.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(two.started.borrow().is_none(), "the standby started");
    // Kill the writer: its tasks and renewals stop at once.
    one.done.abort();
    let killed = tokio::time::Instant::now();
    let second = two.driver(0).await;
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(3), "took over after {took:?}");
    assert!(second.epoch > first.epoch, "above the writer's mark");
    assert_eq!(lease_holder(&k8s).await.as_deref(), Some("two"));
    let transitions =
        k8s.get("leases", "grid-operator-a").await.unwrap()["spec"]["leaseTransitions"].clone();
    assert_eq!(transitions, 1);
    two.stop().await.unwrap();
    assert_eq!(
        lease_holder(&k8s).await,
        None,
        "a graceful stop gives the Lease up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_failing_on_the_api_is_tried_again_while_its_replica_keeps_the_lease() {
    let (k8s, _epp, _grid, site) = seeded().await;
    // The state ConfigMap answers 503 four times: starts at 0, 0.5, 1.5 and 3.5 s fail,
    // the one at 7.5 s goes through, seven lease durations after the Lease was taken.
    k8s.inject(Fault {
        target: Target::Path("configmaps/grid-site-a".into()),
        times: 4,
        action: Action::ServerError(503),
    });
    let mut one = Controller::start_with(&k8s, &site, Some(election("one"))).await;
    eventually("one holds the Lease", 10, || async {
        lease_holder(&k8s).await.as_deref() == Some("one")
    })
    .await;
    let two = Controller::start_with(&k8s, &site, Some(election("two"))).await;
    one.driver(0).await;
    assert_eq!(
        lease_holder(&k8s).await.as_deref(),
        Some("one"),
        "renewed throughout the retries"
    );
    assert!(
        two.started.borrow().is_none(),
        "the standby never took over"
    );
    assert!(
        one.metrics.failures(api::Operation::StateRead) >= 4,
        "each failed start counted"
    );
    two.stop().await.unwrap();
    one.stop().await.unwrap();
}

/// The inode of the socket listening on loopback port `port` (`ss`), if any.
fn listening_inode(port: u16) -> Option<String> {
    let out = std::process::Command::new("ss")
        .args(["-Hltne", &format!("sport = :{port}")])
        .output()
        .expect("ss runs");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ino:").map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_taking_over_serves_its_metrics_on_the_very_socket_its_probes_listened_on() {
    // Closed and bound again, the port could not be bound while another copy of the
    // descriptor was open (any process forked in between holds one until it execs), and
    // the replica taking over ended instead.
    let (k8s, _epp, _grid, site) = seeded().await;
    let mut one = Controller::start_with(&k8s, &site, Some(election("one"))).await;
    one.driver(0).await;
    let port = grid_kit::ports::loopback_port();
    let mut deployment = site.deployment();
    deployment.listen.metrics = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut two = Controller::start_full(&k8s, deployment, Some(election("two")), options()).await;
    let mut standby = None;
    eventually("the standby's probes listen", 10, || {
        standby = listening_inode(port);
        std::future::ready(standby.is_some())
    })
    .await;
    assert!(two.started.borrow().is_none(), "a standby still");
    one.done.abort();
    let second = two.driver(0).await;
    assert_eq!(second.metrics_addr.port(), port);
    assert_eq!(listening_inode(port), standby, "one socket throughout");
    let page = get_metrics(second.metrics_addr).await;
    assert!(page.contains("grid_operator_kube_failures_total"), "{page}");
    two.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_cannot_renew_for_a_whole_lease_duration_stops_publishing() {
    let (k8s, _epp, _grid, site) = seeded().await;
    let mut one = Controller::start_with(&k8s, &site, Some(election("one"))).await;
    one.driver(0).await;
    k8s.set_unavailable(true);
    match one.ended().await {
        Err(Error::LeaseLost { lease }) => assert_eq!(lease, "grid-operator-a"),
        other => panic!("expected the lease lost, got {other:?}"),
    }
}

/// What a gateway's store learns from one poll of the operator: the learning resets of
/// `provider`'s batches (uid, generation).
async fn poll_resets(
    store: &mut grid_signals::store::Store,
    addr: std::net::SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> Vec<(String, u64)> {
    let fetched = get_signals(addr, tls).await.unwrap();
    ingest_resets(store, &fetched)
        .1
        .into_iter()
        .filter(|(provider, _)| provider == "llama")
        .map(|(_, revision)| (revision.uid, revision.generation))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_resets_learning_on_a_spec_change_and_a_recreation_but_not_on_a_status_update() {
    let (k8s, epp, grid, site) = seeded().await;
    let gateway = grid.client(&site.cert, "a", "a");
    let mut store = grid_signals::store::Store::new(grid_signals::store::StoreConfig::default());
    let mut op = Controller::start(&k8s, &site).await;
    let first = op.driver(0).await;
    let uid = first.config.providers[0].uid.clone();
    let mut resets = Vec::new();
    for _ in 0..100 {
        resets.extend(poll_resets(&mut store, first.signals_addr, gateway.clone()).await);
        if !resets.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(resets, [(uid.clone(), 1)], "the first lifetime");
    // A status-only update: the same revision keeps being published; nothing resets.
    status_only_update(&k8s, "llama").await;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            poll_resets(&mut store, first.signals_addr, gateway.clone()).await,
            []
        );
    }
    // A spec change: the next revision carries generation 2, and learning resets.
    let mut spec = provider("llama", &epp);
    spec["spec"]["pool"] = json!("pool");
    k8s.replace("inferenceproviders", spec).await;
    let second = op
        .configured(|d| d.config.providers[0].generation == 2)
        .await;
    let mut after_change = Vec::new();
    for _ in 0..100 {
        after_change.extend(poll_resets(&mut store, second.signals_addr, gateway.clone()).await);
        if after_change.iter().any(|(_, g)| *g == 2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(after_change.contains(&(uid.clone(), 2)), "{after_change:?}");
    // A same-name recreation: a new UID, and learning resets again.
    k8s.delete("inferenceproviders", "llama").await;
    k8s.create("inferenceproviders", provider("llama", &epp))
        .await;
    let mut after_recreation = Vec::new();
    for _ in 0..200 {
        let restarts = op.started.borrow().as_ref().unwrap().restarts;
        let d = op.driver(restarts).await;
        if let Ok(f) = get_signals(d.signals_addr, gateway.clone()).await {
            let (_, resets) = ingest_resets(&mut store, &f);
            after_recreation.extend(resets.into_iter().map(|(_, revision)| revision.uid));
        }
        if after_recreation.iter().any(|u| *u != uid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        after_recreation.iter().any(|u| *u != uid),
        "{after_recreation:?}"
    );
    op.stop().await.unwrap();
}

/// Every learning reset a gateway's store raises on one poll: (provider, generation, epoch).
async fn poll_every_reset(
    store: &mut grid_signals::store::Store,
    addr: std::net::SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> Vec<(String, u64, u64)> {
    let Ok(fetched) = get_signals(addr, tls).await else {
        return Vec::new();
    };
    let (report, resets) = ingest_resets(store, &fetched);
    assert_eq!(report.dropped.total(), 0, "nothing refused: {report:?}");
    resets
        .into_iter()
        .map(|(provider, r)| (provider, r.generation, r.epoch))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_change_of_one_provider_resets_only_that_providers_learning_in_the_same_epoch() {
    let (k8s, epp, grid, site) = seeded().await;
    k8s.create("inferenceproviders", provider("mistral", &epp))
        .await;
    let gateway = grid.client(&site.cert, "a", "a");
    let mut store = grid_signals::store::Store::new(grid_signals::store::StoreConfig::default());
    let mut op = Controller::start(&k8s, &site).await;
    let first = op.configured(|d| d.config.providers.len() == 2).await;
    let mut resets = Vec::new();
    for _ in 0..100 {
        resets.extend(poll_every_reset(&mut store, first.signals_addr, gateway.clone()).await);
        if resets.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    resets.sort();
    assert_eq!(
        resets,
        [
            ("llama".to_owned(), 1, first.epoch),
            ("mistral".to_owned(), 1, first.epoch)
        ],
        "the two first lifetimes"
    );
    // Only mistral's spec changes.
    let mut spec = provider("mistral", &epp);
    spec["spec"]["pool"] = json!("pool");
    k8s.replace("inferenceproviders", spec).await;
    op.configured(|d| d.config.providers.iter().any(|p| p.generation == 2))
        .await;
    let mut after = Vec::new();
    for _ in 0..100 {
        after.extend(poll_every_reset(&mut store, first.signals_addr, gateway.clone()).await);
        if after.iter().any(|(_, g, _)| *g == 2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A few more polls: llama's learning must not reset late either.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        after.extend(poll_every_reset(&mut store, first.signals_addr, gateway.clone()).await);
    }
    assert_eq!(
        after,
        [("mistral".to_owned(), 2, first.epoch)],
        "exactly mistral learns afresh, in the running epoch"
    );
    let running = op.started.borrow().clone().unwrap();
    assert_eq!((running.restarts, running.epoch), (0, first.epoch));
    op.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_provider_reads_not_ready_at_the_gateway_at_once_and_is_no_longer_scraped() {
    let (k8s, epp, grid, site) = seeded().await;
    k8s.create("inferenceproviders", provider("mistral", &epp))
        .await;
    let gateway = grid.client(&site.cert, "a", "a");
    let mut op = Controller::start(&k8s, &site).await;
    let first = op.configured(|d| d.config.providers.len() == 2).await;
    let ready_row = |body: &str, provider: &str| {
        body.lines()
            .find(|l| {
                l.starts_with("grid_provider_ready{")
                    && l.contains(&format!("grid_provider=\"{provider}\""))
            })
            .map(str::to_owned)
    };
    eventually("mistral ready at the gateway", 15, || async {
        get_signals(first.signals_addr, gateway.clone())
            .await
            .is_ok_and(|f| ready_row(&text(&f.body), "mistral").is_some_and(|l| l.contains("} 1 ")))
    })
    .await;
    // A slow EPP keeps a pass in flight most of the time, so the deletion lands mid-pass
    // (the case a read right after the hand-over got wrong).
    *epp.behaviour.lock().unwrap() = Behaviour::Delay(Duration::from_millis(300), epp_body(2, 1.0));
    tokio::time::sleep(Duration::from_millis(350)).await;
    k8s.delete("inferenceproviders", "mistral").await;
    let mut in_force = op
        .configured(|d| d.config.providers.len() == 1)
        .await
        .verdicts;
    // The list is handed to the scrape loop, which puts it in force at the end of the
    // pass in flight: the withdrawal is served from then on, within one pass (300 ms
    // here) and well before mistral's readings (stale after 1 s) would have aged out.
    let took = tokio::time::timeout(Duration::from_secs(1), in_force.wait_for(|v| v.len() == 1))
        .await
        .is_ok();
    assert!(
        took,
        "the scrape loop took the new list within the staleness window: {:?}",
        in_force
            .borrow()
            .iter()
            .map(|v| v.provider.name.clone())
            .collect::<Vec<_>>()
    );
    // Its last batch says not ready.
    let fetched = get_signals(first.signals_addr, gateway.clone())
        .await
        .unwrap();
    let row = ready_row(&text(&fetched.body), "mistral").expect("mistral's last readiness");
    assert!(row.contains("} 0 "), "{row}");
    let metrics = get_metrics(first.metrics_addr).await;
    let scrapes = |m: &str| {
        m.lines()
            .filter(|l| l.starts_with("grid_operator_scrapes_total{provider=\"mistral\""))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum::<u64>()
    };
    let before = scrapes(&metrics);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let later = get_metrics(first.metrics_addr).await;
    assert_eq!(scrapes(&later), before, "mistral is no longer scraped");
    assert!(
        later.contains(
            "grid_operator_provider_ready_reason{provider=\"mistral\",reason=\"endpoints_ready\"} 0"
        ),
        "its last reason is no longer exported as current"
    );
    op.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binarys_controller_subcommand_runs_from_the_resources_and_exits_zero_on_sigterm() {
    use grid_kit::daemon_process::Daemon;
    let (k8s, _epp, _grid, site) = seeded().await;
    let d = site.dir.path();
    let path = |f: &str| d.join(f).to_str().unwrap().to_owned();
    let (cert, key, ca) = (path("site.crt"), path("site.key"), path("ca.crt"));
    // No --api-server: the client is the one KUBECONFIG names, the ServiceAccount's.
    let mut op = Daemon::spawn_with_env(
        std::path::Path::new(env!("CARGO_BIN_EXE_grid-operatord")),
        &[
            "controller",
            "--namespace",
            &k8s.ns,
            "--site",
            "a",
            "--cert",
            &cert,
            "--key",
            &key,
            "--ca",
            &ca,
            "--signals-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--identity",
            "pod-0",
        ],
        &[("KUBECONFIG", &k8s.operator_kubeconfig)],
    );
    op.wait_for_line("operator started", Duration::from_secs(20));
    let ready = ready_reason(&k8s, "llama", "EndpointsReady").await;
    assert_eq!(ready["status"], "True");
    assert!(k8s.get("configmaps", "grid-site-a").await.is_some());
    assert_eq!(lease_holder(&k8s).await.as_deref(), Some("pod-0"));
    op.signal("TERM");
    let status = op.wait_exit(Duration::from_secs(15)).expect("it exits");
    assert!(status.success(), "{status:?}\n{}", op.seen.join("\n"));
    assert_eq!(lease_holder(&k8s).await, None, "released at the stop");
    assert!(
        k8s.get("configmaps", "grid-site-a").await.unwrap()["data"]["fences"]
            .as_str()
            .is_some_and(|f| f.contains("llama")),
        "fences persisted"
    );
    assert!(
        op.loud_lines().is_empty(),
        "a healthy run warned:\n{}",
        op.seen.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_lasting_verdict_reaches_the_ready_condition_with_its_reason_and_status() {
    let (k8s, epp, _grid, site) = seeded().await;
    let mut op = Controller::start(&k8s, &site).await;
    op.driver(0).await;
    ready_reason(&k8s, "llama", "EndpointsReady").await;
    let mut oversized = epp_body(2, 1.0);
    oversized.resize(grid_signals::exposition::MAX_EXPOSITION_BYTES + 1, b'\n');
    let cases: Vec<(Behaviour, &str, &str)> = vec![
        (Behaviour::Status(401), "ScrapeUnauthorized", "False"),
        (Behaviour::Hang, "ScrapeTimeout", "False"),
        (
            Behaviour::Body(b"some_other_family 1\n".to_vec()),
            "NoReadySeries",
            "Unknown",
        ),
        (Behaviour::Body(oversized), "ScrapeBodyCap", "Unknown"),
        (Behaviour::Body(epp_body(2, 1.0)), "EndpointsReady", "True"),
    ];
    for (behaviour, reason, status) in cases {
        epp.set(behaviour);
        let c = ready_reason(&k8s, "llama", reason).await;
        assert_eq!(c["status"], status, "{reason}");
        assert_eq!(c["observedGeneration"], 1, "{reason}");
    }
    epp.set(Behaviour::Body(epp_body(0, 0.0)));
    eventually("zero ready endpoints confirmed", 15, || async {
        ready_condition(&k8s, "llama").await.is_some_and(|c| {
            (c["reason"] == "NoReadyEndpoints" && c["status"] == "False")
                || (c["reason"] == "EngineAnswering" && c["status"] == "True")
        })
    })
    .await;
    op.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exit_for_a_mode_change_gives_the_lease_up_for_the_restarted_pod() {
    let (k8s, _epp, _grid, site) = seeded().await;
    let mut op = Controller::start_with(&k8s, &site, Some(election("one"))).await;
    op.driver(0).await;
    assert_eq!(lease_holder(&k8s).await.as_deref(), Some("one"));
    k8s.replace("gridnetworks", network("gossip")).await;
    assert!(matches!(op.ended().await, Err(Error::ModeChanged { .. })));
    assert_eq!(lease_holder(&k8s).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_grid_network_created_after_the_start_with_another_mode_ends_the_operator() {
    let (k8s, _epp, _grid, site) = seeded().await;
    let mut op = Controller::start(&k8s, &site).await;
    op.driver(0).await;
    let mut second = network("gossip");
    second["metadata"]["name"] = json!("staging");
    k8s.create("gridnetworks", second).await;
    match op.ended().await {
        Err(Error::ModeChanged {
            running: "poll",
            declared,
        }) => assert_eq!(declared, "gossip"),
        other => panic!("expected a mode change, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_process_restart_binds_the_same_fixed_ports_again() {
    let (k8s, _epp, grid, site) = seeded_with(network("gossip")).await;
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let (signals, metrics) = (free(), free());
    let client = client(&k8s).await;
    let mut deployment = site.deployment();
    deployment.listen = Listen { signals, metrics };
    let m = ControllerMetrics::new();
    let source = Arc::new(
        KubeConfigSource::start(client.clone(), &k8s.ns, deployment, m.clone())
            .await
            .unwrap(),
    );
    let (tx, started) = watch::channel(None);
    let (stop, stopped) = oneshot::channel::<()>();
    let setup = run::Setup {
        client,
        namespace: k8s.ns.clone(),
        source,
        options: options(),
        metrics: m,
        election: None,
    };
    let done = tokio::spawn(run::run(setup, tx, async {
        let _ = stopped.await;
    }));
    let wait = |restarts: u64| {
        let mut s = started.clone();
        async move {
            tokio::time::timeout(
                Duration::from_secs(15),
                s.wait_for(|d| d.as_ref().is_some_and(|d| d.restarts == restarts)),
            )
            .await
            .unwrap()
            .unwrap()
            .clone()
            .unwrap()
        }
    };
    assert_eq!(wait(0).await.signals_addr, signals);
    // Another scrape interval restarts the driver in-process.
    let mut slower = network("gossip");
    slower["spec"]["intervals"]["scrapeSeconds"] = json!(0.3);
    k8s.replace("gridnetworks", slower).await;
    let second = wait(1).await;
    assert_eq!(
        (second.signals_addr, second.metrics_addr),
        (signals, metrics)
    );
    let gateway = grid.client(&site.cert, "a", "a");
    get_signals(signals, gateway).await.unwrap();
    let _ = stop.send(());
    done.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_reporter_past_the_persisted_capacity_is_refused_as_overflow() {
    let (k8s, _epp, grid, site) = seeded().await;
    let mut op = Controller::start(&k8s, &site).await;
    let d = op.driver(0).await;
    let gateway = grid.client(&site.cert, "a", "a");
    let report_of = |epoch: usize| {
        let mut r = report(1, 1);
        r[1].1 = format!("{:016x}", epoch + 1);
        r
    };
    for epoch in 0..grid_feedback::MAX_REPORTERS {
        let (status, _) = post_ingest(d.signals_addr, gateway.clone(), &report_of(epoch)).await;
        assert_eq!(status, 204, "reporter {epoch}");
    }
    let (status, headers) = post_ingest(
        d.signals_addr,
        gateway,
        &report_of(grid_feedback::MAX_REPORTERS),
    )
    .await;
    assert_ne!(status, 204);
    assert_eq!(headers["x-grid-ingest-refusal"], "overflow");
    let m = get_metrics(d.metrics_addr).await;
    assert_eq!(events(&m, "overflow"), 1, "{m}");
    let held = k8s.get("gridnetworks", "prod").await.unwrap();
    assert_eq!(
        held["status"]["gatewayFeedback"]["reporters"]
            .as_array()
            .unwrap()
            .len(),
        grid_feedback::MAX_REPORTERS
    );
    op.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresolved_gateway_evidence_survives_an_operator_restart_in_the_network_status() {
    let (k8s, _epp, grid, site) = seeded().await;
    let gateway = grid.client(&site.cert, "a", "a");
    let mut op = Controller::start(&k8s, &site).await;
    let d = op.driver(0).await;
    let (status, _) = post_ingest(d.signals_addr, gateway.clone(), &report(1, 3)).await;
    assert_eq!(status, 204);
    let transition = ages_rejected(&k8s).await.unwrap()["lastTransitionTime"].clone();
    op.stop().await.unwrap();
    let mut again = Controller::start(&k8s, &site).await;
    let d = again.driver(0).await;
    let m = get_metrics(d.metrics_addr).await;
    assert!(
        m.lines()
            .any(|l| l == "grid_operator_gateway_ages_rejected 1"),
        "{m}"
    );
    // The exact duplicate is idempotent against the restored evidence.
    let (status, _) = post_ingest(d.signals_addr, gateway, &report(1, 3)).await;
    assert_eq!(status, 204);
    let condition = ages_rejected(&k8s).await.unwrap();
    assert_eq!(condition["status"], "True");
    assert_eq!(
        condition["lastTransitionTime"], transition,
        "no status change, no transition"
    );
    again.stop().await.unwrap();
}

async fn mode_agreed(k8s: &KubeTest) -> Option<Value> {
    let n = k8s.get("gridnetworks", "prod").await?;
    n["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "SignalTransportAgreed")
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_refused_for_another_mode_are_stated_on_the_grid_network_and_so_is_their_end() {
    let k8s = KubeTest::start().await;
    k8s.create("gridnetworks", network("gossip")).await;
    let store = Arc::new(KubeStateStore::new(
        client(&k8s).await,
        &k8s.ns,
        "a",
        "prod",
        ControllerMetrics::new(),
    ));
    let state = |peers: &[&str]| {
        let (store, peers) = (
            store.clone(),
            peers.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>(),
        );
        tokio::task::spawn_blocking(move || store.store_mode_agreement("gossip", &peers))
    };
    // Absent means agreed: a healthy grid never writes it.
    state(&[]).await.unwrap().unwrap();
    assert_eq!(
        (
            mode_agreed(&k8s).await,
            k8s.writes_to("gridnetworks/prod/status")
        ),
        (None, 0)
    );
    state(&["b", "c"]).await.unwrap().unwrap();
    let c = mode_agreed(&k8s).await.expect("stated");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("ModeMismatch"))
    );
    assert!(
        c["message"].as_str().unwrap().ends_with("(gossip): b, c"),
        "{c}"
    );
    let writes = k8s.writes_to("gridnetworks/prod/status");
    state(&["b", "c"]).await.unwrap().unwrap();
    assert_eq!(
        k8s.writes_to("gridnetworks/prod/status"),
        writes,
        "unchanged: not written again"
    );
    state(&[]).await.unwrap().unwrap();
    let c = mode_agreed(&k8s).await.unwrap();
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("True"), Some("ModesAgree"))
    );
}

/// A plain-HTTP GET of `path` at `addr`: the status code and the body, or why not.
async fn probe(addr: std::net::SocketAddr, path: &str) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let exchange = async {
        let mut tcp = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n");
        tcp.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        tcp.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&answer).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .map_err(|_| "no answer within 2 s".to_owned())?
        .map_err(|e| e.to_string())?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not HTTP: {text}"))?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    Ok((code, body))
}

fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_replica_answers_alive_and_not_ready_until_it_holds_the_lease_then_ready_on_the_same_port()
 {
    let (k8s, _epp, _grid, site) = seeded().await;
    let mut one = Controller::start_with(&k8s, &site, Some(election("one"))).await;
    one.driver(0).await;
    let mut standby = site.deployment();
    standby.listen.metrics = free_addr();
    let metrics = standby.listen.metrics;
    let mut two = Controller::start_full(&k8s, standby, Some(election("two")), options()).await;
    eventually("the standby answers its probes", 10, || async {
        probe(metrics, "/healthz")
            .await
            .is_ok_and(|(c, _)| c == 200)
    })
    .await;
    let (code, body) = probe(metrics, "/readyz").await.unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("standby"), "{body}");
    assert!(two.started.borrow().is_none(), "the standby started");
    // The writer dies: the standby takes the Lease, and its driver binds the same port.
    one.done.abort();
    let second = two.driver(0).await;
    assert_eq!(second.metrics_addr, metrics);
    eventually("the new writer is ready", 10, || async {
        probe(metrics, "/readyz").await.is_ok_and(|(c, _)| c == 200)
    })
    .await;
    two.stop().await.unwrap();
}

/// Milliseconds since the Unix epoch of an RFC 3339 time the API server returned.
fn ms_of(time: &Value) -> i64 {
    time.as_str()
        .unwrap()
        .parse::<k8s_openapi::jiff::Timestamp>()
        .unwrap()
        .as_millisecond()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_and_condition_times_are_read_from_the_operators_clock() {
    let (k8s, _epp, _grid, site) = seeded().await;
    // The operator's clock three days behind the host's.
    let behind: i64 = 3 * 24 * 3_600_000;
    let clock = grid_operatord::clock::Clock::system();
    clock.step(-behind);
    let options = Options {
        clock: clock.clone(),
        ..options()
    };
    let mut op =
        Controller::start_full(&k8s, site.deployment(), Some(election("one")), options).await;
    op.driver(0).await;
    let ready = ready_reason(&k8s, "llama", "EndpointsReady").await;
    let lease = k8s.get("leases", "grid-operator-a").await.unwrap();
    let operator_now = i64::try_from(clock.wall_ms()).unwrap();
    let hour = 3_600_000;
    for (what, time) in [
        ("Ready's lastTransitionTime", &ready["lastTransitionTime"]),
        ("the Lease's renewTime", &lease["spec"]["renewTime"]),
        ("the Lease's acquireTime", &lease["spec"]["acquireTime"]),
    ] {
        let t = ms_of(time);
        assert!(
            (operator_now - hour..=operator_now).contains(&t),
            "{what} {time} is not on the operator's clock"
        );
    }
    op.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_are_not_written_over_a_newer_process_of_the_site_without_an_election() {
    use grid_signals::batch::{Fence, FenceRecord, FenceSet};
    let k8s = KubeTest::start().await;
    k8s.create("gridnetworks", network("poll")).await;
    let client = client(&k8s).await;
    let store = || {
        Arc::new(KubeStateStore::new(
            client.clone(),
            &k8s.ns,
            "a",
            "prod",
            ControllerMetrics::new(),
        ))
    };
    let fences = |epoch: u64| FenceSet {
        records: vec![FenceRecord {
            site: "b".into(),
            provider: "llama".into(),
            fence: Fence::new(epoch, 1),
        }],
    };
    let (old, new) = (store(), store());
    let outcome = tokio::task::spawn_blocking(move || {
        // The old process starts at mark 10; a newer one (no Lease between them) at 11.
        old.load_epoch_hwm().unwrap();
        old.store_epoch_hwm(10).unwrap();
        new.load_epoch_hwm().unwrap();
        new.store_epoch_hwm(11).unwrap();
        new.store_fences(&fences(20)).unwrap();
        // The old one's periodic write comes later: it must not land.
        let late = old.store_fences(&fences(5));
        (late.is_err(), new.load_fences().unwrap())
    })
    .await
    .unwrap();
    assert_eq!(outcome, (true, Some(fences(20))));
}

// One thread: every task of this test logs to the subscriber set for it alone.
#[tokio::test(flavor = "current_thread")]
async fn a_second_grid_network_of_the_same_mode_is_warned_of_once_not_at_every_check() {
    let lines = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let writer = {
        let lines = lines.clone();
        move || Capture(lines.clone())
    };
    let subscriber = tracing_subscriber::fmt()
        .with_writer(writer)
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let (k8s, _epp, _grid, site) = seeded().await;
    let mut op = Controller::start(&k8s, &site).await;
    op.driver(0).await;
    let mut second = network("poll");
    second["metadata"]["name"] = json!("staging");
    k8s.create("gridnetworks", second).await;
    let warned = || {
        String::from_utf8_lossy(&lines.lock().unwrap())
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("2 GridNetworks"))
            .count()
    };
    // Many mode checks (every 200 ms here) later, it was said once by each reader.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let early = warned();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        warned(),
        early,
        "{}",
        String::from_utf8_lossy(&lines.lock().unwrap())
    );
    assert!(
        (1..=2).contains(&early),
        "{}",
        String::from_utf8_lossy(&lines.lock().unwrap())
    );
    // Still serving: the same mode is no reason to restart.
    assert_eq!(op.started.borrow().as_ref().unwrap().restarts, 0);
    op.stop().await.unwrap();
}

/// A log writer into a shared buffer.
struct Capture(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
