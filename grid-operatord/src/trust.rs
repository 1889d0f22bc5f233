//! The trust the configuration declares, built with grid-daemon's one trust model
//! ([`grid_daemon::tls`]), which the gateway uses too.

use grid_daemon::tls::{PinConflict, TlsMaterial, Trust};

use crate::Error;
use crate::config::{Config, TlsFiles, TrustMode};

/// Reads the PEM files the configuration names.
pub(crate) fn material(files: &TlsFiles) -> Result<TlsMaterial, Error> {
    Ok(TlsMaterial::load(
        &files.cert,
        &files.key,
        files.ca.as_deref(),
    )?)
}

/// Builds the trust map the configuration declares.
pub(crate) fn trust_from_config(config: &Config, material: &TlsMaterial) -> Result<Trust, Error> {
    match &config.trust {
        TrustMode::Pin => Trust::pin(
            &config.site,
            material.leaf(),
            config
                .peers
                .iter()
                .map(|p| (p.name.clone(), p.fingerprints.clone())),
        )
        .map_err(|conflict| {
            let (peer, reason) = match conflict {
                PinConflict::OwnCertificate { peer } => {
                    (peer, "is this site's own certificate".to_owned())
                }
                PinConflict::Shared { first, second } => {
                    (second, format!("is also pinned for peer `{first}`"))
                }
            };
            let i = config
                .peers
                .iter()
                .position(|p| p.name == peer)
                .unwrap_or(0);
            Error::ConfigField {
                field: format!("peers[{i}].fingerprints"),
                reason,
            }
        }),
        TrustMode::Spiffe { trust_domain } => {
            if material.roots.is_empty() {
                return Err(Error::ConfigField {
                    field: "tls.ca".into(),
                    reason: "spiffe mode needs at least one CA certificate".into(),
                });
            }
            Ok(Trust::spiffe(
                &config.site,
                trust_domain,
                material.roots.clone(),
            ))
        }
    }
}
