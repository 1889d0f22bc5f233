//! The gateway's TLS identity: its site certificate and the CA it trusts, turned into the
//! rustls client configuration used toward the operator and toward remote sites.
//!
//! The gateway is only ever a TLS client. It presents the site's own certificate (the
//! operator admits feedback only from its own site's identity; remote sites admit the
//! grid's gateways) and verifies the peer against the configured CA, never the system
//! roots: a grid is a closed trust domain.

use std::path::Path;
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::Error;
use crate::config::TlsFiles;

/// The PEM material, read once and shared by every client built from it.
#[derive(Debug)]
pub struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    roots: Arc<rustls::RootCertStore>,
}

impl Identity {
    /// Reads the certificate chain, key and CA bundle named in the config.
    pub fn load(files: &TlsFiles) -> Result<Self, Error> {
        let chain = read_certs(&files.cert)?;
        let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| pem_err(&files.key, &e))?;
        let mut roots = rustls::RootCertStore::empty();
        for ca in read_certs(&files.ca)? {
            roots.add(ca).map_err(|e| Error::Pem {
                path: files.ca.clone(),
                reason: e.to_string(),
            })?;
        }
        Ok(Self {
            chain,
            key,
            roots: Arc::new(roots),
        })
    }

    /// A client configuration that presents this identity and trusts only the CA; `what`
    /// names it in errors (`"operator"`, `"sites"`).
    pub fn client_config(&self, what: &'static str) -> Result<ClientConfig, Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Tls {
                what,
                reason: e.to_string(),
            })?
            .with_root_certificates(Arc::clone(&self.roots))
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| Error::Tls {
                what,
                reason: e.to_string(),
            })
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_err(path, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(path, &e))?;
    if certs.is_empty() {
        return Err(Error::Pem {
            path: path.to_owned(),
            reason: "no CERTIFICATE block".to_owned(),
        });
    }
    Ok(certs)
}

fn pem_err(path: &Path, e: &rustls::pki_types::pem::Error) -> Error {
    match e {
        rustls::pki_types::pem::Error::Io(io) => Error::Read {
            path: path.to_owned(),
            source: std::io::Error::new(io.kind(), io.to_string()),
        },
        other => Error::Pem {
            path: path.to_owned(),
            reason: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_is_named_in_the_error() {
        let files = TlsFiles {
            cert: "/nonexistent/gw.crt".into(),
            key: "/nonexistent/gw.key".into(),
            ca: "/nonexistent/ca.crt".into(),
        };
        let err = Identity::load(&files).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/gw.crt"), "{err}");
    }

    #[test]
    fn file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("empty.pem");
        std::fs::write(&p, "not pem\n").unwrap();
        let files = TlsFiles {
            cert: p.clone(),
            key: p.clone(),
            ca: p,
        };
        assert!(matches!(Identity::load(&files), Err(Error::Pem { .. })));
    }
}
