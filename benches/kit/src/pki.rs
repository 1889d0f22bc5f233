//! The one test PKI: certificates minted with rcgen for a loopback grid, its daemons'
//! tests and the demo.
//!
//! One [`Ca`] signs every leaf. A site certificate ([`Ca::site`]) is both the site
//! operator's (server and peer client) and its gateway's (client toward the operator), as
//! in a real deployment: it carries `spiffe://<domain>/site/<name>` as a URI SAN for the
//! SPIFFE trust mode, and `localhost` / `127.0.0.1` so a gateway can verify its operator
//! by name on loopback. [`Ca::mint`] makes the odd ones tests need (no SPIFFE ID, expired,
//! other names). Nothing here is meant for anything but a throwaway loopback grid.
//!
//! The constructors that tests call panic on an rcgen failure (a test failure either
//! way); the ones the demo calls ([`Ca::try_new`], [`Ca::write_site`]) return it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, date_time_ymd,
};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::Error;

/// The SPIFFE trust domain of every local grid.
pub const TRUST_DOMAIN: &str = "grid.local";

/// The DNS name every minted site certificate carries; gateways verify their operator
/// under it.
pub const LOOPBACK_NAME: &str = "localhost";

/// A throwaway certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// One minted leaf with its key.
#[derive(Clone, Debug)]
pub struct SiteCert {
    /// The DER leaf.
    pub cert: CertificateDer<'static>,
    /// PEM of the leaf.
    pub cert_pem: String,
    /// PEM of the private key.
    pub key_pem: String,
    key_der: Vec<u8>,
}

/// Where one identity's PEM files were written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteFiles {
    /// The certificate (leaf only).
    pub cert: PathBuf,
    /// Its PKCS#8 private key.
    pub key: PathBuf,
    /// The CA certificate it chains to.
    pub ca: PathBuf,
}

/// What to put in a leaf beside the loopback names.
#[derive(Clone, Debug)]
pub struct Mint<'a> {
    /// SPIFFE URI SAN, if any.
    pub spiffe: Option<String>,
    /// Expired a year ago instead of valid now.
    pub expired: bool,
    /// Common name (diagnostic only).
    pub cn: &'a str,
}

impl SiteCert {
    /// This leaf as the daemons' TLS material: the leaf alone as its chain, its key, and
    /// `ca` as the only root.
    ///
    /// # Panics
    /// If `ca`'s certificate is not one rustls takes as a root (it always is).
    #[must_use]
    pub fn material(&self, ca: &Ca) -> grid_daemon::tls::TlsMaterial {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert()).expect("a minted CA is a root");
        grid_daemon::tls::TlsMaterial {
            chain: vec![self.cert.clone()],
            key: self.key(),
            roots,
        }
    }

    /// The private key as rustls wants it.
    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()))
    }

    /// Writes `<name>.crt` and `<name>.key` into `dir`, returning their paths.
    ///
    /// # Panics
    ///
    /// When a file cannot be written (a test failure).
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let c = dir.join(format!("{name}.crt"));
        let k = dir.join(format!("{name}.key"));
        std::fs::write(&c, &self.cert_pem).expect("test certificate written");
        std::fs::write(&k, &self.key_pem).expect("test key written");
        (c, k)
    }
}

impl Ca {
    /// A fresh self-signed CA named `name`.
    pub fn try_new(name: &str) -> Result<Self, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate()?;
        Ok(Self {
            issuer: CertifiedIssuer::self_signed(params, key)?,
        })
    }

    /// [`Ca::try_new`] for tests.
    ///
    /// # Panics
    ///
    /// When rcgen fails (a test failure).
    pub fn new(name: &str) -> Self {
        Self::try_new(name).expect("test CA minted")
    }

    /// The CA certificate.
    pub fn cert(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// PEM of the CA certificate.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf for `names` (DNS names or IPs), usable as both TLS server and client.
    pub fn try_mint_for(&self, names: &[&str], m: &Mint<'_>) -> Result<SiteCert, rcgen::Error> {
        self.try_mint_until(names, m, None)
    }

    /// A valid site certificate with the SPIFFE ID `spiffe://<domain>/site/<site>` whose
    /// validity ends on the first of January of `year` (a certificate that expires soon,
    /// or at a known time).
    ///
    /// # Panics
    ///
    /// When rcgen fails (a test failure).
    pub fn site_until(&self, domain: &str, site: &str, year: i32) -> SiteCert {
        let m = Mint {
            spiffe: Some(format!("spiffe://{domain}/site/{site}")),
            expired: false,
            cn: site,
        };
        self.try_mint_until(&[LOOPBACK_NAME, "127.0.0.1"], &m, Some(year))
            .expect("test certificate minted")
    }

    fn try_mint_until(
        &self,
        names: &[&str],
        m: &Mint<'_>,
        until_year: Option<i32>,
    ) -> Result<SiteCert, rcgen::Error> {
        let mut params =
            CertificateParams::new(names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())?;
        params.distinguished_name.push(DnType::CommonName, m.cn);
        if let Some(uri) = &m.spiffe {
            params
                .subject_alt_names
                .push(SanType::URI(uri.as_str().try_into()?));
        }
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        if m.expired {
            params.not_before = date_time_ymd(2020, 1, 1);
            params.not_after = date_time_ymd(2021, 1, 1);
        }
        if let Some(year) = until_year {
            params.not_after = date_time_ymd(year, 1, 1);
        }
        let key = KeyPair::generate()?;
        let issuer: &Issuer<'_, KeyPair> = &self.issuer;
        let cert = params.signed_by(&key, issuer)?;
        Ok(SiteCert {
            cert: cert.der().clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            key_der: key.serialize_der(),
        })
    }

    /// A client-only leaf whose subject is `CN=<cn>, O=<organization>`: a Kubernetes
    /// user and its group, as the API server reads a client certificate.
    pub fn try_mint_client(&self, cn: &str, organization: &str) -> Result<SiteCert, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, cn);
        params
            .distinguished_name
            .push(DnType::OrganizationName, organization);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let issuer: &Issuer<'_, KeyPair> = &self.issuer;
        let cert = params.signed_by(&key, issuer)?;
        Ok(SiteCert {
            cert: cert.der().clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            key_der: key.serialize_der(),
        })
    }

    /// A leaf for `localhost` and `127.0.0.1` with what `m` says.
    ///
    /// # Panics
    ///
    /// When rcgen fails (a test failure).
    pub fn mint(&self, m: &Mint<'_>) -> SiteCert {
        self.try_mint_for(&[LOOPBACK_NAME, "127.0.0.1"], m)
            .expect("test certificate minted")
    }

    /// A valid site certificate with the SPIFFE ID `spiffe://<domain>/site/<site>`.
    ///
    /// # Panics
    ///
    /// When rcgen fails (a test failure).
    pub fn site(&self, domain: &str, site: &str) -> SiteCert {
        self.mint(&Mint {
            spiffe: Some(format!("spiffe://{domain}/site/{site}")),
            expired: false,
            cn: site,
        })
    }

    /// Mints a leaf for `names` and writes `<stem>.crt`, `<stem>.key` and this CA as
    /// `<stem>-ca.crt` under `dir`.
    ///
    /// # Panics
    ///
    /// When rcgen fails or a file cannot be written (a test failure).
    pub fn issue(&self, dir: &Path, stem: &str, names: &[&str]) -> SiteFiles {
        let leaf = self
            .try_mint_for(
                names,
                &Mint {
                    spiffe: None,
                    expired: false,
                    cn: stem,
                },
            )
            .expect("test certificate minted");
        let (cert, key) = leaf.write(dir, stem);
        let ca = dir.join(format!("{stem}-ca.crt"));
        std::fs::write(&ca, self.pem()).expect("test CA written");
        SiteFiles { cert, key, ca }
    }

    /// Mints site `site`'s certificate in [`TRUST_DOMAIN`] and writes `<site>.crt`,
    /// `<site>.key` and `ca.crt` into `dir`.
    pub fn write_site(&self, dir: &Path, site: &str) -> Result<SiteFiles, Error> {
        let leaf = self.try_mint_for(
            &[LOOPBACK_NAME, "127.0.0.1"],
            &Mint {
                spiffe: Some(format!("spiffe://{TRUST_DOMAIN}/site/{site}")),
                expired: false,
                cn: site,
            },
        )?;
        let files = SiteFiles {
            cert: dir.join(format!("{site}.crt")),
            key: dir.join(format!("{site}.key")),
            ca: dir.join("ca.crt"),
        };
        // The key before the certificate, as a renewal is written: a daemon that checks in
        // between still reads its old leaf and leaves the pair alone.
        write(&files.key, leaf.key_pem.as_bytes())?;
        write(&files.cert, leaf.cert_pem.as_bytes())?;
        write(&files.ca, self.pem().as_bytes())?;
        Ok(files)
    }
}

/// A server configuration for `files` that requires a client certificate chaining to
/// `client_ca_pem`, offering HTTP/2 and HTTP/1.1: a site's serving endpoint as the
/// gateway's site client meets it.
///
/// # Panics
///
/// When the files do not hold a certificate and key (a test failure).
pub fn server_config(files: &SiteFiles, client_ca_pem: &str) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(client_ca_pem.as_bytes()) {
        roots.add(c.expect("CA PEM")).expect("CA certificate");
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .expect("client verifier");
    let chain: Vec<_> = CertificateDer::pem_file_iter(&files.cert)
        .expect("certificate file")
        .map(|c| c.expect("certificate PEM"))
        .collect();
    let key = PrivateKeyDer::from_pem_file(&files.key).expect("key file");
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .expect("server certificate");
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(cfg)
}

/// Writes `bytes` to `path`, naming the file in the error.
/// Rewrites `path` with `text` in place, as a Kubernetes Secret update does to a mounted
/// file (same path, and here the same modification time on purpose): a reader that
/// looks at the path or the mtime misses the change, one that hashes the bytes sees it.
///
/// # Panics
/// If the file cannot be read, written or have its time set.
pub fn rewrite_keeping_mtime(path: &Path, text: &str) {
    use std::io::Write as _;
    let before = std::fs::metadata(path).unwrap().modified().unwrap();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file.set_modified(before).unwrap();
    drop(file);
    assert_eq!(std::fs::metadata(path).unwrap().modified().unwrap(), before);
}

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
        let ca = Ca::try_new("test-ca").unwrap();
        let files = ca.write_site(dir.path(), "east").unwrap();
        let cert = std::fs::read_to_string(&files.cert).unwrap();
        let key = std::fs::read_to_string(&files.key).unwrap();
        assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"), "{cert}");
        assert!(key.contains("PRIVATE KEY"), "{key}");
        assert_eq!(std::fs::read_to_string(&files.ca).unwrap(), ca.pem());
        assert_eq!(files.cert, dir.path().join("east.crt"));
    }
}
