//! Gossip mode's signal path, driven from the membership driver's loop.
//!
//! Each site announces the version of every batch it publishes (SWIM carries it, see
//! `grid_membership::overlay`); a member that hears of a version newer than what it
//! holds pulls the batch whole from the member it heard it from (and once more from the
//! version's own site when that member was a relay still behind), over the signals
//! listener's mutual TLS (`GET /v1/site/membership/batch`, one request per member for
//! every register wanted from it: `grid_membership::pulls`), and ingests it through the
//! same store and admission rules as a polled body: epoch and sequence fences, the
//! 10-minute future bound, whole batches, ages relative to the answer's `Date`. Once per
//! membership round a random live member's digest (`GET /v1/site/membership/digest`) is
//! compared with what is held, so a member that missed broadcasts (a partition, a
//! restart) converges without waiting for the next change.
//!
//! Waits are bounded: a pull or a digest fetch by [`PULL_TIMEOUT`], the requests in
//! flight by [`MAX_PULLS_IN_FLIGHT`], the registers one asks for by
//! [`MAX_REGISTERS_PER_PULL`]; a digest is read up to [`MAX_DIGEST_BYTES`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use grid_membership::pulls::{Heard, Pull, Pulls};
use grid_membership::{Member, Version};
use grid_signals::batch::Fence;
use grid_signals::site::SiteInput;
use grid_signals::store::IngestMetrics;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;

use crate::clock::Clock;
use crate::site_machine::{SharedSignals, ingest_peer_body, lock};
use grid_daemon::client::{FetchTarget, fetch};
use grid_daemon::tls::{self, CertSlot, Identity, Trust};

pub use grid_signals::wire::{BATCH_PATH, DIGEST_PATH};

/// How often this site's own published versions are compared with what it announced.
pub const ANNOUNCE_CHECK: Duration = Duration::from_millis(250);
/// How often a random live member's digest is compared (one membership round).
pub const DIGEST_INTERVAL: Duration = Duration::from_secs(1);
/// One pull or digest fetch, connect to last byte.
pub const PULL_TIMEOUT: Duration = Duration::from_secs(2);
pub use grid_membership::pull_wire::{
    MAX_DIGEST_BYTES, batch_query, parse_batch_query, parse_digest, write_digest,
};
pub use grid_membership::pulls::{MAX_PULLS_IN_FLIGHT, MAX_REGISTERS_PER_PULL};
/// The longest pull query (every register at the longest names) fits the signals
/// listener's header bound.
const _: () = assert!(
    BATCH_PATH.len()
        + MAX_REGISTERS_PER_PULL
            * ("site=&provider=&".len() + 2 * grid_membership::overlay::MAX_PROVIDER_NAME_BYTES)
        < crate::listener::H2_MAX_HEADER_LIST_BYTES as usize / 2
);

grid_signals::label_values! {
    label "outcome";
    /// How one fetch ended: the closed `outcome` label set.
    pub enum FetchOutcome {
        /// Fetched and ingested (a batch) or read (a digest).
        Ok,
        /// The member answered but did not hold the batch any more, or the exchange failed.
        Failed,
        /// The answer had no usable `Date`.
        NoDate,
        /// A digest line that is not `site provider epoch sequence`.
        Malformed,
        /// Left to the digests: [`grid_membership::pulls::MAX_WANTED`] registers were
        /// waiting for a pull already, or the member it was wanted from was declared down.
        Deferred,
    }
}

grid_signals::label_values! {
    label "kind";
    /// What was fetched: the closed `kind` label set.
    pub enum FetchKind {
        /// One batch.
        Batch,
        /// A digest.
        Digest,
    }
}

/// `grid_operator_gossip_fetches_total{kind,outcome}`.
#[derive(Clone, Debug, Default)]
pub struct GossipMetrics {
    fetches: Family<(FetchKind, FetchOutcome), Counter>,
    /// Where each member's last pull or digest is noted for the routing evidence (the
    /// peer pollers' ledger: one per operator).
    pub ledger: crate::peer_ledger::PeerLedger,
}

impl GossipMetrics {
    /// Registers the series.
    pub fn register(registry: &mut Registry) -> Self {
        Self {
            fetches: grid_signals::labels::register_zeroed(
                registry,
                "grid_operator_gossip_fetches",
                "Gossip pulls of batches and digests from members, by kind and outcome",
            ),
            ledger: crate::peer_ledger::PeerLedger::default(),
        }
    }

    fn record(&self, kind: FetchKind, outcome: FetchOutcome) {
        self.record_many(kind, outcome, 1);
    }

    /// `n` fetches of `kind` that ended with `outcome`, in one lookup of their series.
    fn record_many(&self, kind: FetchKind, outcome: FetchOutcome, n: u64) {
        self.fetches.get_or_create(&(kind, outcome)).inc_by(n);
    }

    /// Fetches of `kind` that ended with `outcome`.
    pub fn count(&self, kind: FetchKind, outcome: FetchOutcome) -> u64 {
        self.fetches.get_or_create(&(kind, outcome)).get()
    }
}

/// One pull or digest fetch from a member, bounded by [`PULL_TIMEOUT`] from connect to
/// last byte.
async fn fetch_from(
    uri: http::Uri,
    tls: Arc<rustls::ClientConfig>,
) -> Result<grid_daemon::client::Fetched, grid_daemon::client::Failed> {
    fetch(&FetchTarget::new(uri, PULL_TIMEOUT, Some(tls))).await
}

/// What a finished fetch tells the driver.
pub(crate) enum Fetched {
    /// A pull of these versions' registers ended (ingested or not).
    Pulled(Vec<Version>),
    /// A member's digest: what it holds.
    Digest(Member, Vec<Version>),
}

/// The gossip half of the membership driver.
pub(crate) struct Gossip {
    pub(crate) site: String,
    pub(crate) signals: SharedSignals,
    pub(crate) ingest: IngestMetrics,
    pub(crate) metrics: GossipMetrics,
    pub(crate) clock: Clock,
    pub(crate) certificate: Arc<CertSlot>,
    pub(crate) trust: Arc<Trust>,
    /// Verifies each pulled batch's signature under the trust in force.
    check: Arc<tls::TrustCheck>,
    announced: HashMap<(String, String), Fence>,
    /// What is pulled, from whom, how many at once (grid-membership's one rule).
    pulls: Pulls,
    done: (mpsc::Sender<Fetched>, mpsc::Receiver<Fetched>),
}

impl Gossip {
    pub(crate) fn new(
        site: String,
        signals: SharedSignals,
        (ingest, metrics): (IngestMetrics, GossipMetrics),
        clock: Clock,
        (certificate, trust): (Arc<CertSlot>, Arc<Trust>),
    ) -> Self {
        Self {
            pulls: Pulls::new(&site),
            site,
            signals,
            ingest,
            metrics,
            clock,
            certificate,
            check: Arc::new(tls::TrustCheck::new(Arc::clone(&trust))),
            trust,
            announced: HashMap::new(),
            done: mpsc::channel(MAX_PULLS_IN_FLIGHT * 2),
        }
    }

    /// This site's batches published since the last check, to announce.
    pub(crate) fn own_news(&mut self) -> Vec<Version> {
        let now = self.clock.wall_ms();
        let site = lock(&self.signals);
        let mut news = Vec::new();
        for (s, provider, fence) in site.all().held_fences(now) {
            if s != self.site {
                continue;
            }
            let key = (s.to_owned(), provider.to_owned());
            if self.announced.get(&key) != Some(&fence) {
                self.announced.insert(key, fence);
                news.push(Version {
                    site: s.to_owned(),
                    provider: provider.to_owned(),
                    epoch: fence.epoch,
                    sequence: fence.sequence,
                });
            }
        }
        news
    }

    /// `from` holds `version`: want it unless the store holds it already or it is being
    /// pulled (then it is weighed again when that pull ends). Wanted registers leave in
    /// [`Gossip::start_pulls`], one request per member.
    pub(crate) fn heard(&mut self, from: Member, version: Version) {
        let held = lock(&self.signals)
            .all()
            .fence_of(&version.site, &version.provider)
            .map(|f| (f.epoch, f.sequence));
        match self.pulls.heard(from, version, held) {
            Heard::Deferred => self
                .metrics
                .record(FetchKind::Batch, FetchOutcome::Deferred),
            Heard::Wanted | Heard::Held | Heard::Queued => {}
        }
    }

    /// `member` was declared down: what was wanted from it is left to the digests,
    /// counted `deferred`.
    pub(crate) fn member_down(&mut self, member: &Member) {
        let forgotten = self.pulls.forget(&member.site) as u64;
        if forgotten > 0 {
            self.metrics
                .record_many(FetchKind::Batch, FetchOutcome::Deferred, forgotten);
        }
    }

    /// Starts every request the pull rule allows now: called once what one input brought
    /// (a datagram's versions, a digest, a finished pull) has been heard, so the registers
    /// wanted from one member share one request.
    pub(crate) fn start_pulls(&mut self) {
        while let Some(pull) = self.pulls.poll_pull() {
            self.spawn_pull(pull);
        }
    }

    fn client(&self, member: &Member) -> Option<Arc<rustls::ClientConfig>> {
        tls::client_config_presenting(
            Arc::clone(&self.certificate),
            self.trust.clone(),
            Identity::Peer(member.site.clone()),
        )
        .ok()
    }

    fn spawn_pull(&self, pull: Pull) {
        let url = format!(
            "https://{}:{}{BATCH_PATH}?{}",
            pull.from.authority_host(),
            pull.from.signals_port,
            batch_query(&pull.versions)
        );
        let (tls, done) = (self.client(&pull.from), self.done.0.clone());
        let (signals, ingest, metrics, clock, check) = (
            self.signals.clone(),
            self.ingest.clone(),
            self.metrics.clone(),
            self.clock.clone(),
            Arc::clone(&self.check),
        );
        tokio::spawn(async move {
            let outcome = match (url.parse(), tls) {
                (Ok(uri), Some(tls)) => match fetch_from(uri, tls).await {
                    Ok(f) => match f.date_ms {
                        Some(date_ms) => {
                            let registers: Vec<(&str, &str)> = pull
                                .versions
                                .iter()
                                .map(|v| (v.site.as_str(), v.provider.as_str()))
                                .collect();
                            ingest_peer_body(
                                &signals,
                                &ingest,
                                clock.wall_ms(),
                                SiteInput::PulledBody {
                                    registers: &registers,
                                    check: &*check,
                                    body: &f.body,
                                    date_ms,
                                },
                            );
                            FetchOutcome::Ok
                        }
                        None => FetchOutcome::NoDate,
                    },
                    Err(_) => FetchOutcome::Failed,
                },
                _ => FetchOutcome::Failed,
            };
            metrics.record(FetchKind::Batch, outcome);
            metrics
                .ledger
                .exchange(&pull.from.site, "batch", outcome.as_str(), clock.wall_ms());
            let _ = done.send(Fetched::Pulled(pull.versions)).await;
        });
    }

    /// Asks `member` for its digest.
    pub(crate) fn spawn_digest(&self, member: Member) {
        let url = format!(
            "https://{}:{}{DIGEST_PATH}",
            member.authority_host(),
            member.signals_port
        );
        let (tls, done, metrics, clock) = (
            self.client(&member),
            self.done.0.clone(),
            self.metrics.clone(),
            self.clock.clone(),
        );
        tokio::spawn(async move {
            let site = member.site.clone();
            let outcome = match (url.parse(), tls) {
                (Ok(uri), Some(tls)) => match fetch_from(uri, tls).await {
                    Ok(f) if f.body.len() > MAX_DIGEST_BYTES => FetchOutcome::Malformed,
                    Ok(f) => match parse_digest(&f.body) {
                        Some(versions) => {
                            let _ = done.send(Fetched::Digest(member, versions)).await;
                            FetchOutcome::Ok
                        }
                        None => FetchOutcome::Malformed,
                    },
                    Err(_) => FetchOutcome::Failed,
                },
                _ => FetchOutcome::Failed,
            };
            metrics.record(FetchKind::Digest, outcome);
            metrics
                .ledger
                .exchange(&site, "digest", outcome.as_str(), clock.wall_ms());
        });
    }

    /// The next finished fetch.
    pub(crate) async fn next_done(&mut self) -> Option<Fetched> {
        self.done.1.recv().await
    }

    /// Acts on a finished fetch; `member_of` finds a live member by site (a pull asked
    /// of a relay that was behind is asked again of the version's own site).
    pub(crate) fn finished(
        &mut self,
        fetched: Fetched,
        member_of: impl Fn(&str) -> Option<Member>,
    ) {
        match fetched {
            Fetched::Pulled(versions) => {
                for (from, version) in self.pulls.finished(&versions, member_of) {
                    self.heard(from, version);
                }
            }
            Fetched::Digest(member, versions) => {
                for version in versions {
                    self.heard(member.clone(), version);
                }
            }
        }
        self.start_pulls();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_pull_from_a_member_that_accepts_and_never_answers_gives_up_at_its_bound() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let _held = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(3_600)).await;
            drop(tcp);
        });
        let grid = grid_kit::operator_harness::Grid::new();
        let a = grid.ca.site(grid_kit::operator_harness::DOMAIN, "a");
        let tls = grid.client(&a, "a", "b");
        let url = format!("https://127.0.0.1:{port}{DIGEST_PATH}")
            .parse()
            .unwrap();
        let started = tokio::time::Instant::now();
        let fetched = tokio::time::timeout(PULL_TIMEOUT * 3, fetch_from(url, tls))
            .await
            .expect("the fetch ended on its own bound");
        assert!(fetched.is_err());
        let took = started.elapsed();
        assert!(
            took >= PULL_TIMEOUT && took < PULL_TIMEOUT + Duration::from_secs(1),
            "{took:?}"
        );
    }

    #[test]
    fn fetches_are_exported_under_the_documented_label_spellings_from_zero() {
        let mut registry = Registry::default();
        let m = GossipMetrics::register(&mut registry);
        m.record(FetchKind::Batch, FetchOutcome::NoDate);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "grid_operator_gossip_fetches_total{kind=\"batch\",outcome=\"no_date\"} 1",
            "grid_operator_gossip_fetches_total{kind=\"digest\",outcome=\"deferred\"} 0",
            "grid_operator_gossip_fetches_total{kind=\"batch\",outcome=\"ok\"} 0",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
