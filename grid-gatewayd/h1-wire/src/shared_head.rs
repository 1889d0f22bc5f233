//! A head's field values as slices of the head's own bytes, so a parsed head costs one
//! shared buffer instead of an allocation per field.
//!
//! httparse hands out slices borrowing the read buffer, and the buffer must be split
//! (mutably) before its bytes can be shared, so the fields are first noted as offsets,
//! then built from the frozen head. Both heads the gateway reads, a client's request
//! and a site's answer, go through here.

use arrayvec::ArrayVec;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

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

/// The header map of `head`, its values pointing into it; a name or value that is not
/// valid becomes `malformed(why)`.
#[inline]
pub(crate) fn header_map(
    head: &Bytes,
    fields: &[(Span, Span)],
    malformed: fn(String) -> WireError,
) -> Result<HeaderMap, WireError> {
    let mut headers = HeaderMap::with_capacity(fields.len());
    for &((n0, n1), (v0, v1)) in fields {
        let name = HeaderName::from_bytes(&head[n0..n1]).map_err(|e| malformed(e.to_string()))?;
        let value = HeaderValue::from_maybe_shared(head.slice(v0..v1))
            .map_err(|e| malformed(e.to_string()))?;
        headers.append(name, value);
    }
    Ok(headers)
}
