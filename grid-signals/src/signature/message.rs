//! The bytes a batch signature covers.

use crate::batch::BatchMeta;

/// What the signed bytes start with, so a signature over a batch can never be taken for
/// a signature the same key made over anything else (a TLS handshake signs other
/// contexts).
pub const MESSAGE_CONTEXT: &[u8] = b"grid batch signature v1\0";

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Appends the signed bytes of the batch `meta` heads with `rows` (name, extra labels
/// sorted by name and unescaped, value, stamp): [`MESSAGE_CONTEXT`]; site, provider and
/// UID, each a 4-byte big-endian length then its bytes; epoch, sequence, generation and
/// the number of rows as 8-byte big-endian integers; then per row its name, its label
/// count (4 bytes) and each label's name and value (length-prefixed as above), its value
/// as the 8 bytes of its IEEE 754 bits (both zeros as `+0`, as the wire writes them),
/// and its stamp minus the metadata stamp as an 8-byte two's-complement integer.
///
/// Every field is length-prefixed or fixed-size, so two different batches never give
/// the same bytes; no stamp enters except relative to the metadata stamp, so a relay's
/// re-dating (one shift applied to every stamp) leaves the bytes as they were.
pub fn write_message<'r, L>(
    out: &mut Vec<u8>,
    meta: &BatchMeta,
    rows: impl ExactSizeIterator<Item = (&'r str, L, f64, u64)>,
) where
    L: ExactSizeIterator<Item = (&'r str, &'r str)>,
{
    write_message_parts(
        out,
        (meta.site(), meta.provider(), meta.uid()),
        [meta.fence().epoch, meta.fence().sequence, meta.generation()],
        meta.stamp_ms(),
        rows,
    );
}

/// [`write_message`] from the parts of a metadata line.
pub(crate) fn write_message_parts<'r, L>(
    out: &mut Vec<u8>,
    (site, provider, uid): (&str, &str, &str),
    numbers: [u64; 3],
    meta_stamp_ms: u64,
    rows: impl ExactSizeIterator<Item = (&'r str, L, f64, u64)>,
) where
    L: ExactSizeIterator<Item = (&'r str, &'r str)>,
{
    out.extend_from_slice(MESSAGE_CONTEXT);
    put_str(out, site);
    put_str(out, provider);
    put_str(out, uid);
    for n in numbers {
        out.extend_from_slice(&n.to_be_bytes());
    }
    out.extend_from_slice(&(rows.len() as u64).to_be_bytes());
    for (name, labels, value, stamp_ms) in rows {
        put_str(out, name);
        out.extend_from_slice(&(labels.len() as u32).to_be_bytes());
        for (label, text) in labels {
            put_str(out, label);
            put_str(out, text);
        }
        let bits = if value == 0.0 { 0 } else { value.to_bits() };
        out.extend_from_slice(&bits.to_be_bytes());
        out.extend_from_slice(&stamp_ms.wrapping_sub(meta_stamp_ms).to_be_bytes());
    }
}
