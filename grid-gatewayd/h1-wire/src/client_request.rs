//! A client's request head, as the gateway's own HTTP/1.1 server reads it.
//!
//! The head is parsed in place from the connection's read buffer (httparse, the parser
//! hyper's server uses), and its body framing is decided here once, by RFC 9112 section
//! 6.3 as it binds a server: `Transfer-Encoding` must end in `chunked` and may not come
//! with a `Content-Length` or in HTTP/1.0 (each a way to smuggle a second request past a
//! proxy, so each is refused with 400 and the connection closed); a body chunked after
//! other codings is refused as not implemented (501: the gateway decodes `chunked`
//! alone); differing `Content-Length`s are refused; a request with neither has no body.
//! An HTTP/1.1 request without `Host`, or any request with two, is refused (RFC 9112
//! section 3.2: a server must answer 400). The body itself is read with the same
//! [`BodyDecoder`](crate::BodyDecoder) a site's answer is.

use std::mem::MaybeUninit;

use bytes::BytesMut;
use http::{HeaderMap, Method, Uri, Version, header};

use crate::{Framing, WireError, list_tokens, shared_head};

/// The longest request head read from a client (hyper's server buffered about 400 KiB
/// before refusing; an OpenAI-style request head is a few hundred bytes).
pub const MAX_REQUEST_HEAD_BYTES: usize = 64 * 1024;
/// The most header fields in a request head (hyper's default, 100).
pub const MAX_REQUEST_HEADERS: usize = 100;

/// A client's request head and what it says about the connection.
#[derive(Debug)]
pub struct RequestHead {
    /// The method.
    pub method: Method,
    /// The request target, as sent.
    pub uri: Uri,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// The header fields as sent (hop-by-hop ones included: the proxy strips them),
    /// except `Transfer-Encoding`: its coding is decoded here, and read into `framing`.
    pub headers: HeaderMap,
    /// How the body ends ([`Framing::UntilClose`] never: a request cannot be framed so).
    pub framing: Framing,
    /// The client keeps the connection open after the answer (HTTP/1.1 without
    /// `Connection: close`, or HTTP/1.0 with `Connection: keep-alive`).
    pub keep_alive: bool,
    /// The client waits for `100 Continue` before sending its body.
    pub expects_continue: bool,
}

/// Takes the request head off the front of `buf` when it is whole (empty lines before it
/// are skipped, as RFC 9112 section 2.2 allows); `None` while it is not, `buf` untouched.
///
/// The head's bytes become one shared buffer its target and field values point into,
/// so a head costs no allocation per field.
///
/// ```
/// use bytes::BytesMut;
/// use grid_h1_wire::{Framing, parse_request};
///
/// let mut buf = BytesMut::from(
///     &b"POST /v1/completions HTTP/1.1\r\nhost: g\r\ncontent-length: 2\r\n\r\n{}"[..],
/// );
/// let head = parse_request(&mut buf).unwrap().expect("a whole head");
/// assert_eq!(head.framing, Framing::Length(2));
/// assert_eq!(&buf[..], b"{}", "the body stays in the buffer");
/// ```
///
/// # Errors
///
/// A head that is malformed or has no `Host` (HTTP/1.1) or two
/// ([`WireError::RequestHead`]), larger than [`MAX_REQUEST_HEAD_BYTES`] or with more
/// than [`MAX_REQUEST_HEADERS`] fields ([`WireError::RequestHeadTooLarge`]), whose body
/// framing is ambiguous ([`WireError::RequestFraming`]), or whose body is chunked after
/// other codings ([`WireError::RequestCoding`]).
pub fn parse_request(buf: &mut BytesMut) -> Result<Option<RequestHead>, WireError> {
    let mut spans = shared_head::Fields::<MAX_REQUEST_HEADERS>::new();
    let (len, method, target, version) = {
        let mut fields =
            [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_REQUEST_HEADERS];
        let mut req = httparse::Request::new(&mut []);
        let len = match req.parse_with_uninit_headers(buf, &mut fields) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() >= MAX_REQUEST_HEAD_BYTES => {
                return Err(WireError::RequestHeadTooLarge);
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(WireError::RequestHeadTooLarge),
            Err(e) => return Err(WireError::RequestHead(e.to_string())),
        };
        if len > MAX_REQUEST_HEAD_BYTES {
            return Err(WireError::RequestHeadTooLarge);
        }
        let (Some(method), Some(path)) = (req.method, req.path) else {
            return Err(WireError::RequestHead("no request line".into()));
        };
        let method = Method::from_bytes(method.as_bytes())
            .map_err(|e| WireError::RequestHead(e.to_string()))?;
        let version = if req.version == Some(1) {
            Version::HTTP_11
        } else {
            Version::HTTP_10
        };
        let target = shared_head::span(buf, path.as_bytes());
        shared_head::note(buf, req.headers, &mut spans);
        (len, method, target, version)
    };
    let head = buf.split_to(len).freeze();
    let uri = Uri::from_maybe_shared(head.slice(target.0..target.1))
        .map_err(|e| WireError::RequestHead(e.to_string()))?;
    let (headers, noted) = shared_head::header_map(&head, &spans, WireError::RequestHead)?;
    // RFC 9112 section 3.2: a server answers 400 to an HTTP/1.1 request without `Host`
    // and to any with more than one (two hosts are two readings of where it goes).
    if noted.hosts > 1 {
        return Err(WireError::RequestHead("more than one host field".into()));
    }
    if noted.hosts == 0 && version == Version::HTTP_11 {
        return Err(WireError::RequestHead(
            "no host field in an HTTP/1.1 request".into(),
        ));
    }
    let framing = request_framing(version, noted)?;
    let says = |token: &str| {
        noted.connection
            && list_tokens(&headers, header::CONNECTION).any(|t| t.eq_ignore_ascii_case(token))
    };
    let keep_alive = if version == Version::HTTP_11 {
        !says("close")
    } else {
        says("keep-alive") && !says("close")
    };
    let expects_continue = version == Version::HTTP_11
        && noted.expect
        && headers
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    Ok(Some(RequestHead {
        method,
        uri,
        version,
        headers,
        framing,
        keep_alive,
        expects_continue,
    }))
}

/// The request body's framing (RFC 9112 section 6.3, items 3 to 6, as a server).
fn request_framing(version: Version, noted: shared_head::Noted) -> Result<Framing, WireError> {
    if noted.coding != shared_head::Coding::Absent {
        if version == Version::HTTP_10 {
            return Err(WireError::RequestFraming(
                "transfer-encoding in an HTTP/1.0 request",
            ));
        }
        if noted.length != shared_head::Length::Absent {
            return Err(WireError::RequestFraming(
                "both transfer-encoding and content-length",
            ));
        }
        // Any coding but `chunked` alone is one the gateway does not implement: 501 (RFC
        // 9112 section 6.1), the connection closed after it. Where `chunked` is not last
        // the body's end cannot be known either (section 6.3 answers that 400); either
        // way nothing of the body is read, and decoding the chunks of `gzip, chunked`
        // would forward a body whose other codings are lost.
        if !noted.coding.is_chunked_only() {
            return Err(WireError::RequestCoding);
        }
        return Ok(Framing::Chunked);
    }
    match noted.length {
        shared_head::Length::Absent | shared_head::Length::Is(0) => Ok(Framing::Empty),
        shared_head::Length::Is(n) => Ok(Framing::Length(n)),
        shared_head::Length::Unusable => {
            Err(WireError::RequestFraming("an unusable content-length"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::fmt::Write as _;

    /// `bytes` through the parser: its verdict, and how many bytes it took.
    fn parse(bytes: &[u8]) -> (Result<Option<RequestHead>, WireError>, usize) {
        let mut buf = BytesMut::from(bytes);
        let parsed = parse_request(&mut buf);
        (parsed, bytes.len() - buf.len())
    }

    fn head(text: &str) -> RequestHead {
        match parse(text.as_bytes()) {
            (Ok(Some(h)), len) => {
                assert_eq!(len, text.len());
                h
            }
            (other, _) => panic!("{other:?}: {text:?}"),
        }
    }

    #[test]
    fn the_head_is_taken_off_the_buffer_and_what_follows_left_in_it() {
        let mut buf = BytesMut::from(&b"GET /a HTTP/1.1\r\nhost: g\r\nx-v: 1\r\n\r\nGET /b"[..]);
        let h = parse_request(&mut buf).unwrap().unwrap();
        assert_eq!(
            (h.uri.path(), h.headers["x-v"].as_bytes()),
            ("/a", &b"1"[..])
        );
        assert_eq!(&buf[..], b"GET /b");
        assert!(parse_request(&mut buf).unwrap().is_none());
        assert_eq!(&buf[..], b"GET /b", "a partial head is left whole");
    }

    #[test]
    fn a_post_with_a_length_is_framed_by_it_and_keeps_the_connection() {
        let h =
            head("POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: g\r\ncontent-length: 12\r\n\r\n");
        assert_eq!(h.method, Method::POST);
        assert_eq!(h.uri.path(), "/v1/chat/completions");
        assert_eq!(h.uri.query(), Some("x=1"));
        assert_eq!(h.version, Version::HTTP_11);
        assert_eq!(h.framing, Framing::Length(12));
        assert!(h.keep_alive && !h.expects_continue);
        assert_eq!(h.headers[header::HOST], "g");
    }

    #[test]
    fn a_request_with_neither_length_nor_coding_has_no_body() {
        assert_eq!(
            head("GET /v1/models HTTP/1.1\r\nhost: g\r\n\r\n").framing,
            Framing::Empty
        );
        assert_eq!(
            head("POST / HTTP/1.1\r\nhost: g\r\ncontent-length: 0\r\n\r\n").framing,
            Framing::Empty
        );
    }

    #[test]
    fn a_chunked_request_is_framed_as_chunked() {
        let h = head("POST / HTTP/1.1\r\nhost: g\r\ntransfer-encoding: Chunked\r\n\r\n");
        assert_eq!(h.framing, Framing::Chunked);
    }

    #[test]
    fn any_transfer_coding_but_chunked_alone_is_refused_as_not_implemented() {
        for codings in [
            "transfer-encoding: chunked, gzip\r\n",
            "transfer-encoding: identity\r\n",
            "transfer-encoding: gzip\r\n",
            "transfer-encoding: chunked,\r\n",
            "transfer-encoding: chunked\r\ntransfer-encoding: \r\n",
            "transfer-encoding: gzip, chunked\r\n",
            "transfer-encoding: identity, chunked\r\n",
            "transfer-encoding: x-unknown\r\ntransfer-encoding: chunked\r\n",
            "transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n",
        ] {
            let text = format!("POST / HTTP/1.1\r\nhost: g\r\n{codings}\r\n");
            assert_eq!(
                parse(text.as_bytes()).0.unwrap_err(),
                WireError::RequestCoding,
                "{text:?}"
            );
        }
    }

    #[test]
    fn an_http_1_1_request_without_host_or_any_with_two_is_refused_and_http_1_0_needs_none() {
        for bad in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"GET http://g/ HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nhost: a\r\nHost: a\r\n\r\n",
            b"GET / HTTP/1.0\r\nhost: a\r\nhost: b\r\n\r\n",
        ] {
            assert!(
                matches!(parse(bad).0, Err(WireError::RequestHead(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            head("GET /healthz HTTP/1.0\r\n\r\n").version,
            Version::HTTP_10
        );
    }

    #[test]
    fn ambiguous_framing_is_refused_as_a_smuggling_vector() {
        for text in [
            "POST / HTTP/1.1\r\nhost: g\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n",
            "POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: g\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: g\r\ncontent-length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: g\r\ncontent-length: 1 2\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: g\r\ncontent-length: 3, 3\r\n\r\n",
        ] {
            assert!(
                matches!(parse(text.as_bytes()).0, Err(WireError::RequestFraming(_))),
                "{text:?}"
            );
        }
        let h =
            head("POST / HTTP/1.1\r\nhost: g\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\n");
        assert_eq!(
            h.framing,
            Framing::Length(3),
            "equal repeats in separate fields are one length"
        );
    }

    #[test]
    fn keep_alive_follows_the_version_and_the_connection_field() {
        assert!(
            !head("GET / HTTP/1.1\r\nhost: g\r\nconnection: keep-alive, close\r\n\r\n").keep_alive
        );
        assert!(!head("GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(head("GET / HTTP/1.0\r\nconnection: Keep-Alive\r\n\r\n").keep_alive);
    }

    #[test]
    fn expect_100_continue_is_seen_on_http_1_1_only() {
        let text =
            "POST / HTTP/1.1\r\nhost: g\r\nexpect: 100-Continue\r\ncontent-length: 1\r\n\r\n";
        assert!(head(text).expects_continue);
        let text = "POST / HTTP/1.0\r\nexpect: 100-continue\r\ncontent-length: 1\r\n\r\n";
        assert!(!head(text).expects_continue);
    }

    #[test]
    fn empty_lines_before_the_request_line_are_skipped() {
        let text = "\r\n\r\nGET /healthz HTTP/1.1\r\nhost: g\r\n\r\n";
        assert_eq!(head(text).uri.path(), "/healthz");
    }

    #[test]
    fn malformed_heads_are_refused_and_partial_ones_waited_on() {
        for bad in [
            &b"GET / HTTP/2.0\r\n\r\n"[..],
            b"GET\r\n\r\n",
            b"G@T / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nbad header\r\n\r\n",
            b"GET / HTTP/1.1\r\nx: a\x00b\r\n\r\n",
        ] {
            assert!(
                matches!(parse(bad).0, Err(WireError::RequestHead(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(matches!(
            parse(b"POST /v1/chat/completions HTTP/1.1\r\nhost: g"),
            (Ok(None), 0)
        ));
    }

    #[test]
    fn a_head_at_the_size_limit_is_read_and_one_past_it_refused() {
        let filler = |total: usize| {
            let start = "GET / HTTP/1.1\r\nhost: g\r\nx-fill: ";
            let end = "\r\n\r\n";
            format!(
                "{start}{}{end}",
                "a".repeat(total - start.len() - end.len())
            )
        };
        let at = filler(MAX_REQUEST_HEAD_BYTES);
        assert!(matches!(
            parse(at.as_bytes()),
            (Ok(Some(_)), n) if n == MAX_REQUEST_HEAD_BYTES
        ));
        let past = filler(MAX_REQUEST_HEAD_BYTES + 1);
        assert_eq!(
            parse(past.as_bytes()).0.unwrap_err(),
            WireError::RequestHeadTooLarge
        );
        // An unfinished head that already fills the limit is refused, not waited on.
        let unfinished = &past.as_bytes()[..MAX_REQUEST_HEAD_BYTES];
        assert_eq!(
            parse(unfinished).0.unwrap_err(),
            WireError::RequestHeadTooLarge
        );
        assert!(matches!(
            parse(&past.as_bytes()[..MAX_REQUEST_HEAD_BYTES - 1]),
            (Ok(None), 0)
        ));
    }

    #[test]
    fn a_head_with_the_most_fields_is_read_and_one_more_refused() {
        let with = |n: usize| {
            // `Host` is one of the `n` fields.
            let mut t = String::from("GET / HTTP/1.1\r\nhost: g\r\n");
            for i in 1..n {
                let _ = write!(t, "x-{i}: v\r\n");
            }
            t + "\r\n"
        };
        assert!(matches!(
            parse(with(MAX_REQUEST_HEADERS).as_bytes()),
            (Ok(Some(_)), _)
        ));
        assert_eq!(
            parse(with(MAX_REQUEST_HEADERS + 1).as_bytes())
                .0
                .unwrap_err(),
            WireError::RequestHeadTooLarge
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_the_request_parser(
            bytes in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let _ = parse(&bytes);
        }

        #[test]
        fn a_whole_head_split_anywhere_is_partial_before_its_end_and_whole_at_it(
            len in 0u64..10_000,
            cut in 0usize..60,
        ) {
            let text = format!("POST /v1/completions HTTP/1.1\r\nhost: g\r\ncontent-length: {len}\r\n\r\n");
            let cut = cut.min(text.len() - 1);
            prop_assert!(matches!(parse(&text.as_bytes()[..cut]), (Ok(None), 0)));
            let framing = match parse(text.as_bytes()) {
                (Ok(Some(h)), n) if n == text.len() => h.framing,
                other => return Err(TestCaseError::fail(format!("{other:?}"))),
            };
            prop_assert_eq!(framing, if len == 0 { Framing::Empty } else { Framing::Length(len) });
        }
    }
}
