//! How long a site's requests hold a slot, learned from the answers the gateway proxies:
//! no one setting fits every site and workload, and a setting longer than the requests
//! really hold their slots leaves a reading's free slots and queue barely moving the
//! shares (`ScoreConfig::turnover_ms` is only the prior until the sites' answers show
//! their own; a site whose answers have not is read at the median of the others').
//!
//! ```text
//! held   = geometric mean of first byte to last byte of streamed answers (fast: ~10 answers)
//! speed  = geometric mean of time to first byte, flow-control wait excluded,
//!          fast (~5 answers) against slow (a minute)
//! turnover = max(held_fast, held_slow x speed_fast / speed_slow)
//! ```
//!
//! A slot turns over once per request, so `slots / turnover` is the rate a site absorbs
//! work; a site that slows down turns over slower and is offered less. The held time only
//! shows a slowdown as the slowed requests end (a whole request duration later); the time
//! to first byte of requests that start after it shows it at once. Their ratio to their
//! own minute-long mean says how much slower the site is now than over that minute, and
//! that minute's held time scaled by it is the turnover to expect: a slowdown is read
//! within a few answers, and once the fast held time has caught up the two agree.
//! Geometric means, since request durations are heavy-tailed: one answer a hundred times
//! longer than the rest moves an arithmetic mean by ten times what it moves this one.
//!
//! Only first bytes with the flow-control wait taken out count (the answer carried
//! `x-llm-d-flow-queue-duration-ms`): without it the time includes queueing, and a queue
//! read as a slowdown feeds back on itself (the site's turnover grows with its queue, not
//! with its service).
//!
//! A plain answer from a site without flow control states no wait either: its time from
//! sending to its head is the slot held plus the wait for one. Such times stand for the
//! held time only while none of the site's answers has shown a clean one (a stream's end,
//! or a plain answer with its wait stated): where every answer is plain and no site runs
//! flow control they are all there is, and without them every site read at the prior, so
//! one slowed threefold kept its share and a queue three times the oracle's. Beside
//! clean ones they only add the queue twice (in the reading and in the turnover), which
//! cost the simulator's files with streamed answers up to 2% at 85% load.
//!
//! ```text
//! unstated = geometric mean of a plain answer's sending to head, no wait stated (~10)
//! turnover = unstated, until any held time is known
//! ```

use super::slot::{LOG_FIXED_BITS, LiveEvidence};

/// Weight of one served answer in the fast held-time mean: about the last ten answers.
pub const TURNOVER_SMOOTHING: f64 = 0.1;

/// Weight of one first byte in the fast time-to-first-byte mean: about the last five.
pub const FIRST_BYTE_SMOOTHING: f64 = 0.2;

/// Time constant of the slow means (ms): long against a slowdown's first seconds, short
/// against how long one lasts, so a lasting change becomes the new normal in minutes.
pub const SPEED_BASELINE_MS: u64 = 60_000;

/// Learned turnover of one candidate; logarithms of milliseconds throughout.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Turnover {
    held_fast: Option<f64>,
    held_slow: Option<f64>,
    first_fast: Option<f64>,
    first_slow: Option<f64>,
    unstated: Option<f64>,
    slow_at: u64,
}

fn log_mean(sum: u64, count: u32) -> Option<f64> {
    (count > 0).then(|| sum as f64 / f64::from(1u32 << LOG_FIXED_BITS) / f64::from(count))
}

/// Folds `count` samples whose fixed-point logarithms sum to `sum` into the mean `fast`,
/// each weighing `weight`; their own mean, when there were any.
fn fold_per_sample(fast: &mut Option<f64>, sum: u64, count: u32, weight: f64) -> Option<f64> {
    let mean = log_mean(sum, count)?;
    let keep = (1.0 - weight).powf(f64::from(count));
    *fast = Some(fast.map_or(mean, |p| p * keep + mean * (1.0 - keep)));
    Some(mean)
}

impl Turnover {
    /// Folds in what a slot held at `now_ms`.
    pub(crate) fn observe(&mut self, e: &LiveEvidence, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.slow_at) as f64;
        let keep = (-elapsed / SPEED_BASELINE_MS as f64).exp();
        self.slow_at = self.slow_at.max(now_ms);
        let slow = |prev: Option<f64>, mean: f64| {
            Some(prev.map_or(mean, |p| p * keep + mean * (1.0 - keep)))
        };
        if let Some(mean) = fold_per_sample(
            &mut self.held_fast,
            e.served_log,
            e.served,
            TURNOVER_SMOOTHING,
        ) {
            self.held_slow = slow(self.held_slow, mean);
        }
        fold_per_sample(
            &mut self.unstated,
            e.unstated_log,
            e.unstated,
            TURNOVER_SMOOTHING,
        );
        if let Some(mean) = fold_per_sample(
            &mut self.first_fast,
            e.first_byte_log,
            e.first_bytes,
            FIRST_BYTE_SMOOTHING,
        ) {
            self.first_slow = slow(self.first_slow, mean);
        }
    }

    /// The turnover to expect now (ms), once any answer has shown how long it held its
    /// slot, or, until one has, how long plain answers without a stated wait took.
    pub(crate) fn estimate(&self) -> Option<f64> {
        let Some(fast) = self.held_fast else {
            return self.unstated.map(f64::exp).filter(|ms| ms.is_finite());
        };
        let indexed = match (self.held_slow, self.first_fast, self.first_slow) {
            (Some(held), Some(now), Some(usual)) => held + now - usual,
            _ => fast,
        };
        let ms = fast.max(indexed).exp();
        ms.is_finite().then_some(ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_764_000_000_000;

    fn evidence(held: &[u64], first: &[u64]) -> LiveEvidence {
        let slot = crate::live::LiveSlot::new();
        for &h in held {
            slot.record_served(h);
        }
        for &f in first {
            slot.record_first_byte(f);
        }
        slot.drain()
    }

    #[test]
    fn nothing_is_estimated_before_a_streamed_answer_ends() {
        let mut t = Turnover::default();
        t.observe(&evidence(&[], &[200, 200]), T);
        assert_eq!(t.estimate(), None);
    }

    #[test]
    fn plain_answers_without_a_stated_wait_stand_for_the_turnover_only_until_a_held_time_is_known()
    {
        let slot = crate::live::LiveSlot::new();
        for _ in 0..10 {
            slot.record_unstated(3_000);
        }
        let mut t = Turnover::default();
        t.observe(&slot.drain(), T);
        assert!((t.estimate().unwrap() - 3_000.0).abs() < 1.0);
        t.observe(&evidence(&[2_000], &[]), T + 1_000);
        assert!(
            (t.estimate().unwrap() - 2_000.0).abs() < 1.0,
            "a held time, however few, speaks for the site"
        );
        for _ in 0..10 {
            slot.record_unstated(9_000);
        }
        t.observe(&slot.drain(), T + 2_000);
        assert!((t.estimate().unwrap() - 2_000.0).abs() < 1.0);
    }

    #[test]
    fn the_held_time_is_a_geometric_mean_that_one_outlier_barely_moves() {
        let mut t = Turnover::default();
        t.observe(&evidence(&[2_000; 20], &[]), T);
        assert!((t.estimate().unwrap() - 2_000.0).abs() < 1.0);
        t.observe(&evidence(&[200_000], &[]), T + 1_000);
        let after = t.estimate().unwrap();
        // An arithmetic mean with the same weight would read 21,800 ms.
        assert!(after < 3_200.0, "{after}");
    }

    #[test]
    fn a_site_whose_first_bytes_slow_threefold_reads_three_times_the_turnover_at_once() {
        let mut t = Turnover::default();
        let mut now = T;
        for _ in 0..120 {
            now += 1_000;
            t.observe(&evidence(&[2_000; 4], &[200; 4]), now);
        }
        assert!((t.estimate().unwrap() - 2_000.0).abs() < 5.0);
        // Slowed: first bytes at three times; no slowed request has ended yet.
        for _ in 0..3 {
            now += 500;
            t.observe(&evidence(&[], &[600; 4]), now);
        }
        let slowed = t.estimate().unwrap();
        assert!((5_000.0..6_200.0).contains(&slowed), "{slowed}");
    }

    #[test]
    fn a_faster_first_byte_never_reads_below_the_held_time() {
        let mut t = Turnover::default();
        t.observe(&evidence(&[2_000; 10], &[200; 10]), T);
        t.observe(&evidence(&[], &[20; 20]), T + 500);
        assert!((t.estimate().unwrap() - 2_000.0).abs() < 1.0);
    }
}
