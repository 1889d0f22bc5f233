//! SkyWalker (Xia et al., EuroSys 2026), the cross-region balancer of SkyPilot's serving
//! layer, as its paper and SkyServe's load balancer describe it, without the prefix-cache
//! part (the simulator's requests share no prefixes):
//!
//! - **Selective pushing.** The balancer counts its own requests in flight at each
//!   region and pushes a request to a region only while that count is under the
//!   region's limit (SkyServe's `max_concurrent_requests` per replica, sized to a
//!   replica's batch: here a site's slots). Otherwise the request waits in the
//!   balancer's own queue, first in first out, and is pushed when one of its requests
//!   ends; the queue holds at most [`MAX_HELD`], and one arriving past it is refused.
//! - **Local first, then across regions.** The gateway's own site while it has room;
//!   otherwise the remote site with the lowest share of its limit in flight (ties: the
//!   first listed).
//!
//! Each gateway knows only its own requests: with several gateways, each fills every
//! site to its whole limit.

/// SkyServe's default `max_queue_size`: requests a balancer holds before it refuses.
pub const MAX_HELD: usize = 1_000;

/// One gateway's SkyWalker balancer.
#[derive(Clone, Debug)]
pub struct SkyWalker {
    home: usize,
    in_flight: Vec<u32>,
    limit: Vec<u32>,
}

impl SkyWalker {
    /// A balancer at site `home` over sites with these limits (each at least 1).
    pub fn new(home: usize, limit: Vec<u32>) -> Self {
        Self {
            home,
            in_flight: vec![0; limit.len()],
            limit: limit.into_iter().map(|l| l.max(1)).collect(),
        }
    }

    /// Where a request goes now, never `except`; `None` while no site has room (the
    /// request waits).
    pub fn choose(&self, except: Option<usize>) -> Option<usize> {
        let room = |i: usize| Some(i) != except && self.in_flight[i] < self.limit[i];
        if self.home < self.limit.len() && room(self.home) {
            return Some(self.home);
        }
        let share = |i: usize| f64::from(self.in_flight[i]) / f64::from(self.limit[i]);
        (0..self.limit.len())
            .filter(|&i| room(i))
            .min_by(|&a, &b| share(a).total_cmp(&share(b)))
    }

    /// A request was pushed to `site`.
    pub fn sent(&mut self, site: usize) {
        if let Some(n) = self.in_flight.get_mut(site) {
            *n += 1;
        }
    }

    /// A request to `site` ended, however.
    pub fn ended(&mut self, site: usize) {
        if let Some(n) = self.in_flight.get_mut(site) {
            *n = n.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_home_site_takes_requests_up_to_its_limit_then_the_least_filled_remote_one() {
        let mut b = SkyWalker::new(1, vec![4, 2, 8]);
        for _ in 0..2 {
            assert_eq!(b.choose(None), Some(1));
            b.sent(1);
        }
        // Home full: site 0 and 2 both empty, the first listed.
        assert_eq!(b.choose(None), Some(0));
        b.sent(0);
        // 1 of 4 against 0 of 8.
        assert_eq!(b.choose(None), Some(2));
        b.ended(1);
        assert_eq!(b.choose(None), Some(1), "home has room again");
    }

    #[test]
    fn with_every_site_at_its_limit_a_request_waits_and_a_refused_one_goes_elsewhere() {
        let mut b = SkyWalker::new(0, vec![1, 1]);
        b.sent(0);
        b.sent(1);
        assert_eq!(b.choose(None), None);
        b.ended(1);
        assert_eq!(b.choose(None), Some(1));
        assert_eq!(
            b.choose(Some(1)),
            None,
            "never back to the site that refused it"
        );
        assert_eq!(
            SkyWalker::new(0, vec![0]).choose(None),
            Some(0),
            "a limit is at least 1"
        );
    }
}
