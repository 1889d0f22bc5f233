//! Latency samples and their percentiles, as the load generators report them.

use std::time::Duration;

/// Recorded latencies, in microseconds; percentiles by the nearest-rank method.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Latencies {
    micros: Vec<u64>,
    sorted: bool,
}

impl Latencies {
    /// No samples.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one sample.
    pub fn record(&mut self, latency: Duration) {
        self.micros.push(latency.as_micros() as u64);
        self.sorted = false;
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &Self) {
        self.micros.extend_from_slice(&other.micros);
        self.sorted = false;
    }

    /// How many samples.
    pub fn len(&self) -> usize {
        self.micros.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.micros.is_empty()
    }

    /// The `q` quantile (`0.0..=1.0`, nearest rank), `None` without samples.
    pub fn quantile(&mut self, q: f64) -> Option<Duration> {
        if self.micros.is_empty() {
            return None;
        }
        if !self.sorted {
            self.micros.sort_unstable();
            self.sorted = true;
        }
        let n = self.micros.len();
        let rank = (q.clamp(0.0, 1.0) * n as f64).ceil() as usize;
        let index = rank.clamp(1, n) - 1;
        Some(Duration::from_micros(self.micros[index]))
    }

    /// The median.
    pub fn p50(&mut self) -> Option<Duration> {
        self.quantile(0.5)
    }

    /// The 99th percentile.
    pub fn p99(&mut self) -> Option<Duration> {
        self.quantile(0.99)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles_of_one_to_a_hundred() {
        let mut l = Latencies::new();
        for ms in (1..=100).rev() {
            l.record(Duration::from_millis(ms));
        }
        assert_eq!(l.p50(), Some(Duration::from_millis(50)));
        assert_eq!(l.p99(), Some(Duration::from_millis(99)));
        assert_eq!(l.quantile(1.0), Some(Duration::from_millis(100)));
        assert_eq!(l.quantile(0.0), Some(Duration::from_millis(1)));
    }

    #[test]
    fn no_samples_have_no_quantile_and_merge_adds_them() {
        let mut l = Latencies::new();
        assert_eq!(l.p50(), None);
        let mut other = Latencies::new();
        other.record(Duration::from_micros(7));
        l.merge(&other);
        assert_eq!(l.len(), 1);
        assert_eq!(l.p99(), Some(Duration::from_micros(7)));
    }
}
