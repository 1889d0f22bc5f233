//! One site's operator side as a state machine: scrape results in, batches into its
//! stores; peer bodies in; a relay body out for whoever asks.
//!
//! The operator's driver and the routing simulator feed the same [`Site`]: the driver
//! with what its scrape loop and peer pollers read off the network and the wall clock,
//! the simulator with its fake EPPs and virtual time. Neither frames a batch or picks a
//! store itself, so the rule that decides what a peer may see has one home.
//!
//! Two stores keep that rule structural: a [`Audience::Peer`] is served from `own`, which
//! only ever receives this site's publications, so no path can leak a third site's
//! readings to a peer; the local gateway ([`Audience::Local`]) is served from `all`,
//! which also holds what the peers relayed.
//!
//! ```
//! use grid_signals::epp::PoolSelector;
//! use grid_signals::site::{Audience, ProviderSpec, Site, SiteConfig, SiteInput, SiteOutput};
//! use grid_signals::store::{RelayBudget, StoreConfig};
//!
//! let config = SiteConfig { site: "a".into(), epoch: 1, scrape_interval_ms: 1_000, store: StoreConfig::default() };
//! let provider = ProviderSpec {
//!     name: "m".into(), uid: "u1".into(), generation: 1, pool: PoolSelector::All, stale_metrics_ms: None,
//! };
//! let now = 1_700_000_000_000;
//! let mut site = Site::new(config, &[provider], now);
//! let body = b"llm_d_epp_ready_endpoints{name=\"p\"} 2\n";
//! site.handle(now, SiteInput::Scraped { provider: 0, outcome: Ok(body), latest_pass_ms: 0 });
//! while let Some(output) = site.poll() {
//!     if let SiteOutput::Published { report, .. } = output {
//!         assert_eq!(report.dropped.total(), 0);
//!     }
//! }
//! let mut relay = Vec::new();
//! site.relay(Audience::Peer, now, now, RelayBudget::default(), &mut relay);
//! assert!(relay.starts_with(b"grid_provider_config_generation"));
//! ```

mod publisher;

use std::collections::VecDeque;
use std::sync::Arc;

pub use publisher::{Observed, ProviderSpec, Publisher};

use crate::Error;
use crate::batch::{Fence, FenceSet};
use crate::epp::{Readiness, ScrapeFailure};
use crate::signature::{BatchSigner, SignatureCheck};
use crate::store::{
    FenceImport, IngestReport, RelayBudget, RelayReport, Sender, Store, StoreConfig,
};

/// What a site needs to know of itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteConfig {
    /// `grid_site`.
    pub site: String,
    /// This process's publisher epoch (persisted by the caller before the first scrape).
    pub epoch: u64,
    /// Time between scrape passes: the readiness floor is built from it.
    pub scrape_interval_ms: u64,
    /// Tuning of both stores; its TTL also sets the default `staleMetricsSeconds`.
    pub store: StoreConfig,
}

/// Who a relay body is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Audience {
    /// The site's own gateway: everything held, this site's and what peers relayed.
    Local,
    /// A peer operator: this site's own publications only.
    Peer,
}

/// One input of [`Site::handle`].
#[derive(Clone, Copy, Debug)]
pub enum SiteInput<'a> {
    /// A provider's scrape ended: its body, or why there is none.
    Scraped {
        /// Index of the provider, in the order given to [`Site::new`].
        provider: usize,
        /// The body read (capped by the caller), or the failure class.
        outcome: Result<&'a [u8], ScrapeFailure>,
        /// How long the latest whole scrape pass took: it widens the readiness floor.
        latest_pass_ms: u64,
    },
    /// A body polled from a peer whose identity the caller verified.
    PeerBody {
        /// The peer's site name, from its certificate.
        peer: &'a str,
        /// The relay body.
        body: &'a [u8],
        /// The peer's `Date`: the reference its ages are relative to.
        date_ms: u64,
    },
    /// A body a gossip member answered a pull with, the member's identity verified by the
    /// caller; only batches of the registers asked for are admitted.
    PulledBody {
        /// The `(site, provider)` registers asked for.
        registers: &'a [(&'a str, &'a str)],
        /// Verifies each batch's signature under the trust in force: the member's own
        /// identity vouches for none of them (see [`Sender::Pulled`]).
        check: &'a dyn SignatureCheck,
        /// The relay body.
        body: &'a [u8],
        /// The member's `Date`: the reference its ages are relative to.
        date_ms: u64,
    },
    /// Time passed: expire old readings from both stores.
    Expire,
}

/// What [`Site::poll`] hands back, for the caller to count and log.
#[derive(Debug, PartialEq)]
pub enum SiteOutput {
    /// A provider's scrape outcome was read.
    Scraped {
        /// Index of the provider.
        provider: usize,
        /// What it counted as.
        observed: Observed,
    },
    /// A provider's batch was framed and stored.
    Published {
        /// Index of the provider.
        provider: usize,
        /// Its place in the publication order.
        fence: Fence,
        /// Samples it carried.
        samples: u64,
        /// What the site's own store refused of it (normally nothing).
        report: IngestReport,
        /// The readiness verdict it carries, for the caller to log and export.
        readiness: Readiness,
    },
    /// A provider's batch could not be framed (a name or value out of the wire rules).
    NotPublished {
        /// Index of the provider.
        provider: usize,
        /// Why.
        error: Error,
    },
    /// A provider dropped by [`Site::reconfigure`] published its last batch: not ready,
    /// reason `Unavailable`, so receivers stop routing to it at once instead of when its
    /// readings age out.
    Withdrawn {
        /// Its name (it no longer has an index).
        provider: String,
        /// The last batch's place in the publication order.
        fence: Fence,
        /// What the site's own store refused of it (normally nothing).
        report: IngestReport,
    },
    /// A peer's body was ingested.
    PeerIngested {
        /// What the store kept and refused of it.
        report: IngestReport,
    },
}

/// One site's publishers and its two stores.
#[derive(Debug)]
pub struct Site {
    config: SiteConfig,
    specs: Vec<ProviderSpec>,
    publishers: Vec<Publisher>,
    /// The highest next sequence of any publisher replaced or withdrawn in this epoch:
    /// where every new publisher starts, so a provider changed, or withdrawn and added
    /// back, never repeats a fence its receivers already hold.
    retired_sequence: u64,
    own: Store,
    all: Store,
    outputs: VecDeque<SiteOutput>,
    /// Signs each of this site's publications as it is stored, for gossip pulls.
    signer: Option<Arc<dyn BatchSigner>>,
}

impl Site {
    /// A site publishing `providers`, first known at `now` (ms since the Unix epoch).
    pub fn new(config: SiteConfig, providers: &[ProviderSpec], now: u64) -> Self {
        let mut site = Self {
            own: Store::new(config.store),
            all: Store::new(config.store),
            config,
            specs: providers.to_vec(),
            publishers: Vec::with_capacity(providers.len()),
            retired_sequence: 1,
            outputs: VecDeque::new(),
            signer: None,
        };
        site.publishers = providers.iter().map(|p| site.publisher(p, now)).collect();
        site
    }

    fn publisher(&self, provider: &ProviderSpec, now: u64) -> Publisher {
        Publisher::new(
            &self.config.site,
            provider,
            self.config.epoch,
            self.config.scrape_interval_ms,
            self.config.store.ttl_ms,
            now,
        )
        .starting_at(self.retired_sequence)
    }

    /// Publishes `providers` from now on, in the same epoch, without a restart: a
    /// provider whose spec is unchanged keeps its publisher (its readings, its stale
    /// window, its sequence), so its receivers' learning goes on; a changed one (another
    /// generation, UID, pool or stale window) gets a fresh publisher whose sequence
    /// continues above every one this epoch used, so its receivers reset exactly that
    /// provider's learning, on the new revision; a provider no longer listed publishes
    /// one last not-ready batch ([`SiteOutput::Withdrawn`]) and stops.
    ///
    /// Returns, for each provider of the new list, the index it had in the old one when
    /// its publisher was kept; indexes of later inputs follow the new list. Names are
    /// unique in a valid list; of duplicates, the first is matched.
    pub fn reconfigure(&mut self, now: u64, providers: &[ProviderSpec]) -> Vec<Option<usize>> {
        let mut old: Vec<Option<(ProviderSpec, Publisher)>> = std::mem::take(&mut self.specs)
            .into_iter()
            .zip(std::mem::take(&mut self.publishers))
            .map(Some)
            .collect();
        let mut kept = Vec::with_capacity(providers.len());
        for spec in providers {
            let found = old
                .iter()
                .position(|o| o.as_ref().is_some_and(|(s, _)| s.name == spec.name));
            match found.and_then(|i| old[i].take().map(|o| (i, o))) {
                Some((i, (was, publisher))) if was == *spec => {
                    self.publishers.push(publisher);
                    kept.push(Some(i));
                }
                Some((_, (_, publisher))) => {
                    self.retire(&publisher);
                    self.publishers.push(self.publisher(spec, now));
                    kept.push(None);
                }
                None => {
                    self.publishers.push(self.publisher(spec, now));
                    kept.push(None);
                }
            }
            self.specs.push(spec.clone());
        }
        for (_, publisher) in old.into_iter().flatten() {
            self.withdraw(now, publisher);
        }
        kept
    }

    fn retire(&mut self, publisher: &Publisher) {
        self.retired_sequence = self.retired_sequence.max(publisher.next_sequence());
    }

    fn withdraw(&mut self, now: u64, mut publisher: Publisher) {
        publisher.set_unavailable(true);
        let last = publisher.publish(now, 0);
        self.retire(&publisher);
        // Framing a not-ready batch of a name that was framed before cannot fail; if it
        // ever did, the rows age out as a dead site's do.
        let Ok(batch) = last else { return };
        let provider = publisher.name().to_owned();
        let fence = batch.meta.fence();
        let report = self.store_own(batch, now);
        self.outputs.push_back(SiteOutput::Withdrawn {
            provider,
            fence,
            report,
        });
    }

    /// Signs every publication of this site from now on with `signer` (the gossip
    /// mode's batches travel through other members, so each carries its origin's
    /// signature); the publications held now are signed at once.
    pub fn set_signer(&mut self, signer: Arc<dyn BatchSigner>) {
        let providers: Vec<String> = self.providers().map(str::to_owned).collect();
        for provider in providers {
            self.all
                .sign_held(&self.config.site, &provider, signer.as_ref());
        }
        self.signer = Some(signer);
    }

    /// Puts one of this site's batches in both stores, signing what `all` holds of it
    /// when a signer is set; what its own store refused.
    fn store_own(&mut self, batch: crate::batch::Batch, now: u64) -> IngestReport {
        let mut report = IngestReport::default();
        let provider = batch.meta.provider().to_owned();
        self.own
            .ingest_batch(batch.clone(), Sender::Own, now, now, &mut report);
        let mut ignored = IngestReport::default();
        self.all
            .ingest_batch(batch, Sender::Own, now, now, &mut ignored);
        if let Some(signer) = &self.signer {
            self.all
                .sign_held(&self.config.site, &provider, signer.as_ref());
        }
        report
    }

    /// The site's configuration.
    pub fn config(&self) -> &SiteConfig {
        &self.config
    }

    /// The providers' names, in index order.
    pub fn providers(&self) -> impl Iterator<Item = &str> {
        self.publishers.iter().map(Publisher::name)
    }

    /// Feeds one input observed at `now` (ms since the Unix epoch). A provider index out
    /// of range is ignored: the caller built the site from the same list.
    pub fn handle(&mut self, now: u64, input: SiteInput<'_>) {
        match input {
            SiteInput::Scraped {
                provider,
                outcome,
                latest_pass_ms,
            } => self.scraped(now, provider, outcome, latest_pass_ms),
            SiteInput::PeerBody {
                peer,
                body,
                date_ms,
            } => {
                let report = self
                    .all
                    .ingest(body, Sender::Peer { site: peer }, date_ms, now);
                self.outputs.push_back(SiteOutput::PeerIngested { report });
            }
            SiteInput::PulledBody {
                registers,
                check,
                body,
                date_ms,
            } => {
                let report =
                    self.all
                        .ingest(body, Sender::Pulled { registers, check }, date_ms, now);
                self.outputs.push_back(SiteOutput::PeerIngested { report });
            }
            SiteInput::Expire => {
                self.own.expire(now);
                self.all.expire(now);
                // Nothing here learns from revisions; the gateway's store does.
                while self.own.poll_event().is_some() {}
                while self.all.poll_event().is_some() {}
            }
        }
    }

    fn scraped(
        &mut self,
        now: u64,
        provider: usize,
        outcome: Result<&[u8], ScrapeFailure>,
        latest_pass_ms: u64,
    ) {
        let Some(publisher) = self.publishers.get_mut(provider) else {
            return;
        };
        let observed = publisher.observe(now, outcome);
        self.outputs
            .push_back(SiteOutput::Scraped { provider, observed });
        let readiness = publisher.readiness(now, latest_pass_ms);
        match publisher.publish(now, latest_pass_ms) {
            Ok(batch) => {
                let fence = batch.meta.fence();
                let samples = batch.meta.samples();
                let report = self.store_own(batch, now);
                self.outputs.push_back(SiteOutput::Published {
                    provider,
                    fence,
                    samples,
                    report,
                    readiness,
                });
            }
            Err(error) => self
                .outputs
                .push_back(SiteOutput::NotPublished { provider, error }),
        }
    }

    /// Marks provider `provider` (index) Unavailable from configuration, or clears it;
    /// an index out of range is ignored. Its next batches read not ready with reason
    /// `Unavailable`, the spec's third not-ready case.
    pub fn set_unavailable(&mut self, provider: usize, unavailable: bool) {
        if let Some(publisher) = self.publishers.get_mut(provider) {
            publisher.set_unavailable(unavailable);
        }
    }

    /// The next output of the inputs handled so far, oldest first.
    pub fn poll(&mut self) -> Option<SiteOutput> {
        self.outputs.pop_front()
    }

    /// Writes the relay body for `audience` into `out`, ages relative to `reference_ms`
    /// (the `Date` the caller will send).
    pub fn relay(
        &self,
        audience: Audience,
        now: u64,
        reference_ms: u64,
        budget: RelayBudget,
        out: &mut Vec<u8>,
    ) -> RelayReport {
        let store = match audience {
            Audience::Local => &self.all,
            Audience::Peer => &self.own,
        };
        store.encode_relay(now, reference_ms, budget, out)
    }

    /// The readiness generation of what `audience` is served: the store's
    /// ([`Store::readiness_generation`]) counted from the publisher epoch, so a restarted
    /// operator, whose stores count anew, starts from another generation than a poller saw
    /// from the process before it (the same one would hold that poller's next poll to its
    /// bound, no longer). A long poll ([`crate::long_poll`]) is answered when it moves.
    pub fn readiness_generation(&self, audience: Audience) -> u64 {
        let store = match audience {
            Audience::Local => &self.all,
            Audience::Peer => &self.own,
        };
        self.config.epoch.wrapping_add(store.readiness_generation())
    }

    /// Everything held, own providers and polled peers (what `/metrics` shows).
    pub fn all(&self) -> &Store {
        &self.all
    }

    /// The fences of everything held, to persist.
    pub fn export_fences(&self) -> FenceSet {
        self.all.export_fences()
    }

    /// Raises fences to persisted ones after a restart, so a batch older than one already
    /// admitted before the restart is still refused as `delayed`.
    pub fn import_fences(&mut self, fences: &FenceSet, now: u64) -> FenceImport {
        self.all.import_fences(fences, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::epp::PoolSelector;
    use crate::store::Sender;

    const NOW: u64 = 1_700_000_000_000;
    const BODY: &[u8] = b"llm_d_epp_ready_endpoints{name=\"p\"} 2\n";

    fn site(name: &str) -> Site {
        site_in_epoch(name, 1)
    }

    fn site_in_epoch(name: &str, epoch: u64) -> Site {
        Site::new(
            SiteConfig {
                site: name.into(),
                epoch,
                scrape_interval_ms: 1_000,
                store: StoreConfig::default(),
            },
            &[ProviderSpec {
                name: "m".into(),
                uid: format!("{name}/m"),
                generation: 1,
                pool: PoolSelector::All,
                stale_metrics_ms: None,
            }],
            NOW,
        )
    }

    fn relay(site: &Site, audience: Audience) -> String {
        relay_at(site, audience, NOW)
    }

    fn relay_at(site: &Site, audience: Audience, now: u64) -> String {
        let mut out = Vec::new();
        site.relay(audience, now, now, RelayBudget::default(), &mut out);
        String::from_utf8(out).unwrap()
    }

    fn published_report(site: &mut Site) -> IngestReport {
        std::iter::from_fn(|| site.poll())
            .find_map(|o| match o {
                SiteOutput::Published { report, .. } => Some(report),
                _ => None,
            })
            .expect("a batch")
    }

    #[test]
    fn a_clock_stepped_back_past_the_epoch_bound_keeps_the_site_publishing_its_own_batches() {
        use crate::batch::MAX_EPOCH_LEAD_MS;
        // An operator started at NOW (its epoch), whose host clock then steps back
        // beyond the bound receivers apply to epochs.
        let mut a = site_in_epoch("a", NOW);
        let scrape = |a: &mut Site, now, body: &'static [u8]| {
            a.handle(
                now,
                SiteInput::Scraped {
                    provider: 0,
                    outcome: Ok(body),
                    latest_pass_ms: 0,
                },
            );
        };
        scrape(&mut a, NOW, BODY);
        assert_eq!(published_report(&mut a).dropped.total(), 0);
        let stepped = NOW - 2 * MAX_EPOCH_LEAD_MS;
        scrape(
            &mut a,
            stepped,
            b"llm_d_epp_ready_endpoints{name=\"p\"} 3\n",
        );
        let report = published_report(&mut a);
        assert_eq!(
            report.dropped.total(),
            0,
            "its own batch refused: {report:?}"
        );
        assert_eq!(report.batches_stored, 1);
        let local = relay_at(&a, Audience::Local, stepped);
        assert!(
            local.contains("} 3 "),
            "the relay carries the batch scraped after the step: {local}"
        );

        // The hub rule still holds for others: a peer whose epoch is that far ahead of
        // this (stepped) clock is refused.
        let mut b = site_in_epoch("b", NOW);
        scrape(&mut b, NOW, BODY);
        let from_b = relay(&b, Audience::Peer);
        a.handle(
            stepped,
            SiteInput::PeerBody {
                peer: "b",
                body: from_b.as_bytes(),
                date_ms: stepped,
            },
        );
        let ingested = std::iter::from_fn(|| a.poll()).find_map(|o| match o {
            SiteOutput::PeerIngested { report } => Some(report),
            _ => None,
        });
        assert!(ingested.is_some_and(|r| r.dropped.get(crate::store::DropReason::Skew) > 0));
    }

    #[test]
    fn a_peer_sees_only_this_sites_rows_while_the_local_gateway_sees_the_peers_too() {
        let mut b = site("b");
        b.handle(
            NOW,
            SiteInput::Scraped {
                provider: 0,
                outcome: Ok(BODY),
                latest_pass_ms: 0,
            },
        );
        let from_b = relay(&b, Audience::Peer);
        let mut a = site("a");
        a.handle(
            NOW,
            SiteInput::Scraped {
                provider: 0,
                outcome: Ok(BODY),
                latest_pass_ms: 0,
            },
        );
        a.handle(
            NOW,
            SiteInput::PeerBody {
                peer: "b",
                body: from_b.as_bytes(),
                date_ms: NOW,
            },
        );
        let outputs: Vec<_> = std::iter::from_fn(|| a.poll()).collect();
        assert!(matches!(
            outputs.last(),
            Some(SiteOutput::PeerIngested { report }) if report.dropped.total() == 0
        ));
        let peer = relay(&a, Audience::Peer);
        let local = relay(&a, Audience::Local);
        assert!(peer.contains("grid_site=\"a\"") && !peer.contains("grid_site=\"b\""));
        assert!(local.contains("grid_site=\"a\"") && local.contains("grid_site=\"b\""));
    }

    #[test]
    fn each_scrape_reports_its_outcome_then_its_batch_in_sequence() {
        let mut a = site("a");
        for (i, now) in [NOW, NOW + 1_000].into_iter().enumerate() {
            a.handle(
                now,
                SiteInput::Scraped {
                    provider: 0,
                    outcome: Ok(BODY),
                    latest_pass_ms: 0,
                },
            );
            assert_eq!(
                a.poll(),
                Some(SiteOutput::Scraped {
                    provider: 0,
                    observed: Observed::default()
                })
            );
            let Some(SiteOutput::Published { fence, .. }) = a.poll() else {
                panic!("no batch");
            };
            assert_eq!(fence, Fence::new(1, i as u64 + 1));
            assert_eq!(a.poll(), None);
        }
    }

    #[test]
    fn a_provider_marked_unavailable_publishes_not_ready_with_that_reason() {
        use crate::epp::{ReadyReason, ReadyStatus};
        let mut a = site("a");
        a.set_unavailable(0, true);
        a.set_unavailable(7, true);
        a.handle(
            NOW,
            SiteInput::Scraped {
                provider: 0,
                outcome: Ok(BODY),
                latest_pass_ms: 0,
            },
        );
        let published = std::iter::from_fn(|| a.poll()).find_map(|o| match o {
            SiteOutput::Published { readiness, .. } => Some(readiness),
            _ => None,
        });
        let readiness = published.expect("a batch");
        assert_eq!(
            (readiness.status, readiness.reason),
            (ReadyStatus::NotReady, ReadyReason::Unavailable)
        );
        let local = relay(&a, Audience::Local);
        let ready = local
            .lines()
            .find(|l| l.starts_with("grid_provider_ready{"))
            .expect("a readiness row");
        assert!(ready.contains("} 0 "), "{ready}");
    }

    fn spec(name: &str, generation: u64) -> ProviderSpec {
        ProviderSpec {
            name: name.into(),
            uid: format!("a/{name}"),
            generation,
            pool: PoolSelector::All,
            stale_metrics_ms: None,
        }
    }

    fn two_providers() -> Site {
        Site::new(
            SiteConfig {
                site: "a".into(),
                epoch: 1,
                scrape_interval_ms: 1_000,
                store: StoreConfig::default(),
            },
            &[spec("m", 1), spec("n", 1)],
            NOW,
        )
    }

    /// Scrapes every provider of `site` once at `now`; the fences published, by name.
    fn scrape_all(site: &mut Site, now: u64) -> Vec<(String, Fence)> {
        let names: Vec<String> = site.providers().map(str::to_owned).collect();
        for provider in 0..names.len() {
            site.handle(
                now,
                SiteInput::Scraped {
                    provider,
                    outcome: Ok(BODY),
                    latest_pass_ms: 0,
                },
            );
        }
        std::iter::from_fn(|| site.poll())
            .filter_map(|o| match o {
                SiteOutput::Published {
                    provider, fence, ..
                } => Some((names[provider].clone(), fence)),
                _ => None,
            })
            .collect()
    }

    /// A gateway's store after one relay of `site`: the providers whose learning reset,
    /// and what it refused.
    fn receive(gateway: &mut Store, site: &Site, now: u64) -> (Vec<(String, u64)>, u64) {
        let mut body = Vec::new();
        site.relay(Audience::Local, now, now, RelayBudget::default(), &mut body);
        let report = gateway.ingest(&body, Sender::Local, now, now);
        let resets = std::iter::from_fn(|| gateway.poll_event())
            .filter_map(|e| match e {
                crate::store::StoreEvent::Reset {
                    provider, revision, ..
                } => Some((provider, revision.generation)),
                _ => None,
            })
            .collect();
        (resets, report.dropped.total())
    }

    #[test]
    fn a_changed_provider_resets_only_its_own_learning_in_the_same_epoch() {
        let mut a = two_providers();
        let mut gateway = Store::new(StoreConfig::default());
        scrape_all(&mut a, NOW);
        let (first, _) = receive(&mut gateway, &a, NOW);
        assert_eq!(first.len(), 2, "two first lifetimes: {first:?}");
        scrape_all(&mut a, NOW + 1_000);

        let kept = a.reconfigure(NOW + 1_500, &[spec("m", 2), spec("n", 1)]);
        assert_eq!(kept, [None, Some(1)], "m was replaced, n kept");
        let fences = scrape_all(&mut a, NOW + 2_000);
        for (_, fence) in &fences {
            assert_eq!(fence.epoch, 1, "no new epoch");
        }
        let (resets, dropped) = receive(&mut gateway, &a, NOW + 2_000);
        assert_eq!(dropped, 0, "the changed provider's batch is not delayed");
        assert_eq!(resets, [("m".to_owned(), 2)], "only m learns afresh");
        let n = gateway.entry("a", "n").and_then(crate::store::Entry::fence);
        assert_eq!(n, Some(Fence::new(1, 3)), "n's sequence went on");
    }

    #[test]
    fn an_unchanged_list_keeps_every_publisher_and_resets_nothing() {
        let mut a = two_providers();
        let mut gateway = Store::new(StoreConfig::default());
        scrape_all(&mut a, NOW);
        receive(&mut gateway, &a, NOW);
        // The same providers, in another order.
        let kept = a.reconfigure(NOW + 500, &[spec("n", 1), spec("m", 1)]);
        assert_eq!(kept, [Some(1), Some(0)]);
        let fences = scrape_all(&mut a, NOW + 1_000);
        assert_eq!(
            fences,
            [
                ("n".to_owned(), Fence::new(1, 2)),
                ("m".to_owned(), Fence::new(1, 2))
            ]
        );
        assert_eq!(receive(&mut gateway, &a, NOW + 1_000), (vec![], 0));
    }

    #[test]
    fn a_withdrawn_provider_publishes_not_ready_and_comes_back_above_its_old_fence() {
        let mut a = two_providers();
        let mut gateway = Store::new(StoreConfig::default());
        for i in 0..3 {
            scrape_all(&mut a, NOW + i * 1_000);
        }
        receive(&mut gateway, &a, NOW + 2_000);
        a.reconfigure(NOW + 2_500, &[spec("n", 1)]);
        let withdrawn: Vec<_> = std::iter::from_fn(|| a.poll()).collect();
        let [
            SiteOutput::Withdrawn {
                provider,
                fence,
                report,
            },
        ] = withdrawn.as_slice()
        else {
            panic!("one withdrawal: {withdrawn:?}");
        };
        assert_eq!((provider.as_str(), *fence), ("m", Fence::new(1, 4)));
        assert_eq!(report.dropped.total(), 0);
        assert_eq!(receive(&mut gateway, &a, NOW + 2_500).1, 0);
        let ready = gateway
            .entry("a", "m")
            .and_then(|e| e.latest("grid_provider_ready", &[]))
            .expect("m's readiness");
        assert!(
            ready.value.abs() < f64::EPSILON,
            "m reads not ready at once"
        );

        // Added back in the same epoch: its first batch is above the withdrawn one's.
        let kept = a.reconfigure(NOW + 3_000, &[spec("n", 1), spec("m", 1)]);
        assert_eq!(kept, [Some(0), None]);
        let fences = scrape_all(&mut a, NOW + 3_500);
        assert_eq!(fences[1], ("m".to_owned(), Fence::new(1, 5)));
        assert_eq!(receive(&mut gateway, &a, NOW + 3_500).1, 0, "not delayed");
    }

    #[test]
    fn a_provider_index_out_of_range_is_ignored() {
        let mut a = site("a");
        a.handle(
            NOW,
            SiteInput::Scraped {
                provider: 1,
                outcome: Ok(BODY),
                latest_pass_ms: 0,
            },
        );
        assert_eq!(a.poll(), None);
    }
}
