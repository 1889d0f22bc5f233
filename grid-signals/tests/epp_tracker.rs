//! The operator's conclusions end to end: hand-written EPP scrapes, parsed by the real
//! exposition parser, fed to a `ProviderTracker`, and the verdict and batch read back.

use std::fmt::Write as _;

use grid_signals::epp::{
    PoolSelector, ProviderConfig, ProviderTracker, PublishedSample, ReadyStatus, ScrapeFailure,
    ScrapeInput, ScrapeTiming, StaleWindow,
};
use grid_signals::exposition::parse_strict;

const T0: u64 = 1_700_000_000_000;
const TIMING: ScrapeTiming = ScrapeTiming {
    interval_ms: 1_000,
    stale_metrics_ms: None,
    signal_ttl_ms: 20_000,
};

struct Harness {
    tracker: ProviderTracker,
    now: u64,
    window: StaleWindow,
}

impl Harness {
    fn new() -> Self {
        Self::with_pool(PoolSelector::All)
    }

    fn with_pool(pool: PoolSelector) -> Self {
        let config = ProviderConfig {
            site: "site-a".into(),
            provider: "llama".into(),
            pool,
        };
        Self {
            tracker: ProviderTracker::new(config, T0),
            now: T0,
            window: TIMING.window(0),
        }
    }

    /// Feeds `text` as a scrape at the current time, then advances one second.
    fn scrape(&mut self, text: &str) {
        let samples = parse_strict(text.as_bytes()).unwrap_or_else(|e| panic!("{e}\n{text}"));
        self.tracker.handle(self.now, ScrapeInput::Parsed(&samples));
        self.now += 1_000;
    }

    fn fail(&mut self, failure: ScrapeFailure) {
        self.tracker.handle(
            self.now,
            ScrapeInput::<Vec<grid_signals::exposition::OwnedSample>>::Failed(failure),
        );
        self.now += 1_000;
    }

    /// The verdict as of the last input.
    fn verdict(&self) -> (ReadyStatus, &'static str) {
        let v = self.tracker.readiness(self.now - 1_000, self.window);
        (v.status, v.reason.as_str())
    }

    fn batch(&self) -> Vec<PublishedSample> {
        self.tracker.publication(self.now - 1_000, self.window)
    }

    fn published(&self, name: &str) -> Option<f64> {
        let batch = self.batch();
        let mut found = batch.iter().filter(|s| s.name == name);
        let first = found.next().map(|s| s.value);
        assert!(found.next().is_none(), "{name} twice");
        first
    }
}

/// An EPP scrape for pool `p1`.
struct Epp {
    ready: Option<f64>,
    running: f64,
    queue: f64,
    requests: u64,
    errors: u64,
    /// Per-bucket (not cumulative) streaming TTFT counts for bounds 0.1, 0.5, 1, +Inf.
    ttft: [u64; 4],
    inflight: Option<(u64, u64)>,
    flow_control: Option<u64>,
}

impl Default for Epp {
    fn default() -> Self {
        Self {
            ready: Some(2.0),
            running: 1.0,
            queue: 0.5,
            requests: 0,
            errors: 0,
            ttft: [0; 4],
            inflight: None,
            flow_control: None,
        }
    }
}

impl Epp {
    fn text(&self) -> String {
        let mut t = String::new();
        if let Some(r) = self.ready {
            writeln!(t, "llm_d_epp_ready_endpoints{{name=\"p1\"}} {r}").unwrap();
        }
        writeln!(
            t,
            "llm_d_epp_average_running_requests{{name=\"p1\"}} {}",
            self.running
        )
        .unwrap();
        writeln!(
            t,
            "llm_d_epp_average_queue_size{{name=\"p1\"}} {}",
            self.queue
        )
        .unwrap();
        writeln!(
            t,
            "llm_d_epp_average_kv_cache_utilization{{name=\"p1\"}} 0.25"
        )
        .unwrap();
        writeln!(
            t,
            "llm_d_epp_std_dev_kv_cache_utilization{{name=\"p1\"}} 0.05"
        )
        .unwrap();
        writeln!(
            t,
            "llm_d_epp_per_endpoint_queue_size{{name=\"p1\", model_server_endpoint=\"pod-a\"}} 1"
        )
        .unwrap();
        writeln!(
            t,
            "llm_d_epp_per_endpoint_queue_size{{name=\"p1\", model_server_endpoint=\"pod-b\"}} 0"
        )
        .unwrap();
        writeln!(t, "llm_d_epp_request_total{{model_name=\"m\",target_model_name=\"m\",fairness_id=\"other\",priority=\"0\"}} {}", self.requests).unwrap();
        if self.errors > 0 {
            writeln!(t, "llm_d_epp_request_error_total{{model_name=\"m\",target_model_name=\"m\",fairness_id=\"other\",priority=\"0\",error_code=\"500\"}} {}", self.errors).unwrap();
        }
        let mut cum = 0;
        for (le, n) in ["0.1", "0.5", "1", "+Inf"].iter().zip(self.ttft) {
            cum += n;
            writeln!(t, "llm_d_epp_request_ttft_seconds_bucket{{model_name=\"m\",streaming=\"true\",le=\"{le}\"}} {cum}").unwrap();
            // Non-streaming requests are timed to the whole response: never read.
            writeln!(t, "llm_d_epp_request_ttft_seconds_bucket{{model_name=\"m\",streaming=\"false\",le=\"{le}\"}} 1000").unwrap();
        }
        writeln!(
            t,
            "llm_d_epp_request_ttft_seconds_count{{model_name=\"m\",streaming=\"true\"}} {cum}"
        )
        .unwrap();
        writeln!(
            t,
            "llm_d_epp_request_ttft_seconds_sum{{model_name=\"m\",streaming=\"true\"}} 0"
        )
        .unwrap();
        if let Some((a, b)) = self.inflight {
            writeln!(t, "llm_d_epp_inflight_requests{{endpoint_name=\"pod-a\",namespace=\"ns\",producer_name=\"p\"}} {a}").unwrap();
            writeln!(t, "llm_d_epp_inflight_requests{{endpoint_name=\"pod-b\",namespace=\"ns\",producer_name=\"p\"}} {b}").unwrap();
        }
        if let Some(f) = self.flow_control {
            writeln!(t, "llm_d_epp_flow_control_queue_size{{fairness_id=\"other\",priority=\"0\",inference_pool=\"p1\",model_name=\"m\",target_model_name=\"m\"}} {f}").unwrap();
        }
        t
    }
}

fn ready(n: f64) -> String {
    Epp {
        ready: Some(n),
        ..Epp::default()
    }
    .text()
}

use ReadyStatus::{NotReady, Ready, Unknown};

#[test]
fn two_scrape_hysteresis_holds_both_ways() {
    let mut h = Harness::new();
    let steps: &[(&str, f64, (ReadyStatus, &str))] = &[
        ("serving", 2.0, (Ready, "EndpointsReady")),
        (
            "one zero scrape stays ready",
            0.0,
            (Ready, "ZeroEndpointsUnconfirmed"),
        ),
        (
            "the second zero scrape fails it",
            0.0,
            (NotReady, "NoReadyEndpoints"),
        ),
        (
            "one positive scrape does not recover",
            2.0,
            (NotReady, "RecoveryUnconfirmed"),
        ),
        (
            "a zero in between restarts the count",
            0.0,
            (NotReady, "NoReadyEndpoints"),
        ),
        (
            "first positive again",
            2.0,
            (NotReady, "RecoveryUnconfirmed"),
        ),
        (
            "the second positive scrape recovers",
            2.0,
            (Ready, "EndpointsReady"),
        ),
    ];
    for (name, count, want) in steps {
        h.scrape(&ready(*count));
        assert_eq!(h.verdict(), *want, "{name}");
        let published = h.published("grid_provider_ready");
        assert_eq!(
            published,
            Some(if want.0 == Ready { 1.0 } else { 0.0 }),
            "{name}"
        );
    }
}

#[test]
fn an_engine_answer_within_thirty_seconds_keeps_zero_endpoints_ready() {
    let mut h = Harness::new();
    h.window = StaleWindow(120_000);
    h.scrape(
        &Epp {
            ready: Some(0.0),
            requests: 10,
            ..Epp::default()
        }
        .text(),
    );
    h.scrape(
        &Epp {
            ready: Some(0.0),
            requests: 11,
            ..Epp::default()
        }
        .text(),
    );
    assert_eq!(
        h.verdict(),
        (Ready, "EngineAnswering"),
        "the counter grew on the second scrape"
    );
    let answered_at = h.now - 1_000;
    // No more growth: ready until 30 s after the answer, not ready one scrape later.
    while h.now <= answered_at + 30_000 {
        h.scrape(
            &Epp {
                ready: Some(0.0),
                requests: 11,
                ..Epp::default()
            }
            .text(),
        );
        assert_eq!(
            h.verdict(),
            (Ready, "EngineAnswering"),
            "at +{} ms",
            h.now - 1_000 - answered_at
        );
    }
    h.scrape(
        &Epp {
            ready: Some(0.0),
            requests: 11,
            ..Epp::default()
        }
        .text(),
    );
    assert_eq!(h.verdict(), (NotReady, "NoReadyEndpoints"));
    // A TTFT observation is an answer too.
    h.scrape(
        &Epp {
            ready: Some(0.0),
            requests: 11,
            ttft: [1, 0, 0, 0],
            ..Epp::default()
        }
        .text(),
    );
    assert_eq!(h.verdict(), (Ready, "EngineAnswering"));
}

#[test]
fn the_readiness_floor_keeps_a_sample_valid_until_the_next_pass_can_refresh_it() {
    // staleMetricsSeconds unset: half of a 20 s TTL is 10 s; a 12 s pass raises the floor
    // to 1 s + 12 s = 13 s, which overrides it.
    let window = TIMING.window(12_000);
    assert_eq!(window, StaleWindow(13_000));
    for (after, want) in [
        (13_000, (Ready, "EndpointsReady")),
        (13_001, (NotReady, "ScrapeTimeout")),
    ] {
        let mut h = Harness::new();
        h.window = window;
        h.scrape(&ready(2.0));
        let answered = h.now - 1_000;
        h.fail(ScrapeFailure::Timeout);
        let v = h.tracker.readiness(answered + after, window);
        assert_eq!(
            (v.status, v.reason.as_str()),
            want,
            "{after} ms after the last answer"
        );
        let held = h.tracker.publication(answered + after, window);
        assert_eq!(
            held.iter().any(|s| s.name == "llm_d_epp_ready_endpoints"),
            want.0 == Ready,
            "{after} ms"
        );
    }
}

const VLLM: &str = "vllm:num_requests_running{model_name=\"m\"} 3\nvllm:num_requests_waiting{model_name=\"m\"} 0\n";

#[test]
fn unknown_is_not_false_and_publishes_no_ready_sample() {
    type Setup = fn(&mut Harness);
    let cases: &[(&str, Setup, (ReadyStatus, &str))] = &[
        ("no scrape yet", |_| {}, (Unknown, "NoScrapeYet")),
        (
            "a scrape without the ready series (vLLM's own /metrics)",
            |h| h.scrape(VLLM),
            (Unknown, "NoReadySeries"),
        ),
        (
            "a body that reached the cap",
            |h| h.fail(ScrapeFailure::BodyCap),
            (Unknown, "ScrapeBodyCap"),
        ),
        (
            "a body cap after two zero scrapes",
            |h| {
                h.scrape(&ready(0.0));
                h.scrape(&ready(0.0));
                h.fail(ScrapeFailure::BodyCap);
            },
            (Unknown, "ScrapeBodyCap"),
        ),
        (
            "two zero scrapes without an answer are false",
            |h| {
                h.scrape(&ready(0.0));
                h.scrape(&ready(0.0));
            },
            (NotReady, "NoReadyEndpoints"),
        ),
        (
            "a refused connection before any answer is unknown within the window",
            |h| h.fail(ScrapeFailure::Connect),
            (Unknown, "ScrapeConnect"),
        ),
    ];
    for (name, setup, want) in cases {
        let mut h = Harness::new();
        h.now += 1_000;
        setup(&mut h);
        assert_eq!(h.verdict(), *want, "{name}");
        let sample = h.published("grid_provider_ready");
        match want.0 {
            Unknown => assert_eq!(sample, None, "{name}"),
            _ => assert_eq!(sample, Some(0.0), "{name}"),
        }
    }
}

#[test]
fn a_restart_that_zeroes_the_in_flight_count_does_not_look_idle() {
    let mut h = Harness::new();
    h.scrape(
        &Epp {
            ready: Some(2.0),
            running: 3.0,
            queue: 1.0,
            inflight: Some((6, 5)),
            ..Epp::default()
        }
        .text(),
    );
    assert_eq!(
        h.published("grid_provider_in_flight_requests"),
        Some(11.0),
        "producer 6+5 beats (3+1)x2"
    );
    h.scrape(
        &Epp {
            ready: Some(2.0),
            running: 3.0,
            queue: 1.0,
            inflight: Some((0, 0)),
            ..Epp::default()
        }
        .text(),
    );
    assert_eq!(
        h.published("grid_provider_in_flight_requests"),
        Some(8.0),
        "after the restart the averages hold"
    );
    h.scrape(
        &Epp {
            ready: Some(2.0),
            running: 3.0,
            queue: 1.0,
            inflight: Some((0, 0)),
            flow_control: Some(4),
            ..Epp::default()
        }
        .text(),
    );
    assert_eq!(
        h.published("grid_provider_in_flight_requests"),
        Some(12.0),
        "flow control adds"
    );
}

#[test]
fn an_epp_serving_several_pools_falls_back_to_the_averages() {
    let two_pools = "\
llm_d_epp_ready_endpoints{name=\"p1\"} 2
llm_d_epp_ready_endpoints{name=\"p2\"} 4
llm_d_epp_average_running_requests{name=\"p1\"} 3
llm_d_epp_average_running_requests{name=\"p2\"} 1
llm_d_epp_average_queue_size{name=\"p1\"} 1
llm_d_epp_average_queue_size{name=\"p2\"} 0
llm_d_epp_inflight_requests{endpoint_name=\"a\",namespace=\"ns\",producer_name=\"p\"} 40
llm_d_epp_flow_control_queue_size{inference_pool=\"p1\",priority=\"0\"} 1
llm_d_epp_flow_control_queue_size{inference_pool=\"p2\",priority=\"0\"} 7
";
    // (pool, in-flight, ready endpoints)
    let cases = [
        (
            "pool p1 alone: (3+1)x2 + 1, the 40 unattributable",
            PoolSelector::Named("p1".into()),
            9.0,
            2.0,
        ),
        (
            "pool p2 alone: (1+0)x4 + 7",
            PoolSelector::Named("p2".into()),
            11.0,
            4.0,
        ),
        (
            "both pools combined: weighted averages give (3+1)x2 + (1+0)x4 + 1 + 7",
            PoolSelector::All,
            20.0,
            6.0,
        ),
    ];
    for (name, pool, in_flight, endpoints) in cases {
        let mut h = Harness::with_pool(pool);
        h.scrape(two_pools);
        let got = h.published("grid_provider_in_flight_requests").unwrap();
        assert!((got - in_flight).abs() < 1e-9, "{name}: {got}");
        assert_eq!(
            h.published("grid_provider_ready_endpoints"),
            Some(endpoints),
            "{name}"
        );
    }
}

#[test]
fn a_site_with_no_fresh_endpoint_publishes_no_in_flight_and_no_frozen_averages() {
    let mut h = Harness::new();
    h.scrape(
        &Epp {
            ready: Some(0.0),
            running: 5.0,
            queue: 5.0,
            inflight: Some((3, 3)),
            ..Epp::default()
        }
        .text(),
    );
    let names: Vec<&str> = h.batch().iter().map(|s| s.name).collect();
    assert_eq!(
        names,
        [
            "grid_provider_ready",
            "grid_provider_ready_endpoints",
            "llm_d_epp_ready_endpoints",
            "llm_d_epp_per_endpoint_queue_size",
            "llm_d_epp_per_endpoint_queue_size",
        ]
    );
}

fn latency_scrape(requests: u64, errors: u64, ttft: [u64; 4]) -> String {
    Epp {
        requests,
        errors,
        ttft,
        ..Epp::default()
    }
    .text()
}

#[test]
fn latency_needs_twenty_requests_in_the_window() {
    let cases = [
        ("nineteen requests publish nothing", 19, false),
        ("twenty requests publish the figures", 20, true),
    ];
    for (name, n, want) in cases {
        let mut h = Harness::new();
        h.scrape(&latency_scrape(100, 3, [10, 10, 0, 0]));
        // n new requests: half under 0.1 s, the rest between 0.1 and 0.5 s; 10% failed.
        let fast = n / 2;
        h.scrape(&latency_scrape(
            100 + n,
            3 + n / 10,
            [10 + fast, 10 + n - fast, 0, 0],
        ));
        let got = (
            h.published("grid_provider_ttft_p50_seconds"),
            h.published("grid_provider_ttft_p90_seconds"),
            h.published("grid_provider_error_ratio"),
        );
        if want {
            // p50: rank 10 of 20 is the last of the 10 under 0.1 s -> 0.1 s.
            assert!((got.0.unwrap() - 0.1).abs() < 1e-9, "{name}: {got:?}");
            // p90: rank 18 is the 8th of 10 in (0.1, 0.5] -> 0.1 + 0.4 x 0.8.
            assert!((got.1.unwrap() - 0.42).abs() < 1e-9, "{name}: {got:?}");
            assert!((got.2.unwrap() - 0.1).abs() < 1e-9, "{name}: {got:?}");
        } else {
            assert_eq!(got, (None, None, None), "{name}");
        }
    }
}

#[test]
fn a_counter_going_backwards_resets_the_latency_window_until_it_refills() {
    let mut h = Harness::new();
    h.scrape(&latency_scrape(1_000, 0, [500, 0, 0, 0]));
    h.scrape(&latency_scrape(1_040, 0, [540, 0, 0, 0]));
    assert!(h.published("grid_provider_ttft_p50_seconds").is_some());
    // The EPP restarts: every counter starts again near zero.
    h.scrape(&latency_scrape(5, 0, [5, 0, 0, 0]));
    assert_eq!(
        h.published("grid_provider_ttft_p50_seconds"),
        None,
        "nothing right after the restart"
    );
    assert_eq!(h.published("grid_provider_error_ratio"), None);
    h.scrape(&latency_scrape(20, 0, [20, 0, 0, 0]));
    assert_eq!(
        h.published("grid_provider_error_ratio"),
        None,
        "15 requests since the restart"
    );
    h.scrape(&latency_scrape(25, 0, [25, 0, 0, 0]));
    assert_eq!(
        h.published("grid_provider_error_ratio"),
        Some(0.0),
        "20 requests since the restart"
    );
    assert!(h.published("grid_provider_ttft_p50_seconds").is_some());
}

type Row<'a> = (&'a str, Vec<(&'a str, &'a str)>, f64);

#[test]
fn a_full_batch_carries_contract_then_raw_series_with_site_and_provider_labels() {
    let mut h = Harness::new();
    h.scrape(
        &Epp {
            ready: Some(2.0),
            running: 3.0,
            queue: 1.0,
            requests: 0,
            inflight: Some((1, 1)),
            flow_control: Some(2),
            ..Epp::default()
        }
        .text(),
    );
    let stamp = h.now - 1_000;
    h.scrape(
        &Epp {
            ready: Some(2.0),
            running: 3.0,
            queue: 1.0,
            requests: 40,
            ttft: [40, 0, 0, 0],
            inflight: Some((1, 1)),
            flow_control: Some(2),
            ..Epp::default()
        }
        .text(),
    );
    let latest = h.now - 1_000;
    assert!(latest > stamp);
    let batch = h.batch();
    let rows: Vec<Row<'_>> = batch
        .iter()
        .map(|s| {
            (
                s.name,
                s.labels.iter().map(|(k, v)| (*k, v.as_str())).collect(),
                s.value,
            )
        })
        .collect();
    let base = vec![("grid_site", "site-a"), ("grid_provider", "llama")];
    let with = |endpoint: &'static str| {
        let mut l = base.clone();
        l.push(("model_server_endpoint", endpoint));
        l
    };
    assert_eq!(
        rows,
        vec![
            ("grid_provider_ready", base.clone(), 1.0),
            ("grid_provider_ready_endpoints", base.clone(), 2.0),
            ("grid_provider_in_flight_requests", base.clone(), 10.0),
            ("grid_provider_ttft_p50_seconds", base.clone(), 0.05),
            ("grid_provider_ttft_p90_seconds", base.clone(), 0.09),
            ("grid_provider_error_ratio", base.clone(), 0.0),
            ("llm_d_epp_ready_endpoints", base.clone(), 2.0),
            ("llm_d_epp_average_running_requests", base.clone(), 3.0),
            ("llm_d_epp_average_queue_size", base.clone(), 1.0),
            ("llm_d_epp_average_kv_cache_utilization", base.clone(), 0.25),
            ("llm_d_epp_std_dev_kv_cache_utilization", base.clone(), 0.05),
            ("llm_d_epp_per_endpoint_queue_size", with("pod-a"), 1.0),
            ("llm_d_epp_per_endpoint_queue_size", with("pod-b"), 0.0),
            ("llm_d_epp_flow_control_queue_size", base.clone(), 2.0),
        ]
    );
    assert!(
        batch.iter().all(|s| s.stamp_ms == latest),
        "every value was observed by the latest scrape"
    );
}

#[test]
fn a_not_ready_verdict_is_published_with_its_reason_so_an_unread_epp_is_told_from_a_down_one() {
    use grid_signals::epp::{READY_REASON, READY_REASON_LABEL, ReadyReasonLabel};
    let reason = |h: &Harness| {
        let batch = h.batch();
        let rows: Vec<_> = batch.iter().filter(|s| s.name == READY_REASON).collect();
        assert!(rows.len() <= 1, "one reason per batch: {rows:?}");
        rows.first().map(|s| {
            assert!((s.value - 1.0).abs() < f64::EPSILON);
            let ready = batch
                .iter()
                .find(|r| r.name == "grid_provider_ready")
                .unwrap();
            assert_eq!(s.stamp_ms, ready.stamp_ms, "stamped with the verdict");
            let label = s
                .labels
                .iter()
                .find(|(k, _)| *k == READY_REASON_LABEL)
                .unwrap();
            ReadyReasonLabel::parse(&label.1).unwrap()
        })
    };
    // Ready: no reason row.
    let mut h = Harness::new();
    h.scrape(&ready(2.0));
    assert_eq!(reason(&h), None);
    // The EPP showed it down: the reason is evidence.
    h.scrape(&ready(0.0));
    h.scrape(&ready(0.0));
    let shown = reason(&h).unwrap();
    assert_eq!(shown, ReadyReasonLabel::NoReadyEndpoints);
    assert!(!shown.is_unread());
    // Scrapes time out past the stale window: the operator could not read the EPP.
    let mut h = Harness::new();
    h.scrape(&ready(2.0));
    for _ in 0..30 {
        h.fail(ScrapeFailure::Timeout);
    }
    assert_eq!(h.verdict().0, NotReady);
    let unread = reason(&h).unwrap();
    assert_eq!(unread, ReadyReasonLabel::ScrapeTimeout);
    assert!(unread.is_unread());
}
