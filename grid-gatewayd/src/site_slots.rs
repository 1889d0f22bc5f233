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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::headers::site_value;
use crate::site_pool::SitePool;

/// One site's slots, its idle connections in the clear and its `x-grid-site` value,
/// found by one lookup.
#[derive(Debug, Clone)]
struct Site {
    slots: Arc<Semaphore>,
    pool: Arc<SitePool>,
    header: Option<HeaderValue>,
}

impl Site {
    fn new(name: &str, per_site: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(per_site)),
            pool: Arc::default(),
            header: site_value(name),
        }
    }
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
    /// The site's pool (none for a site that is not configured).
    pub(crate) pool: Option<Arc<SitePool>>,
    /// The site's name as a header value, made once per site rather than validated and
    /// copied per answer (none for a name that cannot be one).
    pub(crate) header: Option<HeaderValue>,
}

/// Why no slot was taken.
#[derive(Debug)]
pub(crate) struct SiteFull;

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

    /// One of `site`'s slots, waiting at most `wait`, with its pool. A site that is not
    /// configured (none is routed to) has no cap and no pool.
    pub(crate) async fn acquire(&self, site: &str, wait: Duration) -> Result<Slot, SiteFull> {
        let Some(entry) = self.sites.get(site) else {
            return Ok(Slot {
                permit: None,
                pool: None,
                header: site_value(site),
            });
        };
        let pool = Some(Arc::clone(&entry.pool));
        let header = entry.header.clone();
        if let Ok(permit) = Arc::clone(&entry.slots).try_acquire_owned() {
            return Ok(Slot {
                permit: Some(permit),
                pool,
                header,
            });
        }
        match tokio::time::timeout(wait, Arc::clone(&entry.slots).acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Slot {
                permit: Some(permit),
                pool,
                header,
            }),
            // The semaphore is never closed; a timeout is the only real outcome here.
            Ok(Err(_)) | Err(_) => Err(SiteFull),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_past_the_cap_waits_its_bound_and_takes_a_slot_freed_in_time() {
        let slots = SiteSlots::new(["a", "b"], 2);
        let wait = Duration::from_millis(50);
        let first = slots.acquire("a", wait).await.unwrap();
        let _second = slots.acquire("a", wait).await.unwrap();
        assert!(
            slots.acquire("a", wait).await.is_err(),
            "the third is over the cap"
        );
        // Another site has its own slots, and an unconfigured one none.
        assert!(slots.acquire("b", wait).await.unwrap().permit.is_some());
        assert!(slots.acquire("z", wait).await.unwrap().permit.is_none());
        let waiting = slots.acquire("a", Duration::from_secs(5));
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
        let first = slots.acquire("site-a", wait).await.unwrap();
        let second = slots.acquire("site-a", wait).await.unwrap();
        let (first, second) = (first.header.unwrap(), second.header.unwrap());
        assert_eq!(first, "site-a");
        assert_eq!(
            first.as_bytes().as_ptr(),
            second.as_bytes().as_ptr(),
            "both answers share the one value, not a copy each"
        );
        let unconfigured = slots.acquire("other", wait).await.unwrap();
        assert_eq!(unconfigured.header.unwrap(), "other");
        assert!(site_value("bad\nname").is_none());
    }

    #[tokio::test]
    async fn a_reload_keeps_the_slots_taken_on_a_kept_site_and_caps_a_site_it_adds() {
        let wait = Duration::from_millis(20);
        let before = SiteSlots::new(["a"], 1);
        let held = before.acquire("a", wait).await.unwrap();
        let after = SiteSlots::carrying_over(["a", "c"], 1, &before);
        assert!(
            Arc::ptr_eq(&before.sites["a"].pool, &after.sites["a"].pool),
            "a kept site keeps its idle connections"
        );
        assert!(
            after.acquire("a", wait).await.is_err(),
            "the request in flight across the reload still holds a's one slot"
        );
        drop(held);
        assert!(after.acquire("a", wait).await.unwrap().permit.is_some());
        let _c = after.acquire("c", wait).await.unwrap();
        assert!(
            after.acquire("c", wait).await.is_err(),
            "the added site is capped from the reload on, not uncapped until a restart"
        );
    }
}
