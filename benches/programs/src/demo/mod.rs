//! `grid-demo`: a whole local grid (three simulated sites of unequal capacity, an operator
//! each, one gateway) driven by OpenAI-style load through a scripted scenario, shown live
//! and plotted at the end.
//!
//! ```text
//! scenario steps --control--> simulated sites <--scrape-- operators <--poll-- gateway
//! traffic (Poisson) --POST--> gateway --proxy--> sites;  answers --> tally
//! every 50 ms: steps due, transitions seen at the gateway;  every 1 s: frame + plot point
//! ```
//!
//! The run stops by itself after its duration, or when `stop` turns true (Ctrl-C in the
//! binary); either way the load stops, the grid shuts down, its certificates are removed
//! and the plot is written.

pub mod plot;
pub mod scenario;
pub mod screen;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;

use grid_kit::Error;
use grid_kit::clock::Stopwatch;
use grid_kit::local_grid::{
    Backend, Cadence, GridSpec, LocalGrid, Shedding, SiteRouting, SiteSpec, TransportMode,
};
use grid_kit::sim_site::{CapacityReaderMode, SimSiteConfig};
use grid_sim::fake_epp::EppIdentity;
use grid_sim::site_model::{BandConfig, ServiceTime, SiteConfig};

/// Requests each site's flow-control band holds per slot before it refuses new ones as
/// `rejected-saturated` (429): a few request durations of queue.
pub const DEMO_BAND_PER_SLOT: usize = 4;
use grid_kit::traffic::{self, Rate, Tally};
use plot::{PlotData, PlotPoint};
use scenario::{Action, SITES, Scenario};
use screen::{Event, Frame, SiteRow};
pub use screen::{SHARE_WINDOW_S, TTFT_WINDOW_S};

/// The plot's file name when `--plot` is not given: in the directory the demo was run
/// from, where a newcomer looks, not inside cargo's target directory.
pub const DEFAULT_PLOT: &str = "grid-demo.svg";

/// Where the plot goes, as an absolute path (printed at the end, so it must be usable
/// from any directory): `given`, or [`DEFAULT_PLOT`] in the current directory.
pub fn plot_path(given: Option<&Path>) -> std::io::Result<PathBuf> {
    std::path::absolute(given.unwrap_or(Path::new(DEFAULT_PLOT)))
}

/// The model the demo's sites serve.
pub const MODEL: &str = "grid-demo-llm";
/// How often due steps and routing transitions are checked.
pub const TICK: Duration = Duration::from_millis(50);
/// How long the grid gets to show every site's first reading (a remote site waits for a
/// peer poll).
pub const MEASURED_WITHIN: Duration = Duration::from_secs(30);
/// How long stopping the load and the grid may take before the demo gives up waiting.
pub const STOP_WITHIN: Duration = Duration::from_secs(10);

/// Every site's service times: a chat request of about 0.9 s, a tenth of it before the
/// first token.
pub const SERVICE: ServiceTime = ServiceTime {
    median_ms: 800.0,
    sigma: 0.5,
    prefill_share: 0.15,
    output_tokens: 40,
};

/// The demo's shedding knobs: grid-score's defaults, except leaving waits for two peer
/// polls so a remote site's saturation (refreshed every 5 s) does not flap in and out.
pub const SHEDDING: Shedding = Shedding {
    full_after_ms: 2_000,
    room_after_ms: 7_000,
    retry_after_s: 1,
};

/// How a run goes.
#[derive(Clone, Debug)]
pub struct DemoConfig {
    /// How long the load runs.
    pub duration: Duration,
    /// Base offered load as a fraction of the grid's nominal capacity.
    pub load: f64,
    /// The script.
    pub scenario: Scenario,
    /// Where the SVG goes (a relative path is taken from the current directory).
    pub plot: PathBuf,
    /// The daemons' cadences (the defaults: remote sites seen every 5 s).
    pub cadence: Cadence,
    /// Fixes arrivals and service times.
    pub seed: u64,
    /// Redraw a terminal screen (true) or print plain lines (false).
    pub live: bool,
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct Report {
    /// Where the plot was written, absolute.
    pub plot: PathBuf,
    /// Whether `stop` ended it early.
    pub interrupted: bool,
    /// Every event, in order.
    pub events: Vec<Event>,
    /// Answers 200, per site name.
    pub served: Vec<(String, u64)>,
    /// 429 answers.
    pub shed: u64,
    /// 503 answers.
    pub unavailable: u64,
    /// Everything else that failed.
    pub failed: u64,
    /// The gateway's routing evidence (`GET /v1/grid/routing`), read halfway through each
    /// scripted fault (a site degraded or without endpoints, until it is restored).
    pub evidence: Vec<StepEvidence>,
}

/// The gateway's routing evidence read during one scripted step.
#[derive(Clone, Debug)]
pub struct StepEvidence {
    /// When it was read, in milliseconds since the load started.
    pub at_ms: u64,
    /// The step it was read during (its short label, e.g. `b degrades`).
    pub step: String,
    /// The document as served.
    pub document: grid_daemon::evidence::GatewayRouting,
}

/// When to read the evidence: halfway between each step that takes a site down or slows
/// it and the step that restores it, with the former's label.
fn evidence_points(steps: &[scenario::Step]) -> Vec<(u64, String)> {
    steps
        .iter()
        .enumerate()
        .filter_map(|(i, step)| {
            let site = match &step.action {
                Action::Degrade { site, .. } | Action::DropAll { site } => *site,
                _ => return None,
            };
            let restored = steps[i + 1..]
                .iter()
                .find(|s| s.action == Action::Restore { site })?;
            Some((
                step.at_ms + (restored.at_ms - step.at_ms) / 2,
                step.action.label(),
            ))
        })
        .collect()
}

/// The grid's nominal capacity in requests per second: every slot busy with requests of
/// the mean service time.
pub fn capacity_rps() -> f64 {
    let slots: usize = SITES.iter().map(|(_, e, s)| e * s).sum();
    slots as f64 * 1_000.0 / SERVICE.mean_ms()
}

/// The demo grid: [`SITES`] with [`SERVICE`], shedding on.
pub fn grid_spec(cadence: Cadence, seed: u64) -> GridSpec {
    let sites = SITES
        .iter()
        .zip(0u64..)
        .map(|(&(name, endpoints, slots), i)| {
            let mut site = SiteConfig::new(name, endpoints, slots);
            site.service = SERVICE;
            // Each site's EPP runs flow control with one bounded band, as llm-d does:
            // what the endpoints cannot take waits there, and every answer carries the
            // band's headroom, which the gateway reads live (a degraded site's band
            // fills and its share falls between polls).
            site.queue_per_endpoint = Some(0);
            site.bands = vec![BandConfig {
                priority: 0,
                capacity: Some(endpoints * slots * DEMO_BAND_PER_SLOT),
            }];
            SiteSpec {
                name: name.to_owned(),
                backend: Backend::Simulated(SimSiteConfig {
                    site,
                    identity: EppIdentity::new(format!("{name}-pool"), MODEL),
                    seed: seed.wrapping_add(i),
                    spoof_flow_headers: false,
                    capacity_reader: CapacityReaderMode::Live,
                }),
            }
        })
        .collect();
    GridSpec {
        model: MODEL.to_owned(),
        sites,
        cadence,
        transport: TransportMode::Poll,
        shedding: Some(SHEDDING),
    }
}

fn say(out: &mut (dyn Write + Send), text: &str) {
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

/// Where each site stands, reduced to what is worth an event.
fn class(r: &SiteRouting) -> &'static str {
    match r {
        SiteRouting::Candidate {
            state: grid_score::CandidateState::Unmeasured,
            ..
        } => "unmeasured",
        SiteRouting::Candidate { .. } => "selectable",
        SiteRouting::Excluded(_) | SiteRouting::Absent => "excluded",
    }
}

/// The run's moving parts between ticks.
struct Run<'a> {
    config: &'a DemoConfig,
    grid: LocalGrid,
    names: Vec<String>,
    clock: Stopwatch,
    rate: Arc<Rate>,
    base_rps: f64,
    tally: Arc<Mutex<Tally>>,
    events: Vec<Event>,
    classes: Vec<&'static str>,
    shedding: bool,
    /// Per site, when the scenario last acted on it and how.
    acted: HashMap<&'static str, (u64, &'static str)>,
    plot: PlotData,
    /// Reads the gateway's own `/metrics`.
    metrics_client: grid_kit::load::LoadClient,
    /// Per site, the gateway's routed decisions counted so far.
    routed_total: Vec<f64>,
    /// Per sampled second, per site, the decisions routed during it.
    routed_per_second: Vec<Vec<f64>>,
    /// The routing evidence read so far.
    evidence: Vec<StepEvidence>,
}

impl Run<'_> {
    fn event(&mut self, at_ms: u64, text: String, out: &mut (dyn Write + Send)) {
        if !self.config.live {
            say(out, &format!("event t={:.1}s {text}", at_ms as f64 / 1e3));
        }
        self.events.push(Event { at_ms, text });
    }

    fn apply(&mut self, at_ms: u64, action: &Action, out: &mut (dyn Write + Send)) {
        match action {
            Action::Degrade { site, factor } => {
                if let Some(c) = self.grid.control(site) {
                    let _ = c.degrade(*factor);
                }
                self.acted.insert(site, (at_ms, "it degraded"));
            }
            Action::DropAll { site } => {
                if let Some(c) = self.grid.control(site) {
                    c.drop_all_endpoints();
                }
                self.acted.insert(site, (at_ms, "its endpoints dropped"));
            }
            Action::Restore { site } => {
                if let Some(c) = self.grid.control(site) {
                    c.restore();
                }
                self.acted.insert(site, (at_ms, "it was restored"));
            }
            Action::Load { factor } => self.rate.set(self.base_rps * factor),
        }
        self.plot.events.push((at_ms as f64 / 1e3, action.label()));
        self.event(at_ms, format!(">> {action}"), out);
    }

    /// Logs sites leaving or rejoining selection and shedding turning on or off.
    fn transitions(&mut self, at_ms: u64, out: &mut (dyn Write + Send)) {
        let view = self.grid.view();
        for i in 0..self.names.len() {
            let routing = grid_kit::local_grid::routing_of(&view, MODEL, &self.names[i]);
            let now = class(&routing);
            let before = std::mem::replace(&mut self.classes[i], now);
            if now == before {
                continue;
            }
            let name = self.names[i].clone();
            let what = match (&routing, now) {
                (SiteRouting::Excluded(reason), _) => format!("{name} left selection ({reason})"),
                (_, "unmeasured") => format!("{name} is unmeasured (no fresh reading)"),
                _ => format!("{name} is in selection"),
            };
            let since = SITES
                .iter()
                .find(|(n, _, _)| *n == name)
                .and_then(|(n, _, _)| self.acted.get(n))
                .map(|(t, how)| {
                    format!(
                        ", {:.1} s after {how}",
                        (at_ms.saturating_sub(*t)) as f64 / 1e3
                    )
                })
                .unwrap_or_default();
            self.event(at_ms, format!("{what}{since}"), out);
        }
        let shedding = view.is_shedding(MODEL);
        if shedding != self.shedding {
            self.shedding = shedding;
            let text = if shedding {
                "gateway sheds: every healthy site is full, answering 429 + Retry-After"
            } else {
                "gateway stops shedding"
            };
            self.event(at_ms, text.to_owned(), out);
        }
    }

    /// Reads the gateway's routing evidence during `step` (and, printing plain lines,
    /// shows it as `grid-gatewayd status` does). A failed read is said and skipped.
    async fn read_evidence(&mut self, at_ms: u64, step: String, out: &mut (dyn Write + Send)) {
        let uri = format!(
            "http://{}{}",
            self.grid.gateway_addr(),
            grid_daemon::evidence::ROUTING_PATH
        );
        let Ok(uri) = uri.parse() else { return };
        let read = match self.metrics_client.get(&uri).await {
            Ok((_, body)) => {
                grid_daemon::evidence::Document::parse(&body).map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        };
        match read {
            Ok(grid_daemon::evidence::Document::Gateway(document)) => {
                if !self.config.live {
                    let table =
                        grid_daemon::evidence::Document::Gateway(document.clone()).table(false);
                    say(
                        out,
                        &format!(
                            "routing evidence t={:.1}s, during \"{step}\" (grid-gatewayd status --url http://{}):\n{table}",
                            at_ms as f64 / 1e3,
                            self.grid.gateway_addr()
                        ),
                    );
                }
                self.evidence.push(StepEvidence {
                    at_ms,
                    step,
                    document,
                });
            }
            Ok(grid_daemon::evidence::Document::Operator(_)) => {}
            Err(e) => say(out, &format!("routing evidence not read: {e}")),
        }
    }

    /// Reads the gateway's routing decisions since the last sample (its
    /// `grid_gateway_score_decisions_total`, so the share of traffic is what the gateway routed,
    /// counted when it routed it). A failed read skips the second.
    async fn sample_routing(&mut self) {
        let uri = format!("http://{}/metrics", self.grid.gateway_addr());
        let Ok(uri) = uri.parse() else { return };
        let Ok((_, body)) = self.metrics_client.get(&uri).await else {
            return;
        };
        let totals = traffic::routed_by_site(&body);
        let now: Vec<f64> = self
            .names
            .iter()
            .map(|n| totals.get(n).copied().unwrap_or(0.0))
            .collect();
        let delta = now
            .iter()
            .zip(&self.routed_total)
            .map(|(n, before)| (n - before).max(0.0))
            .collect();
        self.routed_total = now;
        self.routed_per_second.push(delta);
    }

    /// Each site's share of the decisions routed over the last [`SHARE_WINDOW_S`] sampled
    /// seconds (`None` when nothing was routed).
    fn shares(&self) -> Vec<Option<f64>> {
        let recent =
            &self.routed_per_second[self.routed_per_second.len().saturating_sub(SHARE_WINDOW_S)..];
        let per_site: Vec<f64> = (0..self.names.len())
            .map(|i| recent.iter().map(|second| second[i]).sum())
            .collect();
        let total: f64 = per_site.iter().sum();
        per_site
            .into_iter()
            .map(|n| (total > 0.0).then(|| n / total))
            .collect()
    }

    /// Shows second `s` and records its plot point.
    fn frame(&mut self, s: usize, out: &mut (dyn Write + Send)) {
        let view = self.grid.view();
        let (mut ttft, last) = {
            let tally = self.tally.lock();
            (
                tally.window(s.saturating_sub(TTFT_WINDOW_S), s),
                tally.window(s.saturating_sub(1), s),
            )
        };
        let shares = self.shares();
        let mut rows = Vec::with_capacity(self.names.len());
        let mut point = PlotPoint {
            t_s: s as f64,
            share: Vec::new(),
            rho: Vec::new(),
        };
        for (i, name) in self.names.iter().enumerate() {
            let routing = grid_kit::local_grid::routing_of(&view, MODEL, name);
            let stats = self.grid.control(name).map(|c| c.stats());
            let share = shares[i];
            let t = &mut ttft.sites[i].ttft;
            let percentiles = t.p50().zip(t.p99());
            point.share.push(share);
            point.rho.push(match routing {
                SiteRouting::Candidate { rho, .. } if rho.is_finite() => Some(rho),
                _ => None,
            });
            rows.push(SiteRow {
                name: name.clone(),
                role: if i == 0 { "local" } else { "remote" },
                routing,
                in_flight: stats.map_or(0, |st| st.running + st.waiting),
                share,
                ttft: percentiles,
            });
        }
        self.plot.points.push(point);
        let failed = last.failed + last.not_sent + last.sites.iter().map(|x| x.failed).sum::<u64>();
        let frame = Frame {
            elapsed_s: s as u64,
            duration_s: self.config.duration.as_secs(),
            scenario: self.config.scenario.as_str(),
            offered_rps: self.rate.get(),
            capacity_rps: capacity_rps(),
            sites: rows,
            shedding: view.is_shedding(MODEL),
            last_second: (
                last.sites.iter().map(|x| x.ok).sum(),
                last.shed,
                last.unavailable,
                failed,
            ),
            events: &self.events,
        };
        if self.config.live {
            let _ = write!(out, "{}{}", screen::REDRAW, screen::render(&frame));
            let _ = out.flush();
        } else {
            say(out, &screen::line(&frame));
        }
    }
}

/// Runs the demo, writing its screen (or lines) to `out`.
pub async fn run(
    config: &DemoConfig,
    mut stop: watch::Receiver<bool>,
    out: &mut (dyn Write + Send),
) -> Result<Report, Error> {
    say(
        out,
        "grid-demo: minting certificates, starting 3 simulated sites, 3 operators and a gateway on 127.0.0.1 ...",
    );
    // Once, before anything scrolls or is redrawn; `--help` carries the same text.
    say(out, &screen::legend());
    let grid = LocalGrid::start(&grid_spec(config.cadence, config.seed)).await?;
    say(
        out,
        &format!(
            "gateway on http://{} (model {MODEL}); certificates in {}; waiting for every site's first reading ...",
            grid.gateway_addr(),
            grid.dir().display()
        ),
    );
    let measured = tokio::select! {
        r = grid.wait_measured(MEASURED_WITHIN) => Some(r),
        _ = stop.wait_for(|s| *s) => None,
    };
    let names: Vec<String> = grid.site_names().map(str::to_owned).collect();
    let base_rps = capacity_rps() * config.load;
    let view = grid.view();
    // Events report changes from here on: where each site stands now is the baseline.
    let classes = names
        .iter()
        .map(|n| class(&grid_kit::local_grid::routing_of(&view, MODEL, n)))
        .collect();
    drop(view);
    let mut run = Run {
        metrics_client: grid_kit::load::LoadClient::new(
            grid_kit::load::Protocol::Http1,
            Duration::from_secs(1),
        ),
        routed_total: vec![0.0; names.len()],
        routed_per_second: Vec::new(),
        evidence: Vec::new(),
        config,
        classes,
        tally: Arc::new(Mutex::new(Tally::new(names.clone()))),
        plot: PlotData {
            sites: names.clone(),
            ..PlotData::default()
        },
        names,
        grid,
        clock: Stopwatch::start(),
        rate: Arc::new(Rate::new(base_rps)),
        base_rps,
        events: Vec::new(),
        shedding: false,
        acted: HashMap::new(),
    };
    let interrupted = match measured {
        None => true,
        Some(Err(e)) => {
            run.grid.shutdown().await;
            return Err(e);
        }
        Some(Ok(_)) => drive(&mut run, &mut stop, out).await,
    };
    let Run {
        grid,
        tally,
        plot: plot_data,
        events,
        names,
        evidence,
        ..
    } = run;
    if tokio::time::timeout(STOP_WITHIN, grid.shutdown())
        .await
        .is_err()
    {
        say(
            out,
            "grid-demo: the grid did not stop in time; exiting anyway",
        );
    }
    let plot_path = std::path::absolute(&config.plot)
        .map_err(|e| Error::Plot(format!("resolving {}: {e}", config.plot.display())))?;
    plot::write_svg(&plot_path, &plot_data)?;
    // The path printed is the one to paste: without `..` steps.
    let plot_path = std::fs::canonicalize(&plot_path).unwrap_or(plot_path);
    let total = tally.lock().window(0, usize::MAX);
    Ok(Report {
        plot: plot_path,
        interrupted,
        events,
        served: names
            .into_iter()
            .zip(total.sites.iter().map(|s| s.ok))
            .collect(),
        shed: total.shed,
        unavailable: total.unavailable,
        failed: total.failed + total.not_sent + total.sites.iter().map(|s| s.failed).sum::<u64>(),
        evidence,
    })
}

/// Drives the load and the script until the duration is over (false) or `stop` (true).
async fn drive(
    run: &mut Run<'_>,
    stop: &mut watch::Receiver<bool>,
    out: &mut (dyn Write + Send),
) -> bool {
    let steps = scenario::steps(run.config.scenario, run.config.duration.as_millis() as u64);
    let (stop_load, load_stopped) = watch::channel(false);
    let generator = tokio::spawn(traffic::generate(
        run.grid
            .chat_url()
            .parse()
            .expect("the gateway's own URL parses"),
        MODEL.to_owned(),
        Arc::clone(&run.rate),
        Arc::clone(&run.tally),
        run.clock,
        run.config.seed,
        load_stopped,
    ));
    let mut next = 0;
    let mut shown = 0;
    let mut reads = evidence_points(&steps).into_iter().peekable();
    let mut ticker = tokio::time::interval(TICK);
    let interrupted = loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|s| *s) => break true,
        }
        let now_ms = run.clock.elapsed().as_millis() as u64;
        if now_ms >= run.config.duration.as_millis() as u64 {
            break false;
        }
        while let Some(step) = steps.get(next).filter(|s| s.at_ms <= now_ms) {
            run.apply(now_ms, &step.action, out);
            next += 1;
        }
        run.transitions(now_ms, out);
        if let Some((_, step)) = reads.next_if(|(at, _)| *at <= now_ms) {
            run.read_evidence(now_ms, step, out).await;
        }
        let second = (now_ms / 1_000) as usize;
        if second > shown {
            shown = second;
            run.sample_routing().await;
            run.frame(second, out);
        }
    };
    let _ = stop_load.send(true);
    let _ = tokio::time::timeout(STOP_WITHIN, generator).await;
    interrupted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_plot_path_is_grid_demo_svg_in_the_current_directory() {
        let cwd = std::env::current_dir().unwrap();
        let path = plot_path(None).unwrap();
        assert!(path.is_absolute(), "{}", path.display());
        assert_eq!(path, cwd.join("grid-demo.svg"));
        // Not next to the binary in cargo's target directory, where nobody looks.
        let exe_dir = std::env::current_exe().unwrap();
        assert_ne!(path.parent(), exe_dir.parent());
    }

    #[test]
    fn a_given_plot_path_is_kept_and_made_absolute_against_the_current_directory() {
        let cwd = std::env::current_dir().unwrap();
        let relative = Path::new("plots/run.svg");
        assert_eq!(plot_path(Some(relative)).unwrap(), cwd.join(relative));
        let absolute = cwd.join("elsewhere.svg");
        assert_eq!(plot_path(Some(&absolute)).unwrap(), absolute);
    }
}
