//! llm-d's endpoint-picker scoring applied one level up, to sites: what a hub in front of
//! several clusters would run on their scraped EPP readings, as the llm-d project's
//! multi-cluster hub does. Each site is read as llm-d's scheduler reads a pod:
//!
//! - filtered out when its reading says it cannot serve (not ready, or no ready endpoint);
//! - the queue scorer: `(max - waiting) / (max - min)` over the candidates, every site
//!   `1` when they all wait alike (`waiting`: requests waiting at the site's endpoints
//!   and held by its flow control);
//! - the KV-cache utilization scorer: `1 - utilization` (the site's average);
//! - the two added with equal weights ([`QUEUE_WEIGHT`], [`KV_CACHE_WEIGHT`], as llm-d's
//!   default profile weighs them alike), and the highest total picked, ties at random.
//!
//! Nothing else: no capacity learned or configured, no answers read, only the last
//! readings polled through the signal path, as the hub scrapes them.

use grid_score::Reading;

use crate::sim_rng::SimRng;

/// The queue scorer's weight.
pub const QUEUE_WEIGHT: f64 = 1.0;

/// The KV-cache utilization scorer's weight.
pub const KV_CACHE_WEIGHT: f64 = 1.0;

/// What the hub reads of one site: `None` when it is filtered out or never read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SiteLoad {
    /// Requests waiting at the site (endpoint queues and flow control).
    pub waiting: f64,
    /// Its endpoints' average KV-cache utilization, `0..=1`.
    pub kv_utilization: f64,
}

impl SiteLoad {
    /// The site as its last reading shows it; `None` when that says it cannot serve or
    /// says nothing of its queue.
    pub fn of(reading: &Reading) -> Option<Self> {
        if reading.ready == Some(false) || reading.ready_endpoints == Some(0) {
            return None;
        }
        Some(Self {
            waiting: reading.queue_depth? + reading.flow_held.unwrap_or(0.0),
            kv_utilization: reading.kv_mean.unwrap_or(0.0).clamp(0.0, 1.0),
        })
    }
}

/// The site with the highest score among `loads`, never `except`; `None` when no site
/// is left to score.
pub fn pick(loads: &[Option<SiteLoad>], except: Option<usize>, rng: &mut SimRng) -> Option<usize> {
    let scored = || {
        loads
            .iter()
            .enumerate()
            .filter(move |&(i, _)| Some(i) != except)
            .filter_map(|(i, l)| l.map(|l| (i, l)))
    };
    let (min, max) = scored().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (_, l)| {
        (lo.min(l.waiting), hi.max(l.waiting))
    });
    if min > max {
        return None;
    }
    let score = |l: SiteLoad| {
        let queue = if max > min {
            (max - l.waiting) / (max - min)
        } else {
            1.0
        };
        QUEUE_WEIGHT * queue + KV_CACHE_WEIGHT * (1.0 - l.kv_utilization)
    };
    let scores: Vec<(usize, f64)> = scored().map(|(i, l)| (i, score(l))).collect();
    let best = scores
        .iter()
        .map(|&(_, sc)| sc)
        .fold(f64::NEG_INFINITY, f64::max);
    let tied: Vec<usize> = scores
        .iter()
        .filter(|&&(_, sc)| sc.total_cmp(&best).is_eq())
        .map(|&(i, _)| i)
        .collect();
    Some(tied[rng.below(tied.len() as u64) as usize])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(waiting: f64, kv_utilization: f64) -> SiteLoad {
        SiteLoad {
            waiting,
            kv_utilization,
        }
    }

    #[test]
    fn the_shortest_queue_and_the_emptiest_cache_score_highest_whatever_the_sites_size() {
        let mut rng = SimRng::new(1);
        // A small idle site beats a large one with a short queue: no capacity is known.
        let loads = [
            Some(load(4.0, 1.0)),
            Some(load(0.0, 0.2)),
            Some(load(2.0, 0.9)),
        ];
        assert_eq!(pick(&loads, None, &mut rng), Some(1));
        // Queues alike: the emptier cache.
        let alike = [Some(load(3.0, 0.8)), Some(load(3.0, 0.5))];
        assert_eq!(pick(&alike, None, &mut rng), Some(1));
        // A queue's whole range is worth as much as a whole cache.
        let traded = [Some(load(0.0, 1.0)), Some(load(10.0, 0.0))];
        let first = pick(&traded, None, &mut rng);
        assert!(matches!(first, Some(0 | 1)), "tied at 1.0 each: {first:?}");
    }

    #[test]
    fn a_site_that_cannot_serve_or_refused_the_request_is_never_picked() {
        let mut rng = SimRng::new(2);
        let loads = [None, Some(load(9.0, 0.9)), Some(load(0.0, 0.0))];
        assert_eq!(pick(&loads, Some(2), &mut rng), Some(1));
        assert_eq!(pick(&[None, None], None, &mut rng), None);
        assert_eq!(pick(&[Some(load(0.0, 0.0))], Some(0), &mut rng), None);
        let not_ready = Reading {
            ready: Some(false),
            queue_depth: Some(0.0),
            ..Reading::new(1)
        };
        assert_eq!(SiteLoad::of(&not_ready), None);
        let no_endpoint = Reading {
            ready_endpoints: Some(0),
            queue_depth: Some(0.0),
            ..Reading::new(1)
        };
        assert_eq!(SiteLoad::of(&no_endpoint), None);
        let held = Reading {
            queue_depth: Some(2.0),
            flow_held: Some(3.0),
            kv_mean: Some(0.5),
            ..Reading::new(1)
        };
        assert_eq!(SiteLoad::of(&held), Some(load(5.0, 0.5)));
    }
}
