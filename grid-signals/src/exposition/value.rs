//! Sample values and timestamps as Go's exporters print them.
//!
//! Most values are short decimals (`0`, `3`, `0.25`, `1.9429106442e+10`); those take an
//! exact fast path (Clinger: an integer mantissa below 2^53 scaled by an exactly
//! representable power of ten is correctly rounded by one multiply or divide). Everything
//! else (long mantissas, large exponents, `NaN`, `+Inf`) goes through the standard
//! library's correctly rounded parser, so both paths give the same bits.

use super::scan::{Class, is_blank, run_len};

/// Exactly representable powers of ten, 1e0 through 1e22.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// The largest mantissa the fast path may scale: 2^53, every integer up to it is exact.
const MAX_EXACT_MANTISSA: u64 = 1 << 53;

/// The most decimal digits the fast path accumulates (10^19 < 2^64).
const MAX_FAST_DIGITS: usize = 19;

/// Accumulates the digits of `text` from `i` into `mantissa` (wrapping; the caller
/// bounds the count), eight at a time where it can; returns where the digits end.
#[inline]
fn digit_run(text: &[u8], mut i: usize, mantissa: &mut u64) -> usize {
    while let Some(chunk) = text.get(i..).and_then(<[u8]>::first_chunk::<8>) {
        let word = u64::from_le_bytes(*chunk);
        if !all_digits(word) {
            break;
        }
        *mantissa = mantissa
            .wrapping_mul(100_000_000)
            .wrapping_add(eight_digits(word));
        i += 8;
    }
    while let Some(&b) = text.get(i) {
        if !b.is_ascii_digit() {
            break;
        }
        *mantissa = mantissa.wrapping_mul(10).wrapping_add(u64::from(b - b'0'));
        i += 1;
    }
    i
}

/// Whether all eight bytes of `word` are ASCII digits.
#[inline]
fn all_digits(word: u64) -> bool {
    let high = word & 0xf0f0_f0f0_f0f0_f0f0;
    let carried = (word.wrapping_add(0x0606_0606_0606_0606) & 0xf0f0_f0f0_f0f0_f0f0) >> 4;
    high | carried == 0x3333_3333_3333_3333
}

/// The value of eight ASCII digits read little-endian (first digit in the low byte).
#[inline]
fn eight_digits(word: u64) -> u64 {
    let v = word - 0x3030_3030_3030_3030;
    let v = v * 10 + (v >> 8);
    let low = (v & 0x0000_00ff_0000_00ff).wrapping_mul(100 + (1_000_000 << 32));
    let high = ((v >> 16) & 0x0000_00ff_0000_00ff).wrapping_mul(1 + (10_000 << 32));
    low.wrapping_add(high) >> 32
}

/// Parses the value at the start of `line` (the rest of a sample line): returns it and
/// the length of its token, which ends at a blank or the end of the line. `None` when the
/// token is not a float.
#[inline]
pub(crate) fn parse_value(line: &[u8]) -> Option<(f64, usize)> {
    if let Some((value, len)) = fast_decimal(line)
        && line.get(len).is_none_or(|&b| is_blank(b))
    {
        return Some((value, len));
    }
    let len = run_len(line, Class::Token);
    slow_value(&line[..len]).map(|value| (value, len))
}

/// The exact fast path over the longest decimal prefix of `text`; `None` means "not
/// simple enough", not "invalid".
#[inline]
fn fast_decimal(text: &[u8]) -> Option<(f64, usize)> {
    let (negative, digits, sign_len) = match text.split_first()? {
        (b'-', rest) => (true, rest, 1),
        (b'+', rest) => (false, rest, 1),
        _ => (false, text, 0),
    };
    let mut mantissa: u64 = 0;
    let mut exp10: i32 = 0;
    let mut i = digit_run(digits, 0, &mut mantissa);
    let mut count = i;
    if digits.get(i) == Some(&b'.') {
        let start = i + 1;
        i = digit_run(digits, start, &mut mantissa);
        exp10 = -((i - start) as i32);
        count += i - start;
    }
    // Up to 19 digits cannot overflow the u64 mantissa; leading zeros count too, which
    // only sends a few more values to the slow path.
    if count == 0 || count > MAX_FAST_DIGITS {
        return None;
    }
    if let Some(&(b'e' | b'E')) = digits.get(i) {
        i += 1;
        let exp_negative = match digits.get(i) {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        let start = i;
        let mut exp: i32 = 0;
        while let Some(&b) = digits.get(i) {
            if !b.is_ascii_digit() {
                break;
            }
            if i - start >= 4 {
                return None;
            }
            exp = exp * 10 + i32::from(b - b'0');
            i += 1;
        }
        if i == start {
            return None;
        }
        exp10 += if exp_negative { -exp } else { exp };
    }
    if mantissa > MAX_EXACT_MANTISSA {
        return None;
    }
    let magnitude = mantissa as f64;
    let value = if exp10 >= 0 {
        magnitude * *POW10.get(exp10 as usize)?
    } else {
        magnitude / *POW10.get(exp10.unsigned_abs() as usize)?
    };
    Some((if negative { -value } else { value }, sign_len + i))
}

/// Everything the fast path declines: the standard library parser, which is correctly
/// rounded and knows `NaN`, `Inf` and `infinity` in any case, with a sign.
#[cold]
fn slow_value(token: &[u8]) -> Option<f64> {
    std::str::from_utf8(token).ok()?.parse().ok()
}

/// Parses a millisecond timestamp: an optionally signed decimal integer that fits `i64`.
#[inline]
pub(crate) fn parse_timestamp(token: &[u8]) -> Option<i64> {
    let (negative, digits) = match token.split_first()? {
        (b'-', rest) => (true, rest),
        (b'+', rest) => (false, rest),
        _ => (false, token),
    };
    if digits.is_empty() {
        return None;
    }
    let mut magnitude: i64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        let digit = i64::from(b - b'0');
        magnitude = magnitude.checked_mul(10)?;
        magnitude = if negative {
            magnitude.checked_sub(digit)?
        } else {
            magnitude.checked_add(digit)?
        };
    }
    Some(magnitude)
}

#[cfg(test)]
#[allow(
    clippy::float_cmp,
    reason = "parsed values must be exactly the written ones"
)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The value of a whole token, `None` unless all of it is the value.
    fn value_of(token: &[u8]) -> Option<f64> {
        parse_value(token).and_then(|(v, len)| (len == token.len()).then_some(v))
    }

    #[test]
    fn the_value_token_ends_at_a_blank() {
        assert_eq!(parse_value(b"1.5 123"), Some((1.5, 3)));
        assert_eq!(parse_value(b"+Inf\t1"), Some((f64::INFINITY, 4)));
        assert_eq!(parse_value(b"1.5x 123"), None);
    }

    #[test]
    fn go_value_forms_parse() {
        let cases: [(&str, f64); 12] = [
            ("0", 0.0),
            ("1", 1.0),
            ("-1", -1.0),
            ("0.25", 0.25),
            ("7.6238e-05", 7.6238e-05),
            ("1.9429106442e+10", 1.942_910_644_2e10),
            ("+Inf", f64::INFINITY),
            ("-Inf", f64::NEG_INFINITY),
            ("1E3", 1000.0),
            (".5", 0.5),
            ("5.", 5.0),
            ("9.03676723e+08", 9.036_767_23e8),
        ];
        for (text, want) in cases {
            assert_eq!(value_of(text.as_bytes()), Some(want), "{text}");
        }
        assert!(value_of(b"NaN").unwrap().is_nan());
    }

    #[test]
    fn non_values_are_refused() {
        for text in [
            "", "-", "+", "e5", "1e", "1e+", "1.2.3", "0x10", "1,5", "abc", "1 ",
        ] {
            assert_eq!(value_of(text.as_bytes()), None, "{text:?}");
        }
    }

    #[test]
    fn hard_values_match_the_standard_library() {
        for text in [
            "9007199254740993",
            "123456789012345678901234567890",
            "1e-400",
            "1e400",
            "2.2250738585072011e-308",
            "0.1000000000000000055511151231257827",
            "4.9e-324",
        ] {
            let want: f64 = text.parse().unwrap();
            assert_eq!(
                value_of(text.as_bytes()).map(f64::to_bits),
                Some(want.to_bits())
            );
        }
    }

    #[test]
    fn eight_digit_words_are_recognised_and_valued() {
        assert_eq!(eight_digits(u64::from_le_bytes(*b"12345678")), 12_345_678);
        assert_eq!(eight_digits(u64::from_le_bytes(*b"00000009")), 9);
        assert!(all_digits(u64::from_le_bytes(*b"09876543")));
        for bad in [
            b"1234567.",
            b"/1234567",
            b"1234567:",
            b"12 45678",
            b"\xb02345678",
        ] {
            assert!(!all_digits(u64::from_le_bytes(*bad)), "{bad:?}");
        }
    }

    #[test]
    fn values_at_and_past_the_fast_digit_limit_are_both_exact() {
        let at = "0.000000000001234567"; // 19 digits: fast path
        let past = "0.0000000000001234567"; // 20 digits: standard library
        assert!(fast_decimal(at.as_bytes()).is_some());
        assert!(fast_decimal(past.as_bytes()).is_none());
        for text in [at, past] {
            let want: f64 = text.parse().unwrap();
            assert_eq!(
                value_of(text.as_bytes()).map(f64::to_bits),
                Some(want.to_bits())
            );
        }
    }

    #[test]
    fn timestamps_are_signed_integers_that_fit() {
        assert_eq!(parse_timestamp(b"1395066363000"), Some(1_395_066_363_000));
        assert_eq!(parse_timestamp(b"-5"), Some(-5));
        assert_eq!(parse_timestamp(b"+5"), Some(5));
        assert_eq!(parse_timestamp(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_timestamp(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_timestamp(b"9223372036854775808"), None);
        for bad in ["", "-", "1.5", "1e3", "12a"] {
            assert_eq!(parse_timestamp(bad.as_bytes()), None, "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn fast_path_agrees_with_std_on_printed_floats(v in any::<f64>()) {
            for text in [format!("{v}"), format!("{v:e}"), format!("{v:.3}")] {
                let want: f64 = text.parse().unwrap();
                let got = value_of(text.as_bytes()).unwrap();
                prop_assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{text}");
            }
        }

        #[test]
        fn fast_path_agrees_with_std_on_decimals(m in 0u64..10_000_000_000_000_000_000, e in -30i32..30, neg in any::<bool>()) {
            let text = format!("{}{m}e{e}", if neg { "-" } else { "" });
            let want: f64 = text.parse().unwrap();
            prop_assert_eq!(value_of(text.as_bytes()).map(f64::to_bits), Some(want.to_bits()));
        }
    }
}
