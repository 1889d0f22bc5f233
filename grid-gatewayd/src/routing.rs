//! What the request path reads: one immutable routing view, published atomically.
//!
//! The poller builds a new [`RoutingView`] after each committed ingest and stores it in
//! the shared [`Published`] slot; a request loads the slot once (`ArcSwap::load`: no lock,
//! no allocation) and decides from that one view, never from the store.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::catalog::{Catalog, Upstream};

/// The slot the poller publishes into and requests load from.
pub type Published = Arc<ArcSwap<RoutingView>>;

/// Where one request goes.
#[derive(Debug)]
pub enum Route<'a> {
    /// Send it to this upstream; `path` says which selection rule chose it (metric label).
    To {
        /// The chosen (site, provider) and its address.
        upstream: &'a Upstream,
        /// The selection rule that chose it.
        path: &'static str,
    },
    /// The model is shedding: answer 429 with this Retry-After.
    Shed {
        /// Seconds.
        retry_after_s: u64,
    },
    /// Every candidate is excluded: answer 503 with this Retry-After.
    Unavailable {
        /// Seconds.
        retry_after_s: u64,
    },
    /// No such model is configured: answer 404.
    UnknownModel,
}

/// One published routing state: the catalog and the order computed at the last refresh.
#[derive(Debug)]
pub struct RoutingView {
    catalog: Arc<Catalog>,
    unavailable_retry_after_s: u64,
}

impl RoutingView {
    /// The view before any reading arrived: every candidate unmeasured.
    pub fn unmeasured(catalog: Arc<Catalog>, unavailable_retry_after_s: u64) -> Self {
        Self {
            catalog,
            unavailable_retry_after_s,
        }
    }

    /// The catalog this view routes over.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Decides where a request for `model` goes, skipping `exclude_site` (a site that
    /// just refused a connection); `draw` is a uniform random word.
    pub fn decide(&self, model: &str, draw: u64, exclude_site: Option<&str>) -> Route<'_> {
        let Some(entry) = self.catalog.get(model) else {
            return Route::UnknownModel;
        };
        let eligible = |u: &&Upstream| exclude_site.is_none_or(|s| *u.site != *s);
        let n = entry.upstreams.iter().filter(eligible).count();
        if n == 0 {
            return Route::Unavailable {
                retry_after_s: self.unavailable_retry_after_s,
            };
        }
        let k = (draw % n as u64) as usize;
        let upstream = entry
            .upstreams
            .iter()
            .filter(eligible)
            .nth(k)
            .expect("k < n");
        Route::To {
            upstream,
            path: "unmeasured",
        }
    }

    /// Whether `model` has at least one candidate that could be routed to now.
    pub fn is_routable(&self, model: &str) -> bool {
        self.catalog
            .get(model)
            .is_some_and(|m| !m.upstreams.is_empty())
    }
}
