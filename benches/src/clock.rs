//! The one place the kit reads a clock: the loopback servers live in real time, the
//! models they drive do not.

use tokio::time::Instant;

/// Milliseconds elapsed since a fixed origin: the time axis a real-time simulated site
/// hands its model.
///
/// Built on tokio's clock, so a test running with paused time drives it too.
#[derive(Clone, Copy, Debug)]
pub struct ElapsedClock {
    origin: Instant,
}

impl ElapsedClock {
    /// A clock whose zero is now.
    #[allow(clippy::disallowed_methods)]
    pub fn start() -> Self {
        Self {
            origin: Instant::now(),
        }
    }

    /// Milliseconds since the origin.
    #[allow(clippy::disallowed_methods)]
    pub fn now_ms(&self) -> u64 {
        Instant::now().duration_since(self.origin).as_millis() as u64
    }

    /// The instant at `ms` on this clock's axis, for sleeping until a model deadline.
    pub fn instant_at(&self, ms: u64) -> Instant {
        self.origin + std::time::Duration::from_millis(ms)
    }
}
