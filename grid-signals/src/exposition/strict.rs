//! Strict mode: the whole body parses, or the first error is returned.
//!
//! Used where a bad line means the source is broken as a whole (a peer's signals, the
//! operator's relay): one typed error naming line, column and expectation.

use super::cursor::LineCursor;
use super::grammar::parse_raw_line;
use super::sample::{Line, Sample};
use crate::Error;

/// Iterator over a body's samples that stops after the first error.
///
/// Metadata lines are checked and skipped. `# EOF` is skipped like any comment: grid
/// reads text 0.0.4 (it asks every source for it), which has no end marker, and a body
/// refused for a line after one would lose a whole source over a formality. It
/// allocates nothing.
#[derive(Clone, Debug)]
pub struct Samples<'a> {
    cursor: LineCursor<'a>,
}

/// Parses `body` strictly, one sample at a time.
pub fn samples(body: &[u8]) -> Samples<'_> {
    Samples {
        cursor: LineCursor::new(body),
    }
}

/// Parses all of `body` strictly into a vector.
pub fn parse_strict(body: &[u8]) -> Result<Vec<Sample<'_>>, Error> {
    samples(body).collect()
}

impl<'a> Iterator for Samples<'a> {
    type Item = Result<Sample<'a>, Error>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        while let Some((line_no, raw)) = self.cursor.next_line() {
            let e = match parse_raw_line(raw) {
                Ok(Some(Line::Sample(sample))) => return Some(Ok(sample)),
                Ok(_) => continue,
                Err(e) => e,
            };
            self.cursor.finish();
            return Some(Err(Error::Parse {
                line: line_no,
                column: e.column + 1,
                kind: e.kind,
            }));
        }
        None
    }
}

#[cfg(test)]
#[allow(
    clippy::float_cmp,
    reason = "parsed values must be exactly the written ones"
)]
mod tests {
    use super::*;
    use crate::exposition::SyntaxError;

    #[test]
    fn metadata_is_skipped_and_samples_come_out_in_order() {
        let body = b"# HELP a x\n# TYPE a gauge\na 1\n\nb{l=\"v\"} 2\r\n# EOF\n";
        let got: Vec<(&str, f64)> = parse_strict(body)
            .unwrap()
            .iter()
            .map(|s| (s.name, s.value))
            .collect();
        assert_eq!(got, vec![("a", 1.0), ("b", 2.0)]);
    }

    #[test]
    fn the_first_error_ends_the_iteration() {
        let mut it = samples(b"a 1\nb x\nc 3\n");
        assert_eq!(it.next().unwrap().unwrap().name, "a");
        assert_eq!(
            it.next(),
            Some(Err(Error::Parse {
                line: 2,
                column: 3,
                kind: SyntaxError::Value
            }))
        );
        assert_eq!(it.next(), None);
    }

    #[test]
    fn lines_after_eof_are_read_because_text_0_0_4_has_no_end_marker() {
        let got: Vec<&str> = parse_strict(b"a 1\n# EOF\n\nb 2\n# EOF\nc 3")
            .unwrap()
            .iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(got, ["a", "b", "c"]);
        // What follows `# EOF` is held to the same grammar as what precedes it.
        assert_eq!(
            parse_strict(b"a 1\n# EOF\nb x\n"),
            Err(Error::Parse {
                line: 3,
                column: 3,
                kind: SyntaxError::Value
            })
        );
    }

    #[test]
    fn an_empty_body_has_no_samples() {
        assert_eq!(parse_strict(b""), Ok(vec![]));
    }
}
