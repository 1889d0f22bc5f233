//! Walks a body line by line, counting lines for error positions.

/// The unread part of a body and the 1-based number of the next line.
#[derive(Clone, Debug)]
pub(crate) struct LineCursor<'a> {
    rest: &'a [u8],
    next_line: usize,
}

impl<'a> LineCursor<'a> {
    pub(crate) fn new(body: &'a [u8]) -> Self {
        Self {
            rest: body,
            next_line: 1,
        }
    }

    /// The next line (without `\n`) and its 1-based number; `None` at the end of the body.
    /// A final line without `\n` is still a line.
    #[inline]
    pub(crate) fn next_line(&mut self) -> Option<(usize, &'a [u8])> {
        if self.rest.is_empty() {
            return None;
        }
        let number = self.next_line;
        self.next_line += 1;
        let line = match memchr::memchr(b'\n', self.rest) {
            Some(end) => {
                let line = &self.rest[..end];
                self.rest = &self.rest[end + 1..];
                line
            }
            None => std::mem::take(&mut self.rest),
        };
        Some((number, line))
    }

    /// Forgets the rest of the body.
    pub(crate) fn finish(&mut self) {
        self.rest = &[];
    }
}

#[cfg(test)]
mod tests {
    use super::LineCursor;

    #[test]
    fn lines_are_numbered_and_the_last_needs_no_newline() {
        let mut c = LineCursor::new(b"a\n\nb");
        assert_eq!(c.next_line(), Some((1, &b"a"[..])));
        assert_eq!(c.next_line(), Some((2, &b""[..])));
        assert_eq!(c.next_line(), Some((3, &b"b"[..])));
        assert_eq!(c.next_line(), None);
    }

    #[test]
    fn a_trailing_newline_adds_no_line() {
        let mut c = LineCursor::new(b"a\n");
        assert_eq!(c.next_line(), Some((1, &b"a"[..])));
        assert_eq!(c.next_line(), None);
    }
}
