//! Finds the `model` field of an OpenAI-style JSON request body without parsing the rest.
//!
//! The gateway only needs the model name to route; the body is forwarded unchanged, so a
//! full JSON parse (and its allocation per nested value) would be wasted work on the
//! request path. This is a single linear pass over the top-level object: keys are read,
//! values are skipped by a bracket-matching lexer bounded by [`MAX_JSON_DEPTH`], and the
//! structure is checked only as far as routing needs (balanced brackets, well-formed
//! strings, one top-level object, nothing after it).
//!
//! A second `model` key is refused: JSON parsers disagree on which duplicate wins (most
//! take the last), so routing on one while the upstream reads the other would let a
//! client reach a site the gateway did not choose for that model.

use std::borrow::Cow;

/// Longest model name accepted, in bytes after unescaping. Model names are short
/// identifiers (`org/name-revision`); anything longer is not a name we could route.
pub const MAX_MODEL_NAME_BYTES: usize = 256;

/// Deepest nesting of arrays and objects accepted inside the body. Chat requests nest a
/// handful of levels (messages, content parts, tool schemas); the cap bounds the lexer's
/// fixed-size bracket stack.
pub const MAX_JSON_DEPTH: usize = 64;

/// Why a body has no routable `model` (also carried by [`crate::Error::ModelField`]). Each maps
/// to a 400 answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BodyRefusal {
    /// The body is not one JSON object (empty, an array, a bare value).
    NotAnObject,
    /// The body is not well-formed JSON at `offset` (0-based byte).
    Syntax {
        /// Byte offset of the first byte that could not be read.
        offset: usize,
    },
    /// Arrays and objects nest deeper than [`MAX_JSON_DEPTH`] at `offset`.
    TooDeep {
        /// Byte offset of the bracket that went one level too deep.
        offset: usize,
    },
    /// The top-level object has no `model` key.
    Missing,
    /// The `model` value is not a string.
    NotAString,
    /// The `model` string is empty.
    Empty,
    /// The `model` string is longer than [`MAX_MODEL_NAME_BYTES`].
    TooLong,
    /// The top-level object has a second `model` key at `offset`.
    Duplicate {
        /// Byte offset of the second key.
        offset: usize,
    },
}

impl BodyRefusal {
    /// A short stable label, for metrics and error codes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotAnObject => "not_an_object",
            Self::Syntax { .. } => "syntax",
            Self::TooDeep { .. } => "too_deep",
            Self::Missing => "missing",
            Self::NotAString => "not_a_string",
            Self::Empty => "empty",
            Self::TooLong => "too_long",
            Self::Duplicate { .. } => "duplicate",
        }
    }
}

impl std::error::Error for BodyRefusal {}

impl std::fmt::Display for BodyRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotAnObject => f.write_str("the request body is not a JSON object"),
            Self::Syntax { offset } => {
                write!(f, "the request body is not valid JSON (byte {offset})")
            }
            Self::TooDeep { offset } => write!(
                f,
                "the request body nests deeper than {MAX_JSON_DEPTH} levels (byte {offset})"
            ),
            Self::Missing => f.write_str("the request body has no `model` field"),
            Self::NotAString => f.write_str("the `model` field is not a string"),
            Self::Empty => f.write_str("the `model` field is empty"),
            Self::TooLong => write!(
                f,
                "the `model` field is longer than {MAX_MODEL_NAME_BYTES} bytes"
            ),
            Self::Duplicate { offset } => {
                write!(
                    f,
                    "the request body has a second `model` field (byte {offset})"
                )
            }
        }
    }
}

/// Returns the `model` string of a JSON request body, unescaped (borrowed when it had no
/// escapes).
///
/// # Errors
///
/// Why the body has no routable `model`.
pub fn find_model(body: &[u8]) -> Result<Cow<'_, str>, BodyRefusal> {
    let mut lx = Lexer { body, pos: 0 };
    lx.skip_ws();
    if lx.peek() != Some(b'{') {
        return Err(BodyRefusal::NotAnObject);
    }
    lx.pos += 1;
    let mut model: Option<Result<Cow<'_, str>, BodyRefusal>> = None;
    lx.skip_ws();
    if lx.peek() == Some(b'}') {
        lx.pos += 1;
    } else {
        loop {
            lx.skip_ws();
            let key_at = lx.pos;
            let key = lx.string()?;
            lx.skip_ws();
            lx.expect(b':')?;
            lx.skip_ws();
            if key.is_model()? {
                if model.is_some() {
                    return Err(BodyRefusal::Duplicate { offset: key_at });
                }
                model = Some(if lx.peek() == Some(b'"') {
                    let value = lx.string()?;
                    value.unescape().and_then(check_name)
                } else {
                    lx.skip_value()?;
                    Err(BodyRefusal::NotAString)
                });
            } else {
                lx.skip_value()?;
            }
            lx.skip_ws();
            let at = lx.pos;
            match lx.next() {
                Some(b',') => {}
                Some(b'}') => break,
                _ => return Err(BodyRefusal::Syntax { offset: at }),
            }
        }
    }
    lx.skip_ws();
    if lx.pos != body.len() {
        return Err(BodyRefusal::Syntax { offset: lx.pos });
    }
    model.unwrap_or(Err(BodyRefusal::Missing))
}

fn check_name(name: Cow<'_, str>) -> Result<Cow<'_, str>, BodyRefusal> {
    if name.is_empty() {
        Err(BodyRefusal::Empty)
    } else if name.len() > MAX_MODEL_NAME_BYTES {
        Err(BodyRefusal::TooLong)
    } else {
        Ok(name)
    }
}

/// A string token: the bytes between the quotes, escapes kept.
struct RawString<'a> {
    raw: &'a [u8],
    at: usize,
    escaped: bool,
}

impl<'a> RawString<'a> {
    fn is_model(&self) -> Result<bool, BodyRefusal> {
        if self.escaped {
            Ok(self.unescape()? == "model")
        } else {
            Ok(self.raw == b"model")
        }
    }

    fn unescape(&self) -> Result<Cow<'a, str>, BodyRefusal> {
        let syntax = |i: usize| BodyRefusal::Syntax {
            offset: self.at + i,
        };
        if !self.escaped {
            return std::str::from_utf8(self.raw)
                .map(Cow::Borrowed)
                .map_err(|e| syntax(e.valid_up_to()));
        }
        let mut out = String::with_capacity(self.raw.len());
        let mut i = 0;
        while i < self.raw.len() {
            let run_end = self.raw[i..]
                .iter()
                .position(|&b| b == b'\\')
                .map_or(self.raw.len(), |p| i + p);
            out.push_str(
                std::str::from_utf8(&self.raw[i..run_end])
                    .map_err(|e| syntax(i + e.valid_up_to()))?,
            );
            i = run_end;
            if i == self.raw.len() {
                break;
            }
            // The lexer already checked that an escape letter follows each backslash.
            let c = match self.raw[i + 1] {
                b'"' => '"',
                b'\\' => '\\',
                b'/' => '/',
                b'b' => '\u{8}',
                b'f' => '\u{c}',
                b'n' => '\n',
                b'r' => '\r',
                b't' => '\t',
                _ => {
                    let hi = hex4(&self.raw[i + 2..i + 6]).ok_or_else(|| syntax(i))?;
                    i += 6;
                    if (0xD800..0xDC00).contains(&hi) {
                        let lo = (self.raw.get(i) == Some(&b'\\')
                            && self.raw.get(i + 1) == Some(&b'u'))
                        .then(|| self.raw.get(i + 2..i + 6).and_then(hex4))
                        .flatten()
                        .filter(|lo| (0xDC00..0xE000).contains(lo))
                        .ok_or_else(|| syntax(i))?;
                        i += 6;
                        let cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                        out.push(char::from_u32(cp).ok_or_else(|| syntax(i))?);
                    } else {
                        out.push(char::from_u32(hi).ok_or_else(|| syntax(i))?);
                    }
                    continue;
                }
            };
            out.push(c);
            i += 2;
        }
        Ok(Cow::Owned(out))
    }
}

fn hex4(b: &[u8]) -> Option<u32> {
    if b.len() != 4 {
        return None;
    }
    b.iter()
        .try_fold(0u32, |acc, &c| Some(acc * 16 + (c as char).to_digit(16)?))
}

struct Lexer<'a> {
    body: &'a [u8],
    pos: usize,
}

impl<'a> Lexer<'a> {
    fn peek(&self) -> Option<u8> {
        self.body.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Some(b)
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn expect(&mut self, want: u8) -> Result<(), BodyRefusal> {
        if self.peek() == Some(want) {
            self.pos += 1;
            Ok(())
        } else {
            Err(BodyRefusal::Syntax { offset: self.pos })
        }
    }

    /// Reads a string token starting at its opening quote.
    fn string(&mut self) -> Result<RawString<'a>, BodyRefusal> {
        self.expect(b'"')?;
        let start = self.pos;
        let mut escaped = false;
        loop {
            self.skip_plain();
            match self.next() {
                None => return Err(BodyRefusal::Syntax { offset: self.pos }),
                Some(b'"') => break,
                Some(b'\\') => {
                    escaped = true;
                    match self.next() {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {}
                        Some(b'u') => {
                            let digits = self.body.get(self.pos..self.pos + 4);
                            if digits.and_then(hex4).is_none() {
                                return Err(BodyRefusal::Syntax { offset: self.pos });
                            }
                            self.pos += 4;
                        }
                        _ => {
                            return Err(BodyRefusal::Syntax {
                                offset: self.pos.saturating_sub(1),
                            });
                        }
                    }
                }
                Some(0..0x20) => {
                    return Err(BodyRefusal::Syntax {
                        offset: self.pos - 1,
                    });
                }
                Some(_) => {}
            }
        }
        Ok(RawString {
            raw: &self.body[start..self.pos - 1],
            at: start,
            escaped,
        })
    }

    /// Moves to the next quote, backslash or control byte of string content, a word of
    /// 8 bytes at a time (the last few bytes of the body are left to the byte-wise loop).
    /// A prompt is most of a request body, so this is most of the scan.
    fn skip_plain(&mut self) {
        let rest = &self.body[self.pos..];
        for (i, word) in rest.chunks_exact(8).enumerate() {
            let special = string_special(u64::from_le_bytes(word.try_into().unwrap_or_default()));
            if special != 0 {
                self.pos += i * 8 + (special.trailing_zeros() / 8) as usize;
                return;
            }
        }
        self.pos += rest.len() / 8 * 8;
    }

    /// Skips one value: a string, a scalar, or a balanced array/object. Inside nested
    /// values only tokens and bracket balance are checked; the upstream parses them.
    fn skip_value(&mut self) -> Result<(), BodyRefusal> {
        let mut stack = [0u8; MAX_JSON_DEPTH];
        let mut depth = 0usize;
        loop {
            self.skip_ws();
            let at = self.pos;
            match self.peek() {
                Some(b'"') => {
                    self.string()?;
                }
                Some(open @ (b'{' | b'[')) => {
                    if depth == MAX_JSON_DEPTH {
                        return Err(BodyRefusal::TooDeep { offset: at });
                    }
                    stack[depth] = if open == b'{' { b'}' } else { b']' };
                    depth += 1;
                    self.pos += 1;
                    continue;
                }
                Some(close @ (b'}' | b']')) => {
                    if depth == 0 || stack[depth - 1] != close {
                        return Err(BodyRefusal::Syntax { offset: at });
                    }
                    depth -= 1;
                    self.pos += 1;
                }
                Some(b',' | b':') if depth > 0 => {
                    self.pos += 1;
                    continue;
                }
                Some(b) if is_scalar_byte(b) => {
                    while self.peek().is_some_and(is_scalar_byte) {
                        self.pos += 1;
                    }
                }
                None | Some(_) => return Err(BodyRefusal::Syntax { offset: at }),
            }
            if depth == 0 {
                return Ok(());
            }
        }
    }
}

/// The bytes of `word` (little-endian: the first byte lowest) that end or escape a JSON
/// string or may not appear in one (a quote, a backslash, a control byte below 0x20),
/// each flagged by its top bit. Each test is the classic "has a zero byte" word trick:
/// a borrow may also flag a byte above one that matched, never below, so the lowest flag
/// is always the first such byte, and no flag at all means there is none.
fn string_special(word: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
    let below_space = word.wrapping_sub(ONES * 0x20) & !word & HIGHS;
    below_space | zero(word ^ (ONES * u64::from(b'"'))) | zero(word ^ (ONES * u64::from(b'\\')))
}

/// Bytes of numbers and the literals `true`, `false`, `null`.
fn is_scalar_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(body: &str) -> Result<String, BodyRefusal> {
        find_model(body.as_bytes()).map(Cow::into_owned)
    }

    #[test]
    fn model_is_found_among_nested_fields() {
        let body = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi } ] \" {"}]}],
            "stream": true, "temperature": -1.5e3, "stop": null, "model": "llama-3-8b", "n": 1}"#;
        assert_eq!(model(body).unwrap(), "llama-3-8b");
    }

    #[test]
    fn escaped_model_key_and_value_are_unescaped() {
        assert_eq!(
            model(r#"{"mod\u0065l":"a\/b\u00e9\ud83d\ude00"}"#).unwrap(),
            "a/bé😀"
        );
    }

    #[test]
    fn unescaped_model_is_borrowed_from_the_body() {
        assert!(matches!(
            find_model(br#"{"model":"m"}"#).unwrap(),
            Cow::Borrowed("m")
        ));
    }

    #[test]
    fn missing_model_is_refused() {
        assert_eq!(model(r#"{"prompt":"x"}"#), Err(BodyRefusal::Missing));
        assert_eq!(model("{}"), Err(BodyRefusal::Missing));
        assert_eq!(
            model(r#"{"x":{"model":"nested"}}"#),
            Err(BodyRefusal::Missing)
        );
    }

    #[test]
    fn non_object_bodies_are_refused() {
        for body in ["", "  ", "[]", "\"model\"", "null", "1"] {
            assert_eq!(model(body), Err(BodyRefusal::NotAnObject), "{body:?}");
        }
    }

    #[test]
    fn malformed_json_is_refused_with_its_offset() {
        assert_eq!(
            model(r#"{"model":"m""#),
            Err(BodyRefusal::Syntax { offset: 12 })
        );
        assert_eq!(
            model(r#"{"model":"m"} x"#),
            Err(BodyRefusal::Syntax { offset: 14 })
        );
        assert!(matches!(
            model(r#"{"a":[1,2}"#),
            Err(BodyRefusal::Syntax { .. })
        ));
        assert!(matches!(
            model(r#"{"a" 1}"#),
            Err(BodyRefusal::Syntax { .. })
        ));
        assert!(matches!(
            model("{\"model\":\"a\u{1}\"}"),
            Err(BodyRefusal::Syntax { .. })
        ));
        assert!(matches!(
            model(r#"{"model":"\x"}"#),
            Err(BodyRefusal::Syntax { .. })
        ));
        assert!(matches!(
            model(r#"{"model":"\ud800"}"#),
            Err(BodyRefusal::Syntax { .. })
        ));
        assert!(matches!(
            model(r#"{"a":@}"#),
            Err(BodyRefusal::Syntax { .. })
        ));
    }

    #[test]
    fn invalid_utf8_in_model_is_refused() {
        assert!(matches!(
            find_model(b"{\"model\":\"\xff\"}"),
            Err(BodyRefusal::Syntax { .. })
        ));
    }

    #[test]
    fn non_string_model_is_refused() {
        assert_eq!(model(r#"{"model":["a"]}"#), Err(BodyRefusal::NotAString));
        assert_eq!(model(r#"{"model":null}"#), Err(BodyRefusal::NotAString));
        assert_eq!(model(r#"{"model":""}"#), Err(BodyRefusal::Empty));
    }

    #[test]
    fn second_model_key_is_refused() {
        assert_eq!(
            model(r#"{"model":"a","model":"b"}"#),
            Err(BodyRefusal::Duplicate { offset: 13 })
        );
    }

    #[test]
    fn model_name_length_is_capped_at_its_boundary() {
        let at = "m".repeat(MAX_MODEL_NAME_BYTES);
        assert_eq!(model(&format!(r#"{{"model":"{at}"}}"#)).unwrap(), at);
        let over = "m".repeat(MAX_MODEL_NAME_BYTES + 1);
        assert_eq!(
            model(&format!(r#"{{"model":"{over}"}}"#)),
            Err(BodyRefusal::TooLong)
        );
    }

    #[test]
    fn nesting_is_capped_at_its_boundary() {
        let nest = |n: usize| format!(r#"{{"a":{}{}, "model":"m"}}"#, "[".repeat(n), "]".repeat(n));
        assert_eq!(model(&nest(MAX_JSON_DEPTH)).unwrap(), "m");
        assert_eq!(
            model(&nest(MAX_JSON_DEPTH + 1)),
            Err(BodyRefusal::TooDeep {
                offset: 5 + MAX_JSON_DEPTH
            })
        );
    }

    #[test]
    fn agrees_with_serde_json_on_well_formed_objects() {
        let bodies = [
            r#"{"model":"x","messages":[{"role":"system","content":"\n"}],"max_tokens":10}"#,
            r#"{"input":["a","b"],"model":"emb\t1"}"#,
            r#" { "model" : "spaced" } "#,
        ];
        for body in bodies {
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(model(body).unwrap(), v["model"].as_str().unwrap());
        }
    }

    proptest::proptest! {
        #[test]
        fn the_word_test_finds_the_first_special_byte(
            bytes in proptest::array::uniform8(proptest::prop_oneof![
                proptest::prelude::any::<u8>(),
                proptest::sample::select(vec![b'"', b'\\', 0, 0x1f, 0x20, 0x21, 0x5b, 0x5d, 0x7f, 0x80]),
            ])
        ) {
            let first = bytes.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20);
            let found = string_special(u64::from_le_bytes(bytes));
            let found = (found != 0).then(|| (found.trailing_zeros() / 8) as usize);
            proptest::prop_assert_eq!(found, first);
        }

        #[test]
        fn a_long_string_reads_the_same_as_byte_by_byte(
            text in proptest::collection::vec(
                proptest::prop_oneof![
                    8 => proptest::char::range('a', 'z'),
                    1 => proptest::prelude::Just('"'),
                    1 => proptest::prelude::Just('\\'),
                    1 => proptest::prelude::Just('\n'),
                    1 => proptest::char::range('\u{80}', '\u{10ffff}'),
                ],
                0..200,
            ),
        ) {
            // The text JSON-escaped, then with one raw quote, backslash or newline left
            // in by chance: the verdict must be serde_json's on every body.
            let text: String = text.into_iter().collect();
            let escaped = serde_json::to_string(&text).unwrap();
            for body in [
                format!(r#"{{"prompt":{escaped},"model":"m"}}"#),
                format!(r#"{{"prompt":"{text}","model":"m"}}"#),
            ] {
                let ours = model(&body);
                match serde_json::from_str::<serde_json::Value>(&body) {
                    Ok(v) => {
                        let ours = ours.ok();
                        proptest::prop_assert_eq!(ours.as_deref(), v["model"].as_str());
                    }
                    Err(_) => proptest::prop_assert!(ours.is_err(), "{body:?}"),
                }
            }
        }
    }
}
