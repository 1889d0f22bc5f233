//! The reporting process's identity: a random nonzero 64-bit epoch.

use std::fmt;
use std::num::NonZeroU64;

use crate::Error;
use crate::headers::{EPOCH_HEX_LEN, HEADER_EPOCH};

/// One gateway process's lifetime. The daemon draws it from its random source at start
/// (this crate never does) and keeps it across poller and certificate reloads; a new
/// process is a new reporter identity with its own sequence and counter.
///
/// On the wire and in persisted state it is [`EPOCH_HEX_LEN`] lowercase hex digits.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct Epoch(NonZeroU64);

impl Epoch {
    /// Wraps a random value; `None` for zero, which no process may use.
    pub fn new(value: u64) -> Option<Self> {
        NonZeroU64::new(value).map(Self)
    }

    /// The raw value.
    pub fn get(self) -> u64 {
        self.0.get()
    }

    /// Decodes the wire form: exactly [`EPOCH_HEX_LEN`] lowercase hex digits, not all zero.
    pub fn from_hex(value: &[u8]) -> Result<Self, Error> {
        if value.len() > EPOCH_HEX_LEN {
            return Err(Error::OversizedHeader {
                header: HEADER_EPOCH,
                len: value.len(),
                limit: EPOCH_HEX_LEN,
            });
        }
        let malformed = Error::MalformedHeader {
            header: HEADER_EPOCH,
            expected: "16 lowercase hex digits, not all zero",
        };
        if value.len() != EPOCH_HEX_LEN {
            return Err(malformed);
        }
        let mut total: u64 = 0;
        for &byte in value {
            let digit = match byte {
                b'0'..=b'9' => byte - b'0',
                b'a'..=b'f' => byte - b'a' + 10,
                _ => return Err(malformed),
            };
            total = (total << 4) | u64::from(digit);
        }
        Self::new(total).ok_or(malformed)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0.get())
    }
}

impl From<Epoch> for String {
    fn from(epoch: Epoch) -> Self {
        epoch.to_string()
    }
}

impl TryFrom<String> for Epoch {
    type Error = Error;

    fn try_from(value: String) -> Result<Self, Error> {
        Self::from_hex(value.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_not_an_epoch() {
        assert_eq!(Epoch::new(0), None);
        assert!(matches!(
            Epoch::from_hex(b"0000000000000000"),
            Err(Error::MalformedHeader { .. })
        ));
    }

    #[test]
    fn the_wire_form_round_trips_at_both_ends_of_the_range() {
        for value in [1, u64::MAX, 0x0123_4567_89ab_cdef] {
            let epoch = Epoch::new(value).unwrap();
            let text = epoch.to_string();
            assert_eq!(text.len(), EPOCH_HEX_LEN);
            assert_eq!(Epoch::from_hex(text.as_bytes()), Ok(epoch));
        }
        assert_eq!(Epoch::new(1).unwrap().to_string(), "0000000000000001");
    }

    #[test]
    fn an_epoch_is_exactly_sixteen_lowercase_digits() {
        assert!(matches!(
            Epoch::from_hex(b"000000000000001"),
            Err(Error::MalformedHeader { .. })
        ));
        assert_eq!(
            Epoch::from_hex(b"00000000000000001"),
            Err(Error::OversizedHeader {
                header: HEADER_EPOCH,
                len: 17,
                limit: EPOCH_HEX_LEN
            })
        );
        assert!(matches!(
            Epoch::from_hex(b"000000000000000A"),
            Err(Error::MalformedHeader { .. })
        ));
        assert!(matches!(
            Epoch::from_hex(b"000000000000000g"),
            Err(Error::MalformedHeader { .. })
        ));
    }
}
