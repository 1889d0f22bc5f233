//! What one model's requests did at one candidate, counted on the request path and read
//! by the refresh.

use std::sync::atomic::{AtomicU64, Ordering};

/// What one model's requests did at one candidate: counted on the request path with
/// relaxed atomic adds (no lock, no allocation), read by the refresh into the routing
/// evidence's recent window. Cumulative; the refresher takes differences.
#[derive(Debug, Default)]
pub struct Tally {
    picks: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    retried_away: AtomicU64,
    retried_here: AtomicU64,
}

/// A [`Tally`] read at one instant, or the difference of two readings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TallyCounts {
    /// First attempts routed here.
    pub picks: u64,
    /// Answers in which the site refused before doing any work (429 full, 503).
    pub refused: u64,
    /// Serving failures: any other 5xx, a reset, a timeout, a failed connect.
    pub failed: u64,
    /// Requests this site refused that were sent to another site.
    pub retried_away: u64,
    /// Requests another site refused that were sent here.
    pub retried_here: u64,
}

impl TallyCounts {
    /// What was counted after `base` (each count saturating at 0).
    #[must_use]
    pub fn since(self, base: Self) -> Self {
        Self {
            picks: self.picks.saturating_sub(base.picks),
            refused: self.refused.saturating_sub(base.refused),
            failed: self.failed.saturating_sub(base.failed),
            retried_away: self.retried_away.saturating_sub(base.retried_away),
            retried_here: self.retried_here.saturating_sub(base.retried_here),
        }
    }
}

impl Tally {
    /// A request of the model was routed here first.
    pub fn picked(&self) {
        self.picks.fetch_add(1, Ordering::Relaxed);
    }

    /// The site refused a request before doing any work (a 429 or a 503).
    pub fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// An exchange with the site failed (another 5xx, a reset, a timeout, a connect).
    pub fn failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// A request the site refused was sent to another site.
    pub fn retried_away(&self) {
        self.retried_away.fetch_add(1, Ordering::Relaxed);
    }

    /// A request another site refused was sent here.
    pub fn retried_here(&self) {
        self.retried_here.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn counts(&self) -> TallyCounts {
        TallyCounts {
            picks: self.picks.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            retried_away: self.retried_away.load(Ordering::Relaxed),
            retried_here: self.retried_here.load(Ordering::Relaxed),
        }
    }
}
