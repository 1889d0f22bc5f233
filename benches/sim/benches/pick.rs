//! Request-path and control-step cost of `grid-score`.
//!
//! - `pick/16_candidates`: one pick over a 16-candidate snapshot whose candidates count
//!   the gateway's requests, as a refresher's do (target: at most 100 ns median), with the
//!   allocations per pick counted by an instrumented allocator (target 0);
//! - `pick/16_candidates_with_model_lookup`: the same through the route table's model map;
//! - `pick/16_candidates_with_long_model_lookup`: the same with a 32-byte model name;
//! - `refresh/10000_candidates`: a refresh that orders 10,000 candidates (target: 5 ms);
//! - `pick/naive_store_read_16`: a naive picker that reads a store-like map and computes
//!   load per request, to express our pick as a ratio of it.

use std::alloc::System;
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;

use criterion::Criterion;
use grid_score::live::LiveSlot;
use grid_score::{
    CandidateKey, Path, Reading, Refusals, RouteSnapshot, RouteTable, Routes, ScoreConfig, Scorer,
    SplitMix64, UnitQueues,
};
use grid_sim::clock;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const NOW: u64 = 1_700_000_000_000;

fn key(i: usize) -> CandidateKey {
    CandidateKey::new(format!("site-{i}"), format!("provider-{i}"))
}

/// A reading for candidate `i` at `stamp`: unequal sizes, every site with room.
fn reading(i: usize, stamp: u64, round: u64) -> Reading {
    let capacity = [8.0, 16.0, 32.0, 64.0][i % 4];
    let load = capacity * (0.2 + 0.05 * ((i as u64 + round) % 10) as f64);
    Reading {
        in_flight: Some(load),
        queue_depth: Some(0.0),
        ready: Some(true),
        ready_endpoints: Some(4),
        units: Some(UnitQueues {
            units: 4,
            waiting: 0,
        }),
        kv_mean: Some(0.3),
        kv_spread: Some(0.1),
        flow_held: Some(0.0),
        ..Reading::new(stamp)
    }
}

/// A model name as deployments spell them: a repository path, 32 bytes.
const LONG_MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// A scorer fed three rounds of readings for `n` candidates of one model, `model`.
fn scored(n: usize) -> (Scorer, Routes) {
    scored_as(n, "model")
}

/// The same, for a model named `model`.
fn scored_as(n: usize, model: &str) -> (Scorer, Routes) {
    let mut scorer = Scorer::new(ScoreConfig::default());
    let keys: Vec<_> = (0..n).map(key).collect();
    for round in 0..3u64 {
        for (i, k) in keys.iter().enumerate() {
            // A peak first, older than the recent-worst window, so the soft bound learns
            // each site's size; then lighter rounds inside the window.
            let mut r = reading(i, NOW - 3_000 + round * 1_000, round);
            if round == 0 {
                r.in_flight = Some([8.0, 16.0, 32.0, 64.0][i % 4]);
                r.stamp_ms = NOW - 2 * grid_score::RECENT_WINDOW_MS;
            }
            scorer.observe(k, &r).expect("valid reading");
        }
    }
    (scorer, Routes::new().with(model, keys))
}

/// What a picker without a snapshot does: per request, find each candidate's windows in a
/// store-like map, take the newest fresh sample of each series and pick the least loaded.
/// Stamped values of one series, oldest first.
type Window = Vec<(u64, f64)>;

struct NaiveStore {
    windows: HashMap<String, HashMap<&'static str, Window>>,
    candidates: Vec<String>,
}

impl NaiveStore {
    fn new(n: usize) -> Self {
        let mut windows = HashMap::new();
        let mut candidates = Vec::new();
        for i in 0..n {
            let name = format!("site-{i}/provider-{i}");
            let mut series = HashMap::new();
            for metric in [
                "running",
                "queued",
                "ready_endpoints",
                "kv_mean",
                "kv_spread",
            ] {
                let window = (0..8u64)
                    .map(|s| (NOW - 8_000 + s * 1_000, 1.0 + ((i as u64 + s) % 7) as f64))
                    .collect();
                series.insert(metric, window);
            }
            windows.insert(name.clone(), series);
            candidates.push(name);
        }
        Self {
            windows,
            candidates,
        }
    }

    fn latest(&self, candidate: &str, metric: &str, now: u64) -> Option<f64> {
        self.windows
            .get(candidate)?
            .get(metric)?
            .iter()
            .filter(|(stamp, _)| now.saturating_sub(*stamp) <= 15_000)
            .max_by_key(|(stamp, _)| *stamp)
            .map(|(_, v)| *v)
    }

    fn pick(&self, now: u64) -> Option<usize> {
        let mut best: Option<(usize, f64)> = None;
        for (i, c) in self.candidates.iter().enumerate() {
            let (Some(run), Some(q), Some(n)) = (
                self.latest(c, "running", now),
                self.latest(c, "queued", now),
                self.latest(c, "ready_endpoints", now),
            ) else {
                continue;
            };
            let kv = self.latest(c, "kv_mean", now).unwrap_or(0.0)
                + self.latest(c, "kv_spread", now).unwrap_or(0.0);
            let load = ((run + q) * n).max(kv);
            if best.is_none_or(|(_, b)| load < b) {
                best = Some((i, load));
            }
        }
        best.map(|(i, _)| i)
    }
}

/// `table`'s snapshot of `model` as a gateway's refresher publishes it: each candidate
/// counting the gateway's requests in a live slot (a few held at each), which a pick
/// reads for the two candidates it draws.
fn counting(table: &RouteTable, model: &str) -> RouteTable {
    let scored = table.get(model).expect("configured");
    let candidates = scored
        .candidates()
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let slot = Arc::new(LiveSlot::default());
            for _ in 0..i % 5 {
                slot.record_sent();
            }
            c.clone().with_requests(slot)
        })
        .collect();
    let refusals = Refusals {
        shed_retry_after_ms: None,
        unavailable_retry_after_ms: 5_000,
    };
    RouteTable::from_snapshots([RouteSnapshot::new(
        model,
        candidates,
        scored.excluded().to_vec(),
        refusals,
    )])
}

fn allocations_per_pick(table: &RouteTable, rng: &mut SplitMix64) -> f64 {
    const PICKS: u32 = 100_000;
    let region = Region::new(GLOBAL);
    for _ in 0..PICKS {
        black_box(table.pick(black_box("model"), rng));
    }
    let stats = region.change();
    (stats.allocations + stats.reallocations) as f64 / f64::from(PICKS)
}

fn main() {
    let mut c = Criterion::default().configure_from_args();

    let (mut scorer16, routes16) = scored(16);
    let table16 = counting(&scorer16.refresh(NOW, &routes16), "model");
    let snapshot = table16.get("model").expect("configured");
    assert_eq!(snapshot.candidates().len(), 16);
    assert!(
        snapshot
            .candidates()
            .iter()
            .all(|c| c.requests_now().is_some())
    );
    assert_eq!(
        snapshot.path(),
        Some(Path::Spread),
        "every site has headroom"
    );
    let mut rng = SplitMix64::new(1);
    c.bench_function("pick/16_candidates", |b| {
        b.iter(|| black_box(black_box(snapshot).pick(&mut rng)).outcome());
    });
    c.bench_function("pick/16_candidates_with_model_lookup", |b| {
        b.iter(|| black_box(table16.pick(black_box("model"), &mut rng)).outcome());
    });
    let (mut scorer_long, routes_long) = scored_as(16, LONG_MODEL);
    let table_long = counting(&scorer_long.refresh(NOW, &routes_long), LONG_MODEL);
    c.bench_function("pick/16_candidates_with_long_model_lookup", |b| {
        b.iter(|| black_box(table_long.pick(black_box(LONG_MODEL), &mut rng)).outcome());
    });

    let naive = NaiveStore::new(16);
    assert!(naive.pick(NOW).is_some());
    c.bench_function("pick/naive_store_read_16", |b| {
        b.iter(|| black_box(naive.pick(black_box(NOW))));
    });

    let (mut scorer10k, routes10k) = scored(10_000);
    let mut group = c.benchmark_group("refresh");
    group.sample_size(20);
    group.bench_function("10000_candidates", |b| {
        b.iter(|| black_box(scorer10k.refresh(black_box(NOW), &routes10k)));
    });
    group.finish();
    c.final_summary();

    // Our own summary, measured the same way for both pickers so the ratio is fair.
    let (ours, ours_best) = clock::batch_ns(31, 100_000, || {
        black_box(black_box(snapshot).pick(&mut rng));
    });
    let (with_lookup, with_lookup_best) = clock::batch_ns(31, 100_000, || {
        black_box(table16.pick(black_box("model"), &mut rng));
    });
    let (with_long, with_long_best) = clock::batch_ns(31, 100_000, || {
        black_box(table_long.pick(black_box(LONG_MODEL), &mut rng));
    });
    let (theirs, theirs_best) = clock::batch_ns(31, 10_000, || {
        black_box(naive.pick(black_box(NOW)));
    });
    let (refresh_ns, refresh_best_ns) = clock::batch_ns(11, 1, || {
        black_box(scorer10k.refresh(NOW, &routes10k));
    });
    let (refresh_ms, refresh_best_ms) = (refresh_ns / 1e6, refresh_best_ns / 1e6);
    let allocs = allocations_per_pick(&table16, &mut rng);
    println!(
        "summary: pick over 16 candidates: {ours:.1} ns median, {ours_best:.1} ns best batch (target <= 100 ns)"
    );
    println!(
        "summary: same, model lookup in the route table included: {with_lookup:.1} ns median, {with_lookup_best:.1} ns best batch"
    );
    println!(
        "summary: same, with a {}-byte model name ({LONG_MODEL}): {with_long:.1} ns median, {with_long_best:.1} ns best batch (target <= 25 ns)",
        LONG_MODEL.len()
    );
    println!("summary: allocations per pick: {allocs} (target 0)");
    println!(
        "summary: naive store-reading picker over 16 candidates: {theirs:.1} ns median, {theirs_best:.1} ns best batch"
    );
    println!(
        "summary: pick cost / naive cost = {:.3} ({:.0}x cheaper)",
        ours / theirs,
        theirs / ours
    );
    println!(
        "summary: refresh ordering 10,000 candidates: {refresh_ms:.3} ms median, {refresh_best_ms:.3} ms best (target <= 5 ms)"
    );
}
