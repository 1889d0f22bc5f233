//! grid-pingora's proxy, a real Pingora server, in front of a local grid (real
//! operators, two simulated sites), driven by the official `openai` Python client: each
//! request lands on the site grid chose, a degraded site loses its share, a shed request
//! is a 429 with Retry-After.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use grid_kit::local_grid::{Cadence, GridSpec, LocalGrid, Shedding, SiteSpec};
use grid_kit::openai_client::{answered_by, openai_requests};
use grid_kit::pingora_proxy::PingoraProxy;
use grid_sim::site_model::SiteConfig;

const MODEL: &str = "llama";
/// Start-up and first readings, generous for a loaded 2-core machine.
const MEASURED_WITHIN: Duration = Duration::from_secs(15);
/// The proxy's start, until it answers a request from grid's view.
const PROXY_READY_WITHIN: Duration = Duration::from_secs(20);
/// How long a change at a site may take to reach routing: a scrape, a poll, the refresh.
const SEEN_WITHIN: Duration = Duration::from_secs(10);

fn site(name: &str) -> SiteSpec {
    SiteSpec::simulated(SiteConfig::new(name, 2, 2), MODEL, 50.0, 7)
}

/// A local grid of sites `a` and `b` and `grid-pingora` reading its gateway's
/// configuration.
struct Stack {
    grid: LocalGrid,
    /// Stopped when dropped: a failed test leaves no proxy running.
    proxy: Option<PingoraProxy>,
    url: String,
}

impl Stack {
    async fn start(shedding: Option<Shedding>) -> Self {
        let spec = GridSpec {
            model: MODEL.to_owned(),
            sites: vec![site("a"), site("b")],
            cadence: Cadence::FAST,
            shedding,
        };
        let grid = LocalGrid::start_measured(&spec, MEASURED_WITHIN)
            .await
            .expect("grid starts, both sites measured");
        let listen = free_loopback_addr();
        let mut config = grid_gateway::Config::from_toml_str(&grid.gateway_toml(listen))
            .expect("the grid's gateway configuration");
        config.body_limit_bytes = grid_pingora::MAX_REPLAYED_BODY_BYTES;
        let proxy = PingoraProxy::start(&config).expect("grid-pingora starts");
        let stack = Self {
            grid,
            proxy: Some(proxy),
            url: format!("http://{listen}/v1"),
        };
        stack.wait_routed().await;
        stack
    }

    /// Until the proxy answers a request from grid's view (its poller has published).
    async fn wait_routed(&self) {
        let clock = grid_kit::clock::Stopwatch::start();
        loop {
            if let Ok(lines) = openai_requests(self.url.clone(), 1, false).await
                && lines.first().is_some_and(|l| l["status"] == 200)
            {
                return;
            }
            assert!(
                clock.elapsed() < PROXY_READY_WITHIN,
                "grid-pingora routed nothing within {PROXY_READY_WITHIN:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn openai(&self, count: usize, stream: bool) -> Vec<serde_json::Value> {
        openai_requests(self.url.clone(), count, stream)
            .await
            .unwrap_or_else(|e| panic!("client failed: {e}"))
    }

    /// Answers served by each site (`x-grid-site` of the 200s).
    async fn shares(&self, count: usize) -> HashMap<String, u64> {
        answered_by(&self.openai(count, false).await)
    }

    fn served(&self, site: &str) -> u64 {
        self.grid.control(site).unwrap().stats().requests
    }

    async fn stop(mut self) {
        drop(self.proxy.take());
        self.grid.shutdown().await;
    }
}

fn free_loopback_addr() -> SocketAddr {
    grid_kit::ports::loopback_addr()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_streaming_requests_through_pingora_land_on_the_site_grid_chose() {
    let stack = Stack::start(None).await;
    let before = (stack.served("a"), stack.served("b"));
    let mut lines = stack.openai(12, false).await;
    lines.extend(stack.openai(4, true).await);
    let chosen = answered_by(&lines);
    assert_eq!(
        (stack.served("a") - before.0, stack.served("b") - before.1),
        (
            chosen.get("a").copied().unwrap_or(0),
            chosen.get("b").copied().unwrap_or(0)
        ),
        "each site served exactly the requests grid named it for: {chosen:?}"
    );
    assert_eq!(chosen.len(), 2, "both idle sites take traffic: {chosen:?}");
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_site_loses_its_share_of_the_traffic_pingora_sends() {
    let stack = Stack::start(None).await;
    // Site a backs up (5 s a request, filled three times over behind the proxy's back): its
    // EPP reports the queue, its operator relays it, grid's selection routes around it.
    let _held = stack
        .grid
        .back_up("a", SEEN_WITHIN)
        .await
        .expect("the gateway sees a's queue");
    let after = stack.shares(20).await;
    let on_b = after.get("b").copied().unwrap_or(0);
    assert!(on_b >= 18, "traffic did not leave a: {after:?}");
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_request_through_pingora_is_a_429_with_retry_after_and_the_gateways_body() {
    let stack = Stack::start(Some(Shedding {
        full_after_ms: 300,
        room_after_ms: 2_000,
        retry_after_s: 2,
    }))
    .await;
    // Both sites filled behind the proxy's back until grid sheds.
    let mut held = Vec::new();
    for name in ["a", "b"] {
        stack.grid.control(name).unwrap().degrade(50.0).unwrap();
        held.push(stack.grid.hold_requests(name, 16, Duration::from_secs(60)));
    }
    stack
        .grid
        .wait_until("grid sheds", SEEN_WITHIN, LocalGrid::shedding)
        .await
        .expect("grid sheds once both sites are full");
    let lines = stack.openai(1, false).await;
    let line = &lines[0];
    assert_eq!(line["status"], 429, "{line}");
    assert_eq!(line["code"], "shedding", "{line}");
    assert_eq!(line["type"], "rate_limit_error", "{line}");
    assert_eq!(line["retry_after"], "2", "{line}");
    stack.stop().await;
}
