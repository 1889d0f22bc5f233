//! A queueing model of one LLM serving site: the truth that a simulated EPP reports and a
//! simulated model server lives by.
//!
//! A site has N serving endpoints (model-server pods), each with S slots (concurrent
//! sequences a vLLM instance runs) and its own FIFO wait queue. The EPP in front places
//! each arrival on the endpoint with the lowest (running + queued) / slots, as its queue
//! and KV-cache scorers roughly do. With flow control on (`queue_per_endpoint`), a request
//! that finds every endpoint's queue at its limit is held at the site, before scheduling,
//! and is placed when room appears. Service times are log-normal (most requests short, a
//! long tail), split into a prefill share (time to first token) and decode.
//!
//! # Flow-control bands
//!
//! Under flow control a request is held in a priority band ([`bands`]): the band it asks
//! for if provisioned, else band [`FALLBACK_PRIORITY`]. Held requests are dispatched
//! highest priority first, in arrival order within a band. A bounded band at its capacity
//! refuses new requests ([`Refusal::Saturated`]); with a flow-control TTL, a request held
//! longer fails ([`FailReason::TtlExpired`]). Without any band configured the site has
//! one unbounded band 0, which is exactly the single flow-control hold it always had.
//! The band that admitted a request is fixed when it enters the band and reported when it
//! leaves ([`SiteEvent::Started`], [`SiteModel::admission`]); headroom is read from the
//! live registry whenever asked ([`SiteModel::headroom_for`]).
//!
//! # Time
//!
//! Time is a `now` parameter in milliseconds on any monotonic clock the caller chooses:
//! the routing simulator passes virtual time, the loopback server real elapsed time. The
//! model never reads a clock. Every completion is processed at its own finish time, in
//! order, so a discrete-event simulator that advances in jumps sees exact start times.
//!
//! # Driving it
//!
//! `arrive` admits a request; `advance(now)` completes what finished by `now` and starts
//! what waited; `poll_event` hands back what happened (started, finished, failed), and
//! `next_deadline` says when the next completion is due.

pub mod bands;

use std::collections::VecDeque;

use crate::Error;
use crate::sim_rng::SimRng;
use bands::Bands;
pub use bands::{
    BandConfig, BandSnapshot, CapacityReader, DropReason, FALLBACK_PRIORITY, FlowAdmission,
    Priority, SnapshotError,
};

/// A request's id within one site, in arrival order.
pub type RequestId = u64;

/// The most endpoints a site may have: far above any real pool, and low enough that the
/// fake EPP's exposition stays well under the scraper's 1 MiB cap.
pub const MAX_SITE_ENDPOINTS: usize = 256;
/// The most slots an endpoint may have (a vLLM `max_num_seqs` is typically 128-1024).
pub const MAX_SLOTS_PER_ENDPOINT: usize = 1024;
/// The smallest degrade factor: at most ten times faster than configured.
pub const MIN_DEGRADE_FACTOR: f64 = 0.1;
/// The largest degrade factor: a thousand times slower is already a dead site.
pub const MAX_DEGRADE_FACTOR: f64 = 1_000.0;
/// The longest flow-control TTL: an hour is far past any client's patience, so a longer
/// one is a mistake.
pub const MAX_FLOW_TTL_MS: u64 = 3_600_000;
/// Log-normal draws are cut this many standard deviations (of the log) above the median:
/// one draw in a billion, so no percentile a report reads is changed, while a
/// pathological draw cannot hold a slot for ever.
pub const TAIL_CUT_SIGMAS: f64 = 6.0;
/// The widest service-time spread a scenario may ask for: chat traffic's is 0.5-0.8, and
/// at 2 one request in a hundred already takes over a hundred times the median.
pub const MAX_SERVICE_SIGMA: f64 = 2.0;

/// The EPP's TTFT histogram bounds, in seconds (as in its own test expositions).
pub const TTFT_BUCKETS_SECONDS: [f64; 35] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0,
    1200.0, 1800.0, 2700.0, 3600.0,
];
/// The EPP's TPOT histogram bounds, in seconds.
pub const TPOT_BUCKETS_SECONDS: [f64; 29] = [
    0.0005, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6,
    0.8, 1.0, 1.5, 2.0, 3.0, 4.5, 6.0, 12.0, 18.0, 24.0, 30.0, 36.0, 48.0,
];

/// How long requests take once they hold a slot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServiceTime {
    /// Median prompt + decode time, in ms.
    pub median_ms: f64,
    /// Standard deviation of the log of the time: 0.5-0.8 matches the spread of chat
    /// traffic's output lengths.
    pub sigma: f64,
    /// The share of the time spent before the first token (prefill).
    pub prefill_share: f64,
    /// Output tokens per request, for the time per output token.
    pub output_tokens: u32,
}

impl Default for ServiceTime {
    fn default() -> Self {
        Self {
            median_ms: 2_000.0,
            sigma: 0.6,
            prefill_share: 0.1,
            output_tokens: 200,
        }
    }
}

impl ServiceTime {
    /// One request's undegraded service time in ms, within `1..=`[`Self::tail_cut_ms`].
    pub fn draw(&self, rng: &mut SimRng) -> u64 {
        let ms = rng.lognormal(self.median_ms, self.sigma);
        ms.clamp(1.0, self.tail_cut_ms()).round() as u64
    }

    /// The first field out of its range and why, if any: the one check of a service-time
    /// distribution, for a site's configuration and a scenario file alike.
    pub fn problem(&self) -> Option<(&'static str, &'static str)> {
        if !(self.median_ms.is_finite() && self.median_ms >= 1.0) {
            return Some(("service.median_ms", "must be finite and at least 1"));
        }
        if !(self.sigma.is_finite() && (0.0..=MAX_SERVICE_SIGMA).contains(&self.sigma)) {
            return Some(("service.sigma", "must be within 0..=MAX_SERVICE_SIGMA"));
        }
        if !(0.0..=1.0).contains(&self.prefill_share) {
            return Some(("service.prefill_share", "must be within 0..=1"));
        }
        if self.output_tokens == 0 {
            return Some(("service.output_tokens", "must be at least 1"));
        }
        None
    }

    /// The longest draw: [`TAIL_CUT_SIGMAS`] above the median.
    pub fn tail_cut_ms(&self) -> f64 {
        (self.median_ms * (TAIL_CUT_SIGMAS * self.sigma).exp()).max(1.0)
    }

    /// The mean of the (uncut) distribution, in ms: what a capacity figure in requests
    /// per second divides by.
    pub fn mean_ms(&self) -> f64 {
        self.median_ms * (self.sigma * self.sigma / 2.0).exp()
    }
}

/// The shape of one site.
#[derive(Clone, Debug, PartialEq)]
pub struct SiteConfig {
    /// Endpoint names are `{name}-ep-{i}`.
    pub name: String,
    /// Serving endpoints, `1..=MAX_SITE_ENDPOINTS`.
    pub endpoints: usize,
    /// Slots per endpoint, `1..=MAX_SLOTS_PER_ENDPOINT`.
    pub slots_per_endpoint: usize,
    /// With `Some(q)`, flow control is on: a request that finds every endpoint with all
    /// slots busy and `q` queued is held at the site. `None`: endpoint queues are
    /// unbounded and nothing is held (the EPP's default, flow control off).
    pub queue_per_endpoint: Option<usize>,
    /// The flow-control priority bands, used only with flow control on. Band
    /// [`FALLBACK_PRIORITY`] is provisioned unbounded unless listed here; empty (the
    /// default) is the one unbounded hold of an EPP with a single band.
    pub bands: Vec<BandConfig>,
    /// With `Some(ms)` (`1..=MAX_FLOW_TTL_MS`), a request held in a band longer fails
    /// ([`FailReason::TtlExpired`]), as llm-d's `defaultRequestTTL` drops it. `None`:
    /// held requests wait as long as it takes.
    pub flow_ttl_ms: Option<u64>,
    /// Service-time distribution.
    pub service: ServiceTime,
}

impl SiteConfig {
    /// A site of `endpoints` x `slots` with default service times and flow control off.
    pub fn new(name: impl Into<String>, endpoints: usize, slots_per_endpoint: usize) -> Self {
        Self {
            name: name.into(),
            endpoints,
            slots_per_endpoint,
            queue_per_endpoint: None,
            bands: Vec::new(),
            flow_ttl_ms: None,
            service: ServiceTime::default(),
        }
    }

    fn validate(&self) -> Result<(), Error> {
        let invalid = |field, reason| Err(Error::InvalidConfig { field, reason });
        if self.endpoints == 0 || self.endpoints > MAX_SITE_ENDPOINTS {
            return invalid("endpoints", "must be 1..=MAX_SITE_ENDPOINTS");
        }
        if self.slots_per_endpoint == 0 || self.slots_per_endpoint > MAX_SLOTS_PER_ENDPOINT {
            return invalid("slots_per_endpoint", "must be 1..=MAX_SLOTS_PER_ENDPOINT");
        }
        if self
            .flow_ttl_ms
            .is_some_and(|ms| ms == 0 || ms > MAX_FLOW_TTL_MS)
        {
            return invalid("flow_ttl_ms", "must be 1..=MAX_FLOW_TTL_MS");
        }
        Bands::<Request>::validate(&self.bands)?;
        if let Some((field, reason)) = self.service.problem() {
            return invalid(field, reason);
        }
        Ok(())
    }
}

/// What the caller knows about an arriving request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestSpec {
    /// Whether the client streams (only streaming requests feed the EPP's TTFT and TPOT
    /// histograms under the current names).
    pub streaming: bool,
    /// The undegraded service time in ms, when the caller draws it (so several sites or
    /// policies can serve the very same request); `None` draws from the site's own
    /// distribution and generator.
    pub service_ms: Option<u64>,
}

/// Why a site refused a request at arrival.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No endpoint is up.
    NoReadyEndpoint,
    /// Flow control is on and the band that would admit it is at its capacity.
    Saturated,
}

impl Refusal {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoReadyEndpoint => "no_ready_endpoint",
            Self::Saturated => "saturated",
        }
    }

    /// The reason flow control reports for it (`x-llm-d-request-dropped-reason`).
    pub fn drop_reason(self) -> DropReason {
        match self {
            Self::NoReadyEndpoint => DropReason::NoEndpoints,
            Self::Saturated => DropReason::Saturated,
        }
    }
}

/// Why an admitted request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailReason {
    /// Its endpoint was taken away while it waited or ran.
    EndpointRemoved,
    /// It was held by flow control when the last endpoint went away.
    NoEndpointLeft,
    /// It was held by flow control longer than the flow-control TTL.
    TtlExpired,
}

impl FailReason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EndpointRemoved => "endpoint_removed",
            Self::NoEndpointLeft => "no_endpoint_left",
            Self::TtlExpired => "ttl_expired",
        }
    }

    /// The reason flow control reports for it, when flow control dropped it (a request
    /// already dispatched to a removed endpoint was not dropped by flow control).
    pub fn drop_reason(self) -> Option<DropReason> {
        match self {
            Self::EndpointRemoved => None,
            Self::NoEndpointLeft => Some(DropReason::NoEndpoints),
            Self::TtlExpired => Some(DropReason::TtlExpired),
        }
    }
}

/// What happened to a request, in the order it happened.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SiteEvent {
    /// The request took a slot.
    Started {
        /// Which request.
        id: RequestId,
        /// Which endpoint serves it.
        endpoint: usize,
        /// When it arrived at the site.
        arrived_at: u64,
        /// When it took the slot (`at - arrived_at` is its queueing delay).
        at: u64,
        /// When its first token is out.
        first_token_at: u64,
        /// When it completes, unless its endpoint goes away first.
        finish_at: u64,
        /// The band that admitted it and how long it waited there; `None` when flow
        /// control is off.
        flow: Option<FlowAdmission>,
    },
    /// The request completed.
    Finished {
        /// Which request.
        id: RequestId,
        /// When.
        at: u64,
    },
    /// The request was dropped.
    Failed {
        /// Which request.
        id: RequestId,
        /// When.
        at: u64,
        /// Why.
        reason: FailReason,
    },
}

/// A cumulative histogram with fixed bounds, as an EPP keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per-bucket (not cumulative) counts; the last is the `+Inf` bucket.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one observation.
    pub fn observe(&mut self, value: f64) {
        let bucket = self.bounds.partition_point(|b| *b < value);
        self.counts[bucket] += 1;
        self.sum += value;
        self.count += 1;
    }

    /// `(upper bound, cumulative count)` per bucket, ending with `(+Inf, count)`.
    pub fn cumulative(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        self.bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.counts.iter().scan(0, |acc, n| {
                *acc += n;
                Some(*acc)
            }))
    }

    /// Sum of observations.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// The cumulative counters an EPP keeps for a site.
#[derive(Clone, Debug, PartialEq)]
pub struct Counters {
    /// Requests answered successfully.
    pub requests: u64,
    /// Requests refused at arrival or dropped after admission.
    pub errors: u64,
    /// Time to first token of successful streaming requests, in seconds, queueing
    /// included (what a client sees).
    pub ttft_streaming: Histogram,
    /// Whole duration of successful non-streaming requests (the EPP's TTFT for them).
    pub ttft_non_streaming: Histogram,
    /// Time per output token of successful streaming requests, in seconds.
    pub tpot: Histogram,
}

impl Counters {
    fn new() -> Self {
        Self {
            requests: 0,
            errors: 0,
            ttft_streaming: Histogram::new(&TTFT_BUCKETS_SECONDS),
            ttft_non_streaming: Histogram::new(&TTFT_BUCKETS_SECONDS),
            tpot: Histogram::new(&TPOT_BUCKETS_SECONDS),
        }
    }
}

/// One endpoint's state, as the EPP would see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointView<'a> {
    /// Its name (`model_server_endpoint`).
    pub name: &'a str,
    /// Whether it is serving (a ready pod).
    pub up: bool,
    /// Its slots.
    pub slots: usize,
    /// Requests holding a slot.
    pub running: usize,
    /// Requests waiting in its queue.
    pub queued: usize,
}

impl EndpointView<'_> {
    /// KV-cache utilization derived from occupancy: the share of slots in use. A vLLM
    /// instance fills its KV cache roughly in proportion to the sequences it runs.
    pub fn kv_cache_utilization(&self) -> f64 {
        self.running as f64 / self.slots as f64
    }
}

#[derive(Clone, Copy, Debug)]
struct Request {
    id: RequestId,
    arrived_at: u64,
    service_ms: u64,
    streaming: bool,
    /// Set when it leaves its band (flow control on only).
    flow: Option<FlowAdmission>,
}

#[derive(Clone, Copy, Debug)]
struct Running {
    request: Request,
    first_token_at: u64,
    finish_at: u64,
}

#[derive(Clone, Debug)]
struct Endpoint {
    name: String,
    up: bool,
    running: Vec<Running>,
    queue: VecDeque<Request>,
}

/// One site's queues, slots and counters.
#[derive(Clone, Debug)]
pub struct SiteModel {
    config: SiteConfig,
    endpoints: Vec<Endpoint>,
    bands: Bands<Request>,
    degrade: f64,
    rng: SimRng,
    next_id: RequestId,
    clock: u64,
    events: VecDeque<SiteEvent>,
    counters: Counters,
}

/// The model is its own capacity reader: the EPP's response layer and its flow controller
/// read one registry.
impl CapacityReader for SiteModel {
    fn capacity_snapshot(&self, priority: Priority) -> Result<Option<BandSnapshot>, SnapshotError> {
        Ok(self.band_snapshot(priority))
    }
}

impl SiteModel {
    /// A site with every endpoint up, idle, at time 0; `seed` fixes its own draws.
    pub fn new(config: SiteConfig, seed: u64) -> Result<Self, Error> {
        config.validate()?;
        let endpoints = (0..config.endpoints)
            .map(|i| Endpoint {
                name: format!("{}-ep-{i}", config.name),
                up: true,
                running: Vec::with_capacity(config.slots_per_endpoint),
                queue: VecDeque::new(),
            })
            .collect();
        Ok(Self {
            bands: Bands::new(&config.bands),
            config,
            endpoints,
            degrade: 1.0,
            rng: SimRng::new(seed),
            next_id: 0,
            clock: 0,
            events: VecDeque::new(),
            counters: Counters::new(),
        })
    }

    /// The configuration it was built from.
    pub fn config(&self) -> &SiteConfig {
        &self.config
    }

    /// Admits a request arriving at `now` (completions up to `now` are processed first).
    /// A request that finds a free slot starts at once (a `Started` event is queued).
    /// Under flow control it asks for band [`FALLBACK_PRIORITY`].
    pub fn arrive(&mut self, now: u64, spec: RequestSpec) -> Result<RequestId, Refusal> {
        self.arrive_prioritized(now, spec, FALLBACK_PRIORITY)
    }

    /// Admits a request asking for band `priority`: under flow control it enters that
    /// band if provisioned, else the fallback band, and is refused when that band is at
    /// its capacity. Without flow control the priority plays no part.
    ///
    /// The priority is an argument rather than a [`RequestSpec`] field so that callers
    /// building a spec field by field keep compiling.
    pub fn arrive_prioritized(
        &mut self,
        now: u64,
        spec: RequestSpec,
        priority: Priority,
    ) -> Result<RequestId, Refusal> {
        self.advance(now);
        if !self.endpoints.iter().any(|e| e.up) {
            self.counters.errors += 1;
            return Err(Refusal::NoReadyEndpoint);
        }
        let band = self.bands.resolve(priority);
        if self.flow_control() && self.bands.is_full(band) {
            self.counters.errors += 1;
            return Err(Refusal::Saturated);
        }
        let id = self.next_id;
        self.next_id += 1;
        let service_ms = spec
            .service_ms
            .unwrap_or_else(|| self.config.service.draw(&mut self.rng));
        let request = Request {
            id,
            arrived_at: self.clock,
            service_ms,
            streaming: spec.streaming,
            flow: None,
        };
        if self.flow_control() {
            // Every request passes through its band; dispatch then takes the highest
            // band's oldest first, so an arrival never overtakes one already waiting in
            // its band or a higher one.
            self.bands.push(band, request);
            self.dispatch_held(self.clock);
        } else if let Some(e) = self.pick_endpoint() {
            self.place(e, request, self.clock);
        }
        Ok(id)
    }

    fn flow_control(&self) -> bool {
        self.config.queue_per_endpoint.is_some()
    }

    /// Draws one undegraded service time from the site's own distribution and generator
    /// (for a caller that shapes it, e.g. an embedding that only prefills).
    pub fn draw_service_ms(&mut self) -> u64 {
        self.config.service.draw(&mut self.rng)
    }

    /// Completes every request finishing by `now`, each at its own finish time, and
    /// starts what was waiting for the freed slots.
    pub fn advance(&mut self, now: u64) {
        loop {
            let finish = self.earliest_finish().filter(|(_, _, at)| *at <= now);
            let expiry = self.next_expiry().filter(|at| *at <= now);
            // A finish and an expiry at the same instant: the finish first, so the slot
            // it frees can still take the request that would expire.
            let (e, i, at) = match (finish, expiry) {
                (Some(f), x) if x.is_none_or(|x| f.2 <= x) => f,
                (_, Some(x)) => {
                    self.expire(x);
                    continue;
                }
                _ => break,
            };
            let done = self.endpoints[e].running.swap_remove(i);
            self.clock = self.clock.max(at);
            self.record_success(&done);
            self.events.push_back(SiteEvent::Finished {
                id: done.request.id,
                at,
            });
            self.fill(e, at);
            self.dispatch_held(at);
        }
        self.clock = self.clock.max(now);
    }

    /// The next thing that happened, oldest first.
    pub fn poll_event(&mut self) -> Option<SiteEvent> {
        self.events.pop_front()
    }

    /// When the next running request completes or the next held request expires.
    pub fn next_deadline(&self) -> Option<u64> {
        let finish = self.earliest_finish().map(|(_, _, at)| at);
        match (finish, self.next_expiry()) {
            (Some(f), Some(x)) => Some(f.min(x)),
            (f, x) => f.or(x),
        }
    }

    /// When the oldest held request of any band reaches the flow-control TTL.
    fn next_expiry(&self) -> Option<u64> {
        let ttl = self.config.flow_ttl_ms?;
        self.bands.fronts().map(|r| r.arrived_at + ttl).min()
    }

    /// Fails every held request whose TTL ran out by `at`.
    fn expire(&mut self, at: u64) {
        self.clock = self.clock.max(at);
        let Some(ttl) = self.config.flow_ttl_ms else {
            return;
        };
        let expired = self.bands.pop_expired(|r| r.arrived_at + ttl <= at);
        for r in expired {
            self.fail(r.id, at, FailReason::TtlExpired);
        }
    }

    /// Withdraws a request (its client went away); frees its slot or its place in line.
    /// Returns whether the site still held it.
    pub fn cancel(&mut self, now: u64, id: RequestId) -> bool {
        self.advance(now);
        if self.bands.remove(|r| r.id == id).is_some() {
            return true;
        }
        for e in 0..self.endpoints.len() {
            let endpoint = &mut self.endpoints[e];
            if let Some(i) = endpoint.queue.iter().position(|r| r.id == id) {
                endpoint.queue.remove(i);
                // Its queue place may be the room a held request waited for.
                self.dispatch_held(self.clock);
                return true;
            }
            if let Some(i) = endpoint.running.iter().position(|r| r.request.id == id) {
                endpoint.running.swap_remove(i);
                self.fill(e, self.clock);
                self.dispatch_held(self.clock);
                return true;
            }
        }
        false
    }

    /// Sets the degrade factor: every request that starts from now on takes `factor`
    /// times its service time. Requests already running keep theirs.
    pub fn set_degrade(&mut self, factor: f64) -> Result<(), Error> {
        if !(MIN_DEGRADE_FACTOR..=MAX_DEGRADE_FACTOR).contains(&factor) {
            return Err(Error::DegradeOutOfRange {
                factor,
                min: MIN_DEGRADE_FACTOR,
                max: MAX_DEGRADE_FACTOR,
            });
        }
        self.degrade = factor;
        Ok(())
    }

    /// The current degrade factor.
    pub fn degrade(&self) -> f64 {
        self.degrade
    }

    /// Takes endpoint `index` away (its running and queued requests fail) or brings it
    /// back (held requests move onto it).
    pub fn set_endpoint_up(&mut self, now: u64, index: usize, up: bool) -> Result<(), Error> {
        if index >= self.endpoints.len() {
            return Err(Error::NoSuchEndpoint {
                index,
                endpoints: self.endpoints.len(),
            });
        }
        self.advance(now);
        let at = self.clock;
        if up {
            self.endpoints[index].up = true;
            self.dispatch_held(at);
            return Ok(());
        }
        let endpoint = &mut self.endpoints[index];
        if !endpoint.up {
            return Ok(());
        }
        endpoint.up = false;
        let failed: Vec<RequestId> = endpoint
            .running
            .drain(..)
            .map(|r| r.request.id)
            .chain(endpoint.queue.drain(..).map(|r| r.id))
            .collect();
        for id in failed {
            self.fail(id, at, FailReason::EndpointRemoved);
        }
        if !self.endpoints.iter().any(|e| e.up) {
            let held: Vec<RequestId> = self.bands.drain().into_iter().map(|r| r.id).collect();
            for id in held {
                self.fail(id, at, FailReason::NoEndpointLeft);
            }
        }
        Ok(())
    }

    /// Takes every endpoint away (a pool scaled to zero, a crashed node pool).
    pub fn take_all_endpoints(&mut self, now: u64) {
        for i in 0..self.endpoints.len() {
            // In range by construction.
            let _ = self.set_endpoint_up(now, i, false);
        }
    }

    /// Brings every endpoint back.
    pub fn restore_all_endpoints(&mut self, now: u64) {
        for i in 0..self.endpoints.len() {
            let _ = self.set_endpoint_up(now, i, true);
        }
    }

    /// Every endpoint, up or not, in index order.
    pub fn endpoints(&self) -> impl ExactSizeIterator<Item = EndpointView<'_>> + '_ {
        let slots = self.config.slots_per_endpoint;
        self.endpoints.iter().map(move |e| EndpointView {
            name: &e.name,
            up: e.up,
            slots,
            running: e.running.len(),
            queued: e.queue.len(),
        })
    }

    /// Requests held by flow control, before any endpoint, over all bands.
    pub fn held(&self) -> usize {
        self.bands.len()
    }

    /// The band at `priority` now (capacity and length), if provisioned: a live read of
    /// the registry flow control admits through.
    pub fn band_snapshot(&self, priority: Priority) -> Option<BandSnapshot> {
        self.bands.snapshot(priority)
    }

    /// Every provisioned band now, lowest priority first.
    pub fn band_snapshots(&self) -> impl Iterator<Item = (Priority, BandSnapshot)> + '_ {
        self.bands.snapshots()
    }

    /// Provisions band `priority` or changes its capacity (`None`: unbounded), as a
    /// control plane does at runtime. Requests already admitted keep their band.
    pub fn set_band(&mut self, priority: Priority, capacity: Option<usize>) -> Result<(), Error> {
        self.bands.set(priority, capacity)
    }

    /// Deprovisions an empty band (not the fallback band). Requests it admitted earlier
    /// keep it as their band, which then resolves to nothing.
    pub fn remove_band(&mut self, priority: Priority) -> Result<(), Error> {
        self.bands.unset(priority)
    }

    /// How request `id` went through flow control: `Some` once it left its band and
    /// while it is still waiting on an endpoint or running; `None` for a request flow
    /// control did not admit (flow control off, refused), one still held, or one that
    /// ended (finished, failed, expired, cancelled).
    pub fn admission(&self, id: RequestId) -> Option<FlowAdmission> {
        self.endpoints.iter().find_map(|e| {
            e.queue
                .iter()
                .find(|r| r.id == id)
                .or_else(|| e.running.iter().map(|r| &r.request).find(|r| r.id == id))
                .and_then(|r| r.flow)
        })
    }

    /// The headroom of the band that admitted request `id`, read from the registry now
    /// (never cached at admission); `None` when the band is unbounded or no longer
    /// provisioned, or the request has no admission (see [`SiteModel::admission`]).
    pub fn headroom_for(&self, id: RequestId) -> Option<u64> {
        let band = self.admission(id).map(|a| a.band);
        bands::band_headroom(Some(self), band)
    }

    /// Slots on endpoints that are up.
    pub fn capacity(&self) -> usize {
        self.endpoints.iter().filter(|e| e.up).count() * self.config.slots_per_endpoint
    }

    /// Requests running.
    pub fn running(&self) -> usize {
        self.endpoints.iter().map(|e| e.running.len()).sum()
    }

    /// Requests admitted and not yet running (endpoint queues plus flow control).
    pub fn waiting(&self) -> usize {
        self.endpoints.iter().map(|e| e.queue.len()).sum::<usize>() + self.bands.len()
    }

    /// The cumulative counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The latest time the model has been advanced to.
    pub fn now(&self) -> u64 {
        self.clock
    }

    fn earliest_finish(&self) -> Option<(usize, usize, u64)> {
        let mut best: Option<(usize, usize, u64, RequestId)> = None;
        for (e, endpoint) in self.endpoints.iter().enumerate() {
            for (i, r) in endpoint.running.iter().enumerate() {
                let key = (r.finish_at, r.request.id);
                if best.is_none_or(|(_, _, at, id)| key < (at, id)) {
                    best = Some((e, i, r.finish_at, r.request.id));
                }
            }
        }
        best.map(|(e, i, at, _)| (e, i, at))
    }

    /// The endpoint the EPP would place a request on: the least occupied one that can take
    /// it (a free slot, or queue room under flow control), lowest index on ties.
    fn pick_endpoint(&self) -> Option<usize> {
        let slots = self.config.slots_per_endpoint;
        let cap = self.config.queue_per_endpoint;
        self.endpoints
            .iter()
            .enumerate()
            .filter(|(_, e)| e.up)
            .filter(|(_, e)| cap.is_none_or(|q| e.running.len() < slots || e.queue.len() < q))
            .min_by_key(|(i, e)| (e.running.len() + e.queue.len(), *i))
            .map(|(i, _)| i)
    }

    fn place(&mut self, e: usize, request: Request, at: u64) {
        self.endpoints[e].queue.push_back(request);
        self.fill(e, at);
    }

    /// Starts queued requests on endpoint `e` while it has free slots.
    fn fill(&mut self, e: usize, at: u64) {
        let slots = self.config.slots_per_endpoint;
        while self.endpoints[e].up && self.endpoints[e].running.len() < slots {
            let Some(request) = self.endpoints[e].queue.pop_front() else {
                break;
            };
            let service = ((request.service_ms as f64 * self.degrade).round() as u64).max(1);
            let prefill = (service as f64 * self.config.service.prefill_share).round() as u64;
            let running = Running {
                request,
                first_token_at: at + prefill,
                finish_at: at + service,
            };
            self.endpoints[e].running.push(running);
            self.events.push_back(SiteEvent::Started {
                id: request.id,
                endpoint: e,
                arrived_at: request.arrived_at,
                at,
                first_token_at: running.first_token_at,
                finish_at: running.finish_at,
                flow: request.flow,
            });
        }
    }

    /// Moves held requests onto endpoints while any has room, highest band first,
    /// recording on each the band that admitted it and how long it waited there.
    fn dispatch_held(&mut self, at: u64) {
        while !self.bands.is_empty() {
            let Some(e) = self.pick_endpoint() else {
                break;
            };
            if let Some((band, mut request)) = self.bands.pop_next() {
                request.flow = Some(FlowAdmission {
                    band,
                    queued_ms: at.saturating_sub(request.arrived_at),
                });
                self.place(e, request, at);
            }
        }
    }

    fn fail(&mut self, id: RequestId, at: u64, reason: FailReason) {
        self.counters.errors += 1;
        self.events.push_back(SiteEvent::Failed { id, at, reason });
    }

    fn record_success(&mut self, done: &Running) {
        let r = &done.request;
        self.counters.requests += 1;
        let seconds = |ms: u64| ms as f64 / 1_000.0;
        if r.streaming {
            self.counters
                .ttft_streaming
                .observe(seconds(done.first_token_at - r.arrived_at));
            let decode_ms = done.finish_at - done.first_token_at;
            self.counters
                .tpot
                .observe(seconds(decode_ms) / f64::from(self.config.service.output_tokens));
        } else {
            self.counters
                .ttft_non_streaming
                .observe(seconds(done.finish_at - r.arrived_at));
        }
    }
}

#[cfg(test)]
mod band_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(ms: u64) -> RequestSpec {
        RequestSpec {
            streaming: true,
            service_ms: Some(ms),
        }
    }

    fn site(endpoints: usize, slots: usize) -> SiteModel {
        SiteModel::new(SiteConfig::new("s", endpoints, slots), 1).unwrap()
    }

    fn drain(m: &mut SiteModel) -> Vec<SiteEvent> {
        std::iter::from_fn(|| m.poll_event()).collect()
    }

    fn starts(events: &[SiteEvent]) -> Vec<(RequestId, u64, u64)> {
        events
            .iter()
            .filter_map(|e| match e {
                SiteEvent::Started {
                    id, arrived_at, at, ..
                } => Some((*id, *arrived_at, *at)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_request_with_a_free_slot_starts_at_once_and_finishes_after_its_service_time() {
        let mut m = site(1, 1);
        let id = m.arrive(100, fixed(500)).unwrap();
        assert_eq!(
            drain(&mut m),
            vec![SiteEvent::Started {
                id,
                endpoint: 0,
                arrived_at: 100,
                at: 100,
                first_token_at: 150,
                finish_at: 600,
                flow: None,
            }]
        );
        assert_eq!(m.next_deadline(), Some(600));
        m.advance(599);
        assert!(drain(&mut m).is_empty());
        m.advance(600);
        assert_eq!(drain(&mut m), vec![SiteEvent::Finished { id, at: 600 }]);
        assert_eq!(m.counters().requests, 1);
        assert_eq!(m.counters().ttft_streaming.count(), 1);
        assert!((m.counters().ttft_streaming.sum() - 0.05).abs() < 1e-9);
    }

    #[test]
    fn waiting_requests_start_in_fifo_order_at_the_exact_time_a_slot_frees() {
        let mut m = site(1, 2);
        m.arrive(0, fixed(1_000)).unwrap();
        m.arrive(0, fixed(300)).unwrap();
        m.arrive(10, fixed(100)).unwrap();
        m.arrive(20, fixed(100)).unwrap();
        // One jump far ahead: every start must still carry its own time.
        m.advance(10_000);
        let got = starts(&drain(&mut m));
        assert_eq!(got, vec![(0, 0, 0), (1, 0, 0), (2, 10, 300), (3, 20, 400)]);
        assert_eq!(m.running() + m.waiting(), 0);
    }

    #[test]
    fn arrivals_go_to_the_least_occupied_endpoint() {
        let mut m = site(3, 2);
        for _ in 0..7 {
            m.arrive(0, fixed(1_000)).unwrap();
        }
        let occupancy: Vec<(usize, usize)> = m.endpoints().map(|e| (e.running, e.queued)).collect();
        assert_eq!(occupancy, vec![(2, 1), (2, 0), (2, 0)]);
        assert_eq!(m.waiting(), 1);
    }

    #[test]
    fn flow_control_holds_requests_once_every_endpoint_queue_is_full() {
        let mut config = SiteConfig::new("s", 2, 1);
        config.queue_per_endpoint = Some(1);
        let mut m = SiteModel::new(config, 1).unwrap();
        for _ in 0..6 {
            m.arrive(0, fixed(100)).unwrap();
        }
        assert_eq!(m.held(), 2, "2 running, 2 queued, 2 held");
        m.advance(100);
        assert_eq!(m.held(), 0, "both held moved into the freed queues");
        m.advance(1_000);
        let got = starts(&drain(&mut m));
        let order: Vec<RequestId> = got.iter().map(|s| s.0).collect();
        assert_eq!(order, vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(got[4].2, 200);
    }

    #[test]
    fn a_degraded_site_serves_new_requests_slower() {
        let mut m = site(1, 4);
        m.arrive(0, fixed(100)).unwrap();
        m.set_degrade(3.0).unwrap();
        m.arrive(0, fixed(100)).unwrap();
        let finishes: Vec<u64> = drain(&mut m)
            .iter()
            .filter_map(|e| match e {
                SiteEvent::Started { finish_at, .. } => Some(*finish_at),
                _ => None,
            })
            .collect();
        assert_eq!(finishes, vec![100, 300]);
    }

    #[test]
    fn the_degrade_factor_is_accepted_at_its_bounds_and_refused_one_past() {
        let mut m = site(1, 1);
        assert!(m.set_degrade(MIN_DEGRADE_FACTOR).is_ok());
        assert!(m.set_degrade(MAX_DEGRADE_FACTOR).is_ok());
        let below = f64::from_bits(MIN_DEGRADE_FACTOR.to_bits() - 1);
        let above = f64::from_bits(MAX_DEGRADE_FACTOR.to_bits() + 1);
        for bad in [below, above, f64::NAN, f64::INFINITY] {
            assert!(
                matches!(m.set_degrade(bad), Err(Error::DegradeOutOfRange { .. })),
                "{bad}"
            );
        }
        assert!((m.degrade() - MAX_DEGRADE_FACTOR).abs() < f64::EPSILON);
    }

    #[test]
    fn endpoint_and_slot_counts_are_accepted_at_their_limits_and_refused_one_past() {
        let ok = |e, s| SiteModel::new(SiteConfig::new("s", e, s), 0).is_ok();
        assert!(ok(MAX_SITE_ENDPOINTS, 1));
        assert!(!ok(MAX_SITE_ENDPOINTS + 1, 1));
        assert!(ok(1, MAX_SLOTS_PER_ENDPOINT));
        assert!(!ok(1, MAX_SLOTS_PER_ENDPOINT + 1));
        assert!(!ok(0, 1));
        assert!(!ok(1, 0));
    }

    #[test]
    fn taking_an_endpoint_away_fails_its_requests_and_restoring_it_serves_again() {
        let mut m = site(2, 1);
        m.arrive(0, fixed(1_000)).unwrap();
        m.arrive(0, fixed(1_000)).unwrap();
        m.arrive(0, fixed(1_000)).unwrap(); // queued on endpoint 0
        drain(&mut m);
        m.set_endpoint_up(10, 0, false).unwrap();
        let failed: Vec<RequestId> = drain(&mut m)
            .iter()
            .filter_map(|e| match e {
                SiteEvent::Failed { id, at: 10, reason } => {
                    assert_eq!(*reason, FailReason::EndpointRemoved);
                    Some(*id)
                }
                _ => None,
            })
            .collect();
        assert_eq!(failed, vec![0, 2]);
        assert_eq!(m.counters().errors, 2);
        assert_eq!(m.capacity(), 1);
        m.take_all_endpoints(20);
        assert_eq!(m.capacity(), 0);
        assert_eq!(
            m.arrive(30, fixed(10)),
            Err(Refusal::NoReadyEndpoint),
            "nothing serves"
        );
        assert_eq!(m.counters().errors, 4);
        m.restore_all_endpoints(40);
        assert_eq!(m.capacity(), 2);
        assert!(m.arrive(50, fixed(10)).is_ok());
        assert!(matches!(
            m.set_endpoint_up(50, 2, false),
            Err(Error::NoSuchEndpoint { index: 2, .. })
        ));
    }

    #[test]
    fn a_cancelled_running_request_frees_its_slot_for_the_next() {
        let mut m = site(1, 1);
        let a = m.arrive(0, fixed(1_000)).unwrap();
        let b = m.arrive(0, fixed(1_000)).unwrap();
        drain(&mut m);
        assert!(m.cancel(100, a));
        assert!(!m.cancel(100, a), "already gone");
        assert_eq!(starts(&drain(&mut m)), vec![(b, 0, 100)]);
        assert_eq!(
            m.counters().requests,
            0,
            "a cancel is neither success nor error"
        );
        assert_eq!(m.counters().errors, 0);
    }

    #[test]
    fn kv_cache_utilization_follows_slot_occupancy() {
        let mut m = site(1, 4);
        m.arrive(0, fixed(1_000)).unwrap();
        let e = m.endpoints().next().unwrap();
        assert!((e.kv_cache_utilization() - 0.25).abs() < 1e-12);
    }

    #[test]
    fn the_same_seed_draws_the_same_service_times() {
        let run = |seed| {
            let mut m = SiteModel::new(SiteConfig::new("s", 1, 64), seed).unwrap();
            for _ in 0..32 {
                m.arrive(0, RequestSpec::default()).unwrap();
            }
            drain(&mut m)
        };
        assert_eq!(run(9), run(9));
        assert_ne!(run(9), run(10));
    }

    #[test]
    fn histograms_are_cumulative_and_end_at_the_count() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        for v in [0.05, 0.1, 0.5, 7.0] {
            h.observe(v);
        }
        let got: Vec<(f64, u64)> = h.cumulative().collect();
        assert_eq!(got, vec![(0.1, 2), (1.0, 3), (f64::INFINITY, 4)]);
        assert_eq!(h.count(), 4);
    }

    #[test]
    fn service_draws_keep_the_tail_a_percentile_reads_and_stop_six_sigmas_out() {
        let s = ServiceTime {
            sigma: MAX_SERVICE_SIGMA,
            ..ServiceTime::default()
        };
        let mut rng = SimRng::new(5);
        let mut draws: Vec<u64> = (0..100_000).map(|_| s.draw(&mut rng)).collect();
        draws.sort_unstable();
        let cut = s.tail_cut_ms().round() as u64;
        assert!(draws.iter().all(|d| (1..=cut).contains(d)));
        // The 99.9th percentile of a log-normal is 3.09 sigmas above the median: far past
        // the old cut at twenty times the median, and left as drawn.
        let p999 = draws[99_900] as f64;
        let expected = s.median_ms * (3.09 * s.sigma).exp();
        assert!(
            (p999 / expected - 1.0).abs() < 0.2,
            "p99.9 {p999} against {expected}"
        );
        assert!(p999 > s.median_ms * 20.0);
        let cut_sigma = ServiceTime { sigma: 0.0, ..s };
        assert!((cut_sigma.tail_cut_ms() - s.median_ms).abs() < 1e-9);
    }

    #[test]
    fn a_service_spread_past_the_widest_is_refused() {
        let wide = |sigma: f64| ServiceTime {
            sigma,
            ..ServiceTime::default()
        };
        assert_eq!(wide(MAX_SERVICE_SIGMA).problem(), None);
        assert_eq!(
            wide(MAX_SERVICE_SIGMA + 0.01)
                .problem()
                .map(|(field, _)| field),
            Some("service.sigma")
        );
        let mut site = SiteConfig::new("s", 1, 1);
        site.service = wide(MAX_SERVICE_SIGMA + 0.01);
        assert!(SiteModel::new(site, 0).is_err());
    }
}
