//! A head's field values as slices of the head's own bytes, so a parsed head costs one
//! shared buffer instead of an allocation per field.
//!
//! httparse hands out slices borrowing the read buffer, and the buffer must be split
//! (mutably) before its bytes can be shared, so the fields are first noted as offsets,
//! then built from the frozen head. Both heads the gateway reads, a client's request
//! and a site's answer, go through here.

use arrayvec::ArrayVec;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, header};

use crate::WireError;

/// Where a part lies in its head: start and end byte offsets.
pub(crate) type Span = (usize, usize);

/// Where each field's name and value lie, in order; never zeroed in full (an `ArrayVec`
/// writes only the entries it holds: a zeroed table of 100 cost more than the parse).
pub(crate) type Fields<const N: usize> = ArrayVec<(Span, Span), N>;

/// Where `part`, a slice of `base`, lies in it.
#[inline]
pub(crate) fn span(base: &[u8], part: &[u8]) -> Span {
    let start = part.as_ptr() as usize - base.as_ptr() as usize;
    (start, start + part.len())
}

/// Notes where each of httparse's `fields` (slices of `base`) lies, into `spans`, which
/// the caller keeps in place: returned by value, the table (3 KiB at 100 fields) was
/// copied, which cost more than the noting.
#[inline]
pub(crate) fn note<const N: usize>(
    base: &[u8],
    fields: &[httparse::Header<'_>],
    spans: &mut Fields<N>,
) {
    for f in fields {
        spans.push((span(base, f.name.as_bytes()), span(base, f.value)));
    }
}

/// What the fields the framing rules read said, noted while the map is built: a head
/// with no `Transfer-Encoding`, `Connection` or `Expect` (nearly every one) is then
/// framed without looking a name up in the map, where each lookup hashed the name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Noted {
    /// What the `Transfer-Encoding` fields say.
    pub(crate) coding: Coding,
    /// A `Connection` field is present.
    pub(crate) connection: bool,
    /// An `Expect` field is present.
    pub(crate) expect: bool,
    /// What every `Content-Length` field says together.
    pub(crate) length: Length,
    /// How many `Host` fields there are (saturating).
    pub(crate) hosts: u8,
}

/// What a head's `Transfer-Encoding` fields say together.
///
/// Read as hyper reads it and no more loosely: the coding that frames the body is the
/// last member of the last field (an empty member after a comma counts, so `chunked,`
/// does not end in chunked), and the gateway decodes only `chunked` alone. Two readers of
/// one head that disagree on where its body ends are how a request is smuggled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Coding {
    /// No such field.
    #[default]
    Absent,
    /// Present.
    Listed {
        /// Codings listed over every field (empty members not counted), saturating.
        codings: u8,
        /// The last field's last member is `chunked`.
        chunked_last: bool,
    },
}

impl Coding {
    /// Adds one field's `value` (free of control bytes: checked by the caller).
    pub(crate) fn add(self, value: &[u8]) -> Self {
        let before = match self {
            Self::Absent => 0,
            Self::Listed { codings, .. } => codings,
        };
        // Nearly every one says just `chunked`: known without splitting the list.
        let (codings, chunked_last) = if value.eq_ignore_ascii_case(b"chunked") {
            (1, true)
        } else if !is_text(value) {
            // Not a list of tokens: a coding the gateway cannot name, nor decode.
            (1, false)
        } else {
            let mut codings = 0u8;
            let mut last: &[u8] = b"";
            for member in value.split(|&b| b == b',') {
                last = member.trim_ascii();
                codings = codings.saturating_add(u8::from(!last.is_empty()));
            }
            (codings, last.eq_ignore_ascii_case(b"chunked"))
        };
        Self::Listed {
            codings: before.saturating_add(codings),
            chunked_last,
        }
    }

    /// The body's coding is `chunked` and nothing else: the one coding the gateway
    /// decodes.
    pub(crate) fn is_chunked_only(self) -> bool {
        self == Self::Listed {
            codings: 1,
            chunked_last: true,
        }
    }

    /// The last coding applied is `chunked`: the body is framed by its chunks (RFC 9112
    /// section 6.3), whatever other codings came before. The gateway refuses every such
    /// body but `chunked` alone; the tests hold this reading to hyper's.
    #[cfg(test)]
    pub(crate) fn ends_in_chunked(self) -> bool {
        matches!(
            self,
            Self::Listed {
                chunked_last: true,
                ..
            }
        )
    }
}

/// What a head's `Content-Length` fields say together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Length {
    /// No such field.
    #[default]
    Absent,
    /// One length, however many fields or list members said it.
    Is(u64),
    /// A member that is not a decimal length, or two that differ.
    Unusable,
}

impl Length {
    /// Adds one field's `value`: one decimal length, digits only (no sign, no
    /// whitespace, no list), equal to any length before it. Equal repeats in separate
    /// fields are one length (RFC 9110 section 8.6); a list in one field, which that
    /// section lets a recipient either merge or refuse, is refused, as hyper's server
    /// refuses it: two readers must never frame one body two ways.
    pub(crate) fn add(self, value: &[u8]) -> Self {
        match (self, decimal(value)) {
            (Self::Unusable, _) | (_, None) => Self::Unusable,
            (Self::Is(l), Some(n)) if l != n => Self::Unusable,
            (_, Some(n)) => Self::Is(n),
        }
    }
}

/// `digits` as a number: none empty, all ASCII digits, not past `u64::MAX`.
fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// Whether `b` is a control byte a field may not carry: below a space except a tab, or
/// DEL (RFC 9110 section 5.5).
pub(crate) fn is_control(b: u8) -> bool {
    (b < b' ' && b != b'\t') || b == 0x7f
}

/// Whether `value` is visible ASCII and tabs only: what `HeaderValue::to_str` accepts,
/// and so what the list fields were read as before they were noted here.
fn is_text(value: &[u8]) -> bool {
    value
        .iter()
        .all(|&b| b == b'\t' || (b' '..0x7f).contains(&b))
}

/// The header map of `head`, its values pointing into it, and what its framing fields
/// said; a name or value that is not valid becomes `malformed(why)`.
///
/// `Transfer-Encoding` is read here and left out of the map: the body handed on is the
/// decoded one, which no longer has that coding, and every way the proxy answers frames
/// its body itself.
#[inline]
pub(crate) fn header_map(
    head: &Bytes,
    fields: &[(Span, Span)],
    malformed: fn(String) -> WireError,
) -> Result<(HeaderMap, Noted), WireError> {
    let mut headers = HeaderMap::with_capacity(fields.len());
    let mut noted = Noted::default();
    for &((n0, n1), (v0, v1)) in fields {
        let name = HeaderName::from_bytes(&head[n0..n1]).map_err(|e| malformed(e.to_string()))?;
        // Standard names compare as an enum tag: a few instructions each.
        if name == header::CONTENT_LENGTH {
            noted.length = noted.length.add(&head[v0..v1]);
        } else if name == header::TRANSFER_ENCODING {
            let value = &head[v0..v1];
            // Refused as the map refuses any other field's value (a control byte other
            // than a tab, or DEL), without building the value.
            if value.iter().any(|&b| is_control(b)) {
                return Err(malformed("failed to parse header value".into()));
            }
            noted.coding = noted.coding.add(value);
            continue;
        } else if name == header::CONNECTION {
            noted.connection = true;
        } else if name == header::EXPECT {
            noted.expect = true;
        } else if name == header::HOST {
            noted.hosts = noted.hosts.saturating_add(1);
        }
        let value = HeaderValue::from_maybe_shared(head.slice(v0..v1))
            .map_err(|e| malformed(e.to_string()))?;
        headers.append(name, value);
    }
    Ok((headers, noted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The rule read from the map, as hyper's server reads it: the reference the noting
    /// must agree with.
    fn by_the_map(headers: &HeaderMap) -> Length {
        let mut length = Length::Absent;
        for v in headers.get_all(header::CONTENT_LENGTH) {
            // hyper's server: each field one number, all digits.
            let text = v.as_bytes();
            let n = if !text.is_empty() && text.iter().all(u8::is_ascii_digit) {
                std::str::from_utf8(text)
                    .ok()
                    .and_then(|t| t.parse::<u64>().ok())
            } else {
                None
            };
            length = match (n, length) {
                (None, _) => return Length::Unusable,
                (Some(n), Length::Is(l)) if l != n => return Length::Unusable,
                (Some(n), _) => Length::Is(n),
            };
        }
        length
    }

    /// `fields` as a head's bytes and their spans in it.
    fn head_of(fields: &[(&str, Vec<u8>)]) -> (Bytes, Vec<(Span, Span)>) {
        let mut bytes = Vec::new();
        let mut spans = Vec::new();
        for (name, value) in fields {
            let n0 = bytes.len();
            bytes.extend_from_slice(name.as_bytes());
            let v0 = bytes.len();
            bytes.extend_from_slice(value);
            spans.push(((n0, v0), (v0, bytes.len())));
        }
        (Bytes::from(bytes), spans)
    }

    #[test]
    fn framing_fields_are_noted_whatever_their_case_and_others_are_not() {
        let (head, spans) = head_of(&[
            ("Transfer-Encoding", b"chunked".to_vec()),
            ("CONNECTION", b"close".to_vec()),
            ("x-connection", b"1".to_vec()),
        ]);
        let (map, noted) = header_map(&head, &spans, WireError::Head).unwrap();
        assert_eq!(map.len(), 2, "transfer-encoding is read, not kept: {map:?}");
        assert!(noted.connection && !noted.expect);
        assert!(noted.coding.is_chunked_only());
        assert_eq!(noted.length, Length::Absent);
        assert_eq!(noted.hosts, 0);
        let (head, spans) = head_of(&[("expect", b"100-continue".to_vec())]);
        let (_, noted) = header_map(&head, &spans, WireError::Head).unwrap();
        assert!(noted.expect && !noted.connection);
        assert_eq!(noted.coding, Coding::Absent);
        let (head, spans) = head_of(&[("Host", b"a".to_vec()), ("host", b"b".to_vec())]);
        let (map, noted) = header_map(&head, &spans, WireError::Head).unwrap();
        assert_eq!(noted.hosts, 2, "each host field is counted: {map:?}");
    }

    #[test]
    fn only_chunked_alone_is_chunked_only_and_the_last_member_of_the_last_field_frames() {
        let coding = |values: &[&[u8]]| {
            values
                .iter()
                .fold(Coding::Absent, |coding, value| coding.add(value))
        };
        for only in [
            &[&b"chunked"[..]][..],
            &[b"CHUNKED"],
            &[b" chunked "],
            &[b", chunked"],
            &[b"", b"chunked"],
        ] {
            assert!(coding(only).is_chunked_only(), "{only:?}");
        }
        // Framed by chunks, but with codings the gateway does not decode.
        for others in [
            &[&b"gzip, chunked"[..]][..],
            &[b"gzip", b"chunked"],
            &[b"chunked", b"chunked"],
            &[b"identity,chunked"],
        ] {
            let c = coding(others);
            assert!(c.ends_in_chunked() && !c.is_chunked_only(), "{others:?}");
        }
        // Not ending in chunked, as hyper reads it: an empty last member or field counts.
        for not in [
            &[&b"chunked,"[..]][..],
            &[b"chunked", b""],
            &[b"chunked, gzip"],
            &[b"identity"],
            &[b""],
            &[b"chunked\x80"],
        ] {
            assert!(!coding(not).ends_in_chunked(), "{not:?}");
        }
    }

    #[test]
    fn a_transfer_encoding_with_a_control_byte_is_refused_as_any_field_is() {
        for bad in [&b"chunked\x01"[..], b"\x7fchunked"] {
            let (head, spans) = head_of(&[("transfer-encoding", bad.to_vec())]);
            assert!(header_map(&head, &spans, WireError::Head).is_err());
            let (head, spans) = head_of(&[("x-other", bad.to_vec())]);
            assert!(header_map(&head, &spans, WireError::Head).is_err());
        }
    }

    #[test]
    fn a_length_of_u64_max_is_read_and_one_more_is_unusable() {
        assert_eq!(
            Length::Absent.add(u64::MAX.to_string().as_bytes()),
            Length::Is(u64::MAX)
        );
        assert_eq!(
            Length::Absent.add(b"18446744073709551616"),
            Length::Unusable
        );
    }

    /// `fields` values of up to 14 bytes drawn from `alphabet`.
    fn field_values(
        alphabet: &'static [u8],
        fields: std::ops::Range<usize>,
    ) -> impl Strategy<Value = Vec<Vec<u8>>> {
        prop::collection::vec(
            prop::collection::vec(prop::sample::select(alphabet), 0..14),
            fields,
        )
    }

    proptest! {
        #[test]
        fn the_noted_coding_agrees_with_reading_the_map_as_hyper_frames_it(
            values in field_values(b"chunked, \tgzipCHUNK\x80", 1..4),
        ) {
            let mut map = HeaderMap::new();
            for v in &values {
                map.append(header::TRANSFER_ENCODING, HeaderValue::from_bytes(v).unwrap());
            }
            // hyper's rule (`is_chunked`): the last field's last member, empty or not.
            let chunked_last = map
                .get_all(header::TRANSFER_ENCODING)
                .iter()
                .next_back()
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.rsplit(',').next())
                .is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"));
            // Chunked alone: every member of every field, empty ones dropped, is one
            // `chunked`, and a field that is not text names some other coding.
            let mut members = Vec::new();
            for v in map.get_all(header::TRANSFER_ENCODING) {
                match v.to_str() {
                    Ok(text) => members.extend(
                        text.split(',').map(str::trim).filter(|m| !m.is_empty()).map(str::to_ascii_lowercase),
                    ),
                    Err(_) => members.push("?".to_owned()),
                }
            }
            let only = chunked_last && members == ["chunked"];
            let fields: Vec<(&str, Vec<u8>)> =
                values.into_iter().map(|v| ("transfer-encoding", v)).collect();
            let (head, spans) = head_of(&fields);
            let (kept, noted) = header_map(&head, &spans, WireError::Head).unwrap();
            prop_assert!(kept.is_empty());
            prop_assert_ne!(noted.coding, Coding::Absent);
            prop_assert_eq!(noted.coding.ends_in_chunked(), chunked_last);
            prop_assert_eq!(noted.coding.is_chunked_only(), only);
        }

        #[test]
        fn the_noted_length_agrees_with_reading_the_map(
            values in field_values(b"0123456789, \ta+\x80\xff", 0..4),
        ) {
            let fields: Vec<(&str, Vec<u8>)> = values
                .into_iter()
                .map(|v| ("content-length", v))
                .collect();
            let (head, spans) = head_of(&fields);
            // Tab, visible ASCII and obs-text only: a value the map refuses (a control
            // byte, DEL) fails the head before its length matters.
            let (map, noted) = header_map(&head, &spans, WireError::Head).unwrap();
            prop_assert_eq!(noted.length, by_the_map(&map));
        }
    }
}
