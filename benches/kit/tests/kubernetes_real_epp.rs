//! The Kubernetes grid (`grid_kit::kube_grid`) with llm-d's real programs as each site's
//! model server: two clusters, each a site in a network namespace of its own with its own
//! etcd and kube-apiserver, configured only by applying the example manifests, its
//! operator in controller mode and its gateway from the applied `ConfigMap`. In each, the
//! real EPP watches the site's `InferencePool` (the example provider's `pool`) on that
//! API server, real inference simulators are the pool's `Pod`s, and Envoy is the EPP's
//! data path: what the provider's `serving.baseUrl` and the site's serving front name.
//! Needs root (network namespaces) and the peers `.ci/install` builds.

use std::time::Duration;

use grid_kit::clock::Stopwatch;
use grid_kit::kube_grid::{EXAMPLE_POOL, KubeGrid, METRICS_PORT, SiteSpec, Traffic};
use grid_kit::llmd::{LlmdSpec, SimSpec};

const REQUESTS: usize = 20;
/// Requests in flight from each gateway at once, idle: eight on the grid's eight slots.
const CONCURRENCY: usize = 4;
/// The same while a is loaded: four, which b's four slots serve with no queue.
const LOADED_CONCURRENCY: usize = 2;
const TIMEOUT: Duration = Duration::from_secs(60);
/// Clients holding site a's simulators busy, and each request's length in tokens (20 ms
/// apart, 6 s): each client sends its next request as the last ends, so a's four slots
/// stay full and its queue holds twelve for as long as the observation takes, however
/// long a loaded machine makes it. A round request sent to a (a gateway still tries a
/// site it holds loaded, now and then) waits behind them: twelve on four slots at 6 s
/// each is 18 s before it starts, a third of the client's `TIMEOUT` (at 12 s each it was
/// 36 s, and one such request on a loaded CI machine was not answered within 60 s).
const HELD: usize = 16;
const HELD_TOKENS: u32 = 300;
/// How long a holding client goes on sending: past any observation the test allows (15 s
/// to see the load, 2 s, and two rounds bounded by their timeout).
const HOLD_LIMIT: Duration = Duration::from_secs(240);

/// A simulator that runs two requests at once and writes a token every 20 ms.
fn slow_sim() -> SimSpec {
    SimSpec {
        max_num_seqs: 2,
        ttft: Duration::from_millis(100),
        inter_token: Duration::from_millis(20),
    }
}

/// The value of `name` for site `site`'s provider on an operator's `/metrics`, if there.
fn series(metrics: &str, name: &str, site: &str) -> Option<f64> {
    let prefix = format!("{name}{{");
    metrics.lines().find_map(|l| {
        (l.starts_with(&prefix) && l.contains(&format!("grid_site=\"{site}\"")))
            .then(|| l.rsplit(' ').next()?.parse().ok())
            .flatten()
    })
}

/// One round from both gateways at once, plain or streamed, each `concurrency` at a
/// time.
async fn round(grid: &KubeGrid, stream: bool, concurrency: usize) -> [Traffic; 2] {
    let send = |i| async move {
        if stream {
            grid.traffic_streamed(i, REQUESTS, concurrency, TIMEOUT)
                .await
        } else {
            grid.traffic(i, REQUESTS, concurrency, TIMEOUT).await
        }
    };
    let (a, b) = tokio::join!(send(0), send(1));
    [a, b]
}

fn to(t: &Traffic, site: &str) -> u64 {
    t.answered.get(site).copied().unwrap_or(0)
}

/// Each site's provider is ready with its EPP's two pods on its operator's series, and
/// its `InferenceProvider`'s Ready condition says so.
async fn every_provider_ready_with_two_pods(grid: &KubeGrid) {
    for (i, s) in grid.sites.iter().enumerate() {
        let m = grid.metrics(i, METRICS_PORT).await.unwrap();
        assert_eq!(
            series(&m, "grid_provider_ready_endpoints", &s.name),
            Some(2.0),
            "site {}: {m}",
            s.name
        );
        // Written by the operator once its verdict is in: within a few seconds.
        let conditions = || {
            s.cluster
                .kubectl(
                    &[
                        "-n",
                        &s.namespace,
                        "get",
                        "inferenceprovider",
                        "llama",
                        "-o",
                        "jsonpath={.status.conditions}",
                    ],
                    None,
                )
                .unwrap_or_default()
        };
        grid_kit::llmd::wait_until(
            "the Ready condition written",
            Duration::from_secs(10),
            || async { conditions().contains("EndpointsReady") },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", conditions()));
    }
}

/// Over `rounds`, each gateway's plain and its streamed requests both reached both sites.
fn every_gateway_reached_both_sites(grid: &KubeGrid, rounds: &[(bool, [Traffic; 2])]) {
    for (i, s) in grid.sites.iter().enumerate() {
        for stream in [false, true] {
            let reached: Vec<&str> = ["a", "b"]
                .into_iter()
                .filter(|site| {
                    rounds
                        .iter()
                        .filter(|(st, _)| *st == stream)
                        .any(|(_, t)| to(&t[i], site) > 0)
                })
                .collect();
            assert_eq!(
                reached,
                ["a", "b"],
                "gateway {} (streamed: {stream}): {rounds:?}",
                s.name
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_serving_from_the_real_epp_and_simulators_reach_both_sites_plain_and_streamed_shift_traffic_off_the_loaded_one_and_lose_nothing()
 {
    let began = Stopwatch::start();
    let specs: Vec<SiteSpec> = ["a", "b"]
        .iter()
        .map(|name| {
            let mut spec = LlmdSpec::new(EXAMPLE_POOL, 2);
            spec.sims = vec![slow_sim(); 2];
            SiteSpec::llmd(name, spec)
        })
        .collect();
    let grid = KubeGrid::start(&specs).await.expect("two clusters");
    let formed = grid.wait_formed(Duration::from_secs(60)).await.unwrap();
    eprintln!(
        "formed from the resources {formed:?} after the sites started ({:?} in all)",
        began.elapsed()
    );
    // Each site's provider ready with its EPP's two pods, as its operator scraped them,
    // and so written on its InferenceProvider.
    every_provider_ready_with_two_pods(&grid).await;

    // Idle, every gateway's plain and streamed requests reach both sites: its own
    // through the provider's Envoy, the other's through that site's serving front.
    let mut rounds = Vec::new();
    for stream in [false, true, false, true] {
        rounds.push((stream, round(&grid, stream, CONCURRENCY).await));
    }
    eprintln!("idle: {rounds:?}");
    every_gateway_reached_both_sites(&grid, &rounds);

    // Site a's simulators loaded from outside the grid, through its Envoy: once both
    // operators hold a's load, both gateways send their requests to b.
    let site_a = grid.sites[0].llmd().expect("an llm-d site");
    let hold_began = Stopwatch::start();
    let hold = futures::future::join_all((0..HELD).map(|_| async {
        let mut answers = Vec::new();
        while hold_began.elapsed() < HOLD_LIMIT {
            answers.push(
                site_a
                    .chat(false, HELD_TOKENS, Duration::from_secs(90))
                    .await,
            );
        }
        answers
    }));
    let observe = async {
        let seen = Stopwatch::start();
        grid_kit::llmd::wait_until(
            "a's load in both operators",
            Duration::from_secs(15),
            || async {
                let mut both = true;
                for i in 0..2 {
                    let m = grid.metrics(i, METRICS_PORT).await.unwrap_or_default();
                    both &= series(&m, "grid_provider_in_flight_requests", "a")
                        .is_some_and(|v| v >= 8.0);
                }
                both
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", site_a.logs()));
        let held_seen = seen.elapsed();
        // The gateways poll their operators every second (the example ConfigMap).
        tokio::time::sleep(Duration::from_secs(2)).await;
        let plain = round(&grid, false, LOADED_CONCURRENCY).await;
        let streamed = round(&grid, true, LOADED_CONCURRENCY).await;
        (held_seen, plain, streamed)
    };
    // The held requests are a's other clients': they stop when the rounds are done.
    let (held_seen, plain, streamed) = tokio::select! {
        observed = observe => observed,
        held = hold => panic!("a was held {HOLD_LIMIT:?} and the rounds had not ended: {held:?}"),
    };
    eprintln!("a's load held in both operators {held_seen:?} after it began");
    eprintln!("a loaded: plain {plain:?}, streamed {streamed:?}");
    // Idle, each gateway split its rounds about evenly; loaded, three in four or more go
    // to b (a's share is what a gateway still tries of a site it holds loaded).
    for t in plain.iter().chain(&streamed) {
        assert!(
            to(t, "b") >= 15,
            "b serves what a cannot: plain {plain:?}, streamed {streamed:?}"
        );
    }

    // Nothing lost, idle or loaded, plain or streamed.
    let all: Vec<&Traffic> = rounds
        .iter()
        .flat_map(|(_, t)| t.iter())
        .chain(&plain)
        .chain(&streamed)
        .collect();
    let lost: u64 = all.iter().map(|t| t.lost()).sum();
    let answered: u64 = all.iter().map(|t| t.total()).sum();
    assert_eq!(lost, 0, "{all:?}");
    assert_eq!(answered, (all.len() * REQUESTS) as u64);
    eprintln!("{answered} answered, none lost, in {:?}", began.elapsed());
    grid.stop().await;
}
