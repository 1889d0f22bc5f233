//! LiteLLM's router under its `least-busy` strategy with its default cooldowns, as
//! LiteLLM publishes them (`litellm/router_strategy/least_busy.py`,
//! `litellm/router_utils/cooldown_handlers.py`): what a user putting LiteLLM's proxy in
//! front of the same sites would run.
//!
//! - Each gateway counts its own requests in flight per deployment (here, per site): one
//!   more when a request is about to be sent, one fewer when it succeeds or fails. It
//!   knows nothing of a site's capacity or of other gateways' requests.
//! - A pick is the site with the fewest, among those not cooling down; ties at random.
//! - A failure that calls for a cooldown (a 429, a 5xx, a failed exchange) cools its site
//!   down for [`COOLDOWN_MS`] when more than [`COOLDOWN_FAILURE_SHARE`] of the requests to
//!   it that ended this calendar minute failed, and more than one ended.
//! - With every site cooling down nothing is available: the gateway refuses (429).

use crate::sim_rng::SimRng;

/// LiteLLM's `DEFAULT_COOLDOWN_TIME_SECONDS`.
pub const COOLDOWN_MS: u64 = 5_000;

/// LiteLLM's `DEFAULT_FAILURE_THRESHOLD_PERCENT`: the share of this minute's requests to a
/// deployment that must have failed (strictly more) for a failure to cool it down.
pub const COOLDOWN_FAILURE_SHARE: f64 = 0.5;

/// Requests to one deployment that ended in one calendar minute: LiteLLM counts
/// successes and failures per minute, starting afresh at each.
#[derive(Clone, Copy, Debug, Default)]
struct Minute {
    index: u64,
    successes: u32,
    failures: u32,
}

impl Minute {
    const MS: u64 = 60_000;

    /// The minute holding `now`: this one, or a fresh one with nothing counted.
    fn at(self, now: u64) -> Self {
        let index = now / Self::MS;
        if index == self.index {
            self
        } else {
            Self {
                index,
                ..Self::default()
            }
        }
    }

    /// Whether a failure ending now calls for a cooldown: more than one request ended
    /// this minute, and more than [`COOLDOWN_FAILURE_SHARE`] of them failed.
    fn calls_for_cooldown(self) -> bool {
        let ended = self.successes + self.failures;
        ended > 1 && f64::from(self.failures) / f64::from(ended) > COOLDOWN_FAILURE_SHARE
    }
}

/// One site as one gateway's LiteLLM router sees it.
#[derive(Clone, Copy, Debug, Default)]
struct Deployment {
    in_flight: u32,
    minute: Minute,
    cooling_until: u64,
}

/// One gateway's least-busy router.
#[derive(Debug)]
pub struct LeastBusy {
    sites: Vec<Deployment>,
    rng: SimRng,
    tied: Vec<usize>,
}

impl LeastBusy {
    /// A router over `n` sites.
    pub fn new(n: usize, rng: SimRng) -> Self {
        Self {
            sites: vec![Deployment::default(); n],
            rng,
            tied: Vec::with_capacity(n),
        }
    }

    /// The site for a request at `now`, never `except`; `None` when every other site is
    /// cooling down.
    pub fn choose(&mut self, now: u64, except: Option<usize>) -> Option<usize> {
        self.tied.clear();
        let mut fewest = u32::MAX;
        for (i, d) in self.sites.iter().enumerate() {
            if Some(i) == except || now < d.cooling_until {
                continue;
            }
            if d.in_flight < fewest {
                fewest = d.in_flight;
                self.tied.clear();
            }
            if d.in_flight == fewest {
                self.tied.push(i);
            }
        }
        if self.tied.is_empty() {
            return None;
        }
        Some(self.tied[self.rng.below(self.tied.len() as u64) as usize])
    }

    /// A request is about to be sent to `site`.
    pub fn sent(&mut self, site: usize) {
        if let Some(d) = self.sites.get_mut(site) {
            d.in_flight += 1;
        }
    }

    /// A request to `site` ended at `now`: a success, or a failure that calls for a
    /// cooldown.
    pub fn ended(&mut self, now: u64, site: usize, ok: bool) {
        let Some(d) = self.sites.get_mut(site) else {
            return;
        };
        d.in_flight = d.in_flight.saturating_sub(1);
        d.minute = d.minute.at(now);
        if ok {
            d.minute.successes += 1;
            return;
        }
        d.minute.failures += 1;
        if d.minute.calls_for_cooldown() {
            d.cooling_until = now + COOLDOWN_MS;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(n: usize) -> LeastBusy {
        LeastBusy::new(n, SimRng::fork(1, 2))
    }

    #[test]
    fn the_site_with_the_fewest_requests_in_flight_is_picked_whatever_its_size() {
        let mut r = router(3);
        r.sent(0);
        r.sent(0);
        r.sent(2);
        assert_eq!(r.choose(0, None), Some(1));
        r.sent(1);
        r.sent(1);
        assert_eq!(r.choose(0, None), Some(2));
        let tie = r.choose(0, Some(2));
        assert!(matches!(tie, Some(0 | 1)), "0 and 1 hold two each: {tie:?}");
        r.ended(0, 0, true);
        assert_eq!(r.choose(0, Some(2)), Some(0));
    }

    #[test]
    fn a_site_failing_more_than_half_its_requests_this_minute_cools_down_for_five_seconds() {
        let mut r = router(2);
        r.sent(0);
        r.ended(1_000, 0, false);
        assert_eq!(
            r.choose(1_000, Some(1)),
            Some(0),
            "one failure alone is not enough"
        );
        for t in [2_000, 2_500] {
            r.sent(0);
            r.ended(t, 0, true);
        }
        r.sent(0);
        r.ended(3_000, 0, false);
        assert_eq!(
            r.choose(3_000, Some(1)),
            Some(0),
            "2 of 4: half is not more than half"
        );
        r.sent(0);
        r.ended(4_000, 0, false);
        assert_eq!(
            r.choose(4_000, Some(1)),
            None,
            "3 of 5 failed: cooling down"
        );
        assert_eq!(r.choose(4_000 + COOLDOWN_MS - 1, Some(1)), None);
        assert_eq!(r.choose(4_000 + COOLDOWN_MS, Some(1)), Some(0));
    }

    #[test]
    fn the_minutes_counts_start_again_each_calendar_minute() {
        let mut r = router(2);
        for t in [1_000, 2_000, 3_000] {
            r.sent(0);
            r.ended(t, 0, true);
        }
        r.sent(0);
        r.ended(Minute::MS, 0, false);
        r.sent(0);
        r.ended(Minute::MS + 1, 0, false);
        assert_eq!(
            r.choose(Minute::MS + 1, Some(1)),
            None,
            "2 of 2 this minute"
        );
    }
}
