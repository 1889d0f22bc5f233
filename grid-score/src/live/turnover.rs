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
//! How many answers a fast mean spans is set by how widely they spread: the fewer it
//! spans, the sooner it follows a change and the more it wanders with the luck of which
//! answers ended. Each mean is kept to a standard error ([`TURNOVER_PRECISION`],
//! [`FIRST_BYTE_PRECISION`]) by the spread its own answers have shown over the last
//! minute, and never spans fewer answers than its smoothing weight says. Spanning about
//! ten answers where they spread as a lognormal of sigma 1.3 (the mean 2.3 times the
//! median) read one site's turnover anywhere in a sevenfold range from one second to the
//! next, and the by-capacity shares swung with it: past saturation, a slowed site's
//! queue took in a burst of picks it then needed twice the others' time to drain.
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

use super::slot::{Durations, LiveEvidence};

/// Weight of one served answer in the fast held-time mean at most: about the last ten
/// answers.
pub const TURNOVER_SMOOTHING: f64 = 0.1;

/// Weight of one first byte in the fast time-to-first-byte mean at most: about the last
/// five.
pub const FIRST_BYTE_SMOOTHING: f64 = 0.2;

/// The standard error, in natural logarithm, the fast held-time mean is kept within once
/// its answers have shown their spread (about 14%): where they spread wider than its
/// smoothing weight allows for, each weighs less.
pub const TURNOVER_PRECISION: f64 = 0.14;

/// The standard error the fast time-to-first-byte mean is kept within, as
/// [`TURNOVER_PRECISION`] (about 20%).
pub const FIRST_BYTE_PRECISION: f64 = 0.2;

/// Degrees of freedom (answers beyond the first of each drain, decaying with
/// [`SPEED_BASELINE_MS`]) a spread needs before it sets a weight: fewer read the
/// smoothing weight as it is.
pub const SPREAD_MIN_DEGREES: f64 = 20.0;

/// Time constant of the slow means (ms): long against a slowdown's first seconds, short
/// against how long one lasts, so a lasting change becomes the new normal in minutes.
pub const SPEED_BASELINE_MS: u64 = 60_000;

/// Learned turnover of one candidate; logarithms of milliseconds throughout.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Turnover {
    held_fast: FastMean,
    held_slow: Option<f64>,
    first_fast: FastMean,
    first_slow: Option<f64>,
    unstated: FastMean,
    slow_at: u64,
}

/// `prev` moved towards `mean`, keeping `keep` of itself; `mean` when there is none yet.
fn blend(prev: Option<f64>, mean: f64, keep: f64) -> f64 {
    prev.map_or(mean, |p| p * keep + mean * (1.0 - keep))
}

/// How widely one kind of duration spreads: the squared deviations of each drain's
/// logarithms from that drain's own mean, and their degrees of freedom, both decaying
/// with [`SPEED_BASELINE_MS`]. Deviations within a drain, not from a running mean, so a
/// change of pace is not read as spread (it would slow the very means that follow it).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Spread {
    squared_deviations: f64,
    degrees: f64,
}

impl Spread {
    fn observe(&mut self, d: &Durations, keep: f64) {
        self.squared_deviations = self.squared_deviations * keep + d.log_squared_deviations();
        self.degrees = self.degrees * keep + f64::from(d.count.saturating_sub(1));
    }

    /// The weight of one sample in a fast mean kept within `precision` (standard error,
    /// natural log), at most `weight`. A mean folding each sample with weight `w` has
    /// `w / (2 - w)` times the variance of one sample; with `r = precision^2 / variance`,
    /// `w / (2 - w) = r` gives `w = 2r / (1 + r)`.
    fn weight(&self, weight: f64, precision: f64) -> f64 {
        if self.degrees < SPREAD_MIN_DEGREES {
            return weight;
        }
        let variance = self.squared_deviations / self.degrees;
        let r = precision * precision / variance;
        if r.is_finite() {
            (2.0 * r / (1.0 + r)).min(weight)
        } else {
            weight
        }
    }
}

/// A fast mean of logarithms, each sample folded in with a weight its spread sets.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct FastMean {
    log: Option<f64>,
    spread: Spread,
}

impl FastMean {
    /// Folds `samples` in, each weighing `weight` or less as the spread (which takes them
    /// in, decaying by `keep`) says; their own mean, when there were any.
    fn fold(
        &mut self,
        samples: &Durations,
        keep: f64,
        (weight, precision): (f64, f64),
    ) -> Option<f64> {
        self.spread.observe(samples, keep);
        let mean = samples.log_mean()?;
        let per_sample =
            (1.0 - self.spread.weight(weight, precision)).powf(f64::from(samples.count));
        self.log = Some(blend(self.log, mean, per_sample));
        Some(mean)
    }
}

impl Turnover {
    /// Folds in what a slot held at `now_ms`.
    pub(crate) fn observe(&mut self, e: &LiveEvidence, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.slow_at) as f64;
        let keep = (-elapsed / SPEED_BASELINE_MS as f64).exp();
        self.slow_at = self.slow_at.max(now_ms);
        let held = (TURNOVER_SMOOTHING, TURNOVER_PRECISION);
        if let Some(mean) = self.held_fast.fold(&e.served, keep, held) {
            self.held_slow = Some(blend(self.held_slow, mean, keep));
        }
        self.unstated.fold(&e.unstated, keep, held);
        let first = (FIRST_BYTE_SMOOTHING, FIRST_BYTE_PRECISION);
        if let Some(mean) = self.first_fast.fold(&e.first_bytes, keep, first) {
            self.first_slow = Some(blend(self.first_slow, mean, keep));
        }
    }

    /// The turnover to expect now (ms), once any answer has shown how long it held its
    /// slot, or, until one has, how long plain answers without a stated wait took.
    pub(crate) fn estimate(&self) -> Option<f64> {
        let Some(fast) = self.held_fast.log else {
            return self.unstated.log.map(f64::exp).filter(|ms| ms.is_finite());
        };
        let indexed = match (self.held_slow, self.first_fast.log, self.first_slow) {
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
            slot.record_first_byte(f, Some(0));
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
            slot.record_plain_answer(3_000, None);
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
            slot.record_plain_answer(9_000, None);
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

    /// Durations spread as a lognormal of `sigma` about `median_ms`, the same on every
    /// run (a fixed linear congruential generator and Box-Muller).
    fn lognormal(seed: u64, sigma: f64, median_ms: f64, n: usize) -> Vec<u64> {
        let mut state = seed;
        let mut uniform = || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        (0..n)
            .map(|_| {
                let z =
                    (-2.0 * uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * uniform()).cos();
                (median_ms * (sigma * z).exp()) as u64
            })
            .collect()
    }

    /// The estimates read once a second for five minutes, the first minute left out, of
    /// ten answers a second spread by `sigma`: the standard deviation of their logarithms.
    fn wander(sigma: f64) -> f64 {
        let mut t = Turnover::default();
        let mut logs = Vec::new();
        for second in 0..300u64 {
            let held = lognormal(second + 1, sigma, 2_000.0, 10);
            let first = lognormal(second + 1_000, sigma, 200.0, 10);
            t.observe(&evidence(&held, &first), T + second * 1_000);
            if second >= 60 {
                logs.push(t.estimate().unwrap().ln());
            }
        }
        let mean = logs.iter().sum::<f64>() / logs.len() as f64;
        (logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / logs.len() as f64).sqrt()
    }

    #[test]
    fn answers_that_spread_wide_are_averaged_over_as_many_as_the_precision_needs() {
        // At the smoothing weights alone, ten answers a second of sigma 1.3 read the
        // turnover with a standard deviation of about 0.25 (a factor of 1.3 either way);
        // kept to the precision, about half that.
        let wide = wander(1.3);
        assert!(wide < 0.2, "{wide}");
        // Answers spread as the weights allow for are read as before.
        let narrow = wander(0.5);
        assert!(narrow < 0.2, "{narrow}");
    }

    #[test]
    fn a_change_of_pace_is_not_read_as_spread() {
        // Every drain's answers alike, first at 1 s, then at 3 s: no spread within a
        // drain, so each answer keeps the full smoothing weight and the held time moves
        // to 3 s as fast as it always has.
        let mut t = Turnover::default();
        let mut now = T;
        for _ in 0..60 {
            now += 1_000;
            t.observe(&evidence(&[1_000; 10], &[]), now);
        }
        now += 1_000;
        t.observe(&evidence(&[3_000; 10], &[]), now);
        let moved = t.estimate().unwrap().ln() - 1_000f64.ln();
        let expected = 3f64.ln() * (1.0 - (1.0 - TURNOVER_SMOOTHING).powi(10));
        assert!(
            (moved - expected).abs() < 1e-6,
            "{moved} against {expected}"
        );
    }

    #[test]
    fn a_spread_weighs_answers_down_only_once_enough_have_shown_it() {
        let mut spread = Spread::default();
        assert!(
            (spread.weight(0.1, 0.14) - 0.1).abs() < f64::EPSILON,
            "nothing shown yet"
        );
        // Drains of two answers whose logarithms lie 1.3 apart: one degree of freedom
        // each, a variance of 0.845.
        let pair = {
            let slot = crate::live::LiveSlot::new();
            slot.record_served(1_000);
            slot.record_served((1_000.0 * 1.3f64.exp()) as u64);
            slot.drain().served
        };
        assert_eq!(pair.count, 2);
        for _ in 0..(SPREAD_MIN_DEGREES as usize - 1) {
            spread.observe(&pair, 1.0);
        }
        assert!(
            (spread.weight(0.1, 0.14) - 0.1).abs() < f64::EPSILON,
            "one degree short"
        );
        spread.observe(&pair, 1.0);
        let r = 0.14 * 0.14 / 0.845;
        assert!((spread.weight(0.1, 0.14) - 2.0 * r / (1.0 + r)).abs() < 1e-4);
        assert!(
            spread.weight(0.01, 0.14) <= 0.01,
            "never above the smoothing weight"
        );
    }

    #[test]
    fn a_faster_first_byte_never_reads_below_the_held_time() {
        let mut t = Turnover::default();
        t.observe(&evidence(&[2_000; 10], &[200; 10]), T);
        t.observe(&evidence(&[], &[20; 20]), T + 500);
        assert!((t.estimate().unwrap() - 2_000.0).abs() < 1.0);
    }
}
