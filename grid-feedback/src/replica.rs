//! The diagnostic name a reporting replica gives itself.

use std::fmt;

use crate::Error;
use crate::headers::{HEADER_REPLICA, MAX_REPLICA_LEN};

/// A replica's name: one DNS label (1 to [`MAX_REPLICA_LEN`] bytes of `a-z`, `0-9` and
/// `-`, starting and ending with a letter or digit), typically the gateway pod's name.
///
/// It only helps a human find the replica in the condition message. It is never a metric
/// label and never authorizes anything: the TLS identity does that.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct Replica(String);

impl Replica {
    /// Validates a name.
    pub fn new(name: &str) -> Result<Self, Error> {
        Self::from_bytes(name.as_bytes())
    }

    /// Validates a header value.
    pub fn from_bytes(value: &[u8]) -> Result<Self, Error> {
        if value.len() > MAX_REPLICA_LEN {
            return Err(Error::OversizedHeader {
                header: HEADER_REPLICA,
                len: value.len(),
                limit: MAX_REPLICA_LEN,
            });
        }
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let valid = value.first().is_some_and(alnum)
            && value.last().is_some_and(alnum)
            && value.iter().all(|b| alnum(b) || *b == b'-');
        if !valid {
            return Err(Error::MalformedHeader {
                header: HEADER_REPLICA,
                expected: "a DNS label: a-z, 0-9 and '-', starting and ending alphanumeric",
            });
        }
        // Checked above: ASCII only.
        Ok(Self(String::from_utf8_lossy(value).into_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Replica {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Replica> for String {
    fn from(replica: Replica) -> Self {
        replica.0
    }
}

impl TryFrom<String> for Replica {
    type Error = Error;

    fn try_from(value: String) -> Result<Self, Error> {
        Self::from_bytes(value.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_name_is_accepted_at_its_length_limit_and_oversized_one_past_it() {
        let at = "a".repeat(MAX_REPLICA_LEN);
        let over = "a".repeat(MAX_REPLICA_LEN + 1);
        assert_eq!(Replica::new(&at).unwrap().as_str(), at);
        assert_eq!(
            Replica::new(&over),
            Err(Error::OversizedHeader {
                header: HEADER_REPLICA,
                len: MAX_REPLICA_LEN + 1,
                limit: MAX_REPLICA_LEN
            })
        );
    }

    #[test]
    fn a_replica_name_is_a_dns_label() {
        assert!(Replica::new("gateway-7d9f-x2").is_ok());
        assert!(Replica::new("a").is_ok());
        for bad in ["", "-a", "a-", "Gateway", "a.b", "a b", "a_b", "ü"] {
            assert!(
                matches!(Replica::new(bad), Err(Error::MalformedHeader { .. })),
                "{bad:?}"
            );
        }
    }
}
