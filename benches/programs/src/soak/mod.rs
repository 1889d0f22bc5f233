//! The soak: the local grid (three sites, an operator process each, the gateway process)
//! under the demo's traffic mix, streamed and not, with bursts and faults repeating in
//! cycles, for minutes to hours; and beside it operator x, scraping a 1 MiB, 400-endpoint
//! exposition every second. Every few seconds it reads each daemon's resident memory,
//! open descriptors, threads and `/metrics` series; at the end it judges whether any of
//! them grew after the warm-up ([`verdict`]), prints the table and draws one plot of
//! each over the run.
//!
//! ```text
//! script (per cycle) --control--> sims, relays, big EPP
//! traffic (Poisson, 3 in 4 streamed) --POST--> gateway process --proxy--> sites
//! every SAMPLE_EVERY: /proc/<pid>/{status,fd} + GET /metrics of each daemon --> tracks
//! end: tracks --verdict--> table, CSV, SVGs
//! ```
//!
//! `grid-soak --minutes N` runs it; `benches/programs/tests/soak.rs` runs two minutes of
//! it in the test suite.

pub mod grid;
pub mod plot;
pub mod procs;
pub mod script;
pub mod verdict;

use std::fmt::Write as _;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;

use grid_kit::Error;
use grid_kit::clock::Stopwatch;
use grid_kit::local_grid::Cadence;
use grid_kit::sim_site::EppFault;
use grid_kit::traffic::{self, Rate, Tally};

use crate::demo::scenario::Action;
use grid::{Binaries, ProcessGrid};
use procs::ProcReading;
use script::{FAULTED, Fault, Move};
use verdict::{Track, Verdict, Windows};

/// How long one cycle of the script lasts.
pub const CYCLE: Duration = Duration::from_secs(30);
/// How often every daemon is read.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// The least warm-up: the gateway keeps a pooled connection for this long once idle, so
/// the connections the first bursts opened, and the buffers they hold, add up until it
/// has passed once.
pub const SETTLE: Duration = grid_gateway::upstream::POOL_IDLE_TIMEOUT;
/// The offered load outside bursts, as a share of the grid's nominal capacity (the
/// demo's).
pub const LOAD: f64 = 0.4;
/// How often due steps are applied.
pub const TICK: Duration = Duration::from_millis(50);
/// How long the gateway gets to route by load after start.
pub const ROUTED_WITHIN: Duration = Duration::from_secs(60);
/// How long stopping the load and the daemons may take.
pub const STOP_WITHIN: Duration = Duration::from_secs(20);
/// How long the faulted EPP takes to answer while slow: past the operator's scrape
/// timeout.
pub const SLOW_EPP: Duration = Duration::from_secs(2);
/// The least share of the requests sent that must be answered 200: a grid that stops
/// serving must not pass as flat.
pub const MIN_SERVED_SHARE: f64 = 0.5;
/// Loud log lines kept per daemon for the report.
pub const LOUD_KEPT: usize = 3;

/// How a soak runs.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    /// How long the load runs.
    pub duration: Duration,
    /// How long one cycle of the script lasts.
    pub cycle: Duration,
    /// How often every daemon is read.
    pub sample_every: Duration,
    /// The offered load outside bursts, as a share of nominal capacity.
    pub load: f64,
    /// The daemons' cadences.
    pub cadence: Cadence,
    /// Fixes arrivals and service times.
    pub seed: u64,
    /// Whether operator x scrapes the 1 MiB exposition beside the grid.
    pub big: bool,
    /// Where the plots and the samples are written.
    pub out_dir: PathBuf,
    /// The daemons' binaries.
    pub binaries: Binaries,
}

impl SoakConfig {
    /// A run of `duration` with the module's defaults (short cadences: more polls and
    /// scrapes per minute, so a leak per poll shows sooner), writing into `out_dir`.
    pub fn new(duration: Duration, out_dir: PathBuf, binaries: Binaries) -> Self {
        Self {
            duration,
            cycle: CYCLE,
            sample_every: SAMPLE_EVERY,
            load: LOAD,
            cadence: Cadence::FAST,
            seed: 1,
            big: true,
            out_dir,
            binaries,
        }
    }
}

/// What a daemon logged at WARN or ERROR.
#[derive(Clone, Debug, Default)]
pub struct Loud {
    /// The daemon.
    pub process: String,
    /// How many lines.
    pub lines: u64,
    /// The first few.
    pub first: Vec<String>,
}

/// The least, the median and the most of a series of figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// The least.
    pub min: f64,
    /// The median (the upper of the two middle figures of an even count).
    pub median: f64,
    /// The most.
    pub max: f64,
}

impl Spread {
    /// The spread of `figures`; `None` when there are none.
    pub fn of(mut figures: Vec<f64>) -> Option<Self> {
        figures.retain(|f| f.is_finite());
        figures.sort_by(f64::total_cmp);
        Some(Self {
            min: *figures.first()?,
            median: figures[figures.len() / 2],
            max: *figures.last()?,
        })
    }
}

/// What a run found.
#[derive(Clone, Debug)]
pub struct Report {
    /// The windows judged.
    pub windows: Windows,
    /// Every check.
    pub verdict: Verdict,
    /// Every daemon's readings.
    pub tracks: Vec<Track>,
    /// Answers 200, per site.
    pub served: Vec<(String, u64)>,
    /// 429 from the gateway.
    pub shed: u64,
    /// 503 from the gateway.
    pub unavailable: u64,
    /// Everything else that failed (a site's error, a transport error, a timeout).
    pub failed: u64,
    /// Scripted steps applied.
    pub steps: u64,
    /// The machine's one-minute load average over the samples.
    pub machine_load: Option<Spread>,
    /// Scrapes of the big exposition.
    pub big_scrapes: Option<usize>,
    /// Warnings and errors per daemon.
    pub loud: Vec<Loud>,
    /// The files written: the samples (CSV), then the plots.
    pub files: Vec<PathBuf>,
}

impl Report {
    /// Answers 200 over every request that ended.
    pub fn served_share(&self) -> f64 {
        let ok: u64 = self.served.iter().map(|(_, n)| n).sum();
        let all = ok + self.shed + self.unavailable + self.failed;
        if all == 0 {
            0.0
        } else {
            ok as f64 / all as f64
        }
    }

    /// Whether nothing grew and the grid kept serving.
    pub fn passed(&self) -> bool {
        self.verdict.passed() && self.served_share() >= MIN_SERVED_SHARE
    }

    /// One line per failed check, then whether too few requests were served: what a
    /// failing run says first.
    pub fn failures(&self) -> String {
        let mut out = String::new();
        for c in self.verdict.failures() {
            let _ = writeln!(
                out,
                "{} {} grew after the warm-up: {:.1} in the baseline window, {:.1} in the late \
                 window, at most {:.1} allowed ({})",
                c.process, c.what, c.baseline, c.late, c.limit, c.unit
            );
        }
        if self.served_share() < MIN_SERVED_SHARE {
            let _ = writeln!(
                out,
                "the grid served {:.1}% of the requests answered, under the {:.0}% required",
                self.served_share() * 100.0,
                MIN_SERVED_SHARE * 100.0
            );
        }
        out
    }

    /// The verdict table and what the load did.
    pub fn summary(&self) -> String {
        let mut out = self.verdict.table();
        let w = self.windows;
        let _ = writeln!(
            out,
            "\nwarm-up 0-{:.0} s; baseline window {:.0}-{:.0} s; late window {:.0}-{:.0} s",
            w.warmup_end_s, w.baseline.0, w.baseline.1, w.late.0, w.late.1
        );
        let served: Vec<String> = self
            .served
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect();
        let _ = writeln!(
            out,
            "answers: served {} ({:.1}% of all, at least {:.0}% required) | shed (429) {} | \
             unavailable (503) {} | failed {} | script steps {}",
            served.join(", "),
            self.served_share() * 100.0,
            MIN_SERVED_SHARE * 100.0,
            self.shed,
            self.unavailable,
            self.failed,
            self.steps
        );
        if let Some(l) = self.machine_load {
            let _ = writeln!(
                out,
                "machine load (1-minute average, {} cores): min {:.2}, median {:.2}, max {:.2}",
                std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
                l.min,
                l.median,
                l.max
            );
        }
        if let Some(n) = self.big_scrapes {
            let _ = writeln!(
                out,
                "big exposition (1 MiB, 400 endpoints) scraped {n} times"
            );
        }
        for t in &self.tracks {
            let new = t.new_series();
            if !new.is_empty() {
                let _ = writeln!(
                    out,
                    "{} shows {} series it did not after the warm-up: {}",
                    t.name,
                    new.len(),
                    new.join(", ")
                );
            }
        }
        for l in self.loud.iter().filter(|l| l.lines > 0) {
            let _ = writeln!(
                out,
                "{} logged {} WARN/ERROR lines, first: {}",
                l.process,
                l.lines,
                l.first.join(" / ")
            );
        }
        for f in &self.files {
            let _ = writeln!(out, "wrote {}", f.display());
        }
        let _ = writeln!(
            out,
            "verdict: {}",
            if self.passed() { "FLAT" } else { "GROWTH" }
        );
        out
    }
}

fn say(out: &mut (dyn Write + Send), text: &str) {
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

/// Reads every daemon every `every` until `stop`; returns their tracks.
async fn sample(
    who: Vec<(String, u32, SocketAddr)>,
    clock: Stopwatch,
    every: Duration,
    warmup_end_s: f64,
    latest: Arc<Mutex<Vec<Option<ProcReading>>>>,
    mut stop: watch::Receiver<bool>,
) -> (Vec<Track>, Vec<f64>) {
    let mut tracks: Vec<Track> = who
        .iter()
        .map(|(name, _, _)| Track {
            name: name.clone(),
            ..Track::default()
        })
        .collect();
    let mut loads = Vec::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let t = clock.elapsed().as_secs_f64();
        if let Some(load) = procs::load_average() {
            loads.push(load);
        }
        for (i, (_, pid, metrics)) in who.iter().enumerate() {
            // A process gone from /proc is missed; a /metrics page that could not be read
            // in time (a loaded machine) only leaves this sample without a series count.
            let reading = match procs::read_proc(*pid) {
                Ok(r) => {
                    let page = procs::read_page(*metrics).await.ok();
                    if let Some(page) = &page {
                        let keys = procs::series_keys(page);
                        if t >= warmup_end_s && tracks[i].series_after_warmup.is_empty() {
                            tracks[i].series_after_warmup.clone_from(&keys);
                        }
                        tracks[i].series_at_end = keys;
                    }
                    Some(ProcReading {
                        series: page.as_deref().map(procs::series_count),
                        ..r
                    })
                }
                Err(_) => None,
            };
            match reading {
                Some(r) => tracks[i].samples.push((t, r)),
                None => tracks[i].missed.push(t),
            }
            latest.lock()[i] = reading;
        }
    }
    (tracks, loads)
}

/// Applies one step.
fn apply(grid: &ProcessGrid, rate: &Rate, base_rps: f64, what: &Move) {
    let faulted = grid.control(FAULTED);
    match what {
        Move::Demo(Action::Degrade { site, factor }) => {
            if let Some(c) = grid.control(site) {
                let _ = c.degrade(*factor);
            }
        }
        Move::Demo(Action::DropAll { site }) => {
            if let Some(c) = grid.control(site) {
                c.drop_all_endpoints();
            }
        }
        Move::Demo(Action::Restore { site }) => {
            if let Some(c) = grid.control(site) {
                c.restore();
            }
        }
        Move::Demo(Action::Load { factor }) => rate.set(base_rps * factor),
        Move::Fault(fault, on) => {
            let epp = |f: EppFault| {
                if let Some(c) = &faulted {
                    c.set_epp_fault(on.then_some(f));
                }
            };
            match fault {
                Fault::EppGarbage => epp(EppFault::Garbage),
                Fault::EppOversize => epp(EppFault::Oversize),
                Fault::EppSlow => epp(EppFault::Slow(SLOW_EPP)),
                Fault::ResettingUpstream => {
                    if let Some((_, backend)) = grid.link(FAULTED) {
                        backend.set_resetting(*on);
                    }
                }
                Fault::Partition => {
                    if let Some((peer, backend)) = grid.link(FAULTED) {
                        peer.set_black_hole(*on);
                        backend.set_black_hole(*on);
                    }
                }
            }
        }
    }
}

/// Heals every fault and restores every site.
fn heal_all(grid: &ProcessGrid) {
    for site in grid.site_names() {
        if let Some(c) = grid.control(&site) {
            c.restore();
            c.set_epp_fault(None);
        }
        if let Some((peer, backend)) = grid.link(&site) {
            peer.heal();
            backend.heal();
        }
    }
}

/// Waits until the gateway's `/readyz` says its model is routed by load.
async fn wait_routed(grid: &ProcessGrid, within: Duration) -> Result<(), Error> {
    let client = grid_kit::load::LoadClient::new(grid_kit::load::Protocol::Http1, within);
    let uri: http::Uri = format!("http://{}/readyz", grid.gateway_addr())
        .parse()
        .map_err(|e| Error::Request(format!("{e}")))?;
    let watch = Stopwatch::start();
    while watch.elapsed() < within {
        if let Ok((_, body)) = client.get(&uri).await
            && String::from_utf8_lossy(&body).contains("routed by load")
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(Error::Timeout {
        what: "the gateway routing by load".into(),
        limit_ms: within.as_millis() as u64,
    })
}

/// One progress line: each daemon's latest reading and the answers so far.
fn progress(t_s: u64, names: &[String], latest: &[Option<ProcReading>], tally: &Tally) -> String {
    let mut line = format!("t={t_s:>5} s");
    for (name, r) in names.iter().zip(latest) {
        match r {
            Some(r) => {
                let series = r.series.map_or_else(|| "?".to_owned(), |n| n.to_string());
                let _ = write!(
                    line,
                    " | {name}: {:.1} MiB, {} fd, {} thr, {series} series",
                    r.rss_kib as f64 / 1024.0,
                    r.fds,
                    r.threads,
                );
            }
            None => {
                let _ = write!(line, " | {name}: unread");
            }
        }
    }
    let total = tally.window(0, usize::MAX);
    let ok: u64 = total.sites.iter().map(|s| s.ok).sum();
    let _ = write!(
        line,
        " | ok {ok}, shed {}, failed {}",
        total.shed,
        total.failed + total.unavailable + total.sites.iter().map(|s| s.failed).sum::<u64>()
    );
    line
}

/// Writes every sample as CSV: seconds, process, then the reading's fields (`series`
/// empty where the page was not read).
///
/// # Errors
///
/// When the file cannot be written.
pub fn write_csv(path: &Path, tracks: &[Track]) -> Result<(), Error> {
    let mut text = String::from("t_s,process,rss_kib,rss_anon_kib,fds,threads,series\n");
    for t in tracks {
        for (s, r) in &t.samples {
            let series = r.series.map(|n| n.to_string()).unwrap_or_default();
            let _ = writeln!(
                text,
                "{s:.1},{},{},{},{},{},{series}",
                t.name, r.rss_kib, r.rss_anon_kib, r.fds, r.threads
            );
        }
    }
    std::fs::write(path, text).map_err(|source| Error::Write {
        path: path.to_owned(),
        source,
    })
}

/// Starts the grid, says where each daemon is, and waits until the gateway routes by
/// load.
async fn start_grid(
    config: &SoakConfig,
    out: &mut (dyn Write + Send),
) -> Result<ProcessGrid, Error> {
    say(
        out,
        &format!(
            "grid-soak: starting 3 simulated sites, 3 operator processes and the gateway process{} ...",
            if config.big {
                ", and operator x on a 1 MiB exposition"
            } else {
                ""
            }
        ),
    );
    let spec = crate::demo::grid_spec(config.cadence, config.seed);
    let grid = ProcessGrid::start(&spec, &config.binaries, config.big).await?;
    for w in &grid.watched {
        say(
            out,
            &format!(
                "  {} pid {} /metrics at {}",
                w.name,
                w.daemon.pid(),
                w.metrics
            ),
        );
    }
    wait_routed(&grid, ROUTED_WITHIN).await?;
    say(
        out,
        &format!(
            "gateway on http://{} routes by load; {:?} of traffic in {:?} cycles, sampling every {:?}",
            grid.gateway_addr(),
            config.duration,
            config.cycle,
            config.sample_every
        ),
    );

    Ok(grid)
}

/// Applies the script's steps as they fall due and reads the daemons' logs until the
/// run's end; says a progress line every cycle. Returns the steps applied and what each
/// daemon logged loud.
#[allow(clippy::too_many_arguments)] // the run's shared state, each piece its own handle
async fn drive(
    grid: &mut ProcessGrid,
    config: &SoakConfig,
    clock: Stopwatch,
    rate: &Rate,
    base_rps: f64,
    tally: &Mutex<Tally>,
    latest: &Mutex<Vec<Option<ProcReading>>>,
    out: &mut (dyn Write + Send),
) -> (u64, Vec<Loud>) {
    let names: Vec<String> = grid.watched.iter().map(|w| w.name.clone()).collect();
    let steps = script::cycle(config.cycle.as_millis() as u64);
    let cycle_ms = config.cycle.as_millis() as u64;
    let end_ms = config.duration.as_millis() as u64;
    let mut loud: Vec<Loud> = names
        .iter()
        .map(|n| Loud {
            process: n.clone(),
            ..Loud::default()
        })
        .collect();
    let mut next: u64 = 0;
    let mut cycles_shown = 0;
    let mut ticker = tokio::time::interval(TICK);
    loop {
        ticker.tick().await;
        let now_ms = clock.elapsed().as_millis() as u64;
        if now_ms >= end_ms {
            break;
        }
        loop {
            let n = steps.len() as u64;
            let step = &steps[(next % n) as usize];
            if (next / n) * cycle_ms + step.at_ms > now_ms {
                break;
            }
            apply(grid, rate, base_rps, &step.what);
            next += 1;
        }
        for (w, l) in grid.watched.iter_mut().zip(&mut loud) {
            for line in w.daemon.take_lines() {
                if line.contains(" WARN ") || line.contains(" ERROR ") {
                    l.lines += 1;
                    if l.first.len() < LOUD_KEPT {
                        l.first.push(line);
                    }
                }
            }
        }
        if now_ms / cycle_ms > cycles_shown {
            cycles_shown = now_ms / cycle_ms;
            let line = progress(now_ms / 1_000, &names, &latest.lock(), &tally.lock());
            say(out, &line);
        }
    }
    (next, loud)
}

/// Writes the samples (CSV) and the plots (SVG) into the run's directory; returns them.
fn write_files(
    config: &SoakConfig,
    tracks: &[Track],
    windows: Windows,
) -> Result<Vec<PathBuf>, Error> {
    let csv = config.out_dir.join("soak-samples.csv");
    write_csv(&csv, tracks)?;
    let mut files = vec![csv];
    for (name, figure) in [
        ("soak-memory.svg", &plot::MEMORY),
        ("soak-descriptors.svg", &plot::DESCRIPTORS),
        ("soak-series.svg", &plot::SERIES),
        ("soak-threads.svg", &plot::THREADS),
    ] {
        let path = config.out_dir.join(name);
        plot::write(&path, figure, tracks, windows)?;
        files.push(path);
    }
    Ok(files)
}

/// Runs the soak, printing a progress line every cycle to `out`.
///
/// # Errors
///
/// When the grid cannot be started, the gateway never routes by load, the run is too
/// short for a warm-up and two windows, or the files cannot be written.
pub async fn run(config: &SoakConfig, out: &mut (dyn Write + Send)) -> Result<Report, Error> {
    let windows = Windows::of(
        config.duration.as_secs_f64(),
        config.cycle.as_secs_f64(),
        SETTLE.as_secs_f64(),
    )
    .ok_or_else(|| {
        Error::Request(format!(
            "{:?} is too short for a warm-up and two windows of {:?} cycles",
            config.duration, config.cycle
        ))
    })?;
    std::fs::create_dir_all(&config.out_dir).map_err(|source| Error::Write {
        path: config.out_dir.clone(),
        source,
    })?;
    let mut grid = start_grid(config, out).await?;
    let names: Vec<String> = grid.watched.iter().map(|w| w.name.clone()).collect();

    let clock = Stopwatch::start();
    let base_rps = crate::demo::capacity_rps() * config.load;
    let rate = Arc::new(Rate::new(base_rps));
    let site_names = grid.site_names();
    let tally = Arc::new(Mutex::new(Tally::new(site_names.clone())));
    let (stop_tx, stop_rx) = watch::channel(false);
    let generator = tokio::spawn(traffic::generate(
        grid.chat_url()
            .parse()
            .map_err(|e| Error::Request(format!("{e}")))?,
        grid.model().to_owned(),
        Arc::clone(&rate),
        Arc::clone(&tally),
        clock,
        config.seed,
        stop_rx.clone(),
    ));
    let latest = Arc::new(Mutex::new(vec![None; names.len()]));
    let sampler = tokio::spawn(sample(
        grid.watched
            .iter()
            .map(|w| (w.name.clone(), w.daemon.pid(), w.metrics))
            .collect(),
        clock,
        config.sample_every,
        windows.warmup_end_s,
        Arc::clone(&latest),
        stop_rx,
    ));

    let (steps, loud) = drive(
        &mut grid, config, clock, &rate, base_rps, &tally, &latest, out,
    )
    .await;
    let _ = stop_tx.send(true);
    let (tracks, loads) = tokio::time::timeout(STOP_WITHIN, sampler)
        .await
        .map_err(|_| Error::Timeout {
            what: "the sampler stopping".into(),
            limit_ms: STOP_WITHIN.as_millis() as u64,
        })?
        .map_err(|e| Error::Request(format!("the sampler: {e}")))?;
    let _ = tokio::time::timeout(STOP_WITHIN, generator).await;
    heal_all(&grid);
    let big_scrapes = grid.big_scrapes();
    grid.stop(STOP_WITHIN).await;

    let verdict = Verdict::judge(&tracks, windows);
    let files = write_files(config, &tracks, windows)?;
    let total = tally.lock().window(0, usize::MAX);
    Ok(Report {
        windows,
        verdict,
        tracks,
        served: site_names
            .into_iter()
            .zip(total.sites.iter().map(|s| s.ok))
            .collect(),
        shed: total.shed,
        unavailable: total.unavailable,
        failed: total.failed + total.not_sent + total.sites.iter().map(|s| s.failed).sum::<u64>(),
        steps,
        machine_load: Spread::of(loads),
        big_scrapes,
        loud,
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spread_holds_the_least_the_middle_and_the_most_finite_figure() {
        let s = Spread::of(vec![3.0, f64::NAN, 1.0, 2.0]).unwrap();
        assert_eq!((s.min, s.median, s.max), (1.0, 2.0, 3.0));
        assert_eq!(Spread::of(vec![f64::NAN]), None);
        assert_eq!(Spread::of(Vec::new()), None);
    }
}
