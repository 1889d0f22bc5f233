//! The configured models and where each is served, resolved once at start.
//!
//! The catalog is immutable: the request path borrows upstream addresses from it without
//! allocating, and each published routing view shares it by `Arc`. The embedder builds
//! it from its own validated configuration ([`ModelSpec`]); the simulator from its
//! scenario.

use std::collections::HashMap;
use std::sync::Arc;

use crate::live::{LiveBoard, LiveSlot};
use crate::reading::CandidateKey;
use crate::scorer::Routes;
pub use crate::tally::{Tally, TallyCounts};

/// One configured candidate, as the embedder's validated configuration gives it: the
/// serving base URL already split, so this crate parses no URLs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CandidateSpec {
    /// `grid_site`.
    pub site: String,
    /// `grid_provider`.
    pub provider: String,
    /// `http` or `https`.
    pub scheme: String,
    /// `host[:port]`.
    pub authority: String,
    /// Path prefix of the base URL (a trailing slash is dropped).
    pub prefix: String,
}

/// One configured model and where it is served, in preference-free configuration order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    /// The `model` value clients send.
    pub name: String,
    /// Where it is served.
    pub candidates: Vec<CandidateSpec>,
}

/// One place a model is served: the (site, provider) pair and its serving base URL.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// `grid_site`, also the `x-grid-site` answer header.
    pub site: Arc<str>,
    /// `grid_provider`.
    pub provider: Arc<str>,
    scheme: Arc<str>,
    authority: Arc<str>,
    /// Path prefix without a trailing slash (`""` for none).
    prefix: Arc<str>,
    /// Where the request path leaves what this candidate's responses said (shared by
    /// every model entry naming the same site and provider).
    live: Arc<LiveSlot>,
    /// What this model's requests did here (this entry's own: one per model and
    /// candidate), kept across a reload that keeps the candidate.
    tally: Arc<Tally>,
}

impl Upstream {
    /// The live slot of this (site, provider): the request path records each response's
    /// flow-control headers and outcome here, the refresh folds them in.
    pub fn live(&self) -> &LiveSlot {
        &self.live
    }

    /// The same slot, shared: a streamed answer's body holds it until its end.
    pub fn live_shared(&self) -> Arc<LiveSlot> {
        self.live.clone()
    }

    /// Counts a request sent here now; its end is counted when the guard is dropped
    /// (hold it until the exchange is over, however it ends).
    pub fn in_flight(&self) -> crate::live::InFlight {
        self.live.in_flight()
    }

    /// What this model's requests did here (the routing evidence's recent counts).
    pub fn tally(&self) -> &Tally {
        &self.tally
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// `host[:port]` of the serving base URL.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The base URL's path prefix, no trailing slash (`""` for none): it goes before the
    /// client's path.
    pub fn prefix(&self) -> &str {
        &self.prefix
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
    /// Hashed with [`crate::FastBuild`]: looked up once per request.
    by_name: crate::hash::FastMap<Arc<str>, usize>,
    live: LiveBoard,
}

impl Catalog {
    /// The catalog of `models`, one live slot per distinct (site, provider).
    pub fn new(models: &[ModelSpec]) -> Self {
        Self::build(models, None)
    }

    /// Every configured candidate's tally now, models in configuration order and each
    /// model's candidates in theirs: what the refresher's recent window samples.
    pub fn tallies(&self) -> Vec<TallyCounts> {
        self.models
            .iter()
            .flat_map(|m| m.upstreams.iter().map(|u| u.tally.counts()))
            .collect()
    }

    /// The catalog of `models` for a reload of the configuration: every (site, provider)
    /// `previous` also names keeps its live slot, so answers still streaming record where
    /// the refresh reads, and a kept candidate keeps what its answers taught (turnover,
    /// first-byte speed, room). New candidates start fresh; dropped ones are forgotten.
    pub fn carrying_over(models: &[ModelSpec], previous: &Catalog) -> Self {
        Self::build(models, Some(previous))
    }

    fn build(models: &[ModelSpec], previous_catalog: Option<&Catalog>) -> Self {
        let previous = previous_catalog.map(|c| &c.live);
        let kept_tally = |model: &str, site: &str, provider: &str| {
            previous_catalog
                .and_then(|c| c.get(model))
                .and_then(|m| {
                    m.upstreams
                        .iter()
                        .find(|u| &*u.site == site && &*u.provider == provider)
                })
                .map_or_else(Arc::default, |u| Arc::clone(&u.tally))
        };
        let mut sites: HashMap<&str, Arc<str>> = HashMap::new();
        let keys: Vec<CandidateKey> = models
            .iter()
            .flat_map(|m| &m.candidates)
            .map(|c| CandidateKey::new(c.site.as_str(), c.provider.as_str()))
            .collect();
        let live = match previous {
            Some(previous) => LiveBoard::carrying_over(&keys, previous),
            None => LiveBoard::new(&keys),
        };
        let mut entries = Vec::with_capacity(models.len());
        for m in models {
            let upstreams = m
                .candidates
                .iter()
                .map(|c| {
                    let site = Arc::clone(
                        sites
                            .entry(c.site.as_str())
                            .or_insert_with(|| c.site.as_str().into()),
                    );
                    let key = CandidateKey::new(c.site.as_str(), c.provider.as_str());
                    Upstream {
                        site,
                        provider: c.provider.as_str().into(),
                        scheme: c.scheme.as_str().into(),
                        authority: c.authority.as_str().into(),
                        prefix: c.prefix.trim_end_matches('/').into(),
                        live: Arc::clone(live.slot(&key).unwrap_or_else(|| {
                            unreachable!("the board has a slot for every candidate")
                        })),
                        tally: kept_tally(&m.name, &c.site, &c.provider),
                    }
                })
                .collect();
            entries.push(ModelEntry {
                name: m.name.as_str().into(),
                upstreams,
            });
        }
        let by_name = entries
            .iter()
            .enumerate()
            .map(|(i, m)| (Arc::clone(&m.name), i))
            .collect();
        Self {
            models: entries,
            by_name,
            live,
        }
    }

    /// Every candidate's live slot, for the refresh to drain.
    pub fn live(&self) -> &LiveBoard {
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
    pub fn routes(&self) -> Routes {
        let mut routes = Routes::new();
        for m in &self.models {
            let keys = m
                .upstreams
                .iter()
                .map(|u| CandidateKey::new(Arc::clone(&u.site), Arc::clone(&u.provider)))
                .collect();
            routes.insert(Arc::clone(&m.name), keys);
        }
        routes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(site: &str, provider: &str) -> CandidateSpec {
        CandidateSpec {
            site: site.into(),
            provider: provider.into(),
            scheme: "http".into(),
            authority: format!("{site}.example:8000"),
            prefix: "/serve/".into(),
        }
    }

    #[test]
    fn a_reload_keeps_the_live_slot_of_every_kept_candidate_and_makes_new_ones() {
        let spec = |name: &str, sites: &[&str]| ModelSpec {
            name: name.into(),
            candidates: sites
                .iter()
                .map(|s| CandidateSpec {
                    site: (*s).into(),
                    provider: "p".into(),
                    scheme: "http".into(),
                    authority: "h:1".into(),
                    prefix: String::new(),
                })
                .collect(),
        };
        let before = Catalog::new(&[spec("m", &["a", "b"])]);
        let after = Catalog::carrying_over(&[spec("m", &["a", "c"]), spec("n", &["a"])], &before);
        let slot = |c: &Catalog, model: &str, site: &str| {
            c.get(model)
                .unwrap()
                .upstreams
                .iter()
                .find(|u| &*u.site == site)
                .unwrap()
                .live_shared()
        };
        assert!(Arc::ptr_eq(
            &slot(&before, "m", "a"),
            &slot(&after, "m", "a")
        ));
        assert!(Arc::ptr_eq(
            &slot(&before, "m", "a"),
            &slot(&after, "n", "a")
        ));
        assert!(!Arc::ptr_eq(
            &slot(&before, "m", "b"),
            &slot(&after, "m", "c")
        ));
        assert!(after.get("n").is_some());
    }

    #[test]
    fn models_naming_the_same_site_and_provider_share_one_live_slot() {
        let cat = Catalog::new(&[
            ModelSpec {
                name: "m1".into(),
                candidates: vec![candidate("a", "p"), candidate("b", "p")],
            },
            ModelSpec {
                name: "m2".into(),
                candidates: vec![candidate("a", "p")],
            },
        ]);
        let a1 = &cat.get("m1").unwrap().upstreams[0];
        let a2 = &cat.get("m2").unwrap().upstreams[0];
        assert!(std::ptr::eq(a1.live(), a2.live()));
        assert_eq!(a1.prefix(), "/serve");
        assert_eq!(a1.authority(), "a.example:8000");
        let routes = cat.routes();
        let m1 = routes
            .iter()
            .find(|(m, _)| &***m == "m1")
            .map(|(_, c)| c.len());
        assert_eq!(m1, Some(2));
        assert!(cat.get("nope").is_none());
    }
}
