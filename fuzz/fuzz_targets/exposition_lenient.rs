#![no_main]
//! Lenient mode on arbitrary bytes. Asserts: no panic; at most one item per line; every
//! error names a line that exists and a column inside it; every sample round-trips
//! through the writer; metadata names are valid metric names.

use grid_signals::Error;
use grid_signals::exposition::{Line, lines, samples, write_owned_sample};
use libfuzzer_sys::fuzz_target;

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
    for item in lines(data) {
        items += 1;
        match item {
            Ok(Line::Sample(sample)) => {
                assert!(is_metric_name(sample.name));
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
});
