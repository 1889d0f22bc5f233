#![no_main]
//! Lenient mode on arbitrary bytes. Asserts: no panic; at most one item per line; every
//! error names a line that exists and a column inside it; every sample round-trips
//! through the writer and has each label name once, none `__name__`; metadata names are
//! valid metric names; strict mode yields exactly the lenient samples up to the first
//! lenient error, then that error (`# EOF` ends neither); the EPP body reader counts
//! every refused line, keeps only lenient samples, and calls the body unusable exactly
//! when some line was refused and no sample parsed.

use grid_signals::Error;
use grid_signals::epp::ScrapeBody;
use grid_signals::exposition::{Line, Sample, lines, samples, write_owned_sample};
use libfuzzer_sys::fuzz_target;

/// Each label name once, and never `__name__`.
fn labels_are_distinct(sample: &Sample<'_>) -> bool {
    let names: Vec<&str> = sample.labels.iter().map(|(n, _)| n).collect();
    names
        .iter()
        .enumerate()
        .all(|(j, n)| *n != "__name__" && !names[..j].contains(n))
}

/// Bit-exact equality of two samples (`NaN` payloads included).
fn same_sample(a: &Sample<'_>, b: &Sample<'_>) -> bool {
    a.name == b.name
        && a.labels == b.labels
        && a.value.to_bits() == b.value.to_bits()
        && a.timestamp_ms == b.timestamp_ms
}

fn is_metric_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

fuzz_target!(|data: &[u8]| {
    let line_texts: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    let mut items = 0;
    let mut lenient_samples = Vec::new();
    let mut errors = 0u64;
    // What strict mode must yield: the samples before the first error, then it.
    let mut strict_expected: Vec<Result<Sample<'_>, Error>> = Vec::new();
    for item in lines(data) {
        items += 1;
        if strict_expected.last().is_none_or(Result::is_ok) {
            match &item {
                Ok(Line::Sample(s)) => strict_expected.push(Ok(*s)),
                Err(e) => strict_expected.push(Err(e.clone())),
                Ok(_) => {}
            }
        }
        match item {
            Ok(Line::Sample(sample)) => {
                lenient_samples.push(sample);
                assert!(is_metric_name(sample.name));
                assert!(labels_are_distinct(&sample), "{sample:?}");
                let owned = sample.to_owned_sample();
                let mut text = Vec::new();
                write_owned_sample(&mut text, &owned);
                let back = samples(&text).next().expect("one sample").expect("parses");
                let back = back.to_owned_sample();
                assert_eq!(back.name, owned.name);
                assert_eq!(back.labels.len(), owned.labels.len());
                assert_eq!(back.timestamp_ms, owned.timestamp_ms);
                assert!(
                    back.value.to_bits() == owned.value.to_bits()
                        || (back.value.is_nan() && owned.value.is_nan())
                        || (back.value == 0.0 && owned.value == 0.0)
                );
            }
            Ok(Line::Help { name, .. } | Line::Type { name, .. } | Line::Unit { name, .. }) => {
                assert!(is_metric_name(name));
            }
            Ok(_) => {}
            Err(Error::Parse { line, column, .. }) => {
                errors += 1;
                let text = line_texts[line - 1];
                assert!(
                    column >= 1 && column <= text.len() + 1,
                    "{column} in {text:?}"
                );
            }
            Err(other) => panic!("lenient parse gave {other:?}"),
        }
    }
    assert!(items <= line_texts.len());

    let strict: Vec<Result<Sample<'_>, Error>> = samples(data).collect();
    assert_eq!(strict.len(), strict_expected.len());
    for (got, want) in strict.iter().zip(&strict_expected) {
        match (got, want) {
            (Ok(g), Ok(w)) => assert!(same_sample(g, w), "{g:?} vs {w:?}"),
            (g, w) => assert_eq!(g, w),
        }
    }

    let body = ScrapeBody::parse(data);
    assert_eq!(body.refused().total(), errors);
    assert_eq!(body.sample_lines(), lenient_samples.len());
    assert_eq!(body.is_unusable(), errors > 0 && lenient_samples.is_empty());
    // The samples kept are lenient samples, in order (a left-out family removes some).
    let mut rest = lenient_samples.iter();
    for kept in body.samples() {
        assert!(
            rest.any(|s| same_sample(s, kept)),
            "{kept:?} not read leniently"
        );
    }
});
