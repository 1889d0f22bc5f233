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

use crate::catalog::{Catalog, Upstream};
use crate::config::ScoreConfig;
use crate::error::Error;
use crate::from_store;
use crate::live::{EjectReason, LiveSlot, OutlierChange, Rejoin};
use crate::metrics::ScoreMetrics;
use crate::reading::CandidateKey;
use crate::routing::RoutingView;
use crate::scorer::{Routes, Scorer};

/// The least time between two refreshes that answers' live evidence triggers (a poll's
/// own refresh is not held back): at a thousand answers a second the gateway still
/// refreshes at most twenty times a second, and a full band moves traffic within this
/// long of the answer that said so.
pub const LIVE_REFRESH_MIN_INTERVAL_MS: u64 = 50;

/// How far back the routing evidence's recent counts reach (each candidate's picks,
/// refusals, failures and retries: [`crate::RouteSnapshot::recent`]): a minute, long
/// enough to read a share from at a request a second, short enough to show a change.
pub const EVIDENCE_WINDOW_MS: u64 = 60_000;

/// The least time between two samples the evidence window keeps: it holds at most
/// [`EVIDENCE_WINDOW_MS`] / this + 2 samples, however often the refresh runs.
pub const EVIDENCE_SAMPLE_MS: u64 = 1_000;

/// Samples of every candidate's cumulative tallies, oldest first: the oldest is the last
/// one at or before the window's start, so a difference with it spans the window.
#[derive(Debug, Default)]
struct EvidenceWindow {
    samples: std::collections::VecDeque<(u64, Vec<crate::catalog::TallyCounts>)>,
}

impl EvidenceWindow {
    /// Keeps `now` as a sample of `now_ms` (unless the newest is younger than
    /// [`EVIDENCE_SAMPLE_MS`]) and drops what the window no longer needs; the sample to
    /// take differences from and the span since it.
    fn observe(
        &mut self,
        now_ms: u64,
        now: Vec<crate::catalog::TallyCounts>,
    ) -> (&[crate::catalog::TallyCounts], u64) {
        let due = self
            .samples
            .back()
            .is_none_or(|(at, _)| now_ms.saturating_sub(*at) >= EVIDENCE_SAMPLE_MS);
        if due {
            self.samples.push_back((now_ms, now));
        }
        let start = now_ms.saturating_sub(EVIDENCE_WINDOW_MS);
        while self.samples.get(1).is_some_and(|(at, _)| *at <= start) {
            self.samples.pop_front();
        }
        match self.samples.front() {
            Some((at, base)) => (base, now_ms.saturating_sub(*at)),
            None => (&[], 0),
        }
    }

    /// Forgets every sample (the catalog changed shape).
    fn clear(&mut self) {
        self.samples.clear();
    }

    /// Samples held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.samples.len()
    }
}

/// One refresh's result: the view to publish, the readings the scorer refused and what
/// changed about routing.
#[derive(Debug)]
pub struct Refreshed {
    /// The view to publish.
    pub view: RoutingView,
    /// Readings refused by the scorer in this refresh (counted on [`ScoreMetrics`] when
    /// the refresher has them).
    pub refused: Vec<Error>,
    /// What changed about routing since the refresh before (none at the first): each
    /// happens once per change, for the daemon to log and the simulator to count.
    pub events: Vec<RoutingEvent>,
}

/// A change in how a model or a candidate is routed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoutingEvent {
    /// A candidate was ejected for failing (counted on [`ScoreMetrics`]).
    Ejected {
        /// The candidate.
        key: CandidateKey,
        /// Why.
        reason: EjectReason,
        /// When its ejection ends unless a probe answers first.
        until_ms: u64,
    },
    /// An ejected candidate is back in selection.
    Rejoined {
        /// The candidate.
        key: CandidateKey,
        /// What brought it back.
        cause: Rejoin,
    },
    /// Every candidate of the model is out: it answers 503.
    Unroutable {
        /// The model.
        model: Arc<str>,
    },
    /// The model routes again.
    Routable {
        /// The model.
        model: Arc<str>,
    },
    /// No candidate of the model has a signal (every one unmeasured): it is routed by
    /// learned capacity alone, as Envoy's panic threshold does.
    WithoutSignals {
        /// The model.
        model: Arc<str>,
    },
    /// A signal is back for the model: it is routed by load again.
    SignalsBack {
        /// The model.
        model: Arc<str>,
    },
}

/// What the events compare between two refreshes: per model, whether it routes and
/// whether it routes without any signal.
type ModelStates = std::collections::HashMap<Arc<str>, (bool, bool), crate::FastBuild>;

fn model_states(table: &crate::snapshot::RouteTable) -> ModelStates {
    table
        .iter()
        .map(|s| {
            let routable = !s.candidates().is_empty();
            let blind = s.path() == Some(crate::Path::Fallback);
            (Arc::clone(s.model()), (routable, blind))
        })
        .collect()
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
    /// The models' states at the last refresh; none before the first.
    models: Option<ModelStates>,
    /// The tallies' samples the snapshots' recent counts are read against.
    evidence: EvidenceWindow,
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
            models: None,
            evidence: EvidenceWindow::default(),
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
        self.evidence.clear();
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
        let (view, events) = self.build(now_ms);
        Refreshed {
            view,
            refused: synced.refused,
            events,
        }
    }

    fn build(&mut self, now_ms: u64) -> (RoutingView, Vec<RoutingEvent>) {
        let (changes, _) = self.scorer.feed_live(self.catalog.live(), now_ms);
        let mut events = Vec::new();
        for (key, change) in changes {
            events.push(match change {
                OutlierChange::Ejected { reason, until_ms } => {
                    if let Some(m) = &self.metrics {
                        m.ejection(&key, reason);
                    }
                    RoutingEvent::Ejected {
                        key,
                        reason,
                        until_ms,
                    }
                }
                OutlierChange::Rejoined { cause } => RoutingEvent::Rejoined { key, cause },
            });
        }
        let mut table = self.scorer.refresh(now_ms, &self.routes);
        self.attach_recent(now_ms, &mut table);
        self.attach_requests(&mut table);
        if let Some(m) = &self.metrics {
            m.resolve(&mut table);
            m.publish(&table);
        }
        let models = model_states(&table);
        if let Some(before) = &self.models {
            for (model, &(routable, blind)) in &models {
                let (was_routable, was_blind) = before.get(model).copied().unwrap_or((true, false));
                let model = || Arc::clone(model);
                if was_routable && !routable {
                    events.push(RoutingEvent::Unroutable { model: model() });
                } else if !was_routable && routable {
                    events.push(RoutingEvent::Routable { model: model() });
                }
                if !was_blind && blind {
                    events.push(RoutingEvent::WithoutSignals { model: model() });
                } else if was_blind && !blind {
                    events.push(RoutingEvent::SignalsBack { model: model() });
                }
            }
        }
        self.models = Some(models);
        (RoutingView::new(Arc::clone(&self.catalog), table), events)
    }

    /// Gives each candidate the live slot the request path counts its requests in, so a
    /// pick reads them as they stand ([`crate::snapshot::Candidate::requests_now`]).
    /// The board is indexed once per refresh: looked up by scanning it, every candidate of
    /// every model would read every slot.
    fn attach_requests(&self, table: &mut crate::snapshot::RouteTable) {
        let slots: std::collections::HashMap<&CandidateKey, &Arc<LiveSlot>, crate::FastBuild> =
            self.catalog.live().iter().collect();
        for m in self.catalog.models() {
            if let Some(snapshot) = table.get_mut(&m.name) {
                snapshot.count_requests_in(|key| slots.get(key).map(|slot| Arc::clone(slot)));
            }
        }
    }

    /// Gives each snapshot its candidates' counts over the evidence window.
    fn attach_recent(&mut self, now_ms: u64, table: &mut crate::snapshot::RouteTable) {
        let now = self.catalog.tallies();
        let current = now.clone();
        let (base, span_ms) = self.evidence.observe(now_ms, now);
        let mut at = 0;
        for m in self.catalog.models() {
            let counts = current.get(at..at + m.upstreams.len()).unwrap_or_default();
            let bases = base.get(at..at + m.upstreams.len()).unwrap_or_default();
            at += m.upstreams.len();
            if let Some(snapshot) = table.get_mut(&m.name) {
                snapshot.recent = m
                    .upstreams
                    .iter()
                    .zip(counts)
                    .enumerate()
                    .map(|(i, (u, c))| {
                        let key = CandidateKey::new(Arc::clone(&u.site), Arc::clone(&u.provider));
                        (key, c.since(bases.get(i).copied().unwrap_or_default()))
                    })
                    .collect();
                snapshot.recent_span_ms = span_ms;
            }
        }
    }

    /// The candidates ejected for failing whose probe is due at `now_ms`, with where
    /// they are served (for each model naming them, once per candidate): the daemon
    /// probes each and records what it found in the candidate's live slot
    /// ([`crate::live::LiveSlot::record_probe`]).
    pub fn probes_due(&mut self, now_ms: u64) -> Vec<Upstream> {
        let due = self.scorer.probes_due(now_ms);
        let mut found: Vec<Upstream> = Vec::new();
        for key in due {
            let upstream = self.catalog.models().iter().find_map(|m| {
                m.upstreams
                    .iter()
                    .find(|u| u.site == key.site && u.provider == key.provider)
            });
            if let Some(u) = upstream {
                found.push(u.clone());
            }
        }
        found
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
    pub fn refresh_live(&mut self, now_ms: u64) -> Option<Refreshed> {
        if self.live_wait_ms(now_ms) != Some(0) {
            return None;
        }
        self.last_live_ms = Some(now_ms);
        self.live_pending = false;
        let (view, events) = self.build(now_ms);
        Some(Refreshed {
            view,
            refused: Vec::new(),
            events,
        })
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

    /// A refresher of model `m` served at sites `sites` (provider `p` each).
    fn refresher_of(sites: &[&str]) -> Refresher {
        let candidates = sites
            .iter()
            .map(|site| CandidateSpec {
                site: (*site).into(),
                provider: "p".into(),
                scheme: "http".into(),
                authority: format!("{site}.example"),
                prefix: String::new(),
            })
            .collect();
        let catalog = Catalog::new(&[ModelSpec {
            name: "m".into(),
            candidates,
        }]);
        Refresher::new(
            Arc::new(catalog),
            ScoreConfig::default(),
            StoreConfig::default(),
            None,
        )
    }

    fn slot<'r>(r: &'r Refresher, site: &str) -> &'r LiveSlot {
        r.catalog()
            .live()
            .slot(&CandidateKey::new(site, "p"))
            .unwrap()
    }

    /// As many failures of `site`'s exchanges in a row as eject it.
    fn fail_in_a_row(r: &Refresher, site: &str) {
        for _ in 0..crate::live::CONSECUTIVE_FAILURES {
            slot(r, site).record_failure();
        }
    }

    fn excluded(view: &RoutingView) -> Vec<String> {
        view.table()
            .get("m")
            .unwrap()
            .excluded()
            .iter()
            .map(|e| format!("{}:{}", e.key.site, e.reason.as_str()))
            .collect()
    }

    #[test]
    fn a_site_failing_in_a_row_is_ejected_probed_and_back_once_a_probe_answers() {
        use crate::live::PROBE_INTERVAL_MS;
        let mut r = refresher_of(&["a", "b"]);
        let t0 = 1_000_000;
        r.refresh(t0);
        fail_in_a_row(&r, "a");
        let refreshed = r.refresh_live_now(t0 + 10);
        assert_eq!(excluded(&refreshed.view), ["a:ejected"]);
        assert!(matches!(
            refreshed.events.as_slice(),
            [RoutingEvent::Ejected { key, reason: EjectReason::Consecutive, .. }] if &*key.site == "a"
        ));
        // Probed every interval while out, never before.
        assert!(r.probes_due(t0 + 10 + PROBE_INTERVAL_MS - 1).is_empty());
        let due = r.probes_due(t0 + 10 + PROBE_INTERVAL_MS);
        assert_eq!(due.len(), 1);
        assert_eq!(&*due[0].site, "a");
        assert!(r.probes_due(t0 + 10 + PROBE_INTERVAL_MS).is_empty());
        // A failed probe keeps it out; an answered one brings it back at the next refresh.
        slot(&r, "a").record_probe(false);
        let still = r.refresh_live_now(t0 + 3_000);
        assert_eq!(excluded(&still.view), ["a:ejected"]);
        slot(&r, "a").record_probe(true);
        let back = r.refresh_live_now(t0 + 4_000);
        assert!(excluded(&back.view).is_empty());
        assert!(matches!(
            back.events.as_slice(),
            [RoutingEvent::Rejoined {
                cause: Rejoin::Probe,
                ..
            }]
        ));
    }

    #[test]
    fn a_model_never_has_more_than_its_share_of_sites_ejected() {
        let mut r = refresher_of(&["a", "b"]);
        let t0 = 1_000_000;
        r.refresh(t0);
        fail_in_a_row(&r, "a");
        r.refresh_live_now(t0 + 10);
        fail_in_a_row(&r, "b");
        let both = r.refresh_live_now(t0 + 20);
        // Both failing: the first ejected stays out, the other stays in, weighted down.
        assert_eq!(excluded(&both.view), ["a:ejected"]);
        assert!(both.view.is_routable("m"));
    }

    #[test]
    fn a_lone_failing_site_stays_in_and_the_first_refresh_reports_no_change() {
        let mut r = refresher_of(&["a"]);
        let t0 = 1_000_000;
        assert!(
            r.refresh(t0).events.is_empty(),
            "nothing said at the first refresh"
        );
        // Nothing measured yet: without signals all along, so no change to report.
        assert!(r.refresh(t0 + 1_000).events.is_empty());
        // The one site fails: with one candidate, ejecting it would leave nothing, so it
        // stays in (weighted down) and the model stays routable.
        fail_in_a_row(&r, "a");
        let refreshed = r.refresh_live_now(t0 + 2_000);
        assert!(refreshed.view.is_routable("m"));
        assert!(excluded(&refreshed.view).is_empty());
    }

    /// A relay body with one batch of site `site`'s pool series at `stamp`, sequence
    /// `seq`: ready `ready`, two endpoints, one request running on each.
    fn relay(site: &str, seq: u64, stamp: u64, ready: f64) -> Vec<u8> {
        use grid_signals::batch::{Batch, BatchMeta, Fence, Row};
        let rows: Vec<Row> = [
            (grid_signals::epp::READY, ready),
            (grid_signals::epp::EPP_READY_ENDPOINTS, 2.0),
            (grid_signals::epp::EPP_AVERAGE_RUNNING, 1.0),
            (grid_signals::epp::EPP_AVERAGE_QUEUE, 0.0),
        ]
        .into_iter()
        .map(|(name, value)| Row::new(name, vec![], value, stamp).unwrap())
        .collect();
        let meta = BatchMeta::new(
            site,
            "p",
            "u1",
            Fence::new(1_000, seq),
            rows.len() as u64,
            1,
            stamp,
        )
        .unwrap();
        let mut out = Vec::new();
        Batch::new(meta, rows).write(&mut out);
        out
    }

    #[test]
    fn a_model_that_loses_every_signal_or_every_site_says_so_once_and_again_when_back() {
        let fresh = ScoreConfig::default().fresh_for_ms;
        let mut r = refresher_of(&["a"]);
        let t0 = 1_700_000_000_000;
        r.ingest(&relay("a", 1, t0, 1.0), t0, t0);
        assert!(
            r.refresh(t0).events.is_empty(),
            "the first refresh reports nothing"
        );
        // The site's readings age out: no signal left.
        let blind = r.refresh(t0 + fresh + 1);
        assert_eq!(
            blind.events,
            [RoutingEvent::WithoutSignals { model: "m".into() }]
        );
        assert!(r.refresh(t0 + fresh + 2).events.is_empty(), "once");
        // A reading returns, then says the site is not ready, then ready again.
        let t1 = t0 + fresh + 3;
        r.ingest(&relay("a", 2, t1, 1.0), t1, t1);
        assert_eq!(
            r.refresh(t1).events,
            [RoutingEvent::SignalsBack { model: "m".into() }]
        );
        r.ingest(&relay("a", 3, t1 + 1, 0.0), t1 + 1, t1 + 1);
        assert_eq!(
            r.refresh(t1 + 1).events,
            [RoutingEvent::Unroutable { model: "m".into() }]
        );
        assert!(r.refresh(t1 + 2).events.is_empty(), "once");
        r.ingest(&relay("a", 4, t1 + 3, 1.0), t1 + 3, t1 + 3);
        assert_eq!(
            r.refresh(t1 + 3).events,
            [RoutingEvent::Routable { model: "m".into() }]
        );
    }

    #[test]
    fn the_evidence_window_keeps_one_sample_per_interval_and_spans_at_most_its_window() {
        use crate::catalog::TallyCounts;
        let mut w = EvidenceWindow::default();
        let t0 = 1_000_000;
        let counts = |picks| {
            vec![TallyCounts {
                picks,
                ..TallyCounts::default()
            }]
        };
        // Refreshed every 50 ms for five minutes: at most one sample per interval is kept,
        // and never more than the window needs.
        let mut t = t0;
        let bound = (EVIDENCE_WINDOW_MS / EVIDENCE_SAMPLE_MS) as usize + 2;
        while t <= t0 + 5 * EVIDENCE_WINDOW_MS {
            let (_, span) = w.observe(t, counts(t - t0));
            assert!(span <= EVIDENCE_WINDOW_MS + EVIDENCE_SAMPLE_MS, "{span}");
            assert!(w.len() <= bound, "{} samples", w.len());
            t += 50;
        }
        // Exactly a window after a sample, that sample is still the base; one past it, no.
        let mut w = EvidenceWindow::default();
        w.observe(t0, counts(0));
        w.observe(t0 + EVIDENCE_SAMPLE_MS, counts(1));
        let (base, span) = w.observe(t0 + EVIDENCE_WINDOW_MS, counts(2));
        assert_eq!((base[0].picks, span), (0, EVIDENCE_WINDOW_MS));
        let (base, span) = w.observe(t0 + EVIDENCE_WINDOW_MS + EVIDENCE_SAMPLE_MS, counts(3));
        assert_eq!((base[0].picks, span), (1, EVIDENCE_WINDOW_MS));
    }

    #[test]
    fn a_published_view_reads_the_requests_each_site_holds_at_the_pick_not_at_its_refresh() {
        let mut r = refresher_of(&["a", "b"]);
        let view = r.refresh(1_000_000).view;
        let snapshot = view.table().get("m").unwrap();
        let share_of_a = || {
            let mut rng = crate::SplitMix64::new(21);
            let n = 20_000;
            let a = (0..n)
                .filter(|_| match snapshot.pick(&mut rng) {
                    crate::Decision::Route { candidate, .. } => &**candidate.site() == "a",
                    other => panic!("routes: {other:?}"),
                })
                .count();
            a as f64 / f64::from(n)
        };
        let even = share_of_a();
        assert!((even - 0.5).abs() < 0.02, "{even}");
        // Sent after the view was built: the same view reads them at the next pick, and
        // "a" is sent only when both draws fall on it.
        let a = &r.catalog().get("m").unwrap().upstreams[0];
        assert_eq!(&*a.site, "a");
        let held: Vec<_> = (0..6).map(|_| a.in_flight()).collect();
        let requests: Vec<_> = snapshot
            .candidates()
            .iter()
            .map(|c| (c.site().to_string(), c.requests_now()))
            .collect();
        assert!(requests.contains(&("a".into(), Some(6))), "{requests:?}");
        assert!(requests.contains(&("b".into(), Some(0))), "{requests:?}");
        let held_at_a = share_of_a();
        assert!((held_at_a - 0.25).abs() < 0.02, "{held_at_a}");
        drop(held);
        assert!(
            (share_of_a() - even).abs() < 1e-12,
            "ended, the picks are as before"
        );
    }

    #[test]
    fn each_snapshot_counts_what_its_model_did_at_each_candidate_over_the_window() {
        let mut r = refresher_of(&["a", "b"]);
        let t0 = 1_000_000;
        r.refresh(t0);
        let m = r.catalog().get("m").unwrap();
        for _ in 0..3 {
            m.upstreams[0].tally().picked();
        }
        m.upstreams[0].tally().refused();
        m.upstreams[0].tally().retried_away();
        m.upstreams[1].tally().retried_here();
        let view = r.refresh(t0 + 10_000).view;
        let recent = view.table().get("m").unwrap().recent();
        assert_eq!(recent.len(), 2);
        assert_eq!(&*recent[0].0.site, "a");
        assert_eq!(
            (
                recent[0].1.picks,
                recent[0].1.refused,
                recent[0].1.retried_away
            ),
            (3, 1, 1)
        );
        assert_eq!((recent[1].1.picks, recent[1].1.retried_here), (0, 1));
        // Once the window has passed them, they are not recent any more.
        let later = r
            .refresh(t0 + 10_000 + EVIDENCE_WINDOW_MS + EVIDENCE_SAMPLE_MS)
            .view;
        assert_eq!(later.table().get("m").unwrap().recent()[0].1.picks, 0);
        // A reload keeps a kept candidate's tally.
        let kept = r.catalog().get("m").unwrap().upstreams[0].tally().counts();
        r.replace_models(&[ModelSpec {
            name: "m".into(),
            candidates: vec![CandidateSpec {
                site: "a".into(),
                provider: "p".into(),
                scheme: "http".into(),
                authority: "a.example".into(),
                prefix: String::new(),
            }],
        }]);
        assert_eq!(
            r.catalog().get("m").unwrap().upstreams[0].tally().counts(),
            kept
        );
    }

    #[test]
    fn the_exclusion_series_says_the_one_reason_a_candidate_is_out() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = ScoreMetrics::register(&mut registry);
        let mut r = refresher_of(&["a", "b"]);
        r.metrics = Some(metrics);
        let t0 = 1_000_000;
        r.refresh(t0);
        fail_in_a_row(&r, "a");
        r.refresh_live_now(t0 + 10);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let line = |site: &str, reason: &str| {
            format!("score_excluded{{site=\"{site}\",provider=\"p\",reason=\"{reason}\"}}")
        };
        assert!(
            text.contains(&format!("{} 1\n", line("a", "ejected"))),
            "{text}"
        );
        assert!(
            text.contains(&format!("{} 0\n", line("a", "not_ready"))),
            "{text}"
        );
        assert!(
            text.contains(&format!("{} 0\n", line("b", "ejected"))),
            "{text}"
        );
        assert!(
            text.contains("score_signal_age_seconds{site=\"a\",provider=\"p\"} NaN"),
            "{text}"
        );
    }

    #[test]
    fn an_ejected_candidate_says_since_when_and_until_when_it_is_out() {
        use crate::live::BASE_EJECTION_MS;
        let mut r = refresher_of(&["a", "b"]);
        let t0 = 1_000_000;
        r.refresh(t0);
        fail_in_a_row(&r, "a");
        let view = r.refresh_live_now(t0 + 10).view;
        let snapshot = view.table().get("m").unwrap();
        let out = &snapshot.excluded()[0];
        assert_eq!(out.reason, crate::ExcludeReason::Ejected);
        assert_eq!(out.since_ms, Some(t0 + 10));
        assert_eq!(out.until_ms, Some(t0 + 10 + BASE_EJECTION_MS));
        assert!(out.evidence.failures > 0.0);
        assert_eq!(snapshot.refreshed_at_ms(), t0 + 10);
        // The one left takes every pick the plan makes.
        assert_eq!(snapshot.plan_shares(), [1.0]);
    }

    impl Refresher {
        /// An off-cycle refresh at `now_ms`, woken and due whatever came before.
        fn refresh_live_now(&mut self, now_ms: u64) -> Refreshed {
            self.wake_live();
            self.last_live_ms = None;
            self.refresh_live(now_ms).unwrap()
        }
    }
}
