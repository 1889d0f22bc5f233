//! The gateway's only clock reads.
//!
//! The pure crates take time as a parameter; this module is the one place the daemon asks
//! the operating system for it, so a reviewer finds every clock read here.
#![allow(clippy::disallowed_methods)]

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Wall-clock milliseconds since the Unix epoch, the stamp unit of the pure crates.
///
/// A clock set before 1970 reads as 0 rather than panicking: a broken clock must not
/// take the poll loop down, and the store's skew checks then drop what it cannot place.
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The wall clock, for the `Date` field of the answers the gateway writes itself.
pub fn now_wall() -> SystemTime {
    SystemTime::now()
}

/// A monotonic instant, for deadlines and intervals that must not jump with the wall clock.
pub fn monotonic() -> Instant {
    Instant::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_clock_reads_after_2020() {
        // 2020-01-01T00:00:00Z; a machine clock before that is misconfigured.
        assert!(now_unix_ms() > 1_577_836_800_000);
    }

    #[test]
    fn monotonic_clock_never_goes_back() {
        let a = monotonic();
        let b = monotonic();
        assert!(b >= a);
    }
}
