//! How load signals reach the simulated gateway: only at the real cadences and only
//! through the real code.
//!
//! ```text
//! every 1 s, per site:  FakeEpp text --exposition::parse_strict--> epp::ProviderTracker
//!                       --publication--> Batch (epoch, sequence) --> that site's operator store
//! every 5 s, per peer:  peer store --encode_relay--> body --Store::ingest(Peer)--> home operator store
//! every 1 s:            home store --encode_relay--> body --Store::ingest(Local)--> gateway store
//!                       --grid_score::from_store::sync--> Scorer --refresh--> RouteTable
//! ```
//!
//! Sites marked local are scraped by the home operator itself (the gateway's own site);
//! the others are remote and reach the home operator only through its 5 s peer poll.

use grid_score::live::{FlowObservation, LiveBoard};
use grid_score::{CandidateKey, Reading, RouteTable, Routes, ScoreConfig, Scorer, from_store};
use grid_signals::batch::{Batch, BatchMeta, Fence, Row};
use grid_signals::epp::{
    PoolSelector, ProviderConfig, ProviderTracker, PublishedSample, ScrapeInput, ScrapeTiming,
    StaleWindow,
};
use grid_signals::exposition::parse_strict;
use grid_signals::store::{IngestReport, RelayBudget, Sender, Store, StoreConfig};

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

/// One site's operator side: its EPP, its tracker and its place in the batch order.
struct SiteOperator {
    epp: FakeEpp,
    tracker: ProviderTracker,
    window: StaleWindow,
    sequence: u64,
    /// Where its batches go first: the home store for a local site, else its own.
    local: bool,
    /// A remote site's own operator store (what its peers poll).
    own: Store,
    /// Virtual-time offset of its peer poll within the 5 s period.
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

/// Every operator, the home operator's store, the gateway's store and its scorer.
pub struct SignalPath {
    operators: Vec<SiteOperator>,
    keys: Vec<CandidateKey>,
    home: Store,
    gateway: Store,
    scorer: Scorer,
    routes: Routes,
    table: RouteTable,
    readings: Vec<Option<Reading>>,
    counts: SignalCounts,
    body: Vec<u8>,
    live: LiveBoard,
    /// What answers said, in the order they reach the gateway: (virtual ms, site).
    heard: Vec<(u64, usize, Heard)>,
    last_live_refresh: Option<u64>,
    /// Answers handed to the slots but not yet folded into the table.
    unfolded: bool,
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

/// The least time between two refreshes that answers trigger, as the gateway's poller
/// keeps it (`grid_gatewayd::poller::LIVE_REFRESH_MIN_INTERVAL`).
pub const LIVE_REFRESH_MIN_INTERVAL_MS: u64 = 50;

impl std::fmt::Debug for SignalPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignalPath")
            .field("counts", &self.counts)
            .finish_non_exhaustive()
    }
}

impl SignalPath {
    /// A path for sites named `names`, `local[i]` saying whether site `i` is the
    /// gateway's own.
    pub fn new(names: &[String], local: &[bool]) -> Self {
        let timing = ScrapeTiming {
            interval_ms: LOCAL_CADENCE_MS,
            stale_metrics_ms: None,
            signal_ttl_ms: StoreConfig::default().ttl_ms,
        };
        let remote_count = local.iter().filter(|l| !**l).count().max(1) as u64;
        let mut remote_seen = 0;
        let operators = names
            .iter()
            .zip(local)
            .map(|(name, &local)| {
                let peer_phase_ms = if local {
                    0
                } else {
                    // Peers are polled at staggered points of the 5 s period, on scrape
                    // seconds, as independent timers would drift apart.
                    remote_seen += 1;
                    (remote_seen * PEER_CADENCE_MS / (remote_count + 1)) / LOCAL_CADENCE_MS
                        * LOCAL_CADENCE_MS
                };
                SiteOperator {
                    epp: FakeEpp::new(EppIdentity::new(name.clone(), MODEL)),
                    tracker: ProviderTracker::new(
                        ProviderConfig {
                            site: name.clone(),
                            provider: MODEL.into(),
                            pool: PoolSelector::All,
                        },
                        EPOCH_MS,
                    ),
                    window: timing.window(0),
                    sequence: 1,
                    local,
                    own: Store::new(StoreConfig::default()),
                    peer_phase_ms,
                }
            })
            .collect();
        let keys: Vec<CandidateKey> = names
            .iter()
            .map(|n| CandidateKey::new(n.as_str(), MODEL))
            .collect();
        let routes = Routes::new().with(MODEL, keys.clone());
        let mut scorer = Scorer::new(ScoreConfig::default());
        let table = scorer.refresh(EPOCH_MS, &routes);
        let live = LiveBoard::new(&keys);
        Self {
            live,
            heard: Vec::new(),
            last_live_refresh: None,
            unfolded: false,
            readings: vec![None; names.len()],
            operators,
            keys,
            home: Store::new(StoreConfig::default()),
            gateway: Store::new(StoreConfig::default()),
            scorer,
            routes,
            table,
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
        if t_ms % LOCAL_CADENCE_MS == 0 {
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
            let samples = parse_strict(&self.body).expect("the fake EPP writes strict text");
            op.tracker.handle(now, ScrapeInput::Parsed(&samples));
            self.counts.scrapes += 1;
            let published = op.tracker.publication(now, op.window);
            let batch = frame(&op.tracker, op.sequence, now, &published);
            op.sequence += 1;
            self.counts.batches += 1;
            let mut report = IngestReport::default();
            let store = if op.local {
                &mut self.home
            } else {
                &mut op.own
            };
            store.expire(now);
            store.ingest_batch(batch, Sender::Local, now, now, &mut report);
            self.counts.dropped += report.dropped.total();
        }
    }

    fn poll_peers(&mut self, t_ms: u64, now: u64) {
        for op in self.operators.iter_mut().filter(|op| !op.local) {
            if t_ms % PEER_CADENCE_MS != op.peer_phase_ms {
                continue;
            }
            self.body.clear();
            op.own
                .encode_relay(now, now, RelayBudget::default(), &mut self.body);
            let site = op.tracker.config().site.clone();
            let report = self
                .home
                .ingest(&self.body, Sender::Peer { site: &site }, now, now);
            self.counts.peer_polls += 1;
            self.counts.dropped += report.dropped.total();
        }
    }

    fn gateway_poll(&mut self, now: u64) {
        self.body.clear();
        self.home.expire(now);
        self.home
            .encode_relay(now, now, RelayBudget::default(), &mut self.body);
        let report = self.gateway.ingest(&self.body, Sender::Local, now, now);
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
    /// request path does, and refreshes off-cycle when one did (at most once per
    /// [`LIVE_REFRESH_MIN_INTERVAL_MS`], as the gateway's poller does).
    pub fn settle(&mut self, t_ms: u64) {
        let mut any = false;
        let mut i = 0;
        while i < self.heard.len() {
            let (at, site, heard) = self.heard[i];
            if at > t_ms {
                i += 1;
                continue;
            }
            self.heard.swap_remove(i);
            let Some(slot) = self.live.slot(&self.keys[site]) else {
                continue;
            };
            // As the gateway does, only an answer that says something new about room or
            // serving wakes a refresh; a plain answer is counted at the next one.
            match heard {
                Heard::Answer { flow, server_error } => {
                    slot.record_room(EPOCH_MS + at, &flow);
                    if server_error {
                        slot.record_failure();
                    } else {
                        slot.record_answer();
                    }
                    any |= server_error || flow.has_room_signal();
                }
                Heard::Failed => {
                    slot.record_failure();
                    any = true;
                }
                Heard::Served { held_ms } => slot.record_served(held_ms),
                Heard::FirstByte { ms } => slot.record_first_byte(ms),
            }
        }
        let due = self
            .last_live_refresh
            .is_none_or(|last| t_ms >= last + LIVE_REFRESH_MIN_INTERVAL_MS);
        self.unfolded |= any;
        if self.unfolded && due {
            let now = EPOCH_MS + t_ms;
            self.last_live_refresh = Some(t_ms);
            self.unfolded = false;
            self.scorer.feed_live(&self.live, now);
            self.table = self.scorer.refresh(now, &self.routes);
        }
    }

    fn refresh(&mut self, now: u64) {
        self.gateway.expire(now);
        let report = from_store::sync(&mut self.scorer, &mut self.gateway, now);
        self.scorer.feed_live(&self.live, now);
        self.counts.refused_readings += report.refused.len() as u64;
        for (i, key) in self.keys.iter().enumerate() {
            self.readings[i] = self
                .gateway
                .entry(&key.site, &key.provider)
                .and_then(|entry| from_store::reading_of(entry, now));
        }
        self.table = self.scorer.refresh(now, &self.routes);
    }

    /// The routing table the last refresh built.
    pub fn table(&self) -> &RouteTable {
        &self.table
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

/// Frames a publication as a batch, as an operator does (metadata stamped `now`).
fn frame(tracker: &ProviderTracker, sequence: u64, now: u64, samples: &[PublishedSample]) -> Batch {
    let config = tracker.config();
    let meta = BatchMeta::new(
        config.site.as_str(),
        config.provider.as_str(),
        format!("uid-{}", config.site),
        Fence::new(EPOCH_MS, sequence),
        samples.len() as u64,
        1,
        now,
    )
    .expect("simulated names are within bounds");
    let rows = samples
        .iter()
        .map(|s| Row::from_published(s).expect("published rows are valid"))
        .collect();
    Batch::new(meta, rows)
}
