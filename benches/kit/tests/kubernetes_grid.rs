//! Three Kubernetes clusters on one machine (`grid_kit::kube_grid`): each site in a
//! network namespace of its own with its own etcd and kube-apiserver, configured only by
//! applying the example manifests with its names, running its operator in controller
//! mode (gossip, the default), its simulated model server and its gateway. Needs root
//! (network namespaces), as the fault suite does.

use std::collections::BTreeMap;
use std::time::Duration;

use grid_daemon::tls::Fingerprint;
use grid_kit::kube_grid::{
    GATEWAY_PORT, KubeGrid, METRICS_PORT, SiteSpec, Traffic, apply_secret, mint_site,
};

/// (endpoints, slots) of sites a, b and c: capacities 2, 4 and 8.
const SIZES: [(usize, usize); 3] = [(1, 2), (2, 2), (4, 2)];
const REQUESTS: usize = 60;
const CONCURRENCY: usize = 12;
const TIMEOUT: Duration = Duration::from_secs(30);

/// What was lost so far: requests not answered, and persisted state that went back.
#[derive(Debug, Default)]
struct Ledger {
    rows: Vec<(String, u64, u64, u64)>,
    marks: BTreeMap<String, u64>,
    fences: BTreeMap<(String, String, String), (u64, u64)>,
}

impl Ledger {
    /// Records one phase: its traffic, and whether any site's mark or fence went back.
    fn phase(&mut self, name: &str, traffic: &[Traffic], grid: &KubeGrid) {
        let sent: u64 = traffic.iter().map(|t| t.total() + t.lost()).sum();
        let lost: u64 = traffic.iter().map(Traffic::lost).sum();
        let mut regressions = 0;
        for (holder, mark, fences) in grid.state() {
            if let Some(m) = mark {
                let seen = self.marks.entry(holder.clone()).or_insert(m);
                regressions += u64::from(m < *seen);
                *seen = (*seen).max(m);
            }
            for ((site, provider), f) in fences {
                let seen = self
                    .fences
                    .entry((holder.clone(), site, provider))
                    .or_insert(f);
                regressions += u64::from(f < *seen);
                *seen = (*seen).max(f);
            }
        }
        eprintln!(
            "{name:<24} sent {sent:>4} lost {lost:>2} state regressions {regressions} {traffic:?}"
        );
        self.rows.push((name.to_owned(), sent, lost, regressions));
    }

    fn nothing_lost(&self) -> bool {
        self.rows
            .iter()
            .all(|(_, _, lost, back)| *lost == 0 && *back == 0)
    }
}

/// The inspection commands of docs/kubernetes.md, in every cluster.
fn inspect(grid: &KubeGrid) {
    for s in &grid.sites {
        let kubectl = |args: &[&str]| {
            let mut all = vec!["-n", s.namespace.as_str()];
            all.extend_from_slice(args);
            s.cluster.kubectl(&all, None).unwrap()
        };
        let listed = kubectl(&["get", "gridnetworks,gridsites,inferenceproviders"]);
        for name in [
            "gridnetwork.grid.llm-d.io/prod",
            "gridsite.grid.llm-d.io/c",
            "inferenceprovider.grid.llm-d.io/llama",
        ] {
            assert!(listed.contains(name), "{name}: {listed}");
        }
        let conditions = kubectl(&[
            "get",
            "inferenceprovider",
            "llama",
            "-o",
            "jsonpath={.status.conditions}",
        ]);
        assert!(conditions.contains("\"status\":\"True\""), "{conditions}");
        let state = kubectl(&[
            "get",
            "configmap",
            &format!("grid-site-{}", s.name),
            "-o",
            "yaml",
        ]);
        assert!(state.contains("publisherEpochHighWaterMark"), "{state}");
        let lease = kubectl(&[
            "get",
            "lease",
            &format!("grid-operator-{}", s.name),
            "-o",
            "yaml",
        ]);
        assert!(
            lease.contains(&format!("holderIdentity: grid-operator-{}-1", s.name)),
            "{lease}"
        );
    }
}

/// Traffic from the gateways of `sites`, all at once.
async fn from_every_site(grid: &KubeGrid, sites: &[usize]) -> Vec<Traffic> {
    futures::future::join_all(
        sites
            .iter()
            .map(|&i| grid.traffic(i, REQUESTS, CONCURRENCY, TIMEOUT)),
    )
    .await
}

/// Site a's certificate rotated through its Secret: the new pin is added to `GridSite` a
/// in every cluster first, then the Secret changes (and is projected as a kubelet would),
/// both of a's daemons present the new pair, then the old pin goes.
async fn rotate_site_a(grid: &mut KubeGrid) {
    let old = Fingerprint::of_der(&grid.sites[0].cert.cert).to_string();
    let next = mint_site(&grid.ca, "a");
    let new = Fingerprint::of_der(&next.cert).to_string();
    let pin = |grid: &KubeGrid, pins: &[&str]| {
        let patch = serde_json::json!({"spec": {"fingerprints": pins}}).to_string();
        for s in &grid.sites {
            s.cluster
                .kubectl(
                    &[
                        "patch",
                        "gridsite",
                        "a",
                        "-n",
                        &s.namespace,
                        "--type",
                        "merge",
                        "-p",
                        &patch,
                    ],
                    None,
                )
                .unwrap();
        }
    };
    pin(grid, &[&old, &new]);
    apply_secret(&grid.sites[0], &next, &grid.ca, grid.dir.path()).unwrap();
    grid.project_secret(0).unwrap();
    grid.sites[0].cert = next;
    // Both of a's daemons check their files every 5 s and present the new pair.
    for (port, series) in [
        (
            METRICS_PORT,
            "grid_operator_certificate_reloads_total{result=\"rotated\"} 1",
        ),
        (
            GATEWAY_PORT,
            "grid_gateway_certificate_reloads_total{result=\"rotated\"} 1",
        ),
    ] {
        let mut seen = false;
        for _ in 0..40 {
            seen = grid
                .metrics(0, port)
                .await
                .is_ok_and(|m| m.lines().any(|l| l == series));
            if seen {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(seen, "{series} within 20 s");
    }
    pin(grid, &[&new]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_clusters_form_a_grid_from_the_example_manifests_spread_traffic_by_capacity_and_lose_nothing_through_a_kill_a_partition_and_a_rotation()
 {
    let specs = SiteSpec::sized(&SIZES);
    let mut grid = KubeGrid::start(&specs).await.expect("three clusters");
    let formed = grid.wait_formed(Duration::from_secs(40)).await.unwrap();
    eprintln!("formed from the resources in {formed:?}");
    let mut ledger = Ledger::default();
    inspect(&grid);

    // A first round lets every gateway learn the sites' capacities from their answers.
    let warm = from_every_site(&grid, &[0, 1, 2]).await;
    ledger.phase("formed, first round", &warm, &grid);
    // Then traffic spreads by capacity: c (8 slots) serves more than a (2), and every
    // gateway reaches every site. Each round holds 36 requests on 14 slots, so every
    // site queues: a gateway that has not heard from a queued site for longer than its
    // turnover reads it draining no faster than that silence, and a remote gateway may
    // rightly send a small site its own gateway keeps full none of a round's 60. Over
    // both rounds every gateway has sent to every site.
    let traffic = from_every_site(&grid, &[0, 1, 2]).await;
    let by = |s: &str| -> u64 {
        traffic
            .iter()
            .map(|t| t.answered.get(s).copied().unwrap_or(0))
            .sum()
    };
    assert!(by("c") > by("a"), "by capacity: {traffic:?}");
    for (first, then) in warm.iter().zip(&traffic) {
        let reached: std::collections::BTreeSet<&String> =
            first.answered.keys().chain(then.answered.keys()).collect();
        assert_eq!(reached.len(), 3, "every site serves: {first:?} {then:?}");
    }
    ledger.phase("formed, learned", &traffic, &grid);

    // Site b's operator killed: its Lease lapses, a new replica takes over, above the
    // dead one's mark; meanwhile nothing is lost.
    let before = grid
        .operator_running(1, Duration::from_secs(5))
        .await
        .unwrap();
    grid.kill_operator(1);
    let during = from_every_site(&grid, &[0, 1, 2]).await;
    ledger.phase("b's operator killed", &during, &grid);
    grid.start_operator(1).unwrap();
    let after = grid
        .operator_running(1, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        after.epoch > before.epoch,
        "a new epoch above the dead one's"
    );
    grid.wait_formed(Duration::from_secs(60)).await.unwrap();
    let back = from_every_site(&grid, &[0, 1, 2]).await;
    ledger.phase("b's operator replaced", &back, &grid);

    // Site c partitioned: a and b go on serving, with nothing lost.
    grid.set_link(2, false).unwrap();
    let cut = from_every_site(&grid, &[0, 1]).await;
    ledger.phase("c partitioned", &cut, &grid);
    grid.set_link(2, true).unwrap();
    grid.wait_formed(Duration::from_secs(60)).await.unwrap();
    let healed = from_every_site(&grid, &[0, 1, 2]).await;
    ledger.phase("c back", &healed, &grid);

    rotate_site_a(&mut grid).await;
    grid.wait_formed(Duration::from_secs(60)).await.unwrap();
    let rotated = from_every_site(&grid, &[0, 1, 2]).await;
    ledger.phase("a's certificate rotated", &rotated, &grid);

    assert!(ledger.nothing_lost(), "{:#?}", ledger.rows);
    grid.stop().await;
}
