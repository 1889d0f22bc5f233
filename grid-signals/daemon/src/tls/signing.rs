//! Batch signatures with the site certificate (gossip mode): the signer behind
//! grid-signals' `BatchSigner` and the check behind its `SignatureCheck`.
//!
//! A site signs each batch it publishes with its certificate's key and sends the
//! certificate chain with it; a receiver believes a pulled batch only when that chain is
//! one the trust in force binds to the batch's site (pin mode: the leaf is pinned for
//! the site and currently valid; SPIFFE mode: it chains to the CA and its SPIFFE ID
//! names the site) and the signature verifies with the leaf's key. Since the chain
//! travels with the batch, a batch signed before a rotation keeps verifying while the
//! certificate that signed it is trusted and valid.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use grid_signals::signature::{BatchSignature, BatchSigner, SignatureCheck, SigningChain};
use rustls::SignatureScheme;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::server::ParsedCertificate;
use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, UnixTime};

use super::identity::TrustKind;
use super::identity::{Identity, Trust};
use super::material::provider;
use super::rotation::CertSlot;

/// The schemes a site signs with, in preference order: the one its key type supports
/// is used (TLS 1.3's schemes, so an ECDSA key signs on its own curve).
pub const SIGNING_SCHEMES: [SignatureScheme; 5] = [
    SignatureScheme::ECDSA_NISTP256_SHA256,
    SignatureScheme::ECDSA_NISTP384_SHA384,
    SignatureScheme::ED25519,
    SignatureScheme::RSA_PSS_SHA256,
    SignatureScheme::RSA_PSS_SHA512,
];

/// Signs with whatever the site's [`CertSlot`] presents now, so a rotated certificate
/// signs the next batch.
#[derive(Debug)]
pub struct SiteSigner {
    slot: Arc<CertSlot>,
    /// The chain of the pair last signed with, shared by every signature it made.
    chain: Mutex<Option<(Arc<CertifiedKey>, SigningChain)>>,
}

impl SiteSigner {
    /// A signer presenting `slot`'s pair.
    pub fn new(slot: Arc<CertSlot>) -> Self {
        Self {
            slot,
            chain: Mutex::new(None),
        }
    }

    fn chain_of(&self, certified: &Arc<CertifiedKey>) -> Option<SigningChain> {
        let mut cached = self.chain.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((key, chain)) = &*cached
            && Arc::ptr_eq(key, certified)
        {
            return Some(chain.clone());
        }
        let chain = SigningChain::new(certified.cert.iter().map(|c| c.to_vec()).collect())?;
        *cached = Some((Arc::clone(certified), chain.clone()));
        Some(chain)
    }

    /// Whether the pair presented now can sign (a supported key, a chain within
    /// grid-signals' bounds): what a daemon checks at start.
    pub fn can_sign(&self) -> bool {
        self.sign(b"grid signing probe").is_some()
    }
}

impl BatchSigner for SiteSigner {
    fn sign(&self, message: &[u8]) -> Option<BatchSignature> {
        let certified = self.slot.certified();
        let signer = certified.key.choose_scheme(&SIGNING_SCHEMES)?;
        let signature = signer.sign(message).ok()?;
        let chain = self.chain_of(&certified)?;
        BatchSignature::new(u16::from(signer.scheme()), signature, chain)
    }
}

/// Verifies pulled batches under the trust in force at each call (a trust replaced
/// live applies to the next batch).
#[derive(Debug)]
pub struct TrustCheck {
    trust: Arc<Trust>,
    algs: WebPkiSupportedAlgorithms,
}

impl TrustCheck {
    /// A check under `trust`.
    pub fn new(trust: Arc<Trust>) -> Self {
        Self {
            trust,
            algs: provider().signature_verification_algorithms,
        }
    }
}

impl SignatureCheck for TrustCheck {
    fn vouches(&self, site: &str, chain: &SigningChain, now_ms: u64) -> bool {
        let now = UnixTime::since_unix_epoch(Duration::from_millis(now_ms));
        let leaf = CertificateDer::from(chain.leaf());
        let trusted = match &*self.trust.kind() {
            TrustKind::Spiffe { roots, .. } => {
                let intermediates: Vec<CertificateDer<'_>> = chain.certs()[1..]
                    .iter()
                    .map(|c| CertificateDer::from(c.as_slice()))
                    .collect();
                ParsedCertificate::try_from(&leaf).is_ok_and(|parsed| {
                    rustls::client::verify_server_cert_signed_by_trust_anchor(
                        &parsed,
                        roots,
                        &intermediates,
                        now,
                        self.algs.all,
                    )
                    .is_ok()
                })
            }
            TrustKind::Pin { .. } => Trust::check_validity(&leaf, now).is_ok(),
        };
        trusted
            && match self.trust.classify(&leaf) {
                Some(Identity::Peer(name)) => name == site,
                Some(Identity::Local) => self.trust.site() == site,
                None => false,
            }
    }

    fn verifies(
        &self,
        chain: &SigningChain,
        scheme: u16,
        message: &[u8],
        signature: &[u8],
    ) -> bool {
        let scheme = SignatureScheme::from(scheme);
        let leaf = CertificateDer::from(chain.leaf());
        let Ok(cert) = webpki::EndEntityCert::try_from(&leaf) else {
            return false;
        };
        self.algs
            .mapping
            .iter()
            .filter(|(s, _)| *s == scheme)
            .flat_map(|(_, algs)| algs.iter())
            .any(|alg| cert.verify_signature(*alg, message, signature).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use grid_kit::pki::{Ca, Mint, SiteCert};
    use grid_signals::batch::{Batch, BatchMeta, Fence, Row};
    use grid_signals::store::{DropReason, IngestReport, Sender, Store, StoreConfig};
    use rustls::RootCertStore;

    use super::*;
    use crate::tls::{Fingerprint, TlsMaterial};

    const T0: u64 = 1_700_000_000_000;
    const DOMAIN: &str = "grid.test";

    /// Now, for certificates rcgen minted valid from today.
    fn now() -> u64 {
        UnixTime::now().as_secs() * 1000
    }

    fn signer(cert: &SiteCert) -> SiteSigner {
        let material = TlsMaterial {
            chain: vec![cert.cert.clone()],
            key: cert.key(),
            roots: RootCertStore::empty(),
        };
        SiteSigner::new(CertSlot::fixed(&material).unwrap())
    }

    fn b_batch(at: u64, seq: u64, ready: f64) -> Batch {
        b_batch_in(at, at, seq, ready)
    }

    /// b's batch of epoch `epoch`, stamped `at`.
    fn b_batch_in(epoch: u64, at: u64, seq: u64, ready: f64) -> Batch {
        let meta = BatchMeta::new("b", "m", "u1", Fence::new(epoch, seq), 2, 1, at).unwrap();
        let rows = vec![
            Row::new("grid_provider_ready", vec![], ready, at).unwrap(),
            Row::new("grid_provider_in_flight_requests", vec![], 3.0, at - 10).unwrap(),
        ];
        Batch::new(meta, rows)
    }

    /// The answer member `c` gives a pull of b/m, holding `batch` as `by` signed it.
    fn answer(batch: Batch, by: &SiteCert, at: u64) -> Vec<u8> {
        let mut c = Store::new(StoreConfig::default());
        c.ingest_batch(batch, Sender::Local, at, at, &mut IngestReport::default());
        assert!(c.sign_held("b", "m", &signer(by)));
        let mut out = Vec::new();
        c.encode_pulled(&[("b", "m")], at, at, &mut out);
        out
    }

    fn pull(into: &mut Store, body: &[u8], check: &TrustCheck, at: u64) -> IngestReport {
        into.ingest(
            body,
            Sender::Pulled {
                registers: &[("b", "m")],
                check,
            },
            at,
            at,
        )
    }

    fn spiffe(ca: &Ca) -> TrustCheck {
        let mut roots = RootCertStore::empty();
        roots.add(ca.cert()).unwrap();
        TrustCheck::new(Arc::new(Trust::spiffe("a", DOMAIN, roots)))
    }

    fn pins(own: &SiteCert, peers: &[(&str, &[&SiteCert])]) -> TrustCheck {
        let peers = peers.iter().map(|(name, certs)| {
            let fps = certs.iter().map(|c| Fingerprint::of_der(&c.cert)).collect();
            ((*name).to_owned(), fps)
        });
        TrustCheck::new(Arc::new(Trust::pin("a", &own.cert, peers).unwrap()))
    }

    fn admitted(r: &IngestReport) -> bool {
        r.batches_stored == 1 && r.dropped.total() == 0
    }

    #[test]
    fn under_spiffe_b_s_own_signature_passes_and_a_member_forging_b_is_refused_without_a_fence() {
        let ca = Ca::new("ca");
        let (b, c) = (ca.site(DOMAIN, "b"), ca.site(DOMAIN, "c"));
        let check = spiffe(&ca);
        let at = now();
        let mut a = Store::new(StoreConfig::default());
        // c forges b's readiness, an epoch nine minutes ahead, signed with its own key.
        let forged = b_batch_in(at + 9 * 60_000, at, 0, 0.0);
        let r = pull(&mut a, &answer(forged, &c, at), &check, at);
        assert_eq!(r.dropped.get(DropReason::Signature), 3);
        assert!(a.entry("b", "m").is_none(), "no fence retained");
        let r = pull(&mut a, &answer(b_batch(at, 1, 1.0), &b, at), &check, at);
        assert!(admitted(&r), "{r:?}");
    }

    #[test]
    fn under_pin_only_the_pinned_certificate_of_b_vouches_for_b() {
        let ca = Ca::new("ca");
        let (own, b, c) = (
            ca.site(DOMAIN, "a"),
            ca.site(DOMAIN, "b"),
            ca.site(DOMAIN, "c"),
        );
        let check = pins(&own, &[("b", &[&b]), ("c", &[&c])]);
        let at = now();
        let mut a = Store::new(StoreConfig::default());
        let r = pull(&mut a, &answer(b_batch(at, 1, 0.0), &c, at), &check, at);
        assert_eq!(r.dropped.get(DropReason::Signature), 3);
        // A certificate the CA issued for b but nobody pinned.
        let unpinned = ca.site(DOMAIN, "b");
        let r = pull(
            &mut a,
            &answer(b_batch(at, 1, 0.0), &unpinned, at),
            &check,
            at,
        );
        assert_eq!(r.dropped.get(DropReason::Signature), 3);
        let r = pull(&mut a, &answer(b_batch(at, 1, 1.0), &b, at), &check, at);
        assert!(admitted(&r), "{r:?}");
    }

    #[test]
    fn a_tampered_row_fails_the_real_signature() {
        let ca = Ca::new("ca");
        let b = ca.site(DOMAIN, "b");
        let at = now();
        let text = String::from_utf8(answer(b_batch(at, 1, 1.0), &b, at)).unwrap();
        let tampered = text.replacen("grid_site=\"b\"} 1 ", "grid_site=\"b\"} 0 ", 1);
        assert_ne!(text, tampered);
        let mut a = Store::new(StoreConfig::default());
        let r = pull(&mut a, tampered.as_bytes(), &spiffe(&ca), at);
        assert_eq!(r.dropped.get(DropReason::Signature), 3);
    }

    #[test]
    fn another_ca_another_domain_an_expired_certificate_or_a_foreign_signature_does_not_pass() {
        let ca = Ca::new("ca");
        let check = spiffe(&ca);
        let at = now();
        let other_ca = Ca::new("other").site(DOMAIN, "b");
        let other_domain = ca.site("elsewhere.test", "b");
        let expired = ca.mint(&Mint {
            spiffe: Some(format!("spiffe://{DOMAIN}/site/b")),
            expired: true,
            cn: "b",
        });
        for cert in [&other_ca, &other_domain, &expired] {
            let mut a = Store::new(StoreConfig::default());
            let r = pull(&mut a, &answer(b_batch(at, 1, 1.0), cert, at), &check, at);
            assert_eq!(r.dropped.get(DropReason::Signature), 3);
        }
        // b's chain with a signature c made over the same bytes.
        let b = ca.site(DOMAIN, "b");
        let c = ca.site(DOMAIN, "c");
        let genuine = String::from_utf8(answer(b_batch(at, 1, 1.0), &b, at)).unwrap();
        let by_c = String::from_utf8(answer(b_batch(at, 1, 1.0), &c, at)).unwrap();
        let sig_of = |t: &str| t.lines().nth(1).unwrap().to_owned();
        let spliced = genuine.replacen(&sig_of(&genuine), &sig_of(&by_c), 1);
        let mut a = Store::new(StoreConfig::default());
        let r = pull(&mut a, spliced.as_bytes(), &check, at);
        assert_eq!(r.dropped.get(DropReason::Signature), 3);
    }

    #[test]
    fn a_batch_signed_with_the_previous_certificate_verifies_while_that_certificate_is_trusted() {
        let ca = Ca::new("ca");
        let own = ca.site(DOMAIN, "a");
        let (old, new) = (ca.site(DOMAIN, "b"), ca.site(DOMAIN, "b"));
        let at = now();
        // SPIFFE: both chain to the CA and name b, so both verify until the old expires.
        for (seq, cert) in [(1, &old), (2, &new)] {
            let mut a = Store::new(StoreConfig::default());
            let r = pull(
                &mut a,
                &answer(b_batch(at, seq, 1.0), cert, at),
                &spiffe(&ca),
                at,
            );
            assert!(admitted(&r), "{r:?}");
        }
        // Pin: while both are listed for b (the documented rotation), both verify; once
        // the old pin is removed, what the old key signed no longer does.
        let both = pins(&own, &[("b", &[&old, &new])]);
        let only_new = pins(&own, &[("b", &[&new])]);
        let mut a = Store::new(StoreConfig::default());
        let r = pull(&mut a, &answer(b_batch(at, 1, 1.0), &old, at), &both, at);
        assert!(admitted(&r), "{r:?}");
        let mut a = Store::new(StoreConfig::default());
        let r = pull(
            &mut a,
            &answer(b_batch(at, 1, 1.0), &old, at),
            &only_new,
            at,
        );
        assert_eq!(r.dropped.get(DropReason::Signature), 3);
    }

    #[test]
    fn a_p256_signature_line_is_at_most_128_bytes_and_the_chain_line_comes_once_per_body() {
        let ca = Ca::new("ca");
        let b = ca.site(DOMAIN, "b");
        let at = T0;
        let mut c = Store::new(StoreConfig::default());
        for p in ["m", "n"] {
            let meta = BatchMeta::new("b", p, "u1", Fence::new(at, 1), 1, 1, at).unwrap();
            let rows = vec![Row::new("grid_provider_ready", vec![], 1.0, at).unwrap()];
            c.ingest_batch(
                Batch::new(meta, rows),
                Sender::Local,
                at,
                at,
                &mut IngestReport::default(),
            );
            assert!(c.sign_held("b", p, &signer(&b)));
        }
        let mut signed = Vec::new();
        c.encode_pulled(&[("b", "m"), ("b", "n")], at, at, &mut signed);
        let text = String::from_utf8(signed).unwrap();
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("# ")).collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("# grid_signing_chain 0 "));
        let cert_b64 = b.cert.len().div_ceil(3) * 4;
        assert_eq!(
            lines[0].len() + 1,
            "# grid_signing_chain 0 ".len() + cert_b64 + 1
        );
        for sig in &lines[1..] {
            // An ECDSA P-256 signature is 70 to 72 DER bytes: 96 base64 characters.
            assert!(sig.starts_with("# grid_batch_signature 0 0403 "), "{sig}");
            assert!(sig.len() < 128, "{} bytes: {sig}", sig.len());
        }
    }
}
