//! The immutable, pre-ordered view of one model's candidates that the request path reads.
//!
//! Everything a pick needs is decided here, off the request path: which candidates are
//! healthy, their order, each one's headroom, which selection path applies and the
//! cumulative weights it draws from. [`crate::select`] only draws from them, and reads
//! how many of this gateway's requests the drawn candidates hold at that instant.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;

use crate::learner::ExcludeReason;
use crate::live::{LiveRoom, LiveSlot};
use crate::reading::CandidateKey;
use crate::tally::TallyCounts;

/// The rho and score of a candidate with no fresh reading: infinitely loaded, so it sorts
/// after every measured candidate (whose values are capped at [`crate::RHO_CAP`]) and
/// never reads as having room. Loss of signal degrades to least preferred, never to idle.
pub const UNMEASURED: f64 = f64::INFINITY;

/// The longest turnover a candidate is read at (ms): an hour, far past any request a
/// gateway proxies; bounds the arithmetic against a broken clock.
pub const MAX_TURNOVER_MS: f64 = 3_600_000.0;

grid_signals::label_values! {
    /// Where a healthy candidate stands, derived from its score and latest sample.
    pub enum CandidateState {
        /// Measured, recent worst rho below 1.
        Room,
        /// Measured, no room, but not saturated with work waiting.
        NoRoom,
        /// Measured, saturated with work waiting at every unit or in flow control.
        Full,
        /// No fresh reading: scores [`UNMEASURED`].
        Unmeasured,
    }
}

/// One healthy candidate as of the refresh that built the snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    key: CandidateKey,
    capacity: f64,
    reach: f64,
    rho: f64,
    score: f64,
    waiting: f64,
    state: CandidateState,
    signal: Signal,
    headroom: f64,
    live_factor: f64,
    serving_factor: f64,
    shown: f64,
    drain_ms: f64,
    quiet_ms: f64,
    own: f64,
    live_headroom: Option<u64>,
    evidence: CandidateEvidence,
    requests: Requests,
}

/// Where a pick reads how many of this gateway's requests a candidate holds at the
/// instant of the pick: the live slot its requests are counted in (two atomic loads, no
/// lock). A candidate built outside a refresher has none, and is drawn by weight alone.
///
/// Not part of what a candidate says: two candidates equal in every figure are equal
/// whatever slot they count in.
#[derive(Clone, Default)]
pub(crate) struct Requests(Option<Arc<LiveSlot>>);

impl PartialEq for Requests {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// The count as it stands, not the slot's every field.
impl std::fmt::Debug for Requests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Requests")
            .field(&self.0.as_ref().map(|slot| slot.outstanding()))
            .finish()
    }
}

/// What the refresh knew of a candidate beyond what selection reads: the routing
/// evidence a gateway shows (`GET /v1/grid/routing`), computed at refresh and never read
/// by a pick.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CandidateEvidence {
    /// What it has shown it holds, calm or at a limit: the capacity reported on
    /// `/metrics`. Selection reads [`Candidate::capacity`], which counts only calm holds
    /// and fades while a site stays queued. `None` for a candidate built without a
    /// learner.
    pub shown_capacity: Option<f64>,
    /// Stamp of its newest loaded reading (ms since the Unix epoch), fresh or not.
    pub load_stamp_ms: Option<u64>,
    /// What it held without queueing, as that bound stands now (it fades towards the
    /// floor unless shown again).
    pub soft_bound: Option<f64>,
    /// What it held at its limit, as that bound stands now (it grows unless shown again).
    pub hard_bound: Option<f64>,
    /// The newest room signal its answers carried (flow-control headers), however old.
    pub live_room: Option<LiveRoom>,
    /// Its serving-failure score now (decaying; see `live`).
    pub failures: f64,
    /// Until when its own 429 holds it full, while it does.
    pub full_until_ms: Option<u64>,
}

/// What a candidate's newest sample itself read, beyond its smoothed load: the inputs of
/// its headroom (see `docs/routing.md`, "Selection").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Signal {
    /// Unsmoothed rho of the newest sample (in-flight or KV pressure against capacity).
    pub rho_now: f64,
    /// How long one reading stands: the gap between the candidate's samples, in ms
    /// (0 when unknown; read as at least [`crate::MIN_SPREAD_MS`]).
    pub life_ms: f64,
    /// Share of its slots' turnover the site has been absorbing, in
    /// `[PACE_FLOOR, 1]` ([`crate::PACE_FLOOR`]).
    pub pace: f64,
    /// How long a request holds one of its slots, ms, as its answers showed; 0 when
    /// unknown (the configured turnover stands in).
    pub turnover_ms: f64,
}

impl Candidate {
    /// A candidate with a fresh reading. `rho` is the latest smoothed rho, `score` the
    /// recent worst (what ordering reads); `full` says the latest sample was
    /// saturated with work waiting. Non-finite or negative inputs are clamped into range
    /// so a snapshot can never carry NaN.
    pub fn measured(
        key: CandidateKey,
        capacity: f64,
        rho: f64,
        score: f64,
        waiting: f64,
        full: bool,
    ) -> Self {
        let clean = |v: f64, cap: f64| if v.is_nan() { cap } else { v.clamp(0.0, cap) };
        let score = clean(score, crate::RHO_CAP);
        let state = if full {
            CandidateState::Full
        } else if score < 1.0 {
            CandidateState::Room
        } else {
            CandidateState::NoRoom
        };
        let rho = clean(rho, crate::RHO_CAP);
        let capacity = clean(capacity, f64::MAX).max(crate::CAPACITY_FLOOR);
        Self {
            key,
            capacity,
            reach: capacity,
            rho,
            score,
            waiting: clean(waiting, f64::MAX),
            state,
            signal: Signal {
                rho_now: rho,
                life_ms: 0.0,
                pace: 1.0,
                turnover_ms: 0.0,
            },
            headroom: 0.0,
            live_factor: 1.0,
            serving_factor: 1.0,
            shown: 0.0,
            drain_ms: 0.0,
            quiet_ms: 0.0,
            own: 0.0,
            live_headroom: None,
            evidence: CandidateEvidence::default(),
            requests: Requests::default(),
        }
    }

    /// Adds what the newest sample read (a learner-built candidate always has it; without
    /// it the smoothed rho stands in, at full pace). Non-finite or out-of-range values are
    /// clamped; an unmeasured candidate ignores it.
    #[must_use]
    pub fn with_signal(mut self, signal: Signal) -> Self {
        if self.state != CandidateState::Unmeasured {
            let clean = |v: f64, lo: f64, hi: f64| if v.is_nan() { hi } else { v.clamp(lo, hi) };
            self.signal = Signal {
                rho_now: clean(signal.rho_now, 0.0, crate::RHO_CAP),
                life_ms: clean(signal.life_ms, 0.0, 1.0e12),
                pace: clean(signal.pace, crate::PACE_FLOOR, 1.0),
                // Unknown (0, or not a number) leaves the configured turnover in force.
                turnover_ms: if signal.turnover_ms.is_nan() {
                    0.0
                } else {
                    signal.turnover_ms.clamp(0.0, MAX_TURNOVER_MS)
                },
            };
        }
        self
    }

    /// Sets the capacity selection reads the candidate at (see [`Candidate::reach`]);
    /// never below its shown capacity. Non-finite values are ignored.
    #[must_use]
    pub fn with_reach(mut self, reach: f64) -> Self {
        if reach.is_finite() {
            self.reach = reach.clamp(self.capacity, f64::MAX);
        }
        self
    }

    /// Sets what the candidate's own responses said lately (see [`crate::live`]): the
    /// factor its selection weight is multiplied by (clamped into `[0, 1]`; NaN reads 1)
    /// and its fresh band headroom, summed into [`RouteSnapshot::grid_headroom`].
    #[must_use]
    pub fn with_live(mut self, factor: f64, headroom: Option<u64>) -> Self {
        self.live_factor = if factor.is_nan() {
            1.0
        } else {
            factor.clamp(0.0, 1.0)
        };
        self.live_headroom = headroom;
        self
    }

    /// Its learned turnover (ms); `None` where its answers have not shown one (a
    /// signal's turnover under a millisecond is "not shown").
    fn learned_turnover(&self) -> Option<f64> {
        (self.signal.turnover_ms >= 1.0).then_some(self.signal.turnover_ms)
    }

    /// Its learned turnover (ms), or `default` where its answers have not shown one
    /// ([`unlearned_turnover`]).
    fn turnover_or(&self, default: f64) -> f64 {
        self.learned_turnover().unwrap_or(default)
    }

    /// The turnover room is read with (headroom, what the grid serves): its own, except
    /// that a site reading a queue is never read as turning over faster than the
    /// configured prior. A queue that fast turnover would drain at once says either that
    /// the turnover learned from older answers is stale (the site slowed and none of its
    /// slowed answers has ended yet) or that others keep it full; either way trusting it
    /// as room sent a site three times over its slots 60% of the traffic beside an idle
    /// one. How fast a queue drains reads the site's own while it answers
    /// ([`Candidate::draining_turnover`]). `unlearned` stands for its own until its
    /// answers show one.
    fn effective_turnover(&self, unlearned: f64, prior: f64) -> f64 {
        self.turnover_queued_at_least(unlearned, prior)
    }

    /// Its own turnover (`unlearned` until its answers show one), and, while its reading
    /// shows a queue, no less than `floor`: the one place the two readings of a queued
    /// site's turnover differ only in their floor.
    fn turnover_queued_at_least(&self, unlearned: f64, floor: f64) -> f64 {
        let own = self.turnover_or(unlearned);
        if self.signal.rho_now > 1.0 {
            own.max(floor)
        } else {
            own
        }
    }

    /// The turnover its queue is read draining at ([`Candidate::drain_ms`], the
    /// by-capacity weights): its own, except that a site reading a queue that has not
    /// answered for longer than that is read as turning over no faster than the time
    /// since it last did, up to the configured prior. A learned turnover speaks for the
    /// site only while its answers keep showing it: one that slowed after it was learned
    /// shows nothing until its slowed requests end, and read at the old figure a site
    /// slowed twentyfold and holding three times its slots was drawn as draining its
    /// queue in 0.4 s, and took a quarter of the picks beside one with room. A site
    /// draining at its own pace for this gateway alone answers it within about one of its
    /// turnovers. Only this gateway's answers count, so one with few requests or none at
    /// a small site the other gateways keep queued reads it silent and stops drawing it
    /// while it stays queued; it is full meanwhile, and drawn again once it has room.
    /// Silence read only while this gateway waits on the site knows nothing at a site
    /// slowed and filled behind an idle gateway, and drew it for its first requests.
    fn draining_turnover(&self, unlearned: f64, prior: f64) -> f64 {
        self.turnover_queued_at_least(unlearned, self.quiet_ms.min(prior))
    }

    /// Sets how long it has been, at the refresh, since its newest answer that was not a
    /// failure (ms; infinity when it has given none). A candidate built without it is
    /// read as answering. NaN or negative values are ignored.
    #[must_use]
    pub fn with_quiet(mut self, quiet_ms: f64) -> Self {
        if quiet_ms >= 0.0 {
            self.quiet_ms = quiet_ms;
        }
        self
    }

    /// The factor the candidate's responses put on its selection weight, in `[0, 1]`.
    pub fn live_factor(&self) -> f64 {
        self.live_factor
    }

    /// Sets what its serving failures leave of its weight (`failures` as
    /// [`crate::live`] scores them, decaying): `1 / (1 + failures)`, the part of the live
    /// factor that is not about room. NaN or negative reads no failures.
    #[must_use]
    pub fn with_failures(mut self, failures: f64) -> Self {
        self.serving_factor = if failures.is_nan() {
            1.0
        } else {
            1.0 / (1.0 + failures.max(0.0))
        };
        self
    }

    /// Sets what it has shown it holds, calm or at a limit (the capacity the gateway
    /// reports, [`CandidateEvidence::shown_capacity`]): while its reading shows it full,
    /// the slots that drain its queue ([`Candidate::drain_ms`]) when that is more than
    /// its reach. Non-finite or negative values are ignored.
    #[must_use]
    pub fn with_shown(mut self, shown: f64) -> Self {
        if shown.is_finite() && shown >= 0.0 {
            self.shown = shown;
        }
        self
    }

    /// Sets how many of this gateway's own requests are at the site now (sent there and
    /// not ended). Only a pick without signals reads it ([`Path::Fallback`]): there
    /// nothing else says what the site holds. Non-finite or negative values are ignored.
    #[must_use]
    pub fn with_own(mut self, own: f64) -> Self {
        if own.is_finite() && own >= 0.0 {
            self.own = own;
        }
        self
    }

    /// How many of this gateway's own requests were at the site when the snapshot was
    /// built.
    pub fn own(&self) -> f64 {
        self.own
    }

    /// Counts this gateway's requests at the site in `slot` (its catalog entry's live
    /// slot), so that a pick reads them as they stand then ([`Candidate::requests_now`]).
    #[must_use]
    pub fn with_requests(mut self, slot: Arc<LiveSlot>) -> Self {
        self.requests = Requests(Some(slot));
        self
    }

    /// How many of this gateway's requests are at the site at this instant (sent and
    /// not ended), when it counts them in a live slot ([`Candidate::with_requests`]).
    pub fn requests_now(&self) -> Option<u32> {
        self.requests.0.as_ref().map(|slot| slot.outstanding())
    }

    /// The slots that drain its queue: its reach, or, while its reading shows it full,
    /// what it has shown it holds when that is more. Reach counts calm holds only, and a
    /// site kept queued shows no calm moment, so its reach fades by half every
    /// [`crate::BOUND_HALF_LIFE_MS`] while it serves as many as before: read at its
    /// reach, a fast site kept full for minutes was drawn as if it drained a quarter
    /// of its slots, and the queue went to a slower one.
    fn draining_slots(&self) -> f64 {
        if self.state == CandidateState::Full {
            self.reach.max(self.shown)
        } else {
            self.reach
        }
    }

    /// How long its queue takes to drain, in ms: the work waiting over the slots that
    /// drain it, at its own learned turnover (until its answers show one, the median of
    /// the model's other sites'), or slower while it has not answered for longer than
    /// that. Zero when unmeasured (read as holding nothing waiting); set when the
    /// snapshot is built.
    pub fn drain_ms(&self) -> f64 {
        self.drain_ms
    }

    /// A candidate with no fresh reading: rho and score are [`UNMEASURED`].
    pub fn unmeasured(key: CandidateKey, capacity: f64) -> Self {
        let capacity = if capacity.is_nan() {
            crate::CAPACITY_FLOOR
        } else {
            capacity.clamp(crate::CAPACITY_FLOOR, f64::MAX)
        };
        Self {
            key,
            capacity,
            reach: capacity,
            rho: UNMEASURED,
            score: UNMEASURED,
            waiting: 0.0,
            state: CandidateState::Unmeasured,
            signal: Signal {
                rho_now: UNMEASURED,
                life_ms: 0.0,
                pace: 1.0,
                turnover_ms: 0.0,
            },
            headroom: 0.0,
            live_factor: 1.0,
            serving_factor: 1.0,
            shown: 0.0,
            drain_ms: 0.0,
            quiet_ms: 0.0,
            own: 0.0,
            live_headroom: None,
            evidence: CandidateEvidence::default(),
            requests: Requests::default(),
        }
    }

    /// Sets what the refresh knew of it beyond what selection reads (see
    /// [`CandidateEvidence`]).
    #[must_use]
    pub fn with_evidence(mut self, evidence: CandidateEvidence) -> Self {
        self.evidence = evidence;
        self
    }

    /// What the refresh knew of it beyond what selection reads.
    pub fn evidence(&self) -> &CandidateEvidence {
        &self.evidence
    }

    /// Site and provider.
    pub fn key(&self) -> &CandidateKey {
        &self.key
    }

    /// The site's name.
    pub fn site(&self) -> &Arc<str> {
        &self.key.site
    }

    /// Learned capacity in requests, what the site has shown it holds (a 16-slot site
    /// reads at most 16); finite and at least [`crate::CAPACITY_FLOOR`].
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// The capacity selection reads: [`Candidate::capacity`], or more for a site that has
    /// only shown what it held without queueing ([`crate::SOFT_BOUND_HEADROOM`]), so its
    /// size is explored. Rho, headroom and the by-capacity weights use it.
    pub fn reach(&self) -> f64 {
        self.reach
    }

    /// Latest smoothed rho, or [`UNMEASURED`].
    pub fn rho(&self) -> f64 {
        self.rho
    }

    /// Recent worst rho — the ordering key (and what state and shedding read; selection
    /// reads [`Candidate::headroom`]) — or [`UNMEASURED`].
    pub fn score(&self) -> f64 {
        self.score
    }

    /// Work waiting at the site (endpoint queues plus flow control); the by-capacity rule
    /// compares it per unit of capacity.
    pub fn waiting(&self) -> f64 {
        self.waiting
    }

    /// Where the candidate stands.
    pub fn state(&self) -> CandidateState {
        self.state
    }

    /// What its newest sample read.
    pub fn signal(&self) -> Signal {
        self.signal
    }

    /// Expected intake over the life of its reading, in requests per second: the weight
    /// it is drawn with on the `spread` path. Zero when unmeasured or when its queue
    /// outweighs its turnover; set when the snapshot is built.
    pub fn headroom(&self) -> f64 {
        self.headroom
    }
}

/// A candidate kept out of selection, with the reason (for status pages and metrics).
#[derive(Clone, Debug, PartialEq)]
pub struct Excluded {
    /// Site and provider.
    pub key: CandidateKey,
    /// Why it is out.
    pub reason: ExcludeReason,
    /// Since when: the stamp of the reading that said so, or when it was ejected.
    pub since_ms: Option<u64>,
    /// Until when at most: an ejection's end (a probe that answers ends it sooner); none
    /// for a reading's verdict, which holds until a newer reading says otherwise.
    pub until_ms: Option<u64>,
    /// Its learned capacity (what it has shown it holds) as it stands.
    pub capacity: f64,
    /// What the refresh knew of it beyond that.
    pub evidence: CandidateEvidence,
}

/// The least live factor a by-capacity weight is multiplied by: with every site out of
/// headroom a site whose responses say "full" is drawn rarely, not never, so the pool
/// always has weight and its recovery is seen.
pub const LIVE_FACTOR_FLOOR: f64 = 0.02;

/// Weighted draw over a subset of candidates: member indices and inclusive prefix sums of
/// their weights, built once at refresh.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Pool {
    pub(crate) members: Vec<u32>,
    pub(crate) cumulative: Vec<f64>,
}

impl Pool {
    /// `weight` of each member; when the weights do not sum to a positive finite total
    /// (every one zero, or overflowing), by capacity instead, which always does for the
    /// few candidates a model has (each at least the floor).
    fn new(
        members: Vec<u32>,
        candidates: &[Candidate],
        weight: impl Fn(&Candidate) -> f64,
    ) -> Self {
        let prefix = |w: &dyn Fn(&Candidate) -> f64| -> Vec<f64> {
            let mut total = 0.0;
            members
                .iter()
                .map(|&i| {
                    total += w(&candidates[i as usize]);
                    total
                })
                .collect()
        };
        let mut cumulative = prefix(&weight);
        let total = cumulative.last().copied().unwrap_or(0.0);
        if !(total.is_finite() && total > 0.0) {
            cumulative = prefix(&|c: &Candidate| c.reach);
        }
        Self {
            members,
            cumulative,
        }
    }
}

grid_signals::label_values! {
    /// Which selection rule chose the site (a metric label).
    pub enum Path {
        /// Two or more sites with headroom: one drawn with weight its headroom.
        Spread,
        /// Exactly one site with headroom, enough for what the grid is serving.
        Lone,
        /// Sites with headroom, but less of it than what the grid is serving: that share of
        /// the picks is drawn by headroom, the rest as [`Path::ByCapacity`] draws, in one
        /// draw over both weights.
        Overflow,
        /// No site with headroom but some measured: one drawn among the measured with weight
        /// pace (1 for a site read full) x capacity over the square of one plus work
        /// waiting per unit of capacity.
        ByCapacity,
        /// Nothing measured: one drawn among the unmeasured by capacity, less for a site
        /// holding more of this gateway's own requests than that.
        Fallback,
    }
}

/// The selection path decided at refresh.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Plan {
    Unavailable { retry_after_ms: u64 },
    Shed { retry_after_ms: u64 },
    Lone(u32),
    Spread(Pool),
    Overflow(Pool),
    ByCapacity(Pool),
    Fallback(Pool),
}

/// What a snapshot answers when it cannot route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusals {
    /// `Some(retry_after_ms)` when the model is shedding.
    pub shed_retry_after_ms: Option<u64>,
    /// Retry-After when every candidate is excluded.
    pub unavailable_retry_after_ms: u64,
}

/// A snapshot's decision counters, found once when its table is published: a family
/// lookup per pick is a lock and a hash of three labels, on the request path.
///
/// Not part of what a snapshot says: two snapshots with the same candidates and plan
/// are equal whatever their counters.
#[derive(Clone, Debug, Default)]
pub(crate) struct DecisionCounters {
    /// `{site, path, routed}` of each candidate, by its index in the snapshot.
    pub(crate) routed: Box<[Counter]>,
    /// `{"", "", shed | unavailable}` when the plan refuses.
    pub(crate) refused: Option<Counter>,
}

impl PartialEq for DecisionCounters {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// One model's candidates, least-loaded first, with the selection path already decided.
///
/// Immutable once built: the daemon publishes a [`RouteTable`] of these atomically and
/// every request reads the same one until the next refresh.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteSnapshot {
    model: Arc<str>,
    candidates: Vec<Candidate>,
    excluded: Vec<Excluded>,
    grid_headroom: Option<u64>,
    pub(crate) plan: Plan,
    /// When the refresh that built it ran (ms since the Unix epoch; 0 when built outside
    /// a scorer).
    pub(crate) refreshed_at_ms: u64,
    /// Each configured candidate's tallies over the refresher's recent window, in
    /// configuration order (empty outside a refresher), and that window's span.
    pub(crate) recent: Vec<(CandidateKey, TallyCounts)>,
    pub(crate) recent_span_ms: u64,
    /// Where [`crate::ScoreMetrics::record_in`] counts this snapshot's picks, resolved by
    /// [`crate::ScoreMetrics::resolve`] when the table is published; empty until then.
    pub(crate) counters: DecisionCounters,
}

impl RouteSnapshot {
    /// [`RouteSnapshot::build`] with the default turnover
    /// ([`crate::DEFAULT_TURNOVER_MS`]). Public so simulators and tests can build
    /// snapshots without a learner.
    pub fn new(
        model: impl Into<Arc<str>>,
        candidates: Vec<Candidate>,
        excluded: Vec<Excluded>,
        refusals: Refusals,
    ) -> Self {
        Self::build(
            model,
            candidates,
            excluded,
            refusals,
            crate::DEFAULT_TURNOVER_MS,
        )
    }

    /// Orders `candidates` least-loaded first (score, then larger capacity; full ties keep
    /// the given order), sets each one's headroom with `turnover_ms` (the typical time a
    /// request holds a slot, [`crate::ScoreConfig::turnover_ms`]) and decides the
    /// selection path.
    pub fn build(
        model: impl Into<Arc<str>>,
        mut candidates: Vec<Candidate>,
        excluded: Vec<Excluded>,
        refusals: Refusals,
        turnover_ms: u64,
    ) -> Self {
        candidates.sort_by(|a, b| {
            a.score
                .total_cmp(&b.score)
                .then(b.reach.total_cmp(&a.reach))
        });
        let prior = turnover_ms as f64;
        let unlearned = unlearned_turnover(&candidates, prior);
        for c in &mut candidates {
            if c.state != CandidateState::Unmeasured {
                // The spread term reads the worse of the newest load and the recent worst:
                // a drained burst stays penalized in the weights until it ages out of the
                // window, as the poll design's Failure Behavior section says, instead of snapping back on the first quiet
                // sample (measured neutral on the simulator's p99: docs/routing-quality.md,
                // "The drained-burst penalty").
                let turnover = c.effective_turnover(unlearned, prior);
                c.headroom = c.live_factor
                    * crate::headroom::headroom(
                        c.reach,
                        c.signal.rho_now.max(c.score),
                        c.signal.pace,
                        c.signal.life_ms,
                        turnover,
                    );
                // At the site's own turnover while it answers, not clamped to the prior as
                // room is: past saturation every site queues, and every site faster than
                // the prior would drain alike. Both bounds are at least the capacity,
                // itself at least the floor.
                c.drain_ms = c.waiting * c.draining_turnover(unlearned, prior) / c.draining_slots();
            }
        }
        let grid_headroom = candidates
            .iter()
            .filter_map(|c| c.live_headroom)
            .reduce(u64::saturating_add);
        let plan = plan(&candidates, refusals, prior, unlearned);
        Self {
            model: model.into(),
            candidates,
            excluded,
            grid_headroom,
            plan,
            refreshed_at_ms: 0,
            recent: Vec::new(),
            recent_span_ms: 0,
            counters: DecisionCounters::default(),
        }
    }

    /// When the refresh that built it ran (ms since the Unix epoch; 0 outside a scorer).
    pub fn refreshed_at_ms(&self) -> u64 {
        self.refreshed_at_ms
    }

    /// What each configured candidate's requests came to over the refresher's recent
    /// window ([`crate::refresh::EVIDENCE_WINDOW_MS`]), in configuration order, excluded
    /// candidates included; empty for a snapshot built outside a refresher.
    pub fn recent(&self) -> &[(CandidateKey, TallyCounts)] {
        &self.recent
    }

    /// How long the window of [`RouteSnapshot::recent`] spans (ms): up to
    /// [`crate::refresh::EVIDENCE_WINDOW_MS`], less while the gateway is younger.
    pub fn recent_span_ms(&self) -> u64 {
        self.recent_span_ms
    }

    /// The probability that the next pick goes to each candidate (by its index in
    /// [`RouteSnapshot::candidates`]), read off the plan the refresh decided: all zero
    /// when the plan refuses (shedding, unavailable). Computed on demand, off the request
    /// path.
    pub fn plan_shares(&self) -> Vec<f64> {
        let mut shares = vec![0.0; self.candidates.len()];
        match &self.plan {
            Plan::Unavailable { .. } | Plan::Shed { .. } => {}
            Plan::Lone(i) => {
                if let Some(s) = shares.get_mut(*i as usize) {
                    *s = 1.0;
                }
            }
            Plan::Spread(pool)
            | Plan::Overflow(pool)
            | Plan::ByCapacity(pool)
            | Plan::Fallback(pool) => {
                let total = pool.cumulative.last().copied().unwrap_or(0.0);
                if total > 0.0 && total.is_finite() {
                    let mut before = 0.0;
                    for (&member, &upto) in pool.members.iter().zip(&pool.cumulative) {
                        if let Some(s) = shares.get_mut(member as usize) {
                            *s += (upto - before) / total;
                        }
                        before = upto;
                    }
                }
            }
        }
        shares
    }

    /// The grid's room for this model as a site's router would state it: the sum of the
    /// fresh band headroom the routable candidates' responses carried (0 for one that said
    /// it is full), `None` when none carried one. What a gateway puts in its own
    /// `x-llm-d-flow-band-headroom-requests`.
    pub fn grid_headroom(&self) -> Option<u64> {
        self.grid_headroom
    }

    /// The model this snapshot routes.
    pub fn model(&self) -> &Arc<str> {
        &self.model
    }

    /// Healthy candidates, least-loaded first; unmeasured ones last.
    pub fn candidates(&self) -> &[Candidate] {
        &self.candidates
    }

    /// Candidates out of selection and why.
    pub fn excluded(&self) -> &[Excluded] {
        &self.excluded
    }

    /// Gives each candidate the live slot its requests are counted in, where `slot_of`
    /// has one ([`Candidate::with_requests`]).
    pub(crate) fn count_requests_in(
        &mut self,
        slot_of: impl Fn(&CandidateKey) -> Option<Arc<LiveSlot>>,
    ) {
        for c in &mut self.candidates {
            if let Some(slot) = slot_of(c.key()) {
                c.requests = Requests(Some(slot));
            }
        }
    }

    /// The weighted draw a pick makes, when it makes one.
    pub(crate) fn pool(&self) -> Option<&Pool> {
        match &self.plan {
            Plan::Spread(pool)
            | Plan::Overflow(pool)
            | Plan::ByCapacity(pool)
            | Plan::Fallback(pool) => Some(pool),
            Plan::Unavailable { .. } | Plan::Shed { .. } | Plan::Lone(_) => None,
        }
    }

    /// The path a pick will take.
    pub fn path(&self) -> Option<Path> {
        use Path;
        match self.plan {
            Plan::Unavailable { .. } | Plan::Shed { .. } => None,
            Plan::Lone(_) => Some(Path::Lone),
            Plan::Spread(_) => Some(Path::Spread),
            Plan::Overflow(_) => Some(Path::Overflow),
            Plan::ByCapacity(_) => Some(Path::ByCapacity),
            Plan::Fallback(_) => Some(Path::Fallback),
        }
    }
}

fn members(candidates: &[Candidate], keep: impl Fn(&Candidate) -> bool) -> Vec<u32> {
    (0..candidates.len() as u32)
        .filter(|&i| keep(&candidates[i as usize]))
        .collect()
}

/// The turnover a site whose answers have not shown its own is read at (ms): the median
/// of those the model's other sites have shown, else the configured `prior`. The prior
/// is one figure for every deployment; read against sites whose answers have shown a
/// turnover twenty times shorter, a site that had not answered yet read twenty times
/// slower, took about a twentieth of the picks and so was slow to answer at all (two
/// sites answering in 100 ms against the 2 s default, through real Envoy), and against
/// sites twenty times longer it would read twenty times faster and be flooded.
fn unlearned_turnover(candidates: &[Candidate], prior: f64) -> f64 {
    let mut learned: Vec<f64> = candidates
        .iter()
        .filter_map(Candidate::learned_turnover)
        .collect();
    if learned.is_empty() {
        return prior;
    }
    learned.sort_by(f64::total_cmp);
    learned[learned.len() / 2]
}

fn plan(
    candidates: &[Candidate],
    refusals: Refusals,
    default_turnover_ms: f64,
    unlearned_ms: f64,
) -> Plan {
    if candidates.is_empty() {
        return Plan::Unavailable {
            retry_after_ms: refusals.unavailable_retry_after_ms,
        };
    }
    if let Some(retry_after_ms) = refusals.shed_retry_after_ms {
        return Plan::Shed { retry_after_ms };
    }
    let measured = members(candidates, |c| c.state != CandidateState::Unmeasured);
    if measured.is_empty() {
        // Loss of signal is least preferred, and load is spread by capacity rather than
        // herded onto one unmeasured site.
        let all = members(candidates, |_| true);
        return Plan::Fallback(Pool::new(all, candidates, fallback_weight));
    }
    let with_headroom = members(candidates, |c| c.headroom > 0.0);
    let room: f64 = with_headroom
        .iter()
        .map(|&i| candidates[i as usize].headroom)
        .sum();
    // What the grid is serving now: every measured site's busy slots turning over. Picks
    // arrive about that fast; headroom short of it cannot take them all (a drained 8-slot
    // site with half a request a second of headroom took every request for five seconds
    // while three others queued: 200 requests on 8 slots).
    let serving: f64 = measured
        .iter()
        .map(|&i| {
            let c = &candidates[i as usize];
            c.signal.pace * c.reach * c.signal.rho_now.min(1.0) * 1_000.0
                / c.effective_turnover(unlearned_ms, default_turnover_ms)
        })
        .sum();
    let by_capacity = |c: &Candidate| by_capacity_weight(c, default_turnover_ms, unlearned_ms);
    let fastest_ms = fastest_turnover(candidates, &with_headroom);
    let drawn = |c: &Candidate| c.headroom * speed(c, fastest_ms);
    let drawn_room: f64 = with_headroom
        .iter()
        .map(|&i| drawn(&candidates[i as usize]))
        .sum();
    match with_headroom.as_slice() {
        // Every measured site is full: a site without a signal (a frozen remote operator,
        // an EPP gone silent) is tried too, by its capacity as if it held nothing waiting,
        // before work piles up further on the full ones or the model sheds. It is least
        // preferred only while some site has room.
        [] => Plan::ByCapacity(Pool::new(
            members(candidates, |_| true),
            candidates,
            by_capacity,
        )),
        _ if room.is_finite() && room < serving => {
            let spread = room / serving;
            let capacity_total: f64 = measured
                .iter()
                .map(|&i| by_capacity(&candidates[i as usize]))
                .sum();
            Plan::Overflow(Pool::new(measured, candidates, |c| {
                spread * drawn(c) / drawn_room.max(f64::MIN_POSITIVE)
                    + (1.0 - spread) * by_capacity(c) / capacity_total.max(f64::MIN_POSITIVE)
            }))
        }
        [only] => Plan::Lone(*only),
        _ => Plan::Spread(Pool::new(with_headroom, candidates, drawn)),
    }
}

/// The shortest turnover the answers of the sites with headroom have shown (ms), or
/// infinity when none has shown one.
fn fastest_turnover(candidates: &[Candidate], with_headroom: &[u32]) -> f64 {
    with_headroom
        .iter()
        .filter_map(|&i| candidates[i as usize].learned_turnover())
        .fold(f64::INFINITY, f64::min)
}

/// How much slower than the fastest site with headroom a site may turn over and still
/// be drawn as fast as it (`docs/routing.md`, "Selection"): each learned turnover is a smoothed mean of a site's
/// own recent answers, and with heavy-tailed request durations those of equally fast
/// sites differ by about this much; read as speed, that noise took shares from sites at
/// random.
pub const SPEED_MARGIN: f64 = 1.5;

/// How fast a site with headroom serves against the fastest of them, in `(0, 1]`:
/// [`SPEED_MARGIN`] times that fastest turnover over its own, at most 1, and 1 where its
/// answers have not shown one. A site is drawn by its headroom times this. Headroom
/// counts how many requests a site can take, not how soon it answers them: a free slot
/// at a site three times slower serves a request three times slower, so while every site
/// has free slots (light load) a draw by headroom alone kept a slowed site's slots full
/// of requests the faster sites would have served at once. Whether the room covers what
/// the grid serves is still counted in requests, unscaled.
fn speed(c: &Candidate, fastest_ms: f64) -> f64 {
    match c.learned_turnover() {
        Some(own) if fastest_ms.is_finite() => (SPEED_MARGIN * fastest_ms / own).min(1.0),
        _ => 1.0,
    }
}

/// The weight of a measured site when no site's headroom covers the picks: capacity as
/// the slots that drain its queue turned over in the configured turnover, at its own
/// turnover as [`Candidate::drain_ms`] reads it (a site whose answers hold slots three
/// times longer drains its queue three times slower; measured on five sites, the largest
/// slowed twofold: p99 at 85% 1.7x the oracle's without this, 1.2x with it),
/// times pace, [`evened`] by the work waiting per unit of that capacity. A site whose
/// answers said "full" keeps at least
/// [`LIVE_FACTOR_FLOOR`] of it, unless its reading already shows it full (work waiting at
/// every unit or in flow control): the weight has counted that queue, so only its serving
/// failures weigh on it. Every site is out of headroom here and the fast ones refuse
/// most often, being drawn most; floored for it, they handed their share to the site
/// drawn least, a slow one, whose full queue takes longest to drain (two slowed sites at
/// 124% of what they served: its band 37 s deep at the median). Its pace is not read
/// either: pace backs off while a site keeps more than two waiting per slot, which counts
/// the same queue again, in requests rather than time, so past saturation every fast
/// site, its band four per slot, was paced down to an eighth while a site three times
/// slower, fewer per slot waiting longer, kept its whole pace and a share that grew its
/// queue to three times the others' in time (the simulator's standard sites at 95% load,
/// over ten runs: a p99 1.11x the oracle's with pace read here, 1.04x without).
fn by_capacity_weight(c: &Candidate, default_turnover_ms: f64, unlearned_ms: f64) -> f64 {
    let slots = c.draining_slots() * default_turnover_ms
        / c.draining_turnover(unlearned_ms, default_turnover_ms);
    let (live, pace) = if c.state == CandidateState::Full {
        (c.serving_factor, 1.0)
    } else {
        (c.live_factor, c.signal.pace)
    };
    // The waiting work per unit of that capacity is its drain time in configured turnovers.
    live.max(LIVE_FACTOR_FLOOR) * pace * evened(slots, c.drain_ms / default_turnover_ms)
}

/// The weight of a site when nothing is measured: its capacity, [`evened`] by this
/// gateway's own requests there past that capacity per unit of it (the queue the gateway
/// knows it made), as the by-capacity weights read a measured queue. Drawn
/// by capacity alone, a site whose learned size ran a little over its share of the load
/// kept that share while its queue grew for as long as the signals stayed away (with
/// every EPP silent for 90 s, the smallest site's waits reached 7 s while the others
/// had free slots). Free slots are not drawn for: the weights stand until the next
/// refresh, and drawing by the gateway's own count of free slots herded a second's
/// picks onto the site that read most free.
fn fallback_weight(c: &Candidate) -> f64 {
    evened(c.reach, (c.own - c.reach).max(0.0) / c.reach)
}

/// `slots` over the square of one plus the work waiting per slot: the weight a queue
/// leaves a site when no site has room, so a backlog evens out towards equal waits (the
/// square, against plain inverse proportion, lowered the simulator's p99 at 95% load by
/// 10-35% on every seed tried and left 85% unchanged).
fn evened(slots: f64, waiting_per_slot: f64) -> f64 {
    let share = 1.0 / (1.0 + waiting_per_slot);
    slots * share * share
}

/// Every model's snapshot from one refresh: what the daemon swaps in atomically.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouteTable {
    models: crate::hash::FastMap<Arc<str>, RouteSnapshot>,
}

impl RouteTable {
    /// A table of the given snapshots (a later snapshot for the same model wins).
    pub fn from_snapshots(snapshots: impl IntoIterator<Item = RouteSnapshot>) -> Self {
        Self {
            models: snapshots
                .into_iter()
                .map(|s| (s.model.clone(), s))
                .collect(),
        }
    }

    /// The snapshot of `model`, if the model is configured.
    pub fn get(&self, model: &str) -> Option<&RouteSnapshot> {
        self.models.get(model)
    }

    /// Every snapshot, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &RouteSnapshot> {
        self.models.values()
    }

    /// The snapshot of `model`, to attach what the refresher knows before publishing.
    pub(crate) fn get_mut(&mut self, model: &str) -> Option<&mut RouteSnapshot> {
        self.models.get_mut(model)
    }

    /// Every snapshot, to resolve its counters before the table is published.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut RouteSnapshot> {
        self.models.values_mut()
    }

    /// Number of models.
    pub fn len(&self) -> usize {
        self.models.len()
    }

    /// No models configured.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }
}

#[cfg(test)]
#[allow(
    clippy::float_cmp,
    reason = "sentinels and floors are exact values, compared exactly on purpose"
)]
mod tests {
    use super::*;

    pub(crate) fn cand(site: &str, capacity: f64, score: f64) -> Candidate {
        Candidate::measured(
            CandidateKey::new(site, "p"),
            capacity,
            score,
            score,
            0.0,
            false,
        )
    }

    const REFUSE: Refusals = Refusals {
        shed_retry_after_ms: None,
        unavailable_retry_after_ms: 5_000,
    };

    #[test]
    fn candidates_sort_least_loaded_first_and_unmeasured_last() {
        let s = RouteSnapshot::new(
            "m",
            vec![
                Candidate::unmeasured(CandidateKey::new("u", "p"), 100.0),
                cand("busy", 10.0, 3.0),
                cand("idle", 10.0, 0.1),
                cand("mid", 10.0, 0.5),
            ],
            vec![],
            REFUSE,
        );
        let order: Vec<_> = s.candidates().iter().map(|c| &*c.key.site).collect();
        assert_eq!(order, ["idle", "mid", "busy", "u"]);
    }

    #[test]
    fn paths_follow_the_number_of_sites_with_headroom() {
        use Path;
        let path = |cs: Vec<Candidate>| RouteSnapshot::new("m", cs, vec![], REFUSE).path();
        // With the defaults (turnover 2 s, spread over 2 s) headroom is c (2 - rho) / 2
        // per second: zero from rho 2 up.
        assert_eq!(path(vec![cand("a", 1.0, 0.1)]), Some(Path::Lone));
        assert_eq!(
            path(vec![cand("a", 1.0, 0.1), cand("b", 1.0, 1.5)]),
            Some(Path::Spread)
        );
        assert_eq!(
            path(vec![cand("a", 1.0, 0.1), cand("b", 1.0, 5.0)]),
            Some(Path::Lone)
        );
        assert_eq!(
            path(vec![cand("a", 1.0, 3.0), cand("b", 1.0, 2.0)]),
            Some(Path::ByCapacity)
        );
        let full = Candidate::measured(CandidateKey::new("f", "p"), 1.0, 2.0, 2.0, 3.0, true);
        assert_eq!(path(vec![full]), Some(Path::ByCapacity));
        assert_eq!(
            path(vec![Candidate::unmeasured(
                CandidateKey::new("u", "p"),
                4.0
            )]),
            Some(Path::Fallback)
        );
        assert_eq!(path(vec![]), None);
    }

    #[test]
    fn among_sites_with_free_slots_one_slower_than_the_margin_is_drawn_less_by_how_much_slower() {
        let site = |name: &str, turnover_ms: f64| {
            cand(name, 16.0, 0.25).with_signal(Signal {
                rho_now: 0.25,
                life_ms: 1_000.0,
                pace: 1.0,
                turnover_ms,
            })
        };
        let weights = |cs: Vec<Candidate>| {
            let s = RouteSnapshot::new("m", cs, vec![], REFUSE);
            let Plan::Spread(pool) = &s.plan else {
                panic!("both have room: {:?}", s.path())
            };
            let drawn =
                |i: usize| pool.cumulative[i] - if i == 0 { 0.0 } else { pool.cumulative[i - 1] };
            let by_site: std::collections::HashMap<String, (f64, f64)> = pool
                .members
                .iter()
                .enumerate()
                .map(|(at, &c)| {
                    let c = &s.candidates()[c as usize];
                    (c.key.site.to_string(), (drawn(at), c.headroom()))
                })
                .collect();
            by_site
        };
        // The same slots and load, one site's answers three times slower: its headroom
        // (turnover plus free slots) is drawn at the margin over three.
        let w = weights(vec![site("fast", 2_000.0), site("slow", 6_000.0)]);
        let (fast, slow) = (w["fast"], w["slow"]);
        assert!((fast.0 - fast.1).abs() < 1e-9, "{w:?}");
        assert!((slow.0 - slow.1 * SPEED_MARGIN / 3.0).abs() < 1e-9, "{w:?}");
        // Within the margin a site counts as fast as the fastest; just past it, slower.
        let at_margin = 2_000.0 * SPEED_MARGIN;
        let w = weights(vec![site("fast", 2_000.0), site("at", at_margin)]);
        assert!((w["at"].0 - w["at"].1).abs() < 1e-9, "{w:?}");
        let w = weights(vec![site("fast", 2_000.0), site("past", at_margin + 1.0)]);
        assert!(w["past"].0 < w["past"].1, "{w:?}");
        // A site whose answers have shown no turnover yet is drawn by its headroom.
        let w = weights(vec![site("fast", 2_000.0), site("new", 0.0)]);
        assert!((w["new"].0 - w["new"].1).abs() < 1e-9, "{w:?}");
    }

    #[test]
    fn a_site_without_a_signal_takes_the_overflow_only_once_every_measured_site_is_full() {
        let unknown = || Candidate::unmeasured(CandidateKey::new("remote", "p"), 8.0);
        let share_of_remote = |s: &RouteSnapshot| {
            let mut rng = crate::SplitMix64::new(3);
            let picks = 4_000;
            let hits = (0..picks)
                .filter(|_| {
                    matches!(s.pick(&mut rng), crate::Decision::Route { candidate, .. }
                        if &*candidate.key().site == "remote")
                })
                .count();
            hits as f64 / f64::from(picks)
        };
        // The local site drowns: 25 times its capacity, most of it waiting.
        let drowning = Candidate::measured(
            CandidateKey::new("local", "p"),
            8.0,
            25.0,
            25.0,
            192.0,
            true,
        );
        let s = RouteSnapshot::new("m", vec![drowning, unknown()], vec![], REFUSE);
        assert_eq!(s.path(), Some(Path::ByCapacity));
        assert!(share_of_remote(&s) > 0.9, "{}", share_of_remote(&s));
        // While the local site has room, the unknown one gets nothing.
        let s = RouteSnapshot::new(
            "m",
            vec![cand("local", 8.0, 0.2), unknown()],
            vec![],
            REFUSE,
        );
        assert!(share_of_remote(&s) < f64::EPSILON);
    }

    #[test]
    fn headroom_exactly_zero_is_none_and_just_above_is_some() {
        let s = RouteSnapshot::new(
            "m",
            vec![cand("at", 10.0, 2.0), cand("below", 10.0, 1.999)],
            vec![],
            REFUSE,
        );
        let h = |site: &str| {
            s.candidates()
                .iter()
                .find(|c| &*c.key.site == site)
                .unwrap()
                .headroom()
        };
        assert_eq!(h("at"), 0.0);
        assert!(h("below") > 0.0);
        // Its sliver of headroom is far short of what both sites serve: overflow.
        assert_eq!(s.path(), Some(Path::Overflow));
    }

    #[test]
    fn a_signal_with_nan_or_out_of_range_values_is_clamped() {
        let c = cand("a", 10.0, 0.5).with_signal(Signal {
            rho_now: f64::NAN,
            life_ms: -1.0,
            pace: 7.0,
            turnover_ms: f64::NAN,
        });
        let sig = c.signal();
        assert_eq!(sig.rho_now, crate::RHO_CAP);
        assert_eq!(sig.life_ms, 0.0);
        assert_eq!(sig.pace, 1.0);
        assert_eq!(sig.turnover_ms, 0.0, "unknown, not huge");
        let long = cand("a", 10.0, 0.5).with_signal(Signal {
            turnover_ms: MAX_TURNOVER_MS * 2.0,
            ..sig
        });
        assert_eq!(long.signal().turnover_ms, MAX_TURNOVER_MS);
        let u = Candidate::unmeasured(CandidateKey::new("u", "p"), 4.0).with_signal(sig);
        assert_eq!(
            u.signal().rho_now,
            UNMEASURED,
            "unmeasured ignores a signal"
        );
    }

    #[test]
    fn plan_shares_are_the_pick_probabilities_and_sum_to_one_or_to_nothing_when_refusing() {
        let s = RouteSnapshot::new(
            "m",
            vec![
                cand("a", 10.0, 0.1),
                cand("b", 10.0, 0.5),
                cand("c", 10.0, 0.9),
            ],
            vec![],
            REFUSE,
        );
        let shares = s.plan_shares();
        assert!(
            (shares.iter().sum::<f64>() - 1.0).abs() < 1e-12,
            "{shares:?}"
        );
        // Drawn empirically, each share is what the picks come to.
        let mut rng = crate::SplitMix64::new(9);
        let mut hits = [0_u32; 3];
        let picks = 20_000;
        for _ in 0..picks {
            if let crate::Decision::Route { index, .. } = s.pick(&mut rng) {
                hits[index] += 1;
            }
        }
        for (i, share) in shares.iter().enumerate() {
            let seen = f64::from(hits[i]) / f64::from(picks);
            assert!((seen - share).abs() < 0.02, "{i}: {seen} against {share}");
        }
        let shed = RouteSnapshot::new(
            "m",
            vec![cand("a", 10.0, 0.1)],
            vec![],
            Refusals {
                shed_retry_after_ms: Some(1_000),
                ..REFUSE
            },
        );
        assert_eq!(shed.plan_shares(), [0.0]);
        assert!(
            RouteSnapshot::new("m", vec![], vec![], REFUSE)
                .plan_shares()
                .is_empty()
        );
    }

    #[test]
    fn rho_exactly_one_has_no_room() {
        assert_eq!(cand("a", 1.0, 1.0).state(), CandidateState::NoRoom);
        assert_eq!(cand("a", 1.0, 0.999_999).state(), CandidateState::Room);
    }

    #[test]
    fn nan_inputs_never_reach_a_snapshot() {
        let c = Candidate::measured(
            CandidateKey::new("a", "p"),
            f64::NAN,
            f64::NAN,
            f64::NAN,
            f64::NAN,
            false,
        );
        assert!(c.capacity().is_finite() && c.rho().is_finite() && c.score().is_finite());
        assert!(c.capacity() >= crate::CAPACITY_FLOOR);
        let u = Candidate::unmeasured(CandidateKey::new("a", "p"), f64::NAN);
        assert_eq!(u.capacity(), crate::CAPACITY_FLOOR);
        assert_eq!(u.score(), UNMEASURED);
    }
}
