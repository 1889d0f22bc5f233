//! One policy's world: shared sites in virtual time, one router and one view of the
//! signals per gateway, requests and probes crossing the WAN.
//!
//! Events at the same instant run in a fixed order: scheduled episodes (degrade, blip),
//! signal instants, requests reaching their site, probes reaching theirs, arrivals at
//! the gateways. With zero round trips a request reaches its site at the instant it is
//! routed, exactly as in the single-gateway simulator before round trips existed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::arrivals::Arrival;
use super::policy::{Policy, Router};
use super::prequal::ProbeReading;
use super::signals::Heard;
use super::signals::{SignalCounts, SignalPath};
use super::stats::{RunRecord, Summary};
use super::{PolicyResult, SimConfig};
use crate::site_model::{
    BandConfig, FailReason, Refusal, RequestId, RequestSpec, SiteConfig, SiteEvent, SiteModel,
};
use grid_score::live::{DropReason, FlowObservation};

/// What the run knows of a request between its routing and its end.
#[derive(Clone, Copy, Debug)]
struct Flight {
    gateway: usize,
    sent_ms: u64,
    started_ms: Option<u64>,
    first_token_ms: Option<u64>,
    arrived_ms: u64,
    streaming: bool,
}

/// A request on its way to a site.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Transit {
    at_ms: u64,
    seq: u64,
    site: usize,
    gateway: usize,
    sent_ms: u64,
    service_ms: u64,
    streaming: bool,
}

/// A probe on its way to a site.
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
    sites: Vec<SiteModel>,
    latency: Vec<SiteLatency>,
    flights: Vec<HashMap<RequestId, Flight>>,
    routers: Vec<Router>,
    record: RunRecord,
    completed: u64,
    failed: u64,
    transits: BinaryHeap<Reverse<Transit>>,
    probes: BinaryHeap<Reverse<Probe>>,
    targets: Vec<usize>,
    seq: u64,
    /// What answers told their gateways, for the policies that read answers (ours):
    /// (gateway, virtual ms it reaches the gateway, site, what it said).
    heard: Option<Vec<(usize, u64, usize, Heard)>>,
}

/// The flow-control headers of an answer from `site` read at this instant: the band's
/// headroom (the simulated sites run one band, band 0).
fn flow_now(site: &SiteModel) -> FlowObservation {
    FlowObservation {
        headroom: site.band_snapshot(0).and_then(|b| b.headroom()),
        ..FlowObservation::default()
    }
}

impl World<'_> {
    fn tell(&mut self, gateway: usize, at_ms: u64, site: usize, heard: Heard) {
        if let Some(h) = &mut self.heard {
            h.push((gateway, at_ms, site, heard));
        }
    }

    /// Routes arrival `a` at its gateway (with `view`, that gateway's signals, for the
    /// policies that read them): the request and any probes set off across the WAN.
    fn route(&mut self, a: Arrival, view: Option<&SignalPath>) {
        let config = self.config;
        let g = a.gateway;
        let (site, placed) = self.routers[g].choose(a.at_ms, &self.sites, view);
        let s = &self.sites[site];
        let full = s.running() + s.waiting() >= s.capacity();
        let counted = a.at_ms >= config.warmup_ms;
        self.record.route(a.at_ms, site, counted, full);
        if !placed && counted {
            self.record.unplaced += 1;
        }
        self.routers[g].sent(site);
        self.routers[g].probe_targets(&mut self.targets);
        for &target in &self.targets {
            self.seq += 1;
            self.probes.push(Reverse(Probe {
                at_ms: a.at_ms + config.rtt_ms(g, target) / 2,
                seq: self.seq,
                site: target,
                gateway: g,
                sent_ms: a.at_ms,
            }));
        }
        self.seq += 1;
        let transit = Transit {
            at_ms: a.at_ms + config.rtt_ms(g, site) / 2,
            seq: self.seq,
            site,
            gateway: g,
            sent_ms: a.at_ms,
            service_ms: a.service_ms,
            streaming: a.streaming,
        };
        if transit.at_ms == a.at_ms {
            self.deliver(transit);
        } else {
            self.transits.push(Reverse(transit));
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

    fn advance(&mut self, t_ms: u64) {
        for site in &mut self.sites {
            site.advance(t_ms);
        }
        self.collect();
    }

    /// Drains every site's events into the record and the gateways' observations.
    #[allow(clippy::too_many_lines)] // one match over every event kind, read top to bottom
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
                        // Measured by when the gateway received it, as the routing
                        // counts are.
                        if f.sent_ms >= warmup {
                            self.record.delays_ms.push(at - arrived_at);
                            self.record
                                .e2e_ms
                                .push(at - arrived_at + self.config.rtt_ms(f.gateway, s));
                        }
                        if f.streaming {
                            let seen = first_token_at + half;
                            // The flow-control wait is on the answer's header when the
                            // site runs flow control; otherwise it is inside the time.
                            if self.config.flow_control.is_some() {
                                let queued = at - arrived_at;
                                self.tell(
                                    f.gateway,
                                    seen,
                                    s,
                                    Heard::FirstByte {
                                        ms: (seen - f.sent_ms).saturating_sub(queued),
                                    },
                                );
                            }
                            self.routers[f.gateway].observe(seen, s, Some(seen - f.sent_ms), false);
                            // A streamed answer's head goes out when it takes a slot.
                            let flow = flow_now(&self.sites[s]);
                            self.tell(
                                f.gateway,
                                at + half,
                                s,
                                Heard::Answer {
                                    flow,
                                    server_error: false,
                                },
                            );
                        }
                    }
                    SiteEvent::Finished { id, at } => self.finished(s, id, at),
                    SiteEvent::Failed { id, at, reason } => {
                        let Some(f) = self.flights[s].remove(&id) else {
                            continue;
                        };
                        // Endpoints gone: 503 `rejected-no-endpoints`; a TTL expiry is a
                        // 429 `rejected-ttl-expired`, an answer, not a serving failure.
                        let answer = if reason == FailReason::TtlExpired {
                            Heard::Answer {
                                flow: FlowObservation {
                                    dropped: Some(DropReason::RejectedTtlExpired),
                                    ..FlowObservation::default()
                                },
                                server_error: false,
                            }
                        } else {
                            Heard::Answer {
                                flow: FlowObservation::default(),
                                server_error: true,
                            }
                        };
                        self.fail(s, f, at, answer);
                    }
                }
            }
        }
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
        }
        let seen = at + self.config.rtt_ms(f.gateway, s) / 2;
        let sample = (!f.streaming).then(|| seen - f.sent_ms);
        self.routers[f.gateway].observe(seen, s, sample, true);
        // How long the answer held its slot, as the gateway can tell: a
        // stream from its first byte to its last; a plain answer from
        // sending to its head less the flow-control wait its header
        // states (only when the site runs flow control).
        let held = match (f.streaming, f.first_token_ms, f.started_ms) {
            (true, Some(first), _) => Some(at - first),
            (false, _, Some(started)) if self.config.flow_control.is_some() => {
                Some((seen - f.sent_ms).saturating_sub(started - f.arrived_ms))
            }
            _ => None,
        };
        if let Some(held_ms) = held {
            self.tell(f.gateway, seen, s, Heard::Served { held_ms });
        }
        if !f.streaming {
            // A plain answer's head is built when it is done.
            let flow = flow_now(&self.sites[s]);
            self.tell(
                f.gateway,
                seen,
                s,
                Heard::Answer {
                    flow,
                    server_error: false,
                },
            );
        }
    }

    /// A request that failed at site `s` at `at_ms`: counted, and its gateway hears of it
    /// half a round trip later (its quick answer is a latency sample).
    fn fail(&mut self, s: usize, f: Flight, at_ms: u64, answer: Heard) {
        self.failed += 1;
        if f.sent_ms >= self.config.warmup_ms {
            self.record.failed += 1;
            if f.started_ms.is_none() {
                self.record.unserved += 1;
            }
        }
        let seen = at_ms + self.config.rtt_ms(f.gateway, s) / 2;
        self.routers[f.gateway].observe(seen, s, Some(seen - f.sent_ms), true);
        self.tell(f.gateway, seen, s, answer);
    }

    /// Request `t` reaches its site.
    fn deliver(&mut self, t: Transit) {
        let flight = Flight {
            gateway: t.gateway,
            sent_ms: t.sent_ms,
            started_ms: None,
            first_token_ms: None,
            arrived_ms: t.at_ms,
            streaming: t.streaming,
        };
        match self.sites[t.site].arrive(
            t.at_ms,
            RequestSpec {
                streaming: t.streaming,
                service_ms: Some(t.service_ms),
            },
        ) {
            Ok(id) => {
                self.flights[t.site].insert(id, flight);
                self.collect();
            }
            Err(refusal) => {
                let answer = match refusal {
                    Refusal::Saturated => Heard::Answer {
                        flow: FlowObservation {
                            dropped: Some(DropReason::RejectedSaturated),
                            ..FlowObservation::default()
                        },
                        server_error: false,
                    },
                    Refusal::NoReadyEndpoint => Heard::Answer {
                        flow: FlowObservation::default(),
                        server_error: true,
                    },
                };
                self.fail(t.site, flight, t.at_ms, answer);
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
                        priority: 0,
                        capacity: Some(fc.band_capacity(s.slots())),
                    }];
                }
                SiteModel::new(c, config.seed ^ i as u64).expect("scenario sites are valid")
            })
            .collect();
        let names: Vec<String> = config.sites.iter().map(|s| s.name.clone()).collect();
        let signals: Vec<SignalPath> = if policy.reads_signals() {
            config
                .gateways
                .iter()
                .map(|g| SignalPath::new(&names, g.site))
                .collect()
        } else {
            Vec::new()
        };
        let seconds = (config.duration_ms / 1_000 + 1) as usize;
        let world = World {
            config,
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
            targets: Vec::new(),
            seq: 0,
            heard: (policy == Policy::Ours).then(Vec::new),
        };
        (world, signals)
    }
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
        let Some(horizon) = earliest(&[
            arrival.map(|a| a.at_ms),
            world.transits.peek().map(|t| t.0.at_ms),
            world.probes.peek().map(|p| p.0.at_ms),
        ]) else {
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
            for path in &mut signals {
                path.at(next_signal, &world.sites);
            }
            next_signal = SignalPath::next_instant_after(next_signal);
            continue;
        }
        if let Some(Reverse(t)) = world
            .transits
            .peek()
            .copied()
            .filter(|t| t.0.at_ms <= horizon)
        {
            world.transits.pop();
            world.advance(t.at_ms);
            world.deliver(t);
            continue;
        }
        if let Some(Reverse(p)) = world
            .probes
            .peek()
            .copied()
            .filter(|p| p.0.at_ms <= horizon)
        {
            world.probes.pop();
            world.advance(p.at_ms);
            world.probe(p);
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
    // Drain: every admitted request starts and completes (endpoints taken away by an
    // episode still running are back: nothing is left stranded).
    while let Some(&(at, step)) = steps.last() {
        world.advance(at);
        apply(&mut world.sites, at, step);
        world.collect();
        steps.pop();
    }
    while let Some(t) = world
        .sites
        .iter()
        .filter_map(SiteModel::next_deadline)
        .min()
    {
        world.advance(t);
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
