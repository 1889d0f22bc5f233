//! Resources to [`Config`]: the pure function that makes the controller mode build the
//! very value the file mode builds, so the driver cannot tell them apart.
//!
//! Order is made deterministic here (peers and providers sorted by name), because a
//! running operator compares successive translations: the same resources must give an
//! equal `Config`, whatever order a list or watch returned them in.

use std::collections::BTreeMap;
use std::path::PathBuf;

use grid_daemon::tls::Fingerprint;
use kube::{Resource as _, ResourceExt};

use super::resources::{
    GridNetwork, GridSite, InferenceProvider, TransportModeName, TrustModeName,
};
use crate::Error;
use crate::config::{
    CatalogCandidate, CatalogModel, Config, DEFAULT_METRICS_PATH, DEFAULT_PEER_POLL_INTERVAL,
    DEFAULT_PEER_TIMEOUT, DEFAULT_SCRAPE_INTERVAL, DEFAULT_SCRAPE_TIMEOUT, Listen, PeerConfig,
    ProviderConfig, TlsFiles, TransportMode, TrustMode, metrics_url, parse_url, period,
};

/// What the resources do not say: this process's own site, listeners and TLS files
/// (the pod's flags and mounted Secret).
#[derive(Clone, Debug, PartialEq)]
pub struct Deployment {
    /// This operator's site (a `GridSite` of that name, if any, is not polled).
    pub site: String,
    /// Listener addresses.
    pub listen: Listen,
    /// The site's certificate, key and CA bundle.
    pub tls: TlsFiles,
    /// Where persisted state lives, for messages only (the controller keeps it in the
    /// site's `ConfigMap` and the `GridNetwork` status).
    pub state_label: PathBuf,
}

/// The resources of one namespace, as the watcher last saw them.
#[derive(Clone, Debug, Default)]
pub struct Resources {
    /// Every `GridNetwork`; exactly one is served.
    pub networks: Vec<GridNetwork>,
    /// Every `GridSite`: the peers, and perhaps this site itself.
    pub sites: Vec<GridSite>,
    /// Every `InferenceProvider` of this site.
    pub providers: Vec<InferenceProvider>,
}

/// The one `GridNetwork`, or why there is not exactly one.
pub fn the_network(networks: &[GridNetwork]) -> Result<&GridNetwork, Error> {
    if let [one] = networks {
        return Ok(one);
    }
    let mut names: Vec<String> = networks.iter().map(ResourceExt::name_any).collect();
    names.sort();
    Err(Error::NetworkCount {
        count: networks.len(),
        names,
    })
}

/// The signal transport the network declares, read without validating the rest (absent
/// means gossip, as in the spec).
pub fn declared_mode(network: &GridNetwork) -> &'static str {
    network
        .spec
        .signal_transport
        .as_ref()
        .and_then(|t| t.mode)
        .unwrap_or(TransportModeName::Gossip)
        .as_str()
}

/// Builds and validates the configuration the resources declare for `deployment`.
pub fn translate(deployment: &Deployment, resources: &Resources) -> Result<Config, Error> {
    let network = the_network(&resources.networks)?;
    let net = format!("GridNetwork/{}", network.name_any());
    let at = |f: &str| format!("{net}.spec.{f}");
    let trust = trust_of(network, &at)?;
    let mut config = Config::new(
        deployment.site.clone(),
        network.name_any(),
        deployment.listen,
        deployment.tls.clone(),
        trust,
        deployment.state_label.clone(),
    );
    config.transport = match declared_mode(network) {
        "poll" => TransportMode::Poll,
        _ => TransportMode::Gossip,
    };
    let intervals = network.spec.intervals.clone().unwrap_or_default();
    config.scrape_interval = period(
        &at("intervals.scrapeSeconds"),
        intervals.scrape_seconds,
        DEFAULT_SCRAPE_INTERVAL,
    )?;
    config.peer_poll_interval = period(
        &at("intervals.peerPollSeconds"),
        intervals.peer_poll_seconds,
        DEFAULT_PEER_POLL_INTERVAL,
    )?;
    // This site's own GridSite says where peers reach it: its advertised host and port.
    if let Some(own) = resources
        .sites
        .iter()
        .find(|s| s.name_any() == deployment.site)
    {
        let (host, port) = advertised(own)?;
        config.advertise_host = Some(host);
        config.advertise_port = Some(port);
    }
    let mut sites: Vec<&GridSite> = resources
        .sites
        .iter()
        .filter(|s| s.name_any() != deployment.site)
        .collect();
    sites.sort_by_key(|s| s.name_any());
    for site in sites {
        config.peers.push(peer_of(site)?);
    }
    let mut providers: Vec<&InferenceProvider> = resources.providers.iter().collect();
    providers.sort_by_key(|p| p.name_any());
    for provider in &providers {
        config
            .providers
            .push(provider_of(&deployment.site, provider)?);
    }
    config.catalog = catalog_of(&deployment.site, &providers, &resources.sites)?;
    config.validate()?;
    Ok(config)
}

fn trust_of(network: &GridNetwork, at: &dyn Fn(&str) -> String) -> Result<TrustMode, Error> {
    let trust = &network.spec.peer_trust;
    match (trust.mode, &trust.trust_domain) {
        (TrustModeName::Pin, None) => Ok(TrustMode::Pin),
        (TrustModeName::Pin, Some(_)) => Err(Error::ConfigField {
            field: at("peerTrust.trustDomain"),
            reason: "only applies in `spiffe` mode".into(),
        }),
        (TrustModeName::Spiffe, Some(domain)) => {
            grid_daemon::config::trust_domain(&at("peerTrust.trustDomain"), domain)?;
            Ok(TrustMode::Spiffe {
                trust_domain: domain.clone(),
            })
        }
        (TrustModeName::Spiffe, None) => Err(Error::ConfigField {
            field: at("peerTrust.trustDomain"),
            reason: "required in `spiffe` mode".into(),
        }),
    }
}

/// Where peers reach `site`, from its `signalsEndpoint`: the host (an IPv6 address
/// without its brackets) and the port (443 when the URL names none), which the signals
/// listener (TCP) and the SWIM socket (UDP) share.
fn advertised(site: &GridSite) -> Result<(String, u16), Error> {
    let field = format!("GridSite/{}.spec.signalsEndpoint", site.name_any());
    let url = parse_url(&field, &site.spec.signals_endpoint, &["https"])?;
    let host = url.host().unwrap_or_default();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Ok((host.to_owned(), url.port_u16().unwrap_or(443)))
}

/// The gateway's model-to-candidates table: this site's `InferenceProvider`s that say
/// where they serve (`spec.serving`), and what every other `GridSite` serves
/// (`spec.serving`). Models sorted by name, candidates by (site, provider).
fn catalog_of(
    own: &str,
    providers: &[&InferenceProvider],
    sites: &[GridSite],
) -> Result<Vec<CatalogModel>, Error> {
    let mut models: BTreeMap<String, Vec<CatalogCandidate>> = BTreeMap::new();
    let mut add = |model: &str, site: &str, provider: &str, base_url: &str| {
        models
            .entry(model.to_owned())
            .or_default()
            .push(CatalogCandidate {
                site: site.to_owned(),
                provider: provider.to_owned(),
                base_url: base_url.to_owned(),
            });
    };
    for p in providers {
        let Some(serving) = &p.spec.serving else {
            continue;
        };
        let name = p.name_any();
        let field = format!("InferenceProvider/{name}.spec.serving.baseUrl");
        parse_url(&field, &serving.base_url, &["http", "https"])?;
        for model in &serving.models {
            add(model, own, &name, &serving.base_url);
        }
    }
    for site in sites.iter().filter(|s| s.name_any() != own) {
        let Some(serving) = &site.spec.serving else {
            continue;
        };
        let name = site.name_any();
        let field = format!("GridSite/{name}.spec.serving.baseUrl");
        parse_url(&field, &serving.base_url, &["https"])?;
        for p in &serving.providers {
            for model in &p.models {
                add(model, &name, &p.name, &serving.base_url);
            }
        }
    }
    Ok(models
        .into_iter()
        .map(|(name, mut candidates)| {
            candidates.sort();
            candidates.dedup_by(|a, b| a.site == b.site && a.provider == b.provider);
            CatalogModel { name, candidates }
        })
        .collect())
}

fn peer_of(site: &GridSite) -> Result<PeerConfig, Error> {
    let at = |f: &str| format!("GridSite/{}.spec.{f}", site.name_any());
    let url = parse_url(
        &at("signalsEndpoint"),
        &site.spec.signals_endpoint,
        &["https"],
    )?;
    let fingerprints = site
        .spec
        .fingerprints
        .iter()
        .enumerate()
        .map(|(j, f)| {
            Fingerprint::parse(f).map_err(|reason| Error::ConfigField {
                field: at(&format!("fingerprints[{j}]")),
                reason,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if fingerprints.len() > super::resources::MAX_SITE_FINGERPRINTS {
        return Err(Error::ConfigField {
            field: at("fingerprints"),
            reason: format!(
                "at most {} (the current certificate and the next one)",
                super::resources::MAX_SITE_FINGERPRINTS
            ),
        });
    }
    let mut peer = PeerConfig::new(site.name_any(), url, fingerprints);
    peer.timeout = period(
        &at("timeoutSeconds"),
        site.spec.timeout_seconds,
        DEFAULT_PEER_TIMEOUT,
    )?;
    Ok(peer)
}

fn provider_of(site: &str, provider: &InferenceProvider) -> Result<ProviderConfig, Error> {
    let name = provider.name_any();
    let at = |f: &str| format!("InferenceProvider/{name}.{f}");
    let metrics = &provider.spec.metrics_config;
    let url = metrics_url(
        (&at("spec.metricsConfig.endpoint"), &metrics.endpoint),
        (
            &at("spec.metricsConfig.path"),
            metrics.path.as_deref().unwrap_or(DEFAULT_METRICS_PATH),
        ),
    )?;
    let mut config = ProviderConfig::new(site, name.clone(), url);
    config.timeout = period(
        &at("spec.metricsConfig.timeoutSeconds"),
        metrics.timeout_seconds,
        DEFAULT_SCRAPE_TIMEOUT,
    )?;
    config.stale_metrics = metrics
        .stale_metrics_seconds
        .map(|s| {
            period(
                &at("spec.metricsConfig.staleMetricsSeconds"),
                Some(s),
                DEFAULT_SCRAPE_TIMEOUT,
            )
        })
        .transpose()?;
    // The API server assigns both; an object without them was not read from a server.
    config.uid = provider.uid().ok_or_else(|| Error::ConfigField {
        field: at("metadata.uid"),
        reason: "missing: the API server sets it".into(),
    })?;
    config.generation = provider
        .meta()
        .generation
        .and_then(|g| u64::try_from(g).ok())
        .ok_or_else(|| Error::ConfigField {
            field: at("metadata.generation"),
            reason: "missing or negative: the API server sets it".into(),
        })?;
    config.ca_file = metrics
        .tls
        .as_ref()
        .and_then(|t| t.ca_file.as_ref())
        .map(PathBuf::from);
    config.pool.clone_from(&provider.spec.pool);
    config.unavailable = provider.spec.unavailable;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::super::resources::{
        GridNetworkSpec, GridSiteSpec, InferenceProviderSpec, InferenceProviderStatus, Intervals,
        MetricsConfig, PeerTrust, SignalTransport,
    };
    use super::*;

    const PIN: &str = "AB:CD:EF:01:23:45:67:89:ab:cd:ef:01:23:45:67:89:ab:cd:ef:01:23:45:67:89:ab:cd:ef:01:23:45:67:89";
    const PIN2: &str = "01:CD:EF:01:23:45:67:89:ab:cd:ef:01:23:45:67:89:ab:cd:ef:01:23:45:67:89:ab:cd:ef:01:23:45:67:89";

    fn deployment() -> Deployment {
        Deployment {
            site: "a".into(),
            listen: Listen {
                signals: "127.0.0.1:9443".parse().unwrap(),
                metrics: "127.0.0.1:9090".parse().unwrap(),
            },
            tls: TlsFiles {
                cert: "a.pem".into(),
                key: "a.key".into(),
                ca: None,
            },
            state_label: "configmap/grid-site-a".into(),
        }
    }

    fn network(mode: Option<TransportModeName>) -> GridNetwork {
        GridNetwork::new(
            "prod",
            GridNetworkSpec {
                signal_transport: Some(SignalTransport { mode }),
                peer_trust: PeerTrust {
                    mode: TrustModeName::Pin,
                    trust_domain: None,
                },
                intervals: None,
            },
        )
    }

    fn site(name: &str, pins: &[&str]) -> GridSite {
        GridSite::new(
            name,
            GridSiteSpec {
                signals_endpoint: format!("https://{name}.example:9443/v1/site/signals"),
                fingerprints: pins.iter().map(|p| (*p).to_owned()).collect(),
                timeout_seconds: None,
                serving: None,
            },
        )
    }

    /// A provider as the API server returns it: with a UID and a generation.
    fn provider(name: &str, uid: &str, generation: i64) -> InferenceProvider {
        let mut p = InferenceProvider::new(
            name,
            InferenceProviderSpec {
                metrics_config: MetricsConfig {
                    endpoint: "http://epp.local:9090".into(),
                    path: None,
                    timeout_seconds: None,
                    stale_metrics_seconds: Some(10.0),
                    tls: None,
                },
                pool: Some("llama-pool".into()),
                unavailable: false,
                serving: None,
            },
        );
        p.metadata.uid = Some(uid.into());
        p.metadata.generation = Some(generation);
        p
    }

    fn resources() -> Resources {
        Resources {
            networks: vec![network(Some(TransportModeName::Poll))],
            sites: vec![site("c", &[PIN2]), site("a", &[]), site("b", &[PIN])],
            providers: vec![provider("llama", "u1", 7)],
        }
    }

    fn field(r: &Resources) -> String {
        match translate(&deployment(), r) {
            Err(Error::ConfigField { field, .. }) => field,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_resources_become_the_config_the_file_mode_would_build() {
        let c = translate(&deployment(), &resources()).unwrap();
        assert_eq!(c.site, "a");
        assert_eq!(c.network, "prod");
        assert_eq!(c.transport, TransportMode::Poll);
        assert_eq!(c.trust, TrustMode::Pin);
        assert_eq!(c.scrape_interval, DEFAULT_SCRAPE_INTERVAL);
        let peers: Vec<&str> = c.peers.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(peers, ["b", "c"], "own site skipped, sorted by name");
        let p = &c.providers[0];
        assert_eq!(p.url.to_string(), "http://epp.local:9090/metrics");
        assert_eq!(p.uid, "u1");
        assert_eq!(p.generation, 7);
        assert_eq!(p.pool.as_deref(), Some("llama-pool"));
        assert_eq!(p.stale_metrics, Some(std::time::Duration::from_secs(10)));
    }

    #[test]
    fn this_sites_own_grid_site_is_where_it_advertises_itself() {
        let c = translate(&deployment(), &resources()).unwrap();
        assert_eq!(
            (c.advertise_host.as_deref(), c.advertise_port),
            (Some("a.example"), Some(9443))
        );
        let mut r = resources();
        r.sites[1].spec.signals_endpoint = "https://[fd00::a]/v1/site/signals".into();
        let c = translate(&deployment(), &r).unwrap();
        assert_eq!(
            (c.advertise_host.as_deref(), c.advertise_port),
            (Some("fd00::a"), Some(443)),
            "an IPv6 host without brackets; https's port when none is named"
        );
        r.sites.remove(1);
        let c = translate(&deployment(), &r).unwrap();
        assert_eq!((c.advertise_host, c.advertise_port), (None, None));
    }

    /// A model and its (site, provider, baseUrl) candidates.
    type CatalogRow<'a> = (&'a str, Vec<(&'a str, &'a str, &'a str)>);

    #[test]
    fn the_catalog_is_this_sites_serving_providers_and_what_every_other_site_serves() {
        use super::super::resources::{ProviderServing, ServedProvider, SiteServing};
        let mut r = resources();
        r.providers[0].spec.serving = Some(ProviderServing {
            base_url: "http://llama.a.svc:8000".into(),
            models: vec!["llama-3".into()],
        });
        let served = |name: &str, models: &[&str]| ServedProvider {
            name: name.into(),
            models: models.iter().map(|m| (*m).to_owned()).collect(),
        };
        r.sites[2].spec.serving = Some(SiteServing {
            base_url: "https://b.example:8443".into(),
            providers: vec![served("llama", &["llama-3", "mistral"])],
        });
        // This site's own GridSite says nothing to its own gateway.
        r.sites[1].spec.serving = Some(SiteServing {
            base_url: "https://a.example:8443".into(),
            providers: vec![served("other", &["ignored"])],
        });
        let c = translate(&deployment(), &r).unwrap();
        let table: Vec<CatalogRow<'_>> = c
            .catalog
            .iter()
            .map(|m| {
                let cands = m
                    .candidates
                    .iter()
                    .map(|c| (c.site.as_str(), c.provider.as_str(), c.base_url.as_str()))
                    .collect();
                (m.name.as_str(), cands)
            })
            .collect();
        assert_eq!(
            table,
            [
                (
                    "llama-3",
                    vec![
                        ("a", "llama", "http://llama.a.svc:8000"),
                        ("b", "llama", "https://b.example:8443"),
                    ]
                ),
                ("mistral", vec![("b", "llama", "https://b.example:8443")]),
            ]
        );
        // A remote site is reached over TLS only.
        r.sites[2].spec.serving.as_mut().unwrap().base_url = "http://b.example:8443".into();
        assert_eq!(field(&r), "GridSite/b.spec.serving.baseUrl");
    }

    #[test]
    fn list_order_does_not_change_the_config() {
        let mut shuffled = resources();
        shuffled.sites.reverse();
        shuffled.providers.push(provider("aaa", "u0", 1));
        let mut again = shuffled.clone();
        again.providers.reverse();
        assert_eq!(
            translate(&deployment(), &shuffled).unwrap(),
            translate(&deployment(), &again).unwrap()
        );
    }

    #[test]
    fn a_spec_change_advances_the_published_generation() {
        let before = translate(&deployment(), &resources()).unwrap();
        let mut changed = resources();
        // What the API server does on a spec update: the generation moves.
        changed.providers[0].spec.metrics_config.path = Some("/epp/metrics".into());
        changed.providers[0].metadata.generation = Some(8);
        let after = translate(&deployment(), &changed).unwrap();
        assert_eq!(after.providers[0].generation, 8);
        assert_eq!(after.providers[0].uid, before.providers[0].uid);
        assert_ne!(before, after);
    }

    #[test]
    fn a_status_only_update_leaves_the_config_equal() {
        let before = translate(&deployment(), &resources()).unwrap();
        let mut status_only = resources();
        status_only.providers[0].status = Some(InferenceProviderStatus {
            conditions: Vec::new(),
            observed_generation: Some(7),
        });
        status_only.providers[0].metadata.resource_version = Some("99".into());
        assert_eq!(translate(&deployment(), &status_only).unwrap(), before);
    }

    #[test]
    fn a_same_name_recreation_publishes_the_new_uid() {
        let before = translate(&deployment(), &resources()).unwrap();
        let mut recreated = resources();
        recreated.providers[0] = provider("llama", "u2", 1);
        let after = translate(&deployment(), &recreated).unwrap();
        assert_eq!(after.providers[0].uid, "u2");
        assert_eq!(after.providers[0].generation, 1);
        assert_ne!(before.providers[0].uid, after.providers[0].uid);
    }

    #[test]
    fn a_provider_without_uid_or_generation_is_refused() {
        let mut r = resources();
        r.providers[0].metadata.uid = None;
        assert_eq!(field(&r), "InferenceProvider/llama.metadata.uid");
        let mut r = resources();
        r.providers[0].metadata.generation = None;
        assert_eq!(field(&r), "InferenceProvider/llama.metadata.generation");
    }

    #[test]
    fn zero_or_two_networks_are_refused_naming_them() {
        let mut r = resources();
        r.networks.push(network(None));
        assert!(matches!(
            translate(&deployment(), &r),
            Err(Error::NetworkCount { count: 2, .. })
        ));
        r.networks.clear();
        assert!(matches!(
            translate(&deployment(), &r),
            Err(Error::NetworkCount { count: 0, .. })
        ));
    }

    #[test]
    fn an_absent_or_gossip_mode_translates_to_gossip() {
        let mut r = resources();
        r.networks = vec![network(None)];
        assert_eq!(declared_mode(&r.networks[0]), "gossip");
        assert_eq!(
            translate(&deployment(), &r).unwrap().transport,
            TransportMode::Gossip
        );
        r.networks[0].spec.signal_transport = None;
        assert_eq!(declared_mode(&r.networks[0]), "gossip");
        assert_eq!(
            translate(&deployment(), &r).unwrap().transport,
            TransportMode::Gossip
        );
        r.networks = vec![network(Some(TransportModeName::Gossip))];
        assert_eq!(
            translate(&deployment(), &r).unwrap().transport,
            TransportMode::Gossip
        );
    }

    #[test]
    fn a_site_pins_at_most_two_fingerprints() {
        let mut r = resources();
        r.sites = vec![site("b", &[PIN, PIN2])];
        assert_eq!(
            translate(&deployment(), &r).unwrap().peers[0]
                .fingerprints
                .len(),
            2
        );
        r.sites = vec![site("b", &[PIN, PIN2, PIN])];
        assert_eq!(field(&r), "GridSite/b.spec.fingerprints");
        r.sites = vec![site("b", &["00:11"])];
        assert_eq!(field(&r), "GridSite/b.spec.fingerprints[0]");
    }

    #[test]
    fn spiffe_needs_a_trust_domain_and_pin_refuses_one() {
        let mut r = resources();
        r.networks[0].spec.peer_trust.trust_domain = Some("grid.example".into());
        assert_eq!(field(&r), "GridNetwork/prod.spec.peerTrust.trustDomain");
        r.networks[0].spec.peer_trust = PeerTrust {
            mode: TrustModeName::Spiffe,
            trust_domain: None,
        };
        assert_eq!(field(&r), "GridNetwork/prod.spec.peerTrust.trustDomain");
    }

    #[test]
    fn intervals_are_bounded_like_the_file_mode() {
        let mut r = resources();
        r.networks[0].spec.intervals = Some(Intervals {
            scrape_seconds: Some(0.1),
            peer_poll_seconds: Some(3600.0),
        });
        let c = translate(&deployment(), &r).unwrap();
        assert_eq!(c.scrape_interval.as_millis(), 100);
        r.networks[0].spec.intervals = Some(Intervals {
            scrape_seconds: Some(0.099),
            peer_poll_seconds: None,
        });
        assert_eq!(field(&r), "GridNetwork/prod.spec.intervals.scrapeSeconds");
    }
}
