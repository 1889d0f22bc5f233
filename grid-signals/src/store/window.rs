//! A bounded window of one series' recent readings.

use std::collections::VecDeque;

use super::MAX_SAMPLES_PER_SERIES;

/// One stored reading: a value and when it was observed, in the store's clock
/// (milliseconds since the Unix epoch).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reading {
    /// The observed value.
    pub value: f64,
    /// When it was observed.
    pub stamp_ms: u64,
}

/// A series' readings in admission order (which is fence order), at most
/// [`MAX_SAMPLES_PER_SERIES`] of them.
#[derive(Clone, Debug, Default)]
pub(crate) struct Window {
    readings: VecDeque<Reading>,
}

impl Window {
    /// Appends a reading, pushing out the oldest when full.
    pub(crate) fn push(&mut self, reading: Reading) {
        if self.readings.len() == MAX_SAMPLES_PER_SERIES {
            self.readings.pop_front();
        }
        self.readings.push_back(reading);
    }

    /// The most recently admitted reading.
    pub(crate) fn latest(&self) -> Option<Reading> {
        self.readings.back().copied()
    }

    /// Every held reading, oldest admitted first.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = Reading> + '_ {
        self.readings.iter().copied()
    }

    /// The highest value stamped at or after `since_ms`.
    pub(crate) fn worst_since(&self, since_ms: u64) -> Option<f64> {
        self.readings
            .iter()
            .filter(|r| r.stamp_ms >= since_ms)
            .map(|r| r.value)
            .reduce(f64::max)
    }

    /// The newest stamp held.
    pub(crate) fn newest_ms(&self) -> Option<u64> {
        self.readings.iter().map(|r| r.stamp_ms).max()
    }

    /// Drops readings stamped before `cutoff_ms` from the old end.
    ///
    /// Readings arrive in fence order, which is stamp order but for jitter, so popping
    /// from the front is amortized O(1) per reading; an out-of-order older reading behind
    /// a newer one waits until it reaches the front, and every read filters by stamp, so
    /// it is never reported as fresh.
    pub(crate) fn expire(&mut self, cutoff_ms: u64) {
        while self
            .readings
            .front()
            .is_some_and(|r| r.stamp_ms < cutoff_ms)
        {
            self.readings.pop_front();
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.readings.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.readings.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(value: f64, stamp_ms: u64) -> Reading {
        Reading { value, stamp_ms }
    }

    #[test]
    fn window_holds_exactly_the_cap_and_the_next_pushes_out_the_oldest() {
        let mut w = Window::default();
        for i in 0..MAX_SAMPLES_PER_SERIES as u64 {
            w.push(r(i as f64, i));
        }
        assert_eq!(w.len(), MAX_SAMPLES_PER_SERIES);
        assert_eq!(w.iter().next(), Some(r(0.0, 0)));
        w.push(r(-1.0, 1000));
        assert_eq!(w.len(), MAX_SAMPLES_PER_SERIES);
        assert_eq!(w.iter().next(), Some(r(1.0, 1)));
        assert_eq!(w.latest(), Some(r(-1.0, 1000)));
    }

    #[test]
    fn a_drained_burst_stays_worst_until_it_ages_out() {
        let mut w = Window::default();
        w.push(r(9.0, 100));
        w.push(r(1.0, 200));
        assert_eq!(w.worst_since(100), Some(9.0));
        assert_eq!(w.worst_since(101), Some(1.0));
        assert_eq!(w.worst_since(201), None);
    }

    #[test]
    fn expiry_drops_only_readings_before_the_cutoff() {
        let mut w = Window::default();
        w.push(r(1.0, 90));
        w.push(r(2.0, 100));
        w.push(r(3.0, 150));
        w.expire(100);
        assert_eq!(w.iter().map(|x| x.value).collect::<Vec<_>>(), [2.0, 3.0]);
        assert_eq!(w.newest_ms(), Some(150));
        w.expire(151);
        assert!(w.is_empty());
    }
}
