//! Scenario files: a TOML description of sites, round trips, service times, gateways
//! and their arrivals, bursts, the episodes (degrades, blips, sites failing fast, EPPs
//! gone silent, operators frozen), loads and seeds, so anyone can run their own. The built-in scenarios are files in `benches/scenarios/`.
//!
//! Unknown fields are refused (a misspelt field would otherwise silently fall back to a
//! default), and every figure is checked against the site model's limits when read, so
//! a run never panics on a file.

use std::collections::HashSet;

use serde::Deserialize;

use super::arrivals::{Bursts, Ramp};
use super::setup::{
    Blip, DEFAULT_WARMUP_S, Degrade, Episode, FailFast, FlowControl, GatewaySpec, HighBand,
    MAX_WARMUP_DIVISOR, RoundTrip, SignalTransport, SimConfig, SiteSpec,
};
use super::signals::{FULL_STATUS, SERVER_ERRORS};
use crate::site_model::{
    FALLBACK_PRIORITY, MAX_DEGRADE_FACTOR, MAX_SITE_ENDPOINTS, MAX_SLOTS_PER_ENDPOINT,
    MIN_DEGRADE_FACTOR, Priority, ServiceTime,
};

/// The widest swing of a `[ramp]`: the rate never stops altogether.
pub const MAX_RAMP_SWING: f64 = 0.9;
/// The shortest `[ramp]` period: a swing faster than the bursts is a burst.
pub const MIN_RAMP_PERIOD_S: u64 = 60;

/// The most sites a scenario may have: each is scraped through the real parser every
/// second, once per gateway.
pub const MAX_SITES: usize = 32;
/// The longest run (virtual seconds): a day.
pub const MAX_DURATION_S: u64 = 86_400;
/// The longest round trip (ms): beyond a few seconds it is an outage, not a WAN.
pub const MAX_RTT_MS: u64 = 5_000;
/// The most loads or seeds in one file.
pub const MAX_RUNS: usize = 32;
/// The highest offered load (share of capacity): beyond it every queue only grows.
pub const MAX_LOAD: f64 = 2.0;
/// The most scheduled episodes, of every kind together.
pub const MAX_EPISODES: usize = 64;
/// The longest `Retry-After` a site failing fast may state (s): an hour. The gateway
/// holds a site full for at most `grid_score::live::MAX_FULL_HOLD_MS` whatever it says.
pub const MAX_RETRY_AFTER_S: u64 = 3_600;
/// The most band capacity per slot a scenario gives its sites: 64 requests held behind
/// every slot is already hours of queue at the default service time.
pub const MAX_BAND_CAPACITY_PER_SLOT: f64 = 64.0;

/// Why a scenario file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// Not TOML, or not the schema (an unknown or missing field, a wrong type).
    #[error("scenario: {0}")]
    Parse(#[from] toml::de::Error),
    /// A field out of range or naming something that does not exist.
    #[error("scenario field `{field}`: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

fn invalid<T>(field: &'static str, reason: impl Into<String>) -> Result<T, ScenarioError> {
    Err(ScenarioError::Invalid {
        field,
        reason: reason.into(),
    })
}

/// A scenario as the file states it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    /// What it shows (printed with the results).
    pub description: String,
    /// Virtual seconds of arrivals per run.
    pub duration_s: u64,
    /// Seconds served but not measured (at most a quarter of the run).
    #[serde(default = "default_warmup_s")]
    pub warmup_s: u64,
    /// Offered loads, as shares of the total capacity.
    pub loads: Vec<f64>,
    /// Seeds; every load runs once per seed.
    pub seeds: Vec<u64>,
    /// Share of streaming requests.
    pub streaming_share: f64,
    /// Round trip (ms) between a gateway and the site it runs at.
    #[serde(default)]
    pub local_rtt_ms: u64,
    /// Service times of every request.
    pub service: ServiceFile,
    /// The sites.
    pub sites: Vec<SiteFile>,
    /// The gateways and their shares of the offered load.
    pub gateways: Vec<GatewayFile>,
    /// Round trips of named pairs of sites.
    #[serde(default)]
    pub round_trips: Vec<RoundTripFile>,
    /// Bursts on top of the base rate.
    #[serde(default)]
    pub bursts: Option<BurstsFile>,
    /// A slow swing of the rate.
    #[serde(default)]
    pub ramp: Option<RampFile>,
    /// Slow-downs.
    #[serde(default)]
    pub degrade: Vec<DegradeFile>,
    /// Zero-endpoint episodes.
    #[serde(default)]
    pub blips: Vec<BlipFile>,
    /// Sites answering every request at once with one status.
    #[serde(default)]
    pub fail_fast: Vec<FailFastFile>,
    /// Sites whose EPP stops answering its operator's scrapes.
    #[serde(default)]
    pub epp_silent: Vec<EpisodeFile>,
    /// Sites whose operator is frozen.
    #[serde(default)]
    pub operator_frozen: Vec<EpisodeFile>,
    /// Every site's EPP flow control (absent: off).
    #[serde(default)]
    pub flow_control: Option<FlowControlFile>,
    /// How operators exchange their sites' signals (absent: poll).
    #[serde(default)]
    pub signal_transport: SignalTransport,
}

/// `[flow_control]`: a bounded band 0 at every site ([`FlowControl`]).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FlowControlFile {
    /// Requests an endpoint queues behind its slots before flow control holds them.
    pub queue_per_endpoint: usize,
    /// Band capacity per slot of the site.
    pub band_capacity_per_slot: f64,
    /// `[flow_control.high]`: a second band and the share of requests asking for it.
    #[serde(default)]
    pub high: Option<HighBandFile>,
}

/// `[flow_control.high]`: a band other than band 0 ([`HighBand`]).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HighBandFile {
    /// Its priority: not band 0's.
    pub priority: Priority,
    /// The share of requests asking for it, within (0, 1).
    pub share: f64,
    /// Its capacity per slot of the site.
    pub capacity_per_slot: f64,
}

fn default_warmup_s() -> u64 {
    DEFAULT_WARMUP_S
}

/// Log-normal service times ([`ServiceTime`]).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServiceFile {
    /// Median service time (ms).
    pub median_ms: f64,
    /// Standard deviation of its log.
    pub sigma: f64,
    /// Share before the first token.
    pub prefill_share: f64,
    /// Output tokens per request.
    pub output_tokens: u32,
}

impl From<ServiceFile> for ServiceTime {
    fn from(s: ServiceFile) -> Self {
        Self {
            median_ms: s.median_ms,
            sigma: s.sigma,
            prefill_share: s.prefill_share,
            output_tokens: s.output_tokens,
        }
    }
}

/// One site.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SiteFile {
    /// Its name.
    pub name: String,
    /// Serving endpoints.
    pub endpoints: usize,
    /// Slots per endpoint.
    pub slots_per_endpoint: usize,
    /// Round trip (ms) from a gateway at another site.
    #[serde(default)]
    pub rtt_ms: u64,
}

/// One gateway.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GatewayFile {
    /// The site it runs at (its home: scraped at 1 s, the others through peer polls).
    pub site: String,
    /// Its share of the offered load (shares are normalised to sum to 1).
    pub share: f64,
}

/// `[[round_trips]]`: the round trip between two named sites, either way ([`RoundTrip`]).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RoundTripFile {
    /// The two sites.
    pub between: [String; 2],
    /// Their round trip, in ms.
    pub rtt_ms: u64,
}

/// `[ramp]`: a slow swing of the rate ([`Ramp`]) in seconds.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RampFile {
    /// One whole swing, at least [`MIN_RAMP_PERIOD_S`].
    pub period_s: u64,
    /// How far the rate moves above and below its mean, `0..=MAX_RAMP_SWING`.
    pub swing: f64,
}

/// Bursts ([`Bursts`]) in seconds.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BurstsFile {
    /// First burst start.
    pub first_s: u64,
    /// Period between burst starts.
    pub every_s: u64,
    /// Burst length.
    pub length_s: u64,
    /// Rate multiplier during a burst.
    pub factor: f64,
}

/// A slow-down.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DegradeFile {
    /// Which site.
    pub site: String,
    /// Service times multiplied by this.
    pub factor: f64,
    /// Start (s).
    pub from_s: u64,
    /// End (s).
    pub until_s: u64,
}

/// A zero-endpoint episode.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BlipFile {
    /// Which site.
    pub site: String,
    /// Endpoints gone (s).
    pub from_s: u64,
    /// Endpoints back (s).
    pub until_s: u64,
}

/// A site in some state for a while (`[[epp_silent]]`, `[[operator_frozen]]`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EpisodeFile {
    /// Which site.
    pub site: String,
    /// Start (s).
    pub from_s: u64,
    /// End (s).
    pub until_s: u64,
}

/// A site answering every request at once with one status (`[[fail_fast]]`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FailFastFile {
    /// Which site.
    pub site: String,
    /// The status: [`FULL_STATUS`] (429), or one of [`SERVER_ERRORS`] (a 5xx).
    pub status: u16,
    /// The `Retry-After` its 429s state (s); only with status 429.
    #[serde(default)]
    pub retry_after_s: Option<u64>,
    /// Start (s).
    pub from_s: u64,
    /// End (s).
    pub until_s: u64,
}

/// Checks an episode's times: it ends after it starts, and within [`MAX_DURATION_S`].
fn check_times(field: &'static str, from_s: u64, until_s: u64) -> Result<(), ScenarioError> {
    if until_s <= from_s {
        return invalid(
            field,
            format!("until_s ({until_s}) must be after from_s ({from_s})"),
        );
    }
    if until_s > MAX_DURATION_S {
        return invalid(field, format!("until_s must be at most {MAX_DURATION_S}"));
    }
    Ok(())
}

/// A checked scenario: builds one [`SimConfig`] per load and seed.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// What it shows.
    pub description: String,
    /// Its loads.
    pub loads: Vec<f64>,
    /// Its seeds.
    pub seeds: Vec<u64>,
    /// The configuration at the first load and seed.
    template: SimConfig,
    warmup_s: u64,
}

impl Scenario {
    /// Reads and checks a scenario from TOML text.
    pub fn parse(text: &str) -> Result<Self, ScenarioError> {
        let file: ScenarioFile = toml::from_str(text)?;
        Self::check(file)
    }

    /// The run at `load` and `seed`.
    pub fn config(&self, load: f64, seed: u64) -> SimConfig {
        SimConfig {
            load,
            seed,
            ..self.template.clone()
        }
    }

    /// The same scenario with arrivals for `duration_s` seconds instead (episodes keep
    /// their times; the warm-up is cut to a quarter of a shorter run).
    #[must_use]
    pub fn with_duration_s(mut self, duration_s: u64) -> Self {
        self.template.duration_ms = duration_s * 1_000;
        self.template.warmup_ms =
            (self.warmup_s * 1_000).min(self.template.duration_ms / MAX_WARMUP_DIVISOR);
        self
    }

    /// The same scenario with its operators gossiping their signals instead of polling.
    #[must_use]
    pub fn with_gossip(mut self) -> Self {
        self.template.transport = SignalTransport::Gossip;
        self.description.push_str(" (signals gossiped)");
        self
    }

    /// The same scenario with every site's flow control off: what the endpoints cannot
    /// take waits in their own queues, and no answer carries a flow-control header.
    #[must_use]
    pub fn without_flow_control(mut self) -> Self {
        self.template.flow_control = None;
        self.description.push_str(" (flow control off)");
        self
    }

    #[allow(clippy::too_many_lines)] // one check per field, in file order
    fn check(f: ScenarioFile) -> Result<Self, ScenarioError> {
        if f.duration_s == 0 || f.duration_s > MAX_DURATION_S {
            return invalid("duration_s", format!("must be 1..={MAX_DURATION_S}"));
        }
        if f.loads.is_empty() || f.loads.len() > MAX_RUNS {
            return invalid("loads", format!("must list 1..={MAX_RUNS} loads"));
        }
        if let Some(l) = f.loads.iter().find(|l| !(**l > 0.0 && **l <= MAX_LOAD)) {
            return invalid("loads", format!("{l} is not within (0, {MAX_LOAD}]"));
        }
        if f.seeds.is_empty() || f.seeds.len() > MAX_RUNS {
            return invalid("seeds", format!("must list 1..={MAX_RUNS} seeds"));
        }
        if !(0.0..=1.0).contains(&f.streaming_share) {
            return invalid("streaming_share", "must be within 0..=1");
        }
        if f.local_rtt_ms > MAX_RTT_MS {
            return invalid("local_rtt_ms", format!("must be at most {MAX_RTT_MS}"));
        }
        if let Some((field, reason)) = ServiceTime::from(f.service).problem() {
            return invalid(field, reason);
        }
        if f.sites.is_empty() || f.sites.len() > MAX_SITES {
            return invalid("sites", format!("must list 1..={MAX_SITES} sites"));
        }
        let mut names = HashSet::new();
        for site in &f.sites {
            if site.name.is_empty() || !names.insert(site.name.as_str()) {
                return invalid(
                    "sites.name",
                    format!("`{}` is empty or repeated", site.name),
                );
            }
            if site.endpoints == 0 || site.endpoints > MAX_SITE_ENDPOINTS {
                return invalid(
                    "sites.endpoints",
                    format!("{}: must be 1..={MAX_SITE_ENDPOINTS}", site.name),
                );
            }
            if site.slots_per_endpoint == 0 || site.slots_per_endpoint > MAX_SLOTS_PER_ENDPOINT {
                return invalid(
                    "sites.slots_per_endpoint",
                    format!("{}: must be 1..={MAX_SLOTS_PER_ENDPOINT}", site.name),
                );
            }
            if site.rtt_ms > MAX_RTT_MS {
                return invalid(
                    "sites.rtt_ms",
                    format!("{}: must be at most {MAX_RTT_MS}", site.name),
                );
            }
        }
        let index = |field: &'static str, name: &str| {
            f.sites
                .iter()
                .position(|s| s.name == name)
                .map_or_else(|| invalid(field, format!("no site named `{name}`")), Ok)
        };
        if f.gateways.is_empty() {
            return invalid("gateways", "must list at least one gateway");
        }
        let total: f64 = f.gateways.iter().map(|g| g.share).sum();
        let mut gateways = Vec::with_capacity(f.gateways.len());
        for g in &f.gateways {
            let site = index("gateways.site", &g.site)?;
            if gateways.iter().any(|x: &GatewaySpec| x.site == site) {
                return invalid("gateways.site", format!("`{}` has two gateways", g.site));
            }
            if !(g.share.is_finite() && g.share > 0.0) {
                return invalid("gateways.share", format!("{}: must be above 0", g.site));
            }
            gateways.push(GatewaySpec {
                site,
                share: g.share / total,
            });
        }
        let round_trips = check_round_trips(&f.round_trips, &index)?;
        let ramp = match f.ramp {
            None => None,
            Some(r) => {
                if r.period_s < MIN_RAMP_PERIOD_S || r.period_s > MAX_DURATION_S {
                    return invalid(
                        "ramp.period_s",
                        format!("must be {MIN_RAMP_PERIOD_S}..={MAX_DURATION_S}"),
                    );
                }
                if !(r.swing.is_finite() && (0.0..=MAX_RAMP_SWING).contains(&r.swing)) {
                    return invalid("ramp.swing", format!("must be within 0..={MAX_RAMP_SWING}"));
                }
                Some(Ramp {
                    period_ms: r.period_s * 1_000,
                    swing: r.swing,
                })
            }
        };
        let bursts = match f.bursts {
            None => None,
            Some(b) => {
                if b.every_s == 0 || b.length_s > b.every_s {
                    return invalid("bursts.every_s", "must be above 0 and at least length_s");
                }
                if !(b.factor.is_finite() && b.factor >= 1.0) {
                    return invalid("bursts.factor", "must be at least 1");
                }
                Some(Bursts {
                    first_ms: b.first_s * 1_000,
                    every_ms: b.every_s * 1_000,
                    length_ms: b.length_s * 1_000,
                    factor: b.factor,
                })
            }
        };
        let episodes = f.degrade.len()
            + f.blips.len()
            + f.fail_fast.len()
            + f.epp_silent.len()
            + f.operator_frozen.len();
        if episodes > MAX_EPISODES {
            return invalid(
                "degrade",
                format!("at most {MAX_EPISODES} episodes of every kind together, not {episodes}"),
            );
        }
        let mut degrade = Vec::with_capacity(f.degrade.len());
        for d in &f.degrade {
            if !(MIN_DEGRADE_FACTOR..=MAX_DEGRADE_FACTOR).contains(&d.factor) {
                return invalid(
                    "degrade.factor",
                    format!("must be {MIN_DEGRADE_FACTOR}..={MAX_DEGRADE_FACTOR}"),
                );
            }
            check_times("degrade.until_s", d.from_s, d.until_s)?;
            degrade.push(Degrade {
                site: index("degrade.site", &d.site)?,
                factor: d.factor,
                from_ms: d.from_s * 1_000,
                until_ms: d.until_s * 1_000,
            });
        }
        let mut blips = Vec::with_capacity(f.blips.len());
        for b in &f.blips {
            check_times("blips.until_s", b.from_s, b.until_s)?;
            blips.push(Blip {
                site: index("blips.site", &b.site)?,
                from_ms: b.from_s * 1_000,
                until_ms: b.until_s * 1_000,
            });
        }
        let mut fail_fast: Vec<FailFast> = Vec::with_capacity(f.fail_fast.len());
        for e in &f.fail_fast {
            check_times("fail_fast.until_s", e.from_s, e.until_s)?;
            let site = index("fail_fast.site", &e.site)?;
            if e.status != FULL_STATUS && !SERVER_ERRORS.contains(&e.status) {
                return invalid(
                    "fail_fast.status",
                    format!(
                        "{}: must be {FULL_STATUS} or {}..={}",
                        e.status,
                        SERVER_ERRORS.start(),
                        SERVER_ERRORS.end()
                    ),
                );
            }
            if let Some(r) = e.retry_after_s {
                if e.status != FULL_STATUS {
                    return invalid(
                        "fail_fast.retry_after_s",
                        format!("only a {FULL_STATUS} states one, not a {}", e.status),
                    );
                }
                if r > MAX_RETRY_AFTER_S {
                    return invalid(
                        "fail_fast.retry_after_s",
                        format!("must be at most {MAX_RETRY_AFTER_S}"),
                    );
                }
            }
            let (from_ms, until_ms) = (e.from_s * 1_000, e.until_s * 1_000);
            if let Some(other) = fail_fast
                .iter()
                .find(|o| o.site == site && o.from_ms < until_ms && from_ms < o.until_ms)
            {
                return invalid(
                    "fail_fast.from_s",
                    format!(
                        "{}: overlaps the episode from {} s to {} s (one status at a time)",
                        e.site,
                        other.from_ms / 1_000,
                        other.until_ms / 1_000
                    ),
                );
            }
            fail_fast.push(FailFast {
                site,
                status: e.status,
                retry_after_ms: e.retry_after_s.map(|r| r * 1_000),
                from_ms,
                until_ms,
            });
        }
        let episodes = |field_site: &'static str,
                        field_until: &'static str,
                        list: &[EpisodeFile]|
         -> Result<Vec<Episode>, ScenarioError> {
            list.iter()
                .map(|e| {
                    check_times(field_until, e.from_s, e.until_s)?;
                    Ok(Episode {
                        site: index(field_site, &e.site)?,
                        from_ms: e.from_s * 1_000,
                        until_ms: e.until_s * 1_000,
                    })
                })
                .collect()
        };
        let epp_silent = episodes("epp_silent.site", "epp_silent.until_s", &f.epp_silent)?;
        let operator_frozen = episodes(
            "operator_frozen.site",
            "operator_frozen.until_s",
            &f.operator_frozen,
        )?;
        let flow_control = match f.flow_control {
            None => None,
            Some(fc) => {
                if fc.queue_per_endpoint > MAX_SLOTS_PER_ENDPOINT {
                    return invalid(
                        "flow_control.queue_per_endpoint",
                        format!("must be at most {MAX_SLOTS_PER_ENDPOINT}"),
                    );
                }
                if !(fc.band_capacity_per_slot.is_finite()
                    && fc.band_capacity_per_slot > 0.0
                    && fc.band_capacity_per_slot <= MAX_BAND_CAPACITY_PER_SLOT)
                {
                    return invalid(
                        "flow_control.band_capacity_per_slot",
                        format!("must be within (0, {MAX_BAND_CAPACITY_PER_SLOT}]"),
                    );
                }
                let high = match fc.high {
                    None => None,
                    Some(h) => {
                        if h.priority == FALLBACK_PRIORITY {
                            return invalid(
                                "flow_control.high.priority",
                                "must not be band 0's priority",
                            );
                        }
                        if !(h.share > 0.0 && h.share < 1.0) {
                            return invalid("flow_control.high.share", "must be within (0, 1)");
                        }
                        if !(h.capacity_per_slot.is_finite()
                            && h.capacity_per_slot > 0.0
                            && h.capacity_per_slot <= MAX_BAND_CAPACITY_PER_SLOT)
                        {
                            return invalid(
                                "flow_control.high.capacity_per_slot",
                                format!("must be within (0, {MAX_BAND_CAPACITY_PER_SLOT}]"),
                            );
                        }
                        Some(HighBand {
                            priority: h.priority,
                            share: h.share,
                            capacity_per_slot: h.capacity_per_slot,
                        })
                    }
                };
                Some(FlowControl {
                    queue_per_endpoint: fc.queue_per_endpoint,
                    band_capacity_per_slot: fc.band_capacity_per_slot,
                    high,
                })
            }
        };
        let duration_ms = f.duration_s * 1_000;
        let template = SimConfig {
            sites: f
                .sites
                .iter()
                .map(|s| SiteSpec {
                    name: s.name.clone(),
                    endpoints: s.endpoints,
                    slots_per_endpoint: s.slots_per_endpoint,
                    rtt_ms: s.rtt_ms,
                })
                .collect(),
            gateways,
            local_rtt_ms: f.local_rtt_ms,
            round_trips,
            service: ServiceTime::from(f.service),
            load: f.loads[0],
            bursts,
            ramp,
            streaming_share: f.streaming_share,
            duration_ms,
            warmup_ms: (f.warmup_s * 1_000).min(duration_ms / MAX_WARMUP_DIVISOR),
            degrade,
            blips,
            fail_fast,
            epp_silent,
            operator_frozen,
            flow_control,
            transport: f.signal_transport,
            seed: f.seeds[0],
        };
        Ok(Self {
            description: f.description,
            loads: f.loads,
            seeds: f.seeds,
            template,
            warmup_s: f.warmup_s,
        })
    }
}

/// The named pairs' round trips, each between two different known sites, at most
/// [`MAX_RTT_MS`], no pair named twice.
fn check_round_trips(
    files: &[RoundTripFile],
    index: &dyn Fn(&'static str, &str) -> Result<usize, ScenarioError>,
) -> Result<Vec<RoundTrip>, ScenarioError> {
    let mut out: Vec<RoundTrip> = Vec::with_capacity(files.len());
    for r in files {
        let [a, b] = &r.between;
        let (ai, bi) = (
            index("round_trips.between", a)?,
            index("round_trips.between", b)?,
        );
        if ai == bi {
            return invalid("round_trips.between", format!("`{a}` twice"));
        }
        if out.iter().any(|x| x.joins(ai, bi)) {
            return invalid(
                "round_trips.between",
                format!("`{a}` and `{b}` named twice"),
            );
        }
        if r.rtt_ms > MAX_RTT_MS {
            return invalid(
                "round_trips.rtt_ms",
                format!("{a}-{b}: must be at most {MAX_RTT_MS}"),
            );
        }
        out.push(RoundTrip {
            a: ai,
            b: bi,
            rtt_ms: r.rtt_ms,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sites, one gateway, nothing scheduled; `episodes` appended.
    fn with(episodes: &str) -> Result<Scenario, ScenarioError> {
        let text = format!(
            r#"
description = "t"
duration_s = 60
loads = [0.5]
seeds = [1]
streaming_share = 0.5
[service]
median_ms = 1000.0
sigma = 0.5
prefill_share = 0.1
output_tokens = 10
[[sites]]
name = "a"
endpoints = 1
slots_per_endpoint = 8
[[sites]]
name = "b"
endpoints = 1
slots_per_endpoint = 8
[[gateways]]
site = "a"
share = 1.0
{episodes}
"#
        );
        Scenario::parse(&text)
    }

    fn fail_fast(status: u16, retry_after_s: Option<u64>) -> String {
        let retry = retry_after_s.map_or_else(String::new, |r| format!("retry_after_s = {r}\n"));
        format!(
            "[[fail_fast]]\nsite = \"b\"\nstatus = {status}\n{retry}from_s = 10\nuntil_s = 20\n"
        )
    }

    fn refused(result: Result<Scenario, ScenarioError>, field: &str) {
        match result {
            Err(e) => assert!(e.to_string().contains(field), "{e}"),
            Ok(_) => panic!("accepted; {field} should refuse it"),
        }
    }

    fn high_band(priority: i32, share: f64, capacity_per_slot: f64) -> String {
        format!(
            "[flow_control]\nqueue_per_endpoint = 0\nband_capacity_per_slot = 4.0\n\
             [flow_control.high]\npriority = {priority}\nshare = {share:?}\n\
             capacity_per_slot = {capacity_per_slot:?}\n"
        )
    }

    #[test]
    fn a_named_pair_round_trip_replaces_the_serving_sites_own_for_a_gateway_at_either_end() {
        let three = |pairs: &str| {
            with(&format!(
                "[[sites]]\nname = \"c\"\nendpoints = 1\nslots_per_endpoint = 8\nrtt_ms = 30\n{pairs}"
            ))
        };
        let s = three("[[round_trips]]\nbetween = [\"c\", \"a\"]\nrtt_ms = 90\n").unwrap();
        let c = s.config(0.5, 1);
        // The gateway is at a: a to c is the pair's, a to b the site's own (0), a local.
        assert_eq!(c.rtt_ms(0, 2), 90);
        assert_eq!(c.rtt_ms(0, 1), 0);
        assert_eq!(c.rtt_ms(0, 0), c.local_rtt_ms);
        let at_limit =
            format!("[[round_trips]]\nbetween = [\"a\", \"b\"]\nrtt_ms = {MAX_RTT_MS}\n");
        assert!(three(&at_limit).is_ok());
        let past = format!(
            "[[round_trips]]\nbetween = [\"a\", \"b\"]\nrtt_ms = {}\n",
            MAX_RTT_MS + 1
        );
        refused(three(&past), "round_trips.rtt_ms");
        refused(
            three("[[round_trips]]\nbetween = [\"a\", \"x\"]\nrtt_ms = 1\n"),
            "round_trips.between",
        );
        refused(
            three("[[round_trips]]\nbetween = [\"a\", \"a\"]\nrtt_ms = 1\n"),
            "round_trips.between",
        );
        let twice = "[[round_trips]]\nbetween = [\"a\", \"b\"]\nrtt_ms = 1\n\
                     [[round_trips]]\nbetween = [\"b\", \"a\"]\nrtt_ms = 2\n";
        refused(three(twice), "round_trips.between");
    }

    #[test]
    fn signal_transport_reads_poll_by_default_gossip_when_named_and_refuses_any_other() {
        let base = include_str!("../../../scenarios/standard.toml");
        let with_transport = |t: &str| Scenario::parse(&format!("signal_transport = {t}\n{base}"));
        assert_eq!(
            Scenario::parse(base).unwrap().config(0.5, 1).transport,
            SignalTransport::Poll
        );
        for (named, want) in [
            ("\"poll\"", SignalTransport::Poll),
            ("\"gossip\"", SignalTransport::Gossip),
        ] {
            assert_eq!(
                with_transport(named).unwrap().config(0.5, 1).transport,
                want
            );
        }
        assert!(with_transport("\"carrier\"").is_err());
    }

    #[test]
    fn a_ramp_is_accepted_at_its_bounds_and_refused_one_past() {
        let ramp = |period: u64, swing: f64| {
            with(&format!("[ramp]\nperiod_s = {period}\nswing = {swing}\n"))
        };
        let s = ramp(MIN_RAMP_PERIOD_S, MAX_RAMP_SWING).unwrap();
        assert_eq!(
            s.config(0.5, 1).ramp,
            Some(Ramp {
                period_ms: MIN_RAMP_PERIOD_S * 1_000,
                swing: MAX_RAMP_SWING
            })
        );
        assert!(ramp(MAX_DURATION_S, 0.0).is_ok());
        refused(ramp(MIN_RAMP_PERIOD_S - 1, 0.5), "ramp.period_s");
        refused(ramp(MAX_DURATION_S + 1, 0.5), "ramp.period_s");
        refused(ramp(600, MAX_RAMP_SWING + 0.01), "ramp.swing");
        refused(ramp(600, -0.1), "ramp.swing");
    }

    #[test]
    fn a_higher_band_is_not_band_0_takes_a_share_within_0_and_1_and_a_bounded_capacity() {
        let s = with(&high_band(1, 0.3, MAX_BAND_CAPACITY_PER_SLOT)).unwrap();
        let high = s.config(0.5, 1).flow_control.unwrap().high.unwrap();
        assert_eq!(high.priority, 1);
        assert!((high.share - 0.3).abs() < 1e-12);
        assert!((high.capacity_per_slot - MAX_BAND_CAPACITY_PER_SLOT).abs() < 1e-12);
        assert!(with(&high_band(-2, 0.999, 0.5)).is_ok(), "a sheddable band");
        refused(with(&high_band(0, 0.3, 1.0)), "flow_control.high.priority");
        for share in [0.0, 1.0, -0.1] {
            refused(with(&high_band(1, share, 1.0)), "flow_control.high.share");
        }
        for capacity in [0.0, MAX_BAND_CAPACITY_PER_SLOT * 1.001] {
            refused(
                with(&high_band(1, 0.3, capacity)),
                "flow_control.high.capacity_per_slot",
            );
        }
    }

    #[test]
    fn a_site_fails_fast_with_429_or_a_5xx_and_nothing_else() {
        for ok in [
            FULL_STATUS,
            *SERVER_ERRORS.start(),
            503,
            *SERVER_ERRORS.end(),
        ] {
            let s = with(&fail_fast(ok, None)).unwrap();
            assert_eq!(s.config(0.5, 1).fail_fast[0].status, ok);
        }
        for bad in [
            FULL_STATUS - 1,
            FULL_STATUS + 1,
            SERVER_ERRORS.start() - 1,
            SERVER_ERRORS.end() + 1,
            200,
        ] {
            refused(with(&fail_fast(bad, None)), "fail_fast.status");
        }
    }

    #[test]
    fn only_a_429_states_a_retry_after_and_at_most_the_longest() {
        let s = with(&fail_fast(FULL_STATUS, Some(MAX_RETRY_AFTER_S))).unwrap();
        assert_eq!(
            s.config(0.5, 1).fail_fast[0].retry_after_ms,
            Some(MAX_RETRY_AFTER_S * 1_000)
        );
        refused(
            with(&fail_fast(FULL_STATUS, Some(MAX_RETRY_AFTER_S + 1))),
            "fail_fast.retry_after_s",
        );
        refused(with(&fail_fast(503, Some(5))), "fail_fast.retry_after_s");
    }

    #[test]
    fn two_fail_fast_episodes_of_one_site_may_touch_but_not_overlap() {
        let later = |from: u64| {
            format!("[[fail_fast]]\nsite = \"b\"\nstatus = 500\nfrom_s = {from}\nuntil_s = 30\n")
        };
        let touching = format!("{}{}", fail_fast(503, None), later(20));
        assert_eq!(with(&touching).unwrap().config(0.5, 1).fail_fast.len(), 2);
        let overlapping = format!("{}{}", fail_fast(503, None), later(19));
        refused(with(&overlapping), "fail_fast.from_s");
        // Another site may fail at the same time.
        let other = format!(
            "{}[[fail_fast]]\nsite = \"a\"\nstatus = 500\nfrom_s = 10\nuntil_s = 20\n",
            fail_fast(503, None)
        );
        assert!(with(&other).is_ok());
    }

    #[test]
    fn an_episode_ends_after_it_starts_and_within_the_longest_run() {
        let silent = |from: u64, until: u64| {
            format!("[[epp_silent]]\nsite = \"a\"\nfrom_s = {from}\nuntil_s = {until}\n")
        };
        let s = with(&silent(0, MAX_DURATION_S)).unwrap();
        assert_eq!(
            s.config(0.5, 1).epp_silent,
            [Episode {
                site: 0,
                from_ms: 0,
                until_ms: MAX_DURATION_S * 1_000
            }]
        );
        refused(with(&silent(0, MAX_DURATION_S + 1)), "epp_silent.until_s");
        refused(with(&silent(10, 10)), "epp_silent.until_s");
        let frozen = "[[operator_frozen]]\nsite = \"c\"\nfrom_s = 1\nuntil_s = 2\n";
        refused(with(frozen), "operator_frozen.site");
        let blip = "[[blips]]\nsite = \"b\"\nfrom_s = 5\nuntil_s = 4\n";
        refused(with(blip), "blips.until_s");
    }

    #[test]
    fn every_kind_of_episode_counts_towards_the_most_a_scenario_schedules() {
        let episode = |i: usize| {
            let kind = ["epp_silent", "operator_frozen", "blips"][i % 3];
            format!(
                "[[{kind}]]\nsite = \"b\"\nfrom_s = {i}\nuntil_s = {}\n",
                i + 1
            )
        };
        let most: String = (0..MAX_EPISODES).map(episode).collect();
        let s = with(&most).unwrap();
        let c = s.config(0.5, 1);
        assert_eq!(
            c.epp_silent.len() + c.operator_frozen.len() + c.blips.len(),
            MAX_EPISODES
        );
        let one_more = format!("{most}{}", fail_fast(500, None));
        refused(with(&one_more), "at most");
    }
}
