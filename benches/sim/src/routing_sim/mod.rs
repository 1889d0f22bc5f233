//! The deterministic discrete-event routing simulator (`docs/routing-quality.md`).
//!
//! N sites of unequal capacity, each a [`SiteModel`](crate::site_model::SiteModel) in
//! virtual time, receive the same Poisson-plus-bursts arrivals under several routing
//! policies, one independent world per policy. The arrivals come in at one gateway or at
//! several (one per site that has arrivals, each with its own router and its own view of
//! the signals), and a request reaches its site half a WAN round trip after it is
//! routed. Signals reach each gateway only through [`signals::SignalPath`]: the real
//! exposition parser, EPP tracker, batches, stores and scorer, at the real cadences.
//! Sites degrade, lose every endpoint, fail fast, or lose their signals for a while
//! (an EPP gone silent, an operator frozen), as the scenario says ([`scenario`]: files
//! under `benches/scenarios/`).
//!
//! Every gateway retries as grid's gateway does, whatever its policy: a request a site
//! refused before any work goes once to another site within a retry budget
//! (`grid_score::retry`); what is not retried is a client-visible failure. Grid's own
//! gateway also probes the sites it ejected for failing (`Refresher::probes_due`).
//!
//! Policies compared: ours (grid-score's table and pick), round-robin, capacity-weighted
//! random, least-queue on the polled signals (a queue-only cross-site scorer), Prequal
//! and power of two choices over peak-EWMA (both from the gateway's own probes and
//! requests), llm-d's queue and KV-cache scorers over the polled readings as a
//! multi-cluster hub runs them, LiteLLM's least-busy router with its cooldowns (the gateway's own requests
//! in flight, blind to capacity), and an oracle that sees every site's true state instantly and joins the
//! shortest expected delay.
//!
//! Everything is a function of the configuration and its seed: the same inputs give the
//! same figures, whichever thread runs them.

pub mod arrivals;
pub mod hub_scorer;
pub mod least_busy;
pub mod peak_ewma;
pub mod policy;
pub mod prequal;
pub mod report;
pub mod run_loop;
pub mod scenario;
pub mod setup;
pub mod signals;
pub mod skywalker;
pub mod stats;

use policy::Policy;
pub use run_loop::{PolicyResult, run_policy};
pub use setup::{
    Blip, DEFAULT_DURATION_S, DEFAULT_WARMUP_S, Degrade, Episode, FailFast, FlowControl,
    GatewaySpec, HighBand, MAX_WARMUP_DIVISOR, RoundTrip, STANDARD_FLOW_CONTROL, SignalTransport,
    SimConfig, SiteSpec,
};

/// Runs every policy in `policies` over the same arrivals, on up to `threads` threads.
/// The results come back in `policies` order and do not depend on `threads`.
///
/// # Panics
///
/// As [`run_policy`] does, on any thread.
pub fn run(config: &SimConfig, policies: &[Policy], threads: usize) -> Vec<PolicyResult> {
    let mut arrivals = arrivals::generate(&config.load_shape(), config.seed);
    let shares: Vec<f64> = config.gateways.iter().map(|g| g.share).collect();
    arrivals::assign_gateways(&mut arrivals, &shares, config.seed);
    if let Some(high) = config.flow_control.and_then(|fc| fc.high) {
        arrivals::assign_priorities(&mut arrivals, high.priority, high.share, config.seed);
    }
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
