//! Gossip mode's signal path, driven from the membership driver's loop.
//!
//! Each site announces the version of every batch it publishes (SWIM carries it, see
//! `grid_membership::overlay`); a member that hears of a version newer than what it
//! holds pulls the batch whole from the member it heard it from, over the signals
//! listener's mutual TLS (`GET /v1/site/membership/batch`), and ingests it through the
//! same store and admission rules as a polled body: epoch and sequence fences, the
//! 10-minute future bound, whole batches, ages relative to the answer's `Date`. Once per
//! membership round a random live member's digest (`GET /v1/site/membership/digest`) is
//! compared with what is held, so a member that missed broadcasts (a partition, a
//! restart) converges without waiting for the next change.
//!
//! Waits are bounded: a pull or a digest fetch by [`PULL_TIMEOUT`], the number in flight
//! by [`MAX_PULLS_IN_FLIGHT`]; a digest is read up to [`MAX_DIGEST_BYTES`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use grid_membership::pulls::{Heard, Pulls};
use grid_membership::{Member, Version};
use grid_signals::batch::Fence;
use grid_signals::store::IngestMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;

use crate::clock::Clock;
use crate::signals::{SharedSignals, ingest_peer_body, lock};
use grid_daemon::client::{FetchTarget, fetch};
use grid_daemon::tls::{self, CertSlot, Identity, Trust};

/// Path of one batch, `?site=..&provider=..`.
pub const BATCH_PATH: &str = "/v1/site/membership/batch";
/// Path of the digest.
pub const DIGEST_PATH: &str = "/v1/site/membership/digest";
/// How often this site's own published versions are compared with what it announced.
pub const ANNOUNCE_CHECK: Duration = Duration::from_millis(250);
/// How often a random live member's digest is compared (one membership round).
pub const DIGEST_INTERVAL: Duration = Duration::from_secs(1);
/// One pull or digest fetch, connect to last byte.
pub const PULL_TIMEOUT: Duration = Duration::from_secs(2);
pub use grid_membership::pulls::MAX_PULLS_IN_FLIGHT;
/// The largest digest accepted; [`grid_membership::overlay::MAX_VERSIONS`] lines of the
/// longest names fit, and it is below the fetch client's body cap.
pub const MAX_DIGEST_BYTES: usize = 4096 * 160;
const _: () = assert!(MAX_DIGEST_BYTES <= grid_signals::exposition::MAX_EXPOSITION_BYTES);

grid_signals::label_values! {
    /// How one fetch ended: the closed `outcome` label set.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum FetchOutcome {
        /// Fetched and ingested (a batch) or read (a digest).
        Ok = "ok",
        /// The member answered but did not hold the batch any more, or the exchange failed.
        Failed = "failed",
        /// The answer had no usable `Date`.
        NoDate = "no_date",
        /// A digest line that is not `site provider epoch sequence`.
        Malformed = "malformed",
        /// Not started: [`MAX_PULLS_IN_FLIGHT`] were in flight.
        Deferred = "deferred",
    }
}

grid_signals::label_values! {
    /// What was fetched: the closed `kind` label set.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum FetchKind {
        /// One batch.
        Batch = "batch",
        /// A digest.
        Digest = "digest",
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FetchLabels {
    kind: FetchKind,
    outcome: FetchOutcome,
}

/// `grid_operator_gossip_fetches_total{kind,outcome}`.
#[derive(Clone, Debug, Default)]
pub struct GossipMetrics {
    fetches: Family<FetchLabels, Counter>,
}

impl GossipMetrics {
    /// Registers the series.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        for kind in FetchKind::ALL {
            for outcome in FetchOutcome::ALL {
                let _ = m.fetches.get_or_create(&FetchLabels { kind, outcome });
            }
        }
        registry.register(
            "grid_operator_gossip_fetches",
            "Gossip pulls of batches and digests from members, by kind and outcome",
            m.fetches.clone(),
        );
        m
    }

    fn record(&self, kind: FetchKind, outcome: FetchOutcome) {
        self.fetches
            .get_or_create(&FetchLabels { kind, outcome })
            .inc();
    }

    /// Fetches of `kind` that ended with `outcome`.
    pub fn count(&self, kind: FetchKind, outcome: FetchOutcome) -> u64 {
        self.fetches
            .get_or_create(&FetchLabels { kind, outcome })
            .get()
    }
}

/// The query of a batch pull: both names, each a DNS label.
pub fn parse_batch_query(query: &str) -> Option<(&str, &str)> {
    let (mut site, mut provider) = (None, None);
    for pair in query.split('&') {
        match pair.split_once('=')? {
            ("site", v) if site.is_none() && label(v) => site = Some(v),
            ("provider", v) if provider.is_none() && label(v) => provider = Some(v),
            _ => return None,
        }
    }
    Some((site?, provider?))
}

fn label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= grid_membership::overlay::MAX_PROVIDER_NAME_BYTES
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// One line per batch held: `site provider epoch sequence`.
pub fn write_digest<'a>(held: impl Iterator<Item = (&'a str, &'a str, Fence)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (site, provider, fence) in held {
        out.extend_from_slice(
            format!("{site} {provider} {} {}\n", fence.epoch, fence.sequence).as_bytes(),
        );
    }
    out
}

/// Reads a digest; `None` when any line is not one version.
pub fn parse_digest(body: &[u8]) -> Option<Vec<Version>> {
    let text = std::str::from_utf8(body).ok()?;
    text.lines()
        .take(grid_membership::overlay::MAX_VERSIONS + 1)
        .map(|line| {
            let mut f = line.split(' ');
            let (site, provider) = (f.next()?, f.next()?);
            let (epoch, sequence) = (f.next()?.parse().ok()?, f.next()?.parse().ok()?);
            (f.next().is_none() && label(site) && label(provider)).then(|| Version {
                site: site.to_owned(),
                provider: provider.to_owned(),
                epoch,
                sequence,
            })
        })
        .collect::<Option<Vec<_>>>()
        .filter(|v| v.len() <= grid_membership::overlay::MAX_VERSIONS)
}

/// One pull or digest fetch from a member, bounded by [`PULL_TIMEOUT`] from connect to
/// last byte.
async fn fetch_from(
    uri: http::Uri,
    tls: Arc<rustls::ClientConfig>,
) -> Result<grid_daemon::client::Fetched, grid_daemon::client::Failed> {
    fetch(&FetchTarget::new(uri, PULL_TIMEOUT, Some(tls))).await
}

type Register = (String, String);

/// What a finished fetch tells the driver.
pub(crate) enum Fetched {
    /// A pull of `register` ended (ingested or not).
    Pulled(Register),
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
    announced: HashMap<Register, Fence>,
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

    /// `from` holds `version`: pull it unless the store holds it already or it is being
    /// pulled (then it is weighed again when that pull ends).
    pub(crate) fn heard(&mut self, from: Member, version: Version) {
        let held = lock(&self.signals)
            .all()
            .fence_of(&version.site, &version.provider)
            .map(|f| (f.epoch, f.sequence));
        match self.pulls.heard(from, version, held) {
            Heard::Pull { from, version } => self.spawn_pull(&from, version),
            Heard::Deferred => self
                .metrics
                .record(FetchKind::Batch, FetchOutcome::Deferred),
            Heard::Held | Heard::Queued => {}
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

    fn spawn_pull(&self, from: &Member, version: Version) {
        let key = (version.site.clone(), version.provider.clone());
        let url = format!(
            "https://{}:{}{BATCH_PATH}?site={}&provider={}",
            from.authority_host(),
            from.signals_port,
            version.site,
            version.provider
        );
        let (tls, done) = (self.client(from), self.done.0.clone());
        let (signals, ingest, metrics, clock) = (
            self.signals.clone(),
            self.ingest.clone(),
            self.metrics.clone(),
            self.clock.clone(),
        );
        tokio::spawn(async move {
            let outcome = match (url.parse(), tls) {
                (Ok(uri), Some(tls)) => match fetch_from(uri, tls).await {
                    Ok(f) => match f.date_ms {
                        Some(date_ms) => {
                            ingest_peer_body(
                                &signals,
                                &ingest,
                                clock.wall_ms(),
                                (&version.site, &f.body, date_ms),
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
            let _ = done.send(Fetched::Pulled(key)).await;
        });
    }

    /// Asks `member` for its digest.
    pub(crate) fn spawn_digest(&self, member: Member) {
        let url = format!(
            "https://{}:{}{DIGEST_PATH}",
            member.authority_host(),
            member.signals_port
        );
        let (tls, done, metrics) = (
            self.client(&member),
            self.done.0.clone(),
            self.metrics.clone(),
        );
        tokio::spawn(async move {
            let (Ok(uri), Some(tls)) = (url.parse(), tls) else {
                metrics.record(FetchKind::Digest, FetchOutcome::Failed);
                return;
            };
            match fetch_from(uri, tls).await {
                Ok(f) if f.body.len() > MAX_DIGEST_BYTES => {
                    metrics.record(FetchKind::Digest, FetchOutcome::Malformed);
                }
                Ok(f) => match parse_digest(&f.body) {
                    Some(versions) => {
                        metrics.record(FetchKind::Digest, FetchOutcome::Ok);
                        let _ = done.send(Fetched::Digest(member, versions)).await;
                    }
                    None => metrics.record(FetchKind::Digest, FetchOutcome::Malformed),
                },
                Err(_) => metrics.record(FetchKind::Digest, FetchOutcome::Failed),
            }
        });
    }

    /// The next finished fetch.
    pub(crate) async fn next_done(&mut self) -> Option<Fetched> {
        self.done.1.recv().await
    }

    /// Acts on a finished fetch.
    pub(crate) fn finished(&mut self, fetched: Fetched) {
        match fetched {
            Fetched::Pulled((site, provider)) => {
                if let Some((from, version)) = self.pulls.finished(&site, &provider) {
                    self.heard(from, version);
                }
            }
            Fetched::Digest(member, versions) => {
                for version in versions {
                    self.heard(member.clone(), version);
                }
            }
        }
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

    #[test]
    fn a_batch_query_names_both_labels_once_and_nothing_else() {
        assert_eq!(
            parse_batch_query("site=a&provider=llama"),
            Some(("a", "llama"))
        );
        assert_eq!(
            parse_batch_query("provider=llama&site=a"),
            Some(("a", "llama"))
        );
        for bad in [
            "site=a",
            "site=a&provider=",
            "site=a&provider=l&provider=m",
            "site=a/b&provider=l",
            "site=a&provider=l&x=1",
            "",
        ] {
            assert_eq!(parse_batch_query(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_digest_round_trips_and_any_bad_line_refuses_it_whole() {
        let held = [("a", "m", Fence::new(5, 7)), ("b", "n", Fence::new(6, 1))];
        let body = write_digest(held.iter().copied());
        let parsed = parse_digest(&body).unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(
            (parsed[1].site.as_str(), parsed[1].epoch, parsed[1].sequence),
            ("b", 6, 1)
        );
        for bad in ["a m 5\n", "a m 5 7 8\n", "a m x 7\n", "a/ m 5 7\n"] {
            assert_eq!(parse_digest(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn a_digest_of_the_most_registers_is_read_and_one_more_is_refused() {
        use grid_membership::overlay::MAX_VERSIONS;
        let names: Vec<String> = (0..=MAX_VERSIONS).map(|i| format!("p{i}")).collect();
        let held = |n: usize| {
            write_digest(
                names[..n]
                    .iter()
                    .map(|p| ("a", p.as_str(), Fence::new(1, 1))),
            )
        };
        let most = held(MAX_VERSIONS);
        assert!(most.len() <= MAX_DIGEST_BYTES);
        assert_eq!(parse_digest(&most).map(|v| v.len()), Some(MAX_VERSIONS));
        assert_eq!(parse_digest(&held(MAX_VERSIONS + 1)), None);
    }
}
