//! grid-pingora's proxy, a real Pingora server, in front of a local grid (real
//! operators, two simulated sites), driven by the official `openai` Python client: each
//! request lands on the site grid chose, a degraded site loses its share, a shed request
//! is a 429 with Retry-After.

use std::net::SocketAddr;
use std::time::Duration;

use grid_kit::front_end_checks::{self as checks, FrontEnd};
use grid_kit::local_grid::{Cadence, GridSpec, LocalGrid, Shedding, SiteSpec, TransportMode};
use grid_kit::openai_client::openai_requests;
use grid_kit::pingora_proxy::PingoraProxy;
use grid_sim::site_model::SiteConfig;

const MODEL: &str = "llama";
/// Start-up and first readings, generous for a loaded 2-core machine.
const MEASURED_WITHIN: Duration = Duration::from_secs(15);
/// The proxy's start, until it answers a request from grid's view.
const PROXY_READY_WITHIN: Duration = Duration::from_secs(20);

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
            transport: TransportMode::Poll,
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

    async fn stop(mut self) {
        drop(self.proxy.take());
        self.grid.shutdown().await;
    }
}

fn free_loopback_addr() -> SocketAddr {
    grid_kit::ports::loopback_addr()
}

impl FrontEnd for Stack {
    fn grid(&self) -> &LocalGrid {
        &self.grid
    }

    async fn openai(&self, count: usize, stream: bool) -> Vec<serde_json::Value> {
        openai_requests(self.url.clone(), count, stream)
            .await
            .unwrap_or_else(|e| panic!("client failed: {e}"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_streaming_requests_through_pingora_land_on_the_site_grid_chose() {
    let stack = Stack::start(None).await;
    checks::requests_land_on_the_site_grid_chose(&stack).await;
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_site_loses_its_share_of_the_traffic_pingora_sends() {
    let stack = Stack::start(None).await;
    checks::a_degraded_site_loses_its_share(&stack).await;
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_request_through_pingora_is_a_429_with_retry_after_and_the_gateways_body() {
    let stack = Stack::start(Some(checks::SHEDDING)).await;
    checks::a_shed_request_is_a_429_with_retry_after(&stack).await;
    stack.stop().await;
}
