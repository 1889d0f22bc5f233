//! One policy's world: shared sites in virtual time, one router and one view of the
//! signals per gateway, requests and probes crossing the WAN.
//!
//! Events at the same instant run in a fixed order: scheduled episodes (degrade, blip),
//! signal instants, requests reaching their site, Prequal's probes reaching theirs,
//! refusals reaching their gateway, grid's probes of ejected sites reaching theirs,
//! arrivals at the gateways. With zero round trips a request reaches its site at the
//! instant it is routed, exactly as in the single-gateway simulator before round trips
//! existed.
//!
//! # What a site answers, and what the gateway does with it
//!
//! Every gateway follows grid's gateway, whatever its policy picks: a site's answer
//! reaches it half a round trip after it leaves the site, and an attempt that ended
//! before any answer began goes once to another site when `grid_score::retry`'s
//! [`goes_elsewhere`] says so and the gateway's [`RetryBudget`] allows it; otherwise it
//! is the client's failure. What the simulated sites answer, as the loopback kit's
//! simulated site does:
//!
//! | the site | answer | goes elsewhere |
//! | --- | --- | --- |
//! | band full (flow control) | 429 `rejected-saturated` | yes |
//! | no endpoint up at arrival, or the last went away while it was held | 503 | yes |
//! | its endpoint went away before a streamed answer began, or during a plain one | 503 | yes |
//! | its endpoint went away during a streamed answer | the stream is cut | no: the client saw it begin |
//! | failing fast | its episode's status (and Retry-After) | 503 and 429: yes; a 5xx else: no |

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use super::arrivals::Arrival;
use super::policy::{Choice, Policy, Router};
use super::prequal::ProbeReading;
use super::setup::{SignalTransport, SimConfig};
use super::signals::{
    EPOCH_MS, FULL_STATUS, GATEWAY_POLL_PHASE_MS, Heard, LOCAL_CADENCE_MS, SERVER_ERRORS,
    SignalCounts, SignalFaults, SignalPath, UNAVAILABLE_STATUS,
};
use super::skywalker::MAX_HELD;
use super::stats::{RunRecord, Summary, bump};
use crate::site_model::{
    BandConfig, FALLBACK_PRIORITY, FailReason, Priority, Refusal, RequestId, RequestSpec,
    SiteConfig, SiteEvent, SiteModel,
};
use grid_score::live::{BandKey, DropReason, FlowObservation};
use grid_score::retry::{AttemptEnd, RetryBudget, goes_elsewhere};

/// How long grid's gateway waits for a probe of an ejected site to answer (its
/// `poller::PROBE_TIMEOUT`): a site further than this round trip away never answers one.
pub const PROBE_TIMEOUT_MS: u64 = 2_000;

/// Whether a probe of a site is answered: the site serves (an endpoint up, not failing
/// fast) and its answer is back within [`PROBE_TIMEOUT_MS`].
pub fn probe_answered(serves: bool, rtt_ms: u64) -> bool {
    serves && rtt_ms <= PROBE_TIMEOUT_MS
}

/// Where a refused request goes once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum RetryPlan {
    /// Grid's gateway: the target its routing view named when the request was routed
    /// (the view a request loads once and keeps), `None` when it named none.
    Snapshot(Option<usize>),
    /// The other policies: their own choice among the other sites when the refusal
    /// reaches the gateway.
    OwnChoice,
}

/// What the run knows of a request between its routing and its end.
#[derive(Clone, Copy, Debug)]
struct Flight {
    gateway: usize,
    /// When the request reached its gateway.
    client_ms: u64,
    /// When this attempt left the gateway.
    sent_ms: u64,
    started_ms: Option<u64>,
    first_token_ms: Option<u64>,
    arrived_ms: u64,
    streaming: bool,
    service_ms: u64,
    /// 1, or 2 for the retry.
    attempt: u8,
    retry: RetryPlan,
    /// The flow-control band it asks for (its objective's priority).
    priority: Priority,
}

/// A request on its way to a site.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Transit {
    at_ms: u64,
    seq: u64,
    site: usize,
    gateway: usize,
    client_ms: u64,
    sent_ms: u64,
    service_ms: u64,
    streaming: bool,
    attempt: u8,
    retry: RetryPlan,
    priority: Priority,
}

/// An attempt that ended before any answer began, on its way back to its gateway.
#[derive(Clone, Copy, Debug)]
struct Return {
    /// When it reaches the gateway.
    at_ms: u64,
    seq: u64,
    /// The site that ended it.
    site: usize,
    flight: Flight,
    end: AttemptEnd,
}

impl PartialEq for Return {
    fn eq(&self, other: &Self) -> bool {
        (self.at_ms, self.seq) == (other.at_ms, other.seq)
    }
}
impl Eq for Return {}
impl PartialOrd for Return {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Return {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at_ms, self.seq).cmp(&(other.at_ms, other.seq))
    }
}

/// A probe on its way to a site (Prequal's, or grid's probe of an ejected site).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Probe {
    at_ms: u64,
    seq: u64,
    site: usize,
    gateway: usize,
    sent_ms: u64,
}

/// A change a scenario schedules.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Step {
    Degrade(usize, f64),
    TakeAll(usize),
    RestoreAll(usize),
}

/// What a site says about its own latency to a probe: a moving average of the service
/// times of its recent completions, the way a Prequal server estimates from its own
/// recent queries, forgotten towards the nominal service time as it ages (a site that
/// served nothing for a while has no evidence of being slow any more; without this, a
/// site that was degraded once would read slow forever, since Prequal then sends it
/// nothing to learn from).
#[derive(Clone, Copy, Debug)]
struct SiteLatency {
    /// The averaged service time (ms).
    service_ms: f64,
    /// When it last took a completion (virtual ms).
    updated_ms: u64,
    /// The nominal mean service time it returns to (ms).
    nominal: f64,
}

/// Weight of each new completion in a site's own service-time average.
const SITE_LATENCY_WEIGHT: f64 = 0.05;
/// Time constant (ms) over which a site's average returns to the nominal service time
/// without completions.
const SITE_LATENCY_MEMORY_MS: f64 = 10_000.0;

impl SiteLatency {
    fn observe(&mut self, at_ms: u64, service_ms: u64) {
        self.service_ms = self.current(at_ms);
        self.service_ms += SITE_LATENCY_WEIGHT * (service_ms as f64 - self.service_ms);
        self.updated_ms = at_ms;
    }

    fn current(self, now: u64) -> f64 {
        let age = now.saturating_sub(self.updated_ms) as f64;
        let keep = (-age / SITE_LATENCY_MEMORY_MS).exp();
        self.nominal + (self.service_ms - self.nominal) * keep
    }

    /// The latency a query arriving now should expect: its service, plus the wait of
    /// the requests ahead of it beyond the free slots, served `capacity` at a time.
    fn estimate(self, now: u64, site: &SiteModel) -> ProbeReading {
        let capacity = site.capacity();
        let rif = (site.running() + site.waiting()) as f64;
        if capacity == 0 {
            return ProbeReading {
                site: 0,
                rif_per_slot: f64::INFINITY,
                latency_ms: f64::INFINITY,
                read_ms: 0,
            };
        }
        let c = capacity as f64;
        ProbeReading {
            site: 0,
            rif_per_slot: rif / c,
            latency_ms: self.current(now) * (1.0 + (rif + 1.0 - c).max(0.0) / c),
            read_ms: 0,
        }
    }
}

/// The whole world of one policy.
struct World<'a> {
    config: &'a SimConfig,
    policy: Policy,
    sites: Vec<SiteModel>,
    latency: Vec<SiteLatency>,
    flights: Vec<HashMap<RequestId, Flight>>,
    routers: Vec<Router>,
    record: RunRecord,
    completed: u64,
    failed: u64,
    transits: BinaryHeap<Reverse<Transit>>,
    probes: BinaryHeap<Reverse<Probe>>,
    /// Attempts refused before any answer began, on their way back to their gateway.
    returns: BinaryHeap<Reverse<Return>>,
    /// Grid's probes of ejected sites on their way to the site.
    health: BinaryHeap<Reverse<Probe>>,
    /// Each gateway's retry budget.
    budgets: Vec<RetryBudget>,
    /// Requests each gateway has sent on so far (the count its budget reads).
    taken: Vec<u64>,
    /// Arrivals each gateway holds in its own queue, oldest first (a policy that holds:
    /// [`Choice::Hold`]).
    held: Vec<VecDeque<Arrival>>,
    targets: Vec<usize>,
    seq: u64,
    /// What answers told their gateways, for the policies that read answers (ours):
    /// (gateway, virtual ms it reaches the gateway, site, what it said).
    heard: Option<Vec<(usize, u64, usize, Heard)>>,
    /// The band above band 0, when the run has one: its priority and the key its
    /// requests' objective hashes to.
    high_band: Option<(Priority, BandKey)>,
}

/// The flow-control headers of an answer from `site` to a request of band `priority`
/// read at this instant: the headroom of the band that admitted it, as llm-d's EPP
/// states it (a band not provisioned admits at the fallback band).
fn flow_now(site: &SiteModel, priority: Priority) -> FlowObservation {
    let band = site
        .band_snapshot(priority)
        .or_else(|| site.band_snapshot(FALLBACK_PRIORITY));
    FlowObservation {
        headroom: band.and_then(|b| b.headroom()),
        ..FlowObservation::default()
    }
}

impl World<'_> {
    /// The band key a gateway knows requests of band `priority` by: the objective its
    /// requests name, hashed as the gateway's front ends hash it.
    fn band_key(&self, priority: Priority) -> BandKey {
        match self.high_band {
            Some((p, key)) if p == priority => key,
            _ => BandKey::DEFAULT,
        }
    }

    fn tell(&mut self, gateway: usize, at_ms: u64, site: usize, heard: Heard) {
        if let Some(h) = &mut self.heard {
            h.push((gateway, at_ms, site, heard));
        }
    }

    /// Whether site `s` serves at `t_ms`: an endpoint up and not failing fast.
    fn serves(&self, s: usize, t_ms: u64) -> bool {
        self.sites[s].capacity() > 0 && self.config.fail_fast_at(s, t_ms).is_none()
    }

    /// Whether some site other than `except` serves at `t_ms` and has a free slot or
    /// room in its flow-control band, in the simulator's truth.
    fn room_elsewhere(&self, except: Option<usize>, t_ms: u64) -> bool {
        (0..self.sites.len()).any(|s| {
            let site = &self.sites[s];
            Some(s) != except
                && self.serves(s, t_ms)
                && (site.running() < site.capacity()
                    || site
                        .band_snapshot(0)
                        .and_then(|b| b.headroom())
                        .is_some_and(|h| h > 0))
        })
    }

    /// Routes arrival `a` at its gateway (with `view`, that gateway's signals, for the
    /// policies that read them): the request and any probes set off across the WAN, or
    /// the request held at the gateway.
    fn route(&mut self, a: Arrival, view: Option<&SignalPath>) {
        let g = a.gateway;
        self.record.arrival(a.at_ms);
        if self.routers[g].holds() {
            self.hold(a);
            return;
        }
        let (site, placed) = match self.routers[g].choose(a.at_ms, &self.sites, view) {
            Choice::Site { site, placed } => (site, placed),
            Choice::Refuse { status } => {
                self.refused_by_gateway(a, status);
                return;
            }
            Choice::Hold => unreachable!("only a router that holds answers Hold"),
        };
        let t = self.dispatch(a, site, placed, a.at_ms, view);
        self.send(t);
    }

    /// The gateway refuses arrival `a` itself with `status`.
    fn refused_by_gateway(&mut self, a: Arrival, status: u16) {
        if a.at_ms >= self.config.warmup_ms {
            self.record.refused_by_gateway += 1;
        }
        self.client_failure(None, a.at_ms, a.at_ms, Some(status), false);
    }

    /// Arrival `a` joins its gateway's queue, behind any held before it (refused when the
    /// queue is full), and the queue is pushed on as far as the policy has room.
    fn hold(&mut self, a: Arrival) {
        let g = a.gateway;
        if self.held[g].len() >= MAX_HELD {
            self.refused_by_gateway(a, FULL_STATUS);
            return;
        }
        self.held[g].push_back(a);
        self.dispatch_held(g, a.at_ms);
    }

    /// Gateway `g` pushes its held requests, oldest first, while its policy has a site
    /// for them at `now`. They leave as events of their own (not delivered inline), so
    /// a request ending inside the site's event loop can free room for them.
    fn dispatch_held(&mut self, g: usize, now: u64) {
        while let Some(&a) = self.held[g].front() {
            let Choice::Site { site, placed } = self.routers[g].choose(now, &self.sites, None)
            else {
                return;
            };
            self.held[g].pop_front();
            let t = self.dispatch(a, site, placed, now, None);
            self.transits.push(Reverse(t));
        }
    }

    /// A request of gateway `g`'s to `site` ended at `at_ms` (`ok`, or a failure its
    /// router counts): its router hears it, and what the gateway held may now leave.
    fn ended(&mut self, g: usize, at_ms: u64, site: usize, ok: bool) {
        self.routers[g].ended(at_ms, site, ok);
        self.dispatch_held(g, at_ms);
    }

    /// Arrival `a` leaves its gateway for `site` at `now` (its arrival, or later when it
    /// was held): counted, told, and any probes set off; the request's transit is
    /// returned for the caller to send.
    fn dispatch(
        &mut self,
        a: Arrival,
        site: usize,
        placed: bool,
        now: u64,
        view: Option<&SignalPath>,
    ) -> Transit {
        let config = self.config;
        let g = a.gateway;
        let counted = a.at_ms >= config.warmup_ms;
        let s = &self.sites[site];
        let full = s.running() + s.waiting() >= s.capacity();
        self.record.route(now, site, counted, full);
        if !placed && counted {
            self.record.unplaced += 1;
        }
        self.routers[g].sent(site);
        self.tell(g, now, site, Heard::Sent);
        self.taken[g] += 1;
        // As the gateway's timer does, each second.
        self.budgets[g].sample(EPOCH_MS + now, self.taken[g]);
        self.routers[g].probe_targets(&mut self.targets);
        for &target in &self.targets {
            self.seq += 1;
            self.probes.push(Reverse(Probe {
                at_ms: now + config.rtt_ms(g, target) / 2,
                seq: self.seq,
                site: target,
                gateway: g,
                sent_ms: now,
            }));
        }
        let retry = if self.policy == Policy::Ours {
            // Drawn from the view the request was routed by, as the gateway does.
            RetryPlan::Snapshot(self.routers[g].retry_target(now, &self.sites, view, site))
        } else {
            RetryPlan::OwnChoice
        };
        self.seq += 1;
        Transit {
            at_ms: now + config.rtt_ms(g, site) / 2,
            seq: self.seq,
            site,
            gateway: g,
            client_ms: a.at_ms,
            sent_ms: now,
            service_ms: a.service_ms,
            streaming: a.streaming,
            attempt: 1,
            retry,
            priority: a.priority,
        }
    }

    /// Sets request `t` off to its site: there at once without a round trip.
    fn send(&mut self, t: Transit) {
        if t.at_ms == t.sent_ms {
            self.deliver(t);
        } else {
            self.transits.push(Reverse(t));
        }
    }

    /// Probe `p` reads its site; the reading lands at its gateway a round trip after
    /// it was sent.
    fn probe(&mut self, p: Probe) {
        let mut reading = self.latency[p.site].estimate(p.at_ms, &self.sites[p.site]);
        reading.site = p.site;
        reading.read_ms = p.at_ms;
        let back = p.sent_ms + self.config.rtt_ms(p.gateway, p.site);
        self.routers[p.gateway].land(back, reading);
    }

    /// Grid's gateway probes site `site`, ejected for failing, at `t_ms`.
    fn send_health_probe(&mut self, gateway: usize, site: usize, t_ms: u64) {
        self.seq += 1;
        self.health.push(Reverse(Probe {
            at_ms: t_ms + self.config.rtt_ms(gateway, site) / 2,
            seq: self.seq,
            site,
            gateway,
            sent_ms: t_ms,
        }));
    }

    /// A probe of an ejected site reaches it: answered when the site serves, back at its
    /// gateway a round trip after it was sent (or failed at the probe's bound).
    fn health_probe(&mut self, p: Probe) {
        let rtt = self.config.rtt_ms(p.gateway, p.site);
        let answered = probe_answered(self.serves(p.site, p.at_ms), rtt);
        let back = p.sent_ms + rtt.min(PROBE_TIMEOUT_MS);
        self.tell(p.gateway, back, p.site, Heard::Probe { answered });
    }

    /// When the next request, probe or refusal in flight arrives where it goes.
    fn next_in_flight(&self) -> Option<u64> {
        earliest(&[
            self.transits.peek().map(|t| t.0.at_ms),
            self.probes.peek().map(|p| p.0.at_ms),
            self.returns.peek().map(|r| r.0.at_ms),
            self.health.peek().map(|p| p.0.at_ms),
        ])
    }

    /// Handles the first thing in flight due by `horizon`, in the order the run loop
    /// states for one instant; false when nothing is due. `signals`: every gateway's view,
    /// for the policies that read it.
    fn in_flight_event(&mut self, horizon: u64, signals: &[SignalPath]) -> bool {
        if let Some(Reverse(t)) = self
            .transits
            .peek()
            .copied()
            .filter(|t| t.0.at_ms <= horizon)
        {
            self.transits.pop();
            self.advance(t.at_ms);
            self.deliver(t);
        } else if let Some(Reverse(p)) =
            self.probes.peek().copied().filter(|p| p.0.at_ms <= horizon)
        {
            self.probes.pop();
            self.advance(p.at_ms);
            self.probe(p);
        } else if let Some(Reverse(r)) = self
            .returns
            .peek()
            .copied()
            .filter(|r| r.0.at_ms <= horizon)
        {
            self.returns.pop();
            self.advance(r.at_ms);
            self.returned(r, signals.get(r.flight.gateway));
        } else if let Some(Reverse(p)) =
            self.health.peek().copied().filter(|p| p.0.at_ms <= horizon)
        {
            self.health.pop();
            self.advance(p.at_ms);
            self.health_probe(p);
        } else {
            return false;
        }
        true
    }

    fn advance(&mut self, t_ms: u64) {
        for site in &mut self.sites {
            site.advance(t_ms);
        }
        self.collect();
    }

    /// Drains every site's events into the record and the gateways' observations.
    fn collect(&mut self) {
        let warmup = self.config.warmup_ms;
        for s in 0..self.sites.len() {
            while let Some(event) = self.sites[s].poll_event() {
                match event {
                    SiteEvent::Started {
                        id,
                        arrived_at,
                        at,
                        first_token_at,
                        ..
                    } => {
                        let Some(f) = self.flights[s].get_mut(&id) else {
                            continue;
                        };
                        f.started_ms = Some(at);
                        f.first_token_ms = Some(first_token_at);
                        let f = *f;
                        let half = self.config.rtt_ms(f.gateway, s) / 2;
                        if !f.streaming {
                            // A plain answer is judged when it ends: its site may still
                            // fail it before any byte of it leaves.
                            continue;
                        }
                        // Measured by when the gateway received it, as the routing
                        // counts are.
                        if f.client_ms >= warmup {
                            self.record_delay(s, &f, at, first_token_at);
                        }
                        let seen = first_token_at + half;
                        // The flow-control wait is on the answer's header when the site
                        // runs flow control; otherwise it is inside the time.
                        let queued = at - arrived_at;
                        self.tell(
                            f.gateway,
                            seen,
                            s,
                            Heard::FirstByte {
                                elapsed_ms: seen - f.sent_ms,
                                stated_wait_ms: self
                                    .config
                                    .flow_control
                                    .is_some()
                                    .then_some(queued),
                            },
                        );
                        self.routers[f.gateway].observe(seen, s, Some(seen - f.sent_ms), false);
                        // A streamed answer's head goes out when it takes a slot.
                        let flow = flow_now(&self.sites[s], f.priority);
                        let band = self.band_key(f.priority);
                        self.tell(
                            f.gateway,
                            at + half,
                            s,
                            Heard::Answer {
                                band,
                                flow,
                                status: 200,
                                retry_after_ms: None,
                            },
                        );
                    }
                    SiteEvent::Finished { id, at } => self.finished(s, id, at),
                    SiteEvent::Failed { id, at, reason } => {
                        let Some(f) = self.flights[s].remove(&id) else {
                            continue;
                        };
                        match reason {
                            // Flow control held it past its TTL: 429 `rejected-ttl-expired`.
                            FailReason::TtlExpired => {
                                let flow = FlowObservation {
                                    dropped: Some(DropReason::RejectedTtlExpired),
                                    ..FlowObservation::default()
                                };
                                self.refused(s, f, at, FULL_STATUS, flow);
                            }
                            // A streamed answer already begun is cut: the client saw it.
                            _ if f.streaming && f.started_ms.is_some() => self.cut(s, f, at),
                            // Endpoints gone before any answer began: 503.
                            _ => self.refused(
                                s,
                                f,
                                at,
                                UNAVAILABLE_STATUS,
                                FlowObservation::default(),
                            ),
                        }
                    }
                }
            }
        }
    }

    /// What request `f`, served at site `s` from `started_ms`, waited: its wait there,
    /// plus what it waited before this attempt left its gateway (a refusal's round trip,
    /// or its time held in the gateway's queue).
    fn waited(f: &Flight, started_ms: u64) -> u64 {
        let refused_for = f.sent_ms - f.client_ms;
        started_ms - f.arrived_ms + refused_for
    }

    /// Records the delay of request `f`, served at site `s` from `started_ms`, and its
    /// time to first token, the site's first token made at `first_token_ms`.
    fn record_delay(&mut self, s: usize, f: &Flight, started_ms: u64, first_token_ms: u64) {
        let waited = Self::waited(f, started_ms);
        self.record.delays_ms.push(waited);
        let ttft = waited + self.config.rtt_ms(f.gateway, s) + (first_token_ms - started_ms);
        self.record.ttft_ms.push(ttft);
        if f.priority != 0 {
            self.record.ttft_high_ms.push(ttft);
        }
    }

    /// Records the end-to-end time of request `f`, served at site `s` from `started_ms`
    /// to `finished_ms`.
    fn record_end_to_end(&mut self, s: usize, f: &Flight, started_ms: u64, finished_ms: u64) {
        self.record.e2e_ms.push(
            Self::waited(f, started_ms)
                + self.config.rtt_ms(f.gateway, s)
                + (finished_ms - started_ms),
        );
    }

    /// Request `id` completed at site `s` at `at`: counted, its gateway hears the answer
    /// end (and, for a plain answer, its head) half a round trip later.
    fn finished(&mut self, s: usize, id: RequestId, at: u64) {
        self.completed += 1;
        let Some(f) = self.flights[s].remove(&id) else {
            return;
        };
        if let Some(started) = f.started_ms {
            self.latency[s].observe(at, at - started);
            if f.client_ms >= self.config.warmup_ms {
                // A plain answer's first token reaches its client with its last.
                if !f.streaming {
                    self.record_delay(s, &f, started, at);
                }
                self.record_end_to_end(s, &f, started, at);
            }
        }
        let seen = at + self.config.rtt_ms(f.gateway, s) / 2;
        let sample = (!f.streaming).then(|| seen - f.sent_ms);
        self.routers[f.gateway].observe(seen, s, sample, true);
        self.ended(f.gateway, seen, s, true);
        self.tell(f.gateway, seen, s, Heard::Ended);
        // What the gateway can time of the answer: a stream from its first byte to its
        // last; a plain answer from sending to its head, with the flow-control wait its
        // header states when the site runs flow control.
        let heard = match (f.streaming, f.first_token_ms, f.started_ms) {
            (true, Some(first), _) => Some(Heard::Served {
                held_ms: at - first,
            }),
            (false, _, Some(started)) => Some(Heard::Plain {
                elapsed_ms: seen - f.sent_ms,
                stated_wait_ms: self
                    .config
                    .flow_control
                    .is_some()
                    .then_some(started - f.arrived_ms),
            }),
            _ => None,
        };
        if let Some(heard) = heard {
            self.tell(f.gateway, seen, s, heard);
        }
        if !f.streaming {
            // A plain answer's head is built when it is done.
            let flow = flow_now(&self.sites[s], f.priority);
            let band = self.band_key(f.priority);
            self.tell(
                f.gateway,
                seen,
                s,
                Heard::Answer {
                    band,
                    flow,
                    status: 200,
                    retry_after_ms: None,
                },
            );
        }
    }

    /// Site `s` answered attempt `f` at `at_ms` with `status` before any work began (or,
    /// failing fast, instead of any): its gateway hears the answer half a round trip
    /// later (a quick answer is a latency sample too) and decides there whether it goes
    /// elsewhere.
    fn refused(&mut self, s: usize, f: Flight, at_ms: u64, status: u16, flow: FlowObservation) {
        let retry_after_ms = self
            .config
            .fail_fast_at(s, at_ms)
            .and_then(|ff| ff.retry_after_ms)
            .filter(|_| status == FULL_STATUS);
        let seen = at_ms + self.config.rtt_ms(f.gateway, s) / 2;
        self.routers[f.gateway].observe(seen, s, Some(seen - f.sent_ms), true);
        let failed = status == FULL_STATUS || SERVER_ERRORS.contains(&status);
        self.ended(f.gateway, seen, s, !failed);
        self.tell(f.gateway, seen, s, Heard::Ended);
        let band = self.band_key(f.priority);
        self.tell(
            f.gateway,
            seen,
            s,
            Heard::Answer {
                band,
                flow,
                status,
                retry_after_ms,
            },
        );
        self.seq += 1;
        self.returns.push(Reverse(Return {
            at_ms: seen,
            seq: self.seq,
            site: s,
            flight: f,
            end: AttemptEnd::Answered(status),
        }));
    }

    /// Site `s` cut request `f`'s streamed answer at `at_ms`: the client saw it begin, so
    /// it fails there, half a round trip later.
    fn cut(&mut self, s: usize, f: Flight, at_ms: u64) {
        let seen = at_ms + self.config.rtt_ms(f.gateway, s) / 2;
        self.routers[f.gateway].observe(seen, s, Some(seen - f.sent_ms), true);
        self.ended(f.gateway, seen, s, false);
        self.tell(f.gateway, seen, s, Heard::Failed);
        self.tell(f.gateway, seen, s, Heard::Ended);
        self.client_failure(Some(s), f.client_ms, seen, None, true);
    }

    /// A refusal reaches its gateway at `r.at_ms`: sent once to another site when the
    /// rule and the budget allow, else answered to the client.
    fn returned(&mut self, r: Return, view: Option<&SignalPath>) {
        let f = r.flight;
        let g = f.gateway;
        let counted = f.client_ms >= self.config.warmup_ms;
        let elsewhere = goes_elsewhere(r.end).is_some();
        if elsewhere && f.attempt == 1 {
            let target = match f.retry {
                RetryPlan::Snapshot(target) => target,
                RetryPlan::OwnChoice => {
                    self.routers[g].retry_target(r.at_ms, &self.sites, view, r.site)
                }
            };
            match target {
                None => {
                    if counted {
                        self.record.retries_skipped_no_site += 1;
                    }
                }
                Some(next) if self.budgets[g].try_retry(EPOCH_MS + r.at_ms, self.taken[g]) => {
                    if counted {
                        self.record.retries += 1;
                    }
                    bump(&mut self.record.retries_per_second, r.at_ms);
                    self.routers[g].sent(next);
                    self.tell(g, r.at_ms, next, Heard::Sent);
                    self.seq += 1;
                    self.send(Transit {
                        at_ms: r.at_ms + self.config.rtt_ms(g, next) / 2,
                        seq: self.seq,
                        site: next,
                        gateway: g,
                        client_ms: f.client_ms,
                        sent_ms: r.at_ms,
                        service_ms: f.service_ms,
                        streaming: f.streaming,
                        attempt: 2,
                        retry: f.retry,
                        priority: f.priority,
                    });
                    return;
                }
                Some(_) => {
                    if counted {
                        self.record.retries_skipped_budget += 1;
                    }
                }
            }
        }
        // What the client is told, judged by its status whatever the retry rule said.
        let refused = match r.end {
            AttemptEnd::Answered(status)
                if status == FULL_STATUS || status == UNAVAILABLE_STATUS =>
            {
                Some(status)
            }
            AttemptEnd::Answered(_)
            | AttemptEnd::NotSent
            | AttemptEnd::ResetBeforeAnswer
            | AttemptEnd::NoAnswerInTime => None,
        };
        self.client_failure(Some(r.site), f.client_ms, r.at_ms, refused, false);
    }

    /// A request that reached its gateway at `client_ms` is answered to its client with
    /// a failure at `at_ms`, the last site it tried being `site` (none: the gateway
    /// refused it itself). `refusal`: the status when the client is told it was refused
    /// (a 503 or a 429, the gateway's own or a site's passed on); `served`: its answer had
    /// begun.
    fn client_failure(
        &mut self,
        site: Option<usize>,
        client_ms: u64,
        at_ms: u64,
        refusal: Option<u16>,
        served: bool,
    ) {
        self.failed += 1;
        bump(&mut self.record.failed_per_second, client_ms);
        if client_ms < self.config.warmup_ms {
            return;
        }
        self.record.failed += 1;
        if !served {
            self.record.unserved += 1;
        }
        if let Some(status) = refusal
            && self.room_elsewhere(site, at_ms)
        {
            self.record.refused_room += 1;
            if status == FULL_STATUS {
                self.record.refused_room_full += 1;
            }
        }
    }

    /// Request `t` reaches its site.
    fn deliver(&mut self, t: Transit) {
        let flight = Flight {
            gateway: t.gateway,
            client_ms: t.client_ms,
            sent_ms: t.sent_ms,
            started_ms: None,
            first_token_ms: None,
            arrived_ms: t.at_ms,
            streaming: t.streaming,
            service_ms: t.service_ms,
            attempt: t.attempt,
            retry: t.retry,
            priority: t.priority,
        };
        if let Some(ff) = self.config.fail_fast_at(t.site, t.at_ms) {
            // Answered at once; nothing reaches the model servers, so the EPP sees an
            // idle, healthy pool.
            let status = ff.status;
            self.refused(t.site, flight, t.at_ms, status, FlowObservation::default());
            return;
        }
        match self.sites[t.site].arrive_prioritized(
            t.at_ms,
            RequestSpec {
                streaming: t.streaming,
                service_ms: Some(t.service_ms),
            },
            t.priority,
        ) {
            Ok(id) => {
                self.flights[t.site].insert(id, flight);
                self.collect();
            }
            Err(Refusal::Saturated) => {
                let flow = FlowObservation {
                    dropped: Some(DropReason::RejectedSaturated),
                    ..FlowObservation::default()
                };
                self.refused(t.site, flight, t.at_ms, FULL_STATUS, flow);
            }
            Err(Refusal::NoReadyEndpoint) => {
                self.refused(
                    t.site,
                    flight,
                    t.at_ms,
                    UNAVAILABLE_STATUS,
                    FlowObservation::default(),
                );
            }
        }
    }
}

/// The scheduled steps of a scenario, in time order (ties in the scenario's order).
fn schedule(config: &SimConfig) -> Vec<(u64, Step)> {
    let mut steps: Vec<(u64, Step)> = Vec::new();
    for d in &config.degrade {
        steps.push((d.from_ms, Step::Degrade(d.site, d.factor)));
        steps.push((d.until_ms, Step::Degrade(d.site, 1.0)));
    }
    for b in &config.blips {
        steps.push((b.from_ms, Step::TakeAll(b.site)));
        steps.push((b.until_ms, Step::RestoreAll(b.site)));
    }
    steps.sort_by_key(|(at, _)| *at);
    steps.reverse();
    steps
}

/// The smallest of optional instants.
fn earliest(times: &[Option<u64>]) -> Option<u64> {
    times.iter().flatten().copied().min()
}

impl<'a> World<'a> {
    /// A fresh world for `policy` over `config`, and each gateway's signal path when the
    /// policy reads signals.
    fn new(config: &'a SimConfig, policy: Policy) -> (Self, Vec<SignalPath>) {
        let sites: Vec<SiteModel> = config
            .sites
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let mut c = SiteConfig::new(s.name.clone(), s.endpoints, s.slots_per_endpoint);
                c.service = config.service;
                if let Some(fc) = config.flow_control {
                    c.queue_per_endpoint = Some(fc.queue_per_endpoint);
                    c.bands = vec![BandConfig {
                        priority: FALLBACK_PRIORITY,
                        capacity: Some(fc.band_capacity(s.slots())),
                    }];
                    if let Some(high) = fc.high {
                        c.bands.push(BandConfig {
                            priority: high.priority,
                            capacity: Some(high.capacity(s.slots())),
                        });
                    }
                }
                SiteModel::new(c, config.seed ^ i as u64).expect("scenario sites are valid")
            })
            .collect();
        let names: Vec<String> = config.sites.iter().map(|s| s.name.clone()).collect();
        let faults = SignalFaults {
            epp_silent: config.epp_silent.clone(),
            operator_frozen: config.operator_frozen.clone(),
        };
        let signals: Vec<SignalPath> = if policy.reads_signals() {
            config
                .gateways
                .iter()
                .enumerate()
                .map(|(gi, g)| {
                    let path = SignalPath::new(&names, g.site).with_faults(faults.clone());
                    match config.transport {
                        SignalTransport::Poll => path,
                        SignalTransport::Gossip => {
                            let rtts: Vec<u64> =
                                (0..names.len()).map(|s| config.rtt_ms(gi, s)).collect();
                            path.gossiping(&rtts)
                        }
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        let seconds = (config.duration_ms / 1_000 + 1) as usize;
        let world = World {
            config,
            policy,
            latency: vec![
                SiteLatency {
                    service_ms: config.service.mean_ms(),
                    updated_ms: 0,
                    nominal: config.service.mean_ms(),
                };
                sites.len()
            ],
            flights: vec![HashMap::new(); sites.len()],
            routers: (0..config.gateways.len())
                .map(|g| Router::new(policy, config, g))
                .collect(),
            record: RunRecord::new(sites.len(), seconds),
            sites,
            completed: 0,
            failed: 0,
            transits: BinaryHeap::new(),
            probes: BinaryHeap::new(),
            returns: BinaryHeap::new(),
            health: BinaryHeap::new(),
            budgets: (0..config.gateways.len())
                .map(|_| RetryBudget::new())
                .collect(),
            taken: vec![0; config.gateways.len()],
            held: vec![VecDeque::new(); config.gateways.len()],
            targets: Vec::new(),
            seq: 0,
            heard: (policy == Policy::Ours).then(Vec::new),
            high_band: config
                .flow_control
                .and_then(|fc| fc.high)
                .map(|h| (h.priority, BandKey::named(Some(h.objective().as_bytes())))),
        };
        (world, signals)
    }
}

/// One policy's outcome.
#[derive(Clone, Debug)]
pub struct PolicyResult {
    /// Which policy.
    pub policy: Policy,
    /// Its figures.
    pub summary: Summary,
    /// How the signal path worked in its world.
    pub signals: SignalCounts,
    /// The raw record (delays, per-second routing).
    pub record: RunRecord,
    /// Requests that arrived, measured or not.
    pub arrived: u64,
    /// Requests that completed.
    pub completed: u64,
    /// Requests answered to their client with a failure: refused and not retried (or
    /// refused again when retried), or cut after their answer began.
    pub failed: u64,
}

/// Runs one policy over `arrivals` in its own world.
///
/// # Panics
///
/// When the scenario is not one a site model accepts (a site out of the limits of
/// [`SiteConfig`], a degrade factor out of range): scenario files are checked when read.
pub fn run_policy(config: &SimConfig, arrivals: &[Arrival], policy: Policy) -> PolicyResult {
    let (mut world, mut signals) = World::new(config, policy);
    let mut steps = schedule(config);
    let mut next_signal = 0;
    let mut next_arrival = 0;

    // Each pass handles one event; every event is consumed once and each creates at most
    // a bounded number of later ones, so the loop ends when arrivals run out.
    loop {
        let arrival = arrivals.get(next_arrival);
        let Some(horizon) = earliest(&[arrival.map(|a| a.at_ms), world.next_in_flight()]) else {
            break;
        };
        if let Some(&(at, step)) = steps.last().filter(|(at, _)| *at <= horizon) {
            world.advance(at);
            apply(&mut world.sites, at, step);
            world.collect();
            steps.pop();
            continue;
        }
        if !signals.is_empty() && next_signal <= horizon {
            world.advance(next_signal);
            // The gateway's probe tick: every second, beside its poll.
            let probe_tick = next_signal % LOCAL_CADENCE_MS == GATEWAY_POLL_PHASE_MS;
            for (g, path) in signals.iter_mut().enumerate() {
                path.at(next_signal, &world.sites);
                if probe_tick {
                    for site in path.probes_due(next_signal) {
                        world.send_health_probe(g, site, next_signal);
                    }
                }
            }
            next_signal = signals
                .iter()
                .map(|path| path.next_instant_after(next_signal))
                .min()
                .unwrap_or(u64::MAX);
            continue;
        }
        if world.in_flight_event(horizon, &signals) {
            continue;
        }
        let Some(a) = arrival.copied() else {
            break;
        };
        next_arrival += 1;
        world.advance(a.at_ms);
        if let Some(heard) = &mut world.heard {
            for (g, at, site, h) in heard.drain(..) {
                signals[g].hear(at, site, h);
            }
            signals[a.gateway].settle(a.at_ms);
        }
        world.route(a, signals.get(a.gateway));
    }
    // Drain: every admitted request starts and completes or fails, and every refusal is
    // retried or answered (endpoints taken away by an episode still running are back:
    // nothing is left stranded).
    while let Some(horizon) = earliest(&[
        steps.last().map(|(at, _)| *at),
        world
            .sites
            .iter()
            .filter_map(SiteModel::next_deadline)
            .min(),
        world.next_in_flight(),
    ]) {
        if let Some(&(at, step)) = steps.last().filter(|(at, _)| *at <= horizon) {
            world.advance(at);
            apply(&mut world.sites, at, step);
            world.collect();
            steps.pop();
        } else if !world.in_flight_event(horizon, &signals) {
            world.advance(horizon);
        }
    }
    let mut counts = SignalCounts::default();
    for path in &signals {
        counts.add(path.counts());
    }
    PolicyResult {
        policy,
        summary: Summary::of(&world.record, config.degrade_window()),
        signals: counts,
        record: world.record,
        arrived: arrivals.len() as u64,
        completed: world.completed,
        failed: world.failed,
    }
}

fn apply(sites: &mut [SiteModel], at: u64, step: Step) {
    match step {
        Step::Degrade(site, factor) => sites[site]
            .set_degrade(factor)
            .expect("scenario degrade factors are in range"),
        Step::TakeAll(site) => sites[site].take_all_endpoints(at),
        Step::RestoreAll(site) => sites[site].restore_all_endpoints(at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_is_answered_only_by_a_site_that_serves_within_the_probe_bound() {
        assert!(probe_answered(true, 0));
        assert!(probe_answered(true, PROBE_TIMEOUT_MS));
        assert!(!probe_answered(true, PROBE_TIMEOUT_MS + 1));
        assert!(!probe_answered(false, 0));
    }
}
