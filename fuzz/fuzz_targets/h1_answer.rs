//! A site's HTTP/1.1 answer as the gateway reads it (`grid_h1_wire`), from arbitrary
//! bytes fed in arbitrary pieces, and the same bytes read by hyper's client connection as
//! the reference (differential).
//!
//! Input: the first byte picks the piece size (1 to 64) and the request method (`HEAD`
//! or `POST`); the rest is what the site sent.
//!
//! Asserts: no panic and no endless loop; a head is never longer than the input nor than
//! `MAX_ANSWER_HEAD_BYTES`; an unfinished head that fills the limit is refused, not
//! waited on; the body bytes decoded never exceed the input after the head, a body of
//! known length yields exactly that many bytes or fails as truncated, and feeding the
//! same bytes in one piece decodes the same body as feeding them piece by piece.
//!
//! Differential: an answer grid reads whole (its head, then its body to its end, or to
//! the close for one framed so) hyper's client reads whole too from the same bytes cut
//! where grid's reading ended, with the same status, header fields (`Transfer-Encoding`
//! aside: grid decodes it and drops it) and body: so the two agree on where the answer
//! ends, which is where the next would start. (What follows an answer is never read by
//! the gateway's pool, which drops such a connection, and hyper's client fails the
//! exchange over it, so hyper is not shown it.)
//! An answer grid refuses and hyper reads is allowed (grid is stricter); its class is
//! printed once.
#![no_main]

#[path = "reference/mod.rs"]
mod reference;

use bytes::BytesMut;
use grid_h1_wire::{
    AnswerHead, BodyDecoder, Decoded, Framing, MAX_ANSWER_HEAD_BYTES, MAX_INTERIM_ANSWERS,
    Parsed, WireError, parse_head,
};
use http::Method;
use libfuzzer_sys::fuzz_target;

use reference::{hyper_answer, stricter};

/// The body decoded from `wire` fed `step` bytes at a time, whether it ended cleanly,
/// and how many bytes of `wire` it took (what follows is not the body's).
fn decode(framing: Framing, wire: &[u8], step: usize) -> (Vec<u8>, Result<(), WireError>, usize) {
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
            Ok(Decoded::End) => return (body, Ok(()), fed - buf.len()),
            Ok(Decoded::More) if fed < wire.len() => {
                let n = step.min(wire.len() - fed);
                buf.extend_from_slice(&wire[fed..fed + n]);
                fed += n;
            }
            Ok(Decoded::More) => return (body, d.eof(), fed),
            Err(e) => return (body, Err(e), fed),
        }
    }
    panic!("the decoder did not finish {} bytes", wire.len());
}

/// How grid's reading of an answer went.
enum Verdict {
    /// The head and the whole body, which ended this many bytes into the input.
    Read(AnswerHead, Vec<u8>, usize),
    /// The bytes ended before the answer did.
    Partial,
    /// Refused, for this reason.
    Refused(String),
}

fn grid_answer(input: &[u8], method: &Method, step: usize) -> Verdict {
    let mut wire = input;
    let mut interim = 0;
    let head = loop {
        let mut buf = BytesMut::from(wire);
        match parse_head(&mut buf, method) {
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
                    return Verdict::Refused(format!("{:?}", WireError::TooManyInterim));
                }
            }
            Ok(Parsed::Partial) => {
                assert_eq!(&buf[..], wire, "a partial head was consumed");
                assert!(
                    wire.len() < MAX_ANSWER_HEAD_BYTES,
                    "a full-size partial head waited on"
                );
                return Verdict::Partial;
            }
            Err(e) => return Verdict::Refused(format!("{e:?}")),
        }
    };
    if *method == Method::HEAD {
        assert_eq!(head.framing, Framing::Empty);
    }
    let (body, ended, taken) = decode(head.framing, wire, step);
    assert!(body.len() <= wire.len());
    if let Framing::Length(n) = head.framing {
        match &ended {
            Ok(()) => assert_eq!(body.len() as u64, n),
            Err(e) => assert_eq!(*e, WireError::Truncated),
        }
    }
    let (whole, whole_ended, whole_taken) = decode(head.framing, wire, wire.len().max(1));
    assert_eq!(whole, body, "piece size changed the body");
    assert_eq!(whole_ended, ended, "piece size changed the ending");
    if ended.is_ok() {
        assert_eq!(whole_taken, taken, "piece size changed where the body ended");
    }
    match ended {
        Ok(()) => Verdict::Read(head, body, input.len() - wire.len() + taken),
        Err(WireError::Truncated) => Verdict::Partial,
        Err(e) => Verdict::Refused(format!("{e:?}")),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, wire)) = data.split_first() else {
        return;
    };
    let step = usize::from(first & 63) + 1;
    let method = if first & 64 == 0 {
        Method::POST
    } else {
        Method::HEAD
    };
    let grid = grid_answer(wire, &method, step);
    // hyper is given the answer as grid framed it, and nothing after: what it reads
    // there must be the same answer, so the two agree on where it ends. (Bytes after an
    // answer are never read by the gateway's pool, and hyper's client fails the exchange
    // over them.)
    let end = match &grid {
        Verdict::Read(_, _, end) => *end,
        _ => wire.len(),
    };
    let hyper = hyper_answer(&wire[..end], &method);
    match (grid, hyper) {
        (Verdict::Read(head, body, _), Ok(hyper)) => {
            assert_eq!(head.status, hyper.status, "the status differs");
            assert_eq!(head.headers, hyper.headers, "the header fields differ");
            assert_eq!(body, hyper.body, "the body differs");
        }
        (Verdict::Read(head, body, _), Err(e)) => panic!(
            "grid read the answer whole ({} {:?}, {} body bytes) and hyper refused it: {e}",
            head.status,
            head.framing,
            body.len()
        ),
        (Verdict::Refused(class), Ok(_)) => stricter("h1_answer", class),
        (Verdict::Partial, Ok(_)) => stricter("h1_answer", "Partial".to_owned()),
        (Verdict::Refused(_) | Verdict::Partial, Err(_)) => {}
    }
});
