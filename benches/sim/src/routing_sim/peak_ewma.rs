//! Power of two choices over peak-EWMA cost, as tower's `PeakEwma` balancer (and
//! linkerd2-proxy's, built on it) computes it, from the gateway's own requests only.
//!
//! Per site: an estimate of the response latency that jumps to any sample above it (the
//! "peak") and otherwise decays towards new samples, and towards zero while nothing is
//! observed, with a time constant of [`DECAY_MS`] (tower's default decay, 10 s); and the
//! count of this gateway's requests still pending at the site. Cost = estimate x
//! (pending + 1). Two distinct sites drawn uniformly at random, the cheaper one wins.
//!
//! What a gateway observes arrives one half round trip after it happens at the site: the
//! first token of a streaming request (its latency sample, as a streaming response's
//! first bytes), the completion of a non-streaming one (its sample), the end of every
//! request (pending falls), a failure (its short latency is a sample too, as in tower).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::sim_rng::SimRng;

/// tower's default decay time constant of the latency estimate (ms).
pub const DECAY_MS: f64 = 10_000.0;
/// The smallest initial estimate (ms): tower starts every endpoint at a default round
/// trip; we start at the site's round trip, at least this so a zero-RTT site costs more
/// than nothing before its first sample.
pub const MIN_INITIAL_ESTIMATE_MS: f64 = 1.0;

/// What one site's estimate and pending count are.
#[derive(Clone, Copy, Debug, PartialEq)]
struct SiteCost {
    estimate_ms: f64,
    updated_ms: u64,
    pending: u32,
}

impl SiteCost {
    /// tower's `RttEstimate::update`: a sample above the estimate replaces it; one below
    /// is blended in by the time since the last update.
    fn update(&mut self, now: u64, sample_ms: f64) -> f64 {
        if self.estimate_ms < sample_ms {
            self.estimate_ms = sample_ms;
        } else {
            let elapsed = now.saturating_sub(self.updated_ms) as f64;
            let decay = (-elapsed / DECAY_MS).exp();
            self.estimate_ms = self.estimate_ms * decay + sample_ms * (1.0 - decay);
        }
        self.updated_ms = now;
        self.estimate_ms
    }

    /// tower's `load()`: the estimate decayed towards zero (an update with a zero
    /// sample), times pending + 1.
    fn cost(&mut self, now: u64) -> f64 {
        self.update(now, 0.0) * f64::from(self.pending + 1)
    }
}

/// Something the gateway learns at `at_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Observation {
    at_ms: u64,
    seq: u64,
    site: usize,
    /// A latency sample in whole ms, if this observation carries one.
    sample_ms: Option<u64>,
    /// Whether the request is over (pending falls).
    done: bool,
}

/// One gateway's peak-EWMA balancer.
#[derive(Debug)]
pub struct PeakEwmaP2c {
    sites: Vec<SiteCost>,
    arriving: BinaryHeap<Reverse<Observation>>,
    seq: u64,
    rng: SimRng,
}

impl PeakEwmaP2c {
    /// A balancer over sites whose round trips from this gateway are `rtt_ms`.
    pub fn new(rtt_ms: &[u64], rng: SimRng) -> Self {
        Self {
            sites: rtt_ms
                .iter()
                .map(|&rtt| SiteCost {
                    estimate_ms: (rtt as f64).max(MIN_INITIAL_ESTIMATE_MS),
                    updated_ms: 0,
                    pending: 0,
                })
                .collect(),
            arriving: BinaryHeap::new(),
            seq: 0,
            rng,
        }
    }

    /// A request sent to `site` now: pending rises at once (the gateway knows).
    pub fn sent(&mut self, site: usize) {
        self.sites[site].pending += 1;
    }

    /// The gateway will learn at `at_ms` a latency sample for `site` and/or that one of
    /// its requests there is over.
    pub fn observe(&mut self, at_ms: u64, site: usize, sample_ms: Option<u64>, done: bool) {
        self.seq += 1;
        self.arriving.push(Reverse(Observation {
            at_ms,
            seq: self.seq,
            site,
            sample_ms,
            done,
        }));
    }

    /// Applies every observation due by `now`, in time order.
    fn catch_up(&mut self, now: u64) {
        while let Some(Reverse(o)) = self.arriving.peek().copied().filter(|o| o.0.at_ms <= now) {
            self.arriving.pop();
            let site = &mut self.sites[o.site];
            if let Some(sample) = o.sample_ms {
                site.update(o.at_ms, sample as f64);
            }
            if o.done {
                site.pending = site.pending.saturating_sub(1);
            }
        }
    }

    /// Two distinct sites drawn uniformly, the cheaper one (the first on a tie); never
    /// `except` (a retry leaves the site that refused it out).
    pub fn choose(&mut self, now: u64, except: Option<usize>) -> usize {
        self.catch_up(now);
        let n = self.sites.len();
        // The sites it may draw, as draws in 0..m mapped past `except`.
        let m = n - usize::from(except.is_some_and(|x| x < n));
        let site = |i: usize| match except {
            Some(x) if i >= x => i + 1,
            _ => i,
        };
        if m < 2 {
            return site(0);
        }
        let a = self.rng.below(m as u64) as usize;
        let mut b = self.rng.below(m as u64 - 1) as usize;
        if b >= a {
            b += 1;
        }
        let (a, b) = (site(a), site(b));
        let (ca, cb) = (self.sites[a].cost(now), self.sites[b].cost(now));
        if cb < ca { b } else { a }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_above_the_estimate_replaces_it_and_one_below_blends_in_over_time() {
        let mut c = SiteCost {
            estimate_ms: 100.0,
            updated_ms: 0,
            pending: 0,
        };
        assert!((c.update(1_000, 500.0) - 500.0).abs() < 1e-9, "the peak");
        // One decay time later, a sample of 0 leaves e^-1 of the estimate.
        let blended = c.update(11_000, 0.0);
        assert!(
            (blended - 500.0 * (-1.0f64).exp()).abs() < 1e-6,
            "{blended}"
        );
    }

    #[test]
    fn the_cost_grows_with_pending_requests_and_the_cheaper_of_two_wins() {
        let mut p = PeakEwmaP2c::new(&[10, 10], SimRng::new(1));
        for _ in 0..5 {
            p.sent(0);
        }
        for _ in 0..20 {
            assert_eq!(p.choose(0, None), 1, "site 0 has five pending");
        }
        // Its requests end a round trip later, and five go to site 1: site 0 wins.
        for _ in 0..5 {
            p.observe(10, 0, Some(10), true);
            p.sent(1);
        }
        for _ in 0..20 {
            assert_eq!(p.choose(10, None), 0, "site 1 has five pending");
        }
        for _ in 0..20 {
            assert_eq!(
                p.choose(10, Some(0)),
                1,
                "a retry from site 0: the only other"
            );
        }
    }
}
