//! Lenient mode: every non-blank line's result, so a caller keeps the good lines and
//! counts the bad ones by reason.
//!
//! Used on EPP scrapes, where one odd line must not hide the load signals around it.

use super::cursor::LineCursor;
use super::grammar::parse_raw_line;
use super::sample::Line;
use crate::Error;

/// Iterator over every non-blank line of a body, continuing after errors.
#[derive(Clone, Debug)]
pub struct Lines<'a> {
    cursor: LineCursor<'a>,
}

/// Parses `body` leniently, one line at a time.
pub fn lines(body: &[u8]) -> Lines<'_> {
    Lines {
        cursor: LineCursor::new(body),
    }
}

impl Lines<'_> {
    /// Byte offset, in the body, just past the last line handed out (after its `\n`),
    /// so a caller can tell which bytes a run of lines occupied.
    pub(crate) fn offset(&self) -> usize {
        self.cursor.offset()
    }

    /// Goes on from byte `offset` of the body (at or after [`Self::offset`], at the
    /// start of a line), as if the lines in between had been read.
    pub(crate) fn skip_to(&mut self, offset: usize) {
        self.cursor.skip_to(offset);
    }
}

impl<'a> Iterator for Lines<'a> {
    type Item = Result<Line<'a>, Error>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        while let Some((line_no, raw)) = self.cursor.next_line() {
            let parsed = parse_raw_line(raw);
            match parsed {
                Ok(None) => {}
                Ok(Some(line)) => return Some(Ok(line)),
                Err(e) => {
                    return Some(Err(Error::Parse {
                        line: line_no,
                        column: e.column + 1,
                        kind: e.kind,
                    }));
                }
            }
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
    use crate::exposition::{MetricType, SyntaxError};

    #[test]
    fn bad_lines_are_reported_and_good_ones_kept() {
        let body = b"# TYPE a counter\na 1\na{x=1} 2\n\n\xff 3\nb 4\n# EOF";
        let got: Vec<Result<Line<'_>, Error>> = lines(body).collect();
        assert_eq!(got.len(), 6);
        assert_eq!(
            got[0],
            Ok(Line::Type {
                name: "a",
                kind: MetricType::Counter
            })
        );
        assert!(matches!(got[1], Ok(Line::Sample(s)) if s.value == 1.0));
        assert_eq!(
            got[2],
            Err(Error::Parse {
                line: 3,
                column: 5,
                kind: SyntaxError::LabelValue
            })
        );
        assert_eq!(
            got[3],
            Err(Error::Parse {
                line: 5,
                column: 1,
                kind: SyntaxError::Utf8
            })
        );
        assert!(matches!(got[4], Ok(Line::Sample(s)) if s.name == "b"));
        assert_eq!(got[5], Ok(Line::Eof));
    }
}
