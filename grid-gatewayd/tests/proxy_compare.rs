//! The proxy comparison (`grid-proxy-compare`, `grid_programs::proxy_compare`) runs end to
//! end: nginx, Envoy and this gateway's binary in front of one instant upstream each
//! answer wrk's and h2load's requests, plain and streamed, and each run yields the
//! figures the table prints. It asserts that the harness measures, not how fast anything
//! is: speed is shown in `docs/benchmarks.md`.

use std::path::Path;
use std::time::Duration;

use grid_programs::proxy_compare::{Client, Lineup, Pinning};

/// The CPUs every thread of `pid` may run on, as `/proc` lists them (`0`, `0-1`).
fn cpus_of_threads(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .map(|t| {
            std::fs::read_to_string(t.path().join("status"))
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .unwrap()
                .trim()
                .to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_envoy_and_the_gateway_each_answer_both_generators_and_are_measured() {
    let envoy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/envoy");
    let lineup = Lineup::start(
        Path::new(env!("CARGO_BIN_EXE_grid-gatewayd")),
        &envoy,
        1,
        Pinning::TWO_CORES,
    )
    .await
    .unwrap();
    // Pinned apart: every thread of every proxy (nginx's workers included) on CPU 0, and
    // this process (the upstream, the operator, the generators' parent) on CPU 1.
    for proxy in [&lineup.nginx.0, &lineup.envoy.0, &lineup.grid] {
        let pids = proxy.pids();
        assert!(!pids.is_empty(), "{}", proxy.name);
        for pid in pids {
            let cpus = cpus_of_threads(pid);
            assert!(
                cpus.iter().all(|c| c == "0"),
                "{} {pid}: {cpus:?}",
                proxy.name
            );
        }
    }
    let own = cpus_of_threads(std::process::id());
    assert!(own.iter().all(|c| c == "1"), "{own:?}");
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
