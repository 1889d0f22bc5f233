//! What the gateway itself has in flight at a site, and how that changed since a polled
//! reading was taken.
//!
//! A polled reading stands for its whole life (a remote one up to a peer poll and more,
//! seconds), while the gateway knows at once what it sends and what ends. Every request
//! it sent since the reading is in flight at the site on top of what the reading showed,
//! and every one that ended is gone from it: so the site's load now is the reading's plus
//! the change in the gateway's own requests outstanding there since the reading's stamp.
//! Other gateways' requests are not known and stay as the reading showed them.
//!
//! ```text
//! request path: LiveSlot::record_sent / record_ended  (two counters, never reset)
//! refresh:      drain -> outstanding now, kept every OUTSTANDING_SPACING_MS
//!               change since stamp = outstanding now - outstanding at the newest sample
//!                                    taken at or before the stamp
//! ingest:       the learner keeps the count at each loaded reading's stamp, so the
//!               change is known past the kept samples (a site measured by its answers
//!               long after its last reading)
//! ```

/// Least time between two kept samples of what is outstanding: a refresh can run many
/// times a second, and the readings it corrects are a second to several seconds old.
pub const OUTSTANDING_SPACING_MS: u64 = 250;

/// Samples kept: with [`OUTSTANDING_SPACING_MS`] they reach back 16 s, past the 15 s a
/// polled reading counts (`ScoreConfig::fresh_for_ms`'s default); a reading whose stamp
/// is older than the oldest sample when it arrives is not corrected.
pub const OUTSTANDING_SAMPLES: usize = 64;

/// The gateway's own requests outstanding at one site, sampled over time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Outstanding {
    /// `(ms, outstanding)`, a ring; `len` of them are set.
    ring: [(u64, u32); OUTSTANDING_SAMPLES],
    next: usize,
    len: usize,
    /// The newest count, however recent.
    now: u32,
}

impl Default for Outstanding {
    fn default() -> Self {
        Self {
            ring: [(0, 0); OUTSTANDING_SAMPLES],
            next: 0,
            len: 0,
            now: 0,
        }
    }
}

impl Outstanding {
    /// Folds in what was outstanding at `now_ms`.
    pub(crate) fn observe(&mut self, now_ms: u64, outstanding: u32) {
        self.now = outstanding;
        let newest = self.newest();
        if newest.is_some_and(|(at, _)| now_ms < at.saturating_add(OUTSTANDING_SPACING_MS)) {
            return;
        }
        self.ring[self.next] = (now_ms, outstanding);
        self.next = (self.next + 1) % OUTSTANDING_SAMPLES;
        self.len = (self.len + 1).min(OUTSTANDING_SAMPLES);
    }

    fn newest(&self) -> Option<(u64, u32)> {
        (self.len > 0)
            .then(|| self.ring[(self.next + OUTSTANDING_SAMPLES - 1) % OUTSTANDING_SAMPLES])
    }

    /// What was outstanding at `stamp_ms`: the newest kept sample at or before it;
    /// `None` when none is that old.
    pub(crate) fn at(&self, stamp_ms: u64) -> Option<u32> {
        self.ring[..self.len]
            .iter()
            .filter(|(at, _)| *at <= stamp_ms)
            .max_by_key(|(at, _)| *at)
            .map(|(_, n)| *n)
    }

    /// What is outstanding now (the newest count, however recent).
    pub(crate) fn now(&self) -> u32 {
        self.now
    }

    /// How many more of the gateway's requests are outstanding now than at `stamp_ms`
    /// (fewer: negative); `None` when no kept sample is that old.
    pub(crate) fn change_since(&self, stamp_ms: u64) -> Option<f64> {
        Some(f64::from(self.now) - f64::from(self.at(stamp_ms)?))
    }
}

#[cfg(test)]
#[allow(
    clippy::float_cmp,
    reason = "counts of requests are small whole numbers, exact in f64"
)]
mod tests {
    use super::*;

    #[test]
    fn the_change_since_a_stamp_reads_the_newest_sample_at_or_before_it() {
        let mut o = Outstanding::default();
        o.observe(1_000, 4);
        o.observe(2_000, 10);
        o.observe(3_000, 7);
        assert_eq!(o.change_since(1_000), Some(3.0));
        assert_eq!(o.change_since(2_500), Some(-3.0));
        assert_eq!(o.change_since(3_000), Some(0.0));
        assert_eq!(o.change_since(999), None, "older than every sample");
    }

    #[test]
    fn the_count_at_a_stamp_is_the_newest_sample_at_or_before_it_and_now_the_newest_count() {
        let mut o = Outstanding::default();
        o.observe(1_000, 4);
        o.observe(2_000, 10);
        o.observe(2_100, 12);
        assert_eq!(
            (o.at(1_999), o.at(2_000), o.at(999)),
            (Some(4), Some(10), None)
        );
        assert_eq!(o.now(), 12, "kept or not, the newest count is now's");
    }

    #[test]
    fn samples_closer_than_the_spacing_update_the_count_but_are_not_kept() {
        let mut o = Outstanding::default();
        o.observe(1_000, 4);
        o.observe(1_000 + OUTSTANDING_SPACING_MS - 1, 9);
        assert_eq!(o.len, 1);
        assert_eq!(
            o.change_since(1_100),
            Some(5.0),
            "the count now is the newest"
        );
        o.observe(1_000 + OUTSTANDING_SPACING_MS, 9);
        assert_eq!(o.len, 2);
    }

    #[test]
    fn the_ring_keeps_the_last_samples_and_forgets_the_oldest() {
        let mut o = Outstanding::default();
        let spacing = OUTSTANDING_SPACING_MS;
        for i in 0..=OUTSTANDING_SAMPLES as u64 {
            o.observe(i * spacing, u32::try_from(i).unwrap());
        }
        assert_eq!(o.change_since(0), None, "the first sample is forgotten");
        assert_eq!(
            o.change_since(spacing),
            Some(OUTSTANDING_SAMPLES as f64 - 1.0)
        );
    }
}
