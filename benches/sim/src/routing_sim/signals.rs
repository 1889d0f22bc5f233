//! How load signals reach the simulated gateway: only at the real cadences and only
//! through the real code.
//!
//! ```text
//! every 1 s, per site:  FakeEpp text --Site::handle(Scraped)--> that site's operator
//!                       (grid_signals::site::Site, as grid-operatord runs it)
//! every 5 s, per peer:  peer Site --relay(Peer)--> body --handle(PeerBody)--> home Site
//! every 1 s:            home Site --relay(Local)--> body --Refresher::ingest--> gateway store
//!                       --Refresher::refresh--> RoutingView (grid_score::refresh, as
//!                       grid-gatewayd runs it)
//! each answer:          live slot --Refresher::refresh_live (off-cycle, rate-limited)
//! ```
//!
//! The home site is the gateway's own: its operator scrapes it itself; the others are
//! remote and reach the home operator only through its 5 s peer poll.

use std::sync::Arc;

use grid_score::catalog::{CandidateSpec, Catalog, ModelSpec};
use grid_score::live::FlowObservation;
use grid_score::refresh::Refresher;
use grid_score::routing::RoutingView;
use grid_score::{CandidateKey, Reading, RouteTable, ScoreConfig, from_store};
use grid_signals::epp::PoolSelector;
use grid_signals::site::{Audience, ProviderSpec, Site, SiteConfig, SiteInput, SiteOutput};
use grid_signals::store::{RelayBudget, StoreConfig};

use crate::fake_epp::{EppIdentity, FakeEpp};
use crate::site_model::SiteModel;

/// Scrape interval of every operator, and the gateway's poll of its own operator (ms).
pub const LOCAL_CADENCE_MS: u64 = 1_000;
/// The home operator's poll of each peer operator (ms).
pub const PEER_CADENCE_MS: u64 = 5_000;
/// Where in each second the gateway polls its operator, after the scrapes (ms).
pub const GATEWAY_POLL_PHASE_MS: u64 = 500;
/// The model every simulated site serves.
pub const MODEL: &str = "llama";
/// The wall clock at virtual time 0 (ms since the Unix epoch): the pure crates take
/// wall-clock stamps.
pub const EPOCH_MS: u64 = 1_700_000_000_000;

/// One site's operator: its EPP and the operator's own site machine (grid-signals'
/// [`Site`], as the operator daemon runs it).
struct SiteOperator {
    epp: FakeEpp,
    site: Site,
    /// Virtual-time offset of its peer poll within the 5 s period (remote sites only).
    peer_phase_ms: u64,
}

/// Counters of the signal path, to check that signals flowed and nothing was refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SignalCounts {
    /// Scrapes taken.
    pub scrapes: u64,
    /// Batches published.
    pub batches: u64,
    /// Peer polls ingested by the home operator.
    pub peer_polls: u64,
    /// Gateway polls (each followed by a refresh).
    pub gateway_polls: u64,
    /// Lines any store refused.
    pub dropped: u64,
    /// Readings the scorer refused.
    pub refused_readings: u64,
}

impl SignalCounts {
    /// Adds another path's counters (one path per gateway).
    pub fn add(&mut self, other: Self) {
        self.scrapes += other.scrapes;
        self.batches += other.batches;
        self.peer_polls += other.peer_polls;
        self.gateway_polls += other.gateway_polls;
        self.dropped += other.dropped;
        self.refused_readings += other.refused_readings;
    }
}

/// Every operator (the home one among them) and the gateway's routing core.
pub struct SignalPath {
    operators: Vec<SiteOperator>,
    home: usize,
    keys: Vec<CandidateKey>,
    refresher: Refresher,
    view: RoutingView,
    readings: Vec<Option<Reading>>,
    counts: SignalCounts,
    body: Vec<u8>,
    /// What answers said, in the order they reach the gateway: (virtual ms, site).
    heard: Vec<(u64, usize, Heard)>,
}

/// What one answer told the gateway about its site, as the gateway's request path reads
/// it (`docs/gateway.md`, "Live room from the answers").
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Heard {
    /// An answer's head: its flow-control headers, and whether it was a 5xx.
    Answer {
        /// The flow-control headers it carried.
        flow: FlowObservation,
        /// 5xx: a serving failure.
        server_error: bool,
    },
    /// The exchange failed (reset, refused connection).
    Failed,
    /// A streamed answer's first byte, `ms` after it went out (flow-control wait
    /// excluded).
    FirstByte {
        /// Time to first byte, ms.
        ms: u64,
    },
    /// A streamed answer ended, `held_ms` after its first byte.
    Served {
        /// First byte to last, ms.
        held_ms: u64,
    },
}

impl std::fmt::Debug for SignalPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignalPath")
            .field("counts", &self.counts)
            .finish_non_exhaustive()
    }
}

impl SignalPath {
    /// A path for sites named `names`, site `home` being the gateway's own.
    pub fn new(names: &[String], home: usize) -> Self {
        let store = StoreConfig::default();
        let remote_count = (names.len() - 1).max(1) as u64;
        let mut remote_seen = 0;
        let operators = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let peer_phase_ms = if i == home {
                    0
                } else {
                    // Peers are polled at staggered points of the 5 s period, on scrape
                    // seconds, as independent timers would drift apart.
                    remote_seen += 1;
                    (remote_seen * PEER_CADENCE_MS / (remote_count + 1)) / LOCAL_CADENCE_MS
                        * LOCAL_CADENCE_MS
                };
                let provider = ProviderSpec {
                    name: MODEL.into(),
                    uid: format!("uid-{name}"),
                    generation: 1,
                    pool: PoolSelector::All,
                    stale_metrics_ms: None,
                };
                let config = SiteConfig {
                    site: name.clone(),
                    epoch: EPOCH_MS,
                    scrape_interval_ms: LOCAL_CADENCE_MS,
                    store,
                };
                SiteOperator {
                    epp: FakeEpp::new(EppIdentity::new(name.clone(), MODEL)),
                    site: Site::new(config, &[provider], EPOCH_MS),
                    peer_phase_ms,
                }
            })
            .collect();
        let keys: Vec<CandidateKey> = names
            .iter()
            .map(|n| CandidateKey::new(n.as_str(), MODEL))
            .collect();
        let catalog = Catalog::new(&[ModelSpec {
            name: MODEL.into(),
            candidates: names
                .iter()
                .map(|n| CandidateSpec {
                    site: n.clone(),
                    provider: MODEL.into(),
                    scheme: "http".into(),
                    authority: format!("{n}.sim"),
                    prefix: String::new(),
                })
                .collect(),
        }]);
        let mut refresher = Refresher::new(Arc::new(catalog), ScoreConfig::default(), store, None);
        let view = refresher.refresh(EPOCH_MS).view;
        Self {
            heard: Vec::new(),
            readings: vec![None; names.len()],
            operators,
            home,
            keys,
            refresher,
            view,
            counts: SignalCounts::default(),
            body: Vec::with_capacity(64 * 1024),
        }
    }

    /// The first signal instant (a scrape second or a gateway poll) after `t_ms`.
    pub fn next_instant_after(t_ms: u64) -> u64 {
        let second = t_ms / LOCAL_CADENCE_MS * LOCAL_CADENCE_MS;
        if t_ms < second + GATEWAY_POLL_PHASE_MS {
            second + GATEWAY_POLL_PHASE_MS
        } else {
            second + LOCAL_CADENCE_MS
        }
    }

    /// Runs whatever the signal path does at virtual time `t_ms` (a value returned by
    /// [`Self::next_instant_after`]): scrapes and peer polls on the second, the gateway
    /// poll and refresh at [`GATEWAY_POLL_PHASE_MS`].
    pub fn at(&mut self, t_ms: u64, sites: &[SiteModel]) {
        let now = EPOCH_MS + t_ms;
        if t_ms.is_multiple_of(LOCAL_CADENCE_MS) {
            // Peers first: a peer poll reads what the peer scraped a second ago, on
            // average half a second staler than independent timers would.
            self.poll_peers(t_ms, now);
            self.scrape_all(now, sites);
        } else if t_ms % LOCAL_CADENCE_MS == GATEWAY_POLL_PHASE_MS {
            self.gateway_poll(now);
        }
    }

    fn scrape_all(&mut self, now: u64, sites: &[SiteModel]) {
        for (op, site) in self.operators.iter_mut().zip(sites) {
            self.body.clear();
            op.epp.render_into(site, &mut self.body);
            op.site.handle(now, SiteInput::Expire);
            op.site.handle(
                now,
                SiteInput::Scraped {
                    provider: 0,
                    outcome: Ok(&self.body),
                    latest_pass_ms: 0,
                },
            );
            drain(&mut op.site, &mut self.counts);
        }
    }

    fn poll_peers(&mut self, t_ms: u64, now: u64) {
        for i in 0..self.operators.len() {
            if i == self.home || t_ms % PEER_CADENCE_MS != self.operators[i].peer_phase_ms {
                continue;
            }
            self.body.clear();
            let peer = &self.operators[i].site;
            peer.relay(
                Audience::Peer,
                now,
                now,
                RelayBudget::default(),
                &mut self.body,
            );
            let name = peer.config().site.clone();
            let home = &mut self.operators[self.home].site;
            home.handle(
                now,
                SiteInput::PeerBody {
                    peer: &name,
                    body: &self.body,
                    date_ms: now,
                },
            );
            self.counts.peer_polls += 1;
            drain(home, &mut self.counts);
        }
    }

    fn gateway_poll(&mut self, now: u64) {
        self.body.clear();
        let home = &mut self.operators[self.home].site;
        home.handle(now, SiteInput::Expire);
        home.relay(
            Audience::Local,
            now,
            now,
            RelayBudget::default(),
            &mut self.body,
        );
        let report = self.refresher.ingest(&self.body, now, now);
        self.counts.gateway_polls += 1;
        self.counts.dropped += report.dropped.total();
        self.refresh(now);
    }

    /// The gateway's control step, as the gateway runs it: the store's events reset or
    /// forget learners, every entry's newest instant is observed, a new table is built.
    /// An answer from site `site` reaches the gateway at virtual `at_ms` (it is read
    /// then, not before: see [`Self::settle`]).
    pub fn hear(&mut self, at_ms: u64, site: usize, heard: Heard) {
        self.heard.push((at_ms, site, heard));
    }

    /// Hands every answer that reached the gateway by `t_ms` to the live slots, as the
    /// request path does, and refreshes off-cycle when one said something new, as the
    /// gateway's poller does (grid-score's [`Refresher::refresh_live`]: at most once per
    /// [`grid_score::refresh::LIVE_REFRESH_MIN_INTERVAL_MS`]).
    pub fn settle(&mut self, t_ms: u64) {
        let mut i = 0;
        while i < self.heard.len() {
            let (at, site, heard) = self.heard[i];
            if at > t_ms {
                i += 1;
                continue;
            }
            self.heard.swap_remove(i);
            let Some(slot) = self.refresher.catalog().live().slot(&self.keys[site]) else {
                continue;
            };
            // As the gateway does, only an answer that says something new about room or
            // serving wakes a refresh; a plain answer is counted at the next one.
            let wakes = match heard {
                Heard::Answer { flow, server_error } => {
                    slot.record_room(EPOCH_MS + at, &flow);
                    if server_error {
                        slot.record_failure();
                    } else {
                        slot.record_answer();
                    }
                    server_error || flow.has_room_signal()
                }
                Heard::Failed => {
                    slot.record_failure();
                    true
                }
                Heard::Served { held_ms } => {
                    slot.record_served(held_ms);
                    false
                }
                Heard::FirstByte { ms } => {
                    slot.record_first_byte(ms);
                    false
                }
            };
            if wakes {
                self.refresher.wake_live();
            }
        }
        if let Some(refreshed) = self.refresher.refresh_live(EPOCH_MS + t_ms) {
            self.view = refreshed.view;
        }
    }

    fn refresh(&mut self, now: u64) {
        let refreshed = self.refresher.refresh(now);
        self.counts.refused_readings += refreshed.refused.len() as u64;
        for (i, key) in self.keys.iter().enumerate() {
            self.readings[i] = self
                .refresher
                .store()
                .entry(&key.site, &key.provider)
                .and_then(|entry| from_store::reading_of(entry, now));
        }
        self.view = refreshed.view;
    }

    /// The routing table the last refresh built.
    pub fn table(&self) -> &RouteTable {
        self.view.table()
    }

    /// What the gateway last read for site `i`, if anything.
    pub fn reading(&self, i: usize) -> Option<&Reading> {
        self.readings[i].as_ref()
    }

    /// The candidate keys, in site order.
    pub fn keys(&self) -> &[CandidateKey] {
        &self.keys
    }

    /// Counters so far.
    pub fn counts(&self) -> SignalCounts {
        self.counts
    }
}

/// Counts what a site machine said of the inputs just handled.
fn drain(site: &mut Site, counts: &mut SignalCounts) {
    while let Some(output) = site.poll() {
        match output {
            SiteOutput::Scraped { .. } => counts.scrapes += 1,
            SiteOutput::Published { report, .. } => {
                counts.batches += 1;
                counts.dropped += report.dropped.total();
            }
            SiteOutput::PeerIngested { report } | SiteOutput::Withdrawn { report, .. } => {
                counts.dropped += report.dropped.total();
            }
            SiteOutput::NotPublished { error, .. } => {
                panic!("simulated names and values are within the wire rules: {error}")
            }
        }
    }
}
