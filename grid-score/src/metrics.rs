//! Metric handles for the scorer. The crate never owns a registry: the daemon passes one
//! in and keeps the returned handles.

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::error::RejectReason;
use crate::learner::ExcludeReason;
use crate::live::EjectReason;
use crate::reading::CandidateKey;
use crate::select::{Decision, Outcome};
use crate::snapshot::{DecisionCounters, Plan, RouteSnapshot, RouteTable, UNMEASURED};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CandidateLabels {
    site: Arc<str>,
    provider: Arc<str>,
}

impl From<&CandidateKey> for CandidateLabels {
    fn from(key: &CandidateKey) -> Self {
        Self {
            site: key.site.clone(),
            provider: key.provider.clone(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    site: Arc<str>,
    /// Empty when nothing was routed.
    path: &'static str,
    outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExclusionLabels {
    site: Arc<str>,
    provider: Arc<str>,
    reason: ExcludeReason,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EjectionLabels {
    site: Arc<str>,
    provider: Arc<str>,
    reason: EjectReason,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// Handles to the scorer's metrics, registered under a `score` prefix (nest the registry
/// under `grid_gateway`, as the gateway does, to get `grid_gateway_score_*`). Cloning shares
/// the same series.
#[derive(Clone, Debug)]
pub struct ScoreMetrics {
    rho: Family<CandidateLabels, FloatGauge>,
    capacity: Family<CandidateLabels, FloatGauge>,
    score: Family<CandidateLabels, FloatGauge>,
    headroom: Family<CandidateLabels, FloatGauge>,
    pace: Family<CandidateLabels, FloatGauge>,
    live_factor: Family<CandidateLabels, FloatGauge>,
    turnover: Family<CandidateLabels, FloatGauge>,
    decisions: Family<DecisionLabels, Counter>,
    rejected: Family<RejectReason, Counter>,
    ejected: Family<CandidateLabels, Gauge>,
    ejections: Family<EjectionLabels, Counter>,
    excluded: Family<ExclusionLabels, Gauge>,
    signal_age: Family<CandidateLabels, FloatGauge>,
    /// Candidates given values by the last publish, so ones that vanish read NaN rather
    /// than their last value forever. Touched only by `publish`, off the request path.
    published: Arc<Mutex<HashSet<CandidateKey>>>,
    /// The site label of a decision that routed nowhere, shared so counting it never
    /// allocates.
    no_site: Arc<str>,
    /// `{"", "", unknown_model}`, found once.
    unknown_model: Counter,
}

impl ScoreMetrics {
    /// Registers every series in `registry` and returns the handles.
    pub fn register(registry: &mut Registry) -> Self {
        let this = Self {
            rho: Family::default(),
            capacity: Family::default(),
            score: Family::default(),
            headroom: Family::default(),
            pace: Family::default(),
            live_factor: Family::default(),
            turnover: Family::default(),
            decisions: Family::default(),
            rejected: grid_signals::labels::zeroed(),
            ejected: Family::default(),
            ejections: Family::default(),
            excluded: Family::default(),
            signal_age: Family::default(),
            published: Arc::default(),
            no_site: Arc::from(""),
            unknown_model: Counter::default(),
        };
        let this = Self {
            unknown_model: this.refused_counter(Outcome::UnknownModel),
            ..this
        };
        let r = registry.sub_registry_with_prefix("score");
        r.register(
            "rho",
            "Latest smoothed saturation per site/provider; NaN when unmeasured, excluded or gone",
            this.rho.clone(),
        );
        r.register(
            "capacity",
            "Learned capacity in requests per site/provider; NaN when excluded or gone",
            this.capacity.clone(),
        );
        r.register(
            "score",
            "Recent worst rho, the ordering key; NaN when unmeasured, excluded or gone",
            this.score.clone(),
        );
        r.register(
            "headroom",
            "Expected intake over the life of the reading (requests/s), the spread weight; 0 when unmeasured, NaN when excluded or gone",
            this.headroom.clone(),
        );
        r.register(
            "pace",
            "Share of its slots' turnover the site has been absorbing (1 = all); NaN when unmeasured, excluded or gone",
            this.pace.clone(),
        );
        r.register(
            "live_factor",
            "What the site's own answers put on its selection weight (1 = nothing; lower after a full band or serving failures); NaN when excluded or gone",
            this.live_factor.clone(),
        );
        r.register(
            "turnover_seconds",
            "How long a request has held one of the site's slots lately, learned from its answers (s); NaN until they have shown it, when excluded or gone",
            this.turnover.clone(),
        );
        r.register(
            "decisions",
            "Routing decisions by chosen site, selection path and outcome",
            this.decisions.clone(),
        );
        r.register(
            "readings_rejected",
            "Readings refused before learning, by reason",
            this.rejected.clone(),
        );
        r.register(
            "ejected",
            "1 while the site/provider is out of selection for failing (probed until it answers), else 0",
            this.ejected.clone(),
        );
        r.register(
            "ejections",
            "Times a site/provider was taken out of selection for failing, by reason (consecutive, ratio)",
            this.ejections.clone(),
        );
        r.register(
            "excluded",
            "1 for the reason the site/provider is out of selection (not_ready, no_ready_endpoints, unit_series_stopped, ejected), 0 for every other reason",
            this.excluded.clone(),
        );
        r.register(
            "signal_age_seconds",
            "Age of the site/provider's newest loaded reading at the last refresh (s); NaN before its first or once gone",
            this.signal_age.clone(),
        );
        this
    }

    /// Mirrors a freshly built table into the gauges. Call after each refresh.
    pub fn publish(&self, table: &RouteTable) {
        let nan_if_unmeasured = |v: f64| if v == UNMEASURED { f64::NAN } else { v };
        let mut now_published = HashSet::new();
        for snapshot in table.iter() {
            for c in snapshot.candidates() {
                let labels = CandidateLabels::from(c.key());
                self.rho
                    .get_or_create(&labels)
                    .set(nan_if_unmeasured(c.rho()));
                self.score
                    .get_or_create(&labels)
                    .set(nan_if_unmeasured(c.score()));
                self.capacity
                    .get_or_create(&labels)
                    .set(c.evidence().shown_capacity.unwrap_or(c.capacity()));
                self.headroom.get_or_create(&labels).set(c.headroom());
                self.pace
                    .get_or_create(&labels)
                    .set(if c.score() == UNMEASURED {
                        f64::NAN
                    } else {
                        c.signal().pace
                    });
                self.live_factor.get_or_create(&labels).set(c.live_factor());
                let turnover = c.signal().turnover_ms;
                self.turnover
                    .get_or_create(&labels)
                    .set(if turnover >= 1.0 {
                        turnover / 1_000.0
                    } else {
                        f64::NAN
                    });
                now_published.insert(c.key().clone());
            }
            for e in snapshot.excluded() {
                self.set_gone(&e.key);
                now_published.insert(e.key.clone());
            }
            for c in snapshot.candidates() {
                self.ejected
                    .get_or_create(&CandidateLabels::from(c.key()))
                    .set(0);
            }
            for e in snapshot.excluded() {
                let out = e.reason == ExcludeReason::Ejected;
                self.ejected
                    .get_or_create(&CandidateLabels::from(&e.key))
                    .set(i64::from(out));
            }
            let now = snapshot.refreshed_at_ms();
            let in_selection = snapshot
                .candidates()
                .iter()
                .map(|c| (c.key(), None, c.evidence().load_stamp_ms));
            let out = snapshot
                .excluded()
                .iter()
                .map(|e| (&e.key, Some(e.reason), e.evidence.load_stamp_ms));
            for (key, reason, stamp) in in_selection.chain(out) {
                self.set_excluded(key, reason);
                self.signal_age
                    .get_or_create(&CandidateLabels::from(key))
                    .set(stamp.map_or(f64::NAN, |s| now.saturating_sub(s) as f64 / 1_000.0));
            }
        }
        let mut published = self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for gone in published.difference(&now_published) {
            self.set_gone(gone);
        }
        *published = now_published;
    }

    /// Counts one ejection of `key` for `reason`.
    pub fn ejection(&self, key: &CandidateKey, reason: EjectReason) {
        self.ejections
            .get_or_create(&EjectionLabels {
                site: key.site.clone(),
                provider: key.provider.clone(),
                reason,
            })
            .inc();
    }

    /// Sets `key`'s exclusion series: 1 for `reason`, 0 for every other.
    fn set_excluded(&self, key: &CandidateKey, reason: Option<ExcludeReason>) {
        for r in ExcludeReason::ALL {
            self.excluded
                .get_or_create(&ExclusionLabels {
                    site: key.site.clone(),
                    provider: key.provider.clone(),
                    reason: r,
                })
                .set(i64::from(reason == Some(r)));
        }
    }

    fn set_gone(&self, key: &CandidateKey) {
        self.set_excluded(key, None);
        self.signal_age
            .get_or_create(&CandidateLabels::from(key))
            .set(f64::NAN);
        let labels = CandidateLabels::from(key);
        for family in [
            &self.rho,
            &self.score,
            &self.capacity,
            &self.headroom,
            &self.pace,
            &self.live_factor,
            &self.turnover,
        ] {
            family.get_or_create(&labels).set(f64::NAN);
        }
    }

    /// Finds, for every snapshot of `table`, the series each of its picks counts on, so
    /// that [`ScoreMetrics::record_in`] takes no lock and hashes nothing. Call once per
    /// table, before it is published.
    pub fn resolve(&self, table: &mut RouteTable) {
        for snapshot in table.iter_mut() {
            let routed = match snapshot.path() {
                Some(path) => snapshot
                    .candidates()
                    .iter()
                    .map(|c| {
                        self.decisions
                            .get_or_create(&DecisionLabels {
                                site: c.site().clone(),
                                path: path.as_str(),
                                outcome: Outcome::Routed,
                            })
                            .clone()
                    })
                    .collect(),
                None => Box::default(),
            };
            let refused = match snapshot.plan {
                Plan::Shed { .. } => Some(self.refused_counter(Outcome::Shed)),
                Plan::Unavailable { .. } => Some(self.refused_counter(Outcome::Unavailable)),
                _ => None,
            };
            snapshot.counters = DecisionCounters { routed, refused };
        }
    }

    fn refused_counter(&self, outcome: Outcome) -> Counter {
        self.decisions
            .get_or_create(&DecisionLabels {
                site: self.no_site.clone(),
                path: "",
                outcome,
            })
            .clone()
    }

    /// Counts one decision `snapshot` made (`None`: the model has none), on the series
    /// [`ScoreMetrics::resolve`] found for it: no lock, no hash, no allocation. The
    /// counters are those of the metrics that resolved the snapshot (the refresher's, in
    /// a daemon: one set per process); a snapshot never resolved is counted as
    /// [`ScoreMetrics::record`] counts.
    pub fn record_in(&self, snapshot: Option<&RouteSnapshot>, decision: &Decision<'_>) {
        let counter = match (snapshot, decision) {
            (_, Decision::UnknownModel) => Some(&self.unknown_model),
            (Some(s), Decision::Route { index, .. }) => s.counters.routed.get(*index),
            (Some(s), Decision::Shed { .. } | Decision::Unavailable { .. }) => {
                s.counters.refused.as_ref()
            }
            (None, _) => None,
        };
        match counter {
            Some(c) => {
                c.inc();
            }
            None => self.record(decision),
        }
    }

    /// Counts one decision, looking its series up (a lock and a hash); the request path
    /// uses [`ScoreMetrics::record_in`]. Allocation-free after the first of each label set.
    pub fn record(&self, decision: &Decision<'_>) {
        let site = match decision {
            Decision::Route { candidate, .. } => candidate.site().clone(),
            _ => self.no_site.clone(),
        };
        self.decisions
            .get_or_create(&DecisionLabels {
                site,
                path: decision.path().map_or("", |p| p.as_str()),
                outcome: decision.outcome(),
            })
            .inc();
    }

    /// Counts one refused reading.
    pub fn rejected(&self, reason: RejectReason) {
        self.rejected.get_or_create(&reason).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SplitMix64;
    use crate::reading::Reading;
    use crate::scorer::{Routes, Scorer};
    use crate::{CandidateKey, ScoreConfig};

    fn render(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting {prefix} in\n{text}"))
    }

    #[test]
    fn gauges_follow_the_table_and_read_nan_when_unmeasured_or_gone() {
        let mut registry = Registry::default();
        let metrics = ScoreMetrics::register(&mut registry);
        let mut scorer = Scorer::new(ScoreConfig::default());
        let a = CandidateKey::new("a", "p");
        let reading = Reading {
            in_flight: Some(4.0),
            queue_depth: Some(0.0),
            ..Reading::new(1_000)
        };
        scorer.observe(&a, &reading).unwrap();
        let routes = Routes::new().with("m", vec![a.clone(), CandidateKey::new("b", "p")]);
        metrics.publish(&scorer.refresh(1_000, &routes));
        let text = render(&registry);
        assert_eq!(
            line(&text, r#"score_capacity{site="a",provider="p"}"#)
                .split(' ')
                .nth(1),
            Some("4.0"),
            "what it held, not the headroom selection explores"
        );
        assert_eq!(
            line(&text, r#"score_rho{site="a",provider="p"}"#)
                .split(' ')
                .nth(1),
            Some("0.5")
        );
        assert!(line(&text, r#"score_score{site="b",provider="p"}"#).ends_with("NaN"));
        // Headroom of a lone reading: 8 slots over the 2 s turnover plus 4 free over 2 s.
        assert_eq!(
            line(&text, r#"score_headroom{site="a",provider="p"}"#)
                .split(' ')
                .nth(1),
            Some("6.0")
        );
        assert_eq!(
            line(&text, r#"score_pace{site="a",provider="p"}"#)
                .split(' ')
                .nth(1),
            Some("1.0")
        );
        assert!(line(&text, r#"score_pace{site="b",provider="p"}"#).ends_with("NaN"));
        assert!(
            line(&text, r#"score_turnover_seconds{site="a",provider="p"}"#).ends_with("NaN"),
            "no answer timed yet"
        );
        let board = crate::live::LiveBoard::new(std::slice::from_ref(&a));
        board.slot(&a).unwrap().record_served(2_500);
        scorer.feed_live(&board, 1_000);
        metrics.publish(&scorer.refresh(1_000, &routes));
        let text = render(&registry);
        let turnover: f64 = line(&text, r#"score_turnover_seconds{site="a",provider="p"}"#)
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        assert!((turnover - 2.5).abs() < 0.01, "{turnover}");
        assert_eq!(
            line(&text, r#"score_headroom{site="b",provider="p"}"#)
                .split(' ')
                .nth(1),
            Some("0.0")
        );

        metrics.publish(&scorer.refresh(1_000, &Routes::new()));
        let text = render(&registry);
        assert!(line(&text, r#"score_capacity{site="a",provider="p"}"#).ends_with("NaN"));
        assert!(line(&text, r#"score_headroom{site="a",provider="p"}"#).ends_with("NaN"));
    }

    #[test]
    fn decisions_and_rejections_are_counted_by_label() {
        let mut registry = Registry::default();
        let metrics = ScoreMetrics::register(&mut registry);
        let table = RouteTable::default();
        let mut rng = SplitMix64::new(1);
        metrics.record(&table.pick("m", &mut rng));
        metrics.rejected(RejectReason::NonFinite);
        let text = render(&registry);
        assert!(
            line(
                &text,
                r#"score_decisions_total{site="",path="",outcome="unknown_model"}"#
            )
            .ends_with(" 1")
        );
        assert!(
            line(
                &text,
                r#"score_readings_rejected_total{reason="non_finite"}"#
            )
            .ends_with(" 1")
        );
        assert!(
            line(
                &text,
                r#"score_readings_rejected_total{reason="candidate_cap"}"#
            )
            .ends_with(" 0")
        );
    }

    /// Every kind of decision, made by a table whose counters were resolved and by the
    /// same table unresolved, with the same draws.
    fn decisions_text(resolved: bool) -> String {
        use crate::snapshot::{Refusals, RouteSnapshot};
        let mut registry = Registry::default();
        let metrics = ScoreMetrics::register(&mut registry);
        let cand = |site: &str, capacity: f64, rho: f64| {
            crate::snapshot::Candidate::measured(
                CandidateKey::new(site, "p"),
                capacity,
                rho,
                rho,
                0.0,
                false,
            )
        };
        let serve = Refusals {
            shed_retry_after_ms: None,
            unavailable_retry_after_ms: 5_000,
        };
        let shed = Refusals {
            shed_retry_after_ms: Some(1_000),
            ..serve
        };
        let mut table = RouteTable::from_snapshots([
            RouteSnapshot::new(
                "two",
                vec![cand("a", 8.0, 0.2), cand("b", 8.0, 0.3)],
                vec![],
                serve,
            ),
            RouteSnapshot::new("one", vec![cand("c", 4.0, 0.5)], vec![], serve),
            RouteSnapshot::new("none", vec![], vec![], serve),
            RouteSnapshot::new("full", vec![cand("a", 8.0, 1.0)], vec![], shed),
        ]);
        if resolved {
            metrics.resolve(&mut table);
        }
        let mut rng = SplitMix64::new(7);
        for model in ["two", "one", "none", "full", "absent"] {
            for _ in 0..50 {
                let snapshot = table.get(model);
                let decision = snapshot.map_or(Decision::UnknownModel, |s| s.pick(&mut rng));
                metrics.record_in(snapshot, &decision);
            }
        }
        let text = render(&registry);
        let mut lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("score_decisions_total"))
            .collect();
        lines.sort_unstable();
        lines.join("\n")
    }

    #[test]
    fn picks_counted_on_resolved_counters_land_on_the_series_a_lookup_finds() {
        let resolved = decisions_text(true);
        assert_eq!(resolved, decisions_text(false));
        for series in [
            r#"{site="c",path="lone",outcome="routed"} 50"#,
            r#"{site="",path="",outcome="unavailable"} 50"#,
            r#"{site="",path="",outcome="shed"} 50"#,
            r#"{site="",path="",outcome="unknown_model"} 50"#,
        ] {
            assert!(resolved.contains(series), "{series} in\n{resolved}");
        }
        let spread: u64 = resolved
            .lines()
            .filter(|l| l.contains(r#"path="spread""#))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        assert_eq!(spread, 50, "{resolved}");
    }

    #[test]
    fn a_refresh_resolves_its_tables_counters_before_it_publishes() {
        let metrics = ScoreMetrics::register(&mut Registry::default());
        let mut scorer = Scorer::new(ScoreConfig::default());
        let routes = Routes::new().with("m", vec![CandidateKey::new("a", "p")]);
        let mut table = scorer.refresh(1_000, &routes);
        assert!(table.get("m").unwrap().counters.routed.is_empty());
        metrics.resolve(&mut table);
        assert_eq!(table.get("m").unwrap().counters.routed.len(), 1);
    }
}
