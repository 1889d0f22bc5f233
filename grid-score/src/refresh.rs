//! The control step between poll and route: the store, the scorer, and the refresh that
//! turns them into a routing view. Pure apart from the `now_ms` it is handed; the poller
//! drives it, tests and embedders can drive it directly.

use std::sync::Arc;

use grid_score::{ScoreConfig, ScoreMetrics, Scorer};
use grid_signals::store::{IngestReport, Sender, Store, StoreConfig};

use crate::catalog::Catalog;
use crate::routing::RoutingView;

/// Store plus scorer for one gateway's configured candidates.
#[derive(Debug)]
pub struct Refresher {
    store: Store,
    scorer: Scorer,
    catalog: Arc<Catalog>,
    routes: grid_score::Routes,
    metrics: Option<ScoreMetrics>,
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

    /// Applies the store's events and feeds every entry's newest reading to the scorer
    /// (grid-score's `from_store::sync`), folds in what proxied responses said since the
    /// last refresh (`Scorer::feed_live`), then builds the view to publish. Run after every poll, failed ones included: time
    /// passing is what ages a silent site into "unmeasured".
    pub fn refresh(&mut self, now_ms: u64) -> RoutingView {
        self.store.expire(now_ms);
        let synced = grid_score::from_store::sync(&mut self.scorer, &mut self.store, now_ms);
        self.scorer.feed_live(self.catalog.live(), now_ms);
        for e in &synced.refused {
            tracing::debug!(error = %e, "reading refused");
            if let Some(m) = &self.metrics {
                m.rejected(e.reason());
            }
        }
        let table = self.scorer.refresh(now_ms, &self.routes);
        if let Some(m) = &self.metrics {
            m.publish(&table);
        }
        RoutingView::new(Arc::clone(&self.catalog), table)
    }
}
