//! The version-1 wire vocabulary: the route, the header names, their length bounds and the
//! exact syntax of each field.
//!
//! Every field has one canonical spelling (no leading zeros, lowercase hex, no
//! whitespace), so "exact duplicate" can compare values and never has to wonder whether
//! two spellings mean the same report.

use crate::Error;

pub use grid_signals::wire::INGEST_PATH;

/// The only method the route takes.
pub const INGEST_METHOD: &str = "POST";

/// Every version-1 header starts with this; an unknown header with it is refused.
pub const HEADER_PREFIX: &str = "x-grid-ingest-";
/// The wire version; this crate speaks [`WIRE_VERSION`].
pub const HEADER_VERSION: &str = "x-grid-ingest-version";
/// The reporting process's random nonzero epoch, [`EPOCH_HEX_LEN`] lowercase hex digits.
/// Echoed on a 204.
pub const HEADER_EPOCH: &str = "x-grid-ingest-epoch";
/// Decimal u64, strictly increasing per report within an epoch. Echoed on a 204.
pub const HEADER_SEQUENCE: &str = "x-grid-ingest-sequence";
/// Decimal u64: cumulative skew drops since the epoch began.
pub const HEADER_REJECTED: &str = "x-grid-ingest-rejected";
/// `true` or `false`: whether the report claims no new rejection.
pub const HEADER_CLEAN: &str = "x-grid-ingest-clean";
/// Diagnostic name of the reporting replica; never a metric label, never authorization.
pub const HEADER_REPLICA: &str = "x-grid-ingest-replica";
/// Set on refusals only: the [`crate::RefusalReason`] label, for humans reading logs.
pub const HEADER_REFUSAL: &str = "x-grid-ingest-refusal";

/// The one wire version this crate reads and writes.
pub const WIRE_VERSION: u64 = 1;
/// An epoch is exactly this many lowercase hex digits.
pub const EPOCH_HEX_LEN: usize = 16;
/// A decimal u64 field is at most this many digits (`u64::MAX` has 20).
pub const MAX_DECIMAL_LEN: usize = 20;
/// A replica name is one DNS label: at most this many bytes.
pub const MAX_REPLICA_LEN: usize = 63;
/// The clean flag is at most this many bytes (`false`).
pub const MAX_CLEAN_LEN: usize = 5;

/// Whether `name` is an `x-grid-ingest-*` header (ASCII case-insensitive, as HTTP is).
pub(crate) fn is_ingest_header(name: &[u8]) -> bool {
    name.len() >= HEADER_PREFIX.len()
        && name[..HEADER_PREFIX.len()].eq_ignore_ascii_case(HEADER_PREFIX.as_bytes())
}

/// Decodes a canonical decimal u64: `0` or a nonzero digit followed by digits.
pub(crate) fn parse_decimal(header: &'static str, value: &[u8]) -> Result<u64, Error> {
    const EXPECTED: &str = "a decimal u64 without sign, spaces or leading zeros";
    if value.len() > MAX_DECIMAL_LEN {
        return Err(Error::OversizedHeader {
            header,
            len: value.len(),
            limit: MAX_DECIMAL_LEN,
        });
    }
    let malformed = Error::MalformedHeader {
        header,
        expected: EXPECTED,
    };
    if value.is_empty() || (value.len() > 1 && value[0] == b'0') {
        return Err(malformed);
    }
    let mut total: u64 = 0;
    for &byte in value {
        if !byte.is_ascii_digit() {
            return Err(malformed);
        }
        total = total
            .checked_mul(10)
            .and_then(|t| t.checked_add(u64::from(byte - b'0')))
            .ok_or_else(|| malformed.clone())?;
    }
    Ok(total)
}

/// Decodes the clean flag: exactly `true` or `false`.
pub(crate) fn parse_flag(header: &'static str, value: &[u8]) -> Result<bool, Error> {
    if value.len() > MAX_CLEAN_LEN {
        return Err(Error::OversizedHeader {
            header,
            len: value.len(),
            limit: MAX_CLEAN_LEN,
        });
    }
    match value {
        b"true" => Ok(true),
        b"false" => Ok(false),
        _ => Err(Error::MalformedHeader {
            header,
            expected: "true or false",
        }),
    }
}

/// One header's occurrences while a header list is scanned: version 1 wants exactly one.
pub(crate) enum Slot<T> {
    /// Not seen yet.
    Absent,
    /// Seen once, decoded.
    Once(Result<T, Error>),
    /// Seen more than once; the later values are not even decoded.
    Repeated,
}

impl<T> Slot<T> {
    /// Records one occurrence, decoding it only if it is the first.
    pub(crate) fn fill(&mut self, decode: impl FnOnce() -> Result<T, Error>) {
        *self = match self {
            Self::Absent => Self::Once(decode()),
            Self::Once(_) | Self::Repeated => Self::Repeated,
        };
    }

    /// The single decoded value, or why there is not exactly one good one.
    pub(crate) fn take(self, header: &'static str) -> Result<T, Error> {
        match self {
            Self::Absent => Err(Error::MissingHeader { header }),
            Self::Repeated => Err(Error::RepeatedHeader { header }),
            Self::Once(decoded) => decoded,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_u64_is_accepted_and_one_more_is_malformed() {
        assert_eq!(
            parse_decimal(HEADER_SEQUENCE, b"18446744073709551615"),
            Ok(u64::MAX)
        );
        assert!(matches!(
            parse_decimal(HEADER_SEQUENCE, b"18446744073709551616"),
            Err(Error::MalformedHeader { .. })
        ));
    }

    #[test]
    fn a_decimal_is_oversized_exactly_one_digit_past_its_limit() {
        let at = vec![b'1'; MAX_DECIMAL_LEN];
        let over = vec![b'1'; MAX_DECIMAL_LEN + 1];
        assert_eq!(
            parse_decimal(HEADER_REJECTED, &at),
            Ok(11_111_111_111_111_111_111)
        );
        assert_eq!(
            parse_decimal(HEADER_REJECTED, &over),
            Err(Error::OversizedHeader {
                header: HEADER_REJECTED,
                len: MAX_DECIMAL_LEN + 1,
                limit: MAX_DECIMAL_LEN
            })
        );
    }

    #[test]
    fn decimals_have_one_spelling() {
        for bad in [&b""[..], b"01", b"+1", b" 1", b"1 ", b"-0", b"1_0", b"0x1"] {
            assert!(
                matches!(
                    parse_decimal(HEADER_SEQUENCE, bad),
                    Err(Error::MalformedHeader { .. })
                ),
                "{bad:?}"
            );
        }
        assert_eq!(parse_decimal(HEADER_SEQUENCE, b"0"), Ok(0));
        assert_eq!(parse_decimal(HEADER_SEQUENCE, b"10"), Ok(10));
    }

    #[test]
    fn the_flag_is_exactly_true_or_false() {
        assert_eq!(parse_flag(HEADER_CLEAN, b"true"), Ok(true));
        assert_eq!(parse_flag(HEADER_CLEAN, b"false"), Ok(false));
        for bad in [&b"True"[..], b"1", b"", b"yes", b"fals"] {
            assert!(matches!(
                parse_flag(HEADER_CLEAN, bad),
                Err(Error::MalformedHeader { .. })
            ));
        }
        assert!(matches!(
            parse_flag(HEADER_CLEAN, b"falsee"),
            Err(Error::OversizedHeader { limit: 5, .. })
        ));
    }

    #[test]
    fn ingest_headers_are_recognized_in_any_case() {
        assert!(is_ingest_header(b"X-Grid-Ingest-Epoch"));
        assert!(is_ingest_header(b"x-grid-ingest-"));
        assert!(!is_ingest_header(b"x-grid-ingest"));
        assert!(!is_ingest_header(b"content-length"));
    }
}
