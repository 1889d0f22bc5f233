//! The routing policies compared, each choosing a site for one arrival at one gateway.

use grid_score::{Decision, SplitMix64};

use super::hub_scorer::{self, SiteLoad};
use super::least_busy::LeastBusy;
use super::peak_ewma::PeakEwmaP2c;
use super::prequal::{Prequal, ProbeReading};
use super::setup::{FailFast, SimConfig};
use super::signals::{FULL_STATUS, MODEL, SignalPath, UNAVAILABLE_STATUS};
use super::skywalker::SkyWalker;
use crate::sim_rng::SimRng;
use crate::site_model::SiteModel;

/// A routing policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// grid-score: the refreshed `RouteTable` and its pick.
    Ours,
    /// Each site in turn, blind to load and capacity.
    RoundRobin,
    /// A random site, weighted by its configured slots.
    CapacityWeighted,
    /// The site with the fewest queued requests in the polled signals (ties at random):
    /// a queue-only cross-site scorer on the same stale data ours reads.
    LeastQueue,
    /// Prequal (NSDI 2024): asynchronous probes of requests in flight and latency, one
    /// round trip each, hot-cold lexicographic choice (see [`super::prequal`]). Uses the
    /// probed sites' true state, not the polled signals.
    Prequal,
    /// Power of two choices over tower's peak-EWMA cost, from this gateway's own requests
    /// (see [`super::peak_ewma`]).
    P2cPeakEwma,
    /// llm-d's endpoint-picker scorers (queue and KV-cache utilization) over the polled
    /// site readings, as a multi-cluster hub runs them (see [`super::hub_scorer`]).
    LlmDHub,
    /// LiteLLM's router: the site with the fewest of this gateway's requests in flight,
    /// with LiteLLM's default cooldowns (see [`super::least_busy`]).
    LiteLlmLeastBusy,
    /// SkyWalker (EuroSys 2026): the gateway's own requests in flight per site held
    /// under the site's slots, the rest waiting at the gateway; local site first (see
    /// [`super::skywalker`]).
    SkyWalker,
    /// Sees every site's true state at the instant of arrival and joins the shortest
    /// expected queueing delay (ties by expected response time).
    Oracle,
}

impl Policy {
    /// Every policy, in report order.
    pub const ALL: [Self; 10] = [
        Self::Ours,
        Self::RoundRobin,
        Self::CapacityWeighted,
        Self::LeastQueue,
        Self::LlmDHub,
        Self::Prequal,
        Self::P2cPeakEwma,
        Self::LiteLlmLeastBusy,
        Self::SkyWalker,
        Self::Oracle,
    ];

    /// Its name in tables and files.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ours => "ours",
            Self::RoundRobin => "round-robin",
            Self::CapacityWeighted => "capacity-weighted",
            Self::LeastQueue => "least-queue",
            Self::Prequal => "prequal",
            Self::P2cPeakEwma => "p2c-peak-ewma",
            Self::LlmDHub => "llm-d-hub",
            Self::LiteLlmLeastBusy => "litellm-least-busy",
            Self::SkyWalker => "skywalker",
            Self::Oracle => "oracle",
        }
    }

    /// Whether it reads the polled signals (the others never do, so their worlds skip
    /// the signal path).
    pub fn reads_signals(self) -> bool {
        matches!(self, Self::Ours | Self::LeastQueue | Self::LlmDHub)
    }
}

/// Random streams of gateway `g`'s router: gateway 0 keeps the streams of the
/// single-gateway simulator, so its figures did not move when gateways were added.
const GATEWAY_STREAM_STRIDE: u64 = 1_000;
/// The router's baseline stream (gateway 0).
const ROUTER_STREAM: u64 = 100;
/// The seed offset of grid-score's pick generator.
const PICK_SEED: u64 = 0x5eed;
/// The seed offset of grid-score's retry draw.
const RETRY_SEED: u64 = 0x7e7d;

/// Where one arrival goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// To this site; `placed` is false when the policy could not place it and it went by
    /// capacity (or uniformly, for an empty probe pool) instead.
    Site {
        /// The site.
        site: usize,
        /// Whether the policy placed it itself.
        placed: bool,
    },
    /// The gateway answers it itself with `status` (grid's table: every candidate
    /// excluded, 503; or the model shedding, 429): a client-visible refusal.
    Refuse {
        /// 503 or 429.
        status: u16,
    },
    /// The gateway holds it in its own queue until the policy has a site for it (only
    /// SkyWalker holds).
    Hold,
}

/// One gateway's routing state under one policy.
#[derive(Debug)]
pub struct Router {
    policy: Policy,
    /// For grid-score's pick (its own `Rng`).
    pick_rng: SplitMix64,
    /// For grid-score's draw of where a refused request goes: a stream of its own, so
    /// that the retry drawn for every request (from the view it was routed by) leaves
    /// the first picks as they would be without retries.
    retry_rng: SplitMix64,
    /// For the baselines' draws and tie-breaks.
    rng: SimRng,
    next: usize,
    slots: Vec<f64>,
    names: Vec<String>,
    mean_service_ms: f64,
    /// What the oracle knows besides the sites' state: which of them fail fast, when.
    fail_fast: Vec<FailFast>,
    peak: Option<PeakEwmaP2c>,
    prequal: Option<Prequal>,
    least_busy: Option<LeastBusy>,
    skywalker: Option<SkyWalker>,
}

impl Router {
    /// The router of gateway `gateway` for `policy` over `config`'s sites.
    pub fn new(policy: Policy, config: &SimConfig, gateway: usize) -> Self {
        let g = gateway as u64;
        let stream = ROUTER_STREAM + g * GATEWAY_STREAM_STRIDE;
        let n = config.sites.len();
        let rtts: Vec<u64> = (0..n).map(|s| config.rtt_ms(gateway, s)).collect();
        Self {
            policy,
            pick_rng: SplitMix64::new(
                config.seed ^ PICK_SEED ^ g.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ),
            retry_rng: SplitMix64::new(
                config.seed ^ RETRY_SEED ^ g.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ),
            rng: SimRng::fork(config.seed, stream),
            next: gateway,
            slots: config.sites.iter().map(|s| s.slots() as f64).collect(),
            names: config.sites.iter().map(|s| s.name.clone()).collect(),
            mean_service_ms: config.service.mean_ms(),
            fail_fast: config.fail_fast.clone(),
            peak: (policy == Policy::P2cPeakEwma)
                .then(|| PeakEwmaP2c::new(&rtts, SimRng::fork(config.seed, stream + 1))),
            prequal: (policy == Policy::Prequal)
                .then(|| Prequal::new(n, SimRng::fork(config.seed, stream + 2))),
            least_busy: (policy == Policy::LiteLlmLeastBusy)
                .then(|| LeastBusy::new(n, SimRng::fork(config.seed, stream + 3))),
            skywalker: (policy == Policy::SkyWalker).then(|| {
                let slots = config
                    .sites
                    .iter()
                    .map(|s| u32::try_from(s.slots()).unwrap_or(u32::MAX));
                SkyWalker::new(config.gateways[gateway].site, slots.collect())
            }),
        }
    }

    /// A request of this gateway's was sent to `site` now.
    pub fn sent(&mut self, site: usize) {
        if let Some(p) = &mut self.peak {
            p.sent(site);
        }
        if let Some(l) = &mut self.least_busy {
            l.sent(site);
        }
        if let Some(w) = &mut self.skywalker {
            w.sent(site);
        }
    }

    /// Whether this gateway holds requests in its own queue ([`Choice::Hold`]).
    pub fn holds(&self) -> bool {
        self.skywalker.is_some()
    }

    /// A request of this gateway's to `site` ended at `at_ms`: `ok`, or a failure that a
    /// router counts against its site (a 429, a 5xx, a failed exchange). LiteLLM's
    /// router and SkyWalker listen.
    pub fn ended(&mut self, at_ms: u64, site: usize, ok: bool) {
        if let Some(l) = &mut self.least_busy {
            l.ended(at_ms, site, ok);
        }
        if let Some(w) = &mut self.skywalker {
            w.ended(site);
        }
    }

    /// The gateway learns at `at_ms` a latency sample for `site` and/or that one of its
    /// requests there is over (only peak-EWMA listens).
    pub fn observe(&mut self, at_ms: u64, site: usize, sample_ms: Option<u64>, done: bool) {
        if let Some(p) = &mut self.peak {
            p.observe(at_ms, site, sample_ms, done);
        }
    }

    /// The probes this query sends (only Prequal probes).
    pub fn probe_targets(&mut self, out: &mut Vec<usize>) {
        out.clear();
        if let Some(p) = &mut self.prequal {
            p.probe_targets(out);
        }
    }

    /// A probe's reading lands at the gateway at `at_ms`.
    pub fn land(&mut self, at_ms: u64, reading: ProbeReading) {
        if let Some(p) = &mut self.prequal {
            p.land(at_ms, reading);
        }
    }

    /// Where the arrival at `now` goes. `signals` is this gateway's view, present for
    /// the policies that [read it](Policy::reads_signals).
    ///
    /// # Panics
    ///
    /// When grid-score's table names a site the scenario does not have (the table is
    /// built from the same names, so that is a bug), or when a policy that reads signals
    /// is given none.
    pub fn choose(
        &mut self,
        now: u64,
        sites: &[SiteModel],
        signals: Option<&SignalPath>,
    ) -> Choice {
        let signals = || signals.expect("policies that read signals are given them");
        let (site, placed) = match self.policy {
            Policy::Ours => match signals().table().pick(MODEL, &mut self.pick_rng) {
                Decision::Route { candidate, .. } => {
                    let site = candidate.site();
                    let index = self
                        .names
                        .iter()
                        .position(|n| n.as_str() == &**site)
                        .expect("the table only holds configured sites");
                    (index, true)
                }
                Decision::Shed { .. } => {
                    return Choice::Refuse {
                        status: FULL_STATUS,
                    };
                }
                Decision::Unavailable { .. } | Decision::UnknownModel => {
                    return Choice::Refuse {
                        status: UNAVAILABLE_STATUS,
                    };
                }
            },
            Policy::RoundRobin => {
                let i = self.next % sites.len();
                self.next += 1;
                (i, true)
            }
            Policy::CapacityWeighted => (self.by_capacity(None), true),
            Policy::LeastQueue => self.least_queue(sites.len(), signals(), None),
            Policy::LlmDHub => self.hub(sites.len(), signals(), None),
            Policy::Prequal => self
                .prequal
                .as_mut()
                .expect("a Prequal router has its pool")
                .choose(now, None),
            Policy::P2cPeakEwma => (
                self.peak
                    .as_mut()
                    .expect("a peak-EWMA router has its costs")
                    .choose(now, None),
                true,
            ),
            Policy::LiteLlmLeastBusy => match self
                .least_busy
                .as_mut()
                .expect("a least-busy router has its counts")
                .choose(now, None)
            {
                Some(site) => (site, true),
                // Every deployment cooling down: LiteLLM answers that none is available.
                None => {
                    return Choice::Refuse {
                        status: FULL_STATUS,
                    };
                }
            },
            Policy::SkyWalker => match self
                .skywalker
                .as_ref()
                .expect("a SkyWalker router has its counts")
                .choose(None)
            {
                Some(site) => (site, true),
                None => return Choice::Hold,
            },
            Policy::Oracle => (self.oracle(now, sites, None), true),
        };
        Choice::Site { site, placed }
    }

    /// Where a request that site `failed` refused goes once, by this policy's own rule
    /// among the other sites (grid's gateway reads its routing view's
    /// `retry_target`); `None` when there is no other site.
    ///
    /// # Panics
    ///
    /// As [`Self::choose`].
    pub fn retry_target(
        &mut self,
        now: u64,
        sites: &[SiteModel],
        signals: Option<&SignalPath>,
        failed: usize,
    ) -> Option<usize> {
        let n = sites.len();
        if n < 2 {
            return None;
        }
        let signals = || signals.expect("policies that read signals are given them");
        Some(match self.policy {
            Policy::Ours => return signals().retry_target(failed, &mut self.retry_rng),
            // The site after the one that refused it; the turn of first attempts goes on.
            Policy::RoundRobin => (failed + 1) % n,
            Policy::CapacityWeighted => self.by_capacity(Some(failed)),
            Policy::LeastQueue => self.least_queue(n, signals(), Some(failed)).0,
            Policy::LlmDHub => self.hub(n, signals(), Some(failed)).0,
            Policy::Prequal => {
                self.prequal
                    .as_mut()
                    .expect("a Prequal router has its pool")
                    .choose(now, Some(failed))
                    .0
            }
            Policy::P2cPeakEwma => self
                .peak
                .as_mut()
                .expect("a peak-EWMA router has its costs")
                .choose(now, Some(failed)),
            Policy::LiteLlmLeastBusy => {
                return self
                    .least_busy
                    .as_mut()
                    .expect("a least-busy router has its counts")
                    .choose(now, Some(failed));
            }
            Policy::SkyWalker => {
                return self
                    .skywalker
                    .as_ref()
                    .expect("a SkyWalker router has its counts")
                    .choose(Some(failed));
            }
            Policy::Oracle => self.oracle(now, sites, Some(failed)),
        })
    }

    /// A site drawn by configured slots, never `except`.
    fn by_capacity(&mut self, except: Option<usize>) -> usize {
        let weight = |i: usize, w: f64| if Some(i) == except { 0.0 } else { w };
        let total: f64 = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, &w)| weight(i, w))
            .sum();
        let mut x = self.rng.unit() * total;
        let mut last = 0;
        for (i, &w) in self.slots.iter().enumerate() {
            let w = weight(i, w);
            if w <= 0.0 {
                continue;
            }
            if x < w {
                return i;
            }
            x -= w;
            last = i;
        }
        last
    }

    fn least_queue(
        &mut self,
        n: usize,
        signals: &SignalPath,
        except: Option<usize>,
    ) -> (usize, bool) {
        let queue = |i: usize| {
            signals
                .reading(i)
                .filter(|r| r.ready_endpoints != Some(0) && r.ready != Some(false))
                .and_then(|r| r.queue_depth.map(|q| q + r.flow_held.unwrap_or(0.0)))
        };
        let eligible = || (0..n).filter(|&i| Some(i) != except);
        let best = eligible().filter_map(queue).fold(f64::INFINITY, f64::min);
        if best.is_infinite() {
            return (self.by_capacity(except), false);
        }
        let tied: Vec<usize> = eligible().filter(|&i| queue(i) == Some(best)).collect();
        (tied[self.rng.below(tied.len() as u64) as usize], true)
    }

    /// llm-d's scorers over the last readings, never `except`; by capacity (not placed)
    /// while no site can be scored.
    fn hub(&mut self, n: usize, signals: &SignalPath, except: Option<usize>) -> (usize, bool) {
        let loads: Vec<Option<SiteLoad>> = (0..n)
            .map(|i| signals.reading(i).and_then(SiteLoad::of))
            .collect();
        match hub_scorer::pick(&loads, except, &mut self.rng) {
            Some(site) => (site, true),
            None => (self.by_capacity(except), false),
        }
    }

    /// The site with the shortest expected queueing delay at `now` (ties: the shortest
    /// response), never `except`; a site without an endpoint or failing fast serves
    /// nothing.
    fn oracle(&self, now: u64, sites: &[SiteModel], except: Option<usize>) -> usize {
        let key = |i: usize| {
            let s = &sites[i];
            let c = s.capacity() as f64;
            if c == 0.0 || self.fail_fast.iter().any(|f| f.covers(i, now)) {
                return (f64::INFINITY, f64::INFINITY);
            }
            let n = (s.running() + s.waiting()) as f64;
            let per_slot_ms = self.mean_service_ms * s.degrade() / c;
            (
                (n + 1.0 - c).max(0.0) * per_slot_ms,
                (n + 1.0) * per_slot_ms,
            )
        };
        let mut eligible = (0..sites.len()).filter(|&i| Some(i) != except);
        let mut best = eligible.next().unwrap_or(0);
        for i in eligible {
            let (a, b) = (key(i), key(best));
            if a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)).is_lt() {
                best = i;
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::site_model::{RequestSpec, SiteConfig};

    fn world(fill: &[usize]) -> (SimConfig, Vec<SiteModel>, SignalPath) {
        let config = SimConfig::standard(0.5, 60_000, 1);
        let mut sites: Vec<SiteModel> = config
            .sites
            .iter()
            .map(|s| SiteModel::new(SiteConfig::new(s.name.clone(), s.endpoints, 8), 1).unwrap())
            .collect();
        for (site, &n) in sites.iter_mut().zip(fill) {
            for _ in 0..n {
                site.arrive(
                    0,
                    RequestSpec {
                        streaming: false,
                        service_ms: Some(10_000),
                    },
                )
                .unwrap();
            }
        }
        let names: Vec<String> = config.sites.iter().map(|s| s.name.clone()).collect();
        let home = (0..names.len())
            .find(|&i| config.has_gateway(i))
            .expect("the scenario has a gateway");
        let signals = SignalPath::new(&names, home);
        (config, sites, signals)
    }

    #[test]
    fn the_oracle_never_joins_a_queue_while_a_slot_is_free() {
        // Slots 8, 16, 32, 64: every site full except one free slot on the 16-slot site.
        let (config, sites, signals) = world(&[20, 15, 40, 70]);
        let mut router = Router::new(Policy::Oracle, &config, 0);
        assert_eq!(
            router.choose(0, &sites, Some(&signals)),
            Choice::Site {
                site: 1,
                placed: true
            }
        );
        assert_eq!(
            router.retry_target(0, &sites, Some(&signals), 1),
            Some(3),
            "elsewhere: the shortest wait per slot"
        );
    }

    #[test]
    fn with_every_site_full_the_oracle_joins_the_shortest_wait_per_slot() {
        // Waiting per slot: 8/8, 8/16, 8/32, 8/64: the 64-slot site drains first.
        let (config, sites, signals) = world(&[16, 24, 40, 72]);
        let mut router = Router::new(Policy::Oracle, &config, 0);
        assert_eq!(
            router.choose(0, &sites, Some(&signals)),
            Choice::Site {
                site: 3,
                placed: true
            }
        );
    }

    #[test]
    fn least_queue_without_any_reading_falls_back_to_capacity() {
        let (config, sites, signals) = world(&[0, 0, 0, 0]);
        let mut router = Router::new(Policy::LeastQueue, &config, 0);
        assert!(
            matches!(
                router.choose(0, &sites, Some(&signals)),
                Choice::Site { placed: false, .. }
            ),
            "no reading: not placed by itself"
        );
    }

    #[test]
    fn a_retry_never_goes_back_to_the_site_that_refused_it_under_any_policy() {
        let (config, sites, signals) = world(&[0, 0, 0, 0]);
        for policy in Policy::ALL {
            let mut router = Router::new(policy, &config, 0);
            for failed in 0..sites.len() {
                for now in 0..50 {
                    let target = router.retry_target(now, &sites, Some(&signals), failed);
                    if policy == Policy::Ours {
                        // Nothing polled yet: every candidate unmeasured, none excluded.
                        assert!(target.is_some(), "{policy:?}");
                    }
                    assert_ne!(target, Some(failed), "{policy:?}");
                }
            }
        }
    }

    #[test]
    fn with_one_site_there_is_nowhere_to_retry() {
        let (mut config, sites, signals) = world(&[0]);
        config.sites.truncate(1);
        let mut router = Router::new(Policy::CapacityWeighted, &config, 0);
        assert_eq!(router.retry_target(0, &sites[..1], Some(&signals), 0), None);
    }
}
