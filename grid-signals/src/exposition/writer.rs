//! Encodes samples back to exposition text, the way the operator serves
//! `/v1/site/signals` and relays its store.
//!
//! Output is canonical so that equal sample sets give equal bytes: labels sorted by name,
//! one `,` between labels and no blanks inside braces, values printed as Go's `expfmt`
//! prints them (so our text diffs cleanly against an EPP's), timestamps kept.

use std::io::Write as _;

use super::labels::{escape_help, escape_label_value};
use super::sample::{MetricType, OwnedSample};

/// Appends one sample line. Labels are written sorted by name (stable for equal names),
/// values escaped; the caller passes names already valid for the format.
pub fn write_sample(
    out: &mut Vec<u8>,
    name: &str,
    labels: &[(&str, &str)],
    value: f64,
    timestamp_ms: Option<i64>,
) {
    out.extend_from_slice(name.as_bytes());
    if !labels.is_empty() {
        out.push(b'{');
        if labels.windows(2).all(|w| w[0].0 <= w[1].0) {
            write_labels(out, labels.iter());
        } else {
            let mut sorted: Vec<&(&str, &str)> = labels.iter().collect();
            sorted.sort_by_key(|(n, _)| *n);
            write_labels(out, sorted.into_iter());
        }
        out.push(b'}');
    }
    out.push(b' ');
    write_value(out, value);
    if let Some(ts) = timestamp_ms {
        out.push(b' ');
        // Writing to a Vec cannot fail.
        let _ = write!(out, "{ts}");
    }
    out.push(b'\n');
}

/// Appends an owned sample with [`write_sample`].
pub fn write_owned_sample(out: &mut Vec<u8>, sample: &OwnedSample) {
    let labels: Vec<(&str, &str)> = sample
        .labels
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    write_sample(
        out,
        &sample.name,
        &labels,
        sample.value,
        sample.timestamp_ms,
    );
}

fn write_labels<'l>(out: &mut Vec<u8>, labels: impl Iterator<Item = &'l (&'l str, &'l str)>) {
    for (i, (name, value)) in labels.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"=\"");
        escape_label_value(out, value);
        out.push(b'"');
    }
}

/// Appends `# TYPE name kind`.
pub fn write_type(out: &mut Vec<u8>, name: &str, kind: MetricType) {
    out.extend_from_slice(b"# TYPE ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    out.extend_from_slice(kind.as_str().as_bytes());
    out.push(b'\n');
}

/// Appends `# HELP name text`, escaping `\` and newlines in the text.
pub fn write_help(out: &mut Vec<u8>, name: &str, text: &str) {
    out.extend_from_slice(b"# HELP ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    escape_help(out, text);
    out.push(b'\n');
}

/// Appends `value` as Go's `expfmt` does: `NaN`, `+Inf`, `-Inf`, and otherwise
/// `strconv.FormatFloat(v, 'g', -1, 64)`: the shortest digits that round-trip, in
/// exponent form (`1.5e+06`, `1e-05`) when the decimal exponent is below -4 or at
/// least 6.
pub fn write_value(out: &mut Vec<u8>, value: f64) {
    if value.is_nan() {
        out.extend_from_slice(b"NaN");
        return;
    }
    if value.is_infinite() {
        out.extend_from_slice(if value > 0.0 { b"+Inf" } else { b"-Inf" });
        return;
    }
    if value == 0.0 {
        // Go prints both zeros as "0".
        out.push(b'0');
        return;
    }
    if value < 0.0 {
        out.push(b'-');
    }
    // Rust's `{:e}` gives the shortest round-trip digits: `d[.ddd]e[-]x`.
    let mut buf = [0u8; 40];
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    // 40 bytes hold any f64 in `{:e}` form (at most 17 digits, a point and `e-324`).
    let _ = write!(cursor, "{:e}", value.abs());
    let written = cursor.position() as usize;
    let text = &buf[..written];
    let e_at = text.iter().position(|&b| b == b'e').unwrap_or(text.len());
    let mut digits = [0u8; 20];
    let mut nd = 0;
    for &b in &text[..e_at] {
        if b.is_ascii_digit() && nd < digits.len() {
            digits[nd] = b;
            nd += 1;
        }
    }
    let digits = &digits[..nd];
    let exp: i32 = std::str::from_utf8(text.get(e_at + 1..).unwrap_or_default())
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    if !(-4..6).contains(&exp) {
        out.push(digits[0]);
        if digits.len() > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        out.push(if exp < 0 { b'-' } else { b'+' });
        let magnitude = exp.unsigned_abs();
        if magnitude < 10 {
            out.push(b'0');
        }
        let _ = write!(out, "{magnitude}");
    } else if exp >= 0 {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            out.extend_from_slice(digits);
            out.extend(std::iter::repeat_n(b'0', int_len - digits.len()));
        } else {
            out.extend_from_slice(&digits[..int_len]);
            out.push(b'.');
            out.extend_from_slice(&digits[int_len..]);
        }
    } else {
        out.extend_from_slice(b"0.");
        out.extend(std::iter::repeat_n(b'0', exp.unsigned_abs() as usize - 1));
        out.extend_from_slice(digits);
    }
}

#[cfg(test)]
#[allow(
    clippy::float_cmp,
    reason = "parsed values must be exactly the written ones"
)]
mod tests {
    use super::*;

    fn value_text(v: f64) -> String {
        let mut out = Vec::new();
        write_value(&mut out, v);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn values_print_like_go_strconv_g() {
        // Expected strings are what Go's strconv.FormatFloat(v, 'g', -1, 64) prints;
        // several appear verbatim in the alltypes fixture.
        let cases: [(f64, &str); 18] = [
            (0.0, "0"),
            (-0.0, "0"),
            (1.0, "1"),
            (-1.0, "-1"),
            (190_932.0, "190932"),
            (999_999.0, "999999"),
            (1e6, "1e+06"),
            (4.059_092e6, "4.059092e+06"),
            (7.6238e-05, "7.6238e-05"),
            (0.0001, "0.0001"),
            (0.000_135_819, "0.000135819"),
            (44.985_611_511, "44.985611511"),
            (1.942_910_644_2e10, "1.9429106442e+10"),
            (5.937_322_571_024e12, "5.937322571024e+12"),
            (1e21, "1e+21"),
            (1.5e-300, "1.5e-300"),
            (f64::MAX, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
        ];
        for (v, want) in cases {
            assert_eq!(value_text(v), want, "{v:e}");
        }
        assert_eq!(value_text(f64::NAN), "NaN");
        assert_eq!(value_text(f64::INFINITY), "+Inf");
        assert_eq!(value_text(f64::NEG_INFINITY), "-Inf");
        assert_eq!(value_text(-0.25), "-0.25");
    }

    #[test]
    fn samples_are_written_with_sorted_escaped_labels_and_timestamps() {
        let mut out = Vec::new();
        write_sample(
            &mut out,
            "m",
            &[("z", "a\"b"), ("a", "x\\y\nz")],
            2.5,
            Some(-3),
        );
        write_sample(&mut out, "n", &[], 1.0, None);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "m{a=\"x\\\\y\\nz\",z=\"a\\\"b\"} 2.5 -3\nn 1\n"
        );
    }

    #[test]
    fn metadata_lines_are_written() {
        let mut out = Vec::new();
        write_help(&mut out, "m", "a\\b\nc");
        write_type(&mut out, "m", MetricType::Summary);
        assert_eq!(out, b"# HELP m a\\\\b\\nc\n# TYPE m summary\n");
    }
}
