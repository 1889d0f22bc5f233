//! prometheus-client (the project's metrics library) as a second, independent writer:
//! metrics registered and encoded with it parse back to exactly what was recorded, and
//! our writer's text for the same samples parses to the same samples.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::CounterWithExemplar;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

use grid_signals::exposition::{
    Line, MetricType, OwnedSample, Sample, lines, parse_strict, write_owned_sample,
};

type Labels = Vec<(String, String)>;

/// A tricky label value: quote, backslash, newline, comma, braces, non-ASCII.
const TRICKY: &str = "a\"b\\c\nd,{e}=λ";

fn sample(name: &str, labels: &[(&str, &str)], value: f64) -> OwnedSample {
    OwnedSample {
        name: name.into(),
        labels: labels
            .iter()
            .map(|(n, v)| ((*n).into(), (*v).into()))
            .collect(),
        value,
        timestamp_ms: None,
    }
}

/// Registers one metric of each kind, records known values, and returns the encoder's
/// text with the samples it must contain, in the encoder's order.
fn encoded() -> (String, Vec<OwnedSample>) {
    let mut registry = Registry::default();

    let requests: Counter = Counter::default();
    registry.register("requests", "Requests served", requests.clone());
    requests.inc_by(3);

    let load: Gauge<f64, AtomicU64> = Gauge::default();
    registry.register("load", "Load ratio", load.clone());
    load.set(0.125);

    let queue: Family<Labels, Gauge> = Family::default();
    registry.register("queue", "Queue per site", queue.clone());
    queue
        .get_or_create(&vec![
            ("site".into(), TRICKY.into()),
            ("provider".into(), "p1".into()),
        ])
        .set(7);

    let latency = Histogram::new([0.1, 0.5, 1.0]);
    registry.register_with_unit("latency", "Latency", Unit::Seconds, latency.clone());
    for v in [0.05, 0.3, 2.0] {
        latency.observe(v);
    }

    registry.register(
        "build",
        "Build",
        Info::new(vec![("version".to_owned(), "1.2".to_owned())]),
    );

    let tokens: CounterWithExemplar<Labels> = CounterWithExemplar::default();
    registry.register("tokens", "Tokens", tokens.clone());
    tokens.inc_by(5, Some(vec![("trace_id".into(), "abc".into())]), None);

    let mut text = String::new();
    encode(&mut text, &registry).unwrap();

    let expected = vec![
        sample("requests_total", &[], 3.0),
        sample("load", &[], 0.125),
        sample("queue", &[("site", TRICKY), ("provider", "p1")], 7.0),
        sample("latency_seconds_sum", &[], 2.35),
        sample("latency_seconds_count", &[], 3.0),
        sample("latency_seconds_bucket", &[("le", "0.1")], 1.0),
        sample("latency_seconds_bucket", &[("le", "0.5")], 2.0),
        sample("latency_seconds_bucket", &[("le", "1.0")], 2.0),
        sample("latency_seconds_bucket", &[("le", "+Inf")], 3.0),
        sample("build_info", &[("version", "1.2")], 1.0),
        sample("tokens_total", &[], 5.0),
    ];
    (text, expected)
}

fn owned(body: &[u8]) -> Vec<OwnedSample> {
    parse_strict(body)
        .unwrap_or_else(|e| panic!("{e}\n{}", String::from_utf8_lossy(body)))
        .iter()
        .map(Sample::to_owned_sample)
        .collect()
}

#[test]
fn prometheus_client_output_parses_to_the_recorded_samples() {
    let (text, expected) = encoded();
    // The encoder writes an exemplar after the counter's value; it must be skipped.
    assert!(
        text.contains("tokens_total 5 # {trace_id=\"abc\"}"),
        "{text}"
    );
    let parsed = owned(text.as_bytes());
    assert_eq!(parsed.len(), expected.len(), "{text}");
    for want in &expected {
        let got = parsed
            .iter()
            .find(|s| s.name == want.name && s.labels == want.labels)
            .unwrap_or_else(|| panic!("missing {want:?} in\n{text}"));
        assert!(
            (got.value - want.value).abs() < 1e-12,
            "{got:?} vs {want:?}"
        );
        assert_eq!(got.timestamp_ms, None);
    }
}

#[test]
fn prometheus_client_metadata_comes_out_as_lines() {
    let (text, _) = encoded();
    let metadata: Vec<Line<'_>> = lines(text.as_bytes())
        .map(Result::unwrap)
        .filter(|l| !matches!(l, Line::Sample(_) | Line::Help { .. }))
        .collect();
    assert!(metadata.contains(&Line::Type {
        name: "requests",
        kind: MetricType::Counter
    }));
    assert!(metadata.contains(&Line::Type {
        name: "latency_seconds",
        kind: MetricType::Histogram
    }));
    assert!(metadata.contains(&Line::Type {
        name: "build",
        kind: MetricType::Info
    }));
    assert!(metadata.contains(&Line::Unit {
        name: "latency_seconds",
        unit: "seconds"
    }));
    assert_eq!(metadata.last(), Some(&Line::Eof));
}

#[test]
fn our_writer_and_prometheus_client_agree_on_the_samples() {
    let (text, _) = encoded();
    let theirs = owned(text.as_bytes());
    let mut ours_text = Vec::new();
    for s in &theirs {
        write_owned_sample(&mut ours_text, s);
    }
    let mut ours = owned(&ours_text);
    let mut theirs = theirs;
    for s in ours.iter_mut().chain(theirs.iter_mut()) {
        s.labels.sort();
    }
    assert_eq!(ours, theirs);
}
