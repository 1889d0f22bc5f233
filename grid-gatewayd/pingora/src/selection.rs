//! grid's pick as a Pingora `BackendSelection`.
//!
//! Round-robin and Ketama choose from the backend set alone; grid chooses from its
//! routing view, which the poller replaces after every poll. The view comes in as the
//! selection's configuration (`LoadBalancer::from_backends_with_config(backends,
//! Some(published))`), so a rebuild on a backend change keeps reading the same slot, and
//! every `iter` reads the view of that moment.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use grid_gateway::request_rng::ThreadRng;
use grid_gateway::upstream::Published;
use grid_score::live::LiveSlot;
use grid_score::routing::Route;
use pingora_load_balancing::Backend;
use pingora_load_balancing::selection::{BackendIter, BackendSelection};

use crate::SiteOf;

/// In a backend [`GridSelection::iter`] yields: the live slot of the (model, site) it was
/// chosen for. The proxy counts its request in flight there from when it is sent until
/// the request is over ([`LiveSlot::in_flight`], held in the request's context), as
/// grid's own gateway does: the picks between two polls then see the requests this
/// proxy already sent, not only what the last poll read.
#[derive(Clone, Debug)]
pub struct ChosenFor(pub Arc<LiveSlot>);

/// Backends chosen by grid: the key is the request's model.
pub struct GridSelection {
    by_site: HashMap<Arc<str>, Backend>,
    published: Option<Published>,
}

impl std::fmt::Debug for GridSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GridSelection")
            .field("sites", &self.by_site.len())
            .finish_non_exhaustive()
    }
}

impl BackendSelection for GridSelection {
    type Iter = GridIter;
    type Config = Published;

    fn build_with_config(backends: &BTreeSet<Backend>, published: &Published) -> Self {
        let mut selection = Self::build(backends);
        selection.published = Some(published.clone());
        selection
    }

    /// Without a view every `iter` is empty: there is nothing to pick from.
    fn build(backends: &BTreeSet<Backend>) -> Self {
        let by_site = backends
            .iter()
            .filter_map(|b| Some((b.ext.get::<SiteOf>()?.site.clone(), b.clone())))
            .collect();
        Self {
            by_site,
            published: None,
        }
    }

    fn iter(self: &Arc<Self>, key: &[u8]) -> GridIter {
        let mut order = [None, None];
        if let (Some(published), Ok(model)) = (&self.published, std::str::from_utf8(key)) {
            let view = published.load();
            let decision = view.pick(model, &mut ThreadRng);
            let chosen = |u: &grid_score::catalog::Upstream| {
                let mut backend = self.by_site.get(&u.site)?.clone();
                backend.ext.insert(ChosenFor(u.live_shared()));
                Some(backend)
            };
            if let Route::To { upstream, .. } = view.route(model, &decision) {
                order[0] = chosen(upstream);
                order[1] = view
                    .retry_target(model, &upstream.site, &mut ThreadRng)
                    .and_then(chosen);
            }
        }
        GridIter {
            order,
            next: 0,
            current: None,
        }
    }
}

/// grid's pick, then the site a refused connection is retried on; nothing when grid
/// refuses (shedding, every site excluded, an unknown model).
#[derive(Debug)]
pub struct GridIter {
    order: [Option<Backend>; 2],
    next: usize,
    current: Option<Backend>,
}

impl BackendIter for GridIter {
    fn next(&mut self) -> Option<&Backend> {
        while self.next < self.order.len() {
            let item = self.order[self.next].take();
            self.next += 1;
            if item.is_some() {
                self.current = item;
                return self.current.as_ref();
            }
        }
        None
    }
}
