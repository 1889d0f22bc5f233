//! Gossip mode between real operators on loopback: an absent mode gossips; batch
//! versions ride SWIM, batches are pulled whole from whoever announced them and pass the
//! same admission as a polled body; nothing is polled.

use std::sync::Arc;
use std::time::Duration;

use grid_kit::epp_server::{Behaviour, FakeEpp};
use grid_kit::operator_harness::{
    Grid, ProviderSpec, Site, epp_body, eventually, get_signals, signals_url,
};
use grid_operatord::config::{Config, TransportMode};
use grid_operatord::driver::{self, Options, Running};
use grid_operatord::gossip::{FetchKind, FetchOutcome};
use grid_operatord::peers::PollOutcome;
use grid_operatord::state::{FileStateStore, StateStore};
use grid_signals::store::DropReason;

/// A peer URL nothing answers at (port 1 on loopback).
const NOWHERE: &str = "https://127.0.0.1:1/v1/site/signals";

async fn start(site: &Site, config: Config) -> Running {
    let state: Arc<dyn StateStore> = Arc::new(FileStateStore::open(site.state_dir()).unwrap());
    driver::start(config, None, state, Options::default())
        .await
        .unwrap()
}

fn gossip_config(site: &Site, peers: &[(&str, String)], providers: &[ProviderSpec]) -> Config {
    let mut config = site.config(peers, providers);
    config.transport = TransportMode::Gossip;
    config
}

/// The relay a site's gateway reads, as text.
async fn relay_of(grid: &Grid, site: &Site, op: &Running) -> String {
    let tls = grid.client(&site.cert, &site.name, &site.name);
    String::from_utf8(get_signals(op.signals_addr, tls).await.unwrap().body).unwrap()
}

/// The metric names of `relay`'s lines for one provider: what a whole batch carries,
/// whatever its sequence and ages.
fn rows(relay: &str, site: &str, provider: &str) -> Vec<String> {
    let needle = format!("grid_site=\"{site}\"");
    let provider = format!("grid_provider=\"{provider}\"");
    relay
        .lines()
        .filter(|l| l.contains(&needle) && l.contains(&provider))
        .map(|l| l.split('{').next().unwrap_or(l).to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_mode_gossips_and_a_batch_too_large_for_a_datagram_reaches_a_site_two_hops_away_whole()
 {
    let grid = Grid::new();
    // The longest names make every row of c's batch long: the batch is then larger than
    // one membership datagram.
    let c_name = "c".repeat(grid_membership::MAX_SITE_NAME_BYTES);
    let qwen = "q".repeat(grid_membership::overlay::MAX_PROVIDER_NAME_BYTES);
    let (a, b, c) = (grid.site("a"), grid.site("b"), grid.site(&c_name));
    let epp_c = FakeEpp::start(Behaviour::Body(epp_body(5, 1.0))).await;
    let op_b = start(
        &b,
        gossip_config(&b, &[("a", NOWHERE.into()), (&c_name, NOWHERE.into())], &[]),
    )
    .await;
    let op_c = start(
        &c,
        gossip_config(
            &c,
            &[("a", NOWHERE.into()), ("b", signals_url(op_b.signals_addr))],
            &[ProviderSpec::of(&qwen, &epp_c)],
        ),
    )
    .await;
    // a's configuration says nothing of the mode: absent means gossip.
    let text = a
        .config_text(
            &[
                ("b", signals_url(op_b.signals_addr)),
                (&c_name, NOWHERE.into()),
            ],
            &[],
        )
        .replace("[signalTransport]\nmode = \"poll\"\n", "");
    let config = Config::from_toml(&text, std::path::Path::new("a.toml")).unwrap();
    assert_eq!(config.transport, TransportMode::Gossip);
    let op_a = start(&a, config).await;

    eventually("c publishes", 10, || {
        let (grid, c, op_c, c_name, qwen) = (&grid, &c, &op_c, &c_name, &qwen);
        async move { !rows(&relay_of(grid, c, op_c).await, c_name, qwen).is_empty() }
    })
    .await;
    let own_c = relay_of(&grid, &c, &op_c).await;
    let c_rows = rows(&own_c, &c_name, &qwen);
    let c_bytes: usize = own_c
        .lines()
        .filter(|l| l.contains(&format!("grid_site=\"{c_name}\"")))
        .map(|l| l.len() + 1)
        .sum();
    assert!(
        c_bytes > grid_membership::MAX_DATAGRAM_BYTES,
        "the test needs a batch larger than a datagram ({c_bytes} bytes)"
    );
    eventually("a's gateway sees c's whole batch", 20, || {
        let (grid, a, op_a, c_rows, c_name, qwen) = (&grid, &a, &op_a, &c_rows, &c_name, &qwen);
        async move { rows(&relay_of(grid, a, op_a).await, c_name, qwen) == *c_rows }
    })
    .await;
    assert!(
        op_a.metrics
            .gossip
            .count(FetchKind::Batch, FetchOutcome::Ok)
            >= 1
    );
    // Nothing was polled: the batches were pulled as their versions were heard.
    for op in [&op_a, &op_b, &op_c] {
        for peer in ["a", "b", c_name.as_str()] {
            assert_eq!(op.metrics.polls.count(peer, PollOutcome::Ok), 0);
        }
    }
    // The batch keeps flowing as c publishes: a's copy advances.
    let seq = |relay: &str| {
        relay
            .lines()
            .find(|l| {
                l.starts_with("grid_provider_config_generation")
                    && l.contains(&format!("grid_site=\"{c_name}\""))
            })
            .and_then(|l| l.split("batch_sequence=\"").nth(1))
            .and_then(|s| s.split('"').next())
            .and_then(|s| s.parse::<u64>().ok())
    };
    let first = seq(&relay_of(&grid, &a, &op_a).await);
    assert!(first.is_some(), "no sequence in a's copy of c");
    eventually("a's copy of c advances", 10, || {
        let (grid, a, op_a) = (&grid, &a, &op_a);
        async move { seq(&relay_of(grid, a, op_a).await) > first }
    })
    .await;
    // c's batches reached a through b signed by c, and a believed every one: a relay
    // passes a signature on whole.
    for op in [&op_a, &op_b] {
        assert_eq!(op.metrics.ingest.dropped(DropReason::Signature), 0);
    }
    // The relay a's gateway reads carries no signature lines: the gateway, reading its
    // own operator, needs none.
    assert!(!relay_of(&grid, &a, &op_a).await.contains("# grid_"));
    drop((op_b, op_c));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_joins_after_the_last_broadcast_of_a_batch_converges_through_digests() {
    let grid = Grid::new();
    let (a, b, c) = (grid.site("a"), grid.site("b"), grid.site("c"));
    let epp_b = FakeEpp::start(Behaviour::Body(epp_body(3, 1.0))).await;
    // b publishes once (its next scrape is an hour away), so its version is broadcast a
    // bounded number of times, to c, and then never again.
    let mut config_b = gossip_config(
        &b,
        &[("a", NOWHERE.into()), ("c", NOWHERE.into())],
        &[ProviderSpec::of("mistral", &epp_b)],
    );
    config_b.scrape_interval = Duration::from_secs(3600);
    let op_b = start(&b, config_b).await;
    let seed = || vec![("a", NOWHERE.into()), ("b", signals_url(op_b.signals_addr))];
    let op_c = start(&c, gossip_config(&c, &seed(), &[])).await;
    eventually("c holds b's batch", 20, || {
        let (grid, c, op_c) = (&grid, &c, &op_c);
        async move { !rows(&relay_of(grid, c, op_c).await, "b", "mistral").is_empty() }
    })
    .await;
    // Long past the broadcast's last transmission (ten in all, four a second).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let seed_a = [("b", signals_url(op_b.signals_addr)), ("c", NOWHERE.into())];
    let op_a = start(&a, gossip_config(&a, &seed_a, &[])).await;
    eventually("the late a holds b's batch", 20, || {
        let (grid, a, op_a) = (&grid, &a, &op_a);
        async move { !rows(&relay_of(grid, a, op_a).await, "b", "mistral").is_empty() }
    })
    .await;
    assert!(
        op_a.metrics
            .gossip
            .count(FetchKind::Digest, FetchOutcome::Ok)
            >= 1
    );
    assert!(
        op_a.metrics
            .gossip
            .count(FetchKind::Batch, FetchOutcome::Ok)
            >= 1
    );
    drop(op_c);
}

/// `grid_provider_ready_endpoints` of `site`'s `provider` in a relay.
fn ready_endpoints(relay: &str, site: &str, provider: &str) -> Option<f64> {
    let (s, p) = (
        format!("grid_site=\"{site}\""),
        format!("grid_provider=\"{provider}\""),
    );
    relay
        .lines()
        .find(|l| {
            l.starts_with("grid_provider_ready_endpoints{") && l.contains(&s) && l.contains(&p)
        })
        .and_then(|l| l.split("} ").nth(1))
        .and_then(|v| v.split(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_one_percent_loss_every_gateway_converges_through_a_partition_a_heal_a_kill_and_a_restart()
 {
    let grid = Grid::new();
    let names = ["a", "b", "c"];
    let sites: Vec<Site> = names.iter().map(|n| grid.site(n)).collect();
    let mut epps = Vec::new();
    for _ in &names {
        epps.push(FakeEpp::start(Behaviour::Body(epp_body(4, 1.0))).await);
    }
    let faults = Arc::new(grid_operatord::membership::LinkFaults::default());
    faults
        .loss_per_mille
        .store(10, std::sync::atomic::Ordering::Relaxed);
    let options = || Options {
        membership_faults: Some(faults.clone()),
        ..Options::default()
    };
    let run = |i: usize, seed: Option<std::net::SocketAddr>| {
        let site = &sites[i];
        let peers: Vec<(&str, String)> = names
            .iter()
            .filter(|n| **n != names[i])
            .map(|n| {
                (
                    *n,
                    seed.filter(|_| *n == "a")
                        .map_or(NOWHERE.into(), signals_url),
                )
            })
            .collect();
        let config = gossip_config(site, &peers, &[ProviderSpec::of("m", &epps[i])]);
        let state: Arc<dyn StateStore> = Arc::new(FileStateStore::open(site.state_dir()).unwrap());
        let options = options();
        async move { driver::start(config, None, state, options).await.unwrap() }
    };
    // b and c know only a's address.
    let op_a = run(0, None).await;
    let a_addr = op_a.signals_addr;
    let mut ops = vec![op_a, run(1, Some(a_addr)).await, run(2, Some(a_addr)).await];

    // Every gateway sees every site's provider with the same reading.
    let agree = |ops: &[Running], expect: [f64; 3]| {
        let views: Vec<_> = ops
            .iter()
            .zip(&sites)
            .map(|(op, s)| (op.signals_addr, grid.client(&s.cert, &s.name, &s.name)))
            .collect();
        async move {
            for (addr, tls) in views {
                let relay = String::from_utf8(get_signals(addr, tls).await.unwrap().body).unwrap();
                for (i, n) in names.iter().enumerate() {
                    if ready_endpoints(&relay, n, "m") != Some(expect[i]) {
                        return false;
                    }
                }
            }
            true
        }
    };
    eventually("every gateway sees every site", 30, || {
        agree(&ops, [4.0, 4.0, 4.0])
    })
    .await;

    // Partition c away; its reading changes to zero endpoints while cut off.
    let c_port = ops[2].signals_addr.port();
    faults.set_cut(c_port, true);
    epps[2].set(Behaviour::Body(epp_body(0, 0.0)));
    eventually("a declares c down", 30, || {
        let v = ops[0].membership.borrow().clone();
        async move { v.down.contains("c") }
    })
    .await;
    // Heal: the zero reaches every gateway.
    faults.set_cut(c_port, false);
    eventually("every gateway sees c's zero after the heal", 30, || {
        agree(&ops, [4.0, 4.0, 0.0])
    })
    .await;

    // Kill b, change a's reading, restart b from its state: b's gateway catches up, and
    // everyone sees b again.
    let b = ops.remove(1);
    drop(b);
    epps[0].set(Behaviour::Body(epp_body(2, 1.0)));
    ops.insert(1, run(1, Some(a_addr)).await);
    eventually("every gateway agrees after b's restart", 30, || {
        agree(&ops, [2.0, 4.0, 0.0])
    })
    .await;
}

/// The status of a GET of `path` on `op` presenting `tls`.
async fn status_of(op: &Running, tls: Arc<rustls::ClientConfig>, path: &str) -> u16 {
    let url = format!("https://127.0.0.1:{}{path}", op.signals_addr.port());
    match grid_daemon::client::fetch(&grid_daemon::client::FetchTarget::new(
        url.parse().unwrap(),
        Duration::from_secs(5),
        Some(tls),
    ))
    .await
    {
        Ok(_) => 200,
        Err(f) => f.status.unwrap_or(0),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_and_digests_are_served_to_peers_only_under_gossip_and_bad_queries_are_counted() {
    use grid_operatord::gossip::{BATCH_PATH, DIGEST_PATH};
    use grid_operatord::signals::Refusal;
    let grid = Grid::new();
    let (a, b) = (grid.site("a"), grid.site("b"));
    let epp = FakeEpp::start(Behaviour::Body(epp_body(2, 1.0))).await;
    let op = start(
        &a,
        gossip_config(&a, &[("b", NOWHERE.into())], &[ProviderSpec::of("m", &epp)]),
    )
    .await;
    let (peer, gateway) = (
        grid.client(&b.cert, "b", "a"),
        grid.client(&a.cert, "a", "a"),
    );
    eventually("a holds its own batch", 10, || {
        let (grid, a, op) = (&grid, &a, &op);
        async move { !rows(&relay_of(grid, a, op).await, "a", "m").is_empty() }
    })
    .await;
    let batch = format!("{BATCH_PATH}?site=a&provider=m");
    assert_eq!(status_of(&op, peer.clone(), &batch).await, 200);
    assert_eq!(status_of(&op, peer.clone(), DIGEST_PATH).await, 200);
    assert_eq!(
        status_of(
            &op,
            peer.clone(),
            &format!("{BATCH_PATH}?site=a&provider=none")
        )
        .await,
        404
    );
    // Several registers in one request: those held are answered.
    assert_eq!(
        status_of(
            &op,
            peer.clone(),
            &format!("{BATCH_PATH}?site=a&provider=none&site=a&provider=m")
        )
        .await,
        200
    );
    assert_eq!(
        status_of(&op, peer.clone(), &format!("{BATCH_PATH}?site=a")).await,
        400
    );
    assert_eq!(op.metrics.refusals.count(Refusal::GossipQuery), 1);
    assert_eq!(status_of(&op, gateway.clone(), &batch).await, 403);
    assert_eq!(status_of(&op, gateway, DIGEST_PATH).await, 403);
    assert_eq!(op.metrics.refusals.count(Refusal::Forbidden), 2);
    // Under poll neither path exists: a peer sees only this site's rows, from
    // `/v1/site/signals`.
    let c = grid.site("c");
    let polling = start(&c, c.config(&[("b", NOWHERE.into())], &[])).await;
    let peer_of_c = grid.client(&b.cert, "b", "c");
    assert_eq!(
        status_of(
            &polling,
            peer_of_c.clone(),
            &format!("{BATCH_PATH}?site=c&provider=m")
        )
        .await,
        404
    );
    assert_eq!(status_of(&polling, peer_of_c, DIGEST_PATH).await, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_site_and_a_gossip_site_refuse_each_other_at_join_and_both_report_the_mismatch() {
    let grid = Grid::new();
    let (a, b) = (grid.site("a"), grid.site("b"));
    // b polls (the harness's default), a gossips; a has b as its seed.
    let op_b = start(&b, b.config(&[("a", NOWHERE.into())], &[])).await;
    let op_a = start(
        &a,
        gossip_config(&a, &[("b", signals_url(op_b.signals_addr))], &[]),
    )
    .await;
    eventually("both sides report the other's mode", 15, || {
        let (op_a, op_b) = (&op_a, &op_b);
        async move { op_a.mode_mismatch.peers() == ["b"] && op_b.mode_mismatch.peers() == ["a"] }
    })
    .await;
    assert_eq!(
        (op_a.mode_mismatch.own(), op_b.mode_mismatch.own()),
        ("gossip", "poll")
    );
    assert!(
        op_b.metrics
            .refusals
            .count(grid_operatord::signals::Refusal::SessionMode)
            >= 1
    );
    let text = grid_kit::operator_harness::get_metrics(op_a.metrics_addr).await;
    assert!(
        text.contains("grid_operator_membership_mode_mismatch 1"),
        "{text}"
    );
    // Refused at join: neither is a member of the other's view.
    assert!(!op_a.membership.borrow().live.contains_key("b"));
    assert!(!op_b.membership.borrow().live.contains_key("a"));
}
