//! The request path: one pick over a pre-built snapshot.
//!
//! Locks nothing, allocates nothing, reads no store: the snapshot already holds the path
//! and its cumulative weights, so a pick is at most two uniform draws, two binary
//! searches and, of the two candidates drawn, how many of this gateway's requests each
//! holds (two atomic loads each, from the live slot the request path counts them in).

use crate::Rng;
use crate::snapshot::{Candidate, CandidateState, Path, Plan, Pool, RouteSnapshot, RouteTable};

grid_signals::label_values! {
    /// The kind of answer, without its data (a metric label).
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
    /// One member drawn with probability its weight over the total: its position in the
    /// pool.
    fn draw_position<R: Rng + ?Sized>(&self, rng: &mut R) -> usize {
        let last = self.members.len() - 1;
        let r = rng.next_f64() * self.cumulative[last];
        self.cumulative.partition_point(|&c| c <= r).min(last)
    }

    /// The weight of the member at `pos`.
    fn weight_at(&self, pos: usize) -> f64 {
        let below = pos.checked_sub(1).map_or(0.0, |p| self.cumulative[p]);
        self.cumulative[pos] - below
    }

    /// Two members drawn as [`Pool::draw_position`] draws one, and of the two the one
    /// holding fewer of this gateway's requests at this instant for its weight: the lower
    /// of (requests + 1) / weight, the first drawn on a tie; the first drawn when either
    /// does not count its requests ([`Candidate::requests_now`]). A candidate index.
    ///
    /// The weights stand from one refresh to the next, a second or more, while requests
    /// arrive and end at every pick: drawn once, a run of picks lands on one site by
    /// chance while its requests there last long, and the queue that forms there is the
    /// tail. Of two drawn, the one holding less for its share is the one whose requests
    /// end sooner or that chance has sent fewer since, so a site's in-flight count
    /// follows its weight (at equal service, its share of the picks is the weight's)
    /// and a site whose requests run long is drawn less before any refresh says so.
    fn draw_two<R: Rng + ?Sized>(&self, candidates: &[Candidate], rng: &mut R) -> usize {
        let first = self.draw_position(rng);
        let second = self.draw_position(rng);
        let (a, b) = (self.members[first] as usize, self.members[second] as usize);
        if a == b {
            return a;
        }
        match (candidates[a].requests_now(), candidates[b].requests_now()) {
            // Cross-multiplied: no division, whatever the weights.
            (Some(held_a), Some(held_b))
                if (f64::from(held_b) + 1.0) * self.weight_at(first)
                    < (f64::from(held_a) + 1.0) * self.weight_at(second) =>
            {
                b
            }
            _ => a,
        }
    }

    /// A member drawn as [`Pool::draw_position`] draws one (a candidate index), with the
    /// members at `failed_site` left out, and those whose queue takes `drains_within_ms`
    /// or longer to drain; `None` when no other member has weight.
    fn draw_elsewhere<R: Rng + ?Sized>(
        &self,
        candidates: &[Candidate],
        failed_site: &str,
        drains_within_ms: f64,
        rng: &mut R,
    ) -> Option<usize> {
        let weight = |pos: usize| {
            let c = &candidates[self.members[pos] as usize];
            (&**c.site() != failed_site && c.drain_ms() < drains_within_ms)
                .then(|| self.weight_at(pos))
        };
        draw_indexed(self.members.len(), rng, weight).map(|pos| self.members[pos] as usize)
    }
}

impl RouteSnapshot {
    /// Picks a site for one request: on a drawn path, two drawn by weight and the one
    /// holding fewer of this gateway's requests for its weight, as
    /// [`Candidate::requests_now`] reads them (`docs/routing.md`, "Selection"). Never
    /// allocates, locks or reads the store; reads two atomic counts of each of the two
    /// candidates' live slots.
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
            Plan::Spread(pool) => route(pool.draw_two(self.candidates(), rng), Path::Spread),
            Plan::Overflow(pool) => route(pool.draw_two(self.candidates(), rng), Path::Overflow),
            Plan::ByCapacity(pool) => {
                route(pool.draw_two(self.candidates(), rng), Path::ByCapacity)
            }
            Plan::Fallback(pool) => route(pool.draw_two(self.candidates(), rng), Path::Fallback),
        }
    }
}

impl RouteSnapshot {
    /// Where a request goes once when its first site, `failed_site`, refused it: a
    /// candidate elsewhere that has headroom, drawn by its reach; with none, one drawn as a
    /// first pick would be, by the plan's weights with `failed_site` left out. When the
    /// refusing site's reading shows it full, that draw keeps only the sites whose queue
    /// drains sooner than its full band, and with none the request goes to the one whose
    /// queue drains soonest. Otherwise, with nothing drawn, one whose answers do not say
    /// it is full, drawn by reach; else any elsewhere, by reach. `None` when no candidate
    /// is elsewhere. Allocates nothing.
    ///
    /// With no headroom elsewhere every other site is queueing, and the plan's weights
    /// (the by-capacity rule) say how fast each drains its queue. Drawn by reach instead,
    /// the refusals of the fast sites, which are drawn most and so refuse most, were
    /// retried onto a slow site by its slots and kept its queue, the longest in time, full.
    /// A band is full in requests, not in time: a site at half speed whose band holds as
    /// many requests per slot as a fast one's holds them twice as long, so a refusal sent
    /// there by weight alone waited longer than in the band that refused it (two slowed
    /// sites at 124% of what they served: a p99 twice the oracle's, which retries only to
    /// the shortest wait).
    ///
    /// Refusals come in bursts (a site losing its endpoints refuses everything it held at
    /// once) and the view does not move between them, so the one site ranked first would
    /// take the whole burst: a small one overflowed and refused it again beside larger
    /// sites with room. Drawn by reach, a burst lands on each site in proportion to the
    /// slots that drain it, which adds the same wait per slot everywhere.
    pub fn pick_elsewhere<R: Rng + ?Sized>(&self, failed_site: &str, rng: &mut R) -> Option<usize> {
        let candidates = self.candidates();
        let elsewhere = |c: &Candidate| &**c.site() != failed_site;
        if let Some(i) = draw_weighted(candidates, rng, |c| {
            (elsewhere(c) && c.headroom() > 0.0).then(|| c.reach())
        }) {
            return Some(i);
        }
        let full_band_ms = candidates
            .iter()
            .filter(|c| !elsewhere(c) && c.state() == CandidateState::Full)
            .map(Candidate::drain_ms)
            .reduce(f64::max);
        let drawn = |within_ms, rng: &mut R| {
            self.pool()
                .and_then(|pool| pool.draw_elsewhere(candidates, failed_site, within_ms, rng))
        };
        if let Some(full_band_ms) = full_band_ms {
            return drawn(full_band_ms, rng).or_else(|| {
                (0..candidates.len())
                    .filter(|&i| elsewhere(&candidates[i]))
                    .min_by(|&a, &b| {
                        candidates[a]
                            .drain_ms()
                            .total_cmp(&candidates[b].drain_ms())
                    })
            });
        }
        drawn(f64::INFINITY, rng)
            .or_else(|| {
                draw_weighted(candidates, rng, |c| {
                    elsewhere(c).then(|| c.reach() * c.live_factor())
                })
            })
            .or_else(|| draw_weighted(candidates, rng, |c| elsewhere(c).then(|| c.reach())))
    }
}

/// One of `candidates` drawn with probability its weight over the total, a candidate
/// without one (`None`), or with one not positive and finite, never; `None` when no
/// candidate has such a weight.
fn draw_weighted<R: Rng + ?Sized>(
    candidates: &[Candidate],
    rng: &mut R,
    weight: impl Fn(&Candidate) -> Option<f64>,
) -> Option<usize> {
    draw_indexed(candidates.len(), rng, |i| weight(&candidates[i]))
}

/// One of `0..n` drawn with probability its weight over the total, as [`draw_weighted`]
/// draws a candidate.
fn draw_indexed<R: Rng + ?Sized>(
    n: usize,
    rng: &mut R,
    weight: impl Fn(usize) -> Option<f64>,
) -> Option<usize> {
    let usable = |i: usize| weight(i).filter(|w| w.is_finite() && *w > 0.0);
    let total: f64 = (0..n).filter_map(usable).sum();
    if !(total.is_finite() && total > 0.0) {
        return None;
    }
    let mut r = rng.next_f64() * total;
    let mut last = None;
    for i in 0..n {
        let Some(w) = usable(i) else { continue };
        if r < w {
            return Some(i);
        }
        r -= w;
        last = Some(i);
    }
    // Rounding left the draw past the last weight.
    last
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
    use crate::SplitMix64;
    use crate::reading::CandidateKey;
    use crate::snapshot::{Candidate, LIVE_FACTOR_FLOOR, Refusals, Signal};

    const REFUSE: Refusals = Refusals {
        shed_retry_after_ms: None,
        unavailable_retry_after_ms: 5_000,
    };

    /// A measured candidate whose newest sample read `rho` (a remote one: 5 s apart).
    fn cand(site: &str, capacity: f64, rho: f64, waiting: f64) -> Candidate {
        read(site, capacity, rho, waiting, false)
    }

    /// As [`cand`], its sample saturated with work waiting (`full`) or not.
    fn read(site: &str, capacity: f64, rho: f64, waiting: f64, full: bool) -> Candidate {
        Candidate::measured(
            CandidateKey::new(site, "p"),
            capacity,
            rho,
            rho,
            waiting,
            full,
        )
        .with_signal(Signal {
            rho_now: rho,
            life_ms: 5_000.0,
            pace: 1.0,
            turnover_ms: 0.0,
        })
    }

    /// `c` with a learned turnover of `turnover_ms`.
    fn turning_over(c: Candidate, turnover_ms: f64) -> Candidate {
        let signal = Signal {
            turnover_ms,
            ..c.signal()
        };
        c.with_signal(signal)
    }

    fn picked_site(d: Decision<'_>) -> String {
        match d {
            Decision::Route { candidate, .. } => candidate.site().to_string(),
            other => panic!("expected a route, got {other:?}"),
        }
    }

    fn shares(s: &RouteSnapshot, n: u32, seed: u64) -> std::collections::HashMap<String, f64> {
        let mut rng = SplitMix64::new(seed);
        let mut counts = std::collections::HashMap::new();
        for _ in 0..n {
            *counts.entry(picked_site(s.pick(&mut rng))).or_insert(0.0) += 1.0 / f64::from(n);
        }
        counts
    }

    #[test]
    fn lone_site_with_headroom_for_what_the_grid_serves_is_taken() {
        // b: 4 slots turning over every 2 s absorb 2/s; 12 queued over 5 s is 2.4/s: none.
        // a: 16 slots, a fifth busy: 8/s + 16 x 0.8 / 5 s = 10.6/s of headroom against
        // the 3.6/s both serve.
        let s = RouteSnapshot::new(
            "m",
            vec![cand("a", 16.0, 0.2, 0.0), cand("b", 4.0, 4.0, 12.0)],
            vec![],
            REFUSE,
        );
        for seed in 0..20 {
            let d = s.pick(&mut SplitMix64::new(seed));
            assert_eq!(d.path(), Some(Path::Lone));
            assert_eq!(picked_site(d), "a");
        }
    }

    #[test]
    fn a_lone_site_with_little_headroom_takes_its_headroom_and_the_rest_overflow_by_capacity() {
        // a: 8 slots at 0.95: 4/s + 8 x 0.05 / 5 s = 4.08/s of headroom. b: 64 slots with
        // 192 waiting, no headroom, serving 32/s. The grid serves 35.8/s: a's headroom
        // covers 11.4% of the picks; the rest go by capacity over waiting, a 8 x 1^2 = 8
        // against b 64 x (64 / 256)^2 = 4. Lone would have sent a every pick.
        let s = RouteSnapshot::new(
            "m",
            vec![cand("a", 8.0, 0.95, 0.0), cand("b", 64.0, 4.0, 192.0)],
            vec![],
            REFUSE,
        );
        assert_eq!(s.path(), Some(Path::Overflow));
        let spread = 4.08 / 35.8;
        let want_a = spread + (1.0 - spread) * 8.0 / 12.0;
        let share_a = shares(&s, 20_000, 3)["a"];
        assert!((share_a - want_a).abs() < 0.02, "{share_a} vs {want_a}");
    }

    #[test]
    fn spread_never_picks_a_site_without_headroom() {
        let s = RouteSnapshot::new(
            "m",
            vec![
                cand("a", 10.0, 0.1, 0.0),
                cand("b", 10.0, 0.5, 0.0),
                cand("c", 10.0, 5.0, 40.0),
            ],
            vec![],
            REFUSE,
        );
        assert_eq!(s.path(), Some(Path::Spread));
        let mut rng = SplitMix64::new(3);
        for _ in 0..1_000 {
            assert_ne!(picked_site(s.pick(&mut rng)), "c");
        }
    }

    #[test]
    fn balanced_sites_share_traffic_in_proportion_to_capacity_not_by_who_reads_lowest() {
        // No herding on who reads lowest: were the site reading a hair lower to win, it
        // would take most of the traffic. The shares follow capacity, nudged by the reading.
        let s = RouteSnapshot::new(
            "m",
            vec![
                cand("s8", 8.0, 0.84, 0.0),
                cand("s16", 16.0, 0.85, 0.0),
                cand("s32", 32.0, 0.86, 0.0),
                cand("s64", 64.0, 0.86, 0.0),
            ],
            vec![],
            REFUSE,
        );
        let got = shares(&s, 40_000, 7);
        for (site, cap) in [("s8", 8.0), ("s16", 16.0), ("s32", 32.0), ("s64", 64.0)] {
            let want = cap / 120.0;
            assert!(
                (got[site] - want).abs() < 0.02,
                "{site}: {} vs {want}",
                got[site]
            );
        }
    }

    #[test]
    fn by_capacity_prefers_less_waiting_per_unit_of_capacity() {
        // No site has headroom. The small one has fewer requests waiting (40 < 166) but
        // more per slot (5 against 2.6): the large one drains first and takes most.
        let s = RouteSnapshot::new(
            "m",
            vec![
                cand("small", 8.0, 6.0, 40.0),
                cand("large", 64.0, 3.6, 166.0),
            ],
            vec![],
            REFUSE,
        );
        assert_eq!(s.path(), Some(Path::ByCapacity));
        let got = shares(&s, 20_000, 11);
        // Weights 8 (8/48)^2 = 0.2222 and 64 (64/230)^2 = 4.955.
        let want = 4.955 / (4.955 + 0.2222);
        assert!((got["large"] - want).abs() < 0.02, "{got:?}");
        assert!(got["small"] > 0.0, "still spread, not herded");
    }

    #[test]
    fn a_site_read_full_is_weighted_by_its_queue_and_failures_and_its_answers_floor_only_a_site_not_read_full()
     {
        // No site has headroom; both hold the same slots and queue. `refusing`'s answers
        // said it is full (live factor 0).
        let snapshot = |read_full: bool, failures: f64| {
            let s = RouteSnapshot::new(
                "m",
                vec![
                    read("quiet", 32.0, 4.0, 96.0, read_full),
                    read("refusing", 32.0, 4.0, 96.0, read_full)
                        .with_live(0.0, Some(0))
                        .with_failures(failures),
                ],
                vec![],
                REFUSE,
            );
            assert_eq!(s.path(), Some(Path::ByCapacity));
            shares(&s, 20_000, 5)["refusing"]
        };
        // Read full, its queue is counted: its "full" says nothing more.
        let got = snapshot(true, 0.0);
        assert!((got - 0.5).abs() < 0.02, "{got}");
        // Its serving failures still weigh: 1 / (1 + 3) against 1.
        let got = snapshot(true, 3.0);
        assert!((got - 0.2).abs() < 0.02, "{got}");
        // Not read full, only its answers say so: floored.
        let floor = LIVE_FACTOR_FLOOR / (1.0 + LIVE_FACTOR_FLOOR);
        let got = snapshot(false, 0.0);
        assert!((got - floor).abs() < 0.01, "{got}");
    }

    #[test]
    fn a_site_read_full_is_weighted_by_its_queue_in_time_not_its_pace() {
        // No site has headroom; both hold the same slots and queue. `paced`'s pace backed
        // off to an eighth (it kept more than two waiting per slot).
        let snapshot = |read_full: bool| {
            let paced = read("paced", 32.0, 4.0, 96.0, read_full);
            let signal = Signal {
                pace: 0.125,
                ..paced.signal()
            };
            let s = RouteSnapshot::new(
                "m",
                vec![
                    read("steady", 32.0, 4.0, 96.0, read_full),
                    paced.with_signal(signal),
                ],
                vec![],
                REFUSE,
            );
            assert_eq!(s.path(), Some(Path::ByCapacity));
            shares(&s, 20_000, 5)["paced"]
        };
        // Read full, its queue's drain time is in the weight: the pace would count it
        // again.
        let got = snapshot(true);
        assert!((got - 0.5).abs() < 0.02, "{got}");
        // Not read full, the pace stands: 0.125 against 1.
        let got = snapshot(false);
        assert!((got - 0.125 / 1.125).abs() < 0.02, "{got}");
    }

    #[test]
    fn a_refusal_with_no_headroom_elsewhere_is_retried_by_the_weights_of_a_first_pick() {
        // No site has headroom. By its slots `large` would take 64 of 72 retries (0.889);
        // by the by-capacity weights, which count how fast each drains its queue, 0.957
        // (weights 8 (8/48)^2 = 0.2222 and 64 (64/230)^2 = 4.955).
        let s = RouteSnapshot::new(
            "m",
            vec![
                cand("refused", 64.0, 3.6, 166.0),
                cand("small", 8.0, 6.0, 40.0),
                cand("large", 64.0, 3.6, 166.0),
            ],
            vec![],
            REFUSE,
        );
        assert_eq!(s.path(), Some(Path::ByCapacity));
        let mut rng = SplitMix64::new(9);
        let draws = 20_000;
        let mut large = 0;
        for _ in 0..draws {
            let at = s
                .pick_elsewhere("refused", &mut rng)
                .expect("two sites elsewhere");
            let site = s.candidates()[at].site().to_string();
            assert_ne!(site, "refused");
            large += u32::from(site == "large");
        }
        let got = f64::from(large) / f64::from(draws);
        let want = 4.955 / (4.955 + 0.2222);
        assert!((got - want).abs() < 0.01, "{got}");
    }

    #[test]
    fn a_site_read_full_drains_its_queue_with_what_it_has_shown_it_holds_not_its_faded_reach() {
        // Both hold 32 slots busy and 128 waiting; `kept_full` has shown no calm moment
        // for minutes, so its reach faded to 8 while it holds 32 in service at its limit.
        let snapshot = |full: bool, shown: f64| {
            RouteSnapshot::new(
                "m",
                vec![
                    read("kept_full", 8.0, 20.0, 128.0, full).with_shown(shown),
                    read("fresh", 32.0, 5.0, 128.0, full).with_shown(32.0),
                ],
                vec![],
                REFUSE,
            )
        };
        let s = snapshot(true, 32.0);
        assert_eq!(s.path(), Some(Path::ByCapacity));
        let shares = s.plan_shares();
        assert!((shares[0] - 0.5).abs() < 1e-9, "{shares:?}");
        let kept_full = s.candidates().iter().find(|c| &**c.site() == "kept_full");
        // 128 waiting on 32 slots turning over every 2 s.
        assert_eq!(kept_full.map(Candidate::drain_ms), Some(8_000.0));
        // A reading that does not show it full says nothing of a limit: its reach stands.
        assert_eq!(
            snapshot(false, 32.0).plan_shares(),
            snapshot(false, 0.0).plan_shares()
        );
    }

    #[test]
    fn a_site_whose_answers_have_not_shown_a_turnover_is_read_at_the_others_not_the_prior() {
        // Both idle with 8 slots. `answered` has shown a 100 ms turnover, `new` none yet.
        // Read at the 2 s prior, `new` would be offered 4 requests a second of its slots'
        // turnover against 80 and drawn about a twentieth of the time.
        let answered = turning_over(cand("answered", 8.0, 0.0, 0.0), 100.0);
        let s = RouteSnapshot::new(
            "m",
            vec![answered, cand("new", 8.0, 0.0, 0.0)],
            vec![],
            REFUSE,
        );
        assert_eq!(s.path(), Some(Path::Spread));
        let new = s
            .candidates()
            .iter()
            .position(|c| &**c.site() == "new")
            .expect("a candidate");
        let shares = s.plan_shares();
        assert!((shares[new] - 0.5).abs() < 1e-9, "{shares:?}");
    }

    #[test]
    fn sites_read_full_that_turn_over_faster_than_the_prior_drain_at_their_own_pace() {
        // Both read full, 32 slots and 128 waiting each; `fast` turns over in 500 ms,
        // `slow` in 1,000 ms, both under the 2 s prior. `fast` drains its queue in 2 s,
        // `slow` in 4 s: by-capacity weights 32 x 4 / (1 + 1)^2 = 32 and
        // 32 x 2 / (1 + 2)^2 = 7.11. Read no faster than the prior, both drained in 8 s
        // and split the picks evenly.
        let full = |site: &str, turnover_ms: f64| {
            turning_over(read(site, 32.0, 5.0, 128.0, true), turnover_ms)
        };
        let s = RouteSnapshot::new(
            "m",
            vec![full("fast", 500.0), full("slow", 1_000.0)],
            vec![],
            REFUSE,
        );
        assert_eq!(s.path(), Some(Path::ByCapacity));
        let drain = |site: &str| {
            s.candidates()
                .iter()
                .find(|c| &**c.site() == site)
                .map(Candidate::drain_ms)
        };
        assert_eq!(drain("fast"), Some(2_000.0));
        assert_eq!(drain("slow"), Some(4_000.0));
        let want = 32.0 / (32.0 + 64.0 / 9.0);
        let got = shares(&s, 20_000, 11)["fast"];
        assert!((got - want).abs() < 0.02, "{got} against {want}");
    }

    #[test]
    fn a_site_read_full_that_has_stopped_answering_is_not_drawn_at_its_old_turnover() {
        // `slowed` turned over in 200 ms until it slowed twentyfold; it holds 20 on 4
        // slots and no answer has ended for 3 s. `busy` turns over in 200 ms and holds 5
        // on its 4 slots: its room falls short of what the grid serves, so about half the
        // picks go by capacity. Read at 200 ms, `slowed` drained its queue in 0.8 s and
        // drew a third of those picks; silent for longer than the prior, it is read at the
        // prior and drains in 8 s.
        let sites = |quiet_ms: f64| {
            RouteSnapshot::new(
                "m",
                vec![
                    turning_over(read("slowed", 4.0, 5.0, 16.0, true), 200.0).with_quiet(quiet_ms),
                    turning_over(cand("busy", 4.0, 1.25, 1.0), 200.0),
                ],
                vec![],
                REFUSE,
            )
        };
        let share = |s: &RouteSnapshot| shares(s, 20_000, 5).get("slowed").copied().unwrap_or(0.0);
        let silent = sites(3_000.0);
        assert_eq!(silent.path(), Some(Path::Overflow));
        let slowed = |s: &RouteSnapshot| {
            s.candidates()
                .iter()
                .find(|c| &**c.site() == "slowed")
                .map(Candidate::drain_ms)
        };
        assert_eq!(slowed(&silent), Some(8_000.0));
        let answering = sites(0.0);
        assert_eq!(slowed(&answering), Some(800.0), "answering: its own pace");
        assert!(share(&silent) < 0.03, "{}", share(&silent));
        assert!(share(&answering) > 0.1, "{}", share(&answering));
    }

    #[test]
    fn a_refusal_at_a_site_read_full_goes_only_where_a_queue_drains_sooner_than_its_band() {
        let retried = |s: &RouteSnapshot, failed: &str| {
            let mut rng = SplitMix64::new(3);
            let mut got = std::collections::HashMap::new();
            for _ in 0..2_000 {
                let at = s.pick_elsewhere(failed, &mut rng).expect("sites elsewhere");
                *got.entry(s.candidates()[at].site().to_string())
                    .or_insert(0) += 1;
            }
            got
        };
        // `refused` drains its full band in 8 s (128 on 32 slots at 2 s), `fast` in 6 s
        // (48 on 16), `slow` in 16 s (256 on 64 slots at 4 s). Drawn by the by-capacity
        // weights alone `slow` would take 28% of the retries (0.395 against 1).
        let s = RouteSnapshot::new(
            "m",
            vec![
                read("refused", 32.0, 5.0, 128.0, true),
                read("fast", 16.0, 4.0, 48.0, true),
                turning_over(read("slow", 64.0, 5.0, 256.0, true), 4_000.0),
            ],
            vec![],
            REFUSE,
        );
        assert_eq!(s.path(), Some(Path::ByCapacity));
        assert_eq!(retried(&s, "refused").get("slow"), None);
        // None drains sooner: the one that drains soonest, `slow` (16 s) before
        // `slowest` (32 on 8 slots at 8 s: 32 s).
        let s = RouteSnapshot::new(
            "m",
            vec![
                read("refused", 32.0, 5.0, 128.0, true),
                turning_over(read("slow", 64.0, 5.0, 256.0, true), 4_000.0),
                turning_over(read("slowest", 8.0, 5.0, 32.0, true), 8_000.0),
            ],
            vec![],
            REFUSE,
        );
        assert_eq!(retried(&s, "refused").get("slow"), Some(&2_000));
        // A site whose reading shows no queue refused anyway (its 429 is the only sign):
        // its band's depth is not known, and the weights alone draw.
        let s = RouteSnapshot::new(
            "m",
            vec![
                read("refused", 32.0, 0.5, 0.0, false).with_live(0.0, Some(0)),
                read("fast", 16.0, 4.0, 48.0, true),
                turning_over(read("slow", 64.0, 5.0, 256.0, true), 4_000.0),
            ],
            vec![],
            REFUSE,
        );
        let got = retried(&s, "refused");
        assert!(got.get("slow").is_some_and(|&n| n > 200), "{got:?}");
    }

    #[test]
    fn fallback_spreads_over_the_unmeasured_by_capacity() {
        let only_unmeasured = RouteSnapshot::new(
            "m",
            vec![
                Candidate::unmeasured(CandidateKey::new("u1", "p"), 1.0),
                Candidate::unmeasured(CandidateKey::new("u2", "p"), 3.0),
            ],
            vec![],
            REFUSE,
        );
        assert_eq!(only_unmeasured.path(), Some(Path::Fallback));
        let got = shares(&only_unmeasured, 20_000, 5);
        assert!((got["u2"] - 0.75).abs() < 0.02, "{got:?}");
    }

    #[test]
    fn without_signals_a_site_holding_more_of_the_gateways_requests_than_its_capacity_is_drawn_less()
     {
        let unmeasured = |site: &str, own: f64| {
            Candidate::unmeasured(CandidateKey::new(site, "p"), 8.0).with_own(own)
        };
        // Sixteen of ours on eight slots: eight waiting, one per unit, so 8 / (1 + 1)^2
        // against 8 beside it.
        let s = RouteSnapshot::new(
            "m",
            vec![unmeasured("queued", 16.0), unmeasured("free", 4.0)],
            vec![],
            REFUSE,
        );
        assert_eq!(s.path(), Some(Path::Fallback));
        let got = shares(&s, 20_000, 5);
        assert!((got["queued"] - 0.2).abs() < 0.02, "{got:?}");
        // Within its capacity a site's share is its capacity's, however many of ours it
        // holds: the weights stand until the next refresh, and drawing for free slots
        // herds.
        let s = RouteSnapshot::new(
            "m",
            vec![unmeasured("busy", 8.0), unmeasured("idle", 0.0)],
            vec![],
            REFUSE,
        );
        let got = shares(&s, 20_000, 5);
        assert!((got["busy"] - 0.5).abs() < 0.02, "{got:?}");
    }

    #[test]
    fn an_unmeasured_site_is_tried_by_capacity_once_every_measured_site_is_full() {
        // A full site with 80 waiting on 10 slots beside one without a signal: the
        // unknown site is tried (as if it held nothing waiting) rather than piling more on
        // the full one; a full site keeps its own, smaller, by-capacity share.
        let full = Candidate::measured(CandidateKey::new("f", "p"), 10.0, 9.0, 9.0, 80.0, true);
        let s = RouteSnapshot::new(
            "m",
            vec![
                full,
                Candidate::unmeasured(CandidateKey::new("u", "p"), 10.0),
            ],
            vec![],
            REFUSE,
        );
        assert_eq!(s.path(), Some(Path::ByCapacity));
        let got = shares(&s, 20_000, 5);
        // Weights: 10 x (10/90)^2 against 10.
        let want = 1.0 / (1.0 + (10.0f64 / 90.0).powi(2));
        assert!((got["u"] - want).abs() < 0.02, "{got:?}");
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

    /// A live slot holding `n` of this gateway's requests (sent, not ended).
    fn holding(n: u32) -> std::sync::Arc<crate::live::LiveSlot> {
        let slot = std::sync::Arc::new(crate::live::LiveSlot::default());
        for _ in 0..n {
            slot.record_sent();
        }
        slot
    }

    #[test]
    fn of_two_sites_drawn_the_one_holding_fewer_of_the_gateways_requests_is_sent() {
        // Two equal sites: drawn alone, each would take half. The one holding six of the
        // gateway's requests loses to the one holding none unless both draws fall on it:
        // a quarter of the picks, on every drawn path.
        let pair = |busy: Candidate, idle: Candidate| {
            RouteSnapshot::new(
                "m",
                vec![
                    busy.with_requests(holding(6)),
                    idle.with_requests(holding(0)),
                ],
                vec![],
                REFUSE,
            )
        };
        for (s, path) in [
            (
                pair(cand("busy", 16.0, 0.2, 0.0), cand("idle", 16.0, 0.2, 0.0)),
                Path::Spread,
            ),
            (
                pair(cand("busy", 16.0, 6.0, 80.0), cand("idle", 16.0, 6.0, 80.0)),
                Path::ByCapacity,
            ),
            (
                pair(
                    Candidate::unmeasured(CandidateKey::new("busy", "p"), 16.0),
                    Candidate::unmeasured(CandidateKey::new("idle", "p"), 16.0),
                ),
                Path::Fallback,
            ),
        ] {
            assert_eq!(s.path(), Some(path));
            let busy = shares(&s, 20_000, 5)["busy"];
            assert!((busy - 0.25).abs() < 0.02, "{path:?}: {busy}");
        }
    }

    #[test]
    fn requests_are_weighed_against_each_sites_weight_not_counted_alone() {
        // "big" has three times "small"'s headroom and holds four requests to its one:
        // (4 + 1) / 3 is less than (1 + 1) / 1, so big wins whenever drawn, and small is
        // sent only when both draws fall on it: (1/4)^2. Counted alone, small (1 < 4)
        // would win whenever drawn: 1 - (3/4)^2.
        let s = RouteSnapshot::new(
            "m",
            vec![
                cand("big", 48.0, 0.2, 0.0).with_requests(holding(4)),
                cand("small", 16.0, 0.2, 0.0).with_requests(holding(1)),
            ],
            vec![],
            REFUSE,
        );
        assert_eq!(s.path(), Some(Path::Spread));
        let weight = s.candidates()[1].headroom()
            / s.candidates().iter().map(Candidate::headroom).sum::<f64>();
        assert!((weight - 0.25).abs() < 1e-9, "{weight}");
        let small = shares(&s, 20_000, 9)["small"];
        assert!((small - 0.0625).abs() < 0.01, "{small}");
    }

    #[test]
    fn a_candidate_not_counting_its_requests_is_drawn_by_weight_alone() {
        // Built outside a refresher, "b" counts its requests nowhere: the first draw
        // stands whatever "a" holds, and the shares are the weights.
        let s = RouteSnapshot::new(
            "m",
            vec![
                cand("a", 16.0, 0.2, 0.0).with_requests(holding(50)),
                cand("b", 16.0, 0.2, 0.0),
            ],
            vec![],
            REFUSE,
        );
        assert_eq!(s.candidates()[0].requests_now(), Some(50));
        assert_eq!(s.candidates()[1].requests_now(), None);
        let a = shares(&s, 20_000, 13)["a"];
        assert!((a - 0.5).abs() < 0.02, "{a}");
    }

    #[test]
    fn a_draw_at_either_extreme_stays_among_the_members() {
        struct Fixed(u64);
        impl Rng for Fixed {
            fn next_u64(&mut self) -> u64 {
                self.0
            }
        }
        let s = RouteSnapshot::new(
            "m",
            vec![
                cand("a", 1.0, 0.1, 0.0),
                cand("b", 2.0, 0.2, 0.0),
                cand("c", 3.0, 9.0, 30.0),
            ],
            vec![],
            REFUSE,
        );
        for x in [0, u64::MAX] {
            let site = picked_site(s.pick(&mut Fixed(x)));
            assert!(site == "a" || site == "b", "{site} has no headroom");
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

    #[test]
    fn a_drained_burst_stays_penalized_in_the_pick_weights_until_it_ages_out() {
        // A drained burst stays penalized until it ages out: a site that just drained a
        // burst reads "no room" and must not get the same share as an identical calm site.
        // Its recent worst (1.4) counts in its headroom: 16/2 + 16 x (1 - 1.4)/2 = 4.8/s
        // against the calm site's 8 + 4 = 12/s, a share of 4.8/16.8 = 28.6%.
        let drained = Candidate::measured(
            CandidateKey::new("drained", "p"),
            16.0,
            0.5,
            1.4,
            0.0,
            false,
        )
        .with_signal(Signal {
            rho_now: 0.5,
            life_ms: 1_000.0,
            pace: 1.0,
            turnover_ms: 0.0,
        });
        let calm = cand("calm", 16.0, 0.5, 0.0).with_signal(Signal {
            rho_now: 0.5,
            life_ms: 1_000.0,
            pace: 1.0,
            turnover_ms: 0.0,
        });
        assert_eq!(drained.state(), CandidateState::NoRoom);
        let s = RouteSnapshot::new("m", vec![drained, calm], vec![], REFUSE);
        assert_eq!(
            &**s.candidates()[1].site(),
            "drained",
            "ordered after the calm site"
        );
        let got = shares(&s, 20_000, 13);
        assert!((got["drained"] - 4.8 / 16.8).abs() < 0.02, "{got:?}");
    }
}
