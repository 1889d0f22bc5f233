//! HTTP/1.1 as the gateway speaks it, on both sides. Toward a site in the clear: the
//! request written in one buffer, the answer's head parsed in place, its body framed and
//! handed on as it is decoded. Toward clients ([`client_request`], [`client_answer`]):
//! request heads parsed in place, bodies read with the same [`BodyDecoder`], answers
//! framed in one buffer. Sans-I/O: bytes in, bytes and decisions out; the gateway's
//! `site_pool` and `client_h1` own the sockets, read into a buffer, and hand it to
//! [`parse_head`] / [`parse_request`] until a head is whole (which takes it off the
//! buffer), then to a [`BodyDecoder`] for each frame.
//!
//! ```
//! use bytes::BytesMut;
//! use grid_h1_wire::{BodyDecoder, Decoded, Parsed, parse_head};
//! use http::Method;
//!
//! let mut read = BytesMut::from(
//!     &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"[..],
//! );
//! let Parsed::Head(_, head) = parse_head(&mut read, &Method::POST).unwrap() else {
//!     unreachable!("the head is whole");
//! };
//! let mut body = BodyDecoder::new(head.framing);
//! assert_eq!(body.decode(&mut read).unwrap(), Decoded::Data("ok".into()));
//! assert_eq!(body.decode(&mut read).unwrap(), Decoded::End);
//! assert!(head.reusable);
//! ```
//!
//! The caller's task does that work itself, with no task of the codec's: a client
//! connection with a dispatcher of its own (hyper's) hands the request over through one
//! channel, the head back through another and every chunk through a one-frame channel,
//! and on a streamed answer those hand-overs cost more than the proxying
//! (`docs/benchmarks.md`). What hyper checks is checked here too, never more loosely (the
//! `h1_request` and `h1_answer` fuzz targets hold both to the same bytes), and every size
//! is bounded: a head of at most [`MAX_ANSWER_HEAD_BYTES`] with at most
//! [`MAX_ANSWER_HEADERS`] fields, a chunk-size line of at most [`MAX_CHUNK_LINE_BYTES`],
//! at most [`MAX_CHUNK_EXTENSION_BYTES`] of chunk extensions per body, trailers of at
//! most [`MAX_TRAILER_BYTES`] in at most [`MAX_TRAILER_FIELDS`] fields (read and dropped:
//! the gateway forwards none). A chunk extension or a trailer with a control byte (a bare
//! CR or LF, NUL; a tab only where RFC 9112 allows whitespace), or a trailer line that is
//! not a `name: value` field, is refused: two readers that split such a line differently
//! disagree on where the body ends. Framing follows RFC 9112 section 6.3: no body for
//! 1xx, 204 and 304; `Transfer-Encoding: chunked` wins over a `Content-Length` (and the
//! connection is not reused after such an answer); an answer with any other coding, or
//! with `Transfer-Encoding` in HTTP/1.0, is refused (the gateway re-frames every body, so
//! a coding it does not decode would reach the client lost); differing `Content-Length`s
//! are refused.

pub mod client_answer;
pub mod client_request;
mod error;
mod shared_head;

pub use client_answer::{
    AnswerFraming, ConnectionField, LAST_CHUNK, encode_answer_head, encode_chunk,
};
pub use client_request::{MAX_REQUEST_HEAD_BYTES, MAX_REQUEST_HEADERS, RequestHead, parse_request};
pub use error::WireError;

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, Method, StatusCode, header};

/// The longest answer head read from a site (hyper's client allowed about 400 KiB of
/// buffer; a model server's head is a few hundred bytes).
pub const MAX_ANSWER_HEAD_BYTES: usize = 64 * 1024;
/// The most header fields in an answer head (hyper's default, 100).
pub const MAX_ANSWER_HEADERS: usize = 100;
/// The longest chunk-size line, extensions included.
pub const MAX_CHUNK_LINE_BYTES: usize = 1024;
/// The most bytes of chunk extensions in one body, each counted from its `;` to the end
/// of its line: hyper's 16 KiB (which it counts without the `;`, so it reads at least as
/// much).
pub const MAX_CHUNK_EXTENSION_BYTES: usize = 16 * 1024;
/// The most bytes of a trailer section: its field lines and the empty line that ends it,
/// line ends included. hyper refuses a section on reaching 16 KiB, so the most it reads is
/// one byte less; the gateway reads no more than hyper would.
pub const MAX_TRAILER_BYTES: usize = 16 * 1024 - 1;
/// The most trailer fields (hyper's, the same as its most header fields).
pub const MAX_TRAILER_FIELDS: usize = 100;
/// The most interim (1xx) answers before the final one.
pub const MAX_INTERIM_ANSWERS: usize = 8;

/// How an answer's body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Until the site closes the connection.
    UntilClose,
}

/// An answer's head, its framing, and whether the connection may carry another request.
#[derive(Debug)]
pub struct AnswerHead {
    /// The status.
    pub status: StatusCode,
    /// The header fields as sent (hop-by-hop ones included: the proxy strips them),
    /// except `Transfer-Encoding`: its coding is decoded here, and read into `framing`.
    pub headers: HeaderMap,
    /// How the body ends.
    pub framing: Framing,
    /// The connection may be reused once the body has ended.
    pub reusable: bool,
}

/// What [`parse_head`] found at the start of the buffer (and took off it).
#[derive(Debug)]
pub enum Parsed {
    /// Not a whole head yet.
    Partial,
    /// An interim (1xx) answer of this many bytes, to be skipped.
    Interim(usize),
    /// The final answer's head, of this many bytes.
    Head(usize, AnswerHead),
}

/// Takes the answer head, to the request made with `method`, off the front of `buf` when
/// it is whole (an interim answer is taken off too, and said so); [`Parsed::Partial`]
/// leaves `buf` untouched.
///
/// The head's bytes become one shared buffer its field values point into, so a head
/// costs no allocation per field.
///
/// # Errors
///
/// A head that is malformed, too large, or frames its body in a way that cannot be read
/// (the connection is not read again then, so what is left in `buf` does not matter).
pub fn parse_head(buf: &mut BytesMut, method: &Method) -> Result<Parsed, WireError> {
    let mut spans = shared_head::Fields::<MAX_ANSWER_HEADERS>::new();
    let (len, code, http11) = {
        let mut fields =
            [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_ANSWER_HEADERS];
        let mut answer = httparse::Response::new(&mut []);
        let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut answer,
            buf,
            &mut fields,
        ) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() >= MAX_ANSWER_HEAD_BYTES => {
                return Err(WireError::HeadTooLarge);
            }
            Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
            Err(httparse::Error::TooManyHeaders) => return Err(WireError::HeadTooLarge),
            Err(e) => return Err(WireError::Head(e.to_string())),
        };
        if len > MAX_ANSWER_HEAD_BYTES {
            return Err(WireError::HeadTooLarge);
        }
        shared_head::note(buf, answer.headers, &mut spans);
        (
            len,
            answer.code.unwrap_or_default(),
            answer.version == Some(1),
        )
    };
    let status = StatusCode::from_u16(code).map_err(|e| WireError::Head(e.to_string()))?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(WireError::Interim(code));
    }
    if status.is_informational() {
        buf.advance(len);
        return Ok(Parsed::Interim(len));
    }
    let head = buf.split_to(len).freeze();
    let (headers, noted) = shared_head::header_map(&head, &spans, WireError::Head)?;
    let (framing, sure) = framing(status, method, http11, noted)?;
    let reusable = http11
        && sure
        && framing != Framing::UntilClose
        && !(noted.connection && asks_close(&headers));
    Ok(Parsed::Head(
        len,
        AnswerHead {
            status,
            headers,
            framing,
            reusable,
        },
    ))
}

/// The body's framing, and whether it is unambiguous (a chunked answer that also carries
/// `Content-Length` is read as chunked, but its connection is not trusted again).
fn framing(
    status: StatusCode,
    method: &Method,
    http11: bool,
    noted: shared_head::Noted,
) -> Result<(Framing, bool), WireError> {
    if *method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok((Framing::Empty, true));
    }
    if noted.coding != shared_head::Coding::Absent {
        // Any coding but `chunked` alone would reach the client undone (the gateway
        // re-frames the body and drops the field), and HTTP/1.0 has no transfer codings
        // (RFC 9112 section 6.1: such framing is faulty).
        if !http11 || !noted.coding.is_chunked_only() {
            return Err(WireError::AnswerCoding);
        }
        let sure = noted.length == shared_head::Length::Absent;
        return Ok((Framing::Chunked, sure));
    }
    match noted.length {
        shared_head::Length::Is(0) => Ok((Framing::Empty, true)),
        shared_head::Length::Is(n) => Ok((Framing::Length(n), true)),
        shared_head::Length::Absent => Ok((Framing::UntilClose, false)),
        shared_head::Length::Unusable => Err(WireError::ContentLength),
    }
}

/// Whether an answer's `headers` name a transfer coding other than `chunked` alone: the
/// rule [`parse_head`] refuses an answer by ([`WireError::AnswerCoding`]), for an answer
/// another HTTP/1.1 client read (hyper's, which decodes the chunks and keeps the field).
#[must_use]
pub fn coded_other_than_chunked(headers: &HeaderMap) -> bool {
    let coding = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .fold(shared_head::Coding::Absent, |coding, value| {
            coding.add(value.as_bytes())
        });
    coding != shared_head::Coding::Absent && !coding.is_chunked_only()
}

/// Whether the site said it closes the connection after this answer.
fn asks_close(headers: &HeaderMap) -> bool {
    list_tokens(headers, header::CONNECTION).any(|t| t.eq_ignore_ascii_case("close"))
}

/// The comma-separated tokens of every `name` field in `headers`, trimmed, in order
/// (empty ones included; a value that is not visible ASCII contributes none): how
/// `Connection` and `Transfer-Encoding` are read.
pub fn list_tokens(headers: &HeaderMap, name: HeaderName) -> impl DoubleEndedIterator<Item = &str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// Writes a request head for `body_len` bytes of body into `out`: `headers` as given
/// (hop-by-hop ones already removed by the proxy), then `Host` and the body's own
/// `Content-Length`. The framing and `Host` fields are this encoder's own whatever the
/// caller left in `headers`: a client's `Content-Length`, `Transfer-Encoding` or `Host`
/// is never written, since the body is sent whole and framed by its length, and a
/// second framing field would let the site read a different body than the one routed.
pub fn encode_request(
    method: &Method,
    target: &str,
    host: &str,
    headers: &HeaderMap,
    body_len: usize,
    out: &mut BytesMut,
) {
    let mut len = method.as_str().len() + target.len() + host.len() + 64;
    for (n, v) in headers {
        len += n.as_str().len() + v.len() + 4;
    }
    out.reserve(len);
    out.put_slice(method.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(target.as_bytes());
    out.put_slice(b" HTTP/1.1\r\nhost: ");
    out.put_slice(host.as_bytes());
    out.put_slice(b"\r\n");
    for (n, v) in headers {
        if n == header::CONTENT_LENGTH || n == header::HOST || n == header::TRANSFER_ENCODING {
            continue;
        }
        out.put_slice(n.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(v.as_bytes());
        out.put_slice(b"\r\n");
    }
    if body_len > 0 || method_expects_body(method) {
        out.put_slice(b"content-length: ");
        put_decimal(out, body_len);
        out.put_slice(b"\r\n");
    }
    out.put_slice(b"\r\n");
}

/// Whether a request with this method and an empty body still says `Content-Length: 0`
/// (RFC 9110 section 8.6: a user agent should for methods that define a body).
fn method_expects_body(method: &Method) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH)
}

/// `n` in decimal, without a `String`.
fn put_decimal(out: &mut BytesMut, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        // `n % 10` is a digit.
        digits[at] = b'0' + u8::try_from(n % 10).unwrap_or(0);
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.put_slice(&digits[at..]);
}

/// What [`BodyDecoder::decode`] took from the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Body bytes, in order.
    Data(Bytes),
    /// The body is complete (the buffer holds what follows it, if anything).
    End,
    /// More bytes are needed.
    More,
}

/// Where a chunked body's decoder is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chunk {
    /// At a chunk-size line.
    Size,
    /// Inside a chunk's data, this many bytes left.
    Data(u64),
    /// After a chunk's data, at its CRLF.
    DataEnd,
    /// After the last chunk, at the trailers: the bytes and fields of them read so far.
    Trailers(usize, usize),
}

/// Frames an answer's body out of the connection's read buffer.
#[derive(Debug)]
pub struct BodyDecoder {
    state: State,
    /// Bytes of chunk extensions read so far (at most [`MAX_CHUNK_EXTENSION_BYTES`]).
    extensions: usize,
}

#[derive(Debug)]
enum State {
    Length(u64),
    Chunked(Chunk),
    UntilClose,
    Done,
}

impl BodyDecoder {
    /// A decoder for a body framed as `framing`.
    #[must_use]
    pub fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Empty | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::Chunked(Chunk::Size),
            Framing::UntilClose => State::UntilClose,
        };
        Self {
            state,
            extensions: 0,
        }
    }

    /// Whether the body has ended.
    #[must_use]
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Body bytes left, when known.
    #[must_use]
    pub fn remaining(&self) -> Option<u64> {
        match self.state {
            State::Length(n) => Some(n),
            State::Done => Some(0),
            _ => None,
        }
    }

    /// Takes the next body bytes (or the end) from the front of `buf`; what follows the
    /// body is left there.
    ///
    /// # Errors
    ///
    /// A malformed chunked coding.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, WireError> {
        match &mut self.state {
            State::Done => Ok(Decoded::End),
            State::Length(_) | State::UntilClose if buf.is_empty() => Ok(Decoded::More),
            State::Length(left) => {
                let n = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                *left -= n as u64;
                if *left == 0 {
                    self.state = State::Done;
                }
                Ok(Decoded::Data(buf.split_to(n).freeze()))
            }
            State::UntilClose => Ok(Decoded::Data(buf.split().freeze())),
            State::Chunked(_) => self.decode_chunks(buf),
        }
    }

    /// The data of every chunk in `buf`, as one frame: the first chunk's data stays
    /// where it is, each later one is moved down over the chunk lines before it. A burst
    /// of small chunks read together (a model's tokens) is then one frame, not one per
    /// chunk through every layer above. The end (past the last chunk and its trailers)
    /// comes at the call after the data; so does an error found after some data, which
    /// leaves the decoder at the malformed part.
    fn decode_chunks(&mut self, buf: &mut BytesMut) -> Result<Decoded, WireError> {
        let Self {
            state: State::Chunked(chunk),
            extensions,
        } = self
        else {
            return Ok(Decoded::More);
        };
        // Gathered data lies in buf[start..end]; bytes up to `pos` are read.
        let (mut start, mut end, mut pos) = (0, 0, 0);
        let mut done = false;
        let stopped: Result<(), WireError> = loop {
            match *chunk {
                Chunk::Size => {
                    let line = match line_end(&buf[pos..], MAX_CHUNK_LINE_BYTES) {
                        Ok(Some(line)) => line,
                        Ok(None) => break Ok(()),
                        Err(e) => break Err(e),
                    };
                    let (size, extension) = match chunk_size(&buf[pos..pos + line]) {
                        Ok(read) => read,
                        Err(e) => break Err(e),
                    };
                    *extensions += extension;
                    if *extensions > MAX_CHUNK_EXTENSION_BYTES {
                        break Err(WireError::ChunkExtensionsTooLarge);
                    }
                    pos += line + 2;
                    *chunk = if size == 0 {
                        Chunk::Trailers(0, 0)
                    } else {
                        Chunk::Data(size)
                    };
                }
                Chunk::Data(left) => {
                    if pos == buf.len() {
                        break Ok(());
                    }
                    let n = usize::try_from(left)
                        .unwrap_or(usize::MAX)
                        .min(buf.len() - pos);
                    if end == start {
                        // The first data: left in place.
                        (start, end) = (pos, pos + n);
                    } else {
                        buf.copy_within(pos..pos + n, end);
                        end += n;
                    }
                    pos += n;
                    let rest = left - n as u64;
                    *chunk = if rest == 0 {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(rest)
                    };
                }
                Chunk::DataEnd => {
                    if buf.len() - pos < 2 {
                        break Ok(());
                    }
                    if &buf[pos..pos + 2] != b"\r\n" {
                        break Err(WireError::ChunkEnd);
                    }
                    pos += 2;
                    *chunk = Chunk::Size;
                }
                Chunk::Trailers(..) if end > start => break Ok(()),
                Chunk::Trailers(seen, fields) => {
                    // A line and its CRLF must fit in what is left (`seen` leaves room for
                    // the empty line's CRLF at least: each field line below keeps it).
                    let room = MAX_TRAILER_BYTES - seen - 2;
                    let line = match line_end(&buf[pos..], room) {
                        Ok(Some(line)) => line,
                        Ok(None) => break Ok(()),
                        Err(_) => break Err(WireError::TrailersTooLarge),
                    };
                    if line == 0 {
                        pos += 2;
                        done = true;
                        break Ok(());
                    }
                    if fields == MAX_TRAILER_FIELDS || seen + line + 4 > MAX_TRAILER_BYTES {
                        break Err(WireError::TrailersTooLarge);
                    }
                    if !is_field_line(&buf[pos..pos + line]) {
                        break Err(WireError::Trailer);
                    }
                    pos += line + 2;
                    *chunk = Chunk::Trailers(seen + line + 2, fields + 1);
                }
            }
        };
        if end > start {
            buf.advance(start);
            let data = buf.split_to(end - start).freeze();
            buf.advance(pos - end);
            return Ok(Decoded::Data(data));
        }
        buf.advance(pos);
        stopped?;
        if done {
            self.state = State::Done;
            return Ok(Decoded::End);
        }
        Ok(Decoded::More)
    }

    /// The connection ended: the end of a body read until close, an error otherwise.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] for a body that had more to come.
    pub fn eof(&mut self) -> Result<(), WireError> {
        match self.state {
            State::UntilClose | State::Done => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err(WireError::Truncated),
        }
    }
}

/// The length of the line at the start of `buf` (before its CRLF), `None` while its end
/// has not arrived, an error once `max` bytes came without one.
fn line_end(buf: &[u8], max: usize) -> Result<Option<usize>, WireError> {
    let window = &buf[..buf.len().min(max + 2)];
    match window.windows(2).position(|w| w == b"\r\n") {
        Some(at) if at <= max => Ok(Some(at)),
        Some(_) => Err(WireError::ChunkSize),
        None if window.len() >= max + 2 => Err(WireError::ChunkSize),
        None => Ok(None),
    }
}

/// The size of a chunk-size line and the bytes of its extension: hexadecimal digits,
/// then optional whitespace, then optional extensions from a `;` to the line's end,
/// which are ignored but may carry no control byte (a tab is whitespace there).
fn chunk_size(line: &[u8]) -> Result<(u64, usize), WireError> {
    let digits = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    if digits == 0 || digits > 16 {
        return Err(WireError::ChunkSize);
    }
    let rest = &line[digits..];
    let extension = match rest.iter().position(|b| !matches!(b, b' ' | b'\t')) {
        None => 0,
        Some(at) if rest[at] == b';' => {
            let extension = &rest[at..];
            if extension.iter().any(|&b| shared_head::is_control(b)) {
                return Err(WireError::ChunkExtension);
            }
            extension.len()
        }
        Some(_) => return Err(WireError::ChunkSize),
    };
    let text = std::str::from_utf8(&line[..digits]).map_err(|_| WireError::ChunkSize)?;
    let size = u64::from_str_radix(text, 16).map_err(|_| WireError::ChunkSize)?;
    Ok((size, extension))
}

/// Whether a trailer `line` (without its CRLF) is a field, RFC 9112 section 5: a token,
/// a colon right after it, then a value of visible bytes, spaces and tabs. A line that
/// starts with whitespace (a fold, obsolete and refused as in a head) has no token first.
fn is_field_line(line: &[u8]) -> bool {
    let name = line
        .iter()
        .position(|&b| !is_token(b))
        .unwrap_or(line.len());
    name > 0
        && line.get(name) == Some(&b':')
        && !line[name + 1..].iter().any(|&b| shared_head::is_control(b))
}

/// Whether `b` is a token character (RFC 9110 section 5.6.2's `tchar`).
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;
    use std::fmt::Write as _;

    /// `bytes` through the parser as a connection's read buffer.
    fn parse(bytes: &[u8], method: &Method) -> Result<Parsed, WireError> {
        parse_head(&mut BytesMut::from(bytes), method)
    }

    fn head(text: &str) -> AnswerHead {
        match parse(text.as_bytes(), &Method::POST).unwrap() {
            Parsed::Head(len, h) => {
                assert_eq!(len, text.len());
                h
            }
            other => panic!("{other:?}"),
        }
    }

    /// Every byte of `wire` through a decoder for `framing`, fed in pieces of `step`
    /// bytes: the body and what was left after it.
    fn decode_all(
        framing: Framing,
        wire: &[u8],
        step: usize,
    ) -> Result<(Vec<u8>, Vec<u8>), WireError> {
        let mut d = BodyDecoder::new(framing);
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        let mut fed = 0;
        loop {
            match d.decode(&mut buf)? {
                Decoded::Data(b) => body.extend_from_slice(&b),
                Decoded::End => return Ok((body, buf.to_vec())),
                Decoded::More if fed < wire.len() => {
                    let n = step.min(wire.len() - fed);
                    buf.extend_from_slice(&wire[fed..fed + n]);
                    fed += n;
                }
                Decoded::More => {
                    d.eof()?;
                    return Ok((body, Vec::new()));
                }
            }
        }
    }

    #[test]
    fn a_plain_answer_with_a_length_is_framed_by_it_and_reusable() {
        let h =
            head("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n");
        assert_eq!(h.status, StatusCode::OK);
        assert_eq!(h.framing, Framing::Length(2));
        assert!(h.reusable);
        assert_eq!(h.headers[header::CONTENT_TYPE], "application/json");
        let (body, after) = decode_all(h.framing, b"okHTTP/1.1", 1).unwrap();
        assert_eq!(body, b"ok");
        assert_eq!(
            after, b"",
            "the next answer's bytes are not read as this body"
        );
    }

    #[test]
    fn a_chunked_answer_is_decoded_with_extensions_and_trailers_at_any_split() {
        let wire = b"5;name=v\r\nhello\r\n1 ; x\r\n!\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
        for step in 1..wire.len() {
            let mut d = BodyDecoder::new(Framing::Chunked);
            let mut buf = BytesMut::new();
            let mut body = Vec::new();
            let mut fed = 0;
            loop {
                match d.decode(&mut buf).unwrap() {
                    Decoded::Data(b) => body.extend_from_slice(&b),
                    Decoded::End => break,
                    Decoded::More => {
                        let n = step.min(wire.len() - fed);
                        assert!(n > 0, "ran out at step {step}");
                        buf.extend_from_slice(&wire[fed..fed + n]);
                        fed += n;
                    }
                }
            }
            assert_eq!(body, b"hello!", "step {step}");
            let mut rest = buf.to_vec();
            rest.extend_from_slice(&wire[fed..]);
            assert_eq!(rest, b"NEXT", "step {step}");
        }
    }

    #[test]
    fn interim_answers_are_skipped_and_switching_protocols_refused() {
        let text = "HTTP/1.1 100 Continue\r\n\r\n";
        assert!(matches!(
            parse(text.as_bytes(), &Method::POST),
            Ok(Parsed::Interim(n)) if n == text.len()
        ));
        assert_eq!(
            parse_head(
                &mut BytesMut::from(&(b"HTTP/1.1 101 Switching Protocols\r\n\r\n")[..]),
                &Method::POST
            )
            .unwrap_err(),
            WireError::Interim(101)
        );
    }

    #[test]
    fn no_body_is_read_for_204_304_and_head_whatever_the_length_says() {
        for (status, method) in [(204, Method::POST), (304, Method::GET), (200, Method::HEAD)] {
            let text = format!("HTTP/1.1 {status} X\r\ncontent-length: 10\r\n\r\n");
            let Parsed::Head(_, h) = parse(text.as_bytes(), &method).unwrap() else {
                panic!("{text}");
            };
            assert_eq!(h.framing, Framing::Empty, "{text}");
            assert!(BodyDecoder::new(h.framing).is_done());
        }
    }

    #[test]
    fn chunked_wins_over_a_length_and_such_a_connection_is_not_reused() {
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n");
        assert_eq!(h.framing, Framing::Chunked);
        assert!(!h.reusable);
    }

    #[test]
    fn an_answer_coded_other_than_chunked_alone_or_coded_in_http_1_0_is_refused() {
        for (version, codings) in [
            ("1.1", "transfer-encoding: gzip\r\n"),
            ("1.1", "transfer-encoding: gzip, chunked\r\n"),
            ("1.1", "transfer-encoding: identity\r\n"),
            ("1.1", "transfer-encoding: chunked, x-unknown\r\n"),
            (
                "1.1",
                "transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n",
            ),
            ("1.1", "transfer-encoding: chunked,\r\n"),
            ("1.0", "transfer-encoding: chunked\r\n"),
        ] {
            let text = format!("HTTP/{version} 200 OK\r\n{codings}\r\n");
            assert_eq!(
                parse(text.as_bytes(), &Method::POST).unwrap_err(),
                WireError::AnswerCoding,
                "{text:?}"
            );
        }
        // An answer with no body has no coding to lose.
        let text = "HTTP/1.1 204 No Content\r\ntransfer-encoding: gzip\r\n\r\n";
        assert!(matches!(
            parse(text.as_bytes(), &Method::POST),
            Ok(Parsed::Head(
                _,
                AnswerHead {
                    framing: Framing::Empty,
                    ..
                }
            ))
        ));
    }

    #[test]
    fn differing_malformed_or_listed_lengths_are_refused_and_equal_repeats_accepted() {
        for bad in [
            "1, 2",
            "4, 4",
            "+4",
            "-1",
            "abc",
            "",
            "1 2",
            "99999999999999999999999",
        ] {
            let text = format!("HTTP/1.1 200 OK\r\ncontent-length: {bad}\r\n\r\n");
            assert_eq!(
                parse(text.as_bytes(), &Method::POST).unwrap_err(),
                WireError::ContentLength,
                "{bad:?}"
            );
        }
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 4\r\ncontent-length: 4\r\n\r\n");
        assert_eq!(h.framing, Framing::Length(4));
    }

    #[test]
    fn a_close_or_http_1_0_or_an_unframed_answer_is_not_reused() {
        assert!(
            !head("HTTP/1.1 200 OK\r\nconnection: keep-alive, close\r\ncontent-length: 1\r\n\r\n")
                .reusable
        );
        assert!(!head("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n").reusable);
        let h = head("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(h.framing, Framing::UntilClose);
        assert!(!h.reusable);
        let (body, _) = decode_all(h.framing, b"all of it", 4).unwrap();
        assert_eq!(body, b"all of it", "read until the connection closes");
    }

    #[test]
    fn a_body_cut_before_its_length_or_last_chunk_is_truncated() {
        assert_eq!(
            decode_all(Framing::Length(10), b"short", 2).unwrap_err(),
            WireError::Truncated
        );
        assert_eq!(
            decode_all(Framing::Chunked, b"5\r\nhel", 2).unwrap_err(),
            WireError::Truncated
        );
    }

    #[test]
    fn a_head_at_the_size_limit_is_read_and_one_past_it_refused() {
        let filler = |total: usize| {
            let start = "HTTP/1.1 200 OK\r\nx-fill: ";
            let end = "\r\ncontent-length: 0\r\n\r\n";
            format!(
                "{start}{}{end}",
                "a".repeat(total - start.len() - end.len())
            )
        };
        let at = filler(MAX_ANSWER_HEAD_BYTES);
        assert_eq!(at.len(), MAX_ANSWER_HEAD_BYTES);
        assert!(matches!(
            parse(at.as_bytes(), &Method::POST),
            Ok(Parsed::Head(..))
        ));
        let past = filler(MAX_ANSWER_HEAD_BYTES + 1);
        assert_eq!(
            parse(past.as_bytes(), &Method::POST).unwrap_err(),
            WireError::HeadTooLarge
        );
        // An unfinished head that already fills the limit is refused, not waited on.
        let unfinished = &past.as_bytes()[..MAX_ANSWER_HEAD_BYTES];
        assert_eq!(
            parse(unfinished, &Method::POST).unwrap_err(),
            WireError::HeadTooLarge
        );
        let partial = &past.as_bytes()[..MAX_ANSWER_HEAD_BYTES - 1];
        assert!(matches!(parse(partial, &Method::POST), Ok(Parsed::Partial)));
    }

    #[test]
    fn a_head_with_the_most_fields_is_read_and_one_more_refused() {
        let with = |n: usize| {
            let mut t = String::from("HTTP/1.1 200 OK\r\n");
            for i in 0..n {
                let _ = write!(t, "x-{i}: v\r\n");
            }
            t + "\r\n"
        };
        assert!(matches!(
            parse(with(MAX_ANSWER_HEADERS).as_bytes(), &Method::POST),
            Ok(Parsed::Head(..))
        ));
        assert_eq!(
            parse(with(MAX_ANSWER_HEADERS + 1).as_bytes(), &Method::POST).unwrap_err(),
            WireError::HeadTooLarge
        );
    }

    #[test]
    fn a_chunk_line_at_the_limit_is_read_and_one_past_it_refused() {
        let line = |len: usize| {
            let mut l = String::from("1;");
            l.push_str(&"e".repeat(len - 2));
            format!("{l}\r\nx\r\n0\r\n\r\n")
        };
        let (body, _) =
            decode_all(Framing::Chunked, line(MAX_CHUNK_LINE_BYTES).as_bytes(), 7).unwrap();
        assert_eq!(body, b"x");
        assert_eq!(
            decode_all(
                Framing::Chunked,
                line(MAX_CHUNK_LINE_BYTES + 1).as_bytes(),
                7
            )
            .unwrap_err(),
            WireError::ChunkSize
        );
    }

    #[test]
    fn a_trailer_section_at_the_limit_is_read_and_one_byte_longer_refused() {
        let with = |len: usize| {
            // One field line (`x: t...` and its CRLF) and the empty line: `len` bytes.
            format!("0\r\nx: {}\r\n\r\n", "t".repeat(len - 7))
        };
        assert_eq!(with(MAX_TRAILER_BYTES).len(), 3 + MAX_TRAILER_BYTES);
        assert!(decode_all(Framing::Chunked, with(MAX_TRAILER_BYTES).as_bytes(), 100).is_ok());
        assert_eq!(
            decode_all(
                Framing::Chunked,
                with(MAX_TRAILER_BYTES + 1).as_bytes(),
                100
            )
            .unwrap_err(),
            WireError::TrailersTooLarge
        );
    }

    #[test]
    fn the_most_trailer_fields_are_read_and_one_more_refused() {
        let with = |n: usize| format!("0\r\n{}\r\n", "t: 1\r\n".repeat(n));
        assert!(decode_all(Framing::Chunked, with(MAX_TRAILER_FIELDS).as_bytes(), 9).is_ok());
        assert_eq!(
            decode_all(Framing::Chunked, with(MAX_TRAILER_FIELDS + 1).as_bytes(), 9).unwrap_err(),
            WireError::TrailersTooLarge
        );
    }

    #[test]
    fn a_trailer_that_is_not_a_name_value_field_is_refused() {
        for bad in [
            &b"no colon"[..],
            b": no name",
            b"x : space before the colon",
            b" folded: onto the line before",
            b"\tfolded: by a tab",
            b"x: a bare\nLF",
            b"x: a bare\rCR",
            b"x: a \x00 NUL",
            b"x: a \x7f DEL",
            b"x\x01: a control byte in the name",
            b"x(y): not a token",
        ] {
            let mut wire = b"1\r\na\r\n0\r\nok: 1\r\n".to_vec();
            wire.extend_from_slice(bad);
            wire.extend_from_slice(b"\r\n\r\n");
            let (body, ended) = match decode_all(Framing::Chunked, &wire, 64) {
                Ok(read) => (read.0, Ok(())),
                Err(e) => (Vec::new(), Err(e)),
            };
            assert_eq!(
                ended,
                Err(WireError::Trailer),
                "{:?} {body:?}",
                String::from_utf8_lossy(bad)
            );
        }
        // Whitespace around the value, a tab in it, bytes past ASCII: a field.
        let good = b"0\r\nx-a:\tv 1 \r\nx-b:\r\nx-c: caf\xc3\xa9\r\n\r\n";
        assert!(decode_all(Framing::Chunked, good, 5).is_ok());
    }

    #[test]
    fn a_chunk_extension_with_a_control_byte_is_refused_and_one_with_a_tab_read() {
        for bad in [
            &b"5;a\nb\r\nhello\r\n0\r\n\r\n"[..],
            b"5;a\rb\r\nhello\r\n0\r\n\r\n",
            b"5;a=\x00\r\nhello\r\n0\r\n\r\n",
            b"5;\x7f\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0;\x1b\r\n\r\n",
        ] {
            let mut d = BodyDecoder::new(Framing::Chunked);
            let mut buf = BytesMut::from(bad);
            let got = loop {
                match d.decode(&mut buf) {
                    Ok(Decoded::Data(_)) => {}
                    other => break other,
                }
            };
            assert_eq!(
                got,
                Err(WireError::ChunkExtension),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let (body, _) = decode_all(
            Framing::Chunked,
            b"5 ;\ta = \"q\t\xff\" ;b\r\nhello\r\n0\r\n\r\n",
            3,
        )
        .unwrap();
        assert_eq!(body, b"hello");
    }

    #[test]
    fn chunk_extensions_up_to_the_limit_are_read_and_one_byte_more_refused() {
        // 32 chunks with 512 bytes of extension each, `;` included: 16 KiB in all.
        let with = |extra: usize| {
            let mut wire = String::new();
            for i in 0..32 {
                let len = 511 + if i == 0 { extra } else { 0 };
                let _ = write!(wire, "1;{}\r\nx\r\n", "e".repeat(len));
            }
            wire + "0\r\n\r\n"
        };
        assert_eq!(32 * 512, MAX_CHUNK_EXTENSION_BYTES);
        let (body, _) = decode_all(Framing::Chunked, with(0).as_bytes(), 700).unwrap();
        assert_eq!(body.len(), 32);
        assert_eq!(
            decode_all(Framing::Chunked, with(1).as_bytes(), 700).unwrap_err(),
            WireError::ChunkExtensionsTooLarge
        );
    }

    #[test]
    fn malformed_chunk_sizes_and_ends_are_refused() {
        for bad in [
            &b"g\r\n"[..],
            b"\r\n",
            b"11111111111111111\r\n",
            b"5 x\r\n",
            b"-5\r\n",
        ] {
            assert_eq!(
                decode_all(Framing::Chunked, bad, 64).unwrap_err(),
                WireError::ChunkSize,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            decode_all(Framing::Chunked, b"2\r\nokXX0\r\n\r\n", 64).unwrap_err(),
            WireError::ChunkEnd
        );
        // The largest size that fits is read as a size (and then waits for its data).
        let mut d = BodyDecoder::new(Framing::Chunked);
        let mut buf = BytesMut::from(&b"ffffffffffffffff\r\n"[..]);
        assert_eq!(d.decode(&mut buf).unwrap(), Decoded::More);
    }

    #[test]
    fn chunks_read_together_come_out_as_one_frame_and_then_the_end() {
        let mut d = BodyDecoder::new(Framing::Chunked);
        let mut buf = BytesMut::from(
            &b"5\r\ndata:\r\n3;x=1\r\n a\n\r\n2\r\n\n\n\r\n0\r\nt: 1\r\n\r\nNEXT"[..],
        );
        let first_at = buf.as_ptr() as usize + 3;
        let Decoded::Data(data) = d.decode(&mut buf).unwrap() else {
            panic!("data first");
        };
        assert_eq!(&data[..], b"data: a\n\n\n");
        assert_eq!(
            data.as_ptr() as usize,
            first_at,
            "the first chunk is not moved"
        );
        assert_eq!(d.decode(&mut buf).unwrap(), Decoded::End);
        assert_eq!(&buf[..], b"NEXT", "what follows the body is left");
    }

    #[test]
    fn data_before_a_malformed_chunk_comes_out_before_the_error() {
        for (wire, error) in [
            (&b"3\r\nabc\r\nzz\r\n"[..], WireError::ChunkSize),
            (b"3\r\nabc\r\n1\r\nxYY", WireError::ChunkEnd),
        ] {
            let mut d = BodyDecoder::new(Framing::Chunked);
            let mut buf = BytesMut::from(wire);
            let Decoded::Data(data) = d.decode(&mut buf).unwrap() else {
                panic!("data first");
            };
            assert!(data.starts_with(b"abc"), "{data:?}");
            assert_eq!(d.decode(&mut buf), Err(error), "{wire:?}");
        }
    }

    #[test]
    fn a_request_head_carries_host_and_the_bodys_own_length_once() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
        h.append("x-multi", HeaderValue::from_static("a"));
        h.append("x-multi", HeaderValue::from_static("b"));
        let mut out = BytesMut::new();
        encode_request(
            &Method::POST,
            "/v1/chat/completions?x=1",
            "site:8000",
            &h,
            12,
            &mut out,
        );
        assert_eq!(
            &out[..],
            &b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: site:8000\r\n\
               content-type: application/json\r\nx-multi: a\r\nx-multi: b\r\n\
               content-length: 12\r\n\r\n"[..]
        );
        let mut out = BytesMut::new();
        encode_request(
            &Method::GET,
            "/v1/models",
            "s",
            &HeaderMap::new(),
            0,
            &mut out,
        );
        assert_eq!(&out[..], b"GET /v1/models HTTP/1.1\r\nhost: s\r\n\r\n");
    }

    #[test]
    fn a_map_is_coded_other_than_chunked_by_the_rule_an_answer_head_is_refused_by() {
        let map = |values: &[&'static str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(header::TRANSFER_ENCODING, HeaderValue::from_static(v));
            }
            h
        };
        assert!(!coded_other_than_chunked(&HeaderMap::new()));
        assert!(!coded_other_than_chunked(&map(&["chunked"])));
        for other in [
            &["gzip, chunked"][..],
            &["gzip", "chunked"],
            &["identity"],
            &["chunked,"],
        ] {
            assert!(coded_other_than_chunked(&map(other)), "{other:?}");
        }
    }

    #[test]
    fn a_request_head_never_carries_the_callers_transfer_encoding() {
        let mut h = HeaderMap::new();
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::HOST, HeaderValue::from_static("client"));
        let mut out = BytesMut::new();
        encode_request(&Method::POST, "/", "site", &h, 2, &mut out);
        assert_eq!(
            &out[..],
            b"POST / HTTP/1.1\r\nhost: site\r\ncontent-length: 2\r\n\r\n"
        );
    }

    proptest! {
        #[test]
        fn any_chunking_of_any_body_decodes_to_the_body_at_any_split(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 0..8),
            step in 1usize..50,
        ) {
            let mut wire = Vec::new();
            let mut want = Vec::new();
            for c in &chunks {
                wire.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                wire.extend_from_slice(c);
                wire.extend_from_slice(b"\r\n");
                want.extend_from_slice(c);
            }
            wire.extend_from_slice(b"0\r\n\r\n");
            let (body, _) = decode_all(Framing::Chunked, &wire, step).unwrap();
            prop_assert_eq!(body, want);
        }

        #[test]
        fn arbitrary_bytes_never_panic_the_head_parser_or_the_decoders(
            bytes in proptest::collection::vec(any::<u8>(), 0..300),
            step in 1usize..64,
        ) {
            let _ = parse(&bytes[..], &Method::POST);
            for framing in [Framing::Chunked, Framing::Length(100), Framing::UntilClose] {
                let _ = decode_all(framing, &bytes, step);
            }
        }
    }
}
