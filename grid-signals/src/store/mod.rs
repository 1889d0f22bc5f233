//! The load store: bounded windows of recent readings per site and provider.
//!
//! Poll and route meet here and only here. Bodies from peers (or the local operator's
//! relay) are parsed, grouped into batches, admitted against each provider's fence and
//! stored; the ordering step (grid-score) reads the result off the request path.
//!
//! # I/O boundary
//!
//! Pure. Every call that depends on time takes `now_ms`, the receiver's wall clock in
//! milliseconds since the Unix epoch; ingest also takes `reference_ms`, the body's
//! reference time (its HTTP `Date`, same unit). Stamps are stored in the receiver's clock:
//! a row stamped `t` in a body dated `d` is stored at `t + (now_ms - d)`, so its age
//! relative to the body survives clock offsets between hosts.
//!
//! # Writing
//!
//! - [`Store::ingest`] takes a body, the sender's verified identity ([`Sender`]), its
//!   reference time and `now_ms`; it never fails as a whole: every refused line is counted
//!   in the returned [`IngestReport`] under a [`DropReason`].
//! - [`Store::ingest_batch`] takes one already-decoded [`crate::batch::Batch`] (the operator's own
//!   publications take this path).
//! - [`Store::expire`] drops readings older than the TTL and entries idle past
//!   [`FENCE_RETENTION_MS`]; `ingest` calls it first.
//!
//! # Reading (the ordering step's API)
//!
//! - [`Store::entries`] iterates every [`Entry`] (sorted by site, then provider);
//!   [`Store::entry`] finds one.
//! - Per entry: [`Entry::learning`] (may learning use it now, or why not),
//!   [`Entry::revision`], [`Entry::fence`], [`Entry::latest`] (newest reading of a series,
//!   with an exact label filter for per-endpoint series), [`Entry::series`],
//!   [`Entry::published`] (the reading the newest publication carries, as the relay
//!   would), [`Entry::newest_at`], [`Entry::metric_newest_at`] and
//!   [`Entry::window_worst`] (highest value within a window, clamped to the TTL).
//! - [`Store::poll_event`] drains [`StoreEvent`]s: one `Reset` per learning lifetime start
//!   (revision change, or first complete batch after a zero-sample one), `Expired` when an
//!   entry is forgotten, `Resync` if the queue overflowed.
//!
//! # Relay and persistence
//!
//! [`Store::encode_relay`] writes what the store holds back as exposition, whole batches
//! only, within a byte and line budget. [`Store::export_fences`] and
//! [`Store::import_fences`] carry the fences across restarts.

mod caps;
mod decode;
mod drop;
mod entry;
mod event;
mod fences;
#[cfg(test)]
mod fixture;
mod ingest;
mod learning;
mod metrics;
mod publication;
mod readiness;
mod relay;
mod signed;
mod window;

use std::collections::BTreeMap;

pub use caps::{
    DEFAULT_TTL_MS, FENCE_RETENTION_MS, MAX_FUTURE_STAMP_MS, MAX_HELD_BATCH_BYTES,
    MAX_METRICS_PER_PROVIDER, MAX_PENDING_EVENTS, MAX_PROVIDERS, MAX_PROVIDERS_PER_SITE,
    MAX_SAMPLE_AGE_MS, MAX_SAMPLES_PER_SERIES, MAX_SERIES_PER_PROVIDER,
};
pub use decode::decode_batches;
pub use drop::{DropCounts, DropReason};
pub use entry::{Entry, SeriesView};
pub use event::StoreEvent;
pub use fences::FenceImport;
pub use ingest::{IngestReport, Sender};
pub use learning::{Learning, PauseReason};
pub use metrics::IngestMetrics;
pub use readiness::ReadinessMark;
pub use relay::{DEFAULT_RELAY_MAX_LINES, RelayBudget, RelayReport};
pub use window::Reading;

use event::EventQueue;

/// How a store is tuned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// Signal TTL in milliseconds: readings older than this expire and metadata older
    /// than this is stale.
    pub ttl_ms: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            ttl_ms: DEFAULT_TTL_MS,
        }
    }
}

/// Every provider's recent readings, fences and learning state.
#[derive(Clone, Debug, Default)]
pub struct Store {
    config: StoreConfig,
    sites: BTreeMap<String, BTreeMap<String, Entry>>,
    providers: usize,
    events: EventQueue,
    /// Moves whenever the [`ReadinessMark`] of a provider's newest publication changes.
    readiness_generation: u64,
}

impl Store {
    /// An empty store.
    pub fn new(config: StoreConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// How the store is tuned.
    pub fn config(&self) -> StoreConfig {
        self.config
    }

    /// Every entry, sorted by site then provider.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.sites.values().flat_map(BTreeMap::values)
    }

    /// The entry of one provider.
    pub fn entry(&self, site: &str, provider: &str) -> Option<&Entry> {
        self.sites.get(site)?.get(provider)
    }

    /// How many (site, provider) entries are held.
    pub fn len(&self) -> usize {
        self.providers
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.providers == 0
    }

    /// A counter that moves (by one, wrapping) each time a complete publication changes
    /// what its provider's readiness reads ([`ReadinessMark`]): a new provider, a verdict,
    /// a ready-endpoint count crossing zero, per-unit series appearing or stopping. Load
    /// alone never moves it. A long poll ([`crate::long_poll`]) is answered when it moved.
    pub fn readiness_generation(&self) -> u64 {
        self.readiness_generation
    }

    /// The next pending event, oldest first.
    pub fn poll_event(&mut self) -> Option<StoreEvent> {
        self.events.pop()
    }

    /// Drops readings older than the TTL at `now_ms`, then forgets entries that hold no
    /// readings and saw no batch for [`FENCE_RETENTION_MS`] (raising
    /// [`StoreEvent::Expired`]).
    pub fn expire(&mut self, now_ms: u64) {
        let events = &mut self.events;
        let mut removed = 0;
        self.sites.retain(|_, providers| {
            providers.retain(|_, entry| {
                entry.expire(now_ms);
                let keep = !entry.holds_no_readings()
                    || entry.touched_ms.saturating_add(FENCE_RETENTION_MS) >= now_ms;
                if !keep {
                    removed += 1;
                    events.push(StoreEvent::Expired {
                        site: entry.site().to_owned(),
                        provider: entry.provider().to_owned(),
                    });
                }
                keep
            });
            !providers.is_empty()
        });
        self.providers -= removed;
    }

    /// The entry for (site, provider), created within the caps.
    fn entry_mut_or_create(
        &mut self,
        site: &str,
        provider: &str,
        now_ms: u64,
    ) -> Option<&mut Entry> {
        let ttl_ms = self.config.ttl_ms;
        let known = self
            .sites
            .get(site)
            .is_some_and(|providers| providers.contains_key(provider));
        if !known {
            let site_len = self.sites.get(site).map_or(0, BTreeMap::len);
            if self.providers >= MAX_PROVIDERS || site_len >= MAX_PROVIDERS_PER_SITE {
                return None;
            }
            self.providers += 1;
            self.sites.entry(site.to_owned()).or_default().insert(
                provider.to_owned(),
                Entry::new(site.to_owned(), provider.to_owned(), ttl_ms, now_ms),
            );
        }
        self.sites.get_mut(site)?.get_mut(provider)
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::{T0, admit, batch, store};
    use super::*;
    use crate::batch::Fence;

    #[test]
    fn readings_exactly_one_ttl_old_are_kept_and_older_ones_expire() {
        let mut s = store();
        admit(
            &mut s,
            batch("b", "m", Fence::new(T0, 1), &[("q", 1.0)], T0),
            T0,
        );
        s.expire(T0 + DEFAULT_TTL_MS);
        assert!(s.entry("b", "m").unwrap().latest("q", &[]).is_some());
        s.expire(T0 + DEFAULT_TTL_MS + 1);
        let e = s.entry("b", "m").unwrap();
        assert!(e.latest("q", &[]).is_none());
        assert_eq!(e.series_count(), 0);
        // The fence outlives the readings.
        assert_eq!(e.fence(), Some(Fence::new(T0, 1)));
    }

    #[test]
    fn an_idle_entry_is_forgotten_one_ms_after_fence_retention_with_one_expired_event() {
        let mut s = store();
        admit(
            &mut s,
            batch("b", "m", Fence::new(T0, 1), &[("q", 1.0)], T0),
            T0,
        );
        assert!(matches!(s.poll_event(), Some(StoreEvent::Reset { .. })));
        s.expire(T0 + FENCE_RETENTION_MS);
        assert_eq!(s.len(), 1);
        assert_eq!(s.poll_event(), None);
        s.expire(T0 + FENCE_RETENTION_MS + 1);
        assert!(s.is_empty());
        assert_eq!(
            s.poll_event(),
            Some(StoreEvent::Expired {
                site: "b".into(),
                provider: "m".into()
            })
        );
        assert_eq!(s.poll_event(), None);
    }

    #[test]
    fn a_published_series_is_there_while_the_newest_publication_carries_it_and_gone_after() {
        let mut s = store();
        admit(
            &mut s,
            batch("b", "m", Fence::new(T0, 1), &[("q", 1.0), ("r", 2.0)], T0),
            T0,
        );
        let e = s.entry("b", "m").unwrap();
        assert_eq!(e.published("q", &[], T0).map(|r| r.value), Some(1.0));
        assert_eq!(
            e.published("q", &[("k", "v")], T0),
            None,
            "labels must match"
        );
        // The next publication no longer carries q: gone at once, though the window
        // still holds the older reading until the TTL.
        admit(
            &mut s,
            batch("b", "m", Fence::new(T0, 2), &[("r", 3.0)], T0 + 1_000),
            T0 + 1_000,
        );
        let e = s.entry("b", "m").unwrap();
        assert_eq!(e.published("q", &[], T0 + 1_000), None);
        assert!(e.latest("q", &[]).is_some());
        assert_eq!(
            e.published("r", &[], T0 + 1_000).map(|r| r.value),
            Some(3.0)
        );
        // Exactly one TTL old it is still published; one millisecond more and it is not.
        let at = T0 + 1_000 + DEFAULT_TTL_MS;
        assert!(e.published("r", &[], at).is_some());
        assert_eq!(e.published("r", &[], at + 1), None);
    }

    #[test]
    fn the_readiness_generation_moves_when_readiness_changes_and_never_on_load_or_repeats() {
        let mut s = store();
        let mut seq = 0;
        let mut send = |s: &mut Store, site: &str, rows: &[(&str, f64)]| {
            seq += 1;
            let at = T0 + seq * 1_000;
            admit(s, batch(site, "m", Fence::new(T0, seq), rows, at), at);
            s.readiness_generation()
        };
        let ready = [("llm_d_epp_ready_endpoints", 2.0), ("q", 1.0)];
        let g0 = s.readiness_generation();
        let g1 = send(&mut s, "b", &ready);
        assert_eq!(g1, g0 + 1, "a new provider");
        let g2 = send(
            &mut s,
            "b",
            &[("llm_d_epp_ready_endpoints", 5.0), ("q", 30.0)],
        );
        assert_eq!(g2, g1, "load alone");
        let g3 = send(&mut s, "b", &[("llm_d_epp_ready_endpoints", 0.0)]);
        assert_eq!(g3, g2 + 1, "zero ready endpoints");
        let g4 = send(&mut s, "b", &ready);
        assert_eq!(g4, g3 + 1, "back");
        let g5 = send(&mut s, "b", &[("grid_provider_ready", 0.0)]);
        assert_eq!(g5, g4 + 1, "the verdict");
        // An exact repeat, a delayed batch and an incomplete one change nothing.
        let repeat = batch(
            "b",
            "m",
            Fence::new(T0, 5),
            &[("grid_provider_ready", 0.0)],
            T0,
        );
        admit(&mut s, repeat, T0 + 9_000);
        admit(
            &mut s,
            batch("b", "m", Fence::new(T0, 1), &ready, T0 + 9_000),
            T0 + 9_000,
        );
        assert_eq!(s.readiness_generation(), g5);
    }

    #[test]
    fn a_custom_ttl_is_honoured() {
        let mut s = Store::new(StoreConfig { ttl_ms: 5_000 });
        admit(
            &mut s,
            batch("b", "m", Fence::new(T0, 1), &[("q", 1.0)], T0),
            T0,
        );
        s.expire(T0 + 5_001);
        assert!(s.entry("b", "m").unwrap().latest("q", &[]).is_none());
    }

    #[test]
    fn entries_iterate_sorted_by_site_then_provider() {
        let mut s = store();
        for (site, provider) in [("c", "a"), ("a", "z"), ("a", "b")] {
            admit(
                &mut s,
                batch(site, provider, Fence::new(T0, 1), &[("q", 1.0)], T0),
                T0,
            );
        }
        let keys: Vec<(&str, &str)> = s.entries().map(|e| (e.site(), e.provider())).collect();
        assert_eq!(keys, [("a", "b"), ("a", "z"), ("c", "a")]);
    }
}
