//! Properties of the parser and the writer together: what the writer writes parses back
//! to the same samples, writing what was parsed is stable, and the two modes agree.

#![allow(
    clippy::float_cmp,
    reason = "round trips must give back exactly the same values"
)]

use proptest::prelude::*;

use grid_signals::Error;
use grid_signals::exposition::{
    Line, MetricType, OwnedSample, Sample, lines, parse_strict, samples, write_help,
    write_owned_sample, write_type, write_value,
};

fn metric_name() -> impl Strategy<Value = String> {
    "[a-zA-Z_:][a-zA-Z0-9_:]{0,24}"
}

fn label_name() -> impl Strategy<Value = String> {
    "[a-zA-Z_][a-zA-Z0-9_]{0,12}"
}

/// Any text, weighted towards the characters that need escaping or look like syntax.
fn label_value() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,16}",
        "[\"\\\\\n,{}= a#λ\t\r]{0,12}",
        Just(String::new()),
    ]
}

fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>(),
        (0u32..100_000).prop_map(f64::from),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        (-1e6..1e6f64),
    ]
}

/// A label name other than `__name__`, which the metric name already sets.
fn free_label_name() -> impl Strategy<Value = String> {
    label_name().prop_filter("`__name__` is the metric name", |n| n != "__name__")
}

/// A label name drawn from few, often alike: repeats, shared eight-byte prefixes,
/// equal lengths and `__name__` are common.
fn clashing_label_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_owned()),
        Just("ab".to_owned()),
        Just("le".to_owned()),
        Just("plugin_name".to_owned()),
        Just("plugin_type".to_owned()),
        Just("abcdefgh".to_owned()),
        Just("abcdefgh_".to_owned()),
        Just("__name__".to_owned()),
        Just("__name".to_owned()),
        label_name(),
    ]
}

/// A sample as the writer emits it: label names unique and sorted.
fn owned_sample() -> impl Strategy<Value = OwnedSample> {
    (
        metric_name(),
        prop::collection::btree_map(free_label_name(), label_value(), 0..10),
        value(),
        prop::option::of(any::<i64>()),
    )
        .prop_map(|(name, labels, value, timestamp_ms)| OwnedSample {
            name,
            labels: labels.into_iter().collect(),
            value,
            timestamp_ms,
        })
}

fn same(a: &OwnedSample, b: &OwnedSample) -> bool {
    let values = a.value == b.value || (a.value.is_nan() && b.value.is_nan());
    a.name == b.name && a.labels == b.labels && a.timestamp_ms == b.timestamp_ms && values
}

fn write_all(samples: &[OwnedSample]) -> Vec<u8> {
    let mut out = Vec::new();
    for s in samples {
        write_owned_sample(&mut out, s);
    }
    out
}

fn parse_owned(body: &[u8]) -> Vec<OwnedSample> {
    parse_strict(body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
        .iter()
        .map(Sample::to_owned_sample)
        .collect()
}

/// Label-value escaping written independently of the crate's writer.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Text for `samples` the way various exporters write it: `", "` or `","` between
/// labels, an optional trailing comma, blanks around tokens (between the name and `{`
/// too), `\r\n`, metadata lines.
fn exporter_text(samples: &[OwnedSample], style: u8) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, s) in samples.iter().enumerate() {
        if style & 1 != 0 {
            write_help(&mut out, &s.name, "some \\ help\nwith a newline");
            write_type(&mut out, &s.name, MetricType::Gauge);
        }
        out.extend_from_slice(s.name.as_bytes());
        if !s.labels.is_empty() || style & 4 != 0 {
            let sep = if style & 2 != 0 { ", " } else { "," };
            let pairs: Vec<String> = s
                .labels
                .iter()
                .map(|(n, v)| format!("{n}=\"{}\"", escape(v)))
                .collect();
            if style & 64 != 0 {
                out.extend_from_slice(if i % 2 == 0 { b" " } else { b"\t " });
            }
            out.push(b'{');
            out.extend_from_slice(pairs.join(sep).as_bytes());
            if style & 4 != 0 && !s.labels.is_empty() {
                out.push(b',');
            }
            out.push(b'}');
        }
        out.extend_from_slice(if style & 8 != 0 { b" \t" } else { b" " });
        write_value(&mut out, s.value);
        if let Some(ts) = s.timestamp_ms {
            out.extend_from_slice(format!(" {ts}").as_bytes());
        }
        out.extend_from_slice(if style & 8 != 0 { b"  \r\n" } else { b"\n" });
        if style & 16 != 0 && i % 2 == 0 {
            out.extend_from_slice(b"\n# a comment\n");
        }
    }
    if style & 32 != 0 {
        out.extend_from_slice(b"# EOF");
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn parse_of_write_gives_back_the_samples(samples in prop::collection::vec(owned_sample(), 0..20)) {
        let text = write_all(&samples);
        let parsed = parse_owned(&text);
        prop_assert_eq!(parsed.len(), samples.len());
        for (got, want) in parsed.iter().zip(&samples) {
            prop_assert!(same(got, want), "{:?} != {:?}", got, want);
        }
    }

    #[test]
    fn write_of_parse_is_stable_whatever_the_exporter_style(
        samples in prop::collection::vec(owned_sample(), 0..12),
        style in 0u8..128,
    ) {
        let text = exporter_text(&samples, style);
        let parsed = parse_owned(&text);
        prop_assert_eq!(parsed.len(), samples.len());
        for (got, want) in parsed.iter().zip(&samples) {
            prop_assert!(same(got, want), "{:?} != {:?}", got, want);
        }
        let once = write_all(&parsed);
        let twice = write_all(&parse_owned(&once));
        prop_assert_eq!(once, twice);
    }

    #[test]
    fn a_label_set_parses_exactly_when_its_names_are_distinct_and_none_is_name(
        names in prop::collection::vec(clashing_label_name(), 1..24),
        spaced in any::<bool>(),
    ) {
        let sep = if spaced { ", " } else { "," };
        let pairs: Vec<String> = names.iter().map(|n| format!("{n}=\"v\"")).collect();
        let text = format!("m{{{}}} 1\n", pairs.join(sep));
        let distinct = names.iter().collect::<std::collections::BTreeSet<_>>().len() == names.len();
        let valid = distinct && !names.iter().any(|n| n == "__name__");
        let parsed = parse_strict(text.as_bytes());
        if valid {
            prop_assert_eq!(parsed.map(|s| s[0].labels.len()), Ok(names.len()), "{}", text);
        } else {
            // The column is the first name that repeats an earlier one (or is `__name__`).
            let first_bad = names
                .iter()
                .enumerate()
                .position(|(j, n)| n == "__name__" || names[..j].contains(n))
                .unwrap();
            let column = 3 + pairs[..first_bad].iter().map(|p| p.len() + sep.len()).sum::<usize>();
            prop_assert_eq!(
                parsed,
                Err(Error::Parse {
                    line: 1,
                    column,
                    kind: grid_signals::exposition::SyntaxError::DuplicateLabel,
                }),
                "{}",
                text
            );
        }
    }

    #[test]
    fn an_eof_line_anywhere_ends_nothing(
        samples in prop::collection::vec(owned_sample(), 0..12),
        at in any::<prop::sample::Index>(),
    ) {
        let cut = at.index(samples.len() + 1);
        let mut text = write_all(&samples[..cut]);
        text.extend_from_slice(b"# EOF\n");
        text.extend_from_slice(&write_all(&samples[cut..]));
        let parsed = parse_owned(&text);
        prop_assert_eq!(parsed.len(), samples.len());
        for (got, want) in parsed.iter().zip(&samples) {
            prop_assert!(same(got, want), "{:?} != {:?}", got, want);
        }
    }

    #[test]
    fn strict_and_lenient_agree_on_any_bytes(body in prop::collection::vec(any::<u8>(), 0..400)) {
        check_modes_agree(&body);
    }

    #[test]
    fn strict_and_lenient_agree_on_mangled_expositions(
        samples in prop::collection::vec(owned_sample(), 1..6),
        cut in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut body = exporter_text(&samples, 1);
        let at = cut.index(body.len());
        body[at] = byte;
        check_modes_agree(&body);
    }
}

type Key = Result<(String, Vec<(String, String)>, u64, Option<i64>), Error>;

/// A comparable form of a sample result: `NaN`s compare equal, `-0` equals `0`.
fn key(item: &Result<Sample<'_>, Error>) -> Key {
    item.clone().map(|s| {
        let o = s.to_owned_sample();
        let bits = if o.value.is_nan() {
            f64::NAN.to_bits()
        } else {
            (o.value + 0.0).to_bits()
        };
        (o.name, o.labels, bits, o.timestamp_ms)
    })
}

fn keys(items: &[Result<Sample<'_>, Error>]) -> Vec<Key> {
    items.iter().map(key).collect()
}

/// Strict yields exactly the lenient samples up to the first lenient error, then that
/// error (`# EOF` ends neither); error positions lie inside the body.
fn check_modes_agree(body: &[u8]) {
    let lenient: Vec<Result<Line<'_>, Error>> = lines(body).collect();
    let strict: Vec<Result<Sample<'_>, Error>> = samples(body).collect();
    let line_count = body.split(|&b| b == b'\n').count();
    let mut expected = Vec::new();
    for item in &lenient {
        match item {
            Err(e) => {
                expected.push(Err(e.clone()));
                break;
            }
            Ok(Line::Sample(s)) => expected.push(Ok(*s)),
            Ok(_) => {}
        }
    }
    for item in &lenient {
        if let Err(Error::Parse { line, column, .. }) = item {
            assert!(
                *line >= 1 && *line <= line_count,
                "line {line} of {line_count}"
            );
            assert!(*column >= 1, "column {column}");
        }
    }
    assert_eq!(keys(&strict), keys(&expected));
}

#[test]
fn labels_written_out_of_order_come_back_sorted() {
    let mut out = Vec::new();
    grid_signals::exposition::write_sample(&mut out, "m", &[("b", "2"), ("a", "1")], 1.0, None);
    let parsed = parse_owned(&out);
    assert_eq!(
        parsed[0].labels,
        vec![("a".into(), "1".into()), ("b".into(), "2".into())]
    );
}
