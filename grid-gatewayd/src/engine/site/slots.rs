//! The per-site cap on requests in flight upstream (`maxConnectionsPerSite`).
//!
//! The pool keeps a bounded number of idle connections per site, but nothing bounded the
//! active ones: a burst toward one site opened one HTTP/1.1 connection per request in
//! flight. Each request now holds one of its site's slots from before it is sent until
//! its answer's last byte (or its failure), so over HTTP/1.1 the cap is a cap on the
//! site's connections; over HTTP/2 it caps streams, and connections are fewer still.
//!
//! A request that finds every slot taken waits at most the connect bound (the time it
//! would have waited for a connection), then fails as a failed connect does: nothing was
//! sent, so it is retried once on another site. A full site is this gateway's own
//! congestion, not the site's failure, so routing does not record it as one.
//!
//! The slots are made at start, one semaphore per configured site, in a map never
//! written again: a request reads it without a lock. A model reload builds the next map
//! ([`SiteSlots::carrying_over`]): a kept site keeps its semaphore, so requests in flight
//! across the reload still count against it; a site the reload adds gets its own cap at
//! once.
//!
//! # No client takes a site alone
//!
//! One HTTP/2 connection carries many requests at once, so one client could hold every
//! slot of a site and leave the site's other clients failing over. A connection holds at
//! most a [`SITE_SHARE_DIVISOR`]th of each site's slots ([`ConnectionShare`]); a request
//! past its connection's share is refused (429 `connection_share`) before it takes a slot.
//! An HTTP/1.1 connection carries one request at a time, so it never reaches its share.
//!
//! `grid_gateway_site_slots_in_use{site}` is read from the semaphores at each scrape
//! ([`SlotsInUse`]): nothing is counted per request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::HeaderValue;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::engine::site::pool::SitePool;
use grid_gateway::headers::site_value;

/// One client connection holds at most this share (one in this many) of a site's slots,
/// and at least one: with the default 1,024 slots, 128, which is also what an HTTP/2
/// connection may carry at once (`limits::HTTP2_MAX_CONCURRENT_STREAMS`). Eight clients
/// that each push as hard as they can still leave a site serving.
pub const SITE_SHARE_DIVISOR: usize = 8;

/// How many of a site with `cap` slots one connection may hold.
pub fn site_share(cap: usize) -> usize {
    (cap / SITE_SHARE_DIVISOR).max(1)
}

/// One site's slots, its idle connections in the clear and its `x-grid-site` value,
/// found by one lookup.
#[derive(Debug, Clone)]
struct Site {
    slots: Arc<Semaphore>,
    /// The slots it was made with: `slots` holds those not taken.
    cap: usize,
    pool: Arc<SitePool>,
    header: Option<HeaderValue>,
}

impl Site {
    fn new(name: &str, per_site: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(per_site)),
            cap: per_site,
            pool: Arc::default(),
            header: site_value(name),
        }
    }
}

/// What one client connection holds of each site's slots (HTTP/2 only: an HTTP/1.1
/// connection carries one request at a time). Its streams all run on the connection's
/// task, so the lock is never contended.
#[derive(Debug, Default)]
pub(crate) struct ConnectionShare {
    held: Mutex<Vec<(Arc<str>, usize)>>,
}

impl ConnectionShare {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Arc<str>, usize)>> {
        // Every update leaves the list valid: a panic elsewhere cannot corrupt it.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One more of `site`'s slots for this connection, unless it holds `share` already.
    fn take(self: &Arc<Self>, site: &Arc<str>, share: usize) -> Option<ShareHeld> {
        let mut held = self.lock();
        match held.iter_mut().find(|(s, _)| s == site) {
            Some((_, n)) if *n >= share => return None,
            Some((_, n)) => *n += 1,
            None => held.push((Arc::clone(site), 1)),
        }
        Some(ShareHeld {
            share: Arc::clone(self),
            site: Arc::clone(site),
        })
    }
}

/// One slot of a site counted against a connection's share until dropped.
#[derive(Debug)]
pub(crate) struct ShareHeld {
    share: Arc<ConnectionShare>,
    site: Arc<str>,
}

impl Drop for ShareHeld {
    fn drop(&mut self) {
        let mut held = self.share.lock();
        if let Some(i) = held.iter().position(|(s, _)| *s == self.site) {
            held[i].1 -= 1;
            if held[i].1 == 0 {
                held.swap_remove(i);
            }
        }
    }
}

/// What an answer holds of its site until it ends (or is cut): the slot, its place in
/// its connection's share, and its count among the requests this gateway has at the site
/// (what the routing adds to the site's polled load until the next reading).
#[derive(Debug)]
pub(crate) struct Held {
    _permit: Option<OwnedSemaphorePermit>,
    _share: Option<ShareHeld>,
    _in_flight: Option<grid_score::live::InFlight>,
}

/// Every configured site's slots.
#[derive(Debug)]
pub(crate) struct SiteSlots {
    /// Hashed with [`grid_score::FastBuild`]: looked up once per request.
    sites: HashMap<Arc<str>, Site, grid_score::FastBuild>,
}

/// What a request holds toward its site: one of its slots (none for a site that is not
/// configured), its pool of connections in the clear and the answer's `x-grid-site`.
#[derive(Debug)]
pub(crate) struct Slot {
    /// Held until the answer ends (or is cut).
    pub(crate) permit: Option<OwnedSemaphorePermit>,
    /// The slot's place in its connection's share (HTTP/2), held as long.
    pub(crate) share: Option<ShareHeld>,
    /// The site's pool (none for a site that is not configured).
    pub(crate) pool: Option<Arc<SitePool>>,
    /// The site's name as a header value, made once per site rather than validated and
    /// copied per answer (none for a name that cannot be one).
    pub(crate) header: Option<HeaderValue>,
}

impl Slot {
    /// What the answer holds until it ends.
    pub(crate) fn held(
        permit: Option<OwnedSemaphorePermit>,
        share: Option<ShareHeld>,
        in_flight: Option<grid_score::live::InFlight>,
    ) -> Held {
        Held {
            _permit: permit,
            _share: share,
            _in_flight: in_flight,
        }
    }
}

/// Why no slot was taken.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NoSlot {
    /// Every slot stayed taken for the whole wait.
    SiteFull,
    /// The request's connection already holds its share of the site's slots.
    ShareUsed,
}

impl SiteSlots {
    /// `per_site` slots for each of `sites`.
    pub(crate) fn new<'a>(sites: impl IntoIterator<Item = &'a str>, per_site: usize) -> Self {
        let per_site = per_site.min(Semaphore::MAX_PERMITS);
        Self {
            sites: sites
                .into_iter()
                .map(|s| (Arc::from(s), Site::new(s, per_site)))
                .collect(),
        }
    }

    /// The slots after a reload to `sites`: each site `previous` also has keeps its
    /// semaphore (and so its cap and the slots taken now); new sites get `per_site`.
    pub(crate) fn carrying_over<'a>(
        sites: impl IntoIterator<Item = &'a str>,
        per_site: usize,
        previous: &SiteSlots,
    ) -> Self {
        let per_site = per_site.min(Semaphore::MAX_PERMITS);
        Self {
            sites: sites
                .into_iter()
                .map(|s| {
                    let kept = previous.sites.get(s).cloned();
                    (Arc::from(s), kept.unwrap_or_else(|| Site::new(s, per_site)))
                })
                .collect(),
        }
    }

    /// One of `site`'s slots, waiting at most `wait`, with its pool; counted against
    /// `share` (the request's connection's, HTTP/2) first. A site that is not configured
    /// (none is routed to) has no cap and no pool.
    pub(crate) async fn acquire(
        &self,
        site: &str,
        wait: Duration,
        share: Option<&Arc<ConnectionShare>>,
    ) -> Result<Slot, NoSlot> {
        let Some((name, entry)) = self.sites.get_key_value(site) else {
            return Ok(Slot {
                permit: None,
                share: None,
                pool: None,
                header: site_value(site),
            });
        };
        let share = match share {
            Some(s) => Some(
                s.take(name, site_share(entry.cap))
                    .ok_or(NoSlot::ShareUsed)?,
            ),
            None => None,
        };
        let pool = Some(Arc::clone(&entry.pool));
        let header = entry.header.clone();
        if let Ok(permit) = Arc::clone(&entry.slots).try_acquire_owned() {
            return Ok(Slot {
                permit: Some(permit),
                share,
                pool,
                header,
            });
        }
        match tokio::time::timeout(wait, Arc::clone(&entry.slots).acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Slot {
                permit: Some(permit),
                share,
                pool,
                header,
            }),
            // The semaphore is never closed; a timeout is the only real outcome here.
            Ok(Err(_)) | Err(_) => Err(NoSlot::SiteFull),
        }
    }

    /// Each configured site's slots taken now.
    fn in_use(&self) -> impl Iterator<Item = (&str, usize)> {
        self.sites.iter().map(|(name, site)| {
            let free = site.slots.available_permits();
            (&**name, site.cap.saturating_sub(free))
        })
    }
}

/// `grid_gateway_site_slots_in_use{site}`, read from the current slots at each scrape.
#[derive(Debug)]
pub(crate) struct SlotsInUse(pub(crate) Arc<ArcSwap<SiteSlots>>);

impl Collector for SlotsInUse {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let slots = self.0.load();
        let mut family = encoder.encode_descriptor(
            "grid_gateway_site_slots_in_use",
            "Requests in flight to each site, each holding one of its maxConnectionsPerSite slots",
            None,
            MetricType::Gauge,
        )?;
        for (site, n) in slots.in_use() {
            ConstGauge::new(n as i64).encode(family.encode_family(&[("site", site)])?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_past_the_cap_waits_its_bound_and_takes_a_slot_freed_in_time() {
        let slots = SiteSlots::new(["a", "b"], 2);
        let wait = Duration::from_millis(50);
        let first = slots.acquire("a", wait, None).await.unwrap();
        let _second = slots.acquire("a", wait, None).await.unwrap();
        assert!(
            slots.acquire("a", wait, None).await.is_err(),
            "the third is over the cap"
        );
        // Another site has its own slots, and an unconfigured one none.
        assert!(
            slots
                .acquire("b", wait, None)
                .await
                .unwrap()
                .permit
                .is_some()
        );
        assert!(
            slots
                .acquire("z", wait, None)
                .await
                .unwrap()
                .permit
                .is_none()
        );
        let waiting = slots.acquire("a", Duration::from_secs(5), None);
        drop(first);
        assert!(
            waiting.await.unwrap().permit.is_some(),
            "a freed slot is taken"
        );
    }

    #[tokio::test]
    async fn a_slot_carries_its_sites_name_as_a_header_value_made_once_per_site() {
        let wait = Duration::from_millis(20);
        let slots = SiteSlots::new(["site-a"], 2);
        let first = slots.acquire("site-a", wait, None).await.unwrap();
        let second = slots.acquire("site-a", wait, None).await.unwrap();
        let (first, second) = (first.header.unwrap(), second.header.unwrap());
        assert_eq!(first, "site-a");
        assert_eq!(
            first.as_bytes().as_ptr(),
            second.as_bytes().as_ptr(),
            "both answers share the one value, not a copy each"
        );
        let unconfigured = slots.acquire("other", wait, None).await.unwrap();
        assert_eq!(unconfigured.header.unwrap(), "other");
        assert!(site_value("bad\nname").is_none());
    }

    #[tokio::test]
    async fn a_reload_keeps_the_slots_taken_on_a_kept_site_and_caps_a_site_it_adds() {
        let wait = Duration::from_millis(20);
        let before = SiteSlots::new(["a"], 1);
        let held = before.acquire("a", wait, None).await.unwrap();
        let after = SiteSlots::carrying_over(["a", "c"], 1, &before);
        assert!(
            Arc::ptr_eq(&before.sites["a"].pool, &after.sites["a"].pool),
            "a kept site keeps its idle connections"
        );
        assert!(
            after.acquire("a", wait, None).await.is_err(),
            "the request in flight across the reload still holds a's one slot"
        );
        drop(held);
        assert!(
            after
                .acquire("a", wait, None)
                .await
                .unwrap()
                .permit
                .is_some()
        );
        let _c = after.acquire("c", wait, None).await.unwrap();
        assert!(
            after.acquire("c", wait, None).await.is_err(),
            "the added site is capped from the reload on, not uncapped until a restart"
        );
    }

    #[test]
    fn a_connection_may_hold_an_eighth_of_a_sites_slots_and_at_least_one() {
        assert_eq!(site_share(1024), 128);
        assert_eq!(
            site_share(SITE_SHARE_DIVISOR * 2 + SITE_SHARE_DIVISOR - 1),
            2
        );
        assert_eq!(site_share(SITE_SHARE_DIVISOR), 1);
        assert_eq!(site_share(SITE_SHARE_DIVISOR - 1), 1, "never none");
        assert_eq!(site_share(1), 1);
    }

    #[tokio::test]
    async fn a_connection_past_its_share_of_a_site_is_refused_and_may_take_a_slot_once_one_ends() {
        let wait = Duration::from_millis(20);
        // Two slots each for this connection at 16 per site.
        let slots = SiteSlots::new(["a", "b"], 16);
        let conn = Arc::new(ConnectionShare::default());
        let first = slots.acquire("a", wait, Some(&conn)).await.unwrap();
        let _second = slots.acquire("a", wait, Some(&conn)).await.unwrap();
        assert_eq!(
            slots.acquire("a", wait, Some(&conn)).await.unwrap_err(),
            NoSlot::ShareUsed,
            "the third is past the share"
        );
        // Other connections, other sites and requests without a share are not held back.
        let other = Arc::new(ConnectionShare::default());
        assert!(slots.acquire("a", wait, Some(&other)).await.is_ok());
        assert!(slots.acquire("b", wait, Some(&conn)).await.is_ok());
        assert!(slots.acquire("a", wait, None).await.is_ok());
        drop(Slot::held(first.permit, first.share, None));
        let again = slots.acquire("a", wait, Some(&conn)).await.unwrap();
        assert!(
            again.share.is_some(),
            "an ended request gives its place back"
        );
    }

    #[tokio::test]
    async fn slots_in_use_are_read_from_the_semaphores_at_each_scrape() {
        let wait = Duration::from_millis(20);
        let slots = Arc::new(ArcSwap::from_pointee(SiteSlots::new(["a", "b"], 4)));
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(SlotsInUse(Arc::clone(&slots))));
        let held = slots.load().acquire("a", wait, None).await.unwrap();
        let text = |r: &prometheus_client::registry::Registry| {
            let mut t = String::new();
            prometheus_client::encoding::text::encode(&mut t, r).unwrap();
            t
        };
        let t = text(&registry);
        assert!(
            t.contains("grid_gateway_site_slots_in_use{site=\"a\"} 1"),
            "{t}"
        );
        assert!(
            t.contains("grid_gateway_site_slots_in_use{site=\"b\"} 0"),
            "{t}"
        );
        drop(held);
        let t = text(&registry);
        assert!(
            t.contains("grid_gateway_site_slots_in_use{site=\"a\"} 0"),
            "{t}"
        );
    }
}
