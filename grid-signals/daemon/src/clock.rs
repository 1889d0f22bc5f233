//! Both daemons' only reads of the clocks.
//!
//! Everything else takes time as a parameter, so this module is the one place clippy's
//! `disallowed_methods` ban on `Instant::now` and `SystemTime::now` is lifted, and a
//! reviewer finds every clock read here.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The wall clock one daemon stamps with: the system clock plus an offset that stays 0
/// outside tests.
///
/// It exists so a host clock step can be shown on one site of a grid that runs in one
/// process (the fault suite's `clock-step` rows, and tests), without stepping the
/// machine's clock under every other process. Only wall time is offset: timeouts and pass
/// durations use [`monotonic`], which a stepped host clock does not move either.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    offset_ms: Arc<AtomicI64>,
}

impl Clock {
    /// The system clock, unstepped.
    pub fn system() -> Self {
        Self::default()
    }

    /// Wall-clock milliseconds since the Unix epoch, as [`wall_ms`], plus the steps taken.
    pub fn wall_ms(&self) -> u64 {
        let offset = self.offset_ms.load(Ordering::Relaxed);
        wall_ms().saturating_add_signed(offset)
    }

    /// Steps this clock by `delta_ms` (negative: back), as an NTP step or an operator
    /// setting the host's time would. Every clone sees the step.
    pub fn step(&self, delta_ms: i64) {
        self.offset_ms.fetch_add(delta_ms, Ordering::Relaxed);
    }
}

/// Wall-clock time as milliseconds since the Unix epoch, the stamp format the pure crates
/// take. A clock set before 1970 reads as 0 rather than panicking the daemon: a broken
/// clock must not take a loop down, and the stores' skew checks then drop what they
/// cannot place.
#[allow(clippy::disallowed_methods)]
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Monotonic time for timeouts and pass durations, which must not jump with the wall clock.
#[allow(clippy::disallowed_methods)]
pub fn monotonic() -> Instant {
    Instant::now()
}

/// Monotonic milliseconds since this process first asked, for pure code that takes a
/// monotonic `now` (the Lease observer).
pub fn monotonic_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(monotonic).elapsed().as_millis() as u64
}

/// Wall-clock time as a [`SystemTime`], for the HTTP `Date` field of answers a daemon
/// writes itself.
#[allow(clippy::disallowed_methods)]
pub fn system_time() -> SystemTime {
    SystemTime::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_clock_is_after_2020_and_agrees_with_system_time() {
        let ms = wall_ms();
        assert!(ms > 1_577_836_800_000, "wall clock {ms} is before 2020");
        let sys = system_time()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(sys >= ms && sys - ms < 60_000);
    }

    #[test]
    fn a_stepped_clock_moves_by_the_step_and_every_clone_sees_it() {
        let clock = Clock::system();
        let seen = clock.clone();
        let before = wall_ms();
        clock.step(-600_000);
        let stepped = seen.wall_ms();
        assert!(stepped + 600_000 >= before && stepped + 600_000 - before < 60_000);
        clock.step(600_000);
        assert!(seen.wall_ms() >= before);
    }

    #[test]
    fn a_clock_stepped_before_1970_reads_zero() {
        let clock = Clock::system();
        clock.step(i64::MIN);
        assert_eq!(clock.wall_ms(), 0);
    }

    #[test]
    fn monotonic_clock_never_goes_back() {
        let a = monotonic();
        let b = monotonic();
        assert!(b >= a);
    }
}
