//! Properties of selection across learner, refresh and pick.

use std::collections::HashMap;

use grid_score::fuzzing;
use grid_score::{
    Candidate, CandidateKey, CandidateState, Decision, ExcludeReason, Observed, Path, Reading,
    Refusals, RouteSnapshot, Routes, ScoreConfig, Scorer, SplitMix64, UNMEASURED, UnitQueues,
};
use proptest::prelude::*;

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
        // Whether each site's latest accepted (newer) reading vetoed it.
        let mut vetoed = vec![false; sites];
        for (round, inputs) in history.iter().enumerate() {
            for (i, key) in keys.iter().enumerate() {
                let s = inputs.get(i).unwrap_or(&inputs[0]);
                let stamp = if s.stale { 1 + round as u64 } else { now - (rounds - round as u64) * 1_000 };
                if scorer.observe(key, &reading(stamp, s)).unwrap() == Observed::NewSample {
                    vetoed[i] = s.veto.is_some();
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

    /// Two with room: the first is picked with share capacity/(1+score) over the sum.
    #[test]
    fn weighted_pair_picks_match_the_stated_weights(
        cap_a in 1.0..100.0f64, cap_b in 1.0..100.0f64,
        rho_a in 0.0..0.99f64, rho_b in 0.0..0.99f64,
        seed in any::<u64>(),
    ) {
        let snap = RouteSnapshot::new("m", vec![
            Candidate::measured(CandidateKey::new("a", "p"), cap_a, rho_a, rho_a, 0.0, false),
            Candidate::measured(CandidateKey::new("b", "p"), cap_b, rho_b, rho_b, 0.0, false),
        ], vec![], REFUSE);
        prop_assert_eq!(snap.path(), Some(Path::WeightedPair));
        let (wa, wb) = (cap_a / (1.0 + rho_a), cap_b / (1.0 + rho_b));
        let p = wa / (wa + wb);
        let n = 20_000;
        let mut rng = SplitMix64::new(seed);
        let hits = (0..n).filter(|_| matches!(snap.pick(&mut rng),
            Decision::Route { candidate, .. } if &**candidate.site() == "a")).count();
        let sigma = (p * (1.0 - p) / f64::from(n)).sqrt();
        let observed = hits as f64 / f64::from(n);
        // Five standard errors (plus a hair for p near 0 or 1): a false alarm is ~1 in 3.5M.
        prop_assert!((observed - p).abs() <= 5.0 * sigma + 1e-3, "observed {observed}, stated {p}");
    }
}

/// Exact two-choices distribution: draw a by capacity, then b by capacity among the rest;
/// the lower score wins (ties to the first drawn).
fn two_choices_distribution(caps: &[f64], scores: &[f64]) -> Vec<f64> {
    let total: f64 = caps.iter().sum();
    let mut p = vec![0.0; caps.len()];
    for a in 0..caps.len() {
        for b in 0..caps.len() {
            if a == b {
                continue;
            }
            let pair = caps[a] / total * caps[b] / (total - caps[a]);
            let winner = if scores[b] < scores[a] { b } else { a };
            p[winner] += pair;
        }
    }
    p
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn two_choices_picks_match_the_exact_distribution_by_chi_square(
        sites in proptest::collection::vec((1.0..64.0f64, 0.0..0.99f64), 3..8),
        seed in any::<u64>(),
    ) {
        let caps: Vec<f64> = sites.iter().map(|s| s.0).collect();
        let scores: Vec<f64> = sites.iter().map(|s| s.1).collect();
        let candidates = sites.iter().enumerate().map(|(i, (c, r))| {
            Candidate::measured(CandidateKey::new(format!("s{i}"), "p"), *c, *r, *r, 0.0, false)
        }).collect();
        let snap = RouteSnapshot::new("m", candidates, vec![], REFUSE);
        prop_assert_eq!(snap.path(), Some(Path::TwoChoices));
        let expected = two_choices_distribution(&caps, &scores);
        let n = 40_000u32;
        let mut counts: HashMap<usize, u32> = HashMap::new();
        let mut rng = SplitMix64::new(seed);
        for _ in 0..n {
            let Decision::Route { candidate, .. } = snap.pick(&mut rng) else { panic!("routes") };
            *counts.entry(candidate.site()[1..].parse().unwrap()).or_default() += 1;
        }
        // Chi-square over cells with a usable expectation; the most loaded site has
        // probability exactly 0 and must never be picked.
        let mut chi2 = 0.0;
        let mut cells = 0;
        for (i, p) in expected.iter().enumerate() {
            let hits = counts.get(&i).copied().unwrap_or(0);
            let observed = f64::from(hits);
            let e = p * f64::from(n);
            if e >= 5.0 {
                chi2 += (observed - e).powi(2) / e;
                cells += 1;
            } else if *p == 0.0 {
                prop_assert_eq!(hits, 0, "site {} has zero probability", i);
            }
        }
        // 99.99th percentile of chi-square with at most 7 degrees of freedom is 29.9.
        prop_assert!(chi2 < 30.0, "chi2 {chi2} over {cells} cells: {expected:?} vs {counts:?}");
    }
}

#[test]
fn the_two_choices_oracle_sums_to_one() {
    let p = two_choices_distribution(&[1.0, 2.0, 3.0, 4.0], &[0.4, 0.3, 0.2, 0.1]);
    assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    assert!(p[0].abs() < 1e-15, "the most loaded never wins two choices");
}
