//! What one simulated run is given: its sites, gateways, load, flow control and the
//! episodes that disturb it (degradations, blips, silent EPPs, frozen operators, sites
//! failing fast), checked and defaulted here; [`super::scenario`] reads them from files.

use super::arrivals::{Bursts, LoadShape, Ramp};
use super::stats::DegradeWindow;
use crate::site_model::{Priority, ServiceTime};

/// How operators exchange their sites' signals (a scenario file's `signal_transport`,
/// `"poll"` or `"gossip"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SignalTransport {
    /// Long polls of every peer (`signalTransport: poll`).
    #[default]
    Poll,
    /// Versions announced over SWIM, each newer batch pulled (`signalTransport: gossip`,
    /// the operator's default).
    Gossip,
}

/// One simulated site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteSpec {
    /// Its name (`grid_site`).
    pub name: String,
    /// Serving endpoints.
    pub endpoints: usize,
    /// Slots per endpoint.
    pub slots_per_endpoint: usize,
    /// WAN round trip (ms) between this site and a gateway at another site, unless a
    /// [`RoundTrip`] names the pair.
    pub rtt_ms: u64,
}

/// The round trip between two sites, either way: a gateway at one reaching the other.
/// It replaces the serving site's own `rtt_ms` for that pair, so a grid spread over
/// regions has near and far pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundTrip {
    /// One site (index into the sites).
    pub a: usize,
    /// The other.
    pub b: usize,
    /// The round trip, in ms.
    pub rtt_ms: u64,
}

impl RoundTrip {
    /// Whether it is the round trip between sites `x` and `y`, either way.
    pub fn joins(&self, x: usize, y: usize) -> bool {
        (self.a, self.b) == (x, y) || (self.a, self.b) == (y, x)
    }
}

impl SiteSpec {
    /// Its slots.
    pub fn slots(&self) -> usize {
        self.endpoints * self.slots_per_endpoint
    }
}

/// One gateway: where it runs and its share of the offered load.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GatewaySpec {
    /// The site it runs at (index into the sites): its operator relays the signals, and
    /// that site is scraped at 1 s while the others arrive through 5 s peer polls.
    pub site: usize,
    /// Its share of all arrivals (the shares of a scenario sum to 1).
    pub share: f64,
}

/// A site that slows down for a while.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Degrade {
    /// Which site (index into the sites).
    pub site: usize,
    /// Service times are multiplied by this while degraded.
    pub factor: f64,
    /// Start (virtual ms).
    pub from_ms: u64,
    /// End (virtual ms).
    pub until_ms: u64,
}

/// A site whose every endpoint goes away for a while: its EPP reads zero ready
/// endpoints, its running and queued requests fail, arrivals are refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blip {
    /// Which site (index into the sites).
    pub site: usize,
    /// Endpoints gone (virtual ms).
    pub from_ms: u64,
    /// Endpoints back (virtual ms).
    pub until_ms: u64,
}

/// A stretch of time a site spends in some state (its EPP silent, its operator frozen).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Episode {
    /// Which site (index into the sites).
    pub site: usize,
    /// Start (virtual ms).
    pub from_ms: u64,
    /// End (virtual ms), not included.
    pub until_ms: u64,
}

impl Episode {
    /// Whether it holds site `site` at virtual `t_ms`.
    pub fn covers(&self, site: usize, t_ms: u64) -> bool {
        self.site == site && (self.from_ms..self.until_ms).contains(&t_ms)
    }
}

/// A site that answers every request at once with one status (its model servers fail
/// fast) while its EPP, seeing nothing run, looks healthy and idle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailFast {
    /// Which site (index into the sites).
    pub site: usize,
    /// The status of every answer: 429, or a 5xx.
    pub status: u16,
    /// The `Retry-After` it states (ms, whole seconds), when it states one.
    pub retry_after_ms: Option<u64>,
    /// Start (virtual ms).
    pub from_ms: u64,
    /// End (virtual ms), not included.
    pub until_ms: u64,
}

impl FailFast {
    /// Whether it holds site `site` at virtual `t_ms`.
    pub fn covers(&self, site: usize, t_ms: u64) -> bool {
        self.site == site && (self.from_ms..self.until_ms).contains(&t_ms)
    }
}

/// A whole scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// The sites.
    pub sites: Vec<SiteSpec>,
    /// The gateways, each with its own arrivals, router and view of the signals.
    pub gateways: Vec<GatewaySpec>,
    /// Round trip (ms) between a gateway and the site it runs at.
    pub local_rtt_ms: u64,
    /// Round trips of named pairs of sites, each replacing its serving site's `rtt_ms`.
    pub round_trips: Vec<RoundTrip>,
    /// Service-time distribution of every request.
    pub service: ServiceTime,
    /// Mean offered load, bursts included, as a share of the sites' total capacity.
    pub load: f64,
    /// Bursts on top of the base rate.
    pub bursts: Option<Bursts>,
    /// A slow swing of the rate (its mean over whole periods is the base rate).
    pub ramp: Option<Ramp>,
    /// Share of streaming requests.
    pub streaming_share: f64,
    /// Arrivals stop at this time (ms); the run then drains.
    pub duration_ms: u64,
    /// Requests arriving earlier are served but not measured (the learners start blank).
    pub warmup_ms: u64,
    /// Slow-downs; the first is the one the degrade statistics follow.
    pub degrade: Vec<Degrade>,
    /// Zero-endpoint episodes; the first is followed by the statistics when no degrade is.
    pub blips: Vec<Blip>,
    /// Sites answering every request at once with one status.
    pub fail_fast: Vec<FailFast>,
    /// Sites whose EPP stops answering its operator's scrapes (each scrape fails as a
    /// timeout) while its model servers keep serving: the operator's own stale rule
    /// decides what it publishes.
    pub epp_silent: Vec<Episode>,
    /// Sites whose operator is frozen: it neither scrapes nor answers a peer's or its
    /// gateway's poll, so the site's signals stop reaching every gateway (a gateway at
    /// that site fails its polls); the site itself serves.
    pub operator_frozen: Vec<Episode>,
    /// The sites' EPP flow control; `None` (the standard scenario) is flow control off.
    pub flow_control: Option<FlowControl>,
    /// How operators exchange their sites' signals.
    pub transport: SignalTransport,
    /// Fixes the arrivals and every policy's random draws.
    pub seed: u64,
}

/// Every site's EPP flow control: a bounded band 0 that holds what the endpoints cannot
/// take, answers with its headroom, and refuses (`rejected-saturated`) once full; and,
/// with mixed priorities, a higher band served before it, each answer stating the
/// headroom of the band that admitted its request, as llm-d's EPP does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlowControl {
    /// Requests an endpoint queues behind its slots before flow control holds them.
    pub queue_per_endpoint: usize,
    /// Band capacity per slot of the site (rounded up): the band of a 64-slot site
    /// holds eight times what an 8-slot site's does.
    pub band_capacity_per_slot: f64,
    /// A second, higher-priority band and the share of requests that ask for it.
    pub high: Option<HighBand>,
}

/// A band above band 0: its priority, the share of requests whose objective names it,
/// and its capacity per slot of the site (rounded up).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HighBand {
    /// Its priority (served before band 0 when above it).
    pub priority: Priority,
    /// The share of requests asking for it.
    pub share: f64,
    /// Capacity per slot of the site.
    pub capacity_per_slot: f64,
}

impl HighBand {
    /// The objective a gateway's requests of this band name (the request header
    /// `grid_score::live::BAND_REQUEST_HEADER`).
    pub fn objective(self) -> String {
        format!("priority-{}", self.priority)
    }

    /// Its capacity at a site of `slots` (rounded up, at least 1).
    pub fn capacity(self, slots: usize) -> usize {
        (slots as f64 * self.capacity_per_slot).ceil().max(1.0) as usize
    }
}

/// The flow control of the standard scenario, as llm-d's EPP runs it in front of vLLM:
/// what the endpoints cannot take waits in the band, four requests per slot at most.
pub const STANDARD_FLOW_CONTROL: FlowControl = FlowControl {
    queue_per_endpoint: 0,
    band_capacity_per_slot: 4.0,
    high: None,
};

impl FlowControl {
    /// The band capacity of a site of `slots`.
    pub fn band_capacity(self, slots: usize) -> usize {
        (slots as f64 * self.band_capacity_per_slot).ceil().max(1.0) as usize
    }
}

/// The default run length (virtual seconds).
pub const DEFAULT_DURATION_S: u64 = 600;
/// The default warm-up (virtual seconds).
pub const DEFAULT_WARMUP_S: u64 = 30;
/// The warm-up never takes more than this share of a run: a short run still measures.
pub const MAX_WARMUP_DIVISOR: u64 = 4;

impl SimConfig {
    /// The standard scenario at `load`: sites of 8, 16, 32 and 64 slots (endpoints of 8
    /// slots) behind [`STANDARD_FLOW_CONTROL`], one gateway at the 32-slot site and the
    /// rest remote; no WAN delay; 10 s bursts at 1.5x every minute; the 16-slot site three
    /// times slower from the first to the second third of the run. `benches/scenarios/standard.toml` is the same at 600 s.
    pub fn standard(load: f64, duration_ms: u64, seed: u64) -> Self {
        let site = |name: &str, endpoints| SiteSpec {
            name: name.into(),
            endpoints,
            slots_per_endpoint: 8,
            rtt_ms: 0,
        };
        Self {
            sites: vec![
                site("s8", 1),
                site("s16", 2),
                site("s32", 4),
                site("s64", 8),
            ],
            gateways: vec![GatewaySpec {
                site: 2,
                share: 1.0,
            }],
            local_rtt_ms: 0,
            round_trips: Vec::new(),
            service: ServiceTime::default(),
            load,
            bursts: Some(Bursts {
                first_ms: 45_000,
                every_ms: 60_000,
                length_ms: 10_000,
                factor: 1.5,
            }),
            ramp: None,
            streaming_share: 0.8,
            duration_ms,
            warmup_ms: (DEFAULT_WARMUP_S * 1_000).min(duration_ms / MAX_WARMUP_DIVISOR),
            degrade: vec![Degrade {
                site: 1,
                factor: 3.0,
                from_ms: duration_ms / 3 / 1_000 * 1_000,
                until_ms: duration_ms * 2 / 3 / 1_000 * 1_000,
            }],
            blips: Vec::new(),
            fail_fast: Vec::new(),
            epp_silent: Vec::new(),
            operator_frozen: Vec::new(),
            flow_control: Some(STANDARD_FLOW_CONTROL),
            transport: SignalTransport::Poll,
            seed,
        }
    }

    /// Total slots.
    pub fn slots(&self) -> usize {
        self.sites.iter().map(SiteSpec::slots).sum()
    }

    /// Round trip (ms) between gateway `gateway` and site `site`: the local one at its
    /// own site, a named pair's, or else the serving site's.
    pub fn rtt_ms(&self, gateway: usize, site: usize) -> u64 {
        let home = self.gateways[gateway].site;
        if home == site {
            return self.local_rtt_ms;
        }
        self.round_trips
            .iter()
            .find(|r| r.joins(home, site))
            .map_or(self.sites[site].rtt_ms, |r| r.rtt_ms)
    }

    /// Whether site `site` is the home site of some gateway.
    pub fn has_gateway(&self, site: usize) -> bool {
        self.gateways.iter().any(|g| g.site == site)
    }

    /// Requests per second the sites can serve at full occupancy (undegraded).
    pub fn capacity_per_s(&self) -> f64 {
        self.slots() as f64 * 1_000.0 / self.service.mean_ms()
    }

    /// The load shape the arrivals follow: the base rate is set so that the long-run
    /// mean, bursts included, is `load` of capacity (a swing keeps the mean over whole
    /// periods).
    pub fn load_shape(&self) -> LoadShape {
        let burst_mean = self.bursts.map_or(1.0, |b| {
            1.0 + (b.factor.max(1.0) - 1.0) * b.length_ms as f64 / b.every_ms.max(1) as f64
        });
        LoadShape {
            rate_per_s: self.load * self.capacity_per_s() / burst_mean,
            bursts: self.bursts,
            ramp: self.ramp,
            service: self.service,
            streaming_share: self.streaming_share,
            duration_ms: self.duration_ms,
        }
    }

    /// The fail-fast episode holding site `site` at virtual `t_ms`, if one does.
    pub fn fail_fast_at(&self, site: usize, t_ms: u64) -> Option<&FailFast> {
        self.fail_fast.iter().find(|f| f.covers(site, t_ms))
    }

    /// The episode the statistics follow: the first degrade, the site's fair share being
    /// its share of the effective capacity while degraded; else the first blip or
    /// fail-fast episode, where the fair share is nothing; else the first frozen operator
    /// or silent EPP, whose site still serves its share of the slots.
    pub fn degrade_window(&self) -> DegradeWindow {
        if let Some(d) = self.degrade.first() {
            let slow = self.sites[d.site].slots() as f64 / d.factor;
            let rest = (self.slots() - self.sites[d.site].slots()) as f64;
            return DegradeWindow {
                site: d.site,
                from_ms: d.from_ms,
                until_ms: d.until_ms,
                fair_share: slow / (slow + rest),
            };
        }
        if let Some(b) = self.blips.first() {
            return DegradeWindow {
                site: b.site,
                from_ms: b.from_ms,
                until_ms: b.until_ms,
                fair_share: 0.0,
            };
        }
        if let Some(f) = self.fail_fast.first() {
            return DegradeWindow {
                site: f.site,
                from_ms: f.from_ms,
                until_ms: f.until_ms,
                fair_share: 0.0,
            };
        }
        if let Some(e) = self.operator_frozen.first().or(self.epp_silent.first()) {
            return DegradeWindow {
                site: e.site,
                from_ms: e.from_ms,
                until_ms: e.until_ms,
                fair_share: self.sites[e.site].slots() as f64 / self.slots() as f64,
            };
        }
        DegradeWindow {
            site: 0,
            from_ms: self.duration_ms,
            until_ms: self.duration_ms,
            fair_share: 0.0,
        }
    }
}
