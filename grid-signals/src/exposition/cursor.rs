//! Walks a body line by line, counting lines for error positions and checking UTF-8.
//!
//! The body is validated in long runs, not line by line, so the check
//! costs one pass at memory speed; a line that holds an invalid sequence is reported as
//! such and the walk resumes after it.

/// One line as the cursor hands it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RawLine<'a> {
    /// The line's text, without its `\n`.
    Text(&'a str),
    /// The line is not UTF-8; the 0-based byte column of its first invalid sequence.
    BadUtf8 {
        /// Where the invalid sequence starts.
        column: usize,
    },
}

/// The unread part of a body and the 1-based number of the next line.
#[derive(Clone, Debug)]
pub(crate) struct LineCursor<'a> {
    body: &'a [u8],
    /// Offset of the first unread byte.
    pos: usize,
    /// Validated text starting at `pos` (may be shorter than the rest of the body).
    valid: &'a str,
    next_line: usize,
}

impl<'a> LineCursor<'a> {
    pub(crate) fn new(body: &'a [u8]) -> Self {
        Self {
            body,
            pos: 0,
            valid: "",
            next_line: 1,
        }
    }

    /// The next line and its 1-based number; `None` at the end of the body. A final line
    /// without `\n` is still a line.
    #[inline]
    pub(crate) fn next_line(&mut self) -> Option<(usize, RawLine<'a>)> {
        if self.valid.is_empty() {
            let rest = self.body.get(self.pos..).filter(|r| !r.is_empty())?;
            self.valid = valid_prefix(rest);
        }
        let number = self.next_line;
        self.next_line += 1;
        if let Some(end) = memchr::memchr(b'\n', self.valid.as_bytes()) {
            let line = &self.valid[..end];
            self.valid = &self.valid[end + 1..];
            self.pos += end + 1;
            return Some((number, RawLine::Text(line)));
        }
        // No newline in the validated run: it ends the body, or an invalid sequence
        // follows inside this line.
        let partial = std::mem::take(&mut self.valid);
        self.pos += partial.len();
        let rest = &self.body[self.pos..];
        if rest.is_empty() {
            return Some((number, RawLine::Text(partial)));
        }
        self.pos += memchr::memchr(b'\n', rest).map_or(rest.len(), |end| end + 1);
        Some((
            number,
            RawLine::BadUtf8 {
                column: partial.len(),
            },
        ))
    }

    /// Offset of the first unread byte.
    pub(crate) fn offset(&self) -> usize {
        self.pos
    }

    /// Moves on to `offset` (at or after [`Self::offset`], at the start of a line),
    /// counting the lines passed; bytes already validated are not validated again.
    pub(crate) fn skip_to(&mut self, offset: usize) {
        let Some(passed) = self.body.get(self.pos..offset) else {
            return;
        };
        self.next_line += memchr::memchr_iter(b'\n', passed).count();
        self.valid = self.valid.get(passed.len()..).unwrap_or_default();
        self.pos = offset;
    }

    /// Forgets the rest of the body.
    pub(crate) fn finish(&mut self) {
        self.pos = self.body.len();
        self.valid = "";
    }
}

/// The longest UTF-8 prefix of `bytes`. `from_utf8` has an ASCII fast path that
/// `utf8_chunks` lacks; the prefix is validated a second time only when an invalid
/// sequence follows it, so the total work stays linear.
fn valid_prefix(bytes: &[u8]) -> &str {
    match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::{LineCursor, RawLine};

    fn all(body: &[u8]) -> Vec<(usize, RawLine<'_>)> {
        let mut c = LineCursor::new(body);
        std::iter::from_fn(|| c.next_line()).collect()
    }

    #[test]
    fn lines_are_numbered_and_the_last_needs_no_newline() {
        assert_eq!(
            all(b"a\n\nb"),
            vec![
                (1, RawLine::Text("a")),
                (2, RawLine::Text("")),
                (3, RawLine::Text("b"))
            ]
        );
    }

    #[test]
    fn a_trailing_newline_adds_no_line() {
        assert_eq!(all(b"a\n"), vec![(1, RawLine::Text("a"))]);
        assert_eq!(all(b""), vec![]);
    }

    #[test]
    fn skipping_keeps_line_numbers_and_resumes_at_the_offset() {
        let body = b"a\nb\nc\n\xff\nd";
        let mut c = LineCursor::new(body);
        assert_eq!(c.next_line(), Some((1, RawLine::Text("a"))));
        c.skip_to(6);
        assert_eq!(c.next_line(), Some((4, RawLine::BadUtf8 { column: 0 })));
        c.skip_to(c.offset());
        assert_eq!(c.next_line(), Some((5, RawLine::Text("d"))));
        assert_eq!(c.next_line(), None);
        // Past the validated run (it stopped at the invalid byte) and past the end.
        let mut c = LineCursor::new(body);
        assert_eq!(c.next_line(), Some((1, RawLine::Text("a"))));
        c.skip_to(8);
        assert_eq!(c.next_line(), Some((5, RawLine::Text("d"))));
        c.skip_to(body.len() + 1);
        assert_eq!(c.next_line(), None);
    }

    #[test]
    fn invalid_utf8_spoils_only_its_own_line() {
        assert_eq!(
            all(b"ok\nab\xffcd\n\xc3\n\xc3\xa9\nend\xff"),
            vec![
                (1, RawLine::Text("ok")),
                (2, RawLine::BadUtf8 { column: 2 }),
                (3, RawLine::BadUtf8 { column: 0 }),
                (4, RawLine::Text("\u{e9}")),
                (5, RawLine::BadUtf8 { column: 3 }),
            ]
        );
    }
}
