//! Properties of selection across learner, refresh and pick.

use grid_score::fuzzing;
use grid_score::live::LiveSlot;
use grid_score::{
    Candidate, CandidateKey, CandidateState, Decision, ExcludeReason, Observed, Path, Reading,
    Refusals, RouteSnapshot, Routes, ScoreConfig, Scorer, Signal, SplitMix64, UNMEASURED,
    UnitQueues,
};
use proptest::prelude::*;
use std::sync::Arc;

const REFUSE: Refusals = Refusals {
    shed_retry_after_ms: None,
    unavailable_retry_after_ms: 5_000,
};

/// One generated site: its latest reading and whether that reading vetoes it.
#[derive(Clone, Debug)]
struct SiteInput {
    in_flight: f64,
    queued: f64,
    kv: Option<(f64, f64)>,
    veto: Option<u8>,
    with_units: bool,
    stale: bool,
}

fn site_input() -> impl Strategy<Value = SiteInput> {
    (
        0.0..200.0f64,
        prop_oneof![Just(0.0), 0.0..50.0f64],
        proptest::option::of((0.0..1.0f64, 0.0..0.5f64)),
        proptest::option::of(0u8..2),
        any::<bool>(),
        proptest::bool::weighted(0.15),
    )
        .prop_map(
            |(in_flight, queued, kv, veto, with_units, stale)| SiteInput {
                in_flight,
                queued,
                kv,
                veto,
                with_units,
                stale,
            },
        )
}

fn reading(stamp: u64, s: &SiteInput) -> Reading {
    let mut r = Reading {
        in_flight: Some(s.in_flight),
        queue_depth: Some(s.queued),
        ready: Some(true),
        ready_endpoints: Some(2),
        kv_mean: s.kv.map(|k| k.0),
        kv_spread: s.kv.map(|k| k.1),
        units: s.with_units.then_some(UnitQueues {
            units: 2,
            waiting: if s.queued > 0.0 { 2 } else { 0 },
        }),
        ..Reading::new(stamp)
    };
    match s.veto {
        Some(0) => r.ready = Some(false),
        Some(_) => r.ready_endpoints = Some(0),
        None => {}
    }
    r
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Sites are fed a warm-up history then a final reading; some final readings veto.
    #[test]
    fn a_vetoed_site_is_never_picked_while_another_is_healthy(
        history in proptest::collection::vec(proptest::collection::vec(site_input(), 1..8), 1..6),
        seed in any::<u64>(),
    ) {
        let sites = history[0].len();
        let keys: Vec<_> = (0..sites).map(|i| CandidateKey::new(format!("s{i}"), "p")).collect();
        let mut scorer = Scorer::new(ScoreConfig::default());
        let now = 100_000;
        let rounds = history.len() as u64;
        // Whether each site's latest accepted (newer) reading vetoed it, and when: a veto
        // stands while its reading is fresh (an old zero never outlives its reading).
        let fresh = ScoreConfig::default().fresh_for_ms;
        let mut vetoed = vec![false; sites];
        for (round, inputs) in history.iter().enumerate() {
            for (i, key) in keys.iter().enumerate() {
                let s = inputs.get(i).unwrap_or(&inputs[0]);
                let stamp = if s.stale { 1 + round as u64 } else { now - (rounds - round as u64) * 1_000 };
                if scorer.observe(key, &reading(stamp, s)).unwrap() == Observed::NewSample {
                    vetoed[i] = s.veto.is_some() && now - stamp <= fresh;
                }
            }
        }
        let table = scorer.refresh(now, &Routes::new().with("m", keys.clone()));
        let snap = table.get("m").unwrap();
        let mut rng = SplitMix64::new(seed);
        for _ in 0..64 {
            match snap.pick(&mut rng) {
                Decision::Route { candidate, .. } => {
                    let i: usize = candidate.site()[1..].parse().unwrap();
                    prop_assert!(!vetoed[i], "picked vetoed {i}");
                }
                Decision::Unavailable { .. } => {
                    // Only when nothing is healthy: every site vetoed, or excluded because
                    // its per-unit series stopped (which the test does not model itself).
                    prop_assert!(snap.candidates().is_empty());
                    for e in snap.excluded() {
                        let i: usize = e.key.site[1..].parse().unwrap();
                        prop_assert!(vetoed[i] || e.reason == ExcludeReason::UnitSeriesStopped);
                    }
                }
                other => prop_assert!(false, "unexpected {other:?}"),
            }
        }
        // Scores are finite and in range, or the documented sentinel.
        for c in snap.candidates() {
            prop_assert!(c.capacity().is_finite() && c.capacity() >= grid_score::CAPACITY_FLOOR);
            for v in [c.rho(), c.score()] {
                prop_assert!(v == UNMEASURED || (v.is_finite() && (0.0..=grid_score::RHO_CAP).contains(&v)));
            }
            prop_assert_eq!(c.score() == UNMEASURED, c.state() == CandidateState::Unmeasured);
        }
    }

    /// Arbitrary byte sequences through the shared fuzz decoder keep every invariant.
    #[test]
    fn arbitrary_sequences_keep_every_invariant(bytes in proptest::collection::vec(any::<u8>(), 0..2_048)) {
        if let Err(v) = fuzzing::run(&bytes) {
            prop_assert!(false, "{v}");
        }
    }
}

/// The stated spread distribution: each candidate with headroom is picked with
/// probability its headroom over the total (read back from the snapshot, which the unit
/// tests of `headroom` pin to the formula).
fn spread_distribution(snap: &RouteSnapshot) -> Vec<f64> {
    let total: f64 = snap.candidates().iter().map(Candidate::headroom).sum();
    snap.candidates()
        .iter()
        .map(|c| c.headroom() / total)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Picks over many draws match the stated weights: chi-square over the spread path.
    #[test]
    fn spread_picks_match_the_stated_headroom_by_chi_square(
        sites in proptest::collection::vec(
            (1.0..64.0f64, 0.0..3.0f64, prop_oneof![Just(1_000.0), Just(5_000.0)], 0.05..1.0f64),
            2..8,
        ),
        seed in any::<u64>(),
    ) {
        let candidates = sites.iter().enumerate().map(|(i, (c, r, life, pace))| {
            Candidate::measured(CandidateKey::new(format!("s{i}"), "p"), *c, *r, *r, 0.0, false)
                .with_signal(Signal { rho_now: *r, life_ms: *life, pace: *pace, turnover_ms: 0.0 })
        }).collect();
        let snap = RouteSnapshot::new("m", candidates, vec![], REFUSE);
        let with_headroom = snap.candidates().iter().filter(|c| c.headroom() > 0.0).count();
        prop_assume!(with_headroom >= 2);
        // Headroom short of what the sites serve overflows by capacity (a unit test in
        // `select` pins that mix); here, the pure spread.
        prop_assume!(snap.path() == Some(Path::Spread));
        let expected = spread_distribution(&snap);
        let n = 40_000u32;
        let mut counts = vec![0u32; expected.len()];
        let mut rng = SplitMix64::new(seed);
        for _ in 0..n {
            let Decision::Route { index, .. } = snap.pick(&mut rng) else { panic!("routes") };
            counts[index] += 1;
        }
        // Chi-square over cells with a usable expectation; a site without headroom has
        // probability exactly 0 and must never be picked.
        let mut chi2 = 0.0;
        for (p, hits) in expected.iter().zip(&counts) {
            let e = p * f64::from(n);
            if e >= 5.0 {
                chi2 += (f64::from(*hits) - e).powi(2) / e;
            } else if *p == 0.0 {
                prop_assert_eq!(*hits, 0, "a site without headroom was picked");
            }
        }
        // 99.99th percentile of chi-square with at most 7 degrees of freedom is 29.9.
        prop_assert!(chi2 < 30.0, "chi2 {chi2}: {expected:?} vs {counts:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Of two drawn, the one holding fewer of the gateway's requests for its weight goes:
    /// the site strictly lowest in (requests + 1) / weight is sent whenever either draw
    /// falls on it (1 - (1 - w)^2 of the picks), the one strictly highest only when both
    /// do (w^2), and no pick leaves the sites with headroom.
    #[test]
    fn of_two_drawn_the_site_holding_least_for_its_weight_goes_and_the_most_only_when_drawn_twice(
        sites in proptest::collection::vec((1.0..64.0f64, 0.0..0.9f64, 0u32..40), 2..8),
        seed in any::<u64>(),
    ) {
        let candidates = sites.iter().enumerate().map(|(i, (c, r, held))| {
            let slot = Arc::new(LiveSlot::default());
            for _ in 0..*held {
                slot.record_sent();
            }
            Candidate::measured(CandidateKey::new(format!("s{i}"), "p"), *c, *r, *r, 0.0, false)
                .with_requests(slot)
        }).collect();
        let snap = RouteSnapshot::new("m", candidates, vec![], REFUSE);
        prop_assume!(snap.path() == Some(Path::Spread));
        let weights = spread_distribution(&snap);
        let per_weight: Vec<f64> = snap.candidates().iter().zip(&weights).map(|(c, w)| {
            (f64::from(c.requests_now().unwrap()) + 1.0) / w
        }).collect();
        let n = 20_000u32;
        let mut counts = vec![0u32; weights.len()];
        let mut rng = SplitMix64::new(seed);
        for _ in 0..n {
            let Decision::Route { index, .. } = snap.pick(&mut rng) else { panic!("routes") };
            prop_assert!(weights[index] > 0.0, "a site without headroom was picked");
            counts[index] += 1;
        }
        let share = |i: usize| f64::from(counts[i]) / f64::from(n);
        // Five standard deviations of a share over n picks is at most 0.018.
        let strict = |i: usize, lower: bool| per_weight.iter().enumerate().all(|(j, v)| {
            j == i || weights[j] == 0.0 || if lower { *v > per_weight[i] * 1.000_001 } else { *v < per_weight[i] / 1.000_001 }
        });
        for i in (0..weights.len()).filter(|&i| weights[i] > 0.0) {
            let w = weights[i];
            if strict(i, true) {
                let want = 1.0 - (1.0 - w).powi(2);
                prop_assert!((share(i) - want).abs() < 0.018, "least s{i}: {} vs {want}", share(i));
            }
            if strict(i, false) {
                prop_assert!((share(i) - w * w).abs() < 0.018, "most s{i}: {} vs {}", share(i), w * w);
            }
        }
    }
}

#[test]
fn the_spread_distribution_sums_to_one_and_gives_a_drowned_site_nothing() {
    let cand = |site: &str, cap: f64, rho: f64| {
        Candidate::measured(CandidateKey::new(site, "p"), cap, rho, rho, 0.0, false)
    };
    let snap = RouteSnapshot::new(
        "m",
        vec![
            cand("a", 8.0, 0.5),
            cand("b", 16.0, 0.9),
            cand("c", 8.0, 9.0),
        ],
        vec![],
        REFUSE,
    );
    let p = spread_distribution(&snap);
    assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    let c = snap
        .candidates()
        .iter()
        .position(|c| &**c.site() == "c")
        .unwrap();
    assert!(
        p[c].abs() < 1e-15,
        "a queue that outweighs turnover gets nothing"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A refused request goes elsewhere whenever a site is elsewhere, never back to the
    /// site that refused it; and when that site's reading shows it full and some site
    /// elsewhere drains its queue sooner than its full band, it goes to one that does.
    #[test]
    fn a_retry_never_returns_to_the_refusing_site_and_never_to_a_longer_wait_than_its_full_band(
        sites in proptest::collection::vec(
            (
                1.0..64.0f64,
                0.0..6.0f64,
                0.0..256.0f64,
                any::<bool>(),
                prop_oneof![Just(0.0), 500.0..8_000.0f64],
                0.0..128.0f64,
                any::<bool>(),
            ),
            1..7,
        ),
        failed in 0usize..7,
        seed in any::<u64>(),
    ) {
        let candidates = sites.iter().enumerate().map(|(i, (cap, rho, waiting, full, turnover, shown, measured))| {
            // Two candidates share each site, as two providers of one site do.
            let key = CandidateKey::new(format!("s{}", i / 2), format!("p{i}"));
            if *measured {
                Candidate::measured(key, *cap, *rho, *rho, *waiting, *full)
                    .with_signal(Signal { rho_now: *rho, life_ms: 1_000.0, pace: 1.0, turnover_ms: *turnover })
                    .with_shown(*shown)
            } else {
                Candidate::unmeasured(key, *cap)
            }
        }).collect();
        let snap = RouteSnapshot::new("m", candidates, vec![], REFUSE);
        let failed_site = format!("s{}", failed.min(sites.len() - 1) / 2);
        let elsewhere: Vec<&Candidate> =
            snap.candidates().iter().filter(|c| **c.site() != *failed_site).collect();
        let band_ms = snap
            .candidates()
            .iter()
            .filter(|c| **c.site() == *failed_site && c.state() == CandidateState::Full)
            .map(Candidate::drain_ms)
            .reduce(f64::max);
        let sooner_exists = band_ms.is_some_and(|b| elsewhere.iter().any(|c| c.drain_ms() < b));
        let headroom_elsewhere = elsewhere.iter().any(|c| c.headroom() > 0.0);
        let mut rng = SplitMix64::new(seed);
        for _ in 0..32 {
            let got = snap.pick_elsewhere(&failed_site, &mut rng);
            prop_assert_eq!(got.is_some(), !elsewhere.is_empty());
            let Some(at) = got else { continue };
            let c = &snap.candidates()[at];
            prop_assert!(**c.site() != *failed_site);
            if sooner_exists && !headroom_elsewhere {
                prop_assert!(c.drain_ms() < band_ms.unwrap_or(f64::INFINITY), "{c:?}");
            }
        }
    }
}
