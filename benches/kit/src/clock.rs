//! The one place this crate reads the clock (benches, the simulator's wall timers and the
//! real-time simulated sites); the pure crates take time as a parameter instead.

use std::time::Duration;

/// Milliseconds elapsed since a fixed origin: the time axis a real-time simulated site
/// hands its model (which itself never reads a clock).
///
/// Built on tokio's clock, so a test running with paused time drives it too.
#[derive(Clone, Copy, Debug)]
pub struct ElapsedClock {
    origin: tokio::time::Instant,
}

impl ElapsedClock {
    /// A clock whose zero is now.
    #[allow(
        clippy::disallowed_methods,
        reason = "the simulated sites' one named clock read"
    )]
    pub fn start() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }

    /// Milliseconds since the origin.
    #[allow(
        clippy::disallowed_methods,
        reason = "the simulated sites' one named clock read"
    )]
    pub fn now_ms(&self) -> u64 {
        tokio::time::Instant::now()
            .duration_since(self.origin)
            .as_millis() as u64
    }

    /// The instant at `ms` on this clock's axis, for sleeping until a model deadline.
    pub fn instant_at(&self, ms: u64) -> tokio::time::Instant {
        self.origin + Duration::from_millis(ms)
    }
}

/// Nanoseconds since the Unix epoch now: the one clock two processes on one machine
/// read the same (a stamp written by one and read by the other).
#[allow(
    clippy::disallowed_methods,
    reason = "the streams benchmark's one named wall-clock read"
)]
pub fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Time since a start, on tokio's clock (so a paused-time test drives it too): what the
/// load generators and the local grid's waits measure with.
#[derive(Clone, Copy, Debug)]
pub struct Stopwatch {
    start: tokio::time::Instant,
}

impl Stopwatch {
    /// A stopwatch started now.
    #[allow(
        clippy::disallowed_methods,
        reason = "the load generators' one named clock read"
    )]
    pub fn start() -> Self {
        Self {
            start: tokio::time::Instant::now(),
        }
    }

    /// Time since the start.
    #[allow(
        clippy::disallowed_methods,
        reason = "the load generators' one named clock read"
    )]
    pub fn elapsed(&self) -> Duration {
        tokio::time::Instant::now().duration_since(self.start)
    }

    /// The start, as an instant to sleep until offsets of.
    pub fn origin(&self) -> tokio::time::Instant {
        self.start
    }
}
