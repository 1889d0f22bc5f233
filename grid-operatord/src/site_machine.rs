//! The site machine (grid-signals' `Site`: its publishers and its two stores) as the
//! operator shares it between its tasks, behind one lock: the scrape loop, the peer
//! pollers, the gossip tasks, the signals listener, the routing evidence and `/metrics`
//! all reach it through here.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use grid_signals::site::{Audience, Site};
use grid_signals::store::IngestMetrics;
use tokio::sync::watch;

/// The site machine (grid-signals' [`Site`]: its publishers and its two stores), shared
/// by the scrape loop, the peer pollers, the listener and `/metrics`, and a watch of its
/// readiness generations that every change made through [`lock`] updates, which a held
/// long poll waits on.
#[derive(Clone, Debug)]
pub struct SharedSignals {
    site: Arc<Mutex<Site>>,
    readiness: Arc<watch::Sender<Generations>>,
}

/// The readiness generation of each relay the site serves
/// ([`Site::readiness_generation`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Generations {
    /// What the local gateway is served: every provider held.
    pub local: u64,
    /// What a peer is served: this site's own providers.
    pub peer: u64,
}

impl Generations {
    fn of(site: &Site) -> Self {
        Self {
            local: site.readiness_generation(Audience::Local),
            peer: site.readiness_generation(Audience::Peer),
        }
    }

    /// The generation of what `audience` is served.
    pub fn get(self, audience: Audience) -> u64 {
        match audience {
            Audience::Local => self.local,
            Audience::Peer => self.peer,
        }
    }
}

impl SharedSignals {
    /// Shares `site`.
    pub fn new(site: Site) -> Self {
        let generations = Generations::of(&site);
        Self {
            site: Arc::new(Mutex::new(site)),
            readiness: Arc::new(watch::Sender::new(generations)),
        }
    }

    /// The readiness generations, as every change through [`lock`] leaves them.
    pub fn readiness(&self) -> watch::Receiver<Generations> {
        self.readiness.subscribe()
    }
}

/// The shared site, locked; dropping it publishes the readiness generations its changes
/// left, so a held long poll wakes as the lock is released.
#[derive(Debug)]
pub struct SiteGuard<'a> {
    site: MutexGuard<'a, Site>,
    readiness: &'a watch::Sender<Generations>,
}

impl std::ops::Deref for SiteGuard<'_> {
    type Target = Site;

    fn deref(&self) -> &Site {
        &self.site
    }
}

impl std::ops::DerefMut for SiteGuard<'_> {
    fn deref_mut(&mut self) -> &mut Site {
        &mut self.site
    }
}

impl Drop for SiteGuard<'_> {
    fn drop(&mut self) {
        let now = Generations::of(&self.site);
        self.readiness.send_if_modified(|held| {
            let moved = *held != now;
            *held = now;
            moved
        });
    }
}

/// Locks the shared site. Its updates are whole-batch operations that leave the stores
/// consistent even if a panic interrupted the caller, so a poisoned lock is still usable.
pub fn lock(signals: &SharedSignals) -> SiteGuard<'_> {
    SiteGuard {
        site: signals.site.lock().unwrap_or_else(PoisonError::into_inner),
        readiness: &signals.readiness,
    }
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
