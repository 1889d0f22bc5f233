//! A client's HTTP/1.1 requests as the gateway's own server reads them
//! (`grid_h1_wire::parse_request` and the body decoder), from arbitrary bytes fed in
//! arbitrary pieces, then the answer framing it writes back.
//!
//! Input: the first byte picks the piece size (1 to 64); the rest is what the client
//! sent, read as pipelined requests until one cannot be read.
//!
//! Asserts: no panic and no endless loop; a partial head leaves the buffer untouched and
//! is never waited on once it fills `MAX_REQUEST_HEAD_BYTES`; a head taken is never
//! longer than that; a request is never framed until close, and one the parser accepts
//! never carries both `Transfer-Encoding` and `Content-Length` (the smuggling shape) nor
//! a `Transfer-Encoding` in HTTP/1.0; fed in one piece, the same bytes give the same
//! requests; each body decoded is re-encoded as chunks and decodes to the same bytes.
#![no_main]

use bytes::BytesMut;
use grid_h1_wire::{
    BodyDecoder, Decoded, Framing, LAST_CHUNK, MAX_REQUEST_HEAD_BYTES, encode_chunk, parse_request,
};
use http::{Version, header};
use libfuzzer_sys::fuzz_target;

/// One request as read: its head's shape and its body.
#[derive(Debug, PartialEq)]
struct Read {
    method: String,
    target: String,
    framing: Framing,
    keep_alive: bool,
    body: Vec<u8>,
}

/// Whether the request head `taken` has a `Transfer-Encoding` field and a
/// `Content-Length` one, read by httparse alone.
fn fields_of(taken: &[u8]) -> (bool, bool) {
    let mut fields = [httparse::EMPTY_HEADER; grid_h1_wire::MAX_REQUEST_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    assert!(
        matches!(req.parse(taken), Ok(httparse::Status::Complete(_))),
        "a head the parser took is not a whole head"
    );
    let has = |name: &str| {
        req.headers
            .iter()
            .any(|f| f.name.eq_ignore_ascii_case(name))
    };
    (has("transfer-encoding"), has("content-length"))
}

/// Every request in `wire` fed `step` bytes at a time, until one cannot be read.
fn requests(wire: &[u8], step: usize) -> Vec<Read> {
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let mut out = Vec::new();
    // Every turn takes input bytes, a head or body bytes, or ends: bounded by the input.
    let mut turns = 0;
    'requests: loop {
        let (head, taken) = loop {
            turns += 1;
            assert!(turns <= 8 * (wire.len() + 8), "the reader did not finish");
            let before = buf.clone();
            match parse_request(&mut buf) {
                Ok(Some(head)) => {
                    assert!(before.len() - buf.len() <= MAX_REQUEST_HEAD_BYTES);
                    break (head, before[..before.len() - buf.len()].to_vec());
                }
                Ok(None) => {
                    assert_eq!(buf, before, "a partial head was consumed");
                    assert!(
                        buf.len() < MAX_REQUEST_HEAD_BYTES,
                        "a full-size partial head waited on"
                    );
                    if fed == wire.len() {
                        break 'requests;
                    }
                    let n = step.min(wire.len() - fed);
                    buf.extend_from_slice(&wire[fed..fed + n]);
                    fed += n;
                }
                Err(_) => break 'requests,
            }
        };
        assert_ne!(head.framing, Framing::UntilClose);
        // The map does not keep `Transfer-Encoding` (its coding is decoded): which fields
        // the head had is read from its bytes.
        assert!(!head.headers.contains_key(header::TRANSFER_ENCODING));
        let (te, cl) = fields_of(&taken);
        assert!(
            !(te && cl),
            "transfer-encoding and content-length accepted together"
        );
        assert!(!(te && head.version == Version::HTTP_10));
        assert!(!te || head.framing == Framing::Chunked);
        let mut decoder = BodyDecoder::new(head.framing);
        let mut body = Vec::new();
        let ended = loop {
            turns += 1;
            assert!(
                turns <= 8 * (wire.len() + 8),
                "the body decoder did not finish"
            );
            match decoder.decode(&mut buf) {
                Ok(Decoded::Data(b)) => {
                    assert!(!b.is_empty());
                    body.extend_from_slice(&b);
                }
                Ok(Decoded::End) => break true,
                Ok(Decoded::More) if fed < wire.len() => {
                    let n = step.min(wire.len() - fed);
                    buf.extend_from_slice(&wire[fed..fed + n]);
                    fed += n;
                }
                Ok(Decoded::More) | Err(_) => break false,
            }
        };
        if let Framing::Length(n) = head.framing
            && ended
        {
            assert_eq!(body.len() as u64, n);
        }
        out.push(Read {
            method: head.method.to_string(),
            target: head.uri.to_string(),
            framing: head.framing,
            keep_alive: head.keep_alive,
            body,
        });
        if !ended {
            break;
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, wire)) = data.split_first() else {
        return;
    };
    let step = usize::from(first & 63) + 1;
    let pieces = requests(wire, step);
    let whole = requests(wire, wire.len().max(1));
    assert_eq!(pieces, whole, "piece size changed what was read");
    for r in &pieces {
        let mut chunked = BytesMut::new();
        encode_chunk(&r.body, &mut chunked);
        chunked.extend_from_slice(LAST_CHUNK);
        let mut d = BodyDecoder::new(Framing::Chunked);
        let mut again = Vec::new();
        loop {
            match d.decode(&mut chunked) {
                Ok(Decoded::Data(b)) => again.extend_from_slice(&b),
                Ok(Decoded::End) => break,
                other => panic!("the answer's own chunks did not decode: {other:?}"),
            }
        }
        assert_eq!(again, r.body);
    }
});
