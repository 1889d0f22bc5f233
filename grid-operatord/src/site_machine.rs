//! The site machine (grid-signals' `Site`: its publishers and its two stores) as the
//! operator shares it between its tasks, behind one lock: the scrape loop, the peer
//! pollers, the gossip tasks, the signals listener, the routing evidence and `/metrics`
//! all reach it through here.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use grid_signals::site::Site;
use grid_signals::store::IngestMetrics;

/// The site machine (grid-signals' [`Site`]: its publishers and its two stores), shared
/// by the scrape loop, the peer pollers, the listener and `/metrics`.
pub type SharedSignals = Arc<Mutex<Site>>;

/// Locks the shared site. Its updates are whole-batch operations that leave the stores
/// consistent even if a panic interrupted the caller, so a poisoned lock is still usable.
pub fn lock(signals: &SharedSignals) -> MutexGuard<'_, Site> {
    signals.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Ingests a body fetched from a peer ([`SiteInput::PeerBody`], a poll, or
/// [`SiteInput::PulledBody`], a gossip pull), ages relative to the answer's `Date`, and
/// counts what the store refused: the one path a polled body and a gossip pull share, so
/// both meet the same admission.
///
/// [`SiteInput::PeerBody`]: grid_signals::site::SiteInput::PeerBody
/// [`SiteInput::PulledBody`]: grid_signals::site::SiteInput::PulledBody
pub fn ingest_peer_body(
    signals: &SharedSignals,
    ingest: &IngestMetrics,
    now: u64,
    body: grid_signals::site::SiteInput<'_>,
) {
    let mut machine = lock(signals);
    machine.handle(now, body);
    while let Some(output) = machine.poll() {
        if let grid_signals::site::SiteOutput::PeerIngested { report } = output {
            ingest.record(&report);
        }
    }
}
