//! Headroom: how much work a site can absorb until its reading is replaced, the weight
//! each pick is drawn with (see `docs/routing.md`, "Selection").
//!
//! Every pick until the next refresh reads the same snapshot, and a remote site's reading
//! stands for a whole peer poll (5 s), so any rule that sends a request to "the site that
//! reads best" sends it every request for seconds (in the routing simulator, queues of a
//! hundred and more). Instead each snapshot carries one draw distribution: a site's share
//! is its expected intake rate over the life of its reading,
//!
//! ```text
//! headroom = pace x capacity / turnover  +  capacity x (1 - rho_now) / life
//! ```
//!
//! the rate at which its slots turn over (capacity per request duration, scaled down by
//! `pace` when the site keeps a queue anyway) plus its free slots (or minus its queue,
//! `rho_now` above 1) spread over the time the reading stands (`life`, the gap between
//! its samples, at least [`MIN_SPREAD_MS`]). A balanced grid therefore splits traffic in
//! proportion to capacity, a site reading free slots gets a little more, a site reading a
//! queue less, in proportion to how much, and a stale reading moves its site's share
//! only as much as it can be worth over its whole life.

/// The shortest time a reading's free slots (or queue) are spread over, in ms.
///
/// Two gateway refreshes: the local site is read every second, and spreading its
/// deviation over one refresh alone overcorrects (the routing simulator's p99 at 85% load:
/// a tenth higher at 1 s than at 2 s), while remote readings stand for their own 5 s gap.
pub const MIN_SPREAD_MS: u64 = 2_000;

/// Waiting requests per slot above which a site's pace backs off: two requests waiting
/// behind every slot is twice the usual request duration of queue, which a site absorbing
/// what its slots suggest would not keep.
pub const PACE_BACKOFF_WAITING_PER_SLOT: f64 = 2.0;

/// Waiting requests per slot at or below which a site's pace recovers.
pub const PACE_RECOVER_WAITING_PER_SLOT: f64 = 0.5;

/// Factor the pace is multiplied by per [`PACE_PERIOD_MS`] of samples while backing off.
pub const PACE_DOWN: f64 = 0.6;

/// Factor the pace is multiplied by per [`PACE_PERIOD_MS`] of samples while recovering
/// (slower than [`PACE_DOWN`] takes away, so a slow site is not flooded again at once).
pub const PACE_UP: f64 = 1.3;

/// The period the pace factors apply per (one peer poll): a site read every second moves
/// its pace as fast per second as one read every five, so a remote site is not corrected
/// five times slower than the local one.
pub const PACE_PERIOD_MS: u64 = 5_000;

/// The lowest pace: a slow site keeps a twentieth of its turnover share so its recovery
/// is seen.
pub const PACE_FLOOR: f64 = 0.05;

/// How much of its slots' turnover a site has been absorbing, learned from its own
/// readings: a site that keeps a queue of more than [`PACE_BACKOFF_WAITING_PER_SLOT`]
/// per slot serves slower than its slots suggest (a degraded backend, long requests) and
/// is offered less; one that drains recovers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Pace(f64);

impl Default for Pace {
    fn default() -> Self {
        Self(1.0)
    }
}

impl Pace {
    /// Folds in one new sample, `gap_ms` after the previous one.
    pub(crate) fn update(&mut self, waiting_per_slot: f64, gap_ms: u64) {
        let periods = (gap_ms as f64 / PACE_PERIOD_MS as f64).min(2.0);
        if waiting_per_slot > PACE_BACKOFF_WAITING_PER_SLOT {
            self.0 = (self.0 * PACE_DOWN.powf(periods)).max(PACE_FLOOR);
        } else if waiting_per_slot <= PACE_RECOVER_WAITING_PER_SLOT {
            self.0 = (self.0 * PACE_UP.powf(periods)).min(1.0);
        }
    }

    /// The factor, in `[PACE_FLOOR, 1]`.
    pub(crate) fn get(self) -> f64 {
        self.0
    }
}

/// A site's expected intake over the life of its reading, in requests per second; zero
/// when its queue outweighs its turnover. Inputs are finite by construction (capacity at
/// least the floor, rho capped, pace in range, durations at least 1 ms).
pub(crate) fn headroom(
    capacity: f64,
    rho_now: f64,
    pace: f64,
    life_ms: f64,
    turnover_ms: f64,
) -> f64 {
    let turnover = pace * capacity * 1_000.0 / turnover_ms.max(1.0);
    let spread = capacity * (1.0 - rho_now) * 1_000.0 / life_ms.max(MIN_SPREAD_MS as f64);
    let h = turnover + spread;
    if h.is_finite() { h.max(0.0) } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_sites_get_headroom_in_proportion_to_capacity() {
        let small = headroom(8.0, 0.85, 1.0, 5_000.0, 2_000.0);
        let large = headroom(64.0, 0.85, 1.0, 5_000.0, 2_000.0);
        assert!((large / small - 8.0).abs() < 1e-9);
    }

    #[test]
    fn a_queue_lowers_headroom_and_a_long_one_zeroes_it() {
        let free = headroom(16.0, 0.5, 1.0, 5_000.0, 2_000.0);
        let queued = headroom(16.0, 1.5, 1.0, 5_000.0, 2_000.0);
        assert!(queued < free && queued > 0.0);
        // 16 slots turning over every 2 s absorb 8/s; 48 queued spread over 5 s is 9.6/s.
        assert!(headroom(16.0, 4.0, 1.0, 5_000.0, 2_000.0) == 0.0);
    }

    #[test]
    fn a_stale_reading_moves_the_share_less_than_a_fresh_one() {
        let fresh = headroom(16.0, 0.0, 1.0, 1_000.0, 2_000.0);
        let remote = headroom(16.0, 0.0, 1.0, 5_000.0, 2_000.0);
        assert!(remote < fresh);
        // Below the minimum spread the life is taken as the minimum.
        assert!((fresh - headroom(16.0, 0.0, 1.0, MIN_SPREAD_MS as f64, 2_000.0)).abs() < 1e-9);
    }

    #[test]
    fn pace_backs_off_past_the_threshold_and_recovers_at_or_below_the_other() {
        let mut p = Pace::default();
        p.update(PACE_BACKOFF_WAITING_PER_SLOT, PACE_PERIOD_MS);
        assert!(
            (p.get() - 1.0).abs() < 1e-12,
            "exactly at the threshold: no change"
        );
        p.update(PACE_BACKOFF_WAITING_PER_SLOT + 0.01, PACE_PERIOD_MS);
        assert!((p.get() - PACE_DOWN).abs() < 1e-12);
        p.update(1.0, PACE_PERIOD_MS); // between the thresholds: held
        assert!((p.get() - PACE_DOWN).abs() < 1e-12);
        p.update(PACE_RECOVER_WAITING_PER_SLOT, PACE_PERIOD_MS);
        assert!((p.get() - PACE_DOWN * PACE_UP).abs() < 1e-12);
        for _ in 0..100 {
            p.update(0.0, PACE_PERIOD_MS);
        }
        assert!((p.get() - 1.0).abs() < 1e-12, "never above 1");
        for _ in 0..100 {
            p.update(100.0, PACE_PERIOD_MS);
        }
        assert!(
            (p.get() - PACE_FLOOR).abs() < 1e-12,
            "never below the floor"
        );
    }

    #[test]
    fn pace_moves_per_time_not_per_sample() {
        let (mut local, mut remote) = (Pace::default(), Pace::default());
        for _ in 0..5 {
            local.update(10.0, 1_000);
        }
        remote.update(10.0, 5_000);
        assert!((local.get() - remote.get()).abs() < 1e-12);
    }

    #[test]
    fn non_finite_arithmetic_never_escapes() {
        assert!(headroom(f64::MAX, 0.0, 1.0, 1.0, 1.0) == 0.0);
    }
}
