//! The operator's only reads of the clocks.
//!
//! Everything else takes time as a parameter, so this module is the one place clippy's
//! `disallowed_methods` ban on `Instant::now` and `SystemTime::now` is lifted.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Wall-clock time as milliseconds since the Unix epoch, the stamp format the pure crates
/// take. A clock set before 1970 reads as 0 rather than panicking the daemon.
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

/// Wall-clock time as a [`SystemTime`], for the HTTP `Date` header.
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
    fn monotonic_clock_never_goes_back() {
        let a = monotonic();
        let b = monotonic();
        assert!(b >= a);
    }
}
