//! Polls each peer operator's `GET /v1/site/signals` over mutual TLS.
//!
//! Every peer has its own task and its own ticker, so a peer that hangs, refuses or is
//! untrusted only delays and ages out its own readings. Each body is attributed to the
//! identity the connection verified (the client configuration accepts only that peer's
//! certificate), and the store drops any row naming another site.

use std::sync::Arc;
use std::time::Duration;

use grid_signals::epp::ScrapeFailure;
use grid_signals::long_poll::{LongPoll, Wait};
use grid_signals::store::IngestMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use rand::{Rng, SeedableRng, rngs::SmallRng};
use rustls::ClientConfig;

use crate::clock::{self, Clock};
use crate::config::PeerConfig;
use crate::peer_ledger::{PeerLedger, SkipReason};
use crate::site_machine::{SharedSignals, ingest_peer_body};
use grid_daemon::client::{FetchTarget, fetch, poll_budget, with_wait};

/// Attempts per poll: the first and at most two retries.
pub const MAX_POLL_ATTEMPTS: u32 = 3;
/// Backoff before the first retry; doubled per retry and jittered by 50 to 150 percent.
pub const RETRY_BACKOFF: Duration = Duration::from_millis(200);

/// How one poll ended; the `outcome` label of `grid_operator_peer_polls_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PollOutcome {
    /// A body was fetched and ingested.
    Ok,
    /// Every attempt failed; the class of the last one.
    Failed(ScrapeFailure),
    /// The answer had no usable `Date`, so the ages in it cannot be placed.
    NoDate,
}

impl PollOutcome {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed(f) => f.as_str(),
            Self::NoDate => "no_date",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PollLabels {
    peer: String,
    outcome: &'static str,
}

grid_signals::label_values! {
    /// Which address of a peer answered a poll: the closed `target` label set.
    pub enum PollTarget {
        /// The host and signals port its membership identity advertises.
        Advertised,
        /// The URL its configuration gives.
        Configured,
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AnswerLabels {
    peer: String,
    target: PollTarget,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SkipLabels {
    peer: String,
    reason: SkipReason,
}

/// `grid_operator_peer_polls_total{peer,outcome}`,
/// `grid_operator_peer_poll_answers_total{peer,target}` and
/// `grid_operator_peer_polls_skipped_total{reason}`.
#[derive(Clone, Debug, Default)]
pub struct PollMetrics {
    polls: Family<PollLabels, Counter>,
    answers: Family<AnswerLabels, Counter>,
    skipped: Family<SkipLabels, Counter>,
    /// What the routing evidence shows of each peer.
    pub ledger: PeerLedger,
}

impl PollMetrics {
    /// Registers the series.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "grid_operator_peer_polls",
            "Peer polls by peer and outcome (ok, a failure class, or no_date)",
            m.polls.clone(),
        );
        registry.register(
            "grid_operator_peer_poll_answers",
            "Peer polls answered, by peer and the address that answered (advertised or configured)",
            m.answers.clone(),
        );
        registry.register(
            "grid_operator_peer_polls_skipped",
            "Polls not made, by peer and reason: one per poll interval a member declared down (member_down) or unverifiable is not polled",
            m.skipped.clone(),
        );
        m
    }

    /// Polls of `peer` that `target` answered.
    pub fn answered(&self, peer: &str, target: PollTarget) -> u64 {
        self.answers
            .get_or_create(&AnswerLabels {
                peer: peer.to_owned(),
                target,
            })
            .get()
    }

    /// Creates `peer`'s skipped-poll series at 0 for every reason, so a dashboard and an
    /// alert see them before the first skip (every configured peer at start).
    pub fn add_peer(&self, peer: &str) {
        for reason in SkipReason::ALL {
            let _ = self.skipped.get_or_create(&SkipLabels {
                peer: peer.to_owned(),
                reason,
            });
        }
    }

    /// Polls of `peer` not made for `reason`.
    pub fn skipped_of(&self, peer: &str, reason: SkipReason) -> u64 {
        self.skipped
            .get_or_create(&SkipLabels {
                peer: peer.to_owned(),
                reason,
            })
            .get()
    }

    /// Polls not made for `reason`, every peer's.
    pub fn skipped(&self, reason: SkipReason) -> u64 {
        self.ledger
            .snapshot()
            .iter()
            .map(|(peer, _)| self.skipped_of(peer, reason))
            .sum()
    }

    fn skip(&self, peer: &str, reason: SkipReason) {
        self.ledger.skipped(peer, Some(reason));
        self.skipped
            .get_or_create(&SkipLabels {
                peer: peer.to_owned(),
                reason,
            })
            .inc();
    }

    fn record(&self, peer: &str, outcome: PollOutcome, at_ms: u64) {
        let result = match outcome {
            PollOutcome::Ok => "ok",
            other => other.as_str(),
        };
        self.ledger.exchange(peer, "poll", result, at_ms);
        self.polls
            .get_or_create(&PollLabels {
                peer: peer.to_owned(),
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// Polls of `peer` that ended with `outcome`.
    pub fn count(&self, peer: &str, outcome: PollOutcome) -> u64 {
        self.polls
            .get_or_create(&PollLabels {
                peer: peer.to_owned(),
                outcome: outcome.as_str(),
            })
            .get()
    }
}

/// The pause before retry `attempt + 1`: [`RETRY_BACKOFF`] doubled per attempt, scaled
/// by a random factor in [0.5, 1.5) so peers that failed together do not retry together.
pub fn retry_backoff(attempt: u32, rng: &mut impl Rng) -> Duration {
    (RETRY_BACKOFF * 2u32.pow(attempt)).mul_f64(rng.random_range(0.5..1.5))
}

/// One peer's poller.
#[derive(Clone, Debug)]
pub struct PeerPoller {
    /// The peer (its URL: where it is polled first).
    pub peer: PeerConfig,
    /// Where it is polled when its URL does not answer: the configured URL, while it is
    /// polled at the host membership advertises for it and that differs. An advertised
    /// host is tried, not trusted blindly: a member can gossip a wrong one.
    pub fallback: Option<http::Uri>,
    /// mTLS client configuration accepting only this peer's certificate.
    pub tls: Arc<ClientConfig>,
    /// Where bodies go.
    pub signals: SharedSignals,
    /// Poll outcomes.
    pub metrics: PollMetrics,
    /// Ingest drops.
    pub ingest: IngestMetrics,
    /// Poll interval.
    pub interval: Duration,
    /// The wall clock polled readings are stamped against.
    pub clock: Clock,
}

impl PeerPoller {
    /// Polls forever: a bounded long poll ([`grid_signals::long_poll`]) answered early when
    /// the peer's readiness changes, once the peer states its readiness generation; at
    /// the interval, as a plain poll, while it states none (an older operator) or fails.
    pub async fn run(self) {
        let mut rng = SmallRng::from_os_rng();
        let mut schedule = LongPoll::new(self.interval.as_millis() as u64);
        // The schedule's clock: tokio's, so a test with paused time drives it.
        let base = tokio::time::Instant::now();
        let ms = || base.elapsed().as_millis() as u64;
        let mut next = 0;
        loop {
            tokio::time::sleep_until(base + Duration::from_millis(next)).await;
            schedule.started(ms());
            let (outcome, generation) = self.poll_once(&mut rng, schedule.wait()).await;
            let now = ms();
            next = if outcome == PollOutcome::Ok {
                schedule.answered(now, generation)
            } else {
                tracing::debug!(peer = %self.peer.name, outcome = outcome.as_str(), "peer poll failed");
                schedule.failed(now)
            };
        }
    }

    /// One poll with its bounded, jittered retries; each attempt tries the peer's URL,
    /// then its fallback when that failed; retries stop when another attempt could not
    /// finish within the poll interval. With `wait` the first attempt is a long poll
    /// (bounded by the peer's timeout plus the wait); retries are plain. Returns how it
    /// ended and the readiness generation the answer stated.
    pub async fn poll_once(
        &self,
        rng: &mut impl Rng,
        wait: Option<Wait>,
    ) -> (PollOutcome, Option<u64>) {
        let primary = if self.fallback.is_some() {
            PollTarget::Advertised
        } else {
            PollTarget::Configured
        };
        let mut targets = vec![(self.peer.url.clone(), primary)];
        if let Some(url) = self.fallback.clone() {
            targets.push((url, PollTarget::Configured));
        }
        let started = clock::monotonic();
        let mut last = ScrapeFailure::Connect;
        for attempt in 0..MAX_POLL_ATTEMPTS {
            let wait = wait.filter(|_| attempt == 0);
            for (url, kind) in &targets {
                let target = FetchTarget::new(
                    with_wait(url, wait),
                    poll_budget(self.peer.timeout, wait),
                    Some(self.tls.clone()),
                );
                match fetch(&target).await {
                    Ok(fetched) => {
                        let Some(date_ms) = fetched.date_ms else {
                            self.metrics.record(
                                &self.peer.name,
                                PollOutcome::NoDate,
                                self.clock.wall_ms(),
                            );
                            return (PollOutcome::NoDate, None);
                        };
                        // Counted before the rows become visible, so whoever sees them
                        // also sees the poll that brought them.
                        self.metrics
                            .record(&self.peer.name, PollOutcome::Ok, self.clock.wall_ms());
                        self.metrics
                            .answers
                            .get_or_create(&AnswerLabels {
                                peer: self.peer.name.clone(),
                                target: *kind,
                            })
                            .inc();
                        ingest_peer_body(
                            &self.signals,
                            &self.ingest,
                            self.clock.wall_ms(),
                            grid_signals::site::SiteInput::PeerBody {
                                peer: &self.peer.name,
                                body: &fetched.body,
                                date_ms,
                            },
                        );
                        return (PollOutcome::Ok, fetched.readiness_generation);
                    }
                    Err(failure) => last = failure.class,
                }
            }
            let backoff = retry_backoff(attempt, rng);
            let retry_fits = started.elapsed() + backoff + self.peer.timeout * targets.len() as u32
                <= self.interval;
            if attempt + 1 == MAX_POLL_ATTEMPTS || !retry_fits {
                break;
            }
            tokio::time::sleep(backoff).await;
        }
        let outcome = PollOutcome::Failed(last);
        self.metrics
            .record(&self.peer.name, outcome, self.clock.wall_ms());
        (outcome, None)
    }
}

/// Builds the poller of a live member no configured peer names, polled at the URL given,
/// or `None` when this site cannot verify it. In SPIFFE mode every site of the trust
/// domain is a peer, so a member that joined through a seed is polled like a configured
/// one; in pin mode only pinned sites can join at all.
pub type Adopt = Arc<dyn Fn(&str, http::Uri) -> Option<PeerPoller> + Send + Sync>;

/// Where one member is polled: first `url`, then `fallback` when that fails.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Polled {
    name: String,
    url: http::Uri,
    fallback: Option<http::Uri>,
}

/// Runs one poller per member to poll, where membership says it is: every configured
/// peer, and every live member no configured peer names.
///
/// Membership never makes a configured peer unmeasured: while it is live it is polled at
/// its SWIM-advertised host and signals port ([`grid_membership::Member::signals_url`])
/// and, when that fails, at its configured URL; while SWIM reads it as down (UDP lost on
/// the path while its TCP signals endpoint answers) or has not heard of it, at its
/// configured URL. `grid_operator_peer_poll_answers_total{peer,target}` counts which
/// answered. A live member no configured peer names is polled at its advertised address
/// through `adopt`; once declared down it has no other address to try and is not polled
/// until it is live again, its rows ageing out: every `interval` it is not polled counts
/// one skipped poll (`member_down` in `grid_operator_peer_polls_skipped_total{peer}`), so
/// the rate of skips reads as the polls it misses.
pub async fn run_peer_set(
    pollers: Vec<PeerPoller>,
    adopt: Adopt,
    mut view: tokio::sync::watch::Receiver<crate::membership::View>,
    metrics: PollMetrics,
    interval: Duration,
) {
    // Owned here, so aborting this task aborts every poller it started.
    let mut tasks = tokio::task::JoinSet::new();
    let mut running: std::collections::HashMap<String, (Polled, tokio::task::AbortHandle)> =
        std::collections::HashMap::new();
    // Members not polled now, and why: each poll interval they stay so is a poll skipped.
    let mut skipped: std::collections::BTreeMap<String, SkipReason> =
        std::collections::BTreeMap::new();
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut following = true;
    loop {
        while tasks.try_join_next().is_some() {}
        let (desired, down) = polled(&pollers, &view.borrow_and_update());
        let mut now_skipped: std::collections::BTreeMap<String, SkipReason> = down
            .into_iter()
            .map(|name| (name, SkipReason::MemberDown))
            .collect();
        running.retain(|name, (was, task)| {
            let keep = desired.iter().any(|p| p.name == *name && p == was);
            if !keep {
                task.abort();
            }
            keep
        });
        for target in desired {
            if running.contains_key(&target.name) {
                continue;
            }
            let configured = pollers.iter().find(|p| p.peer.name == target.name).cloned();
            let Some(mut poller) = configured.or_else(|| adopt(&target.name, target.url.clone()))
            else {
                now_skipped.insert(target.name.clone(), SkipReason::Unverifiable);
                continue;
            };
            poller.peer.url = target.url.clone();
            poller.fallback.clone_from(&target.fallback);
            tracing::debug!(peer = %target.name, url = %target.url, "polling peer");
            running.insert(target.name.clone(), (target, tasks.spawn(poller.run())));
        }
        // A member newly not polled counts its first skipped poll now, one more per
        // interval while it stays so; one polled again is no longer skipped.
        for (name, reason) in &now_skipped {
            if skipped.get(name) != Some(reason) {
                tracing::debug!(peer = %name, reason = reason.as_str(), "member not polled until that changes");
                metrics.skip(name, *reason);
            }
        }
        for name in skipped.keys().filter(|n| !now_skipped.contains_key(*n)) {
            metrics.ledger.skipped(name, None);
        }
        skipped = now_skipped;
        loop {
            tokio::select! {
                changed = view.changed(), if following => {
                    // Membership ended (or never ran): the pollers keep going as they are.
                    following = changed.is_ok();
                    if following {
                        break;
                    }
                }
                _ = ticker.tick() => {
                    for (name, reason) in &skipped {
                        metrics.skip(name, *reason);
                    }
                }
            }
        }
    }
}

/// Who is polled, and where, under `view` (see [`run_peer_set`]); and the members not
/// polled because they were declared down with no configured URL.
fn polled(pollers: &[PeerPoller], view: &crate::membership::View) -> (Vec<Polled>, Vec<String>) {
    let configured = pollers.iter().map(|p| {
        let name = p.peer.name.clone();
        let advertised = view
            .live
            .get(&name)
            .and_then(|m| m.signals_url().parse::<http::Uri>().ok());
        match advertised {
            Some(url) if url != p.peer.url => Polled {
                name,
                url,
                fallback: Some(p.peer.url.clone()),
            },
            _ => Polled {
                name,
                url: p.peer.url.clone(),
                fallback: None,
            },
        }
    });
    let is_configured = |site: &str| pollers.iter().any(|p| p.peer.name == site);
    let adopted = view
        .live
        .values()
        .filter(|m| !is_configured(&m.site))
        .filter_map(|m| {
            Some(Polled {
                name: m.site.clone(),
                url: m.signals_url().parse().ok()?,
                fallback: None,
            })
        });
    let down = view
        .down
        .iter()
        .filter(|site| !is_configured(site))
        .cloned()
        .collect();
    (configured.chain(adopted).collect(), down)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use grid_signals::site::{Site, SiteConfig};
    use grid_signals::store::StoreConfig;
    use rustls::RootCertStore;

    use super::*;
    use grid_daemon::tls::{Identity, TlsMaterial, Trust, client_config};
    use grid_kit::pki::Ca;

    #[test]
    fn backoff_doubles_and_stays_within_its_jitter() {
        let mut rng = SmallRng::seed_from_u64(7);
        for attempt in 0..MAX_POLL_ATTEMPTS {
            let base = RETRY_BACKOFF * 2u32.pow(attempt);
            for _ in 0..100 {
                let b = retry_backoff(attempt, &mut rng);
                assert!(b >= base.mul_f64(0.5) && b < base.mul_f64(1.5), "{b:?}");
            }
        }
    }

    /// A "peer" that accepts and immediately closes every connection, counting them.
    async fn slamming_peer() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                drop(tcp);
            }
        });
        (addr, accepted)
    }

    fn poller(addr: std::net::SocketAddr, interval: Duration) -> PeerPoller {
        let ca = Ca::new("ca");
        let cert = ca.site("grid.test", "a");
        let mut roots = RootCertStore::empty();
        roots.add(ca.cert()).unwrap();
        let trust = Arc::new(Trust::spiffe("a", "grid.test", roots.clone()));
        let material = TlsMaterial {
            chain: vec![cert.cert.clone()],
            key: cert.key(),
            roots,
        };
        PeerPoller {
            peer: PeerConfig {
                name: "b".into(),
                url: format!("https://127.0.0.1:{}/v1/site/signals", addr.port())
                    .parse()
                    .unwrap(),
                fingerprints: Vec::new(),
                timeout: Duration::from_millis(500),
            },
            clock: Clock::system(),
            tls: client_config(&material, trust, Identity::Peer("b".into())).unwrap(),
            signals: SharedSignals::new(Site::new(
                SiteConfig {
                    site: "a".into(),
                    epoch: 1,
                    scrape_interval_ms: 1_000,
                    store: StoreConfig::default(),
                },
                &[],
                0,
            )),
            metrics: PollMetrics::default(),
            ingest: IngestMetrics::default(),
            interval,
            fallback: None,
        }
    }

    fn member(site: &str, host: &str, port: u16) -> grid_membership::Member {
        grid_membership::Member {
            site: site.into(),
            host: host.into(),
            signals_port: port,
            gossip_port: port,
            incarnation: 1,
        }
    }

    #[test]
    fn membership_never_leaves_a_configured_peer_unpolled_and_an_advertised_host_is_only_tried_first()
     {
        let p = poller("127.0.0.1:9".parse().unwrap(), Duration::from_secs(1));
        let configured = p.peer.url.clone();
        let pollers = vec![p];
        let mut view = crate::membership::View::default();
        // Not heard of: the configured URL alone.
        let (polled_now, down) = polled(&pollers, &view);
        assert_eq!(polled_now[0].url, configured);
        assert_eq!((polled_now[0].fallback.as_ref(), down.len()), (None, 0));
        // Live elsewhere: there first, then the configured URL.
        view.live.insert("b".into(), member("b", "10.1.1.1", 4000));
        let (polled_now, _) = polled(&pollers, &view);
        assert_eq!(
            polled_now[0].url.to_string(),
            "https://10.1.1.1:4000/v1/site/signals"
        );
        assert_eq!(polled_now[0].fallback.as_ref(), Some(&configured));
        // Live where configured: no fallback to try.
        view.live.insert("b".into(), member("b", "127.0.0.1", 9));
        assert_eq!(polled(&pollers, &view).0[0].fallback, None);
        // Declared down: still polled, at the configured URL.
        view.live.clear();
        view.down.insert("b".into());
        let (polled_now, down) = polled(&pollers, &view);
        assert_eq!((polled_now.len(), &polled_now[0].url), (1, &configured));
        assert!(down.is_empty());
        // A member no configuration names: polled while live, skipped once down.
        view.live.insert("c".into(), member("c", "10.1.1.2", 4000));
        assert_eq!(polled(&pollers, &view).0.len(), 2);
        view.live.remove("c");
        view.down.insert("c".into());
        let (polled_now, down) = polled(&pollers, &view);
        assert_eq!((polled_now.len(), down), (1, vec!["c".to_owned()]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_declared_down_counts_one_skipped_poll_per_interval_by_name_until_it_is_back()
    {
        let mut view = crate::membership::View::default();
        view.down.insert("c".into());
        let (tx, rx) = tokio::sync::watch::channel(view);
        let metrics = PollMetrics::default();
        let adopt: Adopt = Arc::new(|_, _| None);
        let interval = Duration::from_secs(1);
        let task = tokio::spawn(run_peer_set(
            Vec::new(),
            adopt,
            rx,
            metrics.clone(),
            interval,
        ));
        // Decided at once, then one more per interval it stays down.
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(metrics.skipped_of("c", SkipReason::MemberDown), 1);
        tokio::time::sleep(interval * 3).await;
        assert_eq!(metrics.skipped_of("c", SkipReason::MemberDown), 4);
        assert_eq!(metrics.skipped(SkipReason::MemberDown), 4);
        let ledger = metrics.ledger.snapshot();
        assert_eq!(ledger[0].1.skipped, Some(SkipReason::MemberDown));
        // Live again (with no address this site can verify, here): no longer skipped as
        // down, and the evidence says so.
        tx.send_modify(|v| {
            v.down.clear();
        });
        tokio::time::sleep(interval * 2).await;
        assert_eq!(metrics.skipped_of("c", SkipReason::MemberDown), 4);
        assert_eq!(metrics.ledger.snapshot()[0].1.skipped, None);
        task.abort();
    }

    #[tokio::test]
    async fn a_failing_peer_is_tried_at_most_max_poll_attempts_times() {
        let (addr, accepted) = slamming_peer().await;
        let p = poller(addr, Duration::from_secs(30));
        let (outcome, _) = p.poll_once(&mut SmallRng::seed_from_u64(1), None).await;
        assert!(matches!(outcome, PollOutcome::Failed(_)), "{outcome:?}");
        assert_eq!(accepted.load(Ordering::SeqCst), MAX_POLL_ATTEMPTS as usize);
        assert_eq!(p.metrics.count("b", outcome), 1);
    }

    #[tokio::test]
    async fn no_retry_is_started_that_could_not_finish_within_the_interval() {
        let (addr, accepted) = slamming_peer().await;
        // One attempt may take the whole 500 ms timeout: no retry fits in 600 ms.
        let p = poller(addr, Duration::from_millis(600));
        let (outcome, _) = p.poll_once(&mut SmallRng::seed_from_u64(1), None).await;
        assert!(matches!(outcome, PollOutcome::Failed(_)));
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }
}
