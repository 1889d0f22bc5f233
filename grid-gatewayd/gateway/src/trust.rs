//! The gateway's TLS clients, built with grid-daemon's one trust model
//! ([`grid_daemon::tls`]), the operator's own.
//!
//! The gateway is only ever a TLS client. It presents the site's own certificate (the
//! operator admits feedback only from its own site's identity; remote sites admit the
//! grid's gateways). Toward its operator it trusts what `[trust]` says: the CA and
//! `operator.identity`, the site's own certificate (pin), or the site's SPIFFE ID. Toward
//! remote sites it verifies by the CA and the base URL's host, never the system roots: a
//! grid is a closed trust domain.

use std::sync::Arc;

use grid_daemon::tls::{
    CaBundle, CertSlot, Identity, TlsMaterial, Trust, client_config_presenting,
    webpki_client_following, webpki_client_presenting,
};
use rustls::ClientConfig;

use crate::Error;
use crate::config::{Config, OperatorTrust};

/// Reads the certificate chain, key and (when configured) CA bundle.
pub fn material(config: &Config) -> Result<TlsMaterial, Error> {
    Ok(TlsMaterial::load(
        &config.tls.cert,
        &config.tls.key,
        config.tls.ca.as_deref(),
    )?)
}

/// The CA bundle `tls.ca` names, followed by its bytes: every client verifying by it
/// (toward the operator in CA and SPIFFE modes, toward remote sites) uses the roots it
/// holds at each handshake, so a bundle rewritten in place applies without a restart.
pub fn ca_bundle(config: &Config) -> Result<Option<Arc<CaBundle>>, Error> {
    Ok(config.tls.ca.as_deref().map(CaBundle::load).transpose()?)
}

/// The site's certificate as every client of this gateway presents it: one slot, so a
/// renewal reaches the operator and the remote sites at once.
pub fn certificate(config: &Config, material: &TlsMaterial) -> Result<Arc<CertSlot>, Error> {
    Ok(CertSlot::new(material, &config.tls.cert, &config.tls.key)?)
}

/// The client configuration toward the local operator, as `[trust]` declares it, and the
/// trust it verifies the operator with (pin and SPIFFE modes), which follows a renewal of
/// the site's certificate.
pub fn operator_tls(
    config: &Config,
    material: &TlsMaterial,
    bundle: Option<&Arc<CaBundle>>,
    slot: &Arc<CertSlot>,
) -> Result<(ClientConfig, Option<Arc<Trust>>), Error> {
    let local = |trust: Trust| -> Result<(ClientConfig, Option<Arc<Trust>>), Error> {
        let trust = Arc::new(trust);
        let mut tls =
            (*client_config_presenting(Arc::clone(slot), Arc::clone(&trust), Identity::Local)?)
                .clone();
        // The pooled connector sets ALPN from the HTTP versions it enables.
        tls.alpn_protocols.clear();
        Ok((tls, Some(trust)))
    };
    match &config.trust {
        OperatorTrust::Ca => Ok((
            match bundle {
                Some(bundle) => {
                    webpki_client_following(Arc::clone(bundle), Some(Arc::clone(slot)), "operator")?
                }
                None => webpki_client_presenting(
                    material.roots.clone(),
                    Some(Arc::clone(slot)),
                    "operator",
                )?,
            },
            None,
        )),
        OperatorTrust::Pin => local(
            Trust::pin(&config.site, material.leaf(), std::iter::empty()).map_err(|_| {
                Error::ConfigField {
                    field: "trust.mode".into(),
                    reason: "pin mode needs the site's own certificate in tls.cert".into(),
                }
            })?,
        ),
        OperatorTrust::Spiffe { trust_domain } => local(Trust::spiffe(
            &config.site,
            trust_domain,
            bundle.map_or_else(|| material.roots.clone(), |b| (*b.roots()).clone()),
        )),
    }
}

/// The client configuration toward remote sites: the CA (followed by its bytes) and the
/// base URL's host.
pub fn sites_tls(
    material: &TlsMaterial,
    bundle: Option<&Arc<CaBundle>>,
    slot: &Arc<CertSlot>,
) -> Result<ClientConfig, Error> {
    Ok(match bundle {
        Some(bundle) => {
            webpki_client_following(Arc::clone(bundle), Some(Arc::clone(slot)), "sites")?
        }
        None => webpki_client_presenting(material.roots.clone(), Some(Arc::clone(slot)), "sites")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TlsFiles;

    #[test]
    fn missing_file_is_named_in_the_error() {
        let files = TlsFiles {
            cert: "/nonexistent/gw.crt".into(),
            key: "/nonexistent/gw.key".into(),
            ca: Some("/nonexistent/ca.crt".into()),
        };
        let err = Error::from(
            TlsMaterial::load(&files.cert, &files.key, files.ca.as_deref()).unwrap_err(),
        )
        .to_string();
        assert!(err.contains("/nonexistent/gw.crt"), "{err}");
    }

    #[test]
    fn file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("empty.pem");
        std::fs::write(&p, "not pem\n").unwrap();
        let err = TlsMaterial::load(&p, &p, Some(&p)).unwrap_err();
        assert!(matches!(Error::from(err), Error::Pem { .. }));
    }
}
