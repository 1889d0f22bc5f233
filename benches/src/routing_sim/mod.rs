//! The deterministic discrete-event routing simulator (issue 6, "Routing quality").
//!
//! N sites of unequal capacity, each a [`SiteModel`] in virtual time, receive the same
//! Poisson-plus-bursts arrivals under several routing policies, one independent world per
//! policy. Signals reach the gateway only through [`signals::SignalPath`]: the real
//! exposition parser, EPP tracker, batches, stores and scorer, at the real cadences.
//! A site degrades mid-run and recovers later.
//!
//! Policies compared: ours (grid-score's table and pick), round-robin, capacity-weighted
//! random, least-queue on the polled signals (a queue-only cross-site scorer), and an
//! oracle that sees every site's true state instantly and joins the shortest expected
//! delay.
//!
//! Everything is a function of the configuration and its seed: the same inputs give the
//! same figures, whichever thread runs them.

pub mod arrivals;
pub mod policy;
pub mod report;
pub mod signals;
pub mod stats;

use arrivals::{Arrival, Bursts, LoadShape};
use policy::{Policy, Router};
use signals::{SignalCounts, SignalPath};
use stats::{DegradeWindow, RunRecord, Summary};

use crate::site_model::{RequestSpec, ServiceTime, SiteConfig, SiteEvent, SiteModel};

/// One simulated site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteSpec {
    /// Its name (`grid_site`).
    pub name: String,
    /// Serving endpoints.
    pub endpoints: usize,
    /// Slots per endpoint.
    pub slots_per_endpoint: usize,
    /// Whether it is the gateway's own site (scraped at 1 s) or remote (5 s peer poll).
    pub local: bool,
}

impl SiteSpec {
    /// Its slots.
    pub fn slots(&self) -> usize {
        self.endpoints * self.slots_per_endpoint
    }
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

/// A whole scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// The sites.
    pub sites: Vec<SiteSpec>,
    /// Service-time distribution of every request.
    pub service: ServiceTime,
    /// Mean offered load, bursts included, as a share of the sites' total capacity.
    pub load: f64,
    /// Bursts on top of the base rate.
    pub bursts: Option<Bursts>,
    /// Share of streaming requests.
    pub streaming_share: f64,
    /// Arrivals stop at this time (ms); the run then drains.
    pub duration_ms: u64,
    /// Requests arriving earlier are served but not measured (the learners start blank).
    pub warmup_ms: u64,
    /// The mid-run degrade.
    pub degrade: Option<Degrade>,
    /// Fixes the arrivals and every policy's random draws.
    pub seed: u64,
}

/// The default run length (virtual seconds).
pub const DEFAULT_DURATION_S: u64 = 600;
/// The default warm-up (virtual seconds).
pub const DEFAULT_WARMUP_S: u64 = 30;

impl SimConfig {
    /// The standard scenario at `load`: sites of 8, 16, 32 and 64 slots (endpoints of 8
    /// slots), the 32-slot site local and the rest remote; 10 s bursts at 1.5x every
    /// minute; the 16-slot site three times slower from the first to the second third of
    /// the run.
    pub fn standard(load: f64, duration_ms: u64, seed: u64) -> Self {
        let site = |name: &str, endpoints, local| SiteSpec {
            name: name.into(),
            endpoints,
            slots_per_endpoint: 8,
            local,
        };
        Self {
            sites: vec![
                site("s8", 1, false),
                site("s16", 2, false),
                site("s32", 4, true),
                site("s64", 8, false),
            ],
            service: ServiceTime::default(),
            load,
            bursts: Some(Bursts {
                first_ms: 45_000,
                every_ms: 60_000,
                length_ms: 10_000,
                factor: 1.5,
            }),
            streaming_share: 0.8,
            duration_ms,
            warmup_ms: (DEFAULT_WARMUP_S * 1_000).min(duration_ms / 4),
            degrade: Some(Degrade {
                site: 1,
                factor: 3.0,
                from_ms: duration_ms / 3 / 1_000 * 1_000,
                until_ms: duration_ms * 2 / 3 / 1_000 * 1_000,
            }),
            seed,
        }
    }

    /// Total slots.
    pub fn slots(&self) -> usize {
        self.sites.iter().map(SiteSpec::slots).sum()
    }

    /// Requests per second the sites can serve at full occupancy (undegraded).
    pub fn capacity_per_s(&self) -> f64 {
        self.slots() as f64 * 1_000.0 / self.service.mean_ms()
    }

    /// The load shape the arrivals follow: the base rate is set so that the long-run
    /// mean, bursts included, is `load` of capacity.
    pub fn load_shape(&self) -> LoadShape {
        let burst_mean = self.bursts.map_or(1.0, |b| {
            1.0 + (b.factor.max(1.0) - 1.0) * b.length_ms as f64 / b.every_ms.max(1) as f64
        });
        LoadShape {
            rate_per_s: self.load * self.capacity_per_s() / burst_mean,
            bursts: self.bursts,
            service: self.service,
            streaming_share: self.streaming_share,
            duration_ms: self.duration_ms,
        }
    }

    /// The degrade as the statistics see it: the site's fair share of the effective
    /// capacity while degraded.
    pub fn degrade_window(&self) -> DegradeWindow {
        let Some(d) = self.degrade else {
            return DegradeWindow {
                site: 0,
                from_ms: self.duration_ms,
                until_ms: self.duration_ms,
                fair_share: 0.0,
            };
        };
        let slow = self.sites[d.site].slots() as f64 / d.factor;
        let rest = (self.slots() - self.sites[d.site].slots()) as f64;
        DegradeWindow {
            site: d.site,
            from_ms: d.from_ms,
            until_ms: d.until_ms,
            fair_share: slow / (slow + rest),
        }
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
}

/// Drains every site's events into the record.
fn collect(sites: &mut [SiteModel], warmup_ms: u64, record: &mut RunRecord, completed: &mut u64) {
    for site in sites {
        while let Some(event) = site.poll_event() {
            match event {
                SiteEvent::Started { arrived_at, at, .. } if arrived_at >= warmup_ms => {
                    record.delays_ms.push(at - arrived_at);
                }
                SiteEvent::Finished { .. } => *completed += 1,
                _ => {}
            }
        }
    }
}

fn advance(sites: &mut [SiteModel], t_ms: u64) {
    for site in sites.iter_mut() {
        site.advance(t_ms);
    }
}

/// Runs one policy over `arrivals` in its own world.
///
/// # Panics
///
/// When the scenario is not one a site model accepts (a site out of the limits of
/// [`SiteConfig`], a degrade factor out of range): scenarios are built by the caller.
pub fn run_policy(config: &SimConfig, arrivals: &[Arrival], policy: Policy) -> PolicyResult {
    let mut sites: Vec<SiteModel> = config
        .sites
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut c = SiteConfig::new(s.name.clone(), s.endpoints, s.slots_per_endpoint);
            c.service = config.service;
            SiteModel::new(c, config.seed ^ i as u64).expect("scenario sites are valid")
        })
        .collect();
    let names: Vec<String> = config.sites.iter().map(|s| s.name.clone()).collect();
    let local: Vec<bool> = config.sites.iter().map(|s| s.local).collect();
    let mut signals = SignalPath::new(&names, &local);
    let mut router = Router::new(policy, config);
    let seconds = (config.duration_ms / 1_000 + 1) as usize;
    let mut record = RunRecord::new(sites.len(), seconds);
    let mut completed = 0;
    let mut next_signal = 0;
    let mut degrade_steps: Vec<(u64, f64)> = config
        .degrade
        .map(|d| vec![(d.from_ms, d.factor), (d.until_ms, 1.0)])
        .unwrap_or_default();
    degrade_steps.reverse();

    for arrival in arrivals {
        while next_signal <= arrival.at_ms {
            while let Some(&(at, factor)) =
                degrade_steps.last().filter(|(at, _)| *at <= next_signal)
            {
                advance(&mut sites, at);
                if let Some(d) = config.degrade {
                    sites[d.site]
                        .set_degrade(factor)
                        .expect("scenario degrade factors are in range");
                }
                degrade_steps.pop();
            }
            advance(&mut sites, next_signal);
            collect(&mut sites, config.warmup_ms, &mut record, &mut completed);
            signals.at(next_signal, &sites);
            next_signal = SignalPath::next_instant_after(next_signal);
        }
        advance(&mut sites, arrival.at_ms);
        collect(&mut sites, config.warmup_ms, &mut record, &mut completed);
        let (site, placed) = router.choose(&sites, &signals);
        let s = &sites[site];
        let full = s.running() + s.waiting() >= s.capacity();
        let counted = arrival.at_ms >= config.warmup_ms;
        record.route(arrival.at_ms, site, counted, full);
        if !placed && counted {
            record.unplaced += 1;
        }
        sites[site]
            .arrive(
                arrival.at_ms,
                RequestSpec {
                    streaming: arrival.streaming,
                    service_ms: Some(arrival.service_ms),
                },
            )
            .expect("no endpoint is ever taken away in this scenario");
    }
    // Drain: every admitted request starts and completes.
    while let Some(t) = sites.iter().filter_map(SiteModel::next_deadline).min() {
        advance(&mut sites, t);
        collect(&mut sites, config.warmup_ms, &mut record, &mut completed);
    }
    PolicyResult {
        policy,
        summary: Summary::of(&record, config.degrade_window()),
        signals: signals.counts(),
        record,
        arrived: arrivals.len() as u64,
        completed,
    }
}

/// Runs every policy in `policies` over the same arrivals, on up to `threads` threads.
/// The results come back in `policies` order and do not depend on `threads`.
///
/// # Panics
///
/// As [`run_policy`] does, on any thread.
pub fn run(config: &SimConfig, policies: &[Policy], threads: usize) -> Vec<PolicyResult> {
    let arrivals = arrivals::generate(&config.load_shape(), config.seed);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut results: Vec<Option<PolicyResult>> = vec![None; policies.len()];
    let slots = std::sync::Mutex::new(&mut results);
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1).min(policies.len()) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&policy) = policies.get(i) else {
                        break;
                    };
                    let result = run_policy(config, &arrivals, policy);
                    slots.lock().expect("no worker panics while holding it")[i] = Some(result);
                }
            });
        }
    });
    results.into_iter().flatten().collect()
}
