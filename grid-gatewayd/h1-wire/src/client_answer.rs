//! The gateway's answer to a client, as its own HTTP/1.1 server writes it: the head in
//! one buffer, the body framed by a length when its size is known and chunked when it is
//! not (each chunk's size line written beside its data, so a streamed event leaves in one
//! write).

use bytes::{BufMut as _, BytesMut};
use http::{HeaderMap, StatusCode, header};

use crate::put_decimal;

/// The chunked coding's last chunk, with no trailers.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// How an answer's body is framed toward the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnswerFraming {
    /// No body may follow (1xx, 204, 304): no length field is written.
    None,
    /// Exactly this many bytes (also what a `HEAD` answer announces without sending).
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Until the gateway closes the connection (an HTTP/1.0 client, size unknown).
    UntilClose,
}

/// What the answer's `Connection` field says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectionField {
    /// Nothing: HTTP/1.1's default, the connection stays.
    Default,
    /// `close`: the gateway closes the connection after this answer.
    Close,
    /// `keep-alive`: an HTTP/1.0 client asked to keep the connection, and it stays.
    KeepAlive,
}

/// Writes an answer head into `out`: the status line, `headers` as given except the
/// framing and connection fields (which are the gateway's own to write), `date` when the
/// answer carries none, then `framing`'s field and `connection`'s.
pub fn encode_answer_head(
    status: StatusCode,
    headers: &HeaderMap,
    framing: AnswerFraming,
    connection: ConnectionField,
    date: &[u8],
    out: &mut BytesMut,
) {
    let mut len = 96 + date.len();
    for (n, v) in headers {
        len += n.as_str().len() + v.len() + 4;
    }
    out.reserve(len);
    out.put_slice(b"HTTP/1.1 ");
    out.put_slice(status.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.put_slice(b"\r\n");
    for (n, v) in headers {
        if n == header::CONTENT_LENGTH || n == header::TRANSFER_ENCODING || n == header::CONNECTION
        {
            continue;
        }
        out.put_slice(n.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(v.as_bytes());
        out.put_slice(b"\r\n");
    }
    if !headers.contains_key(header::DATE) {
        out.put_slice(b"date: ");
        out.put_slice(date);
        out.put_slice(b"\r\n");
    }
    match framing {
        AnswerFraming::Length(n) => {
            out.put_slice(b"content-length: ");
            put_decimal(out, usize::try_from(n).unwrap_or(usize::MAX));
            out.put_slice(b"\r\n");
        }
        AnswerFraming::Chunked => out.put_slice(b"transfer-encoding: chunked\r\n"),
        AnswerFraming::None | AnswerFraming::UntilClose => {}
    }
    match connection {
        ConnectionField::Default => {}
        ConnectionField::Close => out.put_slice(b"connection: close\r\n"),
        ConnectionField::KeepAlive => out.put_slice(b"connection: keep-alive\r\n"),
    }
    out.put_slice(b"\r\n");
}

/// Writes one chunk of `data` into `out` (nothing for empty data: an empty chunk would
/// end the body).
pub fn encode_chunk(data: &[u8], out: &mut BytesMut) {
    if data.is_empty() {
        return;
    }
    out.reserve(data.len() + 20);
    let mut digits = [0u8; 16];
    let mut at = digits.len();
    let mut n = data.len();
    loop {
        at -= 1;
        digits[at] = b"0123456789abcdef"[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.put_slice(&digits[at..]);
    out.put_slice(b"\r\n");
    out.put_slice(data);
    out.put_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BodyDecoder, Decoded, Framing};
    use http::HeaderValue;
    use proptest::prelude::*;

    #[test]
    fn an_answer_head_writes_the_gateways_own_framing_and_connection_fields() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        h.insert("x-grid-site", HeaderValue::from_static("a"));
        let mut out = BytesMut::new();
        encode_answer_head(
            StatusCode::OK,
            &h,
            AnswerFraming::Chunked,
            ConnectionField::Close,
            b"Fri, 04 Dec 2026 05:00:00 GMT",
            &mut out,
        );
        assert_eq!(
            &out[..],
            &b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-grid-site: a\r\n\
               date: Fri, 04 Dec 2026 05:00:00 GMT\r\ntransfer-encoding: chunked\r\n\
               connection: close\r\n\r\n"[..]
        );
    }

    #[test]
    fn an_answer_with_its_own_date_and_a_length_keeps_the_date() {
        let mut h = HeaderMap::new();
        h.insert(header::DATE, HeaderValue::from_static("then"));
        let mut out = BytesMut::new();
        encode_answer_head(
            StatusCode::TOO_MANY_REQUESTS,
            &h,
            AnswerFraming::Length(12),
            ConnectionField::KeepAlive,
            b"now",
            &mut out,
        );
        assert_eq!(
            &out[..],
            &b"HTTP/1.1 429 Too Many Requests\r\ndate: then\r\ncontent-length: 12\r\n\
               connection: keep-alive\r\n\r\n"[..]
        );
    }

    proptest! {
        #[test]
        fn chunks_written_here_decode_to_the_same_bytes(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
        ) {
            let mut wire = BytesMut::new();
            let mut want = Vec::new();
            for c in &chunks {
                encode_chunk(c, &mut wire);
                want.extend_from_slice(c);
            }
            wire.extend_from_slice(LAST_CHUNK);
            let mut d = BodyDecoder::new(Framing::Chunked);
            let mut got = Vec::new();
            loop {
                match d.decode(&mut wire).unwrap() {
                    Decoded::Data(b) => got.extend_from_slice(&b),
                    Decoded::End => break,
                    Decoded::More => return Err(TestCaseError::fail("ran out")),
                }
            }
            prop_assert_eq!(got, want);
            prop_assert!(wire.is_empty());
        }
    }
}
