//! The control step between poll and route: the store, the scorer and the refresh that
//! turns them into a routing view. Pure apart from the `now_ms` it is handed: the
//! gateway's poller drives it with the wall clock, the routing simulator with virtual
//! time, so both run the same rule.
//!
//! Two refreshes exist. A poll's ([`Refresher::refresh`]) runs after every poll, failed
//! ones included: time passing is what ages a silent site into "unmeasured". An
//! off-cycle one ([`Refresher::refresh_live`]) runs when a proxied answer said something
//! new about room or serving, at most once per [`LIVE_REFRESH_MIN_INTERVAL_MS`].

use std::sync::Arc;

use grid_signals::store::{IngestReport, Sender, Store, StoreConfig};

use crate::catalog::Catalog;
use crate::config::ScoreConfig;
use crate::error::Error;
use crate::from_store;
use crate::metrics::ScoreMetrics;
use crate::routing::RoutingView;
use crate::scorer::{Routes, Scorer};

/// The least time between two refreshes that answers' live evidence triggers (a poll's
/// own refresh is not held back): at a thousand answers a second the gateway still
/// refreshes at most twenty times a second, and a full band moves traffic within this
/// long of the answer that said so.
pub const LIVE_REFRESH_MIN_INTERVAL_MS: u64 = 50;

/// One refresh's result: the view to publish and the readings the scorer refused.
#[derive(Debug)]
pub struct Refreshed {
    /// The view to publish.
    pub view: RoutingView,
    /// Readings refused by the scorer in this refresh (counted on [`ScoreMetrics`] when
    /// the refresher has them).
    pub refused: Vec<Error>,
}

/// Store plus scorer for one gateway's configured candidates.
#[derive(Debug)]
pub struct Refresher {
    store: Store,
    scorer: Scorer,
    catalog: Arc<Catalog>,
    routes: Routes,
    metrics: Option<ScoreMetrics>,
    last_live_ms: Option<u64>,
    live_pending: bool,
}

impl Refresher {
    /// A refresher for `catalog`'s candidates; `metrics` (when given) receives the gauges
    /// of every refresh and the readings refused.
    pub fn new(
        catalog: Arc<Catalog>,
        score: ScoreConfig,
        store: StoreConfig,
        metrics: Option<ScoreMetrics>,
    ) -> Self {
        Self {
            store: Store::new(store),
            scorer: Scorer::new(score),
            routes: catalog.routes(),
            catalog,
            metrics,
            last_live_ms: None,
            live_pending: false,
        }
    }

    /// Ingests one relay body from the local operator (trusted for every site), dated
    /// `reference_ms` by its `Date`, at wall-clock `now_ms`.
    pub fn ingest(&mut self, body: &[u8], reference_ms: u64, now_ms: u64) -> IngestReport {
        self.store.ingest(body, Sender::Local, reference_ms, now_ms)
    }

    /// The store, for inspection.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Replaces the configured models with `models` (a reload of the configuration):
    /// every candidate kept keeps its learned capacity, saturation and turnover and its
    /// live slot; new candidates start unmeasured; a model kept keeps its shedding state.
    /// The next [`Refresher::refresh`] publishes the new catalog.
    pub fn replace_models(&mut self, models: &[crate::catalog::ModelSpec]) {
        let catalog = Arc::new(Catalog::carrying_over(models, &self.catalog));
        self.routes = catalog.routes();
        self.catalog = catalog;
    }

    /// The catalog refreshed over.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// Applies the store's events and feeds every entry's newest reading to the scorer
    /// ([`from_store::sync`]), folds in what proxied answers said since the last refresh
    /// ([`Scorer::feed_live`]), then builds the view to publish.
    pub fn refresh(&mut self, now_ms: u64) -> Refreshed {
        self.store.expire(now_ms);
        let synced = from_store::sync(&mut self.scorer, &mut self.store, now_ms);
        if let Some(m) = &self.metrics {
            for e in &synced.refused {
                if let Some(reason) = e.reason() {
                    m.rejected(reason);
                }
            }
        }
        Refreshed {
            view: self.build(now_ms),
            refused: synced.refused,
        }
    }

    fn build(&mut self, now_ms: u64) -> RoutingView {
        self.scorer.feed_live(self.catalog.live(), now_ms);
        let mut table = self.scorer.refresh(now_ms, &self.routes);
        if let Some(m) = &self.metrics {
            m.resolve(&mut table);
            m.publish(&table);
        }
        RoutingView::new(Arc::clone(&self.catalog), table)
    }

    /// An answer said something new about room or serving (a flow-control room signal,
    /// a 5xx, a failed exchange): an off-cycle refresh is wanted.
    pub fn wake_live(&mut self) {
        self.live_pending = true;
    }

    /// How long until an off-cycle refresh may run: `None` when none is wanted, `Some(0)`
    /// when one may run now.
    pub fn live_wait_ms(&self, now_ms: u64) -> Option<u64> {
        if !self.live_pending {
            return None;
        }
        Some(self.last_live_ms.map_or(0, |last| {
            (last + LIVE_REFRESH_MIN_INTERVAL_MS).saturating_sub(now_ms)
        }))
    }

    /// The off-cycle refresh, when one is wanted and due: the live slots folded in and a
    /// new table built from what the scorer already holds (the store only changes at a
    /// poll, whose own refresh reads it).
    pub fn refresh_live(&mut self, now_ms: u64) -> Option<RoutingView> {
        if self.live_wait_ms(now_ms) != Some(0) {
            return None;
        }
        self.last_live_ms = Some(now_ms);
        self.live_pending = false;
        Some(self.build(now_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{CandidateSpec, ModelSpec};

    fn refresher() -> Refresher {
        let catalog = Catalog::new(&[ModelSpec {
            name: "m".into(),
            candidates: vec![CandidateSpec {
                site: "a".into(),
                provider: "p".into(),
                scheme: "http".into(),
                authority: "a.example".into(),
                prefix: String::new(),
            }],
        }]);
        Refresher::new(
            Arc::new(catalog),
            ScoreConfig::default(),
            StoreConfig::default(),
            None,
        )
    }

    #[test]
    fn an_off_cycle_refresh_runs_only_when_woken_and_at_most_once_per_min_interval() {
        let mut r = refresher();
        assert!(r.refresh_live(1_000).is_none(), "not woken");
        r.wake_live();
        assert!(r.refresh_live(1_000).is_some());
        r.wake_live();
        assert_eq!(r.live_wait_ms(1_000), Some(LIVE_REFRESH_MIN_INTERVAL_MS));
        assert!(
            r.refresh_live(1_000 + LIVE_REFRESH_MIN_INTERVAL_MS - 1)
                .is_none()
        );
        assert!(
            r.refresh_live(1_000 + LIVE_REFRESH_MIN_INTERVAL_MS)
                .is_some()
        );
        assert_eq!(r.live_wait_ms(2_000), None);
    }

    #[test]
    fn a_poll_refresh_is_never_held_back_and_leaves_a_wanted_off_cycle_one_wanted() {
        let mut r = refresher();
        r.wake_live();
        assert!(r.refresh_live(1_000).is_some());
        r.wake_live();
        let _ = r.refresh(1_010);
        assert_eq!(r.live_wait_ms(1_010), Some(40));
    }
}
