//! The request path allocates nothing: counted with an instrumented global allocator.
//! One test per binary, so no other test's allocations land in the counted region.

use std::alloc::System;
use std::sync::Arc;

use grid_score::live::LiveSlot;
use grid_score::{
    Candidate, CandidateKey, Decision, Path, Reading, Refusals, RouteSnapshot, RouteTable, Routes,
    ScoreConfig, Scorer, SplitMix64,
};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn snapshot_with(room: usize, no_room: usize) -> RouteSnapshot {
    let candidates = (0..room + no_room)
        .map(|i| {
            let score = if i < room {
                0.05 * i as f64
            } else {
                // Past rho 2 a site's queue outweighs its turnover (default turnover and
                // spread): no headroom.
                3.0 + i as f64
            };
            Candidate::measured(
                CandidateKey::new(format!("s{i}"), "p"),
                8.0 + i as f64,
                score,
                score,
                i as f64,
                false,
            )
        })
        .collect();
    RouteSnapshot::new(
        "m",
        candidates,
        vec![],
        Refusals {
            shed_retry_after_ms: None,
            unavailable_retry_after_ms: 5_000,
        },
    )
}

/// A snapshot of `model` over `candidates`, none excluded, nothing shed.
fn named(model: &str, candidates: Vec<Candidate>) -> RouteSnapshot {
    RouteSnapshot::new(
        model,
        candidates,
        vec![],
        Refusals {
            shed_retry_after_ms: None,
            unavailable_retry_after_ms: 1,
        },
    )
}

/// `candidates`, each counting this gateway's requests in a live slot holding some, so a
/// pick reads them (two of the drawn candidates' atomic counts).
fn counted(candidates: &[Candidate]) -> Vec<Candidate> {
    candidates
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let slot = Arc::new(LiveSlot::default());
            for _ in 0..i {
                slot.record_sent();
            }
            c.clone().with_requests(slot)
        })
        .collect()
}

fn picks_on_every_path_allocate_nothing() {
    // Every path: spread (many and two), lone, overflow, by capacity, fallback, unavailable,
    // unknown model; plus a table built by a real scorer.
    let mut scorer = Scorer::new(ScoreConfig::default());
    let keys: Vec<_> = (0..16)
        .map(|i| CandidateKey::new(format!("s{i}"), "p"))
        .collect();
    for (i, key) in keys.iter().enumerate() {
        let r = Reading {
            in_flight: Some(i as f64),
            queue_depth: Some(0.0),
            ..Reading::new(1_000)
        };
        scorer.observe(key, &r).unwrap();
    }
    let scored = scorer.refresh(1_000, &Routes::new().with("real", keys));
    let unmeasured = vec![
        Candidate::unmeasured(CandidateKey::new("u1", "p"), 4.0),
        Candidate::unmeasured(CandidateKey::new("u2", "p"), 8.0),
    ];
    let table = RouteTable::from_snapshots([
        snapshot_with(16, 0),
        named("pair", snapshot_with(2, 3).candidates().to_vec()),
        named("counted", counted(snapshot_with(4, 2).candidates())),
        named("lone", snapshot_with(1, 0).candidates().to_vec()),
        named("overflow", snapshot_with(1, 3).candidates().to_vec()),
        named("bycap", snapshot_with(0, 5).candidates().to_vec()),
        named("fallback", unmeasured),
        named("empty", vec![]),
    ]);
    let models = [
        "m", "pair", "counted", "lone", "overflow", "bycap", "fallback", "empty", "absent",
    ];
    for (model, path) in [
        ("m", Some(Path::Spread)),
        ("pair", Some(Path::Spread)),
        ("counted", Some(Path::Spread)),
        ("lone", Some(Path::Lone)),
        ("overflow", Some(Path::Overflow)),
        ("bycap", Some(Path::ByCapacity)),
        ("fallback", Some(Path::Fallback)),
        ("empty", None),
    ] {
        assert_eq!(table.get(model).unwrap().path(), path, "{model}");
    }
    let mut rng = SplitMix64::new(11);
    let mut routed = 0u64;

    // The counter is process-wide: the test harness's own threads can allocate while
    // this test starts. Measure several batches of 10,000 picks and take the quietest; a
    // pick that allocated on any path would show in every batch.
    let quietest = (0..5)
        .map(|_| {
            let region = Region::new(GLOBAL);
            for i in 0..10_000 {
                let d = table.pick(models[i % models.len()], &mut rng);
                routed += u64::from(matches!(d, Decision::Route { .. }));
                let d = scored.pick("real", &mut rng);
                routed += u64::from(matches!(d, Decision::Route { .. }));
            }
            region.change()
        })
        .min_by_key(|s| s.allocations + s.reallocations)
        .unwrap();
    assert_eq!(quietest.allocations, 0, "{quietest:?}");
    assert_eq!(quietest.reallocations, 0, "{quietest:?}");
    // Control: the counter does see an allocation when one happens.
    let control = Region::new(GLOBAL);
    let boxed = std::hint::black_box(Box::new(routed));
    assert!(control.change().allocations >= 1);
    drop(boxed);
    // 7 of 9 models route, and the scored table always routes.
    assert!(routed > 5 * (10_000 + 10_000 * 7 / 9 - 10), "{routed}");
}

/// Runs without libtest's harness (`harness = false`): the harness's own threads allocate
/// at moments of their choosing, and a global counter cannot tell their allocations from
/// ours, so the only thread alive while counting is this one.
fn main() {
    picks_on_every_path_allocate_nothing();
    println!("test picks_on_every_path_allocate_nothing ... ok");
    println!("1 passed, 0 failed");
}
