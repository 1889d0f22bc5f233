//! Signal freshness, whole system, at the daemons' default cadences (scrape 1 s, gateway
//! poll 1 s, peer poll 5 s): from the moment a simulated EPP reports zero ready endpoints
//! to the moment the gateway stops routing there (the site leaves its published routing
//! view), and from recovery back to selectable, for the gateway's own site and for a
//! remote one seen through a peer operator. Both polls are bounded long polls answered
//! as soon as the polled operator's readiness changes (`grid_signals::long_poll`), so a
//! transition waits for the site's next scrape, local or remote, not for a poll.
//!
//! It runs twice: the operators on peer long polls, then on gossip (the operators' default
//! transport), where the remote site's readiness change is pushed to the members at once
//! and its batch pulled.
//!
//! Light traffic runs through the gateway meanwhile, as at a real site (its engine
//! answers keep `grid_provider_ready` at 1 through a short outage, so exclusion and rejoin
//! follow the ready-endpoint count). Each cycle starts at a different offset from the
//! daemons' timers.
//!
//! Design figures: within a scrape interval (1 s) and its scrape, local or remote. The
//! poll design ("Polling Cross-Site Load Signals", Provider Readiness) gave about 3 s to
//! exclude and 2 s to rejoin locally, and a remote site about 15 s more while it waited on
//! its operator's 5 s peer poll.
//!
//! `cargo bench -p grid-kit --bench freshness`

use std::sync::Arc;
use std::time::Duration;

use grid_kit::clock::Stopwatch;
use grid_kit::latency::Latencies;
use grid_kit::local_grid::{
    Backend, Cadence, GridSpec, LocalGrid, SiteRouting, SiteSpec, TransportMode,
};
use grid_kit::sim_site::SimSiteConfig;
use grid_kit::traffic::{Rate, Tally, generate};
use grid_sim::site_model::{ServiceTime, SiteConfig};

const MODEL: &str = "fresh";
const LOCAL_CYCLES: u64 = 5;
/// Enough remote cycles for a median and a worst case worth reading.
const REMOTE_CYCLES: u64 = 10;
/// No transition may take longer than this (far above any: a remote one is bounded by
/// its scrape and the two long polls, or by a peer poll interval against an older
/// operator).
const LIMIT: Duration = Duration::from_secs(40);
const TRAFFIC_RPS: f64 = 4.0;

fn site(name: &str) -> SiteSpec {
    let mut config = SiteConfig::new(name, 2, 4);
    config.service = ServiceTime {
        median_ms: 300.0,
        sigma: 0.3,
        prefill_share: 0.2,
        output_tokens: 16,
    };
    SiteSpec {
        name: name.to_owned(),
        backend: Backend::Simulated(SimSiteConfig::new(config, MODEL)),
    }
}

fn seconds(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()))
}

/// Measures `cycles` exclude/rejoin cycles of `name`.
async fn cycles(grid: &LocalGrid, name: &str, cycles: u64) -> (Latencies, Latencies) {
    let control = grid.control(name).expect("simulated site");
    let (mut exclude, mut rejoin) = (Latencies::new(), Latencies::new());
    for i in 0..cycles {
        // A different phase against the 1 s / 5 s timers each cycle.
        tokio::time::sleep(Duration::from_millis(1_000 + (i * 373) % 1_000)).await;
        control.drop_all_endpoints();
        let left = grid
            .wait_until("excluded", LIMIT, |g| {
                matches!(g.routing(name), SiteRouting::Excluded(_))
            })
            .await
            .expect("the site leaves selection");
        exclude.record(left);
        tokio::time::sleep(Duration::from_millis(500 + (i * 211) % 1_000)).await;
        control.restore();
        let back = grid
            .wait_until("selectable", LIMIT, |g| g.routing(name).selectable())
            .await
            .expect("the site rejoins");
        rejoin.record(back);
        println!(
            "  {name} cycle {}: excluded after {:.2} s, selectable again after {:.2} s",
            i + 1,
            left.as_secs_f64(),
            back.as_secs_f64()
        );
    }
    (exclude, rejoin)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // Under both transports, one after the other: peer long polls, then gossip (the
    // operators' default), whose pushed readiness and pulled batch answer the gateway's
    // long poll the same way.
    for transport in [TransportMode::Poll, TransportMode::Gossip] {
        runtime.block_on(measure(transport));
    }
}

async fn measure(transport: TransportMode) {
    let spec = GridSpec::at_default_cadences(MODEL, vec![site("a"), site("b")], transport);
    let grid = LocalGrid::start_measured(&spec, Duration::from_secs(30))
        .await
        .expect("grid starts, both sites measured");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let traffic = tokio::spawn(generate(
        grid.chat_url().parse().unwrap(),
        MODEL.to_owned(),
        Arc::new(Rate::new(TRAFFIC_RPS)),
        Arc::new(parking_lot::Mutex::new(Tally::new(
            grid.site_names().map(str::to_owned).collect(),
        ))),
        Stopwatch::start(),
        7,
        stopped,
    ));
    let c = Cadence::DEFAULT;
    println!(
        "signal freshness under {} at the default cadences (scrape {} ms, gateway poll {} ms, peer poll {} ms), {TRAFFIC_RPS} req/s through the gateway",
        transport.as_str(),
        c.scrape_ms,
        c.gateway_poll_ms,
        c.peer_poll_ms
    );
    let (mut le, mut lr) = cycles(&grid, "a", LOCAL_CYCLES).await;
    let (mut re, mut rr) = cycles(&grid, "b", REMOTE_CYCLES).await;
    println!(
        "{:<22} {:>8} {:>8} {:>8} {:>8}",
        "", "min", "median", "max", "design"
    );
    for (label, l, design) in [
        ("local exclude", &mut le, "~1 s"),
        ("local rejoin", &mut lr, "~1 s"),
        ("remote exclude", &mut re, "~1 s"),
        ("remote rejoin", &mut rr, "~1 s"),
    ] {
        println!(
            "{label:<22} {:>8} {:>8} {:>8} {:>8}",
            seconds(l.quantile(0.0)),
            seconds(l.p50()),
            seconds(l.quantile(1.0)),
            design
        );
    }
    let _ = stop.send(true);
    let _ = traffic.await;
    grid.shutdown().await;
}
