//! Gateway overhead, whole system: the same upstream reached directly and through the real
//! gateway (its real operator feeding it, so routing runs as in production), by an
//! in-process hyper load generator in the same run. Two upstreams: one that answers at
//! once (CPU-bound: what the gateway's proxying costs) and a simulated site whose requests
//! take 20 ms in a slot (upstream-bound, as behind a model server). For HTTP/1.1 and
//! HTTP/2 (client side), streamed and not:
//!
//! - latency: one request at a time, p50 and p99 of the whole answer, and what the gateway
//!   adds;
//! - throughput: a closed loop of `CONCURRENCY` workers, answers per second, and the
//!   ratio through the gateway over direct.
//!
//! Targets: at least 80% of direct throughput, under 200 us added at p50.
//! Everything (generator, gateway, operator, upstream) shares this machine's cores, so the
//! throughput ratio also charges the gateway's CPU to the generator's.
//!
//! `cargo bench -p grid-kit --bench overhead`

use std::time::Duration;

use bytes::Bytes;
use grid_kit::instant_upstream::InstantUpstream;
use grid_kit::latency::Latencies;
use grid_kit::load::{LoadClient, LoopResult, Protocol, chat_body, closed_loop};
use grid_kit::local_grid::{Backend, Cadence, GridSpec, LocalGrid, SiteSpec, TransportMode};
use grid_kit::sim_site::SimSiteConfig;
use grid_sim::site_model::{ServiceTime, SiteConfig};
use http::Uri;

const MODEL: &str = "bench";
/// Length of the one-at-a-time latency phase, per path.
const LATENCY_WINDOW: Duration = Duration::from_secs(2);
/// Workers of the throughput phase.
const CONCURRENCY: usize = 32;
/// Length of one throughput phase, per path.
const THROUGHPUT_WINDOW: Duration = Duration::from_secs(3);
/// Service time of the upstream-bound run's simulated site.
const MODEL_BOUND_SERVICE_MS: f64 = 20.0;
/// Requests sent before each measured phase (connections, caches).
const WARMUP: Duration = Duration::from_millis(300);

fn us(d: Option<Duration>) -> f64 {
    d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e6)
}

struct Case {
    protocol: Protocol,
    stream: bool,
    direct_p50: f64,
    direct_p99: f64,
    via_p50: f64,
    via_p99: f64,
    direct_rps: f64,
    via_rps: f64,
    failed: u64,
}

async fn phase(
    client: &LoadClient,
    uri: &Uri,
    body: &Bytes,
    workers: usize,
    d: Duration,
) -> LoopResult {
    let _ = closed_loop(client, uri, body, workers, WARMUP).await;
    closed_loop(client, uri, body, workers, d).await
}

async fn case(protocol: Protocol, stream: bool, direct: &Uri, via: &Uri) -> Case {
    let client = LoadClient::new(protocol, Duration::from_secs(10));
    let body = chat_body(MODEL, stream);
    let mut d = phase(&client, direct, &body, 1, LATENCY_WINDOW).await;
    let mut v = phase(&client, via, &body, 1, LATENCY_WINDOW).await;
    let dt = phase(&client, direct, &body, CONCURRENCY, THROUGHPUT_WINDOW).await;
    let vt = phase(&client, via, &body, CONCURRENCY, THROUGHPUT_WINDOW).await;
    let lat = |l: &mut Latencies| (us(l.p50()), us(l.p99()));
    let (direct_p50, direct_p99) = lat(&mut d.latencies);
    let (via_p50, via_p99) = lat(&mut v.latencies);
    Case {
        protocol,
        stream,
        direct_p50,
        direct_p99,
        via_p50,
        via_p99,
        direct_rps: dt.throughput(),
        via_rps: vt.throughput(),
        failed: d.failed + v.failed + dt.failed + vt.failed,
    }
}

/// The simulated site of the upstream-bound run: every request takes its service time in
/// a slot, with slots to spare for every worker.
fn model_bound_site() -> SimSiteConfig {
    let mut site = SiteConfig::new("a", 8, 8);
    site.service = ServiceTime {
        median_ms: MODEL_BOUND_SERVICE_MS,
        sigma: 0.0,
        prefill_share: 0.2,
        output_tokens: 8,
    };
    SimSiteConfig::new(site, MODEL)
}

async fn table(title: &str, backend: Backend, direct_base: Option<String>) -> bool {
    let spec = GridSpec {
        model: MODEL.to_owned(),
        sites: vec![SiteSpec {
            name: "a".to_owned(),
            backend,
        }],
        cadence: Cadence::DEFAULT,
        transport: TransportMode::Poll,
        shedding: None,
    };
    let grid = LocalGrid::start_measured(&spec, Duration::from_secs(15))
        .await
        .expect("grid starts, site measured");
    let base = direct_base.unwrap_or_else(|| grid.base_url("a").unwrap().to_owned());
    let direct: Uri = format!("{base}/v1/chat/completions").parse().unwrap();
    let via: Uri = grid.chat_url().parse().unwrap();
    println!(
        "\n{title}: latency one request at a time ({LATENCY_WINDOW:?} per path), throughput {CONCURRENCY} workers ({THROUGHPUT_WINDOW:?} per path)"
    );
    println!(
        "{:<4} {:<6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>10} {:>6} {:>6}",
        "http",
        "stream",
        "p50 dir",
        "p50 gw",
        "+p50",
        "p99 dir",
        "p99 gw",
        "rps dir",
        "rps gw",
        "ratio",
        "+cpu/req",
        "target",
        "failed"
    );
    let mut all_met = true;
    for protocol in [Protocol::Http1, Protocol::Http2] {
        for stream in [false, true] {
            let c = case(protocol, stream, &direct, &via).await;
            let ratio = c.via_rps / c.direct_rps;
            let added_p50 = c.via_p50 - c.direct_p50;
            let met = ratio >= 0.8 && added_p50 < 200.0;
            all_met &= met;
            // Extra machine time per answer in the closed loop (both cores), when the
            // loop is CPU-bound: what the gateway's proxying costs.
            let extra_us = (1.0 / c.via_rps - 1.0 / c.direct_rps) * 1e6;
            println!(
                "{:<4} {:<6} {:>7.0}us {:>7.0}us {:>7.0}us {:>7.0}us {:>7.0}us {:>9.0} {:>9.0} {:>6.1}% {:>8.0}us {:>6} {:>6}",
                c.protocol.as_str(),
                c.stream,
                c.direct_p50,
                c.via_p50,
                added_p50,
                c.direct_p99,
                c.via_p99,
                c.direct_rps,
                c.via_rps,
                100.0 * ratio,
                extra_us,
                if met { "met" } else { "MISSED" },
                c.failed
            );
        }
    }
    grid.shutdown().await;
    all_met
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let upstream = InstantUpstream::start(MODEL).await.expect("upstream");
        let cpu_bound = table(
            "CPU-bound: an upstream that answers at once (generator, gateway, operator and upstream share the cores)",
            Backend::External(upstream.base_url()),
            Some(upstream.base_url()),
        )
        .await;
        let model_bound = table(
            &format!(
                "upstream-bound: a simulated site, {MODEL_BOUND_SERVICE_MS} ms per request in one of 64 slots"
            ),
            Backend::Simulated(model_bound_site()),
            None,
        )
        .await;
        println!(
            "\ntargets (>= 80% of direct throughput, < 200 us added p50): CPU-bound {}, upstream-bound {}",
            if cpu_bound { "all met" } else { "not all met" },
            if model_bound { "all met" } else { "not all met" }
        );
    });
}
