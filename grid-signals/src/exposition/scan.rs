//! Byte-class scans for the hot loops of the grammar, eight bytes at a time.
//!
//! Names, label values and value tokens are short runs of one byte class. Classifying a
//! whole `u64` word with add-and-mask tricks (SWAR) costs a few instructions per eight
//! bytes, where a byte loop costs a few per byte; it needs no `unsafe` and no target
//! features. Each class marks the high bit of every byte that belongs to it.

#![allow(
    clippy::inline_always,
    reason = "run_len must be specialised per class at each call site for the class match to fold away"
)]

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;
const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;

/// High bit set in each byte of `lo7` (bytes below 0x80) that is `>= m` (1 ≤ m ≤ 128).
#[inline(always)]
const fn at_least(lo7: u64, m: u8) -> u64 {
    lo7.wrapping_add(ONES * (128 - m as u64)) & HIGH
}

/// High bit set in each byte of `lo7` (bytes below 0x80) that is `<= n` (n ≤ 127).
#[inline(always)]
const fn at_most(lo7: u64, n: u8) -> u64 {
    !lo7.wrapping_add(ONES * (127 - n as u64)) & HIGH
}

/// High bit set in each byte of `lo7` (bytes below 0x80) equal to `c` (c ≤ 127).
#[inline(always)]
const fn equal(lo7: u64, c: u8) -> u64 {
    !(lo7 ^ (ONES * c as u64)).wrapping_add(LOW7) & HIGH
}

/// A byte class: which bytes a run may hold, word-wise and byte-wise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// `[a-zA-Z0-9_:]`
    MetricName,
    /// `[a-zA-Z0-9_]`
    LabelName,
    /// Anything but `"` and `\`.
    QuotedText,
    /// Anything but a space or a tab.
    Token,
}

impl Class {
    /// The high bit of every byte of `word` that belongs to the class.
    #[inline(always)]
    fn members(self, word: u64) -> u64 {
        let lo7 = word & LOW7;
        let ascii = !word & HIGH;
        match self {
            Class::MetricName | Class::LabelName => {
                let lower = lo7 | (ONES * 0x20);
                let letter = at_least(lower, b'a') & at_most(lower, b'z');
                let digit = at_least(lo7, b'0') & at_most(lo7, b'9');
                let mut name = letter | digit | equal(lo7, b'_');
                if self == Class::MetricName {
                    name |= equal(lo7, b':');
                }
                name & ascii
            }
            Class::QuotedText => !((equal(lo7, b'"') | equal(lo7, b'\\')) & ascii) & HIGH,
            Class::Token => !((equal(lo7, b' ') | equal(lo7, b'\t')) & ascii) & HIGH,
        }
    }

    /// A byte that never belongs to the class, to pad a short tail with.
    fn outsider(self) -> u8 {
        match self {
            Class::MetricName | Class::LabelName | Class::Token => b' ',
            Class::QuotedText => b'"',
        }
    }
}

/// Length of the longest prefix of `bytes` whose bytes all belong to `class`.
#[inline(always)]
pub(crate) fn run_len(bytes: &[u8], class: Class) -> usize {
    let mut n = 0;
    loop {
        let word = if let Some(chunk) = bytes[n..].first_chunk::<8>() {
            u64::from_le_bytes(*chunk)
        } else {
            tail_word(bytes, n, class.outsider())
        };
        let outside = !class.members(word) & HIGH;
        if outside != 0 {
            return n + (outside.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
}

/// The bytes of `bytes` from `n` on (fewer than eight) in the low bytes of a word, the
/// rest filled with `pad`. When the slice is long enough, the last eight bytes are read
/// as one word and shifted, which avoids a variable-length copy.
#[inline(always)]
fn tail_word(bytes: &[u8], n: usize, pad: u8) -> u64 {
    let tail_len = bytes.len() - n;
    if tail_len == 0 {
        return ONES * u64::from(pad);
    }
    let pad_bits = 8 * (8 - tail_len) as u32;
    if let Some(last) = bytes.last_chunk::<8>() {
        let tail = u64::from_le_bytes(*last) >> pad_bits;
        return tail | ((ONES * u64::from(pad)) << (64 - pad_bits));
    }
    let mut padded = [pad; 8];
    for (slot, &b) in padded.iter_mut().zip(&bytes[n..]) {
        *slot = b;
    }
    u64::from_le_bytes(padded)
}

/// Whether `s` is a metric name, `[a-zA-Z_:][a-zA-Z0-9_:]*`: the grammar's own rule, for
/// callers that check names they did not parse.
pub(crate) fn is_metric_name(s: &str) -> bool {
    is_name(s.as_bytes(), Class::MetricName)
}

/// Whether `s` is a label name, `[a-zA-Z_][a-zA-Z0-9_]*`.
pub(crate) fn is_label_name(s: &str) -> bool {
    is_name(s.as_bytes(), Class::LabelName)
}

/// A non-empty run of `class` bytes that does not start with a digit.
fn is_name(bytes: &[u8], class: Class) -> bool {
    bytes.first().is_some_and(|b| !b.is_ascii_digit()) && run_len(bytes, class) == bytes.len()
}

/// A space or a tab, the only blanks the format allows between tokens.
#[inline(always)]
pub(crate) fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// Skips blanks (usually none or one, so a plain loop).
#[inline(always)]
pub(crate) fn skip_blanks(mut bytes: &[u8]) -> &[u8] {
    while let Some((&b, rest)) = bytes.split_first() {
        if !is_blank(b) {
            break;
        }
        bytes = rest;
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn belongs(class: Class, b: u8) -> bool {
        match class {
            Class::MetricName => b.is_ascii_alphanumeric() || b == b'_' || b == b':',
            Class::LabelName => b.is_ascii_alphanumeric() || b == b'_',
            Class::QuotedText => b != b'"' && b != b'\\',
            Class::Token => !is_blank(b),
        }
    }

    const CLASSES: [Class; 4] = [
        Class::MetricName,
        Class::LabelName,
        Class::QuotedText,
        Class::Token,
    ];

    #[test]
    fn every_byte_is_classified_like_the_format_says() {
        for class in CLASSES {
            for b in 0..=255u8 {
                // The byte at each position of a word, surrounded by members.
                for pos in 0..8 {
                    let mut word = [b'a'; 8];
                    word[pos] = b;
                    let got = class.members(u64::from_le_bytes(word)) & (0x80 << (8 * pos)) != 0;
                    assert_eq!(got, belongs(class, b), "{class:?} {b:#x} at {pos}");
                }
            }
            assert!(!belongs(class, class.outsider()));
        }
    }

    #[test]
    fn names_follow_the_prometheus_alphabets() {
        for ok in ["a", "_", "a1", "A_b9", "x".repeat(40).as_str()] {
            assert!(is_metric_name(ok) && is_label_name(ok), "{ok}");
        }
        for name in [":", "a:b", "ns:metric_total"] {
            assert!(is_metric_name(name) && !is_label_name(name), "{name}");
        }
        for bad in ["", "1a", "a-b", "a b", "é", "a\u{e9}", "9"] {
            assert!(!is_metric_name(bad) && !is_label_name(bad), "{bad}");
        }
    }

    #[test]
    fn tail_words_hold_the_tail_then_padding() {
        let text = b"0123456789abc";
        for n in 0..=text.len() {
            for len in [text.len(), text.len().min(n + 7)] {
                let bytes = &text[..len];
                if len - n >= 8 {
                    continue;
                }
                let mut want = [b'~'; 8];
                want[..len - n].copy_from_slice(&bytes[n..]);
                assert_eq!(
                    tail_word(bytes, n, b'~'),
                    u64::from_le_bytes(want),
                    "{n} {len}"
                );
            }
        }
    }

    #[test]
    fn runs_end_at_the_first_outsider_across_word_edges_and_tails() {
        for class in CLASSES {
            for len in 0..40 {
                let mut text = vec![b'a'; len];
                assert_eq!(run_len(&text, class), len, "{class:?} {len}");
                text.extend_from_slice(b"\"\\ \t{}=");
                let stop = run_len(&text, class);
                let want = len
                    + text[len..]
                        .iter()
                        .take_while(|&&b| belongs(class, b))
                        .count();
                assert_eq!(stop, want, "{class:?} {len}");
            }
        }
    }
}
