//! `grid-sim`: the routing-quality simulator (`docs/routing-quality.md`). Reads a
//! scenario file (default `benches/scenarios/standard.toml`), runs every policy over the
//! same seeded arrivals at each of its loads and seeds, prints the tables, writes CSV and
//! SVG under `target/grid-sim/`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use grid_sim::routing_sim::policy::Policy;
use grid_sim::routing_sim::report::{self, LoadResults};
use grid_sim::routing_sim::run;
use grid_sim::routing_sim::scenario::Scenario;

/// Flags of the routing simulator.
#[derive(Debug, Parser)]
#[command(about = "Compare routing policies on simulated sites, signals through the real code")]
struct Args {
    /// The scenario file (TOML; see `benches/scenarios/`).
    #[arg(long)]
    scenario: Option<PathBuf>,
    /// Offered loads, as shares of total capacity (default: the scenario's).
    #[arg(long, value_delimiter = ',')]
    loads: Option<Vec<f64>>,
    /// Virtual seconds of arrivals per run (default: the scenario's).
    #[arg(long)]
    duration_s: Option<u64>,
    /// One seed instead of the scenario's list.
    #[arg(long)]
    seed: Option<u64>,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Run the scenario with every site's flow control off (no `[flow_control]`).
    #[arg(long)]
    no_flow_control: bool,
    /// Run the scenario with its operators gossiping their signals instead of polling
    /// each other (`signal_transport = "gossip"`).
    #[arg(long)]
    gossip: bool,
    /// Only these policies, by their table names (default: every one).
    #[arg(long, value_delimiter = ',')]
    policies: Option<Vec<String>>,
    /// Output directory (default: `target/grid-sim` in the workspace).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[allow(clippy::disallowed_methods)] // the binary times itself for the operator's benefit
fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let path = args
        .scenario
        .unwrap_or_else(|| manifest.join("../scenarios/standard.toml"));
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut scenario =
        Scenario::parse(&text).with_context(|| format!("scenario {}", path.display()))?;
    if let Some(d) = args.duration_s {
        anyhow::ensure!(d > 0, "--duration-s must be above 0");
        scenario = scenario.with_duration_s(d);
    }
    if args.no_flow_control {
        scenario = scenario.without_flow_control();
    }
    if args.gossip {
        scenario = scenario.with_gossip();
    }
    let loads = args.loads.unwrap_or_else(|| scenario.loads.clone());
    let seeds = args
        .seed
        .map_or_else(|| scenario.seeds.clone(), |s| vec![s]);
    let out = args.out.unwrap_or_else(|| {
        // The workspace's target folder, two levels above benches/sim.
        manifest.join("../../target/grid-sim")
    });
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let policies: Vec<Policy> = match &args.policies {
        None => Policy::ALL.to_vec(),
        Some(names) => names
            .iter()
            .map(|n| {
                Policy::ALL
                    .into_iter()
                    .find(|p| p.as_str() == n)
                    .with_context(|| format!("unknown policy {n}"))
            })
            .collect::<anyhow::Result<_>>()?,
    };
    let started = std::time::Instant::now();
    let mut runs: Vec<Vec<LoadResults>> = Vec::new();
    for &seed in &seeds {
        let mut all = Vec::new();
        for &load in &loads {
            let config = scenario.config(load, seed);
            let results = run(&config, &policies, args.threads);
            for r in &results {
                anyhow::ensure!(
                    r.completed + r.failed == r.arrived,
                    "{} at {load}, seed {seed}: {} completed and {} failed of {} requests",
                    r.policy.as_str(),
                    r.completed,
                    r.failed,
                    r.arrived
                );
            }
            all.push(LoadResults { config, results });
        }
        runs.push(all);
    }
    let elapsed: Duration = started.elapsed();
    print_header(&scenario, &path, &runs, &seeds, elapsed)?;
    for all in &runs {
        if let Some(level) = all.first() {
            println!("seed {}:", level.config.seed);
        }
        print!("{}", report::table(all));
        print!("{}", report::failure_lines(all));
        print!("{}", report::target_lines(all));
    }
    println!();
    print!("{}", report::p99_by_seed(&runs));
    println!();
    print!("{}", report::ttft_by_seed(&runs));
    println!();
    print!("{}", report::failures_by_seed(&runs));

    write_outputs(&out, &runs)
}

/// The scenario, its sites and gateways, and the episodes, above the tables.
fn print_header(
    scenario: &Scenario,
    path: &std::path::Path,
    runs: &[Vec<LoadResults>],
    seeds: &[u64],
    elapsed: Duration,
) -> anyhow::Result<()> {
    let first = &runs
        .first()
        .and_then(|r| r.first())
        .context("no load or seed given")?
        .config;
    println!("grid-sim: {} ({})", scenario.description, path.display());
    println!(
        "sites {} (slots {}), gateways {}, {:.1} req/s capacity, {} s per run, seeds {:?}, {:.1} s wall",
        first
            .sites
            .iter()
            .map(|s| format!("{}[{} ms]", s.name, s.rtt_ms))
            .collect::<Vec<_>>()
            .join(" "),
        first.slots(),
        first
            .gateways
            .iter()
            .map(|g| format!("{}:{:.2}", first.sites[g.site].name, g.share))
            .collect::<Vec<_>>()
            .join(" "),
        first.capacity_per_s(),
        first.duration_ms / 1_000,
        seeds,
        elapsed.as_secs_f64()
    );
    for d in &first.degrade {
        println!(
            "degrade: {} x{} from {} s to {} s",
            first.sites[d.site].name,
            d.factor,
            d.from_ms / 1_000,
            d.until_ms / 1_000
        );
    }
    for b in &first.blips {
        println!(
            "blip: {} at zero endpoints from {} s to {} s",
            first.sites[b.site].name,
            b.from_ms / 1_000,
            b.until_ms / 1_000
        );
    }
    for f in &first.fail_fast {
        println!(
            "fail fast: {} answers {}{} from {} s to {} s",
            first.sites[f.site].name,
            f.status,
            f.retry_after_ms
                .map_or_else(String::new, |ms| format!(" (Retry-After {} s)", ms / 1_000)),
            f.from_ms / 1_000,
            f.until_ms / 1_000
        );
    }
    for e in &first.epp_silent {
        println!(
            "EPP silent: {} from {} s to {} s",
            first.sites[e.site].name,
            e.from_ms / 1_000,
            e.until_ms / 1_000
        );
    }
    for e in &first.operator_frozen {
        println!(
            "operator frozen: {} from {} s to {} s",
            first.sites[e.site].name,
            e.from_ms / 1_000,
            e.until_ms / 1_000
        );
    }
    println!("bursts: {:?}", first.bursts);
    Ok(())
}

/// `summary.csv` (every seed), `shares.csv` and `routing.svg` (the first seed).
fn write_outputs(out: &std::path::Path, runs: &[Vec<LoadResults>]) -> anyhow::Result<()> {
    let focus_run = runs.first().context("no seed given")?;
    let focus = focus_run
        .iter()
        .min_by(|a, b| {
            (a.config.load - report::RATIO_LOAD)
                .abs()
                .total_cmp(&(b.config.load - report::RATIO_LOAD).abs())
        })
        .context("no load given")?;
    let summary = out.join("summary.csv");
    let mut csv = String::new();
    for (i, all) in runs.iter().enumerate() {
        let text = report::summary_csv(all);
        // One header for all seeds.
        let body = if i == 0 {
            text.as_str()
        } else {
            text.split_once('\n').map_or("", |(_, rest)| rest)
        };
        csv.push_str(body);
    }
    std::fs::write(&summary, csv)?;
    let shares = out.join("shares.csv");
    std::fs::write(&shares, report::shares_csv(focus))?;
    let svg = out.join("routing.svg");
    report::plot(focus_run, focus, &svg).map_err(anyhow::Error::msg)?;
    println!(
        "wrote {}, {}, {}",
        summary.display(),
        shares.display(),
        svg.display()
    );
    Ok(())
}
