//! SHA-256 fingerprints of leaf certificates, the identity in `pin` trust mode.

use std::fmt;

/// The SHA-256 digest of a certificate's DER encoding.
///
/// Operators copy fingerprints from tools that print them as `AB:CD:...` or `abcd...`;
/// both spellings (colons optional, any case) name the same certificate.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of a DER-encoded certificate.
    pub fn of_der(der: &[u8]) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, der);
        let mut out = [0u8; 32];
        out.copy_from_slice(digest.as_ref());
        Self(out)
    }

    /// Parses 64 hex digits, optionally separated by colons, in either case.
    ///
    /// Returns the reason as text because the caller (config validation) attaches the
    /// field name.
    pub fn parse(text: &str) -> Result<Self, String> {
        let hex: Vec<u8> = text.bytes().filter(|b| *b != b':').collect();
        if hex.len() != 64 {
            return Err(format!(
                "a SHA-256 fingerprint has 64 hex digits (colons optional), found {}",
                hex.len()
            ));
        }
        let mut out = [0u8; 32];
        for (i, pair) in hex.chunks_exact(2).enumerate() {
            let hi = hex_digit(pair[0])?;
            let lo = hex_digit(pair[1])?;
            out[i] = (hi << 4) | lo;
        }
        Ok(Self(out))
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

fn hex_digit(b: u8) -> Result<u8, String> {
    match b {
        b'0'..=b'9' => Ok(b - b'0'),
        b'a'..=b'f' => Ok(b - b'a' + 10),
        b'A'..=b'F' => Ok(b - b'A' + 10),
        _ => Err(format!(
            "`{}` is not a hex digit",
            char::from(b).escape_default()
        )),
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{b:02X}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colons_and_case_do_not_change_the_fingerprint() {
        let fp = Fingerprint::of_der(b"certificate");
        let upper = fp.to_string();
        let lower_plain = upper.replace(':', "").to_lowercase();
        assert_eq!(Fingerprint::parse(&upper).unwrap(), fp);
        assert_eq!(Fingerprint::parse(&lower_plain).unwrap(), fp);
        assert_eq!(Fingerprint::parse(&upper.to_lowercase()).unwrap(), fp);
    }

    #[test]
    fn wrong_length_and_non_hex_are_refused() {
        assert!(
            Fingerprint::parse(&"ab".repeat(31))
                .unwrap_err()
                .contains("found 62")
        );
        assert!(Fingerprint::parse(&"ab".repeat(33)).is_err());
        let bad = format!("{}zz", "ab".repeat(31));
        assert!(
            Fingerprint::parse(&bad)
                .unwrap_err()
                .contains("not a hex digit")
        );
    }

    #[test]
    fn fingerprint_is_sha256_of_der() {
        // SHA-256("abc"), a published test vector.
        let fp = Fingerprint::of_der(b"abc");
        assert_eq!(
            fp.to_string().replace(':', "").to_lowercase(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
