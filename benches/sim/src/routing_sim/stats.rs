//! What one policy's run measured: queueing delays, how often it sent work to a site
//! that was already full, where its traffic went second by second, what its clients saw
//! fail and how much the gateway retried.

/// One second of routing: requests sent to each site.
pub type SecondCounts = Vec<u32>;

/// The raw record of one policy's run.
#[derive(Clone, Debug, Default)]
pub struct RunRecord {
    /// Queueing delay (slot start minus arrival at the site that served it) of every
    /// request served that arrived after the warm-up, in ms, plus what it waited before
    /// leaving its gateway: for a retried request what the refusal cost it, for one held
    /// in its gateway's queue the hold (from its arrival at the gateway to the attempt
    /// that was served leaving).
    pub delays_ms: Vec<u64>,
    /// Time to first token of the same requests, as their client sees it: the delay, the
    /// round trip between the gateway and the site (the request travels half of it, the
    /// first token the other half) and the site's prefill at its current speed; for a
    /// plain answer, whose first token comes with its last, its whole service. In ms.
    pub ttft_ms: Vec<u64>,
    /// Of those, the times to first token of the requests that asked for a band above
    /// band 0 (a run with a second band); empty in a run with one band.
    pub ttft_high_ms: Vec<u64>,
    /// End to end of every answer completed (a stream cut midway is a failure, not a
    /// time): the delay, the round trip and the whole service at the site's speed, in ms.
    pub e2e_ms: Vec<u64>,
    /// Requests after the warm-up answered to their client with a failure: refused and
    /// not retried (or refused again when retried, or refused by the gateway itself), or
    /// cut after their answer began.
    pub failed: u64,
    /// Of those, requests never served (no first token): they rank after every delay in
    /// the percentiles.
    pub unserved: u64,
    /// Of the failures, refusals (a site's 503 or 429 passed on, a failed connect, the
    /// gateway's own 503 or 429) answered at an instant when another site serving the
    /// model had a free slot or room in its flow-control band, in the simulator's truth.
    pub refused_room: u64,
    /// Of those, 429s (a site's full band, or the gateway shedding).
    pub refused_room_full: u64,
    /// Requests after the warm-up sent to a second site after their first refused them.
    pub retries: u64,
    /// Refusals that would have gone elsewhere but the retry budget was spent.
    pub retries_skipped_budget: u64,
    /// Refusals that would have gone elsewhere but no other site was routable.
    pub retries_skipped_no_site: u64,
    /// Requests after the warm-up the gateway refused itself (grid's policy: every
    /// candidate excluded, or shedding), never sent to a site.
    pub refused_by_gateway: u64,
    /// Requests per second of their arrival at a gateway, over the whole run.
    pub arrivals_per_second: Vec<u32>,
    /// Client-visible failures per second of their request's arrival, over the whole run.
    pub failed_per_second: Vec<u32>,
    /// Retries per second they were sent, over the whole run.
    pub retries_per_second: Vec<u32>,
    /// Requests routed after the warm-up.
    pub routed: u64,
    /// Of those, sent to a site whose slots were all taken at that instant.
    pub sent_to_full: u64,
    /// Requests the policy could not place (ours answering unavailable); they were sent
    /// by capacity instead so that every policy serves the same requests.
    pub unplaced: u64,
    /// Requests routed per second per site, over the whole run.
    pub per_second: Vec<SecondCounts>,
}

impl RunRecord {
    /// An empty record for `sites` sites over `seconds` seconds.
    pub fn new(sites: usize, seconds: usize) -> Self {
        Self {
            per_second: vec![vec![0; sites]; seconds],
            arrivals_per_second: vec![0; seconds],
            failed_per_second: vec![0; seconds],
            retries_per_second: vec![0; seconds],
            ..Self::default()
        }
    }

    /// Counts one arrival at a gateway at `at_ms`.
    pub fn arrival(&mut self, at_ms: u64) {
        bump(&mut self.arrivals_per_second, at_ms);
    }

    /// Measured client requests: those routed after the warm-up and those the gateway
    /// refused itself.
    pub fn client_requests(&self) -> u64 {
        self.routed + self.refused_by_gateway
    }

    /// The share of requests arriving in `[from_ms, until_ms)` that failed, and how many
    /// arrived.
    pub fn failed_share(&self, from_ms: u64, until_ms: u64) -> (f64, u64) {
        let range = seconds_of(from_ms, until_ms, self.arrivals_per_second.len());
        let arrived: u64 = self.arrivals_per_second[range.clone()]
            .iter()
            .map(|&c| u64::from(c))
            .sum();
        let failed: u64 = self.failed_per_second[range]
            .iter()
            .map(|&c| u64::from(c))
            .sum();
        let share = if arrived == 0 {
            0.0
        } else {
            failed as f64 / arrived as f64
        };
        (share, arrived)
    }

    /// Retries sent in `[from_ms, until_ms)` over the requests that arrived then.
    pub fn retry_share(&self, from_ms: u64, until_ms: u64) -> f64 {
        let range = seconds_of(from_ms, until_ms, self.arrivals_per_second.len());
        let arrived: u64 = self.arrivals_per_second[range.clone()]
            .iter()
            .map(|&c| u64::from(c))
            .sum();
        let retries: u64 = self.retries_per_second[range]
            .iter()
            .map(|&c| u64::from(c))
            .sum();
        if arrived == 0 {
            0.0
        } else {
            retries as f64 / arrived as f64
        }
    }

    /// The share of the requests routed in `[from_ms, until_ms)` that went to `site`.
    pub fn site_share(&self, site: usize, from_ms: u64, until_ms: u64) -> f64 {
        let range = seconds_of(from_ms, until_ms, self.per_second.len());
        share(&self.per_second[range], site)
    }

    /// Counts one routing decision at `at_ms` to `site`.
    pub fn route(&mut self, at_ms: u64, site: usize, counted: bool, full: bool) {
        if let Some(second) = self.per_second.get_mut((at_ms / 1_000) as usize) {
            second[site] += 1;
        }
        if counted {
            self.routed += 1;
            if full {
                self.sent_to_full += 1;
            }
        }
    }
}

/// Adds one to the count of the second holding `at_ms` (none past the run's end).
pub(crate) fn bump(per_second: &mut [u32], at_ms: u64) {
    if let Some(c) = usize::try_from(at_ms / 1_000)
        .ok()
        .and_then(|s| per_second.get_mut(s))
    {
        *c += 1;
    }
}

/// The whole seconds from `from_ms` up to `until_ms`, within `len`.
fn seconds_of(from_ms: u64, until_ms: u64, len: usize) -> std::ops::Range<usize> {
    let at = |ms: u64| usize::try_from(ms / 1_000).unwrap_or(usize::MAX).min(len);
    let (from, until) = (at(from_ms), at(until_ms));
    from.min(until)..until
}

/// The `p`-th percentile (0..=100) of sorted values, nearest-rank; 0 when empty.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    percentile_with_unserved(sorted, 0, p)
}

/// What a percentile reads when a request that was never served ranks after every
/// delay: [`UNSERVED`] where the rank falls among the `unserved` (a policy that refuses
/// more than 1% of requests has no p99 delay to show; its refusals are not hidden by
/// leaving them out).
pub fn percentile_with_unserved(sorted: &[u64], unserved: u64, p: f64) -> u64 {
    let total = sorted.len() + unserved as usize;
    if total == 0 {
        return 0;
    }
    let rank = ((p / 100.0) * total as f64).ceil() as usize;
    sorted
        .get(rank.clamp(1, total) - 1)
        .copied()
        .unwrap_or(UNSERVED)
}

/// The percentile of a distribution whose rank falls among requests never served.
pub const UNSERVED: u64 = u64::MAX;

/// A degrade episode: which site, when, and the share of traffic it should fall to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DegradeWindow {
    /// The degraded site.
    pub site: usize,
    /// Degrade start (ms).
    pub from_ms: u64,
    /// Degrade end (ms).
    pub until_ms: u64,
    /// The site's share of the remaining effective capacity while degraded.
    pub fair_share: f64,
}

/// How a policy's traffic reacted to the degrade.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DegradeReaction {
    /// Share of requests sent to the site in the minute before the degrade.
    pub share_before: f64,
    /// Share sent to it while degraded.
    pub share_during: f64,
    /// Seconds from the degrade start until the site's share over a trailing
    /// [`LEAVE_WINDOW_S`] window fell at least halfway from `share_before` to the fair
    /// share and stayed there over the next window too (so one lucky window of a policy
    /// that does not react is not counted); `None` if it never did.
    pub leave_s: Option<u64>,
    /// Seconds from the degrade start to the end of the first [`HALVE_WINDOW_S`]-second
    /// window in which the site's share was at most half of `share_before` ("its share
    /// halves within N s"; an upper bound, since the reaction may have come anywhere in
    /// that window); `None` if it never was while the degrade lasted.
    pub halve_s: Option<u64>,
    /// Share sent to it in the [`BASELINE_WINDOW_S`] seconds after the episode ended (its
    /// recovery).
    pub share_after: f64,
}

/// Window the leave time is measured over (seconds).
pub const LEAVE_WINDOW_S: usize = 10;
/// Window the halving time reads the share over (seconds): long enough that one second
/// of luck (the degraded site gets about five requests a second) is not counted.
pub const HALVE_WINDOW_S: usize = 5;
/// Baseline window before the degrade (seconds).
pub const BASELINE_WINDOW_S: usize = 60;

fn share(per_second: &[SecondCounts], site: usize) -> f64 {
    let (mine, all) = per_second.iter().fold((0u64, 0u64), |(m, a), s| {
        (
            m + u64::from(s[site]),
            a + s.iter().map(|&c| u64::from(c)).sum::<u64>(),
        )
    });
    if all == 0 {
        0.0
    } else {
        mine as f64 / all as f64
    }
}

/// How traffic moved off the degraded site.
pub fn degrade_reaction(per_second: &[SecondCounts], window: DegradeWindow) -> DegradeReaction {
    let from = (window.from_ms / 1_000) as usize;
    let until = ((window.until_ms / 1_000) as usize).min(per_second.len());
    // An episode past the run's end (a shortened run) leaves empty windows, not a panic.
    let from_in = from.min(per_second.len());
    let before = &per_second[from_in.saturating_sub(BASELINE_WINDOW_S)..from_in];
    let share_before = share(before, window.site);
    let during = &per_second[from_in.min(until)..until];
    let share_during = share(during, window.site);
    let halfway = share_before - (share_before - window.fair_share) / 2.0;
    let below = |start: usize, end: usize| {
        let end = end.min(until);
        start >= end || share(&per_second[start..end], window.site) <= halfway
    };
    // Only ends whose following window still falls inside the degrade: the window after
    // the degrade ends says nothing about leaving.
    let leave_s = (from + 1..=until.saturating_sub(LEAVE_WINDOW_S)).find_map(|end| {
        let start = end.saturating_sub(LEAVE_WINDOW_S).max(from);
        (below(start, end) && below(end, end + LEAVE_WINDOW_S)).then(|| (end - from) as u64)
    });
    let halve_s = (from..until.saturating_sub(HALVE_WINDOW_S)).find_map(|start| {
        (share(&per_second[start..start + HALVE_WINDOW_S], window.site) <= share_before / 2.0)
            .then(|| (start + HALVE_WINDOW_S - from) as u64)
    });
    let after_end = (until + BASELINE_WINDOW_S).min(per_second.len());
    let share_after = share(&per_second[until.min(after_end)..after_end], window.site);
    DegradeReaction {
        share_before,
        share_during,
        share_after,
        leave_s: if share_before > window.fair_share {
            leave_s
        } else {
            // Already at or below its fair share: nothing to leave.
            Some(0)
        },
        halve_s,
    }
}

/// The figures one policy's run is judged by.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Requests measured (after the warm-up).
    pub requests: u64,
    /// Mean queueing delay (ms).
    pub mean_ms: f64,
    /// Median queueing delay (ms), a request never served ranking after every delay
    /// ([`UNSERVED`] where the median is one).
    pub p50_ms: u64,
    /// 99th percentile queueing delay (ms), likewise.
    pub p99_ms: u64,
    /// 99th percentile time to first token (ms), likewise: what the routing targets read.
    pub p99_ttft_ms: u64,
    /// 99th percentile time to first token of the requests served (ms), refusals left
    /// out: read beside [`Self::failed`], so a policy's refusals and its delays are judged
    /// apart rather than one 1% cut deciding between them.
    pub p99_ttft_served_ms: u64,
    /// In a run with a band above band 0: the 99th percentile time to first token of the
    /// requests served in band 0 and in that band (ms), apart, since a site's flow
    /// control serves the higher band first and a policy that holds requests at its
    /// gateway first in, first out does not: one tail over both bands says nothing of
    /// which band waited.
    pub p99_ttft_by_band: Option<(u64, u64)>,
    /// 99th percentile end to end of the answers completed (ms), a request never served
    /// ranking after every time.
    pub p99_e2e_ms: u64,
    /// Requests after the warm-up that failed (see [`RunRecord::failed`]).
    pub failed: u64,
    /// Refusals answered while another site had room ([`RunRecord::refused_room`]).
    pub refused_room: u64,
    /// Retries ([`RunRecord::retries`]).
    pub retries: u64,
    /// Refusals not retried for the budget ([`RunRecord::retries_skipped_budget`]).
    pub retries_skipped_budget: u64,
    /// Retries over measured client requests: the retry budget's share.
    pub retry_share: f64,
    /// Largest queueing delay (ms); [`UNSERVED`] when any request was never served.
    pub max_ms: u64,
    /// Share of requests sent to a site with every slot taken.
    pub full_share: f64,
    /// Requests the policy could not place.
    pub unplaced: u64,
    /// Each site's share of all requests routed.
    pub site_shares: Vec<f64>,
    /// The reaction to the degrade.
    pub degrade: DegradeReaction,
}

impl Summary {
    /// Summarizes a record.
    pub fn of(record: &RunRecord, window: DegradeWindow) -> Self {
        let mut delays = record.delays_ms.clone();
        delays.sort_unstable();
        let mut ttft = record.ttft_ms.clone();
        ttft.sort_unstable();
        let mut e2e = record.e2e_ms.clone();
        e2e.sort_unstable();
        let n = delays.len() as u64;
        let mean_ms = if n == 0 {
            0.0
        } else {
            delays.iter().sum::<u64>() as f64 / n as f64
        };
        let sites = record.per_second.first().map_or(0, Vec::len);
        Self {
            requests: n,
            mean_ms,
            p50_ms: percentile_with_unserved(&delays, record.unserved, 50.0),
            p99_ms: percentile_with_unserved(&delays, record.unserved, 99.0),
            p99_ttft_ms: percentile_with_unserved(&ttft, record.unserved, 99.0),
            p99_ttft_served_ms: percentile(&ttft, 99.0),
            p99_ttft_by_band: by_band(&ttft, &record.ttft_high_ms),
            p99_e2e_ms: percentile_with_unserved(&e2e, record.unserved, 99.0),
            failed: record.failed,
            refused_room: record.refused_room,
            retries: record.retries,
            retries_skipped_budget: record.retries_skipped_budget,
            retry_share: if record.client_requests() == 0 {
                0.0
            } else {
                record.retries as f64 / record.client_requests() as f64
            },
            max_ms: if record.unserved > 0 {
                UNSERVED
            } else {
                delays.last().copied().unwrap_or(0)
            },
            full_share: if record.routed == 0 {
                0.0
            } else {
                record.sent_to_full as f64 / record.routed as f64
            },
            unplaced: record.unplaced,
            site_shares: (0..sites).map(|s| share(&record.per_second, s)).collect(),
            degrade: degrade_reaction(&record.per_second, window),
        }
    }
}

/// The served 99th percentiles of band 0 and of the band above it, out of `all` (sorted)
/// and `high` (the higher band's, a sub-multiset of `all`); `None` when `high` is empty.
fn by_band(all: &[u64], high: &[u64]) -> Option<(u64, u64)> {
    if high.is_empty() {
        return None;
    }
    let mut high = high.to_vec();
    high.sort_unstable();
    let mut band0 = Vec::with_capacity(all.len().saturating_sub(high.len()));
    let mut rest = high.iter().peekable();
    for &t in all {
        if rest.peek() == Some(&&t) {
            rest.next();
        } else {
            band0.push(t);
        }
    }
    Some((percentile(&band0, 99.0), percentile(&high, 99.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_of_each_band_is_read_apart_and_a_run_with_one_band_has_none() {
        // Band 0 took 1..=100 ms, the higher band 1_000..=1_009: together the higher
        // band's tail is the whole run's, apart each band shows its own.
        let high: Vec<u64> = (1_000..1_010).rev().collect();
        let mut all: Vec<u64> = (1..=100).chain(high.iter().copied()).collect();
        all.sort_unstable();
        let (band0, above) = by_band(&all, &high).unwrap();
        assert_eq!(band0, percentile(&(1..=100).collect::<Vec<_>>(), 99.0));
        assert_eq!(above, percentile(&(1_000..1_010).collect::<Vec<_>>(), 99.0));
        assert_eq!(by_band(&all, &[]), None);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&v, 100.0), 100);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 99.0), 0);
    }

    #[test]
    fn a_request_never_served_ranks_after_every_delay() {
        let v: Vec<u64> = (1..=99).collect();
        assert_eq!(
            percentile_with_unserved(&v, 1, 99.0),
            99,
            "one in a hundred: the p99 is the last delay"
        );
        assert_eq!(percentile_with_unserved(&v, 2, 99.0), UNSERVED);
        assert_eq!(percentile_with_unserved(&[], 3, 50.0), UNSERVED);
    }

    fn window() -> DegradeWindow {
        DegradeWindow {
            site: 0,
            from_ms: 60_000,
            until_ms: 120_000,
            fair_share: 0.1,
        }
    }

    #[test]
    fn the_leave_time_is_when_the_trailing_share_crosses_halfway_and_stays() {
        // Site 0 takes half of the traffic for 60 s, then 10% from 3 s after the degrade.
        let mut per_second = vec![vec![50, 50]; 63];
        per_second.extend(vec![vec![10, 90]; 57]);
        let r = degrade_reaction(&per_second, window());
        assert!((r.share_before - 0.5).abs() < 1e-9);
        // Halfway is 0.3. The first seconds after the degrade hold 0.5 and the window
        // grows from the start: at +4 s it holds (3x50 + 10)/400 = 0.4, at +5 s
        // (150 + 20)/500 = 0.34, at +6 s (150 + 30)/600 = 0.3.
        assert_eq!(r.leave_s, Some(6));
        // From +3 s on it holds a fifth of its share. The window [+2 s, +7 s) is the first
        // at half or below: (50 + 4 x 10) / 500 = 0.18.
        assert_eq!(r.halve_s, Some(7));
        assert!((r.share_during - (150.0 + 570.0) / 6_000.0).abs() < 1e-9);
    }

    #[test]
    fn shares_by_window_count_whole_seconds_and_stop_at_the_run_end() {
        let mut r = RunRecord::new(2, 3);
        for at in [0, 999, 1_000, 2_500, 3_000] {
            r.arrival(at);
        }
        bump(&mut r.failed_per_second, 999);
        bump(&mut r.retries_per_second, 1_000);
        assert_eq!(
            r.arrivals_per_second,
            [2, 1, 1],
            "past the end: not counted"
        );
        assert_eq!(r.failed_share(0, 1_000), (0.5, 2));
        assert_eq!(r.failed_share(1_000, 9_000), (0.0, 2));
        assert!((r.retry_share(0, 3_000) - 0.25).abs() < 1e-12);
        assert_eq!(r.failed_share(5_000, 9_000), (0.0, 0), "an empty window");
    }

    #[test]
    fn a_single_low_window_of_a_policy_that_does_not_react_is_no_leave() {
        let mut per_second = vec![vec![50, 50]; 70];
        per_second.extend(vec![vec![10, 90]; 6]); // a lucky stretch...
        per_second.extend(vec![vec![50, 50]; 44]); // ...then back
        assert_eq!(degrade_reaction(&per_second, window()).leave_s, None);
        assert_eq!(
            degrade_reaction(&per_second, window()).halve_s,
            Some(14),
            "the window [+9 s, +14 s) is low enough: a halving, if a short one"
        );
        let stuck = vec![vec![50, 50]; 120];
        assert_eq!(degrade_reaction(&stuck, window()).leave_s, None);
    }
}
