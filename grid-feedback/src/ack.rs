//! The 204 echo: the operator's word that one exact report is persisted.

use crate::headers::{HEADER_EPOCH, HEADER_SEQUENCE, Slot, parse_decimal};
use crate::{Epoch, Error};

/// Names one report by epoch and sequence. A gateway never sends two different reports
/// with the same pair, so an acknowledgment naming a pair proves that exact report (and
/// the condition it produced) is persisted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ack {
    /// The reporting process.
    pub epoch: Epoch,
    /// The acknowledged report's sequence.
    pub sequence: u64,
}

impl Ack {
    /// The 204 response headers, names lowercase.
    pub fn headers(&self) -> [(&'static str, String); 2] {
        [
            (HEADER_EPOCH, self.epoch.to_string()),
            (HEADER_SEQUENCE, self.sequence.to_string()),
        ]
    }

    /// Reads the echo from a response's headers: exactly one epoch and one sequence, in
    /// the request's syntax. Other headers are ignored.
    pub fn from_headers<I, N, V>(headers: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = (N, V)>,
        N: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let mut epoch = Slot::Absent;
        let mut sequence = Slot::Absent;
        for (name, value) in headers {
            let (name, value) = (name.as_ref(), value.as_ref());
            if name.eq_ignore_ascii_case(HEADER_EPOCH.as_bytes()) {
                epoch.fill(|| Epoch::from_hex(value));
            } else if name.eq_ignore_ascii_case(HEADER_SEQUENCE.as_bytes()) {
                sequence.fill(|| parse_decimal(HEADER_SEQUENCE, value));
            }
        }
        Ok(Self {
            epoch: epoch.take(HEADER_EPOCH)?,
            sequence: sequence.take(HEADER_SEQUENCE)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack() -> Ack {
        Ack {
            epoch: Epoch::new(42).unwrap(),
            sequence: 9,
        }
    }

    #[test]
    fn an_echo_round_trips() {
        assert_eq!(Ack::from_headers(ack().headers()), Ok(ack()));
    }

    #[test]
    fn a_missing_or_repeated_echo_is_not_an_acknowledgment() {
        let [epoch, sequence] = ack().headers();
        assert_eq!(
            Ack::from_headers([epoch.clone()]),
            Err(Error::MissingHeader {
                header: HEADER_SEQUENCE
            })
        );
        assert_eq!(
            Ack::from_headers([epoch.clone(), sequence.clone(), sequence]),
            Err(Error::RepeatedHeader {
                header: HEADER_SEQUENCE
            })
        );
        assert!(Ack::from_headers([(HEADER_SEQUENCE, "9")]).is_err());
    }
}
