//! A remote site's readiness reaches the gateway at the speed of the local one: REAL
//! `grid-operatord` drivers and the REAL `grid-gatewayd` on loopback, at the daemons'
//! default cadences (scrape 1 s, peer poll 5 s, gateway poll 1 s). Operator `a` polls
//! operator `b` with a bounded long poll that `b` answers as soon as its readiness
//! changes, and the gateway polls operator `a` the same way, so `b` leaving selection
//! (its EPP reading zero ready endpoints) and rejoining it wait for `b`'s next scrape,
//! not for the next peer poll. The same under gossip, the operators' default transport:
//! `b` pushes the batch's version to the members at once and `a` pulls it.

use std::time::Duration;

use grid_kit::local_grid::{GridSpec, LocalGrid, SiteRouting, SiteSpec, TransportMode};
use grid_sim::site_model::SiteConfig;

const MODEL: &str = "llama";
/// Exclusion and rejoin cycles measured, each at another phase of the daemons' timers.
const CYCLES: u64 = 3;
/// The longest a transition may take: one scrape interval and the scrape itself, with
/// room for a loaded 2-core machine; half the peer poll interval, which a transition
/// waited for before (up to a whole one, 3.3 to 5 s measured).
const BOUND: Duration = Duration::from_millis(2_500);

fn site(name: &str) -> SiteSpec {
    SiteSpec::simulated(SiteConfig::new(name, 2, 2), MODEL, 200.0, 11)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_site_leaves_and_rejoins_selection_within_a_scrape_not_a_peer_poll() {
    assert_within_bound(&cycles(TransportMode::Poll).await);
}

/// Under gossip, the operators' default transport, `b`'s readiness change is pushed to
/// the members at once and `a` pulls the batch, which answers its gateway's long poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_gossip_a_remote_site_leaves_and_rejoins_selection_within_a_scrape_too() {
    assert_within_bound(&cycles(TransportMode::Gossip).await);
}

/// Drops and restores `b`'s endpoints [`CYCLES`] times; how long each exclusion and each
/// rejoin took to reach the gateway's view.
async fn cycles(transport: TransportMode) -> Vec<(Duration, Duration)> {
    let spec = GridSpec::at_default_cadences(MODEL, vec![site("a"), site("b")], transport);
    let grid = LocalGrid::start_measured(&spec, Duration::from_secs(30))
        .await
        .expect("grid starts, both sites measured");
    let b = grid.control("b").expect("b is simulated");
    let mut times = Vec::new();
    for i in 0..CYCLES {
        // Engine answers at b, sent past the gateway: its operator keeps
        // `grid_provider_ready` at 1 through the outage, so selection follows the
        // ready-endpoint count alone, and no answer ejects it.
        let mut answered = grid.hold_requests("b", 2, Duration::from_secs(5));
        while answered.join_next().await.is_some() {}
        tokio::time::sleep(Duration::from_millis(1_000 + (i * 373) % 1_000)).await;
        b.drop_all_endpoints();
        let left = grid
            .wait_until("b excluded", BOUND * 4, |g| {
                matches!(g.routing("b"), SiteRouting::Excluded(_))
            })
            .await
            .expect("b leaves selection");
        tokio::time::sleep(Duration::from_millis(500 + (i * 211) % 1_000)).await;
        b.restore();
        let back = grid
            .wait_until("b selectable", BOUND * 4, |g| g.routing("b").selectable())
            .await
            .expect("b rejoins selection");
        println!(
            "{}, cycle {}: excluded after {:.2} s, selectable again after {:.2} s",
            transport.as_str(),
            i + 1,
            left.as_secs_f64(),
            back.as_secs_f64()
        );
        times.push((left, back));
    }
    // The transport is the one asked for: batches pulled under gossip, none under poll.
    let metrics = grid.operator_metrics_addr("a").expect("a's operator runs");
    let (_, text) = grid_kit::llmd::get(&format!("http://{metrics}/metrics"), None)
        .await
        .expect("a's operator serves /metrics");
    let pulled = text
        .lines()
        .find(|l| {
            l.starts_with("grid_operator_gossip_fetches_total{")
                && l.contains("kind=\"batch\"")
                && l.contains("outcome=\"ok\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert_eq!(
        pulled > 0.0,
        transport == TransportMode::Gossip,
        "{} batches pulled under {}",
        pulled,
        transport.as_str()
    );
    grid.shutdown().await;
    times
}

fn assert_within_bound(times: &[(Duration, Duration)]) {
    for (i, (left, back)) in times.iter().enumerate() {
        assert!(
            *left <= BOUND && *back <= BOUND,
            "cycle {}: excluded after {left:?}, back after {back:?} (bound {BOUND:?}): {times:?}",
            i + 1
        );
    }
}
