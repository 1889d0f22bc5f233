//! Recent latency from the EPP's cumulative histograms: TTFT p50/p90, mean TPOT and the
//! error ratio over the last [`LATENCY_WINDOW_MS`], each only when at least
//! [`MIN_WINDOW_REQUESTS`] requests fed it.
//!
//! The window keeps the cumulative counters of each answered scrape and subtracts the
//! oldest one still inside the window from the newest. A counter that goes backwards
//! means the EPP restarted: the window is emptied and refills from that scrape, so no
//! figure mixes two EPP lifetimes.

use std::collections::VecDeque;

use super::reading::{Counters, Histogram};

/// How far back the latency figures look.
pub const LATENCY_WINDOW_MS: u64 = 30_000;
/// Fewest requests a figure may be computed from; fewer publish nothing rather than a
/// percentile of a handful.
pub const MIN_WINDOW_REQUESTS: f64 = 20.0;
/// Most scrapes the window keeps; at sub-100 ms scrape intervals the oldest go first and
/// the window is shorter than [`LATENCY_WINDOW_MS`].
pub const MAX_WINDOW_SNAPSHOTS: usize = 512;

/// What a new scrape's counters said compared with the previous scrape's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterChange {
    /// A request, TTFT or TPOT counter grew: the engine answered since the last scrape.
    pub engine_answered: bool,
    /// A counter went backwards: the EPP restarted and the window started over.
    pub reset: bool,
}

/// The latency figures at one instant; each `None` when not held.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Latency {
    /// Median time to first token of streaming requests, seconds.
    pub ttft_p50: Option<f64>,
    /// 90th-percentile time to first token of streaming requests, seconds.
    pub ttft_p90: Option<f64>,
    /// Mean time per output token of streaming requests, seconds.
    pub tpot: Option<f64>,
    /// Failed over all requests, 0..=1.
    pub error_ratio: Option<f64>,
    /// The newest scrape the figures include.
    pub stamp_ms: u64,
}

/// A sliding window of cumulative counters for one provider.
#[derive(Clone, Debug, Default)]
pub struct LatencyWindow {
    snapshots: VecDeque<(u64, Counters)>,
}

fn grew(old: Option<f64>, new: Option<f64>) -> bool {
    matches!((old, new), (Some(o), Some(n)) if n > o)
}

fn went_back(old: Option<f64>, new: Option<f64>) -> bool {
    matches!((old, new), (Some(o), Some(n)) if n < o)
}

fn histogram_went_back(old: Option<&Histogram>, new: Option<&Histogram>) -> bool {
    let (Some(old), Some(new)) = (old, new) else {
        return false;
    };
    new.count < old.count
        || new.sum < old.sum
        || old
            .buckets
            .iter()
            .any(|&(le, o)| bucket_at(new, le).is_some_and(|n| n < o))
}

fn bucket_at(h: &Histogram, le: f64) -> Option<f64> {
    h.buckets
        .iter()
        .find(|(b, _)| b.total_cmp(&le).is_eq())
        .map(|&(_, v)| v)
}

fn answer_counts(c: &Counters) -> [Option<f64>; 3] {
    [
        c.requests,
        c.ttft.as_ref().map(|h| h.count),
        c.tpot.as_ref().map(|h| h.count),
    ]
}

impl LatencyWindow {
    /// An empty window.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one answered scrape's counters observed at `now`.
    pub fn push(&mut self, now: u64, counters: Counters) -> CounterChange {
        let mut change = CounterChange::default();
        if let Some((_, last)) = self.snapshots.back() {
            let reset = went_back(last.requests, counters.requests)
                || went_back(last.errors, counters.errors)
                || histogram_went_back(last.ttft.as_ref(), counters.ttft.as_ref())
                || histogram_went_back(last.tpot.as_ref(), counters.tpot.as_ref());
            change.engine_answered = if reset {
                // Everything a reset counter holds was answered after the previous scrape.
                answer_counts(&counters)
                    .iter()
                    .any(|c| c.is_some_and(|v| v > 0.0))
            } else {
                answer_counts(last)
                    .iter()
                    .zip(answer_counts(&counters))
                    .any(|(o, n)| grew(*o, n))
            };
            if reset {
                self.snapshots.clear();
                change.reset = true;
            }
        }
        self.snapshots.push_back((now, counters));
        while self
            .snapshots
            .front()
            .is_some_and(|(at, _)| now.saturating_sub(*at) > LATENCY_WINDOW_MS)
        {
            self.snapshots.pop_front();
        }
        while self.snapshots.len() > MAX_WINDOW_SNAPSHOTS {
            self.snapshots.pop_front();
        }
        change
    }

    /// How many scrapes the window holds.
    pub fn len(&self) -> usize {
        self.snapshots.len()
    }

    /// Whether the window holds no scrape.
    pub fn is_empty(&self) -> bool {
        self.snapshots.is_empty()
    }

    /// The figures over the window ending at the newest scrape, as of `now`. Nothing when
    /// the newest scrape is itself older than the window.
    pub fn latency(&self, now: u64) -> Latency {
        let Some((newest_at, newest)) = self.snapshots.back() else {
            return Latency::default();
        };
        let mut out = Latency {
            stamp_ms: *newest_at,
            ..Latency::default()
        };
        if now.saturating_sub(*newest_at) > LATENCY_WINDOW_MS {
            return out;
        }
        let Some((_, base)) = self
            .snapshots
            .iter()
            .find(|(at, _)| now.saturating_sub(*at) <= LATENCY_WINDOW_MS)
        else {
            return out;
        };
        if let (Some(new), Some(old)) = (&newest.ttft, &base.ttft) {
            let deltas = bucket_deltas(old, new);
            out.ttft_p50 = quantile(0.5, &deltas);
            out.ttft_p90 = quantile(0.9, &deltas);
        }
        if let (Some(new), Some(old)) = (&newest.tpot, &base.tpot) {
            let count = new.count - old.count;
            if count >= MIN_WINDOW_REQUESTS {
                out.tpot = Some((new.sum - old.sum) / count);
            }
        }
        if let (Some(new), Some(old)) = (newest.requests, base.requests) {
            let requests = new - old;
            if requests >= MIN_WINDOW_REQUESTS {
                let errors = newest.errors.unwrap_or(0.0) - base.errors.unwrap_or(0.0);
                out.error_ratio = Some((errors / requests).clamp(0.0, 1.0));
            }
        }
        out
    }
}

/// Per-bound cumulative counts observed inside the window, forced monotone so a bound
/// that appeared mid-window cannot produce a negative bucket.
fn bucket_deltas(old: &Histogram, new: &Histogram) -> Vec<(f64, f64)> {
    let mut running = 0.0_f64;
    new.buckets
        .iter()
        .map(|&(le, n)| {
            let d = (n - bucket_at(old, le).unwrap_or(0.0)).max(0.0);
            running = running.max(d);
            (le, running)
        })
        .collect()
}

/// The `q` quantile of cumulative bucket counts by linear interpolation inside the bucket
/// the rank falls in (as Prometheus' `histogram_quantile`): the lowest bucket starts at 0,
/// and a rank in the `+Inf` bucket answers the highest finite bound. `None` with fewer
/// than [`MIN_WINDOW_REQUESTS`] observations or no `+Inf` bucket to count them.
pub fn quantile(q: f64, cumulative: &[(f64, f64)]) -> Option<f64> {
    let &(last_le, total) = cumulative.last()?;
    if last_le != f64::INFINITY || total < MIN_WINDOW_REQUESTS {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0_f64, 0.0_f64);
    for &(le, count) in cumulative {
        if count >= rank {
            if le == f64::INFINITY {
                return (lower.0 > 0.0 || lower.1 > 0.0).then_some(lower.0);
            }
            let in_bucket = count - lower.1;
            if in_bucket <= 0.0 {
                return Some(le);
            }
            let start = if lower.1 == 0.0 && lower.0 == 0.0 {
                0.0_f64.min(le)
            } else {
                lower.0
            };
            return Some(start + (le - start) * (rank - lower.1) / in_bucket);
        }
        lower = (le, count);
    }
    None
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const T0: u64 = 1_700_000_000_000;

    fn hist(buckets: &[(f64, f64)], sum: f64) -> Histogram {
        let count = buckets.last().map_or(0.0, |b| b.1);
        Histogram {
            buckets: buckets.to_vec(),
            sum,
            count,
        }
    }

    fn counters(
        requests: f64,
        errors: Option<f64>,
        ttft: &[(f64, f64)],
        tpot_sum: f64,
        tpot_count: f64,
    ) -> Counters {
        Counters {
            ttft: Some(hist(ttft, 0.0)),
            tpot: Some(Histogram {
                buckets: vec![(f64::INFINITY, tpot_count)],
                sum: tpot_sum,
                count: tpot_count,
            }),
            requests: Some(requests),
            errors,
        }
    }

    const INF: f64 = f64::INFINITY;

    #[test]
    fn quantile_rules_table() {
        type Case = (&'static str, f64, &'static [(f64, f64)], Option<f64>);
        let cases: &[Case] = &[
            (
                "the median interpolates inside its bucket",
                0.5,
                &[(1.0, 10.0), (2.0, 30.0), (INF, 40.0)],
                Some(1.5),
            ),
            (
                "the first bucket starts at zero",
                0.5,
                &[(1.0, 40.0), (INF, 40.0)],
                Some(0.5),
            ),
            (
                "p90 in the last finite bucket",
                0.9,
                &[(0.1, 0.0), (0.2, 20.0), (0.4, 40.0), (INF, 40.0)],
                Some(0.36),
            ),
            (
                "a rank in the +Inf bucket answers the highest finite bound",
                0.9,
                &[(1.0, 10.0), (2.0, 20.0), (INF, 40.0)],
                Some(2.0),
            ),
            (
                "nineteen observations are too few",
                0.5,
                &[(1.0, 19.0), (INF, 19.0)],
                None,
            ),
            (
                "twenty observations are enough",
                0.5,
                &[(1.0, 20.0), (INF, 20.0)],
                Some(0.5),
            ),
            ("no +Inf bucket answers nothing", 0.5, &[(1.0, 40.0)], None),
        ];
        for (name, q, buckets, want) in cases {
            let got = quantile(*q, buckets);
            match (got, want) {
                (Some(g), Some(w)) => assert!((g - w).abs() < 1e-9, "{name}: {g} vs {w}"),
                _ => assert_eq!(got, *want, "{name}"),
            }
        }
    }

    #[test]
    fn the_window_publishes_from_twenty_requests_and_not_from_nineteen() {
        for (requests, held) in [(19.0, false), (20.0, true)] {
            let mut w = LatencyWindow::new();
            w.push(
                T0,
                counters(100.0, Some(1.0), &[(1.0, 0.0), (INF, 0.0)], 0.0, 0.0),
            );
            w.push(
                T0 + 1_000,
                counters(
                    100.0 + requests,
                    Some(2.0),
                    &[(1.0, requests), (INF, requests)],
                    requests * 0.02,
                    requests,
                ),
            );
            let l = w.latency(T0 + 1_000);
            assert_eq!(l.ttft_p50.is_some(), held, "{requests}");
            assert_eq!(l.tpot.is_some(), held, "{requests}");
            assert_eq!(l.error_ratio.is_some(), held, "{requests}");
            if held {
                assert!((l.tpot.unwrap() - 0.02).abs() < 1e-12);
                assert!((l.error_ratio.unwrap() - 1.0 / 20.0).abs() < 1e-12);
                assert_eq!(l.stamp_ms, T0 + 1_000);
            }
        }
    }

    #[test]
    fn only_the_last_thirty_seconds_count() {
        let mut w = LatencyWindow::new();
        // 100 slow requests long ago, then 40 fast ones in the last 30 s.
        w.push(
            T0,
            counters(0.0, None, &[(1.0, 0.0), (10.0, 0.0), (INF, 0.0)], 0.0, 0.0),
        );
        w.push(
            T0 + 5_000,
            counters(
                100.0,
                None,
                &[(1.0, 0.0), (10.0, 100.0), (INF, 100.0)],
                0.0,
                0.0,
            ),
        );
        w.push(
            T0 + 35_000,
            counters(
                140.0,
                None,
                &[(1.0, 40.0), (10.0, 140.0), (INF, 140.0)],
                0.0,
                0.0,
            ),
        );
        let l = w.latency(T0 + 35_000);
        assert!((l.ttft_p50.unwrap() - 0.5).abs() < 1e-12, "{l:?}");
        assert_eq!(l.error_ratio, Some(0.0));
        // Exactly 30 s after a scrape it is still the baseline; one ms later it is not.
        let mut w = LatencyWindow::new();
        w.push(T0, counters(0.0, None, &[(INF, 0.0)], 0.0, 0.0));
        w.push(T0 + 1_000, counters(50.0, None, &[(INF, 0.0)], 0.0, 0.0));
        assert!(w.latency(T0 + LATENCY_WINDOW_MS).error_ratio.is_some());
        assert!(
            w.latency(T0 + 1_000 + LATENCY_WINDOW_MS)
                .error_ratio
                .is_none()
        );
    }

    #[test]
    fn a_counter_going_backwards_resets_the_window_until_it_refills() {
        let mut w = LatencyWindow::new();
        w.push(
            T0,
            counters(
                1_000.0,
                Some(10.0),
                &[(1.0, 500.0), (INF, 900.0)],
                9.0,
                900.0,
            ),
        );
        let c = w.push(
            T0 + 1_000,
            counters(
                1_100.0,
                Some(10.0),
                &[(1.0, 600.0), (INF, 1_000.0)],
                10.0,
                1_000.0,
            ),
        );
        assert_eq!(
            c,
            CounterChange {
                engine_answered: true,
                reset: false
            }
        );
        assert!(w.latency(T0 + 1_000).ttft_p50.is_some());
        // The EPP restarts: counters drop to small values.
        let c = w.push(
            T0 + 2_000,
            counters(5.0, None, &[(1.0, 5.0), (INF, 5.0)], 0.05, 5.0),
        );
        assert_eq!(
            c,
            CounterChange {
                engine_answered: true,
                reset: true
            }
        );
        assert_eq!(w.len(), 1);
        assert_eq!(
            w.latency(T0 + 2_000),
            Latency {
                stamp_ms: T0 + 2_000,
                ..Latency::default()
            }
        );
        w.push(
            T0 + 3_000,
            counters(15.0, None, &[(1.0, 15.0), (INF, 15.0)], 0.15, 15.0),
        );
        assert_eq!(
            w.latency(T0 + 3_000).error_ratio,
            None,
            "10 requests since the restart"
        );
        w.push(
            T0 + 4_000,
            counters(25.0, None, &[(1.0, 25.0), (INF, 25.0)], 0.25, 25.0),
        );
        assert_eq!(
            w.latency(T0 + 4_000).error_ratio,
            Some(0.0),
            "20 requests since the restart"
        );
    }

    #[test]
    fn a_bucket_going_backwards_alone_is_a_reset() {
        let mut w = LatencyWindow::new();
        w.push(
            T0,
            counters(10.0, None, &[(1.0, 8.0), (INF, 10.0)], 0.0, 0.0),
        );
        let c = w.push(
            T0 + 1_000,
            counters(10.0, None, &[(1.0, 7.0), (INF, 10.0)], 0.0, 0.0),
        );
        assert!(c.reset);
    }

    #[test]
    fn unchanged_counters_are_no_answer() {
        let mut w = LatencyWindow::new();
        assert_eq!(
            w.push(T0, counters(10.0, None, &[(INF, 3.0)], 0.0, 3.0)),
            CounterChange::default()
        );
        assert_eq!(
            w.push(T0 + 1_000, counters(10.0, None, &[(INF, 3.0)], 0.0, 3.0)),
            CounterChange::default()
        );
        let tpot_only = counters(10.0, None, &[(INF, 3.0)], 0.1, 4.0);
        assert!(w.push(T0 + 2_000, tpot_only).engine_answered);
    }

    #[test]
    fn the_window_keeps_at_most_its_snapshot_cap() {
        let mut w = LatencyWindow::new();
        for i in 0..=MAX_WINDOW_SNAPSHOTS as u64 {
            w.push(T0 + i, counters(i as f64, None, &[(INF, 0.0)], 0.0, 0.0));
            assert_eq!(w.len(), (i as usize + 1).min(MAX_WINDOW_SNAPSHOTS));
        }
    }

    proptest! {
        #[test]
        fn a_quantile_lies_inside_the_finite_bounds(
            increments in proptest::collection::vec(0u32..50, 1..12),
            overflow in 0u32..5,
            q in 0.01f64..0.99,
        ) {
            let mut cum = 0.0;
            let mut buckets: Vec<(f64, f64)> = increments.iter().enumerate().map(|(i, inc)| {
                cum += f64::from(*inc);
                ((i + 1) as f64 * 0.1, cum)
            }).collect();
            buckets.push((INF, cum + f64::from(overflow)));
            if let Some(v) = quantile(q, &buckets) {
                prop_assert!(v >= 0.0);
                prop_assert!(v <= increments.len() as f64 * 0.1 + 1e-9);
            }
            if let (Some(lo), Some(hi)) = (quantile(q * 0.5, &buckets), quantile(q, &buckets)) {
                prop_assert!(lo <= hi + 1e-9, "quantiles are monotone in q");
            }
        }
    }
}
