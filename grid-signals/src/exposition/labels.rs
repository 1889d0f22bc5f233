//! Label sets as the parser hands them out: borrowed, already validated text that is
//! split into pairs only when a caller asks.
//!
//! Splitting lazily is what keeps the strict path free of per-sample allocation: a
//! sample carries one `&str` for its whole label set, however many labels it has.

use std::borrow::Cow;
use std::fmt;

use super::scan::{Class, run_len, skip_blanks};

/// The validated text between a sample's braces, e.g. `a="1", b="x\"y"`.
///
/// Only the parser builds non-empty sets, so iteration can rely on the grammar already
/// holding (names, `=`, quoted values with valid escapes, `,` separators, blanks).
#[derive(Clone, Copy, Default)]
pub struct Labels<'a> {
    text: &'a str,
    count: u32,
}

impl<'a> Labels<'a> {
    /// A sample without labels.
    pub const EMPTY: Labels<'static> = Labels { text: "", count: 0 };

    /// Wraps text the grammar accepted, with the number of pairs it counted.
    pub(crate) fn from_validated(text: &'a str, count: u32) -> Self {
        Self { text, count }
    }

    /// The pairs in written order, values still escaped.
    pub fn iter(&self) -> LabelIter<'a> {
        LabelIter { rest: self.text }
    }

    /// The value of the first label called `name`.
    pub fn get(&self, name: &str) -> Option<LabelValue<'a>> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// How many labels the set holds.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether the sample has no labels.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The text between the braces exactly as written (blanks and a trailing comma kept).
    pub fn as_written(&self) -> &'a str {
        self.text
    }
}

impl<'a> IntoIterator for Labels<'a> {
    type Item = (&'a str, LabelValue<'a>);
    type IntoIter = LabelIter<'a>;
    fn into_iter(self) -> LabelIter<'a> {
        self.iter()
    }
}

impl<'a> IntoIterator for &Labels<'a> {
    type Item = (&'a str, LabelValue<'a>);
    type IntoIter = LabelIter<'a>;
    fn into_iter(self) -> LabelIter<'a> {
        self.iter()
    }
}

/// Two sets are equal when they hold the same pairs in the same order; blanks and a
/// trailing comma do not matter.
impl PartialEq for Labels<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.count == other.count && self.iter().eq(other.iter())
    }
}

impl Eq for Labels<'_> {}

impl fmt::Debug for Labels<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// Iterator over a [`Labels`] set: `(name, value)` in written order.
#[derive(Clone, Debug)]
pub struct LabelIter<'a> {
    rest: &'a str,
}

impl<'a> Iterator for LabelIter<'a> {
    type Item = (&'a str, LabelValue<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        // The grammar accepted the text, so each pair is a label name, blanks, `=`,
        // blanks and a quoted value, pairs separated by `,` and blanks: plain byte steps
        // find them.
        let bytes = self.rest.as_bytes();
        let start = bytes
            .iter()
            .position(|&b| !matches!(b, b' ' | b'\t' | b','))?;
        let name_end = start + run_len(&bytes[start..], Class::LabelName);
        let Some((&b'=', after_eq)) = skip_blanks(&bytes[name_end..]).split_first() else {
            self.rest = "";
            return None;
        };
        let quoted = skip_blanks(after_eq);
        if quoted.first() != Some(&b'"') {
            self.rest = "";
            return None;
        }
        let open = bytes.len() - quoted.len();
        let body = &self.rest[open + 1..];
        let Some(end) = closing_quote(body.as_bytes()) else {
            self.rest = "";
            return None;
        };
        let name = &self.rest[start..name_end];
        self.rest = &body[end + 1..];
        Some((name, LabelValue { raw: &body[..end] }))
    }
}

/// Index of the first unescaped `"` in `bytes` (which starts just after an opening
/// quote); an escape skips the byte after the backslash.
pub(crate) fn closing_quote(bytes: &[u8]) -> Option<usize> {
    // Values are short: a word-wise scan beats memchr's setup cost.
    let mut pos = 0;
    loop {
        pos += run_len(bytes.get(pos..)?, Class::QuotedText);
        match bytes.get(pos)? {
            b'"' => return Some(pos),
            _ => pos += 2,
        }
    }
}

/// A label value as written between its quotes, escapes kept.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LabelValue<'a> {
    raw: &'a str,
}

impl<'a> LabelValue<'a> {
    /// Wraps text the grammar accepted as a label value (escapes valid).
    #[cfg(test)]
    pub(crate) fn from_validated(raw: &'a str) -> Self {
        Self { raw }
    }

    /// The value as written, escapes kept.
    pub fn raw(&self) -> &'a str {
        self.raw
    }

    /// The value with `\\`, `\"` and `\n` resolved; borrowed when nothing is escaped.
    pub fn unescaped(&self) -> Cow<'a, str> {
        if !self.raw.contains('\\') {
            return Cow::Borrowed(self.raw);
        }
        Cow::Owned(Unescape::new(self.raw).collect())
    }

    /// Whether the unescaped value equals `s`, without allocating.
    pub fn eq_str(&self, s: &str) -> bool {
        if !self.raw.contains('\\') {
            return self.raw == s;
        }
        Unescape::new(self.raw).eq(s.chars())
    }
}

impl fmt::Debug for LabelValue<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.raw)
    }
}

impl fmt::Display for LabelValue<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.unescaped())
    }
}

/// Characters of an escaped value with its escapes resolved.
struct Unescape<'a> {
    chars: std::str::Chars<'a>,
}

impl<'a> Unescape<'a> {
    fn new(raw: &'a str) -> Self {
        Self { chars: raw.chars() }
    }
}

impl Iterator for Unescape<'_> {
    type Item = char;
    fn next(&mut self) -> Option<char> {
        match self.chars.next()? {
            '\\' => match self.chars.next() {
                Some('n') => Some('\n'),
                Some(other) => Some(other),
                None => Some('\\'),
            },
            c => Some(c),
        }
    }
}

/// Appends `value` escaped for a label value: `\` `"` and newline.
pub(crate) fn escape_label_value(out: &mut Vec<u8>, value: &str) {
    escape_into(out, value, true);
}

/// Appends `text` escaped for a `# HELP` line: `\` and newline.
pub(crate) fn escape_help(out: &mut Vec<u8>, text: &str) {
    escape_into(out, text, false);
}

fn escape_into(out: &mut Vec<u8>, text: &str, quote: bool) {
    let bytes = text.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escaped: &[u8] = match b {
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'"' if quote => b"\\\"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(escaped);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iteration_splits_pairs_across_blanks_and_trailing_comma() {
        let labels = Labels::from_validated(r#" a = "1" ,b="x,}y",  c="" ,"#, 3);
        let pairs: Vec<(&str, &str)> = labels.iter().map(|(n, v)| (n, v.raw())).collect();
        assert_eq!(pairs, vec![("a", "1"), ("b", "x,}y"), ("c", "")]);
        assert_eq!(labels.len(), 3);
    }

    #[test]
    fn escaped_quotes_do_not_end_the_value() {
        let labels = Labels::from_validated(r#"a="x\"y\\",b="z""#, 2);
        assert_eq!(labels.get("a").unwrap().raw(), r#"x\"y\\"#);
        assert_eq!(labels.get("a").unwrap().unescaped(), "x\"y\\");
        assert_eq!(labels.get("b").unwrap().raw(), "z");
        assert!(labels.get("c").is_none());
    }

    #[test]
    fn unescaped_borrows_when_nothing_is_escaped() {
        let v = LabelValue::from_validated("plain");
        assert!(matches!(v.unescaped(), Cow::Borrowed("plain")));
        let v = LabelValue::from_validated(r"line\nbreak");
        assert_eq!(v.unescaped(), "line\nbreak");
    }

    #[test]
    fn eq_str_compares_the_unescaped_form() {
        let v = LabelValue::from_validated(r#"a\\b\"c\nd"#);
        assert!(v.eq_str("a\\b\"c\nd"));
        assert!(!v.eq_str(r#"a\\b\"c\nd"#));
        assert!(!v.eq_str("a\\b\"c\nde"));
        assert!(LabelValue::from_validated("x").eq_str("x"));
    }

    #[test]
    fn equality_ignores_blanks_but_not_order() {
        let a = Labels::from_validated(r#"a="1",b="2""#, 2);
        let b = Labels::from_validated(r#"a="1", b="2","#, 2);
        let c = Labels::from_validated(r#"b="2",a="1""#, 2);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn escaping_round_trips_through_unescape() {
        let mut out = Vec::new();
        escape_label_value(&mut out, "q\"b\\n\nz");
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text, r#"q\"b\\n\nz"#);
        assert!(LabelValue::from_validated(&text).eq_str("q\"b\\n\nz"));
        let mut help = Vec::new();
        escape_help(&mut help, "say \"hi\"\\\n");
        assert_eq!(help, br#"say "hi"\\\n"#);
    }
}
