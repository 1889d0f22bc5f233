//! Conformance over every real exposition in the shared fixtures: each parses strictly
//! and leniently, each family has the sample count its text has, chosen lines come out
//! with exactly their written values and labels, and writing what was parsed gives text
//! that parses back to the same samples.

#![allow(clippy::float_cmp, reason = "values must be exactly the written ones")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use grid_signals::exposition::{
    Line, MetricType, OwnedSample, Sample, lines, parse_strict, write_owned_sample,
};

fn fixtures_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures")
}

/// Every fixture file, `epp/` and `prometheus/`, sorted by path.
fn fixture_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in ["epp", "prometheus"] {
        let dir = fixtures_root().join(dir);
        let entries =
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("fixtures {}: {e}", dir.display()));
        files.extend(entries.map(|e| e.unwrap().path()));
    }
    files.sort();
    files
}

fn read(relative: &str) -> Vec<u8> {
    let path = fixtures_root().join(relative);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `(file, families, samples)` for every EPP fixture, counted from the files' text.
const EPP_COUNTS: [(&str, usize, usize); 40] = [
    ("flow_control_dispatch_cycle_duration_seconds_metric", 1, 13),
    ("flow_control_enqueue_duration_seconds_metric", 1, 182),
    ("kv_cache_avg_metrics", 1, 1),
    (
        "llm_d_flow_control_dispatch_cycle_duration_seconds_metric",
        1,
        13,
    ),
    ("llm_d_flow_control_pending_reclaim_metric", 1, 1),
    ("llm_d_flow_control_reclaim_target_metric", 1, 1),
    ("llm_d_flow_control_revocations_metric", 1, 2),
    ("llm_d_input_tokens_metric", 1, 66),
    ("llm_d_kv_cache_std_dev_metrics", 1, 1),
    (
        "llm_d_normalized_time_per_output_token_seconds_metric",
        1,
        48,
    ),
    ("llm_d_plugin_data_scope_violations_total_metric", 1, 3),
    ("llm_d_plugin_processing_latencies_metric", 1, 104),
    ("llm_d_prefix_indexer_hit_ratio_metric", 1, 14),
    ("llm_d_prefix_indexer_size_metric", 1, 1),
    ("llm_d_queue_std_dev_size_metrics", 1, 1),
    ("llm_d_request_duration_seconds_metric", 1, 114),
    ("llm_d_request_processing_duration_seconds_metric", 1, 19),
    ("llm_d_request_size_bytes_metric", 1, 84),
    ("llm_d_request_tpot_seconds_metric", 1, 76),
    ("llm_d_request_ttft_seconds_metric", 1, 114),
    ("llm_d_response_size_bytes_metric", 1, 54),
    ("llm_d_running_requests_avg_metrics", 1, 1),
    ("llm_d_running_requests_std_dev_metrics", 1, 1),
    ("llm_d_scheduler_attempts_different_models_metrics", 1, 2),
    ("llm_d_scheduler_attempts_total_metrics", 1, 2),
    ("llm_d_scheduler_attempts_with_result_metrics", 1, 1),
    ("normalized_time_per_output_token_seconds_metric", 1, 48),
    ("output_tokens_metric", 1, 45),
    ("prefix_indexer_hit_bytes_metric", 1, 17),
    ("prefix_indexer_hit_ratio_metric", 1, 14),
    ("queue_avg_size_metrics", 1, 1),
    ("request_duration_seconds_metric", 1, 114),
    ("request_sizes_metric", 1, 84),
    ("request_total_metric", 1, 3),
    ("request_ttft_seconds_metric", 1, 114),
    ("response_sizes_metric", 1, 54),
    ("running_requests_metrics", 1, 2),
    ("scheduler_attempts_different_models_metrics", 1, 2),
    ("scheduler_attempts_total_metrics", 1, 2),
    ("scheduler_attempts_with_result_metrics", 1, 1),
];

/// Samples per family as the parser sees them: a sample belongs to the family of the
/// latest `# TYPE` line (exporters write each family's samples after its metadata).
fn parsed_family_counts(body: &[u8]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    let mut family = String::new();
    for line in lines(body) {
        match line.unwrap() {
            Line::Type { name, .. } => {
                name.clone_into(&mut family);
                counts.entry(family.clone()).or_insert(0);
            }
            // Not checked against the family name: one EPP fixture really has a sample
            // named `iinference_model_request_tpot_seconds_bucket` in its family.
            Line::Sample(_) => *counts.entry(family.clone()).or_insert(0) += 1,
            _ => {}
        }
    }
    counts
}

/// The same count from the raw text with no parser: `# TYPE` lines open families, every
/// other line that is neither a comment nor blank is a sample.
fn text_family_counts(body: &[u8]) -> BTreeMap<String, usize> {
    let text = std::str::from_utf8(body).unwrap();
    let mut counts = BTreeMap::new();
    let mut family = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            rest.split(' ').next().unwrap().clone_into(&mut family);
            counts.entry(family.clone()).or_insert(0);
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            *counts.entry(family.clone()).or_insert(0) += 1;
        }
    }
    counts
}

#[test]
fn every_fixture_parses_strictly_and_leniently() {
    let files = fixture_files();
    assert_eq!(files.len(), EPP_COUNTS.len() + 1, "fixture set changed");
    for path in files {
        let body = std::fs::read(&path).unwrap();
        let strict = parse_strict(&body).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!strict.is_empty(), "{} has no samples", path.display());
        let refused = lines(&body).filter(Result::is_err).count();
        assert_eq!(refused, 0, "{}", path.display());
    }
}

#[test]
fn every_family_has_the_sample_count_of_its_text() {
    for path in fixture_files() {
        let body = std::fs::read(&path).unwrap();
        assert_eq!(
            parsed_family_counts(&body),
            text_family_counts(&body),
            "{}",
            path.display()
        );
    }
}

#[test]
fn epp_fixtures_have_their_known_family_and_sample_counts() {
    for (file, families, samples) in EPP_COUNTS {
        let body = read(&format!("epp/{file}"));
        let counts = parsed_family_counts(&body);
        assert_eq!(counts.len(), families, "{file}");
        assert_eq!(counts.values().sum::<usize>(), samples, "{file}");
        assert_eq!(parse_strict(&body).unwrap().len(), samples, "{file}");
    }
}

#[test]
fn alltypes_has_237_families_and_1857_samples() {
    let body = read("prometheus/alltypes.237mfs.prom.txt");
    let counts = parsed_family_counts(&body);
    assert_eq!(counts.len(), 237);
    assert_eq!(counts.values().sum::<usize>(), 1857);
    assert_eq!(counts["go_gc_heap_allocs_by_size_bytes"], 14);
    assert_eq!(counts["go_gc_duration_seconds"], 7);
    let kinds: Vec<MetricType> = lines(&body)
        .filter_map(|l| match l.unwrap() {
            Line::Type { kind, .. } => Some(kind),
            _ => None,
        })
        .collect();
    for kind in [
        MetricType::Counter,
        MetricType::Gauge,
        MetricType::Histogram,
        MetricType::Summary,
    ] {
        assert!(kinds.contains(&kind), "{kind:?}");
    }
    assert_eq!(lines(&body).last(), Some(Ok(Line::Eof)));
}

/// A chosen line: metric name, its labels, its value.
type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], f64);

fn find<'a>(samples: &[Sample<'a>], name: &str, labels: &[(&str, &str)]) -> Sample<'a> {
    *samples
        .iter()
        .find(|s| {
            s.name == name
                && s.labels.len() == labels.len()
                && labels
                    .iter()
                    .all(|(n, v)| s.labels.get(n).is_some_and(|got| got.eq_str(v)))
        })
        .unwrap_or_else(|| panic!("no {name} {labels:?}"))
}

#[test]
fn chosen_alltypes_lines_have_their_exact_values() {
    let body = read("prometheus/alltypes.237mfs.prom.txt");
    let samples = parse_strict(&body).unwrap();
    let cases: [Case<'_>; 7] = [
        ("go_gc_cycles_automatic_gc_cycles_total", &[], 190_932.0),
        (
            "go_gc_duration_seconds",
            &[("quantile", "0.25")],
            0.000_101_88,
        ),
        ("go_gc_duration_seconds_sum", &[], 44.985_611_511),
        ("go_gc_gomemlimit_bytes", &[], 9.036_767_23e8),
        (
            "go_gc_heap_allocs_by_size_bytes_bucket",
            &[("le", "8.999999999999998")],
            2.279_966_416e9,
        ),
        (
            "go_gc_heap_allocs_by_size_bytes_bucket",
            &[("le", "+Inf")],
            4.404_628_880_3e10,
        ),
        (
            "promhttp_metric_handler_requests_total",
            &[("code", "200")],
            4.059_092e6,
        ),
    ];
    for (name, labels, value) in cases {
        let s = find(&samples, name, labels);
        assert_eq!(s.value, value, "{name} {labels:?}");
        assert_eq!(s.timestamp_ms, None);
    }
    let last = samples.last().unwrap();
    assert_eq!(last.name, "promhttp_metric_handler_requests_total");
    assert!(last.labels.get("code").unwrap().eq_str("503"));
    assert_eq!(last.value, 0.0);
}

#[test]
fn chosen_epp_lines_have_their_exact_values_and_labels() {
    // ", " between labels, as this EPP fixture writes them.
    let body = read("epp/llm_d_request_ttft_seconds_metric");
    let samples = parse_strict(&body).unwrap();
    let first = samples[0].to_owned_sample();
    assert_eq!(
        first,
        OwnedSample {
            name: "inference_model_request_ttft_seconds_bucket".into(),
            labels: vec![
                ("model_name".into(), "m10".into()),
                ("target_model_name".into(), "t10".into()),
                ("le".into(), "0.005".into()),
            ],
            value: 0.0,
            timestamp_ms: None,
        }
    );
    let sum = find(
        &samples,
        "inference_model_request_ttft_seconds_sum",
        &[("model_name", "m20"), ("target_model_name", "t20")],
    );
    assert_eq!(sum.value, 0.12);

    let body = read("epp/kv_cache_avg_metrics");
    let samples = parse_strict(&body).unwrap();
    assert_eq!(samples.len(), 1);
    assert_eq!(
        samples[0].name,
        "inference_pool_average_kv_cache_utilization"
    );
    assert!(samples[0].labels.get("name").unwrap().eq_str("p1"));
    assert_eq!(samples[0].value, 0.3);

    let body = read("epp/flow_control_enqueue_duration_seconds_metric");
    let samples = parse_strict(&body).unwrap();
    let sum = find(
        &samples,
        "inference_extension_flow_control_request_enqueue_duration_seconds_sum",
        &[
            ("fairness_id", "default-fairness"),
            ("outcome", "EvictedOther"),
            ("priority", "1"),
        ],
    );
    assert_eq!(sum.value, 1e-07);

    let body = read("epp/llm_d_plugin_data_scope_violations_total_metric");
    let samples = parse_strict(&body).unwrap();
    let s = find(
        &samples,
        "llm_d_epp_plugin_data_scope_violations_total",
        &[
            ("access", "write"),
            ("extension_point", "Filter"),
            ("plugin_name", "f1"),
            ("plugin_type", "test-filter"),
        ],
    );
    assert_eq!(s.value, 2.0);
    let help = lines(&body).find_map(|l| match l.unwrap() {
        Line::Help { name, text } => Some((name, text)),
        _ => None,
    });
    let (name, text) = help.unwrap();
    assert_eq!(name, "llm_d_epp_plugin_data_scope_violations_total");
    assert!(text.starts_with("[ALPHA] Total number of endpoint attribute accesses"));
}

fn owned(body: &[u8]) -> Vec<OwnedSample> {
    parse_strict(body)
        .unwrap()
        .iter()
        .map(Sample::to_owned_sample)
        .collect()
}

fn written(samples: &[OwnedSample]) -> Vec<u8> {
    let mut out = Vec::new();
    for s in samples {
        write_owned_sample(&mut out, s);
    }
    out
}

/// Equal sample lists, where a `NaN` value equals a `NaN` (alltypes has `NaN` quantiles).
fn assert_same(got: &[OwnedSample], want: &[OwnedSample], path: &Path) {
    assert_eq!(got.len(), want.len(), "{}", path.display());
    for (g, w) in got.iter().zip(want) {
        let values_match = g.value.to_bits() == w.value.to_bits() || g.value == w.value;
        assert!(
            g.name == w.name
                && g.labels == w.labels
                && g.timestamp_ms == w.timestamp_ms
                && values_match,
            "{}: {g:?} != {w:?}",
            path.display()
        );
    }
}

#[test]
fn writing_parsed_fixtures_gives_the_same_samples_and_is_stable() {
    for path in fixture_files() {
        let body = std::fs::read(&path).unwrap();
        let parsed = owned(&body);
        let once = written(&parsed);
        let reparsed = owned(&once);
        // Labels come back sorted by name; compare as sorted sets of pairs.
        let sorted = |samples: &[OwnedSample]| -> Vec<OwnedSample> {
            samples
                .iter()
                .map(|s| {
                    let mut s = s.clone();
                    s.labels.sort();
                    s
                })
                .collect()
        };
        assert_same(&sorted(&reparsed), &sorted(&parsed), &path);
        assert_eq!(written(&reparsed), once, "{}", path.display());
    }
}

#[test]
fn writing_alltypes_values_reproduces_the_go_text() {
    // The fixture was written by Go's expfmt, so our writer must print every value the
    // same way: compare each sample line's value text.
    let body = read("prometheus/alltypes.237mfs.prom.txt");
    let text = std::str::from_utf8(&body).unwrap();
    let sample_lines = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty());
    for (line, sample) in sample_lines.zip(parse_strict(&body).unwrap()) {
        let mut out = Vec::new();
        grid_signals::exposition::write_value(&mut out, sample.value);
        let value_text = line.rsplit(' ').next().unwrap();
        assert_eq!(std::str::from_utf8(&out).unwrap(), value_text, "{line}");
    }
}

/// Bodies whose verdict Prometheus' scrape parser, its storage and Python's
/// `prometheus_client` agree on for text 0.0.4 (the `OpenMetrics` parser suite's
/// 0.0.4-applicable cases and the Go parser's tests): accepted bodies give
/// these sample names, refused ones fail on this line with this reason.
#[test]
fn bodies_the_reference_parsers_agree_on_get_the_same_verdict() {
    use grid_signals::Error;
    use grid_signals::exposition::SyntaxError;
    let accepted: &[(&str, &[&str])] = &[
        ("m {a=\"b\"} 1\n", &["m"]),
        ("m\t{a=\"b\"} 1\n", &["m"]),
        ("m  {} 1\n", &["m"]),
        ("# UNIT \nm 1\n", &["m"]),
        ("# UNIT - x\nm 1\n", &["m"]),
        ("# UNIT m seconds\nm 1\n", &["m"]),
        ("a 1\n# EOF\nb 2\n", &["a", "b"]),
        ("# EOF\n# EOF\na 1\n", &["a"]),
        ("m{a=\"1\",b=\"1\"} 1\n", &["m"]),
    ];
    for (body, names) in accepted {
        let got: Vec<&str> = parse_strict(body.as_bytes())
            .unwrap_or_else(|e| panic!("{body:?}: {e}"))
            .iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(&got, names, "{body:?}");
    }
    let refused: &[(&str, usize, SyntaxError)] = &[
        ("a{a=\"1\",a=\"2\"} 1\n", 1, SyntaxError::DuplicateLabel),
        (
            "a 1\na{b=\"1\", a=\"2\", b=\"3\"} 1\n",
            2,
            SyntaxError::DuplicateLabel,
        ),
        ("m{__name__=\"m\"} 1\n", 1, SyntaxError::DuplicateLabel),
        (
            "m{a=\"1\",__name__=\"x\"} 1\n",
            1,
            SyntaxError::DuplicateLabel,
        ),
    ];
    for (body, line, kind) in refused {
        match parse_strict(body.as_bytes()) {
            Err(Error::Parse {
                line: l, kind: k, ..
            }) => {
                assert_eq!((l, k), (*line, *kind), "{body:?}");
            }
            other => panic!("{body:?} gave {other:?}"),
        }
    }
}
