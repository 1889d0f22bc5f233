//! Capacity bounds: what a site has shown it can hold, and where it has shown a limit.
//!
//! The soft bound is the most in-flight the site held with nothing queued; the hard bound
//! is the least it held in service (in-flight less what waits in queues or flow control)
//! at a demonstrated limit. Capacity, what the site has shown, is the lesser, never below
//! [`CAPACITY_FLOOR`]; reach, what selection reads it at, counts the soft bound with
//! [`SOFT_BOUND_HEADROOM`] so a site that never showed a limit is explored. Both bounds
//! lose their evidence with a half-life ([`BOUND_HALF_LIFE_MS`]) so a site that was
//! resized is relearned rather than trusted forever at its old size. Only readings of a
//! serving site move a bound (the learner's rule).

/// The least capacity any candidate is read at, in requests.
///
/// One request is the least a ready engine serves without queueing, so reading capacity
/// below one would call a site holding a single request over-full. It also keeps
/// `in_flight / capacity` finite for a site only ever seen idle (a soft bound of 0). It is
/// deliberately not larger: a larger floor would let an unproven site look emptier than
/// the sites that have shown their size, and herd traffic onto it.
pub const CAPACITY_FLOOR: f64 = 1.0;

/// How far past its soft bound a site that has never shown a limit is read to reach.
///
/// The soft bound only proves the site held that many without queueing; read as capacity
/// itself, every site would read rho 1 (no room) at its busiest calm moment, and a site
/// holding a steady load that never queues would read full forever. Doubling it leaves a
/// never-limited site room to be offered more, so it is explored; once it shows a limit,
/// the hard bound (read as is) takes over.
pub const SOFT_BOUND_HEADROOM: f64 = 2.0;

/// How long a bound keeps half of its evidence, in milliseconds (5 minutes).
///
/// Long against the 1 s local and 5 s peer poll, so a bound is confirmed by dozens of
/// samples before it fades and one quiet spell does not erase it; short against how often
/// a deployment is resized, so a site that grew or shrank is relearned within minutes.
pub const BOUND_HALF_LIFE_MS: u64 = 300_000;

/// Past this many half-lives a hard bound has relaxed by 2^64 and carries no information;
/// capping the exponent keeps the arithmetic finite.
const MAX_HALF_LIVES: f64 = 64.0;

#[derive(Clone, Copy, Debug, PartialEq)]
struct Bound {
    value: f64,
    at_ms: u64,
}

impl Bound {
    /// A held bound as of `now_ms`: its excess over the floor halves every half-life.
    fn faded(self, now_ms: u64) -> f64 {
        CAPACITY_FLOOR + (self.value - CAPACITY_FLOOR) * (-self.half_lives(now_ms)).exp2()
    }

    fn half_lives(self, now_ms: u64) -> f64 {
        (now_ms.saturating_sub(self.at_ms) as f64 / BOUND_HALF_LIFE_MS as f64).min(MAX_HALF_LIVES)
    }
}

/// The learned bounds of one candidate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Bounds {
    soft: Option<Bound>,
    hard: Option<Bound>,
    /// The most it held in service at a limit, faded as the soft bound is: evidence of
    /// what it holds that a long saturation, which shows no calm moment, keeps showing.
    served: Option<Bound>,
}

impl Bounds {
    /// The soft bound as of `now_ms`: its excess over the floor halves every half-life,
    /// so an unconfirmed "it held this much" fades towards "unknown".
    pub(crate) fn soft(&self, now_ms: u64) -> Option<f64> {
        self.soft.map(|b| b.faded(now_ms))
    }

    /// The hard bound as of `now_ms`: it doubles every half-life, so a limit that is not
    /// shown again stops capping a site that has since grown.
    pub(crate) fn hard(&self, now_ms: u64) -> Option<f64> {
        self.hard.map(|b| b.value * b.half_lives(now_ms).exp2())
    }

    /// What the site has shown it holds: the lesser of the two bounds as they stand,
    /// never below [`CAPACITY_FLOOR`]; the floor when nothing is known. This is what
    /// metrics and status pages call capacity: a 16-slot site reads at most 16.
    pub(crate) fn capacity(&self, now_ms: u64) -> f64 {
        self.lesser(now_ms, 1.0)
    }

    /// What selection reads the site at: as [`Bounds::capacity`] but with the soft bound
    /// counted with [`SOFT_BOUND_HEADROOM`], so a site that never showed a limit is
    /// offered more than it has held and its size is explored.
    pub(crate) fn reach(&self, now_ms: u64) -> f64 {
        self.lesser(now_ms, SOFT_BOUND_HEADROOM)
    }

    /// What the site has shown it holds, calm or at a limit: the capacity the gateway
    /// reports (`/metrics`, the demo). Unlike [`Bounds::capacity`], which selection
    /// reads and which counts only calm holds in the soft bound, it does not fade while
    /// the site stays queued and serves as much as before. Selection keeps the cautious
    /// figure: a site back from a long saturation is offered its size again as it shows
    /// it calm.
    pub(crate) fn shown(&self, now_ms: u64) -> f64 {
        let faded = |b: Bound| b.faded(now_ms);
        let held = match (self.soft.map(faded), self.served.map(faded)) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.capped(held, now_ms)
    }

    fn lesser(&self, now_ms: u64, headroom: f64) -> f64 {
        self.capped(self.soft(now_ms).map(|s| s * headroom), now_ms)
    }

    /// What the site holds as `held` says, capped by the hard bound; never below
    /// [`CAPACITY_FLOOR`], and the floor when neither is known.
    fn capped(&self, held: Option<f64>, now_ms: u64) -> f64 {
        let lesser = held
            .unwrap_or(f64::INFINITY)
            .min(self.hard(now_ms).unwrap_or(f64::INFINITY));
        if lesser.is_finite() {
            lesser.max(CAPACITY_FLOOR)
        } else {
            CAPACITY_FLOOR
        }
    }

    /// Records `in_flight` held with nothing queued.
    pub(crate) fn held_unqueued(&mut self, in_flight: f64, now_ms: u64) {
        if self.soft(now_ms).is_none_or(|s| in_flight >= s) {
            self.soft = Some(Bound {
                value: in_flight.max(CAPACITY_FLOOR),
                at_ms: now_ms,
            });
        }
    }

    /// Records `in_flight` held in service at a demonstrated limit: the hard bound, and
    /// the served bound (never lowered) that [`Bounds::shown`] reads.
    pub(crate) fn held_at_limit(&mut self, in_flight: f64, now_ms: u64) {
        let value = in_flight.max(CAPACITY_FLOOR);
        if self.hard(now_ms).is_none_or(|h| in_flight <= h) {
            self.hard = Some(Bound {
                value,
                at_ms: now_ms,
            });
        }
        if self.served.is_none_or(|b| in_flight >= b.faded(now_ms)) {
            self.served = Some(Bound {
                value,
                at_ms: now_ms,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn unknown_site_reads_at_the_floor() {
        assert!(close(Bounds::default().capacity(0), CAPACITY_FLOOR));
    }

    #[test]
    fn idle_site_reads_at_the_floor_not_zero() {
        let mut b = Bounds::default();
        b.held_unqueued(0.0, 0);
        assert!(close(b.reach(0), CAPACITY_FLOOR * SOFT_BOUND_HEADROOM));
        assert!(close(b.capacity(0), CAPACITY_FLOOR));
        b.held_at_limit(0.0, 0);
        assert!(close(b.reach(0), CAPACITY_FLOOR));
    }

    #[test]
    fn capacity_is_the_lesser_bound_with_soft_headroom() {
        let mut b = Bounds::default();
        b.held_unqueued(40.0, 0);
        assert!(close(b.reach(0), 40.0 * SOFT_BOUND_HEADROOM));
        assert!(close(b.capacity(0), 40.0), "shown without headroom");
        b.held_at_limit(30.0, 0);
        assert!(close(b.reach(0), 30.0) && close(b.capacity(0), 30.0));
        b.held_at_limit(35.0, 0); // not less: the least limit stands
        assert!(close(b.reach(0), 30.0));
        b.held_unqueued(20.0, 0); // not more: the most unqueued stands
        assert!(close(b.soft(0).unwrap(), 40.0));
    }

    #[test]
    fn soft_bound_loses_half_its_excess_over_the_floor_per_half_life() {
        let mut b = Bounds::default();
        b.held_unqueued(41.0, 0);
        assert!(close(b.soft(BOUND_HALF_LIFE_MS).unwrap(), 21.0));
        assert!(close(b.soft(2 * BOUND_HALF_LIFE_MS).unwrap(), 11.0));
    }

    #[test]
    fn hard_bound_doubles_per_half_life_so_a_grown_site_is_relearned() {
        let mut b = Bounds::default();
        b.held_unqueued(100.0, 0);
        b.held_at_limit(10.0, 0);
        assert!(close(b.reach(0), 10.0));
        assert!(close(b.hard(BOUND_HALF_LIFE_MS).unwrap(), 20.0));
        // Soft decays too, but far more slowly towards the floor than hard relaxes.
        let later = 3 * BOUND_HALF_LIFE_MS;
        assert!(close(
            b.reach(later),
            80.0_f64.min((1.0 + 99.0 / 8.0) * SOFT_BOUND_HEADROOM)
        ));
    }

    #[test]
    fn a_limit_held_again_keeps_the_shown_capacity_while_selection_reads_calm_holds_only() {
        let mut b = Bounds::default();
        b.held_unqueued(16.0, 0);
        let later = 2 * BOUND_HALF_LIFE_MS;
        b.held_at_limit(16.0, later);
        assert!(
            close(b.shown(later), 16.0),
            "shown at what it holds in service"
        );
        assert!(
            close(b.capacity(later), 1.0 + 15.0 / 4.0),
            "selection's figure fades"
        );
        b.held_at_limit(10.0, later);
        assert!(
            close(b.shown(later), 10.0),
            "the least limit caps what is shown"
        );
        let mut calm = Bounds::default();
        calm.held_unqueued(8.0, 0);
        assert!(
            close(calm.shown(0), calm.capacity(0)),
            "without a limit the two agree"
        );
        assert!(close(Bounds::default().shown(0), CAPACITY_FLOOR));
    }

    #[test]
    fn ancient_bounds_stay_finite_and_fall_back_towards_the_floor() {
        let mut b = Bounds::default();
        b.held_unqueued(50.0, 0);
        b.held_at_limit(5.0, 0);
        for c in [b.capacity(u64::MAX), b.reach(u64::MAX)] {
            assert!(c.is_finite() && c >= CAPACITY_FLOOR);
        }
    }

    #[test]
    fn a_stamp_before_the_bound_does_not_inflate_it() {
        let mut b = Bounds::default();
        b.held_unqueued(9.0, 1_000);
        assert!(close(b.soft(0).unwrap(), 9.0));
    }
}
