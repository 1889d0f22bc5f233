//! What grid reads from each real EPP exposition in the shared fixtures: the names and
//! labels `grid_signals::epp` recognizes, checked against the EPP's own test data.

use std::path::PathBuf;

use grid_signals::epp::{
    PoolSelector, ProviderConfig, ProviderTracker, ReadyStatus, SampleRejection, ScrapeReading,
    ScrapeTiming, read_scrape,
};
use grid_signals::exposition::parse_strict;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/epp")
}

fn fixture(name: &str) -> Vec<u8> {
    let path = fixture_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn read_fixture(name: &str) -> ScrapeReading {
    let body = fixture(name);
    let samples = parse_strict(&body).unwrap_or_else(|e| panic!("{name}: {e}"));
    read_scrape(&samples, &PoolSelector::All)
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

/// Files carrying a series grid reads, with what it reads from each.
const READ: &[&str] = &[
    "kv_cache_avg_metrics",
    "llm_d_kv_cache_std_dev_metrics",
    "llm_d_running_requests_avg_metrics",
    "queue_avg_size_metrics",
    "request_total_metric",
    "llm_d_request_ttft_seconds_metric",
    "request_ttft_seconds_metric",
    "llm_d_request_tpot_seconds_metric",
];

type Check = fn(&ScrapeReading) -> bool;

#[test]
fn each_fixture_series_grid_reads_gives_its_value() {
    let cases: &[(&str, Check)] = &[
        (
            "kv_cache_avg_metrics: old inference_pool_average_kv_cache_utilization{name}",
            |r| r.pools_seen == 1 && close(r.average_kv_cache, 0.3) && r.ready_endpoints.is_none(),
        ),
        (
            "llm_d_kv_cache_std_dev_metrics: llm_d_epp_std_dev_kv_cache_utilization{name}",
            |r| close(r.std_dev_kv_cache, 0.1),
        ),
        (
            "llm_d_running_requests_avg_metrics: llm_d_epp_average_running_requests{name}",
            |r| close(r.average_running, 0.5),
        ),
        (
            "queue_avg_size_metrics: old inference_pool_average_queue_size{name}",
            |r| close(r.average_queue, 0.4),
        ),
        (
            "request_total_metric: old inference_objective_request_total summed over models",
            |r| close(r.counters.requests, 4.0) && r.counters.errors.is_none(),
        ),
        (
            "llm_d_request_ttft_seconds_metric: old TTFT histogram, le 1.0/1 and Inf/+Inf merged",
            |r| {
                r.counters.ttft.as_ref().is_some_and(|h| {
                    h.buckets.len() == 36
                        && h.buckets.last() == Some(&(f64::INFINITY, 4.0))
                        && (h.count - 4.0).abs() < 1e-9
                        && (h.sum - 1.79).abs() < 1e-9
                })
            },
        ),
        (
            "request_ttft_seconds_metric: the same histogram under the same old name",
            |r| {
                r.counters
                    .ttft
                    .as_ref()
                    .is_some_and(|h| (h.count - 4.0).abs() < 1e-9)
            },
        ),
        (
            "llm_d_request_tpot_seconds_metric: the histogram written twice is read once",
            |r| {
                r.counters.tpot.as_ref().is_some_and(|h| {
                    h.buckets.len() == 36
                        && (h.count - 2.0).abs() < 1e-9
                        && (h.sum - 0.161).abs() < 1e-9
                }) && r.rejected.get(SampleRejection::DuplicateSeries) == 37
                    && r.rejected.total() == 37
            },
        ),
    ];
    for (name, check) in cases {
        let file = name.split(':').next().unwrap();
        let r = read_fixture(file);
        assert!(check(&r), "{name}: {r:?}");
        if file != "llm_d_request_tpot_seconds_metric" {
            assert_eq!(r.rejected.total(), 0, "{name}");
        }
    }
}

#[test]
fn every_other_fixture_carries_nothing_grid_reads() {
    let mut others = 0;
    for entry in std::fs::read_dir(fixture_dir()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if READ.contains(&name.as_str()) {
            continue;
        }
        others += 1;
        let r = read_fixture(&name);
        assert_eq!(r, ScrapeReading::default(), "{name}");
    }
    assert_eq!(others, 32, "fixture set changed");
}

#[test]
fn a_scrape_built_from_fixtures_mixing_old_and_current_names_concludes_in_flight() {
    let mut body = Vec::new();
    for name in [
        "kv_cache_avg_metrics",
        "llm_d_kv_cache_std_dev_metrics",
        "llm_d_running_requests_avg_metrics",
        "queue_avg_size_metrics",
        "request_total_metric",
    ] {
        body.extend_from_slice(&fixture(name));
        body.push(b'\n');
    }
    // No fixture carries the ready-endpoint count; an EPP serving pool p1 writes it so.
    body.extend_from_slice(b"llm_d_epp_ready_endpoints{name=\"p1\"} 3\n");
    let samples = parse_strict(&body).unwrap();
    let config = ProviderConfig {
        site: "a".into(),
        provider: "m".into(),
        pool: PoolSelector::Named("p1".into()),
    };
    let now = 1_700_000_000_000;
    let mut tracker = ProviderTracker::new(config, now);
    tracker.on_scrape(now, &samples);
    let window = ScrapeTiming {
        interval_ms: 1_000,
        stale_metrics_ms: None,
        signal_ttl_ms: 30_000,
    }
    .window(0);
    assert_eq!(tracker.readiness(now, window).status, ReadyStatus::Ready);
    let in_flight = tracker.in_flight(now, window).unwrap();
    assert!(
        (in_flight.value - (0.5 + 0.4) * 3.0).abs() < 1e-9,
        "{in_flight:?}"
    );
    let names: Vec<&str> = tracker
        .publication(now, window)
        .iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(
        names,
        [
            "grid_provider_ready",
            "grid_provider_ready_endpoints",
            "grid_provider_in_flight_requests",
            "llm_d_epp_ready_endpoints",
            "llm_d_epp_average_running_requests",
            "llm_d_epp_average_queue_size",
            "llm_d_epp_average_kv_cache_utilization",
            "llm_d_epp_std_dev_kv_cache_utilization",
        ]
    );
}

/// The expositions recorded from the real EPP (`benches/kit/fixtures/epp-real/`, written
/// by `benches/kit/tests/real_epp.rs`), read as the operator reads them: the whole body
/// parses, and what grid reads is there under the release's spellings.
#[test]
fn every_recorded_real_epp_exposition_parses_whole_and_gives_its_pool_readings() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../benches/kit/fixtures/epp-real");
    let read = |name: &str| {
        let body = std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let parsed = grid_signals::epp::ScrapeBody::parse(&body);
        assert_eq!(parsed.refused().total(), 0, "{name}: a refused line");
        let r = read_scrape(parsed.samples(), &PoolSelector::Named("llama".into()));
        assert_eq!(r.rejected.total(), 0, "{name}");
        assert_eq!(r.pools_seen, 1, "{name}");
        assert_eq!(r.ready_endpoints, Some(2.0), "{name}");
        let units: Vec<&str> = r.per_endpoint_queue.keys().map(String::as_str).collect();
        assert_eq!(units, ["llama-0-rank-0", "llama-1-rank-0"], "{name}");
        // Not written by the release: the KV spread, per-endpoint in-flight, TTFT, TPOT.
        assert_eq!(r.std_dev_kv_cache, None, "{name}");
        assert_eq!(r.inflight_requests, None, "{name}");
        assert_eq!(
            (r.counters.ttft.as_ref(), r.counters.tpot.as_ref()),
            (None, None)
        );
        r
    };
    let idle = read("two-pods-after-four-requests.prom");
    assert_eq!(idle.counters.requests, Some(4.0));
    assert_eq!(idle.flow_control_queue, Some(0.0));
    assert!(close(idle.average_running, 0.0) && close(idle.average_queue, 0.0));
    let held = read("two-pods-twelve-requests-held.prom");
    // Twelve requests on two endpoints of two slots: two running and four queued on each.
    assert!(close(held.average_running, 2.0) && close(held.average_queue, 4.0));
    let release = std::fs::read_to_string(dir.join("RELEASE")).unwrap();
    assert_eq!(
        release.trim(),
        "sigs.k8s.io/gateway-api-inference-extension v1.5.0"
    );
}
