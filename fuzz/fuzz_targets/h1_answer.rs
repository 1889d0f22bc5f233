//! A site's HTTP/1.1 answer as the gateway reads it (`grid_h1_wire`), from arbitrary
//! bytes fed in arbitrary pieces.
//!
//! Input: the first byte picks the piece size (1 to 64) and the request method (`HEAD`
//! or `POST`); the rest is what the site sent.
//!
//! Asserts: no panic and no endless loop; a head is never longer than the input nor than
//! `MAX_ANSWER_HEAD_BYTES`; an unfinished head that fills the limit is refused, not
//! waited on; the body bytes decoded never exceed the input after the head, a body of
//! known length yields exactly that many bytes or fails as truncated, and feeding the
//! same bytes in one piece decodes the same body as feeding them piece by piece.
#![no_main]

use bytes::BytesMut;
use grid_h1_wire::{
    BodyDecoder, Decoded, Framing, MAX_ANSWER_HEAD_BYTES, MAX_INTERIM_ANSWERS, Parsed, WireError,
    parse_head,
};
use http::Method;
use libfuzzer_sys::fuzz_target;

/// The body decoded from `wire` fed `step` bytes at a time, and whether it ended cleanly.
fn decode(framing: Framing, wire: &[u8], step: usize) -> (Vec<u8>, Result<(), WireError>) {
    let mut d = BodyDecoder::new(framing);
    let mut buf = BytesMut::new();
    let mut body = Vec::new();
    let mut fed = 0;
    // Every turn takes a byte from the input or ends: bounded by the input's length.
    for _ in 0..=4 * (wire.len() + 4) {
        match d.decode(&mut buf) {
            Ok(Decoded::Data(b)) => {
                assert!(!b.is_empty(), "an empty data frame");
                body.extend_from_slice(&b);
            }
            Ok(Decoded::End) => return (body, Ok(())),
            Ok(Decoded::More) if fed < wire.len() => {
                let n = step.min(wire.len() - fed);
                buf.extend_from_slice(&wire[fed..fed + n]);
                fed += n;
            }
            Ok(Decoded::More) => return (body, d.eof()),
            Err(e) => return (body, Err(e)),
        }
    }
    panic!("the decoder did not finish {} bytes", wire.len());
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, mut wire)) = data.split_first() else {
        return;
    };
    let step = usize::from(first & 63) + 1;
    let method = if first & 64 == 0 {
        Method::POST
    } else {
        Method::HEAD
    };
    let mut interim = 0;
    let head = loop {
        let mut buf = BytesMut::from(wire);
        match parse_head(&mut buf, &method) {
            Ok(Parsed::Head(len, head)) => {
                assert!(len <= wire.len() && len <= MAX_ANSWER_HEAD_BYTES);
                assert_eq!(
                    buf.len(),
                    wire.len() - len,
                    "the head taken is the head's length"
                );
                wire = &wire[len..];
                break head;
            }
            Ok(Parsed::Interim(len)) => {
                assert!(len > 0 && len <= wire.len());
                assert_eq!(buf.len(), wire.len() - len, "the interim answer was taken");
                wire = &wire[len..];
                interim += 1;
                if interim > MAX_INTERIM_ANSWERS {
                    return;
                }
            }
            Ok(Parsed::Partial) => {
                assert_eq!(&buf[..], wire, "a partial head was consumed");
                assert!(
                    wire.len() < MAX_ANSWER_HEAD_BYTES,
                    "a full-size partial head waited on"
                );
                return;
            }
            Err(_) => return,
        }
    };
    if method == Method::HEAD {
        assert_eq!(head.framing, Framing::Empty);
    }
    let (body, ended) = decode(head.framing, wire, step);
    assert!(body.len() <= wire.len());
    if let Framing::Length(n) = head.framing {
        match &ended {
            Ok(()) => assert_eq!(body.len() as u64, n),
            Err(e) => assert_eq!(*e, WireError::Truncated),
        }
    }
    let (whole, whole_ended) = decode(head.framing, wire, wire.len().max(1));
    assert_eq!(whole, body, "piece size changed the body");
    assert_eq!(whole_ended, ended, "piece size changed the ending");
});
