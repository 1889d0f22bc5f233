//! Polls each peer operator's `GET /v1/site/signals` over mutual TLS.
//!
//! Every peer has its own task and its own ticker, so a peer that hangs, refuses or is
//! untrusted only delays and ages out its own readings. Each body is attributed to the
//! identity the connection verified (the client configuration accepts only that peer's
//! certificate), and the store drops any row naming another site.

use std::sync::Arc;
use std::time::Duration;

use grid_signals::epp::ScrapeFailure;
use grid_signals::store::IngestMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use rand::{Rng, SeedableRng, rngs::SmallRng};
use rustls::ClientConfig;

use crate::clock;
use crate::config::PeerConfig;
use crate::scrape::{ScrapeTarget, fetch};
use crate::signals::{SharedSignals, lock};

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

/// `grid_operator_peer_polls_total{peer,outcome}`.
#[derive(Clone, Debug, Default)]
pub struct PollMetrics {
    polls: Family<PollLabels, Counter>,
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
        m
    }

    fn record(&self, peer: &str, outcome: PollOutcome) {
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

/// One peer's poller.
#[derive(Clone, Debug)]
pub struct PeerPoller {
    /// The peer.
    pub peer: PeerConfig,
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
}

impl PeerPoller {
    /// Polls at the interval forever.
    pub async fn run(self) {
        let mut rng = SmallRng::from_os_rng();
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let outcome = self.poll_once(&mut rng).await;
            if outcome != PollOutcome::Ok {
                tracing::debug!(peer = %self.peer.name, outcome = outcome.as_str(), "peer poll failed");
            }
        }
    }

    /// One poll with its bounded, jittered retries; retries stop when another attempt
    /// could not finish within the poll interval.
    pub async fn poll_once(&self, rng: &mut impl Rng) -> PollOutcome {
        let target = ScrapeTarget {
            url: self.peer.url.clone(),
            timeout: self.peer.timeout,
            tls: Some(self.tls.clone()),
        };
        let started = clock::monotonic();
        let mut last = ScrapeFailure::Connect;
        for attempt in 0..MAX_POLL_ATTEMPTS {
            match fetch(&target).await {
                Ok(fetched) => {
                    let outcome = match fetched.date_ms {
                        Some(date_ms) => {
                            let now = clock::wall_ms();
                            let report = lock(&self.signals).ingest_peer(
                                &self.peer.name,
                                &fetched.body,
                                date_ms,
                                now,
                            );
                            self.ingest.record(&report);
                            PollOutcome::Ok
                        }
                        None => PollOutcome::NoDate,
                    };
                    self.metrics.record(&self.peer.name, outcome);
                    return outcome;
                }
                Err(failure) => last = failure,
            }
            let backoff = RETRY_BACKOFF * 2u32.pow(attempt);
            let backoff = backoff.mul_f64(rng.random_range(0.5..1.5));
            let retry_fits = started.elapsed() + backoff + self.peer.timeout <= self.interval;
            if attempt + 1 == MAX_POLL_ATTEMPTS || !retry_fits {
                break;
            }
            tokio::time::sleep(backoff).await;
        }
        let outcome = PollOutcome::Failed(last);
        self.metrics.record(&self.peer.name, outcome);
        outcome
    }
}
