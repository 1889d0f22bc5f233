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

use super::{provider, read_roots};
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
