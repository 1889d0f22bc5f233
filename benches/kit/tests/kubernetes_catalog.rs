//! A gateway in Kubernetes follows the grid's resources: with `operator.catalog = true`
//! its model-to-candidates table is its operator's catalog (`GET /v1/site/catalog`),
//! which the operator in controller mode builds from this site's `InferenceProvider`s and
//! the other `GridSite`s, against a real kube-apiserver (`grid_kit::kube_cluster`). A
//! resource added reaches the running gateway and a deleted one leaves it, with no
//! restart of either daemon.

use std::sync::Arc;
use std::time::Duration;

use grid_kit::epp_server::{Behaviour, FakeEpp};
use grid_kit::kube_cluster::KubeTest;
use grid_kit::operator_harness::{DOMAIN, Grid, epp_body, eventually};
use grid_operatord::controller::api::{self, ControllerMetrics};
use grid_operatord::controller::run::{self, StartedDriver};
use grid_operatord::controller::source::KubeConfigSource;
use serde_json::{Value, json};
use tokio::sync::{oneshot, watch};

/// The (site, provider) candidates of each model the gateway routes now, sorted.
fn table(gateway: &grid_gatewayd::driver::Running) -> Vec<(String, Vec<(String, String)>)> {
    let view = gateway.published().load();
    let mut models: Vec<(String, Vec<(String, String)>)> = view
        .catalog()
        .models()
        .iter()
        .map(|m| {
            let mut c: Vec<(String, String)> = m
                .upstreams
                .iter()
                .map(|u| (u.site.to_string(), u.provider.to_string()))
                .collect();
            c.sort();
            (m.name.to_string(), c)
        })
        .collect();
    models.sort();
    models
}

fn entry(model: &str, candidates: &[(&str, &str)]) -> (String, Vec<(String, String)>) {
    (
        model.to_owned(),
        candidates
            .iter()
            .map(|(s, p)| ((*s).to_owned(), (*p).to_owned()))
            .collect(),
    )
}

async fn routes(
    gateway: &grid_gatewayd::driver::Running,
    what: &str,
    want: Vec<(String, Vec<(String, String)>)>,
) {
    eventually(what, 15, || {
        let want = want.clone();
        async move { table(gateway) == want }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grid_site_or_inference_provider_added_reaches_the_gateway_without_a_restart_and_a_deleted_one_leaves()
 {
    let k8s = KubeTest::start().await;
    let grid = Grid::new();
    let a = grid.site("a");
    let epp = FakeEpp::start(Behaviour::Body(epp_body(2, 1.0))).await;
    // No signalTransport: gossip, under which a GridSite added is taken over live.
    k8s.create(
        "gridnetworks",
        json!({"metadata": {"name": "prod"}, "spec": {
            "peerTrust": {"mode": "spiffe", "trustDomain": DOMAIN},
            "intervals": {"scrapeSeconds": 0.2},
        }}),
    )
    .await;
    let provider = |models: &[&str]| -> Value {
        json!({"metadata": {"name": "llama"}, "spec": {
            "metricsConfig": {"endpoint": format!("http://{}", epp.addr)},
            "serving": {"baseUrl": "http://127.0.0.1:9/llama", "models": models},
        }})
    };
    k8s.create("inferenceproviders", provider(&["llama-3"]))
        .await;

    let client = api::client_from(k8s.operator_config().await, &k8s.ns).unwrap();
    let metrics = ControllerMetrics::new();
    let source = Arc::new(
        KubeConfigSource::start(client.clone(), &k8s.ns, a.deployment(), metrics.clone())
            .await
            .unwrap(),
    );
    let (tx, mut started) = watch::channel::<Option<StartedDriver>>(None);
    let (stop, stopped) = oneshot::channel::<()>();
    let setup = run::Setup {
        client,
        namespace: k8s.ns.clone(),
        source,
        options: grid_operatord::driver::Options::default(),
        metrics,
        election: None,
    };
    let operator = tokio::spawn(run::run(setup, tx, async {
        let _ = stopped.await;
    }));
    let op = tokio::time::timeout(Duration::from_secs(15), started.wait_for(Option::is_some))
        .await
        .expect("the operator started")
        .unwrap()
        .clone()
        .unwrap();

    // The gateway lists no model of its own: its operator's catalog gives them.
    let text = a.gateway_text(
        ("127.0.0.1:0", op.signals_addr.port(), 0.2),
        ("unused", "unused", "http://127.0.0.1:9"),
    );
    let text = text.split("[[models]]").next().unwrap().replace(
        "pollIntervalSeconds = 0.2\n",
        "pollIntervalSeconds = 0.2\ncatalog = true\n",
    );
    let config = grid_gateway::config::Config::from_toml_str(&text).unwrap();
    let gateway = grid_gatewayd::driver::start(config).await.unwrap();
    routes(
        &gateway,
        "this site's provider",
        vec![entry("llama-3", &[("a", "llama")])],
    )
    .await;

    // Another site declares what it serves: its candidates join.
    k8s.create(
        "gridsites",
        json!({"metadata": {"name": "b"}, "spec": {
            "signalsEndpoint": "https://127.0.0.1:1/v1/site/signals",
            "serving": {"baseUrl": "https://127.0.0.1:2", "providers": [
                {"name": "llama", "models": ["llama-3", "mistral"]},
            ]},
        }}),
    )
    .await;
    routes(
        &gateway,
        "site b's candidates",
        vec![
            entry("llama-3", &[("a", "llama"), ("b", "llama")]),
            entry("mistral", &[("b", "llama")]),
        ],
    )
    .await;

    // This site's provider gone: only b serves llama-3.
    k8s.delete("inferenceproviders", "llama").await;
    routes(
        &gateway,
        "this site's provider gone",
        vec![
            entry("llama-3", &[("b", "llama")]),
            entry("mistral", &[("b", "llama")]),
        ],
    )
    .await;
    // Site b gone: nothing left to route.
    k8s.delete("gridsites", "b").await;
    routes(&gateway, "site b gone", Vec::new()).await;

    // Neither daemon restarted: the same driver start, and the same gateway.
    let now = started.borrow().clone().unwrap();
    assert_eq!((now.restarts, now.epoch), (0, op.epoch));
    assert!(now.reconfigured >= 3, "{}", now.reconfigured);
    gateway.shutdown().await;
    let _ = stop.send(());
    operator.await.unwrap().unwrap();
}
