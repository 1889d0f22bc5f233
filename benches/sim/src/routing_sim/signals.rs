//! How load signals reach the simulated gateway: only at the real cadences and only
//! through the real code.
//!
//! ```text
//! every 1 s, per site:  FakeEpp text --Site::handle(Scraped)--> that site's operator
//!                       (grid_signals::site::Site, as grid-operatord runs it)
//! per peer, long poll:  peer Site --relay(Peer)--> body --handle(PeerBody)--> home Site
//!                       (at least every 5 s; at once when the peer's readiness moves)
//!   or, under gossip:   each batch a peer publishes is pulled whole by the home operator
//!                       GOSSIP_SPREAD_MS plus a round trip after it was published;
//!                       one whose readiness moved is pushed: a one-way hop and the pull
//! gateway, long poll:   home Site --relay(Local)--> body --Refresher::ingest--> gateway store
//!                       --Refresher::refresh--> RoutingView (grid_score::refresh, as
//!                       grid-gatewayd runs it; at least every 1 s, at once when the
//!                       readiness of a site the home operator holds moves)
//! each answer:          live slot --Refresher::refresh_live (off-cycle, rate-limited)
//! every 1 s:            Refresher::probes_due --> probes of the ejected sites; each
//!                       answer --LiveSlot::record_probe--> live slot
//! ```
//!
//! The home site is the gateway's own: its operator scrapes it itself; the others are
//! remote and reach the home operator only through its peer polls. Both polls follow the
//! daemons' own rule, grid-signals' [`long_poll`](grid_signals::long_poll): each
//! poller's [`LongPoll`] schedule, each poll held as [`Wait::hold_ms`] says against the
//! polled site's [`Site::readiness_generation`] and answered as soon as that moves, at
//! the instant it moves (no round trip on the signal path).
//!
//! Under gossip ([`SignalTransport::Gossip`](super::setup::SignalTransport::Gossip)) nothing is polled between operators: each
//! site announces the version of every batch it publishes over SWIM and a member that
//! hears of a newer one pulls it (`docs/operator.md`). The simulator does not run the
//! membership protocol itself; it delivers each publication after [`GOSSIP_SPREAD_MS`],
//! the median time the membership simulation (`grid-swim-scale`, 20 sites, 1% loss)
//! takes to spread a version to every member, plus the round trip of the pull. A
//! publication whose readiness moved is pushed to the members at once
//! (`grid_membership::Membership::announce_now`) and arrives a one-way hop plus the pull's
//! round trip after it: what most members see (a member the push missed hears it at its
//! next gossip round, which the model leaves out).
//!
//! Faults on the path ([`SignalFaults`]): an EPP gone silent fails its operator's scrapes
//! (a timeout each), and the operator's own stale rule decides what it publishes; a
//! frozen operator neither scrapes nor answers a poll, so its site's signals stop.

use std::sync::Arc;

use grid_score::catalog::{CandidateSpec, Catalog, ModelSpec};
use grid_score::live::{BandKey, FlowObservation, Rejoin};
use grid_score::refresh::{Refresher, RoutingEvent};
use grid_score::routing::RoutingView;
use grid_score::{CandidateKey, ExcludeReason, Reading, RouteTable, ScoreConfig, from_store};
use grid_signals::epp::{PoolSelector, ScrapeFailure};
use grid_signals::long_poll::{LongPoll, Wait};
use grid_signals::site::{Audience, ProviderSpec, Site, SiteConfig, SiteInput, SiteOutput};
use grid_signals::store::{RelayBudget, StoreConfig};

use super::setup::Episode;
use crate::fake_epp::{EppIdentity, FakeEpp};
use crate::site_model::SiteModel;

/// Scrape interval of every operator, and the gateway's poll of its own operator (ms).
pub const LOCAL_CADENCE_MS: u64 = 1_000;
/// The home operator's poll of each peer operator (ms): its long polls' interval.
pub const PEER_CADENCE_MS: u64 = 5_000;
/// Under gossip, how long a published batch's version takes to reach another member
/// before it is pulled (ms): the membership simulation's median for 20 sites.
pub const GOSSIP_SPREAD_MS: u64 = 500;

/// Where in each second the gateway first polls its operator, after the scrapes, and its
/// probe tick (ms).
pub const GATEWAY_POLL_PHASE_MS: u64 = 500;
/// The model every simulated site serves.
pub const MODEL: &str = "llama";
/// The wall clock at virtual time 0 (ms since the Unix epoch): the pure crates take
/// wall-clock stamps.
pub const EPOCH_MS: u64 = 1_700_000_000_000;
/// The status of an answer saying its site (or the grid) is full.
pub const FULL_STATUS: u16 = 429;
/// The status of an answer saying its site (or every site) cannot serve now.
pub const UNAVAILABLE_STATUS: u16 = 503;
/// The statuses of a site's serving failures.
pub const SERVER_ERRORS: std::ops::RangeInclusive<u16> = 500..=599;

/// One site's operator: its EPP and the operator's own site machine (grid-signals'
/// [`Site`], as the operator daemon runs it).
struct SiteOperator {
    epp: FakeEpp,
    site: Site,
    /// The home operator's poller of it (remote sites only); its first poll at a
    /// virtual-time offset within the 5 s period.
    poller: Option<Poller>,
}

/// One poller on grid-signals' long-poll rule, the daemons' own: the poll under way (when
/// it started, what it asked, when it is answered at the latest) and its [`LongPoll`]
/// schedule.
#[derive(Clone, Copy, Debug)]
struct Poller {
    schedule: LongPoll,
    started_ms: u64,
    wait: Option<Wait>,
    due_ms: u64,
}

impl Poller {
    /// A poller of `interval_ms` whose first poll, plain, is at `first_ms`.
    fn new(interval_ms: u64, first_ms: u64) -> Self {
        let mut schedule = LongPoll::new(interval_ms);
        schedule.started(first_ms);
        Self {
            schedule,
            started_ms: first_ms,
            wait: None,
            due_ms: first_ms,
        }
    }

    /// Whether the poll under way is answered at `t_ms` by a server at `generation`: it
    /// has started, and its hold ran out or the generation it saw moved.
    fn answered_at(&self, t_ms: u64, generation: u64) -> bool {
        t_ms >= self.started_ms
            && (t_ms >= self.due_ms || self.wait.is_some_and(|w| w.seen != generation))
    }

    /// The poll under way was answered at `t_ms` stating `generation` (`None`: it
    /// failed); the next one starts when the schedule says and is held by a server at
    /// `generation` as [`Wait::hold_ms`] says (only a scrape or an ingested poll moves a
    /// generation, and none comes within the spacing between two polls: a move later is
    /// seen by [`Self::answered_at`]).
    fn next(&mut self, t_ms: u64, generation: Option<u64>) {
        let start = match generation {
            Some(g) => self.schedule.answered(t_ms, Some(g)),
            None => self.schedule.failed(t_ms),
        };
        self.schedule.started(start);
        self.started_ms = start;
        self.wait = self.schedule.wait();
        let hold = match (self.wait, generation) {
            (Some(w), Some(g)) => w.hold_ms(g).unwrap_or(0),
            _ => 0,
        };
        self.due_ms = start + hold;
    }

    /// The next instant after `t_ms` it acts at.
    fn next_after(&self, t_ms: u64) -> Option<u64> {
        [self.started_ms, self.due_ms]
            .into_iter()
            .filter(|&at| at > t_ms)
            .min()
    }
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
    /// Batches the home operator pulled on hearing of them (gossip).
    pub gossip_pulls: u64,
    /// Gateway polls (each followed by a refresh).
    pub gateway_polls: u64,
    /// Lines any store refused.
    pub dropped: u64,
    /// Readings the scorer refused.
    pub refused_readings: u64,
    /// Scrapes that failed (an EPP gone silent).
    pub failed_scrapes: u64,
    /// Gateway polls that failed (its own operator frozen); each still refreshed.
    pub failed_gateway_polls: u64,
    /// Candidates ejected for failing (`RoutingEvent::Ejected`).
    pub ejections: u64,
    /// Candidates a reading took out of selection (not ready, no ready endpoints, or
    /// their per-endpoint series stopped), counted at the refresh that took them out.
    pub exclusions: u64,
    /// Ejected candidates back because a probe answered.
    pub rejoined_by_probe: u64,
    /// Ejected candidates back because their ejection ran out.
    pub rejoined_by_time: u64,
    /// Ejected candidates back because a reading said they serve again after one said
    /// they were out.
    pub rejoined_by_reading: u64,
    /// Times the model became unroutable (every candidate out: 503).
    pub unroutable: u64,
    /// Times the model started routing without any signal (by capacity alone).
    pub without_signals: u64,
    /// Probes of ejected sites sent.
    pub probes: u64,
    /// Of those, answered.
    pub probes_answered: u64,
}

impl SignalCounts {
    /// Adds another path's counters (one path per gateway).
    pub fn add(&mut self, other: Self) {
        self.scrapes += other.scrapes;
        self.batches += other.batches;
        self.peer_polls += other.peer_polls;
        self.gossip_pulls += other.gossip_pulls;
        self.gateway_polls += other.gateway_polls;
        self.dropped += other.dropped;
        self.refused_readings += other.refused_readings;
        self.failed_scrapes += other.failed_scrapes;
        self.failed_gateway_polls += other.failed_gateway_polls;
        self.ejections += other.ejections;
        self.exclusions += other.exclusions;
        self.rejoined_by_probe += other.rejoined_by_probe;
        self.rejoined_by_time += other.rejoined_by_time;
        self.rejoined_by_reading += other.rejoined_by_reading;
        self.unroutable += other.unroutable;
        self.without_signals += other.without_signals;
        self.probes += other.probes;
        self.probes_answered += other.probes_answered;
    }

    /// Counts what a refresh said changed.
    fn events(&mut self, events: &[RoutingEvent]) {
        for e in events {
            match e {
                RoutingEvent::Ejected { .. } => self.ejections += 1,
                RoutingEvent::Rejoined { cause, .. } => match cause {
                    Rejoin::Probe => self.rejoined_by_probe += 1,
                    Rejoin::Expired => self.rejoined_by_time += 1,
                    Rejoin::Ready => self.rejoined_by_reading += 1,
                },
                RoutingEvent::Unroutable { .. } => self.unroutable += 1,
                RoutingEvent::WithoutSignals { .. } => self.without_signals += 1,
                RoutingEvent::Routable { .. } | RoutingEvent::SignalsBack { .. } => {}
            }
        }
    }
}

/// What goes wrong on the signal path, per site and time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SignalFaults {
    /// EPPs that answer no scrape.
    pub epp_silent: Vec<Episode>,
    /// Operators that do nothing at all.
    pub operator_frozen: Vec<Episode>,
}

impl SignalFaults {
    fn silent(&self, site: usize, t_ms: u64) -> bool {
        self.epp_silent.iter().any(|e| e.covers(site, t_ms))
    }

    fn frozen(&self, site: usize, t_ms: u64) -> bool {
        self.operator_frozen.iter().any(|e| e.covers(site, t_ms))
    }
}

/// Every operator (the home one among them) and the gateway's routing core.
pub struct SignalPath {
    operators: Vec<SiteOperator>,
    home: usize,
    /// The gateway's poller of its operator.
    gateway: Poller,
    keys: Vec<CandidateKey>,
    refresher: Refresher,
    view: RoutingView,
    readings: Vec<Option<Reading>>,
    counts: SignalCounts,
    body: Vec<u8>,
    /// What answers said, in the order they reach the gateway: (virtual ms, site).
    heard: Vec<(u64, usize, Heard)>,
    faults: SignalFaults,
    /// Under gossip, each peer's delay from publishing a batch to its pull; empty under
    /// poll.
    gossip_delay_ms: Vec<u64>,
    /// Under gossip, publications on their way: (virtual ms of the pull, peer), in time
    /// order.
    announced: std::collections::VecDeque<(u64, usize)>,
    /// Under gossip, each peer's delay from publishing a readiness change to its pull.
    gossip_push_ms: Vec<u64>,
    /// Under gossip, each operator's readiness generation as last announced.
    announced_generation: Vec<u64>,
}

/// What one answer told the gateway about its site, as the gateway's request path reads
/// it (`docs/gateway.md`, "Live room from the answers").
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Heard {
    /// An answer's head: its status, its flow-control headers and its `Retry-After`.
    Answer {
        /// The flow-control band its request named (what its room describes).
        band: BandKey,
        /// The flow-control headers it carried.
        flow: FlowObservation,
        /// Its status.
        status: u16,
        /// Its `Retry-After` (ms), when it stated one.
        retry_after_ms: Option<u64>,
    },
    /// The exchange failed (reset, refused connection, a stream cut).
    Failed,
    /// A probe of the site, ejected for failing, answered with a list of models (a 2xx),
    /// or did not.
    Probe {
        /// Whether it answered.
        answered: bool,
    },
    /// A streamed answer's first byte came `elapsed_ms` after it went out, with the
    /// flow-control wait its header stated, if any (`LiveSlot::record_first_byte`).
    FirstByte {
        /// Sending to first byte, ms.
        elapsed_ms: u64,
        /// The stated flow-control wait, ms.
        stated_wait_ms: Option<u64>,
    },
    /// The gateway sent a request to the site.
    Sent,
    /// An exchange the gateway sent is over: its answer's end, a refusal, a failure.
    Ended,
    /// A streamed answer ended, `held_ms` after its first byte.
    Served {
        /// How long it held its slot, ms.
        held_ms: u64,
    },
    /// A plain answer's head came `elapsed_ms` after it was sent, with the flow-control
    /// wait it stated, if any (`LiveSlot::record_plain_answer`).
    Plain {
        /// Sending to head, ms.
        elapsed_ms: u64,
        /// The stated flow-control wait, ms.
        stated_wait_ms: Option<u64>,
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
    /// The same path with `faults` on it.
    #[must_use]
    pub fn with_faults(mut self, faults: SignalFaults) -> Self {
        self.faults = faults;
        self
    }

    /// The same path under gossip, each peer's batch pulled `round_trip_ms[peer]` plus
    /// [`GOSSIP_SPREAD_MS`] after it is published: no peer is polled.
    #[must_use]
    pub fn gossiping(mut self, round_trip_ms: &[u64]) -> Self {
        for op in &mut self.operators {
            op.poller = None;
        }
        self.gossip_delay_ms = round_trip_ms
            .iter()
            .map(|rtt| rtt + GOSSIP_SPREAD_MS)
            .collect();
        self.gossip_push_ms = round_trip_ms.iter().map(|rtt| rtt / 2 + rtt).collect();
        self.announced_generation = vec![0; round_trip_ms.len()];
        self
    }

    /// A path for sites named `names`, site `home` being the gateway's own.
    pub fn new(names: &[String], home: usize) -> Self {
        let store = StoreConfig::default();
        let remote_count = (names.len() - 1).max(1) as u64;
        let mut remote_seen = 0;
        let operators = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let poller = (i != home).then(|| {
                    // Peers are first polled at staggered points of the 5 s period, on
                    // scrape seconds, as independent timers would drift apart.
                    remote_seen += 1;
                    let first = (remote_seen * PEER_CADENCE_MS / (remote_count + 1))
                        / LOCAL_CADENCE_MS
                        * LOCAL_CADENCE_MS;
                    Poller::new(PEER_CADENCE_MS, first)
                });
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
                    poller,
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
            faults: SignalFaults::default(),
            gossip_delay_ms: Vec::new(),
            announced: std::collections::VecDeque::new(),
            gossip_push_ms: Vec::new(),
            announced_generation: Vec::new(),
            readings: vec![None; names.len()],
            operators,
            home,
            gateway: Poller::new(LOCAL_CADENCE_MS, GATEWAY_POLL_PHASE_MS),
            keys,
            refresher,
            view,
            counts: SignalCounts::default(),
            body: Vec::with_capacity(64 * 1024),
        }
    }

    /// The first signal instant after `t_ms`: a scrape second, the gateway's probe tick
    /// at [`GATEWAY_POLL_PHASE_MS`] into a second, a poll of this path starting or
    /// running out of its wait, or a gossiped batch pulled.
    pub fn next_instant_after(&self, t_ms: u64) -> u64 {
        let second = t_ms / LOCAL_CADENCE_MS * LOCAL_CADENCE_MS;
        let tick = if t_ms < second + GATEWAY_POLL_PHASE_MS {
            second + GATEWAY_POLL_PHASE_MS
        } else {
            second + LOCAL_CADENCE_MS
        };
        self.operators
            .iter()
            .filter_map(|op| op.poller.as_ref())
            .chain([&self.gateway])
            .filter_map(|p| p.next_after(t_ms))
            .chain(
                self.announced
                    .iter()
                    .map(|&(at, _)| at)
                    .filter(|&at| at > t_ms),
            )
            .fold(tick, u64::min)
    }

    /// Runs whatever the signal path does at virtual time `t_ms` (a value returned by
    /// [`Self::next_instant_after`]): peer polls whose wait ran out, the scrapes on the
    /// second, then the peer polls a scrape answered early, then the gateway's poll and
    /// refresh when its wait ran out or its operator's readiness moved.
    pub fn at(&mut self, t_ms: u64, sites: &[SiteModel]) {
        let now = EPOCH_MS + t_ms;
        // Peers first: a poll whose wait runs out on a scrape second reads what the peer
        // scraped a second ago.
        self.poll_peers(t_ms, now);
        self.pull_announced(t_ms, now);
        if t_ms.is_multiple_of(LOCAL_CADENCE_MS) {
            self.scrape_all(t_ms, now, sites);
            self.poll_peers(t_ms, now);
        }
        self.gateway_poll(t_ms, now);
    }

    fn scrape_all(&mut self, t_ms: u64, now: u64, sites: &[SiteModel]) {
        for (i, (op, site)) in self.operators.iter_mut().zip(sites).enumerate() {
            if self.faults.frozen(i, t_ms) {
                continue;
            }
            op.site.handle(now, SiteInput::Expire);
            let outcome = if self.faults.silent(i, t_ms) {
                self.counts.failed_scrapes += 1;
                Err(ScrapeFailure::Timeout)
            } else {
                self.body.clear();
                op.epp.render_into(site, &mut self.body);
                Ok(self.body.as_slice())
            };
            op.site.handle(
                now,
                SiteInput::Scraped {
                    provider: 0,
                    outcome,
                    latest_pass_ms: 0,
                },
            );
            drain(&mut op.site, &mut self.counts);
            if let Some(&delay) = self.gossip_delay_ms.get(i).filter(|_| i != self.home) {
                let generation = op.site.readiness_generation(Audience::Peer);
                let moved = generation != self.announced_generation[i];
                self.announced_generation[i] = generation;
                let delay = if moved { self.gossip_push_ms[i] } else { delay };
                self.announced.push_back((t_ms + delay, i));
            }
        }
        self.announced
            .make_contiguous()
            .sort_by_key(|&(at, peer)| (at, peer));
    }

    /// Pulls every gossiped batch due by `t_ms` into the home operator (none while it is
    /// frozen: it hears nothing).
    fn pull_announced(&mut self, t_ms: u64, now: u64) {
        while let Some(&(at, peer)) = self.announced.front() {
            if at > t_ms {
                return;
            }
            self.announced.pop_front();
            if self.faults.frozen(self.home, t_ms) || self.faults.frozen(peer, t_ms) {
                continue;
            }
            self.pull(peer, now);
            self.counts.gossip_pulls += 1;
        }
    }

    /// The home operator ingests peer `i`'s relay as of `now`: what a peer poll's answer
    /// and a gossip pull both carry.
    fn pull(&mut self, i: usize, now: u64) {
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
        drain(home, &mut self.counts);
    }

    /// Answers every peer poll due at `t_ms` (its wait ran out, or the peer's readiness
    /// moved); a frozen peer's poll, or any while the home operator is frozen, fails.
    fn poll_peers(&mut self, t_ms: u64, now: u64) {
        let home_frozen = self.faults.frozen(self.home, t_ms);
        for i in 0..self.operators.len() {
            let generation = self.operators[i].site.readiness_generation(Audience::Peer);
            let Some(poller) = self.operators[i].poller.as_mut() else {
                continue;
            };
            if !poller.answered_at(t_ms, generation) {
                continue;
            }
            if home_frozen || self.faults.frozen(i, t_ms) {
                poller.next(t_ms, None);
                continue;
            }
            poller.next(t_ms, Some(generation));
            self.pull(i, now);
            self.counts.peer_polls += 1;
        }
    }

    /// The gateway's poll of its operator, when it is answered at `t_ms` (its wait ran
    /// out, or the operator's readiness moved), and its refresh.
    fn gateway_poll(&mut self, t_ms: u64, now: u64) {
        let generation = self.operators[self.home]
            .site
            .readiness_generation(Audience::Local);
        if !self.gateway.answered_at(t_ms, generation) {
            return;
        }
        if self.faults.frozen(self.home, t_ms) {
            // The poll fails; the gateway refreshes anyway, as time passing is what ages a
            // silent site into unmeasured.
            self.gateway.next(t_ms, None);
            self.counts.failed_gateway_polls += 1;
            self.refresh(now);
            return;
        }
        self.body.clear();
        let home = &mut self.operators[self.home].site;
        home.handle(now, SiteInput::Expire);
        // Stated with the body, as the operator does: after what the expiry changed.
        self.gateway
            .next(t_ms, Some(home.readiness_generation(Audience::Local)));
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
            // What the gateway's request path records of an answer's head (grid-gatewayd's
            // `answer_evidence`): its room signal; a 429 holds the site full for its
            // Retry-After; a 5xx is a serving failure; anything else an answer.
            let wakes = match heard {
                Heard::Answer {
                    band,
                    flow,
                    status,
                    retry_after_ms,
                } => {
                    let now = EPOCH_MS + at;
                    slot.record_room(now, band, &flow);
                    let full = status == FULL_STATUS;
                    let server_error = SERVER_ERRORS.contains(&status);
                    if full {
                        slot.record_full(now, retry_after_ms);
                    } else if server_error {
                        slot.record_failure();
                    } else {
                        slot.record_answer();
                    }
                    full || server_error || flow.has_room_signal()
                }
                Heard::Probe { answered } => {
                    slot.record_probe(answered);
                    self.counts.probes_answered += u64::from(answered);
                    answered
                }
                Heard::Failed => {
                    slot.record_failure();
                    true
                }
                Heard::Served { held_ms } => {
                    slot.record_served(held_ms);
                    false
                }
                Heard::Plain {
                    elapsed_ms,
                    stated_wait_ms,
                } => {
                    slot.record_plain_answer(elapsed_ms, stated_wait_ms);
                    false
                }
                Heard::FirstByte {
                    elapsed_ms,
                    stated_wait_ms,
                } => {
                    slot.record_first_byte(elapsed_ms, stated_wait_ms);
                    false
                }
                Heard::Sent => {
                    slot.record_sent();
                    false
                }
                Heard::Ended => {
                    slot.record_ended();
                    false
                }
            };
            if wakes {
                self.refresher.wake_live();
            }
        }
        if let Some(refreshed) = self.refresher.refresh_live(EPOCH_MS + t_ms) {
            self.counts.events(&refreshed.events);
            self.publish(refreshed.view);
        }
    }

    /// The sites ejected for failing whose probe is due at virtual `t_ms`
    /// ([`Refresher::probes_due`]: each once per `grid_score::live::PROBE_INTERVAL_MS`), for
    /// the caller to probe; each answer comes back as [`Heard::Probe`].
    pub fn probes_due(&mut self, t_ms: u64) -> Vec<usize> {
        let due = self.refresher.probes_due(EPOCH_MS + t_ms);
        let sites: Vec<usize> = due
            .iter()
            .filter_map(|u| self.keys.iter().position(|k| k.site == u.site))
            .collect();
        self.counts.probes += sites.len() as u64;
        sites
    }

    /// Where the gateway sends a request site `failed` refused, from the view in force
    /// now (`RoutingView::retry_target`: a candidate elsewhere with headroom, drawn by reach).
    pub fn retry_target<R: grid_score::Rng + ?Sized>(
        &self,
        failed: usize,
        rng: &mut R,
    ) -> Option<usize> {
        let upstream = self
            .view
            .retry_target(MODEL, &self.keys[failed].site, rng)?;
        self.keys.iter().position(|k| k.site == upstream.site)
    }

    fn refresh(&mut self, now: u64) {
        let refreshed = self.refresher.refresh(now);
        self.counts.events(&refreshed.events);
        self.counts.refused_readings += refreshed.refused.len() as u64;
        for (i, key) in self.keys.iter().enumerate() {
            self.readings[i] = self
                .refresher
                .store()
                .entry(&key.site, &key.provider)
                .and_then(|entry| from_store::reading_of(entry, now));
        }
        self.publish(refreshed.view);
    }

    /// Puts a refreshed view in force, counting the candidates a reading took out.
    fn publish(&mut self, view: RoutingView) {
        let by_reading = |view: &RoutingView| -> Vec<Arc<str>> {
            view.table()
                .get(MODEL)
                .map(|m| {
                    m.excluded()
                        .iter()
                        .filter(|e| e.reason != ExcludeReason::Ejected)
                        .map(|e| Arc::clone(&e.key.site))
                        .collect()
                })
                .unwrap_or_default()
        };
        let before = by_reading(&self.view);
        self.counts.exclusions += by_reading(&view)
            .iter()
            .filter(|site| !before.contains(site))
            .count() as u64;
        self.view = view;
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
