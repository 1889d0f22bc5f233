//! Certificates for a local grid, minted with rcgen at start and written as PEM files.
//!
//! One CA signs one certificate per site. Each certificate is both the site operator's
//! (server and peer client) and its gateway's (client toward the operator), as in a real
//! deployment: it carries `spiffe://<domain>/site/<name>` as a URI SAN for the SPIFFE
//! trust mode, and `localhost` / `127.0.0.1` so a gateway can verify its operator by name
//! on loopback. Nothing here is meant for anything but a throwaway loopback grid.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::Error;

/// The SPIFFE trust domain of every local grid.
pub const TRUST_DOMAIN: &str = "grid.local";

/// The DNS name every minted site certificate carries; gateways verify their operator
/// under it.
pub const LOOPBACK_NAME: &str = "localhost";

/// A throwaway certificate authority.
pub struct LocalCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl std::fmt::Debug for LocalCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCa").finish_non_exhaustive()
    }
}

/// Where one site's PEM files were written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteFiles {
    /// The site certificate (leaf only).
    pub cert: PathBuf,
    /// Its PKCS#8 private key.
    pub key: PathBuf,
    /// The CA certificate every site chains to.
    pub ca: PathBuf,
}

impl LocalCa {
    /// A fresh self-signed CA named `name`.
    pub fn new(name: &str) -> Result<Self, Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Self {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// PEM of the CA certificate.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// Mints site `site`'s certificate and writes `<site>.crt`, `<site>.key` and `ca.crt`
    /// into `dir`.
    pub fn write_site(&self, dir: &Path, site: &str) -> Result<SiteFiles, Error> {
        let mut params =
            CertificateParams::new(vec![LOOPBACK_NAME.to_owned(), "127.0.0.1".to_owned()])?;
        params.distinguished_name.push(DnType::CommonName, site);
        let spiffe = format!("spiffe://{TRUST_DOMAIN}/site/{site}");
        params
            .subject_alt_names
            .push(SanType::URI(spiffe.as_str().try_into()?));
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let files = SiteFiles {
            cert: dir.join(format!("{site}.crt")),
            key: dir.join(format!("{site}.key")),
            ca: dir.join("ca.crt"),
        };
        write(&files.cert, cert.pem().as_bytes())?;
        write(&files.key, key.serialize_pem().as_bytes())?;
        write(&files.ca, self.pem.as_bytes())?;
        Ok(files)
    }
}

/// Writes `bytes` to `path`, naming the file in the error.
fn write(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    std::fs::write(path, bytes).map_err(|source| Error::Write {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_site_files_are_pem_and_name_the_site() {
        let dir = tempfile::tempdir().unwrap();
        let ca = LocalCa::new("test-ca").unwrap();
        let files = ca.write_site(dir.path(), "east").unwrap();
        let cert = std::fs::read_to_string(&files.cert).unwrap();
        let key = std::fs::read_to_string(&files.key).unwrap();
        assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"), "{cert}");
        assert!(key.contains("PRIVATE KEY"), "{key}");
        assert_eq!(std::fs::read_to_string(&files.ca).unwrap(), ca.pem());
        assert_eq!(files.cert, dir.path().join("east.crt"));
    }
}
