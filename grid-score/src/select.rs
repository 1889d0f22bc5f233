//! The request path: one pick over a pre-built snapshot.
//!
//! Loads nothing, locks nothing, allocates nothing: the snapshot already holds the path
//! and its cumulative weights, so a pick is at most two uniform draws, two binary searches
//! and one comparison.

use crate::rng::Rng;
use crate::snapshot::{Candidate, Plan, Pool, RouteSnapshot, RouteTable};

/// Which selection rule chose the site (a metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Path {
    /// Three or more sites with room: two distinct drawn by capacity, the lower score wins.
    TwoChoices,
    /// Exactly two with room: one drawn with weight capacity / (1 + score).
    WeightedPair,
    /// Exactly one with room.
    Lone,
    /// None with room: two distinct drawn by capacity among measured sites not full, the
    /// one with less work waiting per unit of capacity wins.
    ByCapacity,
    /// None with room and none merely without room: the by-capacity rule among the
    /// measured-full sites, or among the unmeasured ones when none is measured.
    Fallback,
}

impl Path {
    /// Every path, for pre-registering labels.
    pub const ALL: [Self; 5] = [
        Self::TwoChoices,
        Self::WeightedPair,
        Self::Lone,
        Self::ByCapacity,
        Self::Fallback,
    ];

    /// The metric label for this path.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::TwoChoices => "two_choices",
            Self::WeightedPair => "weighted_pair",
            Self::Lone => "lone",
            Self::ByCapacity => "by_capacity",
            Self::Fallback => "fallback",
        }
    }
}

/// The kind of answer, without its data (a metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Routed to a site.
    Routed,
    /// Shed: 429 with Retry-After.
    Shed,
    /// Every candidate excluded: 503 with Retry-After.
    Unavailable,
    /// The model is not configured: 404.
    UnknownModel,
}

impl Outcome {
    /// Every outcome, for pre-registering labels.
    pub const ALL: [Self; 4] = [
        Self::Routed,
        Self::Shed,
        Self::Unavailable,
        Self::UnknownModel,
    ];

    /// The metric label for this outcome.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Routed => "routed",
            Self::Shed => "shed",
            Self::Unavailable => "unavailable",
            Self::UnknownModel => "unknown_model",
        }
    }
}

/// The answer for one request, borrowing the snapshot it was picked from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decision<'s> {
    /// Send the request to this candidate.
    Route {
        /// The chosen candidate.
        candidate: &'s Candidate,
        /// Its position in [`RouteSnapshot::candidates`].
        index: usize,
        /// The rule that chose it.
        path: Path,
    },
    /// Refuse with 429; every healthy site has been full for `full_after_ms`.
    Shed {
        /// Milliseconds the client should wait.
        retry_after_ms: u64,
    },
    /// Refuse with 503; every candidate is excluded (the model exists but cannot be served).
    Unavailable {
        /// Milliseconds the client should wait.
        retry_after_ms: u64,
    },
    /// Refuse with 404; no snapshot exists for the model.
    UnknownModel,
}

impl Decision<'_> {
    /// The kind of answer.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Route { .. } => Outcome::Routed,
            Self::Shed { .. } => Outcome::Shed,
            Self::Unavailable { .. } => Outcome::Unavailable,
            Self::UnknownModel => Outcome::UnknownModel,
        }
    }

    /// The rule that chose the site, when one was chosen.
    pub fn path(&self) -> Option<Path> {
        match self {
            Self::Route { path, .. } => Some(*path),
            _ => None,
        }
    }
}

impl Pool {
    fn weight_at(&self, pos: usize) -> f64 {
        self.cumulative[pos]
            - if pos == 0 {
                0.0
            } else {
                self.cumulative[pos - 1]
            }
    }

    fn position_of(&self, r: f64) -> usize {
        self.cumulative
            .partition_point(|&c| c <= r)
            .min(self.members.len() - 1)
    }

    /// Two distinct members drawn without replacement, each weighted by capacity;
    /// returned as candidate indices in draw order.
    fn draw_two<R: Rng + ?Sized>(&self, rng: &mut R) -> (usize, usize) {
        let len = self.members.len();
        let total = self.cumulative[len - 1];
        let first = self.position_of(rng.next_f64() * total);
        let w = self.weight_at(first);
        let before = self.cumulative[first] - w;
        let mut r = rng.next_f64() * (total - w);
        if r >= before {
            r += w;
        }
        let mut second = self.position_of(r);
        if second == first {
            // Only reachable through rounding at a boundary: take a neighbour.
            second = if first + 1 < len {
                first + 1
            } else {
                first - 1
            };
        }
        (self.members[first] as usize, self.members[second] as usize)
    }
}

impl RouteSnapshot {
    /// Picks a site for one request. Never allocates, locks or reads the store.
    pub fn pick<R: Rng + ?Sized>(&self, rng: &mut R) -> Decision<'_> {
        let route = |index: usize, path| Decision::Route {
            candidate: &self.candidates()[index],
            index,
            path,
        };
        match &self.plan {
            Plan::Unavailable { retry_after_ms } => Decision::Unavailable {
                retry_after_ms: *retry_after_ms,
            },
            Plan::Shed { retry_after_ms } => Decision::Shed {
                retry_after_ms: *retry_after_ms,
            },
            Plan::Lone(i) => route(*i as usize, Path::Lone),
            Plan::WeightedPair {
                first,
                second,
                first_share,
            } => {
                let i = if rng.next_f64() < *first_share {
                    first
                } else {
                    second
                };
                route(*i as usize, Path::WeightedPair)
            }
            Plan::TwoChoices(pool) => {
                let (a, b) = pool.draw_two(rng);
                let c = self.candidates();
                let i = if c[b].score() < c[a].score() { b } else { a };
                route(i, Path::TwoChoices)
            }
            Plan::ByCapacity(pool) => route(self.less_waiting(pool, rng), Path::ByCapacity),
            Plan::Fallback(pool) => route(self.less_waiting(pool, rng), Path::Fallback),
        }
    }
}

impl RouteSnapshot {
    /// Two distinct pool members drawn by capacity, the one with less work waiting per
    /// unit of capacity (ties to the first drawn); a lone member is taken.
    ///
    /// Per unit of capacity because a queue drains at a rate proportional to the slots
    /// serving it: 20 waiting on 64 slots clear long before 10 waiting on 8. Comparing
    /// absolute counts sent work to the small site whenever its queue was shorter in
    /// requests, however much longer in time (the routing simulator showed small remote
    /// sites stacking queues of 60 and more that way). Compared by cross-multiplying, so
    /// no division: capacities are at least the floor and waiting counts are finite.
    fn less_waiting<R: Rng + ?Sized>(&self, pool: &Pool, rng: &mut R) -> usize {
        if pool.members.len() == 1 {
            return pool.members[0] as usize;
        }
        let (a, b) = pool.draw_two(rng);
        let c = self.candidates();
        if c[b].waiting() * c[a].capacity() < c[a].waiting() * c[b].capacity() {
            b
        } else {
            a
        }
    }
}

impl RouteTable {
    /// Picks for `model`: [`Decision::UnknownModel`] when no snapshot exists for it.
    pub fn pick<R: Rng + ?Sized>(&self, model: &str, rng: &mut R) -> Decision<'_> {
        match self.get(model) {
            Some(snapshot) => snapshot.pick(rng),
            None => Decision::UnknownModel,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reading::CandidateKey;
    use crate::rng::SplitMix64;
    use crate::snapshot::{Candidate, Refusals};

    const REFUSE: Refusals = Refusals {
        shed_retry_after_ms: None,
        unavailable_retry_after_ms: 5_000,
    };

    fn cand(site: &str, capacity: f64, score: f64, waiting: f64) -> Candidate {
        Candidate::measured(
            CandidateKey::new(site, "p"),
            capacity,
            score,
            score,
            waiting,
            false,
        )
    }

    fn picked_site(d: Decision<'_>) -> String {
        match d {
            Decision::Route { candidate, .. } => candidate.site().to_string(),
            other => panic!("expected a route, got {other:?}"),
        }
    }

    #[test]
    fn lone_site_with_room_is_taken() {
        let s = RouteSnapshot::new(
            "m",
            vec![cand("a", 4.0, 0.5, 0.0), cand("b", 64.0, 1.5, 0.0)],
            vec![],
            REFUSE,
        );
        let d = s.pick(&mut SplitMix64::new(1));
        assert_eq!(d.path(), Some(Path::Lone));
        assert_eq!(picked_site(d), "a");
    }

    #[test]
    fn two_choices_never_picks_the_most_loaded_of_three() {
        let s = RouteSnapshot::new(
            "m",
            vec![
                cand("a", 10.0, 0.1, 0.0),
                cand("b", 10.0, 0.5, 0.0),
                cand("c", 10.0, 0.9, 0.0),
            ],
            vec![],
            REFUSE,
        );
        let mut rng = SplitMix64::new(3);
        for _ in 0..1_000 {
            assert_ne!(picked_site(s.pick(&mut rng)), "c");
        }
    }

    #[test]
    fn by_capacity_prefers_less_waiting_among_two_not_full() {
        let s = RouteSnapshot::new(
            "m",
            vec![cand("a", 10.0, 1.2, 5.0), cand("b", 10.0, 1.5, 1.0)],
            vec![],
            REFUSE,
        );
        let mut rng = SplitMix64::new(9);
        for _ in 0..100 {
            let d = s.pick(&mut rng);
            assert_eq!(d.path(), Some(Path::ByCapacity));
            assert_eq!(picked_site(d), "b");
        }
    }

    #[test]
    fn by_capacity_compares_work_waiting_per_unit_of_capacity() {
        // The small site has fewer requests waiting (8 < 24) but three times as many per
        // slot (1.0 against 0.375): the large one drains first and must win every draw.
        let s = RouteSnapshot::new(
            "m",
            vec![cand("small", 8.0, 1.5, 8.0), cand("large", 64.0, 1.2, 24.0)],
            vec![],
            REFUSE,
        );
        let mut rng = SplitMix64::new(11);
        for _ in 0..200 {
            let d = s.pick(&mut rng);
            assert_eq!(d.path(), Some(Path::ByCapacity));
            assert_eq!(picked_site(d), "large");
        }
        // At equal waiting per slot the first drawn is kept, so both are still used.
        let even = RouteSnapshot::new(
            "m",
            vec![cand("small", 8.0, 1.5, 8.0), cand("large", 64.0, 1.2, 64.0)],
            vec![],
            REFUSE,
        );
        let mut seen = std::collections::HashSet::new();
        for _ in 0..400 {
            seen.insert(picked_site(even.pick(&mut rng)));
        }
        assert_eq!(seen, ["small", "large"].map(String::from).into());
    }

    #[test]
    fn fallback_prefers_measured_full_sites_to_unmeasured_and_spreads_among_them() {
        let full = |site: &str, waiting: f64| {
            Candidate::measured(CandidateKey::new(site, "p"), 10.0, 2.0, 2.0, waiting, true)
        };
        let s = RouteSnapshot::new(
            "m",
            vec![
                full("a", 4.0),
                full("b", 4.0),
                Candidate::unmeasured(CandidateKey::new("u", "p"), 100.0),
            ],
            vec![],
            REFUSE,
        );
        let mut rng = SplitMix64::new(5);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let d = s.pick(&mut rng);
            assert_eq!(d.path(), Some(Path::Fallback));
            seen.insert(picked_site(d));
        }
        assert_eq!(seen, ["a", "b"].map(String::from).into());

        let only_unmeasured = RouteSnapshot::new(
            "m",
            vec![
                Candidate::unmeasured(CandidateKey::new("u1", "p"), 1.0),
                Candidate::unmeasured(CandidateKey::new("u2", "p"), 1.0),
            ],
            vec![],
            REFUSE,
        );
        let picks: Vec<_> = (0..200)
            .map(|_| picked_site(only_unmeasured.pick(&mut rng)))
            .collect();
        assert!(picks.iter().any(|p| p == "u1") && picks.iter().any(|p| p == "u2"));
    }

    #[test]
    fn empty_snapshot_is_unavailable_and_missing_model_is_unknown() {
        let s = RouteSnapshot::new("m", vec![], vec![], REFUSE);
        assert_eq!(
            s.pick(&mut SplitMix64::new(1)),
            Decision::Unavailable {
                retry_after_ms: 5_000
            }
        );
        let t = RouteTable::from_snapshots([s]);
        assert_eq!(
            t.pick("other", &mut SplitMix64::new(1)),
            Decision::UnknownModel
        );
        assert_eq!(
            t.pick("m", &mut SplitMix64::new(1)).outcome(),
            Outcome::Unavailable
        );
    }

    #[test]
    fn shedding_snapshot_sheds() {
        let refuse = Refusals {
            shed_retry_after_ms: Some(1_000),
            ..REFUSE
        };
        let s = RouteSnapshot::new("m", vec![cand("a", 1.0, 3.0, 9.0)], vec![], refuse);
        assert_eq!(
            s.pick(&mut SplitMix64::new(1)),
            Decision::Shed {
                retry_after_ms: 1_000
            }
        );
    }

    #[test]
    fn draw_two_always_returns_distinct_members_even_at_extreme_draws() {
        struct Fixed(Vec<u64>);
        impl Rng for Fixed {
            fn next_u64(&mut self) -> u64 {
                self.0.remove(0)
            }
        }
        let s = RouteSnapshot::new(
            "m",
            vec![
                cand("a", 1.0, 0.1, 0.0),
                cand("b", 2.0, 0.2, 0.0),
                cand("c", 3.0, 0.3, 0.0),
            ],
            vec![],
            REFUSE,
        );
        let Plan::TwoChoices(pool) = &s.plan else {
            panic!("three with room")
        };
        for (x, y) in [(0, 0), (u64::MAX, u64::MAX), (0, u64::MAX), (u64::MAX, 0)] {
            let (a, b) = pool.draw_two(&mut Fixed(vec![x, y]));
            assert_ne!(a, b);
        }
    }

    #[test]
    fn labels_are_distinct() {
        let paths: std::collections::HashSet<_> = Path::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(paths.len(), Path::ALL.len());
        let outcomes: std::collections::HashSet<_> =
            Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(outcomes.len(), Outcome::ALL.len());
    }
}
