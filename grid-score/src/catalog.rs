//! The configured models and where each is served, resolved once at start.
//!
//! The catalog is immutable: the request path borrows upstream addresses from it without
//! allocating, and each published routing snapshot shares it by `Arc`.

use std::collections::HashMap;
use std::sync::Arc;

use http::uri::{Authority, PathAndQuery, Scheme, Uri};

use crate::config::{Config, parse_base_url};

/// One place a model is served: the (site, provider) pair and its serving base URL.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// `grid_site`, also the `x-grid-site` answer header.
    pub site: Arc<str>,
    /// `grid_provider`.
    pub provider: Arc<str>,
    scheme: Scheme,
    authority: Authority,
    /// Path prefix without a trailing slash (`""` for none).
    prefix: Arc<str>,
    /// Where the request path leaves what this candidate's responses said (shared by
    /// every model entry naming the same site and provider).
    live: Arc<grid_score::live::LiveSlot>,
}

impl Upstream {
    /// The live slot of this (site, provider): the request path records each response's
    /// flow-control headers and outcome here, the refresh folds them in.
    pub fn live(&self) -> &grid_score::live::LiveSlot {
        &self.live
    }

    /// The same slot, shared: a streamed answer's body holds it until its end.
    pub fn live_shared(&self) -> Arc<grid_score::live::LiveSlot> {
        self.live.clone()
    }

    /// The upstream URI for a client's path and query, the base URL's prefix kept.
    pub fn uri_for(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        let pq = if self.prefix.is_empty() {
            PathAndQuery::try_from(path_and_query)?
        } else {
            PathAndQuery::try_from(format!("{}{path_and_query}", self.prefix))?
        };
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(pq)
            .build()
    }
}

/// A model and its candidates, in configuration order.
#[derive(Clone, Debug)]
pub struct ModelEntry {
    /// The `model` value clients send.
    pub name: Arc<str>,
    /// Where it is served.
    pub upstreams: Vec<Upstream>,
}

/// Every configured model.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    models: Vec<ModelEntry>,
    by_name: HashMap<Arc<str>, usize>,
    live: grid_score::live::LiveBoard,
}

impl Catalog {
    /// Builds the catalog from a validated config.
    ///
    /// # Panics
    ///
    /// Never for a config that passed [`Config::validate`], which checks every base URL.
    pub fn from_config(config: &Config) -> Self {
        let mut sites: HashMap<&str, Arc<str>> = HashMap::new();
        let keys: Vec<grid_score::CandidateKey> = config
            .models
            .iter()
            .flat_map(|m| &m.candidates)
            .map(|c| grid_score::CandidateKey::new(c.site.as_str(), c.provider.as_str()))
            .collect();
        let live = grid_score::live::LiveBoard::new(&keys);
        let mut models = Vec::with_capacity(config.models.len());
        for m in &config.models {
            let upstreams = m
                .candidates
                .iter()
                .map(|c| {
                    let uri = parse_base_url("base_url", &c.base_url).expect("validated base_url");
                    let site = Arc::clone(
                        sites
                            .entry(c.site.as_str())
                            .or_insert_with(|| c.site.as_str().into()),
                    );
                    Upstream {
                        site,
                        provider: c.provider.as_str().into(),
                        scheme: uri.scheme().expect("validated scheme").clone(),
                        authority: uri.authority().expect("validated authority").clone(),
                        prefix: uri.path().trim_end_matches('/').into(),
                        live: Arc::clone(
                            live.slot(&grid_score::CandidateKey::new(
                                c.site.as_str(),
                                c.provider.as_str(),
                            ))
                            .expect("every candidate has a slot"),
                        ),
                    }
                })
                .collect();
            models.push(ModelEntry {
                name: m.name.as_str().into(),
                upstreams,
            });
        }
        let by_name = models
            .iter()
            .enumerate()
            .map(|(i, m)| (Arc::clone(&m.name), i))
            .collect();
        Self {
            models,
            by_name,
            live,
        }
    }

    /// Every candidate's live slot, for the refresh to drain.
    pub fn live(&self) -> &grid_score::live::LiveBoard {
        &self.live
    }

    /// The entry for a model name.
    pub fn get(&self, name: &str) -> Option<&ModelEntry> {
        self.by_name.get(name).map(|&i| &self.models[i])
    }

    /// Every model, in configuration order.
    pub fn models(&self) -> &[ModelEntry] {
        &self.models
    }

    /// The model-to-candidates map grid-score refreshes over.
    pub fn routes(&self) -> grid_score::Routes {
        let mut routes = grid_score::Routes::new();
        for m in &self.models {
            let keys = m
                .upstreams
                .iter()
                .map(|u| {
                    grid_score::CandidateKey::new(Arc::clone(&u.site), Arc::clone(&u.provider))
                })
                .collect();
            routes.insert(Arc::clone(&m.name), keys);
        }
        routes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_prefix_is_kept_before_the_request_path() {
        let text = crate::config::EXAMPLE_CONFIG_TOML
            .replace("http://10.0.0.10:8000", "http://10.0.0.10:8000/site-a/");
        let c = Config::from_toml_str(&text).unwrap();
        let cat = Catalog::from_config(&c);
        let m = cat.get("llama-3.1-8b-instruct").unwrap();
        assert_eq!(
            m.upstreams[0].uri_for("/v1/chat/completions?x=1").unwrap(),
            "http://10.0.0.10:8000/site-a/v1/chat/completions?x=1"
        );
        assert_eq!(
            m.upstreams[1].uri_for("/v1/models").unwrap(),
            "https://gateway.b.example:8443/v1/models"
        );
        assert!(cat.get("nope").is_none());
    }
}
