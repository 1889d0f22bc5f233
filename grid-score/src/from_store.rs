//! The thin adapter from `grid_signals::store` to the scorer: builds each entry's
//! [`Reading`] from the relayed EPP series and applies the store's events.
//!
//! The scorer itself never depends on how the store keeps its windows; only this module
//! does. Stamps are the store's (receiver clock, ms since the Unix epoch), so `now_ms`
//! here is the same clock the store was fed.

use grid_signals::epp::{
    EPP_AVERAGE_KV_CACHE, EPP_AVERAGE_QUEUE, EPP_AVERAGE_RUNNING, EPP_FLOW_CONTROL_QUEUE,
    EPP_PER_ENDPOINT_QUEUE, EPP_READY_ENDPOINTS, EPP_STD_DEV_KV_CACHE, READY, READY_REASON,
    READY_REASON_LABEL, ReadyReasonLabel,
};
use grid_signals::store::{Entry, Learning, Store, StoreEvent};

use crate::error::Error;
use crate::learner::Observed;
use crate::reading::{CandidateKey, EppPool, Reading, UnitQueues};
use crate::scorer::Scorer;

/// The scorer key of a store entry.
pub fn key_of(entry: &Entry) -> CandidateKey {
    CandidateKey::new(entry.site(), entry.provider())
}

/// The newest instant of an entry as a [`Reading`], or `None` when it holds none of the
/// series the scorer reads.
///
/// This is the gateway's one rule for what a site's relayed EPP series say; the spec's
/// "each instant read together". The instant is the newest stamp among the pool series;
/// a series counts only if its own newest value carries that stamp (one scrape stamps
/// every series it held alike), so a series the newest scrape did not carry reads as
/// absent, never as the value it last had: a ready-endpoint count of zero from a scrape
/// long gone cannot keep a site excluded, and one scrape's averages are never paired
/// with another's endpoint count. In-flight is running plus waiting per endpoint times
/// ready endpoints plus what flow control holds, from that instant. A per-endpoint
/// series counts as a serving unit only if it is at least as new as the instant, so
/// series that stopped while the pool kept stamping read as absent, which the learner
/// turns into an exclusion.
pub fn reading_of(entry: &Entry, now_ms: u64) -> Option<Reading> {
    let latest = |metric| entry.latest(metric, &[]);
    let pool = [
        READY,
        EPP_READY_ENDPOINTS,
        EPP_AVERAGE_RUNNING,
        EPP_AVERAGE_QUEUE,
        EPP_AVERAGE_KV_CACHE,
        EPP_STD_DEV_KV_CACHE,
        EPP_FLOW_CONTROL_QUEUE,
    ];
    let stamp_ms = pool
        .iter()
        .filter_map(|m| latest(m))
        .map(|r| r.stamp_ms)
        .max()?;
    let value = |metric| {
        latest(metric)
            .filter(|r| r.stamp_ms == stamp_ms)
            .map(|r| r.value)
    };
    let ready_endpoints = value(EPP_READY_ENDPOINTS).map(|n| n.max(0.0).round() as u32);
    let ready = value(READY).map(|v| v >= 0.5);
    // The verdict's reason, from the same instant: one the operator reached without
    // reading the EPP is no evidence about the site.
    let verdict_unread = ready == Some(false)
        && entry.series(READY_REASON).any(|series| {
            series.latest().is_some_and(|r| r.stamp_ms == stamp_ms)
                && series
                    .label(READY_REASON_LABEL)
                    .and_then(ReadyReasonLabel::parse)
                    .is_some_and(ReadyReasonLabel::is_unread)
        });
    let mut reading = Reading {
        ready,
        verdict_unread,
        ready_endpoints,
        kv_mean: value(EPP_AVERAGE_KV_CACHE),
        kv_spread: value(EPP_STD_DEV_KV_CACHE),
        flow_held: value(EPP_FLOW_CONTROL_QUEUE),
        learning_allowed: matches!(entry.learning(now_ms), Learning::Allowed { .. }),
        ..Reading::new(stamp_ms)
    };
    if let (Some(running_avg), Some(queued_avg), Some(ready_endpoints)) = (
        value(EPP_AVERAGE_RUNNING),
        value(EPP_AVERAGE_QUEUE),
        ready_endpoints,
    ) {
        reading = reading.with_pool(EppPool {
            running_avg,
            queued_avg,
            ready_endpoints,
            flow_held: reading.flow_held.unwrap_or(0.0),
        });
    }
    let mut units = UnitQueues::default();
    for series in entry.series(EPP_PER_ENDPOINT_QUEUE) {
        if let Some(r) = series.latest().filter(|r| r.stamp_ms >= stamp_ms) {
            units.units += 1;
            units.waiting += u32::from(r.value > 0.0);
        }
    }
    reading.units = (units.units > 0).then_some(units);
    Some(reading)
}

/// What one [`sync`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SyncReport {
    /// Entries whose newest instant was a new sample.
    pub fed: usize,
    /// Entries with nothing newer since the last sync.
    pub not_newer: usize,
    /// Readings the scorer refused; count each by [`Error::reason`].
    pub refused: Vec<Error>,
    /// Revision resets applied.
    pub resets: usize,
    /// Candidates forgotten because the store expired them.
    pub forgotten: usize,
    /// Whether the store's event queue overflowed and everything learned was reset.
    pub resynced: bool,
}

/// The control step's input half: drains the store's events into the scorer (resets,
/// expiries, resync), then feeds every entry's newest instant. Call after each committed
/// ingest, then [`Scorer::refresh`].
pub fn sync(scorer: &mut Scorer, store: &mut Store, now_ms: u64) -> SyncReport {
    let mut report = SyncReport::default();
    while let Some(event) = store.poll_event() {
        match event {
            StoreEvent::Reset { site, provider, .. } => {
                scorer.reset(&CandidateKey::new(site, provider));
                report.resets += 1;
            }
            StoreEvent::Expired { site, provider } => {
                scorer.forget(&CandidateKey::new(site, provider));
                report.forgotten += 1;
            }
            StoreEvent::Resync => {
                scorer.reset_all();
                report.resynced = true;
            }
        }
    }
    for entry in store.entries() {
        let Some(reading) = reading_of(entry, now_ms) else {
            continue;
        };
        match scorer.observe(&key_of(entry), &reading) {
            Ok(Observed::NewSample) => report.fed += 1,
            Ok(Observed::NotNewer) => report.not_newer += 1,
            Err(e) => report.refused.push(e),
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use grid_signals::batch::{Batch, BatchMeta, Fence, Row};
    use grid_signals::store::{IngestReport, Sender, StoreConfig};

    use crate::Path;
    use crate::SplitMix64;
    use crate::config::ScoreConfig;
    use crate::scorer::Routes;
    use crate::select::{Decision, Outcome};
    use crate::snapshot::{Candidate, CandidateState, RouteTable};

    const T0: u64 = 1_700_000_000_000;

    fn admit(
        store: &mut Store,
        site: &str,
        uid: &str,
        seq: u64,
        stamp: u64,
        rows: &[(&str, Option<&str>, f64)],
    ) {
        let rows: Vec<Row> = rows
            .iter()
            .map(|&(name, label, value)| {
                let key = if name == READY_REASON {
                    READY_REASON_LABEL
                } else {
                    "model_server_endpoint"
                };
                let labels = label
                    .map(|e| vec![(key.to_string(), e.to_string())])
                    .unwrap_or_default();
                Row::new(name, labels, value, stamp).unwrap()
            })
            .collect();
        let meta = BatchMeta::new(
            site,
            "p",
            uid,
            Fence::new(T0, seq),
            rows.len() as u64,
            1,
            stamp,
        )
        .unwrap();
        let mut report = IngestReport::default();
        store.ingest_batch(
            Batch::new(meta, rows),
            Sender::Local,
            stamp,
            stamp,
            &mut report,
        );
        assert_eq!(report.batches_stored, 1, "{report:?}");
    }

    fn pool(
        running: f64,
        queued: f64,
        waiting_units: usize,
    ) -> Vec<(&'static str, Option<&'static str>, f64)> {
        let mut rows = vec![
            (READY, None, 1.0),
            (EPP_READY_ENDPOINTS, None, 2.0),
            (EPP_AVERAGE_RUNNING, None, running),
            (EPP_AVERAGE_QUEUE, None, queued),
            (EPP_AVERAGE_KV_CACHE, None, 0.2),
            (EPP_STD_DEV_KV_CACHE, None, 0.1),
            (EPP_FLOW_CONTROL_QUEUE, None, 0.0),
        ];
        for (i, e) in ["10.0.0.1:8000", "10.0.0.2:8000"].into_iter().enumerate() {
            rows.push((
                EPP_PER_ENDPOINT_QUEUE,
                Some(e),
                if i < waiting_units { 1.0 } else { 0.0 },
            ));
        }
        rows
    }

    #[test]
    fn an_entry_becomes_a_reading_with_the_gateways_own_in_flight() {
        let mut store = Store::new(StoreConfig::default());
        admit(&mut store, "a", "u1", 1, T0, &pool(3.0, 1.0, 1));
        let r = reading_of(store.entry("a", "p").unwrap(), T0).unwrap();
        assert_eq!(r.stamp_ms, T0);
        assert_eq!(r.ready, Some(true));
        assert_eq!(r.ready_endpoints, Some(2));
        assert_eq!(r.in_flight, Some(8.0));
        assert_eq!(r.queue_depth, Some(2.0));
        assert_eq!(
            r.units,
            Some(UnitQueues {
                units: 2,
                waiting: 1
            })
        );
        assert!(r.learning_allowed);
    }

    #[test]
    fn sync_feeds_new_samples_once_and_applies_revision_resets() {
        let mut store = Store::new(StoreConfig::default());
        let mut scorer = Scorer::new(ScoreConfig::default());
        admit(&mut store, "a", "u1", 1, T0, &pool(10.0, 0.0, 0));
        let first = sync(&mut scorer, &mut store, T0);
        assert_eq!((first.fed, first.resets), (1, 1), "{first:?}");
        let again = sync(&mut scorer, &mut store, T0);
        assert_eq!((again.fed, again.not_newer, again.resets), (0, 1, 0));
        let routes = Routes::new().with("m", vec![CandidateKey::new("a", "p")]);
        let cap = |scorer: &mut Scorer| {
            scorer
                .refresh(T0 + 2_000, &routes)
                .get("m")
                .unwrap()
                .candidates()[0]
                .capacity()
        };
        assert!(
            (cap(&mut scorer) - 20.0).abs() < 0.5,
            "soft 20, two seconds of decay"
        );
        // A new uid is a new revision: the store raises Reset and learning starts over.
        admit(&mut store, "a", "u2", 2, T0 + 1_000, &pool(2.0, 0.0, 0));
        let after = sync(&mut scorer, &mut store, T0 + 1_000);
        assert_eq!((after.fed, after.resets), (1, 1), "{after:?}");
        assert!((cap(&mut scorer) - 4.0).abs() < 0.1, "relearned from 4");
    }

    #[test]
    fn every_publication_that_moves_a_gateways_exclusion_moves_the_readiness_generation() {
        // The store's readiness generation is what a long poll is answered early on: it
        // must move whenever the exclusion verdict read from the same store could.
        let mut store = Store::new(StoreConfig::default());
        let mut scorer = Scorer::new(ScoreConfig::default());
        let routes = Routes::new().with("m", vec![CandidateKey::new("a", "p")]);
        let serving = pool(1.0, 0.0, 0);
        let zero = vec![(READY, None, 1.0), (EPP_READY_ENDPOINTS, None, 0.0)];
        let units_stopped: Vec<_> = serving.iter().copied().filter(|r| r.1.is_none()).collect();
        let shown_down = vec![
            (READY, None, 0.0),
            (READY_REASON, Some("no_ready_endpoints"), 1.0),
            (EPP_READY_ENDPOINTS, None, 0.0),
        ];
        let unread = vec![
            (READY, None, 0.0),
            (READY_REASON, Some("scrape_timeout"), 1.0),
        ];
        let busier = pool(3.0, 2.0, 2);
        let sequence = [
            &serving,
            &busier,
            &zero,
            &serving,
            &units_stopped,
            &serving,
            &shown_down,
            &unread,
            &serving,
            &busier,
            &zero,
            &zero,
            &serving,
        ];
        let mut excluded = None;
        let mut generation = store.readiness_generation();
        for (i, rows) in sequence.into_iter().enumerate() {
            let at = T0 + i as u64 * 1_000;
            admit(&mut store, "a", "u1", i as u64 + 1, at, rows);
            sync(&mut scorer, &mut store, at);
            let table = scorer.refresh(at, &routes);
            let now_excluded = table.get("m").unwrap().excluded().first().map(|e| e.reason);
            let moved = store.readiness_generation() != generation;
            if now_excluded != excluded {
                assert!(
                    moved,
                    "publication {i}: {excluded:?} -> {now_excluded:?} unannounced"
                );
            }
            excluded = now_excluded;
            generation = store.readiness_generation();
        }
    }

    #[test]
    fn per_endpoint_series_that_stop_exclude_the_site_through_the_store() {
        let mut store = Store::new(StoreConfig::default());
        let mut scorer = Scorer::new(ScoreConfig::default());
        admit(&mut store, "a", "u1", 1, T0, &pool(1.0, 0.0, 0));
        admit(&mut store, "b", "u1", 1, T0, &pool(1.0, 0.0, 0));
        sync(&mut scorer, &mut store, T0);
        // Site a's next batch has the pool series but no per-endpoint rows.
        let pool_only: Vec<_> = pool(1.0, 0.0, 0)
            .into_iter()
            .filter(|r| r.1.is_none())
            .collect();
        admit(&mut store, "a", "u1", 2, T0 + 1_000, &pool_only);
        sync(&mut scorer, &mut store, T0 + 1_000);
        let routes = Routes::new().with(
            "m",
            vec![CandidateKey::new("a", "p"), CandidateKey::new("b", "p")],
        );
        let table = scorer.refresh(T0 + 1_000, &routes);
        let snap = table.get("m").unwrap();
        assert_eq!(snap.excluded().len(), 1);
        assert_eq!(&*snap.excluded()[0].key.site, "a");
        assert_eq!(snap.candidates()[0].state(), CandidateState::Room);
        let mut rng = SplitMix64::new(3);
        for _ in 0..50 {
            let Decision::Route { candidate, .. } = table.pick("m", &mut rng) else {
                panic!("routes")
            };
            assert_eq!(&**candidate.site(), "b");
        }
    }

    /// One scrape of a 2-endpoint site as the operator relays it: the averages only while
    /// an endpoint is ready (the EPP freezes them at zero), per-unit series per endpoint.
    fn scrape(
        ready: f64,
        running: f64,
        queued: f64,
        flow: f64,
    ) -> Vec<(&'static str, Option<&'static str>, f64)> {
        let mut rows = vec![
            (EPP_READY_ENDPOINTS, None, ready),
            (EPP_FLOW_CONTROL_QUEUE, None, flow),
        ];
        if ready > 0.0 {
            rows.extend([
                (EPP_AVERAGE_RUNNING, None, running),
                (EPP_AVERAGE_QUEUE, None, queued),
            ]);
            for e in ["10.0.0.1:8000", "10.0.0.2:8000"] {
                rows.push((EPP_PER_ENDPOINT_QUEUE, Some(e), queued));
            }
        }
        rows
    }

    fn share_of(table: &RouteTable, site: &str, draws: u32) -> f64 {
        let mut rng = SplitMix64::new(17);
        let mut hits = 0;
        for _ in 0..draws {
            match table.pick("m", &mut rng) {
                Decision::Route { candidate, .. } if &**candidate.site() == site => hits += 1,
                Decision::Route { .. } => {}
                other => panic!("expected a route, got {other:?}"),
            }
        }
        f64::from(hits) / f64::from(draws)
    }

    #[test]
    fn a_site_back_from_a_six_second_blip_regains_its_capacity_share_within_ten_seconds() {
        // No capacity collapse: during a 6 s zero-endpoint blip the frozen averages of an
        // older scrape meet the blip's endpoint count of 0 and flow control's hold, which
        // must not read as a limit with nothing in service (a's learned capacity would
        // fall from 12 to the floor, and it would get no traffic for many minutes).
        let mut store = Store::new(StoreConfig::default());
        let mut scorer = Scorer::new(ScoreConfig::default());
        let routes = Routes::new().with(
            "m",
            vec![CandidateKey::new("a", "p"), CandidateKey::new("b", "p")],
        );
        let mut seq = 0;
        let mut tick = |store: &mut Store, scorer: &mut Scorer, k: u64, a: &[_], b: &[_]| {
            seq += 1;
            let t = T0 + k * 1_000;
            admit(store, "a", "u1", seq, t, a);
            admit(store, "b", "u1", seq, t, b);
            sync(scorer, store, t);
            scorer.refresh(t, &routes)
        };
        // Both sites show a limit of 12 in service, then serve 8 with nothing waiting.
        for k in 0..3 {
            let limit = scrape(2.0, 6.0, 1.0, 0.0);
            tick(&mut store, &mut scorer, k, &limit, &limit);
        }
        let calm = scrape(2.0, 4.0, 0.0, 0.0);
        for k in 3..10 {
            tick(&mut store, &mut scorer, k, &calm, &calm);
        }
        // a: zero ready endpoints for 6 s while flow control holds ten requests.
        let blip = scrape(0.0, 0.0, 0.0, 10.0);
        for k in 10..16 {
            let table = tick(&mut store, &mut scorer, k, &blip, &calm);
            assert_eq!(table.get("m").unwrap().excluded().len(), 1, "at {k} s");
        }
        let mut table = RouteTable::default();
        for k in 16..26 {
            table = tick(&mut store, &mut scorer, k, &calm, &calm);
        }
        let snap = table.get("m").unwrap();
        let caps: Vec<f64> = snap.candidates().iter().map(Candidate::capacity).collect();
        assert!(
            caps.iter().all(|c| (c - caps[0]).abs() < 1e-6),
            "same capacity as the site that never blipped: {caps:?}"
        );
        let share = share_of(&table, "a", 20_000);
        assert!(
            (share - 0.5).abs() <= 0.1,
            "a's share {share}, capacity share 0.5"
        );
    }

    /// Two sites serving `m`, both measured at `T0`, then only a verdict of 0 from each
    /// operator every second for a minute, with `reason`: what a scrape outage (or a real
    /// outage) of every EPP publishes. The decisions of that minute, as outcome and path.
    fn every_site_not_ready_for(reason: &str) -> Vec<(Outcome, Option<Path>)> {
        let mut store = Store::new(StoreConfig::default());
        let mut scorer = Scorer::new(ScoreConfig::default());
        let routes = Routes::new().with(
            "m",
            vec![CandidateKey::new("a", "p"), CandidateKey::new("b", "p")],
        );
        for site in ["a", "b"] {
            admit(&mut store, site, "u1", 1, T0, &pool(1.0, 0.0, 0));
        }
        sync(&mut scorer, &mut store, T0);
        let mut rng = SplitMix64::new(7);
        let mut decisions = Vec::new();
        for k in 1..=60u64 {
            let t = T0 + k * 1_000;
            for site in ["a", "b"] {
                let verdict = [(READY, None, 0.0), (READY_REASON, Some(reason), 1.0)];
                admit(&mut store, site, "u1", 1 + k, t, &verdict);
            }
            sync(&mut scorer, &mut store, t);
            let table = scorer.refresh(t, &routes);
            let decision = table.pick("m", &mut rng);
            decisions.push((decision.outcome(), decision.path()));
        }
        decisions
    }

    #[test]
    fn a_not_ready_verdict_the_operator_reached_without_reading_the_epp_never_makes_503() {
        // Every EPP silent while the operators run and the model servers serve: the
        // verdict is 0 for a failed scrape, which is no evidence about the sites.
        for reason in ["scrape_timeout", "scrape_connect", "no_recent_scrape"] {
            let decisions = every_site_not_ready_for(reason);
            assert!(
                decisions.iter().all(|(o, _)| *o == Outcome::Routed),
                "{reason}: {decisions:?}"
            );
            // Once the last loads aged out, nothing is measured: by capacity, as the
            // fallback path, which the gateway counts and logs as routing without signals.
            assert_eq!(
                decisions.last(),
                Some(&(Outcome::Routed, Some(Path::Fallback)))
            );
        }
    }

    #[test]
    fn a_not_ready_verdict_the_epp_showed_still_makes_the_model_unavailable() {
        for reason in ["no_ready_endpoints", "unavailable", "recovery_unconfirmed"] {
            let decisions = every_site_not_ready_for(reason);
            assert!(
                decisions.iter().all(|(o, _)| *o == Outcome::Unavailable),
                "{reason}: {decisions:?}"
            );
        }
    }

    #[test]
    fn a_site_whose_later_batches_carry_no_ready_series_is_not_excluded_for_ever() {
        // No sticky exclusion: one zero, then batches without the ready-endpoint series
        // (vLLM's own /metrics, a sustained body cap). Unknown readiness never excludes,
        // so the store's old zero must not keep the model's only candidate excluded past
        // its freshness (503 at 10 s, 40 s, 600 s).
        let mut store = Store::new(StoreConfig::default());
        let mut scorer = Scorer::new(ScoreConfig::default());
        let routes = Routes::new().with("m", vec![CandidateKey::new("a", "p")]);
        admit(&mut store, "a", "u1", 1, T0, &scrape(0.0, 0.0, 0.0, 0.0));
        sync(&mut scorer, &mut store, T0);
        let mut rng = SplitMix64::new(1);
        let fresh = ScoreConfig::default().fresh_for_ms;
        let mut seq = 1;
        for k in 1..=600u64 {
            seq += 1;
            let t = T0 + k * 1_000;
            admit(
                &mut store,
                "a",
                "u1",
                seq,
                t,
                &[(EPP_AVERAGE_KV_CACHE, None, 0.3)],
            );
            sync(&mut scorer, &mut store, t);
            let table = scorer.refresh(t, &routes);
            let decision = table.pick("m", &mut rng);
            if k * 1_000 <= fresh {
                assert!(matches!(decision, Decision::Unavailable { .. }), "at {k} s");
            } else {
                assert!(
                    matches!(decision, Decision::Route { .. }),
                    "at {k} s: {decision:?}"
                );
            }
        }
    }

    #[test]
    fn shedding_stops_within_room_after_of_the_last_saturated_sample_after_a_blip() {
        // Shedding must not linger: were a blip to collapse a site's capacity to the
        // floor, every sample with one request held in flow control would read it as
        // full, and after a burst the gateway would go on shedding with the grid nearly
        // idle.
        let mut config = ScoreConfig::default();
        config.shedding.enabled = true;
        let room_after = config.shedding.room_after_ms;
        let mut store = Store::new(StoreConfig::default());
        let mut scorer = Scorer::new(config);
        let routes = Routes::new().with(
            "m",
            vec![CandidateKey::new("a", "p"), CandidateKey::new("b", "p")],
        );
        let mut seq = 0;
        let mut tick = |k: u64, a: &[_], b: &[_]| {
            seq += 1;
            let t = T0 + k * 1_000;
            admit(&mut store, "a", "u1", seq, t, a);
            admit(&mut store, "b", "u1", seq, t, b);
            sync(&mut scorer, &mut store, t);
            let table = scorer.refresh(t, &routes);
            matches!(
                table.pick("m", &mut SplitMix64::new(k)),
                Decision::Shed { .. }
            )
        };
        let limit = scrape(2.0, 6.0, 1.0, 0.0);
        let calm = scrape(2.0, 2.0, 0.0, 0.0);
        for k in 0..3 {
            tick(k, &limit, &limit);
        }
        for k in 3..10 {
            tick(k, &calm, &calm);
        }
        let blip = scrape(0.0, 0.0, 0.0, 10.0);
        for k in 10..16 {
            tick(k, &blip, &calm);
        }
        for k in 16..20 {
            tick(k, &calm, &calm);
        }
        let burst = scrape(2.0, 6.0, 4.0, 6.0);
        let mut shed = false;
        for k in 20..26 {
            shed = tick(k, &burst, &burst);
        }
        assert!(shed, "both sites full with work waiting: shedding");
        // The burst is over: a holds half its slots, nothing waits.
        let half = scrape(2.0, 3.0, 0.0, 0.0);
        let last_saturated = 25;
        for k in 26..60 {
            let shed = tick(k, &half, &calm);
            if (k - last_saturated) * 1_000 > room_after + 2_000 {
                assert!(
                    !shed,
                    "still shedding at {k} s, {} s after the burst",
                    k - 25
                );
            }
        }
    }
}
