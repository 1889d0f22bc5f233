//! The site's TLS material read from PEM files, and the one crypto provider and ALPN
//! protocols every configuration is built on.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::Error;

/// ALPN protocol of HTTP/1.1: what peers poll with and what every signals listener
/// accepts, so an HTTP/1.1-only client (a peer, `curl --http1.1`) is always served.
pub const ALPN_HTTP11: &[u8] = b"http/1.1";

/// ALPN protocol of HTTP/2, which the signals listener prefers: the local gateway holds
/// one connection to its operator and multiplexes its polls and feedback POSTs over it.
pub const ALPN_H2: &[u8] = b"h2";

/// The one crypto provider every configuration is built on, made once per process.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    Arc::clone(PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())))
}

/// The site's certificate chain, key and trust anchors.
#[derive(Debug)]
pub struct TlsMaterial {
    /// Leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's private key.
    pub key: PrivateKeyDer<'static>,
    /// CA certificates; empty when none were configured.
    pub roots: RootCertStore,
}

impl Clone for TlsMaterial {
    fn clone(&self) -> Self {
        Self {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
            roots: self.roots.clone(),
        }
    }
}

impl TlsMaterial {
    /// Reads the PEM files: the chain (leaf first), its key and, when given, a CA bundle.
    pub fn load(cert: &Path, key: &Path, ca: Option<&Path>) -> Result<Self, Error> {
        let chain = read_certs(cert)?;
        let key = read_key(key)?;
        let roots = match ca {
            Some(ca) => read_roots(ca)?,
            None => RootCertStore::empty(),
        };
        Ok(Self { chain, key, roots })
    }

    /// The site's own leaf certificate.
    pub fn leaf(&self) -> &CertificateDer<'static> {
        &self.chain[0]
    }
}

/// Reads a CA bundle into a root store.
pub fn read_roots(path: &Path) -> Result<RootCertStore, Error> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path)? {
        roots.add(cert).map_err(|e| Error::TlsMaterial {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// Reads a PEM private key (PKCS#8, PKCS#1 or SEC1).
pub(super) fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, Error> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| Error::TlsMaterial {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Reads a PEM certificate chain; at least one certificate.
pub(super) fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let bad = |reason: String| Error::TlsMaterial {
        path: path.to_path_buf(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no CERTIFICATE block".into()));
    }
    Ok(certs)
}
