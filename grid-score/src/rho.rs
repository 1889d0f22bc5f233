//! Saturation (rho): how near to full a candidate is, smoothed per new sample, and the
//! recent worst of it that orders candidates.

/// Weight of a new sample in the smoothed rho (exponential smoothing).
///
/// One half: two samples (2 s at the local poll) carry three quarters of the signal, so a
/// real rise shows within one refresh or two, while one odd instant moves rho only half
/// way. The first sample after a reset is taken as is.
pub const RHO_SMOOTHING: f64 = 0.5;

/// The largest rho a measured candidate reads. A site holding a million times its capacity
/// is simply full; capping keeps every measured score finite so the
/// [`crate::UNMEASURED`] sentinel (infinity) always sorts after it.
pub const RHO_CAP: f64 = 1.0e6;

/// How far back from `now` "recent worst load" looks, in ms (5 s, one peer poll):
/// a drained burst stays penalized until it ages out of this window instead of snapping
/// back on the first quieter sample.
pub const RECENT_WINDOW_MS: u64 = 5_000;

/// Samples kept for the recent-worst window; at a 1 s local poll the window holds about
/// five, so sixteen leaves room for faster pollers. Past this the oldest is forgotten
/// even if still inside the window.
pub const MAX_RECENT_SAMPLES: usize = 16;

/// The unsmoothed rho of one instant: the nearer to full of in-flight over capacity and
/// KV-cache mean plus spread. `None` when the reading carries neither.
pub(crate) fn instant_rho(in_flight: Option<f64>, capacity: f64, kv: Option<f64>) -> Option<f64> {
    let by_count = in_flight.map(|n| n / capacity);
    let rho = match (by_count, kv) {
        (Some(a), Some(b)) => a.max(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => return None,
    };
    Some(rho.clamp(0.0, RHO_CAP))
}

/// Smoothed rho plus a small ring of recent smoothed values with their stamps.
#[derive(Clone, Debug, Default)]
pub(crate) struct Pressure {
    rho: Option<f64>,
    ring: [(u64, f64); MAX_RECENT_SAMPLES],
    len: usize,
    next: usize,
}

impl Pressure {
    /// Folds one new sample in and returns the smoothed rho.
    pub(crate) fn push(&mut self, instant: f64, stamp_ms: u64) -> f64 {
        let rho = match self.rho {
            None => instant,
            Some(prev) => RHO_SMOOTHING * instant + (1.0 - RHO_SMOOTHING) * prev,
        };
        self.rho = Some(rho);
        self.ring[self.next] = (stamp_ms, rho);
        self.next = (self.next + 1) % MAX_RECENT_SAMPLES;
        self.len = (self.len + 1).min(MAX_RECENT_SAMPLES);
        rho
    }

    /// The latest smoothed rho.
    pub(crate) fn rho(&self) -> Option<f64> {
        self.rho
    }

    /// The worst smoothed rho among kept samples stamped within [`RECENT_WINDOW_MS`]
    /// before `now_ms`; the newest sample always counts, however old.
    pub(crate) fn recent_worst(&self, now_ms: u64) -> Option<f64> {
        let newest = self.rho?;
        let since = now_ms.saturating_sub(RECENT_WINDOW_MS);
        Some(
            self.ring[..self.len]
                .iter()
                .filter(|(stamp, _)| *stamp >= since)
                .fold(newest, |worst, (_, rho)| worst.max(*rho)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearer_to_full_of_count_and_kv_wins() {
        assert_eq!(instant_rho(Some(5.0), 10.0, Some(0.7)), Some(0.7));
        assert_eq!(instant_rho(Some(9.0), 10.0, Some(0.7)), Some(0.9));
        assert_eq!(instant_rho(None, 10.0, Some(0.3)), Some(0.3));
        assert_eq!(instant_rho(Some(3.0), 10.0, None), Some(0.3));
        assert_eq!(instant_rho(None, 10.0, None), None);
    }

    #[test]
    fn rho_exactly_at_the_cap_is_kept_and_past_it_is_capped() {
        assert_eq!(instant_rho(Some(RHO_CAP), 1.0, None), Some(RHO_CAP));
        assert_eq!(instant_rho(Some(RHO_CAP * 2.0), 1.0, None), Some(RHO_CAP));
        assert_eq!(instant_rho(None, 1.0, Some(f64::MAX)), Some(RHO_CAP));
    }

    #[test]
    fn first_sample_is_taken_as_is_then_smoothed() {
        let mut p = Pressure::default();
        assert!((p.push(0.8, 1) - 0.8).abs() < 1e-12);
        assert!((p.push(0.0, 2) - 0.4).abs() < 1e-12);
        assert!((p.push(0.0, 3) - 0.2).abs() < 1e-12);
    }

    #[test]
    fn a_burst_stays_worst_until_it_leaves_the_window() {
        let mut p = Pressure::default();
        p.push(2.0, 0);
        p.push(0.0, 1_000); // smoothed: 1.0
        assert_eq!(p.recent_worst(1_000), Some(2.0));
        // Exactly at the window edge the burst still counts...
        assert_eq!(p.recent_worst(RECENT_WINDOW_MS), Some(2.0));
        // ...one millisecond later it has aged out and the newest sample is the worst.
        assert_eq!(p.recent_worst(RECENT_WINDOW_MS + 1), Some(1.0));
        // The newest counts even when it is itself older than the window.
        assert_eq!(p.recent_worst(1_000_000), Some(1.0));
    }

    #[test]
    fn ring_keeps_exactly_max_samples_and_forgets_the_oldest_past_it() {
        let mut p = Pressure::default();
        p.push(1.0e3, 0); // the only high sample, oldest
        for i in 1..MAX_RECENT_SAMPLES as u64 {
            p.push(0.0, i);
        }
        // Exactly MAX samples kept: the oldest (smoothed 1000, then halving) still counts.
        assert_eq!(p.recent_worst(MAX_RECENT_SAMPLES as u64), Some(1.0e3));
        p.push(0.0, MAX_RECENT_SAMPLES as u64);
        // One more: the oldest is forgotten and the next (500) is the worst.
        assert_eq!(p.recent_worst(MAX_RECENT_SAMPLES as u64), Some(500.0));
    }
}
