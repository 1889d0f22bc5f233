//! The proxy comparison (`grid-proxy-compare`, `grid_kit::proxy_compare`) runs end to
//! end: nginx, Envoy and this gateway's binary in front of one instant upstream each
//! answer wrk's and h2load's requests, plain and streamed, and each run yields the
//! figures the table prints. It asserts that the harness measures, not how fast anything
//! is: speed is shown in `docs/benchmarks.md`.

use std::path::Path;
use std::time::Duration;

use grid_kit::proxy_compare::{Client, Lineup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_envoy_and_the_gateway_each_answer_both_generators_and_are_measured() {
    let envoy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/envoy");
    let lineup = Lineup::start(Path::new(env!("CARGO_BIN_EXE_grid-gatewayd")), &envoy, 1)
        .await
        .unwrap();
    for client in [Client::Http1, Client::Http2] {
        for stream in [false, true] {
            let round = lineup
                .round(client, (stream, 4, Duration::from_secs(1)))
                .unwrap();
            for (name, m) in ["nginx", "envoy", "grid"].into_iter().zip(round) {
                let case = format!("{name}, {client:?}, stream {stream}: {m:?}");
                assert!(m.answers > 0, "{case}");
                assert_eq!(m.failed, 0, "{case}");
                assert!(m.rps > 0.0 && m.cpu_us > 0.0 && m.p50_us > 0.0, "{case}");
                assert!(m.p99_us >= m.p50_us, "{case}");
            }
        }
    }
}
