//! Prequal (Wydrowski, Kleinberg, Rumble and Archer, "Load is not what you should
//! balance: Introducing Prequal", NSDI 2024), one instance per gateway.
//!
//! Each query triggers [`PROBES_PER_QUERY`] probes to sites drawn uniformly at random
//! (the paper's probing rate `r_probe`; it probes asynchronously, so a query is routed on
//! the pool as it stands and its own probes serve later queries). A probe reaches the
//! site half a round trip after it is sent, reads the site's requests in flight (RIF:
//! running plus waiting) and the site's own latency estimate at that instant, and is back
//! in the pool a full round trip after it was sent. The pool holds at most [`POOL_SIZE`]
//! probes (the newest replace the oldest), none older than [`PROBE_MAX_AGE_MS`] and none
//! used more than [`PROBE_MAX_USES`] times (the paper's `b_reuse`).
//!
//! Selection is the paper's hot-cold lexicographic rule: a probe is hot when its RIF is
//! above the [`HOT_QUANTILE`] quantile of the RIFs in the pool (the paper's `q_RIF`);
//! among cold probes the lowest estimated latency wins, and if every probe is hot the
//! lowest RIF. With an empty pool the query goes to a uniformly random site.
//!
//! One departure, deliberate: RIF is divided by the site's slots. The paper balances
//! replicas of similar size; here sites differ eightfold (8 to 64 slots) and a raw RIF
//! would call the largest site hot when it is the emptiest per slot. A site with no
//! ready endpoint reports infinite RIF per slot and latency.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::sim_rng::SimRng;

/// Probes in a gateway's pool (the paper's pool size).
pub const POOL_SIZE: usize = 16;
/// Probes sent per query (the paper's probing rate `r_probe`).
pub const PROBES_PER_QUERY: usize = 3;
/// A probe whose RIF is above this quantile of the pool's is hot (the paper's `q_RIF`).
pub const HOT_QUANTILE: f64 = 0.84;
/// Probes older than this (from the instant they read the site) leave the pool (ms).
pub const PROBE_MAX_AGE_MS: u64 = 1_000;
/// A probe is used for at most this many queries (the paper's `b_reuse`).
pub const PROBE_MAX_USES: u32 = 2;

/// What a probe read at a site.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProbeReading {
    /// The probed site.
    pub site: usize,
    /// Requests in flight at the site per slot (infinite with no ready endpoint).
    pub rif_per_slot: f64,
    /// The site's estimated latency for a query arriving then (ms).
    pub latency_ms: f64,
    /// When the site was read (virtual ms).
    pub read_ms: u64,
}

#[derive(Clone, Copy, Debug)]
struct Pooled {
    reading: ProbeReading,
    uses: u32,
}

/// A probe on its way back: ordered by the time it lands, then by send order.
#[derive(Clone, Copy, Debug)]
struct Landing {
    at_ms: u64,
    seq: u64,
    reading: ProbeReading,
}

impl PartialEq for Landing {
    fn eq(&self, other: &Self) -> bool {
        (self.at_ms, self.seq) == (other.at_ms, other.seq)
    }
}
impl Eq for Landing {}
impl PartialOrd for Landing {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Landing {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at_ms, self.seq).cmp(&(other.at_ms, other.seq))
    }
}

/// One gateway's probe pool and draws.
#[derive(Debug)]
pub struct Prequal {
    sites: usize,
    pool: Vec<Pooled>,
    landing: BinaryHeap<Reverse<Landing>>,
    seq: u64,
    rng: SimRng,
}

impl Prequal {
    /// An empty pool over `sites` sites.
    pub fn new(sites: usize, rng: SimRng) -> Self {
        Self {
            sites,
            pool: Vec::with_capacity(POOL_SIZE),
            landing: BinaryHeap::new(),
            seq: 0,
            rng,
        }
    }

    /// The sites to probe for this query, drawn uniformly (with replacement).
    pub fn probe_targets(&mut self, out: &mut Vec<usize>) {
        out.clear();
        for _ in 0..PROBES_PER_QUERY {
            out.push(self.rng.below(self.sites as u64) as usize);
        }
    }

    /// A probe's reading lands in the pool at `at_ms`.
    pub fn land(&mut self, at_ms: u64, reading: ProbeReading) {
        self.seq += 1;
        self.landing.push(Reverse(Landing {
            at_ms,
            seq: self.seq,
            reading,
        }));
    }

    fn catch_up(&mut self, now: u64) {
        while let Some(Reverse(l)) = self.landing.peek().copied().filter(|l| l.0.at_ms <= now) {
            self.landing.pop();
            if self.pool.len() == POOL_SIZE {
                // The oldest reading goes.
                if let Some(oldest) = self
                    .pool
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, p)| p.reading.read_ms)
                    .map(|(i, _)| i)
                {
                    self.pool.swap_remove(oldest);
                }
            }
            self.pool.push(Pooled {
                reading: l.reading,
                uses: 0,
            });
        }
        self.pool.retain(|p| {
            now.saturating_sub(p.reading.read_ms) <= PROBE_MAX_AGE_MS && p.uses < PROBE_MAX_USES
        });
    }

    /// The site for a query at `now`, never `except` (a retry leaves the site that
    /// refused it out), and whether a probe decided it (`false`: no probe in the pool was
    /// of another site, and the draw was uniform).
    pub fn choose(&mut self, now: u64, except: Option<usize>) -> (usize, bool) {
        self.catch_up(now);
        let eligible: Vec<usize> = (0..self.pool.len())
            .filter(|&i| Some(self.pool[i].reading.site) != except)
            .collect();
        if eligible.is_empty() {
            let site = match except {
                None => self.rng.below(self.sites as u64) as usize,
                Some(x) => {
                    let i = self.rng.below(self.sites.saturating_sub(1).max(1) as u64) as usize;
                    if i >= x { i + 1 } else { i }
                }
            };
            return (site, false);
        }
        let mut rifs: Vec<f64> = eligible
            .iter()
            .map(|&i| self.pool[i].reading.rif_per_slot)
            .collect();
        rifs.sort_by(f64::total_cmp);
        let rank = ((HOT_QUANTILE * rifs.len() as f64).ceil() as usize).clamp(1, rifs.len());
        let threshold = rifs[rank - 1];
        let reading = |i: usize| self.pool[i].reading;
        let cold = eligible
            .iter()
            .copied()
            .filter(|&i| reading(i).rif_per_slot <= threshold)
            .min_by(|&a, &b| reading(a).latency_ms.total_cmp(&reading(b).latency_ms));
        let lowest_rif = || {
            eligible
                .iter()
                .copied()
                .min_by(|&a, &b| reading(a).rif_per_slot.total_cmp(&reading(b).rif_per_slot))
                .unwrap_or(0)
        };
        let best = cold.unwrap_or_else(lowest_rif);
        self.pool[best].uses += 1;
        (self.pool[best].reading.site, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(site: usize, rif_per_slot: f64, latency_ms: f64) -> ProbeReading {
        ProbeReading {
            site,
            rif_per_slot,
            latency_ms,
            read_ms: 0,
        }
    }

    #[test]
    fn among_cold_probes_the_lowest_latency_wins_and_hot_ones_are_skipped() {
        let mut p = Prequal::new(8, SimRng::new(1));
        // Seven cold probes of rising latency, one hot probe with the lowest latency.
        for site in 0..7 {
            p.land(10, reading(site, 0.5, 100.0 + site as f64));
        }
        p.land(10, reading(7, 3.0, 1.0));
        assert_eq!(p.choose(10, None), (0, true));
        assert_eq!(
            p.choose(10, Some(0)),
            (1, true),
            "a retry: the next best elsewhere"
        );
    }

    #[test]
    fn probes_land_a_round_trip_later_and_leave_when_old_or_used_up() {
        let mut p = Prequal::new(4, SimRng::new(2));
        p.land(80, reading(3, 0.1, 10.0));
        assert!(!p.choose(79, None).1, "not landed yet: a uniform draw");
        assert_eq!(p.choose(80, None), (3, true));
        assert_eq!(p.choose(81, None), (3, true));
        assert!(!p.choose(82, None).1, "used {PROBE_MAX_USES} times: gone");
        p.land(100, reading(2, 0.1, 10.0));
        assert!(!p.choose(PROBE_MAX_AGE_MS + 1, None).1, "too old: gone");
    }
}
