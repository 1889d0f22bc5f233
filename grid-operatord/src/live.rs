//! What a running operator takes over without a restart, in the same epoch
//! ([`Config::takes_over_live`] says which changes those are).
//!
//! A new provider list goes to the scrape loop, which takes it between passes. Under
//! gossip a new trust (mode, CA bundle, pins) is put in force in the one [`Trust`] every
//! TLS configuration of the process verifies through, so the next handshake of the
//! listener, of a gossip pull and of a session exchange, and the next certificate check,
//! read it (certificate rotation reads the declared trust at every check); the peers
//! become the seeds membership contacts. Everything is built before
//! anything is put in force, so a change that cannot be applied leaves the running one
//! whole.

use std::sync::Arc;

use tokio::sync::watch;

use crate::Error;
use crate::config::Config;
use crate::providers::ScrapedProvider;
use grid_daemon::tls::Trust;

/// A configured peer membership starts from: (site, host, signals port).
pub(crate) type Seed = (String, String, u16);

/// The handles a live change is applied through; the file watcher and [`crate::driver::Running`]
/// hold the same ones.
#[derive(Clone, Debug)]
pub(crate) struct Live {
    pub(crate) providers: Arc<watch::Sender<Vec<ScrapedProvider>>>,
    pub(crate) trust: Arc<Trust>,
    pub(crate) seeds: Arc<watch::Sender<Vec<Seed>>>,
    /// The catalog served to the local gateway (`GET /v1/site/catalog`), as its body.
    pub(crate) catalog: Arc<watch::Sender<bytes::Bytes>>,
}

/// The body of `GET /v1/site/catalog`: `{"models": [...]}` in the order given.
pub(crate) fn catalog_body(catalog: &[crate::config::CatalogModel]) -> bytes::Bytes {
    let body = serde_json::json!({ "models": catalog });
    bytes::Bytes::from(body.to_string())
}

impl Live {
    /// Puts in force the CA bundle `running` names as it reads now (rewritten in place,
    /// same path): the trust rebuilt from it (it names the SPIFFE roots) and every
    /// provider's scraper (an `https` EPP without its own `caFile` verifies with it).
    ///
    /// # Errors
    ///
    /// As [`Live::apply`]; nothing changes then.
    pub(crate) fn reload_ca(&self, running: &Config) -> Result<(), Error> {
        let material = crate::trust::material(&running.tls)?;
        let providers = scraped(running, &material)?;
        self.replace_trust(crate::trust::trust_from_config(running, &material)?)?;
        self.providers.send_replace(providers);
        tracing::info!(
            "the CA bundle changed in place; in force from the next handshake, in the same epoch"
        );
        Ok(())
    }

    /// Puts `trust` in force for the next handshake (refused, as `tls.ca`, when it cannot
    /// take over from the one in force).
    fn replace_trust(&self, trust: Trust) -> Result<(), Error> {
        self.trust
            .replace(trust)
            .map_err(|reason| Error::ConfigField {
                field: "tls.ca".into(),
                reason,
            })
    }

    /// Puts `next` in force where it differs from `running`; the caller has checked
    /// [`Config::takes_over_live`].
    ///
    /// # Errors
    ///
    /// The new TLS material, a provider's CA bundle or the new trust cannot be read or
    /// built; nothing changes then.
    pub(crate) fn apply(&self, running: &Config, next: &Config) -> Result<(), Error> {
        let material = crate::trust::material(&next.tls)?;
        let providers = (running.providers != next.providers)
            .then(|| scraped(next, &material))
            .transpose()?;
        let trust = running
            .trust_differs(next)
            .map(|_| crate::trust::trust_from_config(next, &material))
            .transpose()?;
        if let Some(trust) = trust {
            self.replace_trust(trust)?;
            self.seeds.send_replace(seeds_of(next));
            tracing::info!(
                peers = next.peers.len(),
                "the trust changed; in force from the next handshake, in the same epoch"
            );
        }
        if running.catalog != next.catalog {
            self.catalog.send_replace(catalog_body(&next.catalog));
            tracing::info!(
                models = next.catalog.len(),
                "the gateway's catalog changed; served from now on"
            );
        }
        if let Some(providers) = providers {
            self.providers.send_replace(providers);
            tracing::info!(
                providers = next.providers.len(),
                "the providers changed; taken over live, in the same epoch"
            );
        }
        Ok(())
    }
}

/// `config`'s providers, each with its scrape target: an `https` EPP verified against
/// its own CA bundle, or the site's.
pub(crate) fn scraped(
    config: &Config,
    material: &grid_daemon::tls::TlsMaterial,
) -> Result<Vec<ScrapedProvider>, Error> {
    config
        .providers
        .iter()
        .map(|p| {
            let tls = if p.url.scheme_str() == Some("https") {
                let roots = match &p.ca_file {
                    Some(path) => grid_daemon::tls::read_roots(path)?,
                    None => material.roots.clone(),
                };
                Some(crate::scrape::scrape_tls_config(roots)?)
            } else {
                None
            };
            Ok(ScrapedProvider {
                target: grid_daemon::client::FetchTarget::new(p.url.clone(), p.timeout, tls),
                config: p.clone(),
            })
        })
        .collect()
}

/// The configured peers membership contacts until they are live: each one's URL host
/// and port (443 when the URL names none).
pub(crate) fn seeds_of(config: &Config) -> Vec<Seed> {
    config
        .peers
        .iter()
        .filter_map(|p| {
            let host = p.url.host()?.to_owned();
            Some((p.name.clone(), host, p.url.port_u16().unwrap_or(443)))
        })
        .collect()
}
