//! Test PKI minted with rcgen: a CA, site certificates (pin and SPIFFE), an untrusted CA
//! and an expired certificate. Shared by unit tests (`#[path]`) and integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, SanType, date_time_ymd,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A certificate authority that signs site certificates.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// One minted site certificate with its key.
pub struct SiteCert {
    /// The DER leaf.
    pub cert: CertificateDer<'static>,
    /// PEM of the leaf.
    pub cert_pem: String,
    /// PEM of the private key.
    pub key_pem: String,
    key_der: Vec<u8>,
}

impl SiteCert {
    /// The private key as rustls wants it.
    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()))
    }

    /// Writes `<name>.crt` and `<name>.key` into `dir`, returning their paths.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let c = dir.join(format!("{name}.crt"));
        let k = dir.join(format!("{name}.key"));
        std::fs::write(&c, &self.cert_pem).unwrap();
        std::fs::write(&k, &self.key_pem).unwrap();
        (c, k)
    }
}

/// What to put in a site certificate.
pub struct Mint<'a> {
    /// SPIFFE URI SAN, if any.
    pub spiffe: Option<String>,
    /// Expired a year ago instead of valid now.
    pub expired: bool,
    /// Common name (diagnostic only).
    pub cn: &'a str,
}

impl Ca {
    /// A fresh self-signed CA.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        Self {
            issuer: CertifiedIssuer::self_signed(params, key).unwrap(),
        }
    }

    /// The CA certificate.
    pub fn cert(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// PEM of the CA certificate.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf usable as both TLS server and client (the site's own certificate is both).
    pub fn mint(&self, m: &Mint<'_>) -> SiteCert {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, m.cn);
        if let Some(uri) = &m.spiffe {
            params
                .subject_alt_names
                .push(SanType::URI(uri.as_str().try_into().unwrap()));
        }
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        if m.expired {
            params.not_before = date_time_ymd(2020, 1, 1);
            params.not_after = date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let issuer: &Issuer<'_, KeyPair> = &self.issuer;
        let cert = params.signed_by(&key, issuer).unwrap();
        SiteCert {
            cert: cert.der().clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            key_der: key.serialize_der(),
        }
    }

    /// A valid SPIFFE site certificate `spiffe://<domain>/site/<site>`.
    pub fn site(&self, domain: &str, site: &str) -> SiteCert {
        self.mint(&Mint {
            spiffe: Some(format!("spiffe://{domain}/site/{site}")),
            expired: false,
            cn: site,
        })
    }
}
