//! The two comment lines: parsed from a comment's text, written whole.

use super::{
    BatchSignature, CHAIN_WORD, MAX_CERT_BYTES, MAX_CHAIN_CERTS, MAX_CHAIN_LINE_BYTES,
    MAX_CHAINS_PER_BODY, MAX_SIGNATURE_BYTES, MAX_SIGNATURE_LINE_BYTES, SIGNATURE_WORD,
    SigningChain, b64,
};
use crate::Error;

/// One of the signature module's comment lines, borrowed from the body; base64 is
/// checked canonical and within its bounds, and decoded only when needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignatureLine<'a> {
    /// `grid_signing_chain <index> <cert>...`: a chain the body's signature lines name
    /// by `index`.
    Chain {
        /// The body-local index, below [`MAX_CHAINS_PER_BODY`].
        index: usize,
        /// The certificates, base64, one space between them.
        certs: &'a str,
    },
    /// `grid_batch_signature <chain> <scheme> <signature>`: the next batch's signature.
    Signature {
        /// The index of the chain whose leaf signed.
        chain: usize,
        /// The TLS `SignatureScheme`.
        scheme: u16,
        /// The signature, base64.
        signature: &'a str,
    },
}

impl SignatureLine<'_> {
    /// The chain of a chain line's certificates, decoded.
    pub fn decode_chain(certs: &str) -> Option<SigningChain> {
        let certs = certs
            .split(' ')
            .map(|c| b64::decode(c.as_bytes()))
            .collect::<Option<Vec<_>>>()?;
        SigningChain::new(certs)
    }

    /// A signature line's signature bytes, decoded.
    pub fn decode_signature(signature: &str) -> Option<Vec<u8>> {
        b64::decode(signature.as_bytes())
    }
}

fn refused(field: &'static str) -> Error {
    Error::Signature { field }
}

/// A canonical decimal below `bound`: digits, no sign, no leading zero but `0` itself.
fn index(text: &str, bound: usize) -> Result<usize, Error> {
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'))
        && text.len() <= 4;
    let n = canonical
        .then(|| text.parse::<usize>().ok())
        .flatten()
        .filter(|&n| n < bound);
    n.ok_or_else(|| refused("index"))
}

/// Canonical base64 of 1 to `max` bytes.
fn base64(text: &str, max: usize, field: &'static str) -> Result<(), Error> {
    match b64::decoded_len(text.as_bytes()) {
        Some(n) if (1..=max).contains(&n) => Ok(()),
        _ => Err(refused(field)),
    }
}

/// Reads a comment's text (what follows `# `): `None` when it is no signature or chain
/// line (an ordinary comment), else the line or why it breaks the rules (an error of
/// kind [`Error::Signature`]).
///
/// The rules: one space between fields and none at either end; a canonical decimal
/// index below [`MAX_CHAINS_PER_BODY`]; a scheme of exactly four lowercase hex digits;
/// canonical padded base64 of at most [`MAX_SIGNATURE_BYTES`] per signature and
/// [`MAX_CERT_BYTES`] per certificate, 1 to [`MAX_CHAIN_CERTS`] certificates; the whole
/// line within [`MAX_SIGNATURE_LINE_BYTES`] or [`MAX_CHAIN_LINE_BYTES`]. So a line has
/// one spelling, and [`write_signature_line`] and [`write_chain_line`] write back
/// exactly what was read.
pub fn parse_signature_line(text: &str) -> Option<Result<SignatureLine<'_>, Error>> {
    let (word, rest) = text.split_once(' ').unwrap_or((text, ""));
    // `# ` before the text and `\n` after it.
    let line_len = text.len() + 3;
    match word {
        SIGNATURE_WORD => Some(parse_signature(rest, line_len)),
        CHAIN_WORD => Some(parse_chain(rest, line_len)),
        _ => None,
    }
}

fn parse_signature(rest: &str, line_len: usize) -> Result<SignatureLine<'_>, Error> {
    if line_len > MAX_SIGNATURE_LINE_BYTES {
        return Err(refused("line"));
    }
    let mut fields = rest.split(' ');
    let (Some(chain), Some(scheme), Some(signature), None) =
        (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return Err(refused("fields"));
    };
    let chain = index(chain, MAX_CHAINS_PER_BODY)?;
    let hex = scheme.len() == 4
        && scheme
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let scheme = hex
        .then(|| u16::from_str_radix(scheme, 16).ok())
        .flatten()
        .ok_or_else(|| refused("scheme"))?;
    base64(signature, MAX_SIGNATURE_BYTES, "signature")?;
    Ok(SignatureLine::Signature {
        chain,
        scheme,
        signature,
    })
}

fn parse_chain(rest: &str, line_len: usize) -> Result<SignatureLine<'_>, Error> {
    if line_len > MAX_CHAIN_LINE_BYTES {
        return Err(refused("line"));
    }
    let (at, certs) = rest.split_once(' ').ok_or_else(|| refused("fields"))?;
    let index = index(at, MAX_CHAINS_PER_BODY)?;
    let mut n = 0;
    for cert in certs.split(' ') {
        n += 1;
        if n > MAX_CHAIN_CERTS {
            return Err(refused("certs"));
        }
        base64(cert, MAX_CERT_BYTES, "cert")?;
    }
    Ok(SignatureLine::Chain { index, certs })
}

/// Appends `# grid_signing_chain <index> <cert>...\n`.
pub fn write_chain_line(out: &mut Vec<u8>, index: usize, chain: &SigningChain) {
    out.extend_from_slice(b"# ");
    out.extend_from_slice(CHAIN_WORD.as_bytes());
    out.extend_from_slice(format!(" {index}").as_bytes());
    for cert in chain.certs() {
        out.push(b' ');
        b64::encode_into(out, cert);
    }
    out.push(b'\n');
}

/// Appends `# grid_batch_signature <chain> <scheme> <signature>\n`.
pub fn write_signature_line(out: &mut Vec<u8>, chain: usize, signature: &BatchSignature) {
    out.extend_from_slice(b"# ");
    out.extend_from_slice(SIGNATURE_WORD.as_bytes());
    out.extend_from_slice(format!(" {chain} {:04x} ", signature.scheme()).as_bytes());
    b64::encode_into(out, signature.signature());
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(line: &[u8]) -> &str {
        let s = std::str::from_utf8(line).unwrap();
        s.strip_prefix("# ").unwrap().strip_suffix('\n').unwrap()
    }

    fn chain(n: usize, size: usize) -> SigningChain {
        SigningChain::new(vec![vec![7u8; size]; n]).unwrap()
    }

    #[test]
    fn the_longest_lines_written_are_exactly_at_their_bounds_and_read_back() {
        let mut out = Vec::new();
        write_chain_line(
            &mut out,
            MAX_CHAINS_PER_BODY - 1,
            &chain(MAX_CHAIN_CERTS, MAX_CERT_BYTES),
        );
        assert_eq!(out.len(), MAX_CHAIN_LINE_BYTES);
        let Some(Ok(SignatureLine::Chain { index, certs })) = parse_signature_line(text(&out))
        else {
            panic!("a chain line")
        };
        assert_eq!(index, MAX_CHAINS_PER_BODY - 1);
        assert_eq!(
            SignatureLine::decode_chain(certs).unwrap(),
            chain(MAX_CHAIN_CERTS, MAX_CERT_BYTES)
        );

        let sig = BatchSignature::new(0x0804, vec![9; MAX_SIGNATURE_BYTES], chain(1, 1)).unwrap();
        let mut out = Vec::new();
        write_signature_line(&mut out, MAX_CHAINS_PER_BODY - 1, &sig);
        assert_eq!(out.len(), MAX_SIGNATURE_LINE_BYTES);
        assert_eq!(
            parse_signature_line(text(&out)),
            Some(Ok(SignatureLine::Signature {
                chain: MAX_CHAINS_PER_BODY - 1,
                scheme: 0x0804,
                signature: text(&out).rsplit(' ').next().unwrap(),
            }))
        );
    }

    #[test]
    fn one_byte_past_each_bound_is_refused() {
        // A certificate one byte too long.
        let mut out = Vec::new();
        let big = SigningChain(vec![vec![7u8; MAX_CERT_BYTES + 1]].into());
        write_chain_line(&mut out, 0, &big);
        assert!(matches!(parse_signature_line(text(&out)), Some(Err(_))));
        // One certificate too many.
        let mut out = Vec::new();
        write_chain_line(
            &mut out,
            0,
            &SigningChain(vec![vec![1u8]; MAX_CHAIN_CERTS + 1].into()),
        );
        assert!(matches!(parse_signature_line(text(&out)), Some(Err(_))));
        // A signature one byte too long.
        let long = BatchSignature {
            scheme: 0x0403,
            signature: vec![1; MAX_SIGNATURE_BYTES + 1],
            chain: chain(1, 1),
        };
        let mut out = Vec::new();
        write_signature_line(&mut out, 0, &long);
        assert!(matches!(parse_signature_line(text(&out)), Some(Err(_))));
        // An index at the bound.
        let ok = BatchSignature::new(0x0403, vec![1], chain(1, 1)).unwrap();
        let mut out = Vec::new();
        write_signature_line(&mut out, MAX_CHAINS_PER_BODY, &ok);
        assert!(matches!(parse_signature_line(text(&out)), Some(Err(_))));
    }

    #[test]
    fn ordinary_comments_are_not_signature_lines_and_odd_spellings_are_refused() {
        assert_eq!(parse_signature_line("free text"), None);
        assert_eq!(
            parse_signature_line("grid_batch_signatures 0 0403 AQ=="),
            None
        );
        for bad in [
            "grid_batch_signature",
            "grid_batch_signature 0 0403",
            "grid_batch_signature 0 0403 AQ== x",
            "grid_batch_signature 00 0403 AQ==",
            "grid_batch_signature 0 403 AQ==",
            "grid_batch_signature 0 04A3 AQ==",
            "grid_batch_signature 0 0403 AQ=",
            "grid_batch_signature 0 0403 AR==",
            "grid_batch_signature  0 0403 AQ==",
            "grid_batch_signature -1 0403 AQ==",
            "grid_signing_chain 0",
            "grid_signing_chain 0 ",
            "grid_signing_chain 0 AQ==  AQ==",
            "grid_signing_chain x AQ==",
        ] {
            assert!(matches!(parse_signature_line(bad), Some(Err(_))), "{bad}");
        }
        assert!(matches!(
            parse_signature_line("grid_signing_chain 0 AQ== AQ=="),
            Some(Ok(_))
        ));
    }
}
