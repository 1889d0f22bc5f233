//! A CA bundle followed by its content: a Kubernetes Secret update rewrites the mounted
//! file in place (same path, maybe the same modification time), so a change is told by
//! the SHA-256 of the bytes, never by the path or the mtime.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::material::{provider, read_roots};
use crate::Error;

/// The SHA-256 of a file's bytes: what tells a CA bundle rewritten in place.
pub fn content_digest(path: &Path) -> Result<[u8; 32], Error> {
    let bytes = std::fs::read(path).map_err(|e| Error::TlsMaterial {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
    let mut out = [0; 32];
    out.copy_from_slice(digest.as_ref());
    Ok(out)
}

/// A CA bundle file and the roots it held when last read whole.
#[derive(Debug)]
pub struct CaBundle {
    path: PathBuf,
    digest: Mutex<[u8; 32]>,
    roots: ArcSwap<RootCertStore>,
}

impl CaBundle {
    /// Reads the bundle at `path`.
    ///
    /// # Errors
    ///
    /// The file is unreadable or holds no certificate.
    pub fn load(path: &Path) -> Result<Arc<Self>, Error> {
        let digest = content_digest(path)?;
        let roots = read_roots(path)?;
        Ok(Arc::new(Self {
            path: path.to_path_buf(),
            digest: Mutex::new(digest),
            roots: ArcSwap::from_pointee(roots),
        }))
    }

    /// The roots in force.
    pub fn roots(&self) -> Arc<RootCertStore> {
        self.roots.load_full()
    }

    /// Re-reads the file: `Ok(Some(roots))` when its bytes changed and it holds a valid
    /// bundle, which is in force from now on; `Ok(None)` when the bytes are the ones in
    /// force.
    ///
    /// # Errors
    ///
    /// The changed file is unreadable or holds no valid certificate (half written): the
    /// roots in force are kept, and the next check reads it again.
    pub fn reload(&self) -> Result<Option<Arc<RootCertStore>>, Error> {
        let digest = content_digest(&self.path)?;
        let mut held = self.digest.lock().unwrap_or_else(PoisonError::into_inner);
        if *held == digest {
            return Ok(None);
        }
        let roots = Arc::new(read_roots(&self.path)?);
        // The bytes parsed may be newer than the digest taken; the next check then sees
        // a digest it does not hold and reads them again, which changes nothing.
        *held = digest;
        self.roots.store(Arc::clone(&roots));
        Ok(Some(roots))
    }
}

/// A server verified by chain to the bundle's roots in force at each handshake, and by
/// the name dialled.
#[derive(Debug)]
struct FollowingVerifier {
    bundle: Arc<CaBundle>,
    /// The verifier of the roots last seen.
    built: Mutex<(Arc<RootCertStore>, Arc<WebPkiServerVerifier>)>,
}

impl FollowingVerifier {
    fn new(bundle: Arc<CaBundle>) -> Result<Self, rustls::client::VerifierBuilderError> {
        let roots = bundle.roots();
        let verifier = Self::build(&roots)?;
        Ok(Self {
            bundle,
            built: Mutex::new((roots, verifier)),
        })
    }

    fn build(
        roots: &Arc<RootCertStore>,
    ) -> Result<Arc<WebPkiServerVerifier>, rustls::client::VerifierBuilderError> {
        WebPkiServerVerifier::builder_with_provider(Arc::clone(roots), provider()).build()
    }

    fn current(&self) -> Arc<WebPkiServerVerifier> {
        let roots = self.bundle.roots();
        let mut built = self.built.lock().unwrap_or_else(PoisonError::into_inner);
        if !Arc::ptr_eq(&built.0, &roots)
            && let Ok(verifier) = Self::build(&roots)
        {
            *built = (roots, verifier);
        }
        Arc::clone(&built.1)
    }
}

impl ServerCertVerifier for FollowingVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.current().verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current().supported_verify_schemes()
    }
}

/// [`super::webpki_client_presenting`] whose roots follow `bundle`: a CA rotated in
/// place and reloaded ([`CaBundle::reload`]) verifies the next handshake.
pub fn webpki_client_following(
    bundle: Arc<CaBundle>,
    slot: Option<Arc<super::CertSlot>>,
    context: &'static str,
) -> Result<rustls::ClientConfig, Error> {
    let verifier = FollowingVerifier::new(bundle).map_err(|e| Error::Tls {
        context,
        source: rustls::Error::General(e.to_string()),
    })?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| Error::Tls { context, source })?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier));
    Ok(match slot {
        Some(slot) => builder.with_client_cert_resolver(slot),
        None => builder.with_no_client_auth(),
    })
}

/// Re-reads `bundle` every `every` until the task is dropped; a change is in force for
/// every client following the bundle ([`webpki_client_following`]) and, in SPIFFE mode,
/// for `trust`. Each change is logged at info; a changed file that does not read (half
/// written, not PEM) at error once, the roots in force kept.
pub async fn watch_ca(
    bundle: Arc<CaBundle>,
    trust: Option<Arc<super::Trust>>,
    every: std::time::Duration,
) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut refused: Option<String> = None;
    loop {
        ticker.tick().await;
        let b = Arc::clone(&bundle);
        let failure = match tokio::task::spawn_blocking(move || b.reload()).await {
            Ok(Ok(None)) => None,
            Ok(Ok(Some(roots))) => {
                let replaced = trust
                    .as_ref()
                    .map_or(Ok(()), |t| t.replace_roots((*roots).clone()));
                match replaced {
                    Ok(()) => {
                        tracing::info!(path = %bundle.path.display(), "the CA bundle changed; in force from the next handshake");
                        None
                    }
                    Err(e) => Some(e),
                }
            }
            Ok(Err(e)) => Some(e.to_string()),
            Err(e) => Some(e.to_string()),
        };
        if failure.is_some() && failure != refused {
            tracing::error!(
                error = failure.as_deref().unwrap_or_default(),
                "the changed CA bundle was refused; the previous roots stay in force"
            );
        }
        refused = failure;
    }
}

#[cfg(test)]
mod tests {
    use grid_kit::pki::{Ca, rewrite_keeping_mtime};

    use super::*;

    /// Whether a client following `bundle` completes a handshake with a server
    /// presenting `cert` for `localhost`.
    async fn accepts(bundle: &Arc<CaBundle>, cert: &grid_kit::pki::SiteCert) -> bool {
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.clone()], cert.key())
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let _ = tokio_rustls::TlsAcceptor::from(Arc::new(server))
                .accept(tcp)
                .await;
        });
        let client = webpki_client_following(Arc::clone(bundle), None, "test").unwrap();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let ok = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(name, tcp)
            .await
            .is_ok();
        let _ = served.await;
        ok
    }

    #[tokio::test]
    async fn a_client_following_a_bundle_accepts_a_server_of_the_new_ca_once_the_bundle_is_rewritten_in_place()
     {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        let (old, new) = (Ca::new("old"), Ca::new("new"));
        std::fs::write(&path, old.pem()).unwrap();
        let bundle = CaBundle::load(&path).unwrap();
        let server = new.site("grid.test", "a");
        assert!(!accepts(&bundle, &server).await);
        rewrite_keeping_mtime(&path, &format!("{}{}", old.pem(), new.pem()));
        assert!(bundle.reload().unwrap().is_some());
        assert!(accepts(&bundle, &server).await);
        assert!(accepts(&bundle, &old.site("grid.test", "a")).await);
    }

    #[test]
    fn a_spiffe_trust_takes_new_roots_and_a_pin_trust_has_none_to_take() {
        let (old, new) = (Ca::new("old"), Ca::new("new"));
        let mut roots = RootCertStore::empty();
        roots.add(old.cert()).unwrap();
        let trust = super::super::Trust::spiffe("a", "grid.test", roots);
        let mut next = RootCertStore::empty();
        next.add(new.cert()).unwrap();
        trust.replace_roots(next).unwrap();
        let super::super::identity::TrustKind::Spiffe { roots, domain, .. } = &*trust.kind() else {
            panic!("still SPIFFE")
        };
        assert_eq!((roots.len(), domain.as_str()), (1, "grid.test"));
        let own = old.site("grid.test", "a");
        let pin = super::super::Trust::pin("a", &own.cert, std::iter::empty()).unwrap();
        pin.replace_roots(RootCertStore::empty()).unwrap();
        assert!(pin.is_pin());
    }

    #[test]
    fn a_bundle_rewritten_in_place_with_its_mtime_kept_is_noticed_by_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        let (old, new) = (Ca::new("old"), Ca::new("new"));
        std::fs::write(&path, old.pem()).unwrap();
        let bundle = CaBundle::load(&path).unwrap();
        assert!(bundle.reload().unwrap().is_none());
        rewrite_keeping_mtime(&path, &new.pem());
        let roots = bundle.reload().unwrap().expect("noticed");
        assert_eq!(roots.len(), 1);
        assert!(Arc::ptr_eq(&roots, &bundle.roots()));
        assert!(bundle.reload().unwrap().is_none(), "noticed once");
        // A half-written file keeps the roots in force and is read again next time.
        rewrite_keeping_mtime(&path, "-----BEGIN CERT");
        assert!(bundle.reload().is_err());
        assert!(Arc::ptr_eq(&roots, &bundle.roots()));
    }
}
