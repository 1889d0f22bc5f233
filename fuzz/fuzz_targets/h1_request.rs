//! A client's HTTP/1.1 requests as the gateway's own server reads them
//! (`grid_h1_wire::parse_request` and the body decoder), from arbitrary bytes fed in
//! arbitrary pieces, then the answer framing it writes back, and the same bytes read by
//! hyper's server connection as the reference (differential).
//!
//! Input: the first byte picks the piece size (1 to 64); the rest is what the client
//! sent, read as pipelined requests until one cannot be read or one closes the
//! connection (the gateway reads no request after it).
//!
//! Asserts: no panic and no endless loop; a partial head leaves the buffer untouched and
//! is never waited on once it fills `MAX_REQUEST_HEAD_BYTES`; a head taken is never
//! longer than that; a request is never framed until close, and one the parser accepts
//! never carries both `Transfer-Encoding` and `Content-Length` (the smuggling shape) nor
//! a `Transfer-Encoding` in HTTP/1.0; fed in one piece, the same bytes give the same
//! requests; each body decoded is re-encoded as chunks and decodes to the same bytes.
//!
//! Differential: every request grid reads whole (head and body) hyper's server reads
//! whole too, with the same method, target, version and body, and in the same order: so
//! the two agree on where each body ends and the next request starts. A request grid
//! refuses and hyper reads is allowed (grid is stricter); its class is printed once.
#![no_main]

#[path = "reference/mod.rs"]
mod reference;

use bytes::BytesMut;
use grid_h1_wire::{
    BodyDecoder, Decoded, Framing, LAST_CHUNK, MAX_REQUEST_HEAD_BYTES, WireError, encode_chunk,
    parse_request,
};
use http::{Version, header};
use libfuzzer_sys::fuzz_target;

use reference::{Request1, hyper_requests, stricter};

/// One request as read: its head's shape and its body.
#[derive(Debug, PartialEq)]
struct Read {
    request: Request1,
    framing: Framing,
    keep_alive: bool,
    /// hyper's server hands the connection over after it (a `CONNECT`, or an HTTP/1.1
    /// `Upgrade` field) and reads no further request: the comparison ends there.
    upgrade: bool,
}

/// Why grid read no further request.
#[derive(Debug, PartialEq)]
enum Stop {
    /// The bytes ended inside a head or a body (or between requests).
    Partial,
    /// A request did not keep the connection.
    Closed,
    /// A head or a body was refused.
    Refused(WireError),
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

/// Every request in `wire` fed `step` bytes at a time, until one cannot be read or one
/// closes the connection.
fn requests(wire: &[u8], step: usize) -> (Vec<Read>, Stop) {
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let mut out = Vec::new();
    // Every turn takes input bytes, a head or body bytes, or ends: bounded by the input.
    let mut turns = 0;
    loop {
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
                        return (out, Stop::Partial);
                    }
                    let n = step.min(wire.len() - fed);
                    buf.extend_from_slice(&wire[fed..fed + n]);
                    fed += n;
                }
                Err(e) => return (out, Stop::Refused(e)),
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
        loop {
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
                Ok(Decoded::End) => break,
                Ok(Decoded::More) if fed < wire.len() => {
                    let n = step.min(wire.len() - fed);
                    buf.extend_from_slice(&wire[fed..fed + n]);
                    fed += n;
                }
                Ok(Decoded::More) => return (out, Stop::Partial),
                Err(e) => return (out, Stop::Refused(e)),
            }
        }
        if let Framing::Length(n) = head.framing {
            assert_eq!(body.len() as u64, n);
        }
        let keep_alive = head.keep_alive;
        let upgrade = head.method == http::Method::CONNECT
            || (head.version == Version::HTTP_11 && head.headers.contains_key(header::UPGRADE));
        out.push(Read {
            request: Request1 {
                method: head.method.to_string(),
                target: head.uri.to_string(),
                version: head.version,
                body,
            },
            framing: head.framing,
            keep_alive,
            upgrade,
        });
        if !keep_alive {
            return (out, Stop::Closed);
        }
    }
}

/// The class of a refusal, for the list of what grid refuses and hyper reads: the
/// error's variant and its fixed words (an httparse error's text is one of a few).
fn class(stop: &Stop) -> String {
    match stop {
        Stop::Refused(e) => format!("{e:?}"),
        other => format!("{other:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, wire)) = data.split_first() else {
        return;
    };
    let step = usize::from(first & 63) + 1;
    let (pieces, stop) = requests(wire, step);
    let (whole, whole_stop) = requests(wire, wire.len().max(1));
    assert_eq!(pieces, whole, "piece size changed what was read");
    assert_eq!(
        std::mem::discriminant(&stop),
        std::mem::discriminant(&whole_stop),
        "piece size changed why reading stopped: {stop:?}, {whole_stop:?}"
    );
    for r in &pieces {
        let mut chunked = BytesMut::new();
        encode_chunk(&r.request.body, &mut chunked);
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
        assert_eq!(again, r.request.body);
    }
    let reference = hyper_requests(wire);
    for (i, grid) in whole.iter().enumerate() {
        let Some(hyper) = reference.get(i) else {
            panic!(
                "grid read request {i} whole and hyper did not: {grid:?}; hyper read {reference:?}"
            );
        };
        assert_eq!(
            &grid.request, hyper,
            "grid and hyper read request {i} differently"
        );
        if grid.upgrade {
            return;
        }
    }
    if reference.len() > whole.len() {
        stricter("h1_request", class(&whole_stop));
    }
});
