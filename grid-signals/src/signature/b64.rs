//! Base64 (RFC 4648, standard alphabet, padded) in its one canonical spelling: the
//! signature and chain comment lines carry binary this way, and a canonical spelling
//! means one value has one line.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// The length of the padded encoding of `n` bytes.
pub(crate) const fn encoded_len(n: usize) -> usize {
    n.div_ceil(3) * 4
}

/// Appends the padded encoding of `bytes`.
pub(crate) fn encode_into(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(encoded_len(bytes.len()));
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(ALPHABET[(n >> 18) as usize & 63]);
        out.push(ALPHABET[(n >> 12) as usize & 63]);
        out.push(if chunk.len() > 1 {
            ALPHABET[(n >> 6) as usize & 63]
        } else {
            b'='
        });
        out.push(if chunk.len() > 2 {
            ALPHABET[n as usize & 63]
        } else {
            b'='
        });
    }
}

fn value(c: u8) -> Option<u32> {
    Some(u32::from(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    }))
}

/// How many bytes `text` decodes to, when it is canonical padded base64 (a multiple of
/// four characters, padding only at the end, the bits padding leaves unused zero);
/// checked without decoding.
pub(crate) fn decoded_len(text: &[u8]) -> Option<usize> {
    if !text.len().is_multiple_of(4) {
        return None;
    }
    let pad = text.iter().rev().take_while(|&&c| c == b'=').count();
    if pad > 2 {
        return None;
    }
    let body = &text[..text.len() - pad];
    let mut last = 0;
    for &c in body {
        last = value(c)?;
    }
    // The bits the padding leaves unused must be zero: one spelling per value.
    let unused_mask = match pad {
        1 => 0b11,
        2 => 0b1111,
        _ => 0,
    };
    if last & unused_mask != 0 {
        return None;
    }
    Some(text.len() / 4 * 3 - pad)
}

/// Decodes canonical padded base64 (see [`decoded_len`]).
pub(crate) fn decode(text: &[u8]) -> Option<Vec<u8>> {
    let len = decoded_len(text)?;
    let mut out = Vec::with_capacity(len);
    for quad in text.chunks(4) {
        let mut n = 0u32;
        for &c in quad {
            n = (n << 6) | value(c).unwrap_or(0);
        }
        out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8]);
    }
    out.truncate(len);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_rfc_4648_vectors_encode_and_decode() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            let mut out = Vec::new();
            encode_into(&mut out, plain.as_bytes());
            assert_eq!(out, coded.as_bytes());
            assert_eq!(decode(coded.as_bytes()).unwrap(), plain.as_bytes());
        }
    }

    #[test]
    fn non_canonical_spellings_are_refused() {
        for bad in [
            "Zh==", "Zm9=", "Zg=", "Z===", "Zg==Zg==", "Zm9v\n", "Zm 9", "Zm-v",
        ] {
            assert_eq!(decode(bad.as_bytes()), None, "{bad}");
        }
    }

    proptest! {
        #[test]
        fn any_bytes_round_trip_through_their_one_spelling(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut out = Vec::new();
            encode_into(&mut out, &bytes);
            prop_assert_eq!(out.len(), encoded_len(bytes.len()));
            prop_assert_eq!(decoded_len(&out), Some(bytes.len()));
            prop_assert_eq!(decode(&out).unwrap(), bytes);
        }
    }
}
