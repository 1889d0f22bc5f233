//! The grammar of one exposition line, as nom parsers over the line's bytes.
//!
//! Both modes (strict and lenient) run every line through [`parse_line`]; they differ
//! only in what they do with its result. Each parser step is wrapped in [`expect`], which
//! names what that step wanted, so a failure reports the column and the expectation.

use nom::bytes::complete::take_while;
use nom::error::{ErrorKind, ParseError};
use nom::{Err, IResult, Offset, Parser};

use super::cursor::RawLine;
use super::labels::Labels;
use super::sample::{Line, MetricType, Sample};
use super::scan::{Class, is_blank, run_len, skip_blanks};
use super::syntax_error::SyntaxError;
use super::value::{parse_timestamp, parse_value};

/// Where and why a line failed: 0-based byte column and the expectation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LineError {
    pub(crate) column: usize,
    pub(crate) kind: SyntaxError,
}

/// nom's error for this grammar: the remaining input where a step failed and what that
/// step expected. nom's own kinds are replaced by ours in [`expect`].
#[derive(Debug)]
struct Fail<'a> {
    at: &'a [u8],
    kind: SyntaxError,
}

impl<'a> ParseError<&'a [u8]> for Fail<'a> {
    fn from_error_kind(input: &'a [u8], _: ErrorKind) -> Self {
        // Every nom built-in is wrapped in `expect`, which overwrites this placeholder.
        Fail {
            at: input,
            kind: SyntaxError::LineEnd,
        }
    }

    fn append(_: &'a [u8], _: ErrorKind, other: Self) -> Self {
        other
    }
}

type PResult<'a, O> = IResult<&'a [u8], O, Fail<'a>>;

/// Runs `parser`; on failure reports `kind` at the position the inner parser failed.
#[inline]
fn expect<'a, O>(
    kind: SyntaxError,
    mut parser: impl Parser<&'a [u8], Output = O, Error = Fail<'a>>,
) -> impl Parser<&'a [u8], Output = O, Error = Fail<'a>> {
    move |i: &'a [u8]| {
        parser
            .parse(i)
            .map_err(|e| e.map(|f| Fail { at: f.at, kind }))
    }
}

#[cold]
fn fail<O>(at: &[u8], kind: SyntaxError) -> PResult<'_, O> {
    Err(Err::Error(Fail { at, kind }))
}

/// A name: a run of `class` bytes that does not start with a digit.
#[inline]
fn name(i: &[u8], class: Class, kind: SyntaxError) -> PResult<'_, &[u8]> {
    let len = run_len(i, class);
    if len == 0 || i[0].is_ascii_digit() {
        return fail(i, kind);
    }
    Ok((&i[len..], &i[..len]))
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`
#[inline]
fn metric_name(i: &[u8]) -> PResult<'_, &[u8]> {
    name(i, Class::MetricName, SyntaxError::MetricName)
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`
#[inline]
fn label_name(i: &[u8]) -> PResult<'_, &[u8]> {
    name(i, Class::LabelName, SyntaxError::LabelName)
}

/// A quoted label value: the text between the quotes, escapes checked.
#[inline]
fn quoted(i: &[u8]) -> PResult<'_, &[u8]> {
    let Some((b'"', body)) = i.split_first() else {
        return fail(i, SyntaxError::LabelValue);
    };
    let mut pos = 0;
    loop {
        pos += run_len(&body[pos..], Class::QuotedText);
        match body.get(pos) {
            Some(b'"') => return Ok((&body[pos + 1..], &body[..pos])),
            Some(_) if matches!(body.get(pos + 1), Some(b'\\' | b'"' | b'n')) => pos += 2,
            _ => return fail(&body[pos..], SyntaxError::LabelValue),
        }
    }
}

/// One byte, `want`.
#[inline]
fn byte<'a>(want: u8) -> impl Parser<&'a [u8], Output = u8, Error = Fail<'a>> {
    move |i: &'a [u8]| match i.split_first() {
        Some((&b, rest)) if b == want => Ok((rest, b)),
        _ => fail(i, SyntaxError::LineEnd),
    }
}

/// A token up to the next blank or the end of the line.
#[inline]
fn token(i: &[u8]) -> PResult<'_, &[u8]> {
    let len = run_len(i, Class::Token);
    if len == 0 {
        return fail(i, SyntaxError::LineEnd);
    }
    Ok((&i[len..], &i[..len]))
}

/// The `&str` of `piece`, which lies inside `line`.
#[inline]
fn text_of<'a>(line: &'a str, piece: &[u8]) -> &'a str {
    let start = line.as_bytes().offset(piece);
    &line[start..start + piece.len()]
}

/// A label name folded into one word: up to its first eight bytes, and its length.
/// Equal names give equal keys. `at` is the text from the name on, `len` the name's
/// length (at least 1).
#[inline]
fn name_key(at: &[u8], len: usize) -> u64 {
    let first = if let Some(word) = at.first_chunk::<8>() {
        u64::from_le_bytes(*word)
    } else {
        let mut word = [0u8; 8];
        for (slot, &b) in word.iter_mut().zip(at) {
            *slot = b;
        }
        u64::from_le_bytes(word)
    };
    // Shifting left drops the bytes past a short name (what follows it differs from one
    // line to the next); the length goes in the low byte this frees, or over the first.
    (first << (64 - 8 * len.min(8))) ^ len as u64
}

/// The key of `__name__`, which the metric name already sets.
const NAME_LABEL_KEY: u64 = u64::from_le_bytes(*b"__name__") ^ 8;

/// The bit a name's key sets in its label set's filter word. A name that meets a clear
/// bit is new: one multiply proves it, with no list of earlier names to keep or compare,
/// so the grammar's loop keeps its registers for the scans. (Keeping the names on the
/// side and comparing cost the EPP-shaped bench a tenth of its speed.)
#[inline]
fn filter_bit(key: u64) -> u64 {
    1 << (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58)
}

/// Whether `name` repeats a label of `before` (the validated text of the set up to it),
/// or is `__name__`: the exact check behind a filter hit.
#[cold]
fn repeats(name: &[u8], before: &str) -> bool {
    name == b"__name__"
        || Labels::from_validated(before, 0)
            .iter()
            .any(|(earlier, _)| earlier.as_bytes() == name)
}

/// The label set after `{`: pairs separated by `,` (blanks allowed), optional trailing
/// comma, then `}`. A name may appear once: Prometheus refuses a series that repeats one.
#[inline]
fn label_set<'a>(line: &'a str, start: &'a [u8]) -> PResult<'a, Labels<'a>> {
    // `close` is the input at `}`; the set is everything from `start` up to it.
    let done = |close: &'a [u8], count: u32| {
        let inside = &start[..start.len() - close.len()];
        Ok((
            &close[1..],
            Labels::from_validated(text_of(line, inside), count),
        ))
    };
    let mut i = skip_blanks(start);
    if i.first() == Some(&b'}') {
        return done(i, 0);
    }
    let mut count: u32 = 0;
    let mut filter = 0u64;
    loop {
        let name;
        let at = i;
        (i, name) = label_name(i)?;
        let key = name_key(at, name.len());
        let bit = filter_bit(key);
        if (filter & bit != 0 || key == NAME_LABEL_KEY)
            && repeats(name, text_of(line, &start[..start.len() - at.len()]))
        {
            return fail(at, SyntaxError::DuplicateLabel);
        }
        filter |= bit;
        if i.first() != Some(&b'=') {
            i = skip_blanks(i);
        }
        (i, _) = expect(SyntaxError::LabelEquals, byte(b'=')).parse(i)?;
        if i.first() != Some(&b'"') {
            i = skip_blanks(i);
        }
        (i, _) = quoted(i)?;
        count += 1;
        if i.first().is_some_and(|&b| is_blank(b)) {
            i = skip_blanks(i);
        }
        match i.first() {
            Some(b',') => {
                i = &i[1..];
                if i.first().is_some_and(|&b| is_blank(b)) {
                    i = skip_blanks(i);
                }
                if i.first() == Some(&b'}') {
                    return done(i, count);
                }
            }
            Some(b'}') => return done(i, count),
            _ => return fail(i, SyntaxError::LabelSeparator),
        }
    }
}

/// `name [{labels}] value [timestamp]`
///
/// Text 0.0.4 allows blanks between any two tokens, the name and `{` included (Go's and
/// Python's parsers take `m {a="b"} 1`); a value never starts with `{`, so a blank after
/// the name is read as "no labels" only when no `{` follows it.
#[inline]
fn sample_line<'a>(line: &'a str, i: &'a [u8]) -> PResult<'a, Sample<'a>> {
    let (i, name) = metric_name(i)?;
    let i = match i.first() {
        Some(b'{') => i,
        Some(b' ' | b'\t') => skip_blanks(i),
        _ => return fail(i, SyntaxError::NameEnd),
    };
    // One call site, so the label set parser stays inlined into the line loop.
    let (i, labels) = match i.split_first() {
        Some((b'{', rest)) => label_set(line, rest)?,
        _ => (i, Labels::EMPTY),
    };
    let i = skip_blanks(i);
    let Some((value, len)) = parse_value(i) else {
        return fail(i, SyntaxError::Value);
    };
    let mut i = skip_blanks(&i[len..]);
    let mut timestamp_ms = None;
    if !i.is_empty() && i[0] != b'#' {
        let (after, ts_text) = token(i)?;
        let Some(ts) = parse_timestamp(ts_text) else {
            return fail(i, SyntaxError::Timestamp);
        };
        timestamp_ms = Some(ts);
        i = skip_blanks(after);
    }
    if i.starts_with(b"# {") {
        // An `OpenMetrics` exemplar (`# {trace_id="..."} 1.0`); grid has no use for it.
        i = &i[i.len()..];
    }
    if !i.is_empty() {
        return fail(i, SyntaxError::LineEnd);
    }
    let sample = Sample {
        name: text_of(line, name),
        labels,
        value,
        timestamp_ms,
    };
    Ok((i, sample))
}

/// Everything after `#`.
fn comment_line<'a>(line: &'a str, i: &'a [u8]) -> PResult<'a, Line<'a>> {
    let body = skip_blanks(i);
    let (after_word, word) = take_while(|b: u8| !is_blank(b))(body)?;
    let rest = skip_blanks(after_word);
    let blank_after_word = after_word.len() != rest.len();
    match word {
        b"HELP" if blank_after_word => {
            let (i, name) = metric_name(rest)?;
            let text = skip_blanks(i);
            if !text.is_empty() && text.len() == i.len() {
                return fail(i, SyntaxError::NameEnd);
            }
            let help = Line::Help {
                name: text_of(line, name),
                text: text_of(line, text),
            };
            Ok((&text[text.len()..], help))
        }
        b"TYPE" if blank_after_word => {
            let (i, name) = metric_name(rest)?;
            let kind_at = skip_blanks(i);
            if kind_at.len() == i.len() {
                return fail(i, SyntaxError::NameEnd);
            }
            let (i, kind_text) = expect(SyntaxError::MetricType, token).parse(kind_at)?;
            let Some(kind) = MetricType::from_text(text_of(line, kind_text)) else {
                return fail(kind_at, SyntaxError::MetricType);
            };
            let i = skip_blanks(i);
            if !i.is_empty() {
                return fail(i, SyntaxError::LineEnd);
            }
            let name = text_of(line, name);
            Ok((i, Line::Type { name, kind }))
        }
        b"UNIT" if blank_after_word => {
            let unit = unit_line(line, rest).unwrap_or(Line::Comment(text_of(line, body)));
            Ok((&body[body.len()..], unit))
        }
        b"EOF" if rest.is_empty() => Ok((rest, Line::Eof)),
        _ => Ok((&body[body.len()..], Line::Comment(text_of(line, body)))),
    }
}

/// `name unit` after `# UNIT `, or `None` when it is not that.
///
/// Text 0.0.4 gives `# UNIT` no meaning, so a line that is not an `OpenMetrics` unit is
/// a comment like any other, never an error: exporters write such comments.
fn unit_line<'a>(line: &'a str, rest: &'a [u8]) -> Option<Line<'a>> {
    let (i, name) = metric_name(rest).ok()?;
    let unit = skip_blanks(i);
    if !unit.is_empty() && unit.len() == i.len() {
        return None;
    }
    let name = text_of(line, name);
    let unit = text_of(line, unit).trim_end_matches([' ', '\t']);
    Some(Line::Unit { name, unit })
}

/// Parses one line as the cursor hands it out; `Ok(None)` for a blank line.
#[inline]
pub(crate) fn parse_raw_line(raw: RawLine<'_>) -> Result<Option<Line<'_>>, LineError> {
    match raw {
        RawLine::Text(text) => parse_line(text),
        RawLine::BadUtf8 { column } => Err(LineError {
            column,
            kind: SyntaxError::Utf8,
        }),
    }
}

/// Parses one line (without its `\n`); `Ok(None)` for a blank line.
#[inline]
pub(crate) fn parse_line(line: &str) -> Result<Option<Line<'_>>, LineError> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let bytes = line.as_bytes();
    let i = skip_blanks(bytes);
    let parsed = match i.first() {
        None => return Ok(None),
        Some(b'#') => comment_line(line, &i[1..]),
        Some(_) => sample_line(line, i).map(|(rest, s)| (rest, Line::Sample(s))),
    };
    match parsed {
        Ok((_, parsed)) => Ok(Some(parsed)),
        Err(Err::Error(f) | Err::Failure(f)) => Err(LineError {
            column: bytes.len() - f.at.len(),
            kind: f.kind,
        }),
        // Complete parsers never ask for more input; report it as a truncated line.
        Err(Err::Incomplete(_)) => Err(LineError {
            column: bytes.len(),
            kind: SyntaxError::LineEnd,
        }),
    }
}

#[cfg(test)]
#[allow(
    clippy::float_cmp,
    reason = "parsed values must be exactly the written ones"
)]
mod tests {
    use super::*;

    fn sample(text: &str) -> Sample<'_> {
        match parse_line(text) {
            Ok(Some(Line::Sample(s))) => s,
            other => panic!("{text:?} gave {other:?}"),
        }
    }

    fn error(text: &str) -> (usize, SyntaxError) {
        match parse_line(text) {
            Err(e) => (e.column + 1, e.kind),
            other => panic!("{text:?} gave {other:?}"),
        }
    }

    #[test]
    fn a_bare_sample_parses() {
        let s = sample("up 1");
        assert_eq!((s.name, s.value, s.timestamp_ms), ("up", 1.0, None));
        assert!(s.labels.is_empty());
    }

    #[test]
    fn labels_with_blanks_commas_braces_and_escapes_parse() {
        let s = sample(r#"a:b_c{x="1,}{", y = "q\"\\\n" ,} -Inf 1700000000000"#);
        assert_eq!(s.name, "a:b_c");
        assert_eq!(s.labels.len(), 2);
        assert_eq!(s.labels.get("x").unwrap().raw(), "1,}{");
        assert!(s.labels.get("y").unwrap().eq_str("q\"\\\n"));
        assert_eq!(s.value, f64::NEG_INFINITY);
        assert_eq!(s.timestamp_ms, Some(1_700_000_000_000));
    }

    #[test]
    fn an_openmetrics_exemplar_is_skipped() {
        let s = sample(r#"c_total{a="1"} 3 # {trace_id="x y"} 1.0 1700000000.5"#);
        assert_eq!((s.value, s.timestamp_ms), (3.0, None));
        let s = sample(r#"c_total 3 17 # {trace_id="x"} 1.0"#);
        assert_eq!(s.timestamp_ms, Some(17));
        assert_eq!(error("c_total 3 # x"), (11, SyntaxError::LineEnd));
    }

    #[test]
    fn crlf_and_trailing_blanks_are_accepted() {
        assert_eq!(sample("m{} 2 \t\r").value, 2.0);
        assert_eq!(sample("  m 3 4  ").timestamp_ms, Some(4));
    }

    #[test]
    fn blank_lines_are_nothing() {
        assert_eq!(parse_line(""), Ok(None));
        assert_eq!(parse_line(" \t\r"), Ok(None));
    }

    #[test]
    fn metadata_lines_parse() {
        assert_eq!(
            parse_line("# HELP m_total Says \\\\ hi\\n."),
            Ok(Some(Line::Help {
                name: "m_total",
                text: "Says \\\\ hi\\n."
            }))
        );
        assert_eq!(
            parse_line("# HELP m"),
            Ok(Some(Line::Help {
                name: "m",
                text: ""
            }))
        );
        assert_eq!(
            parse_line("# TYPE m histogram\r"),
            Ok(Some(Line::Type {
                name: "m",
                kind: MetricType::Histogram
            }))
        );
        assert_eq!(
            parse_line("# UNIT m seconds"),
            Ok(Some(Line::Unit {
                name: "m",
                unit: "seconds"
            }))
        );
        assert_eq!(parse_line("# EOF"), Ok(Some(Line::Eof)));
        assert_eq!(parse_line("#EOF"), Ok(Some(Line::Eof)));
        assert_eq!(
            parse_line("# free text"),
            Ok(Some(Line::Comment("free text")))
        );
        assert_eq!(parse_line("# EOF now"), Ok(Some(Line::Comment("EOF now"))));
    }

    #[test]
    fn a_blank_or_tab_between_the_name_and_the_brace_is_accepted() {
        for text in ["m {a=\"b\"} 1", "m\t{a=\"b\"} 1", "m \t {a=\"b\"}\t1 7"] {
            let s = sample(text);
            assert_eq!(s.name, "m", "{text:?}");
            assert_eq!(s.labels.get("a").unwrap().raw(), "b", "{text:?}");
            assert_eq!(s.value, 1.0, "{text:?}");
        }
        assert!(sample("m {} 2").labels.is_empty());
        // The blank still ends a name without labels.
        assert_eq!(sample("m 3").value, 3.0);
    }

    #[test]
    fn a_label_name_given_twice_is_refused_at_its_second_occurrence() {
        assert_eq!(
            error("a{a=\"1\",a=\"2\"} 1"),
            (9, SyntaxError::DuplicateLabel)
        );
        assert_eq!(
            error("a{x=\"1\", y=\"2\" , x=\"3\"} 1"),
            (18, SyntaxError::DuplicateLabel)
        );
        // Long sets too: the filter word says "maybe seen" more often, never "new" wrongly.
        let long: Vec<String> = (0..12).map(|i| format!("l{i}=\"v\"")).collect();
        let text = format!("m{{{},l11=\"w\"}} 1", long.join(","));
        assert_eq!(error(&text).1, SyntaxError::DuplicateLabel);
        let text = format!("m{{{},l0=\"w\"}} 1", long.join(","));
        assert_eq!(error(&text).1, SyntaxError::DuplicateLabel);
        assert_eq!(
            sample(&format!("m{{{}}} 1", long.join(","))).labels.len(),
            12
        );
        // Names that share a prefix are different names.
        assert_eq!(sample("m{a=\"1\",ab=\"2\",b=\"3\"} 1").labels.len(), 3);
    }

    #[test]
    fn a_name_label_is_refused_because_the_metric_name_sets_it() {
        assert_eq!(
            error("m{__name__=\"x\"} 1"),
            (3, SyntaxError::DuplicateLabel)
        );
        assert_eq!(
            error("m{a=\"1\",__name__=\"m\"} 1"),
            (9, SyntaxError::DuplicateLabel)
        );
        assert_eq!(sample("m{__name=\"x\",_name__=\"y\"} 1").labels.len(), 2);
    }

    #[test]
    fn a_unit_comment_that_is_not_openmetrics_is_a_comment() {
        assert_eq!(parse_line("# UNIT "), Ok(Some(Line::Comment("UNIT "))));
        assert_eq!(
            parse_line("# UNIT - x"),
            Ok(Some(Line::Comment("UNIT - x")))
        );
        assert_eq!(
            parse_line("# UNIT 1m s"),
            Ok(Some(Line::Comment("UNIT 1m s")))
        );
        assert_eq!(
            parse_line("# UNIT m\"s"),
            Ok(Some(Line::Comment("UNIT m\"s")))
        );
        assert_eq!(parse_line("#UNIT"), Ok(Some(Line::Comment("UNIT"))));
        // A well-formed one is still reported, for callers that want it.
        assert_eq!(
            parse_line("# UNIT m_seconds seconds "),
            Ok(Some(Line::Unit {
                name: "m_seconds",
                unit: "seconds"
            }))
        );
    }

    #[test]
    fn errors_name_column_and_expectation() {
        assert_eq!(error("1m 1"), (1, SyntaxError::MetricName));
        assert_eq!(error("m\"x\" 1"), (2, SyntaxError::NameEnd));
        assert_eq!(error("m{9=\"1\"} 1"), (3, SyntaxError::LabelName));
        assert_eq!(error("m{a \"1\"} 1"), (5, SyntaxError::LabelEquals));
        assert_eq!(error("m{a=1} 1"), (5, SyntaxError::LabelValue));
        assert_eq!(error("m{a=\"1} 1"), (10, SyntaxError::LabelValue));
        assert_eq!(error("m{a=\"\\t\"} 1"), (6, SyntaxError::LabelValue));
        assert_eq!(
            error("m{a=\"1\" b=\"2\"} 1"),
            (9, SyntaxError::LabelSeparator)
        );
        assert_eq!(error("m{a=\"1\",,} 1"), (9, SyntaxError::LabelName));
        assert_eq!(error("m 1x"), (3, SyntaxError::Value));
        assert_eq!(error("m{}"), (4, SyntaxError::Value));
        assert_eq!(error("m 1 1.5"), (5, SyntaxError::Timestamp));
        assert_eq!(error("m 1 2 3"), (7, SyntaxError::LineEnd));
        assert_eq!(error("# TYPE m countr"), (10, SyntaxError::MetricType));
        assert_eq!(error("# TYPE m"), (9, SyntaxError::NameEnd));
        assert_eq!(error("# HELP 1m x"), (8, SyntaxError::MetricName));
    }
}
