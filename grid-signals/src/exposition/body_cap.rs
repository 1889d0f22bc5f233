//! The 1 MiB body cap: an accumulator for bodies that arrive in chunks, and a reader
//! helper built on it.
//!
//! Reaching the cap is its own outcome ([`Error::BodyCap`]), not a parse error: the
//! endpoint answered but said too much, so the operator counts `body_cap` and leaves
//! readiness unknown. Nothing is kept, read or allocated in proportion to bytes past the
//! cap: the buffer never grows beyond [`MAX_EXPOSITION_BYTES`], and the reader helper
//! reads at most one byte more than the cap (to tell "exactly at" from "over").

use std::io::{ErrorKind, Read};

use super::MAX_EXPOSITION_BYTES;
use crate::Error;

/// Size of the stack buffer [`read_capped`] reads through.
pub const READ_CHUNK_BYTES: usize = 16 * 1024;

/// Sans-I/O body accumulator with the [`MAX_EXPOSITION_BYTES`] cap.
///
/// The caller pushes chunks as its transport delivers them; once the total would pass the
/// cap, `push` refuses (and keeps refusing) without copying the chunk.
#[derive(Clone, Debug, Default)]
pub struct BodyBuf {
    bytes: Vec<u8>,
    capped: bool,
}

impl BodyBuf {
    /// An empty buffer; it allocates on the first non-empty push.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `chunk`, or returns [`Error::BodyCap`] if the body would pass the cap.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), Error> {
        let cap_error = Error::BodyCap {
            limit: MAX_EXPOSITION_BYTES,
        };
        if self.capped {
            return Err(cap_error);
        }
        let needed = self.bytes.len() + chunk.len().min(MAX_EXPOSITION_BYTES + 1);
        if needed > MAX_EXPOSITION_BYTES {
            self.capped = true;
            return Err(cap_error);
        }
        if needed > self.bytes.capacity() {
            // Double as usual, but never past the cap.
            let target = needed
                .max(self.bytes.capacity() * 2)
                .clamp(256, MAX_EXPOSITION_BYTES)
                .max(needed);
            self.bytes.reserve_exact(target - self.bytes.len());
        }
        self.bytes.extend_from_slice(chunk);
        Ok(())
    }

    /// Whether a push has been refused for passing the cap.
    pub fn is_capped(&self) -> bool {
        self.capped
    }

    /// The bytes accepted so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// How many bytes were accepted.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether nothing was accepted yet.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The accepted bytes.
    pub fn into_vec(self) -> Vec<u8> {
        self.bytes
    }
}

/// Reads `reader` to its end into a capped body.
///
/// Reads at most `MAX_EXPOSITION_BYTES + 1` bytes: a body of exactly the cap is returned,
/// one byte more is [`Error::BodyCap`] and the rest of the stream is left unread.
/// `Interrupted` reads are retried; other read errors become [`Error::Read`]. The crate
/// stays sans-I/O: the caller owns the reader and whatever it talks to.
pub fn read_capped(reader: impl Read) -> Result<Vec<u8>, Error> {
    let mut limited = reader.take(MAX_EXPOSITION_BYTES as u64 + 1);
    let mut body = BodyBuf::new();
    let mut chunk = [0u8; READ_CHUNK_BYTES];
    loop {
        match limited.read(&mut chunk) {
            Ok(0) => return Ok(body.into_vec()),
            Ok(n) => body.push(&chunk[..n])?,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(Error::Read {
                    kind: e.kind(),
                    message: e.to_string(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Error = Error::BodyCap {
        limit: MAX_EXPOSITION_BYTES,
    };

    #[test]
    fn exactly_the_cap_is_accepted_in_one_push() {
        let mut b = BodyBuf::new();
        assert_eq!(b.push(&vec![b'a'; MAX_EXPOSITION_BYTES]), Ok(()));
        assert_eq!(b.len(), MAX_EXPOSITION_BYTES);
        assert!(!b.is_capped());
    }

    #[test]
    fn one_byte_past_the_cap_is_refused_and_stays_refused() {
        let mut b = BodyBuf::new();
        b.push(&vec![b'a'; MAX_EXPOSITION_BYTES]).unwrap();
        assert_eq!(b.push(b"x"), Err(CAP));
        assert!(b.is_capped());
        assert_eq!(b.push(b""), Err(CAP));
        assert_eq!(b.len(), MAX_EXPOSITION_BYTES);
    }

    #[test]
    fn a_single_oversized_chunk_is_refused_without_copying() {
        let mut b = BodyBuf::new();
        assert_eq!(b.push(&vec![0; MAX_EXPOSITION_BYTES + 1]), Err(CAP));
        assert!(b.is_empty());
        assert_eq!(b.bytes.capacity(), 0);
    }

    #[test]
    fn growth_never_reserves_past_the_cap() {
        let mut b = BodyBuf::new();
        let chunk = vec![1u8; 1000];
        while b.push(&chunk).is_ok() {
            assert!(b.bytes.capacity() <= MAX_EXPOSITION_BYTES);
        }
        assert!(b.len() > MAX_EXPOSITION_BYTES - 1000);
        assert!(b.bytes.capacity() <= MAX_EXPOSITION_BYTES);
    }

    #[test]
    fn read_capped_accepts_exactly_the_cap() {
        let body = vec![b'x'; MAX_EXPOSITION_BYTES];
        assert_eq!(read_capped(&body[..]).unwrap().len(), MAX_EXPOSITION_BYTES);
    }

    #[test]
    fn read_capped_refuses_one_byte_more_and_stops_reading() {
        let body = vec![b'x'; MAX_EXPOSITION_BYTES + 1];
        assert_eq!(read_capped(&body[..]), Err(CAP));
        // An endless stream ends at the cap too: at most cap + 1 bytes are read.
        let mut endless = std::io::repeat(b'y');
        let mut counted = (&mut endless).take(u64::MAX);
        assert_eq!(read_capped(&mut counted), Err(CAP));
        assert_eq!(u64::MAX - counted.limit(), MAX_EXPOSITION_BYTES as u64 + 1);
    }

    #[test]
    fn read_errors_are_reported_with_their_kind() {
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::new(ErrorKind::ConnectionReset, "reset"))
            }
        }
        assert!(matches!(
            read_capped(Broken),
            Err(Error::Read {
                kind: ErrorKind::ConnectionReset,
                ..
            })
        ));
    }
}
