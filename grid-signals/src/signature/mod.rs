//! Batch signatures: what lets a receiver believe a batch that a third site relayed.
//!
//! Under gossip a batch reaches a receiver through whichever member holds it, so the
//! mutual-TLS identity of the connection names the relay, not the publisher. Each batch
//! is therefore signed by the site that published it, with the key of its certificate,
//! and the receiver of a pull admits it only when the signature verifies against a
//! certificate the declared trust binds to the batch's `grid_site`.
//!
//! # What is signed
//!
//! [`write_message`] builds the signed bytes from what survives a relay: site, provider,
//! UID, epoch, sequence, generation, the number of rows, and each row's name, extra
//! labels (sorted, unescaped), value and stamp **relative to the metadata stamp**. A
//! relay re-dates a body (every stamp moved by one shift, `docs/wire.md`, *Ordering*),
//! which leaves every relative stamp, and so the signature, intact.
//!
//! # On the wire
//!
//! Two comment lines, so a reader that knows nothing of signatures (a Prometheus parser,
//! an older grid) reads the body as before:
//!
//! ```text
//! # grid_signing_chain 0 <base64 DER leaf> [<base64 DER intermediate>...]
//! # grid_batch_signature 0 0403 <base64 signature>
//! grid_provider_config_generation{...} 7 1700000002000
//! ...
//! ```
//!
//! A chain line is written once per body for each distinct chain (normally once per
//! site) under a body-local index; a signature line names its chain's index and its TLS
//! `SignatureScheme` (four lowercase hex digits) and belongs to the batch whose metadata
//! line comes next. Every length is bounded by a constant here.
//!
//! # I/O boundary
//!
//! No cryptography lives here. A daemon signs through [`BatchSigner`] and verifies
//! through [`SignatureCheck`]; this module frames, parses and builds the message.

mod b64;
mod line;
mod message;

use std::fmt;
use std::sync::Arc;

pub use line::{SignatureLine, parse_signature_line, write_chain_line, write_signature_line};
pub use message::{MESSAGE_CONTEXT, write_message};

pub(crate) use b64::decode as decode_base64;
pub(crate) use message::write_message_parts;

/// The word opening a signature comment line.
pub const SIGNATURE_WORD: &str = "grid_batch_signature";
/// The word opening a chain comment line.
pub const CHAIN_WORD: &str = "grid_signing_chain";
/// The largest signature, in bytes (an RSA-4096 signature; ECDSA P-256 takes about 72).
pub const MAX_SIGNATURE_BYTES: usize = 512;
/// The largest certificate of a signing chain, DER bytes.
pub const MAX_CERT_BYTES: usize = 4096;
/// The most certificates in a signing chain (a leaf and two intermediates).
pub const MAX_CHAIN_CERTS: usize = 3;
/// The most chain lines one body may define: chain indexes are below this.
pub const MAX_CHAINS_PER_BODY: usize = 1024;
/// Digits of the largest chain index.
const INDEX_DIGITS: usize = 4;
const _: () = assert!(MAX_CHAINS_PER_BODY <= 10_usize.pow(INDEX_DIGITS as u32));

/// The longest signature line, `# ` and `\n` included.
pub const MAX_SIGNATURE_LINE_BYTES: usize = "# ".len()
    + SIGNATURE_WORD.len()
    + 1
    + INDEX_DIGITS
    + 1
    + 4
    + 1
    + b64::encoded_len(MAX_SIGNATURE_BYTES)
    + 1;

/// The longest chain line, `# ` and `\n` included.
pub const MAX_CHAIN_LINE_BYTES: usize = "# ".len()
    + CHAIN_WORD.len()
    + 1
    + INDEX_DIGITS
    + MAX_CHAIN_CERTS * (1 + b64::encoded_len(MAX_CERT_BYTES))
    + 1;

/// A signing certificate chain: DER certificates, leaf first, 1 to [`MAX_CHAIN_CERTS`],
/// each 1 to [`MAX_CERT_BYTES`] bytes. Cheap to clone (shared).
#[derive(Clone, PartialEq, Eq)]
pub struct SigningChain(Arc<[Vec<u8>]>);

impl SigningChain {
    /// A chain of `certs` (DER, leaf first), when within the bounds.
    pub fn new(certs: Vec<Vec<u8>>) -> Option<Self> {
        let ok = (1..=MAX_CHAIN_CERTS).contains(&certs.len())
            && certs
                .iter()
                .all(|c| (1..=MAX_CERT_BYTES).contains(&c.len()));
        ok.then(|| Self(certs.into()))
    }

    /// The certificates, leaf first.
    pub fn certs(&self) -> &[Vec<u8>] {
        &self.0
    }

    /// The leaf: the certificate whose key signs.
    pub fn leaf(&self) -> &[u8] {
        &self.0[0]
    }

    /// Whether both are the one shared chain (no byte comparison).
    pub(crate) fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for SigningChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sizes: Vec<usize> = self.0.iter().map(Vec::len).collect();
        f.debug_tuple("SigningChain").field(&sizes).finish()
    }
}

/// One batch's signature: the scheme, the signature bytes and the chain whose leaf made
/// it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchSignature {
    scheme: u16,
    signature: Vec<u8>,
    chain: SigningChain,
}

impl BatchSignature {
    /// A signature of 1 to [`MAX_SIGNATURE_BYTES`] bytes under TLS `SignatureScheme`
    /// `scheme`, made by `chain`'s leaf.
    pub fn new(scheme: u16, signature: Vec<u8>, chain: SigningChain) -> Option<Self> {
        (1..=MAX_SIGNATURE_BYTES)
            .contains(&signature.len())
            .then_some(Self {
                scheme,
                signature,
                chain,
            })
    }

    /// The TLS `SignatureScheme` code point (`0x0403` is ECDSA P-256 with SHA-256).
    pub fn scheme(&self) -> u16 {
        self.scheme
    }

    /// The signature bytes.
    pub fn signature(&self) -> &[u8] {
        &self.signature
    }

    /// The chain whose leaf made it.
    pub fn chain(&self) -> &SigningChain {
        &self.chain
    }

    /// The same signature holding `chain`, an equal chain shared with others.
    pub(crate) fn with_chain(self, chain: SigningChain) -> Self {
        debug_assert_eq!(chain, self.chain);
        Self { chain, ..self }
    }
}

/// A batch's signature line as its body gave it, with the text of the chain line it
/// names when the body defined that index before it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SignatureRef<'a> {
    pub(crate) chain_index: usize,
    pub(crate) chain: Option<&'a str>,
    pub(crate) scheme: u16,
    pub(crate) signature: &'a str,
}

/// Signs this site's batches: the daemon's implementation holds the site certificate's
/// key (and follows its rotation).
pub trait BatchSigner: fmt::Debug + Send + Sync {
    /// The signature of `message` ([`write_message`]'s bytes) with the current key, and
    /// the chain that vouches for it; `None` when it cannot sign (no usable key).
    fn sign(&self, message: &[u8]) -> Option<BatchSignature>;
}

/// Verifies pulled batches under the declared trust: the daemon's implementation
/// checks pins or the CA chain and the SPIFFE name, and the signature with the leaf's
/// key.
pub trait SignatureCheck: fmt::Debug {
    /// Whether `chain` is, at `now_ms` (milliseconds since the Unix epoch), a currently
    /// valid certificate that the trust in force binds to site `site`.
    fn vouches(&self, site: &str, chain: &SigningChain, now_ms: u64) -> bool;

    /// Whether `signature`, under scheme `scheme`, is the signature of `message` by the
    /// key of `chain`'s leaf.
    fn verifies(&self, chain: &SigningChain, scheme: u16, message: &[u8], signature: &[u8])
    -> bool;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_holds_one_to_max_chain_certs_of_at_most_max_cert_bytes() {
        let cert = |n| vec![1u8; n];
        assert!(SigningChain::new(vec![]).is_none());
        assert!(SigningChain::new(vec![cert(MAX_CERT_BYTES)]).is_some());
        assert!(SigningChain::new(vec![cert(MAX_CERT_BYTES + 1)]).is_none());
        assert!(SigningChain::new(vec![cert(0)]).is_none());
        assert!(SigningChain::new(vec![cert(1); MAX_CHAIN_CERTS]).is_some());
        assert!(SigningChain::new(vec![cert(1); MAX_CHAIN_CERTS + 1]).is_none());
    }

    #[test]
    fn a_signature_holds_one_to_max_signature_bytes() {
        let chain = SigningChain::new(vec![vec![1]]).unwrap();
        assert!(BatchSignature::new(0x0403, vec![], chain.clone()).is_none());
        assert!(BatchSignature::new(0x0403, vec![0; MAX_SIGNATURE_BYTES], chain.clone()).is_some());
        assert!(BatchSignature::new(0x0403, vec![0; MAX_SIGNATURE_BYTES + 1], chain).is_none());
    }

    #[test]
    fn the_longest_lines_are_these_sizes() {
        // The per-batch and per-chain worst cases a pull answer's bound is argued from.
        assert_eq!(MAX_SIGNATURE_LINE_BYTES, 718);
        assert_eq!(MAX_CHAIN_LINE_BYTES, 16_421);
    }
}

/// A stand-in for the daemon's cryptography in the pure crate's tests: a site's
/// "certificate" is the bytes `cert:<site>:<n>`, and a "signature" is a keyed hash of
/// the message by that certificate. It binds a signature to one chain exactly as a real
/// signature does, which is all the store's rules depend on.
#[cfg(test)]
pub(crate) mod fake {
    use std::hash::{DefaultHasher, Hasher};

    use super::{BatchSignature, BatchSigner, SignatureCheck, SigningChain};

    /// The scheme the fake signs under.
    pub(crate) const SCHEME: u16 = 0x0403;

    /// Site `site`'s `n`th certificate.
    pub(crate) fn chain(site: &str, n: u32) -> SigningChain {
        SigningChain::new(vec![format!("cert:{site}:{n}").into_bytes()]).unwrap()
    }

    fn mac(leaf: &[u8], message: &[u8]) -> Vec<u8> {
        let mut h = DefaultHasher::new();
        h.write(leaf);
        h.write(message);
        h.finish().to_be_bytes().to_vec()
    }

    /// Signs as one certificate.
    #[derive(Debug)]
    pub(crate) struct Signer(pub(crate) SigningChain);

    impl BatchSigner for Signer {
        fn sign(&self, message: &[u8]) -> Option<BatchSignature> {
            BatchSignature::new(SCHEME, mac(self.0.leaf(), message), self.0.clone())
        }
    }

    /// Trusts, for each site, its certificates numbered below `valid` (a rotation keeps
    /// the previous one valid).
    #[derive(Debug)]
    pub(crate) struct Check {
        pub(crate) valid: u32,
    }

    impl SignatureCheck for Check {
        fn vouches(&self, site: &str, chain: &SigningChain, _now_ms: u64) -> bool {
            (0..self.valid).any(|n| chain.leaf() == super::fake::chain(site, n).leaf())
        }

        fn verifies(&self, chain: &SigningChain, scheme: u16, msg: &[u8], sig: &[u8]) -> bool {
            scheme == SCHEME && sig == mac(chain.leaf(), msg)
        }
    }
}
