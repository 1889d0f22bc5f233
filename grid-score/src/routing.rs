//! What the request path reads: one immutable routing view, the catalog and the table
//! of one refresh.
//!
//! The [`Refresher`](crate::refresh::Refresher) builds a new [`RoutingView`] after each
//! refresh; an embedder publishes it atomically (the gateway in an `ArcSwap`) and a
//! request loads it once and decides from that one view, never from the store.

use std::sync::Arc;

use crate::Rng;
use crate::catalog::{Catalog, ModelEntry, Upstream};
use crate::reading::CandidateKey;
use crate::select::Decision;
use crate::snapshot::RouteTable;

/// The selection label of the second attempt after a refused connection.
pub const RETRY_PATH: &str = "retry";

/// Where one request goes.
#[derive(Debug, Clone, Copy)]
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

/// One published routing state: the catalog and the table of the last refresh.
#[derive(Debug)]
pub struct RoutingView {
    catalog: Arc<Catalog>,
    table: RouteTable,
}

/// Retry-After seconds from the table's milliseconds: rounded up, at least 1, so a
/// client never retries at once.
fn retry_after_s(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

impl RoutingView {
    /// A view over `table`.
    pub fn new(catalog: Arc<Catalog>, table: RouteTable) -> Self {
        Self { catalog, table }
    }

    /// The catalog this view routes over.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The table of this view.
    pub fn table(&self) -> &RouteTable {
        &self.table
    }

    /// The table's pick for `model`, for callers that count decisions themselves.
    pub fn pick<R: Rng + ?Sized>(&self, model: &str, rng: &mut R) -> Decision<'_> {
        self.table.pick(model, rng)
    }

    /// Maps a decision onto the catalog: where to send the request, or how to refuse.
    pub fn route<'a>(&'a self, model: &str, decision: &Decision<'a>) -> Route<'a> {
        match decision {
            Decision::Route {
                candidate, path, ..
            } => {
                match self
                    .catalog
                    .get(model)
                    .and_then(|m| upstream_of(m, candidate.key()))
                {
                    Some(upstream) => Route::To {
                        upstream,
                        path: path.as_str(),
                    },
                    // The table and catalog are built from the same config, so this is
                    // unreachable in the daemon; refusing is the safe answer regardless.
                    None => Route::Unavailable { retry_after_s: 1 },
                }
            }
            Decision::Shed { retry_after_ms } => Route::Shed {
                retry_after_s: retry_after_s(*retry_after_ms),
            },
            Decision::Unavailable { retry_after_ms } => Route::Unavailable {
                retry_after_s: retry_after_s(*retry_after_ms),
            },
            Decision::UnknownModel => Route::UnknownModel,
        }
    }

    /// Where a request goes once when its first site, `failed_site`, refused it: a
    /// routable candidate of `model` elsewhere that has headroom (a site whose answers
    /// say it is full, by a full band or its own 429, has none), drawn by reach
    /// ([`RouteSnapshot::pick_elsewhere`](crate::snapshot::RouteSnapshot::pick_elsewhere)).
    pub fn retry_target<R: Rng + ?Sized>(
        &self,
        model: &str,
        failed_site: &str,
        rng: &mut R,
    ) -> Option<&Upstream> {
        let entry = self.catalog.get(model)?;
        let snapshot = self.table.get(model)?;
        let index = snapshot.pick_elsewhere(failed_site, rng)?;
        upstream_of(entry, snapshot.candidates()[index].key())
    }

    /// Whether `model` has at least one candidate that is not excluded.
    pub fn is_routable(&self, model: &str) -> bool {
        self.table
            .get(model)
            .is_some_and(|s| !s.candidates().is_empty())
    }

    /// Whether `model` is refusing with 429 now: it has healthy candidates but no path.
    pub fn is_shedding(&self, model: &str) -> bool {
        self.table
            .get(model)
            .is_some_and(|s| !s.candidates().is_empty() && s.path().is_none())
    }
}

fn upstream_of<'a>(entry: &'a ModelEntry, key: &CandidateKey) -> Option<&'a Upstream> {
    entry
        .upstreams
        .iter()
        .find(|u| u.site == key.site && u.provider == key.provider)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_s(0), 1);
        assert_eq!(retry_after_s(1), 1);
        assert_eq!(retry_after_s(1000), 1);
        assert_eq!(retry_after_s(1001), 2);
    }

    use crate::catalog::{CandidateSpec, ModelSpec};
    use crate::reading::CandidateKey;
    use crate::snapshot::{Candidate, Refusals, RouteSnapshot};

    /// Model `m` served by provider `p` at each of `sites`.
    fn catalog(sites: &[&str]) -> Catalog {
        let spec = |site: &str| CandidateSpec {
            site: site.into(),
            provider: "p".into(),
            scheme: "http".into(),
            authority: format!("{site}.example"),
            prefix: String::new(),
        };
        Catalog::new(&[ModelSpec {
            name: "m".into(),
            candidates: sites.iter().map(|s| spec(s)).collect(),
        }])
    }

    fn key(site: &str) -> CandidateKey {
        CandidateKey::new(site, "p")
    }

    #[test]
    fn a_refused_request_goes_to_a_site_with_headroom_before_a_less_loaded_full_one() {
        let catalog = catalog(&["a", "full", "room"]);
        // `full` reads less loaded, but its own answers say it is full (live factor 0).
        let candidates = vec![
            Candidate::measured(key("a"), 8.0, 0.5, 0.5, 0.0, false),
            Candidate::measured(key("full"), 8.0, 0.1, 0.1, 0.0, false).with_live(0.0, Some(0)),
            Candidate::measured(key("room"), 8.0, 0.6, 0.6, 0.0, false),
        ];
        let refusals = Refusals {
            shed_retry_after_ms: None,
            unavailable_retry_after_ms: 5_000,
        };
        let table =
            RouteTable::from_snapshots([RouteSnapshot::new("m", candidates, vec![], refusals)]);
        let view = RoutingView::new(Arc::new(catalog), table);
        let mut rng = crate::SplitMix64::new(1);
        for _ in 0..100 {
            assert_eq!(
                &*view.retry_target("m", "a", &mut rng).unwrap().site,
                "room"
            );
            // With no site elsewhere that has headroom, one whose answers do not say it is
            // full.
            assert_eq!(
                &*view.retry_target("m", "room", &mut rng).unwrap().site,
                "a"
            );
        }
    }

    #[test]
    fn a_burst_of_refused_requests_spreads_over_the_sites_with_room_by_their_reach() {
        let catalog = catalog(&["gone", "small", "large"]);
        // The least loaded elsewhere is the small site: a burst of refusals sent there
        // all at once would overflow it beside the large one's room.
        let candidates = vec![
            Candidate::measured(key("gone"), 64.0, 0.5, 0.5, 0.0, false),
            Candidate::measured(key("small"), 8.0, 0.2, 0.2, 0.0, false),
            Candidate::measured(key("large"), 32.0, 0.4, 0.4, 0.0, false),
        ];
        let refusals = Refusals {
            shed_retry_after_ms: None,
            unavailable_retry_after_ms: 5_000,
        };
        let snapshot = RouteSnapshot::new("m", candidates, vec![], refusals);
        let of = |site: &str| {
            snapshot
                .candidates()
                .iter()
                .find(|c| &**c.site() == site)
                .unwrap()
                .clone()
        };
        assert_eq!(&**snapshot.candidates()[0].site(), "small", "ranked first");
        assert!(of("small").headroom() > 0.0 && of("large").headroom() > 0.0);
        let want_large = of("large").reach() / (of("large").reach() + of("small").reach());
        let view = RoutingView::new(Arc::new(catalog), RouteTable::from_snapshots([snapshot]));
        let mut rng = crate::SplitMix64::new(7);
        let n = 10_000;
        let mut large = 0;
        for _ in 0..n {
            let site = &view.retry_target("m", "gone", &mut rng).unwrap().site;
            assert_ne!(&**site, "gone");
            large += usize::from(&**site == "large");
        }
        let share = large as f64 / f64::from(n);
        assert!((share - want_large).abs() < 0.02, "{share} vs {want_large}");
    }
}
