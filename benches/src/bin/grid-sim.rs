//! `grid-sim`: the routing-quality simulator (issue 6). Runs every policy over the same
//! seeded arrivals at several loads, prints the table, writes CSV and SVG under
//! `target/grid-sim/`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use grid_benches::routing_sim::policy::Policy;
use grid_benches::routing_sim::report::{self, LoadResults};
use grid_benches::routing_sim::{DEFAULT_DURATION_S, SimConfig, run};

/// Flags of the routing simulator.
#[derive(Debug, Parser)]
#[command(about = "Compare routing policies on simulated sites, signals through the real code")]
struct Args {
    /// Offered loads, as shares of total capacity.
    #[arg(long, value_delimiter = ',', default_value = "0.6,0.75,0.85,0.95")]
    loads: Vec<f64>,
    /// Virtual seconds of arrivals per run.
    #[arg(long, default_value_t = DEFAULT_DURATION_S)]
    duration_s: u64,
    /// Seed of the arrivals and every policy's draws.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Output directory (default: `target/grid-sim` in the workspace).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[allow(clippy::disallowed_methods)] // the binary times itself for the operator's benefit
fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let out = args.out.unwrap_or_else(|| {
        let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        manifest
            .parent()
            .map_or_else(|| manifest.join("target"), |root| root.join("target"))
            .join("grid-sim")
    });
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let started = std::time::Instant::now();
    let mut all = Vec::new();
    for &load in &args.loads {
        let config = SimConfig::standard(load, args.duration_s * 1_000, args.seed);
        let results = run(&config, &Policy::ALL, args.threads);
        for r in &results {
            anyhow::ensure!(
                r.completed == r.arrived,
                "{} at {load}: {} of {} requests completed",
                r.policy.as_str(),
                r.completed,
                r.arrived
            );
        }
        all.push(LoadResults { config, results });
    }
    let elapsed: Duration = started.elapsed();
    let first = &all.first().context("no load given")?.config;
    println!(
        "grid-sim: sites {} (slots {}), {:.1} req/s capacity, {} s per run, seed {}, {:.1} s wall",
        first
            .sites
            .iter()
            .map(|s| format!("{}{}", s.name, if s.local { "(local)" } else { "" }))
            .collect::<Vec<_>>()
            .join(" "),
        first.slots(),
        first.capacity_per_s(),
        args.duration_s,
        args.seed,
        elapsed.as_secs_f64()
    );
    if let Some(d) = first.degrade {
        println!(
            "degrade: {} x{} from {} s to {} s; bursts: {:?}",
            first.sites[d.site].name,
            d.factor,
            d.from_ms / 1_000,
            d.until_ms / 1_000,
            first.bursts
        );
    }
    print!("{}", report::table(&all));
    print!("{}", report::target_lines(&all));

    let focus = all
        .iter()
        .min_by(|a, b| {
            (a.config.load - 0.85)
                .abs()
                .total_cmp(&(b.config.load - 0.85).abs())
        })
        .context("no load given")?;
    let summary = out.join("summary.csv");
    std::fs::write(&summary, report::summary_csv(&all))?;
    let shares = out.join("shares.csv");
    std::fs::write(&shares, report::shares_csv(focus))?;
    let svg = out.join("routing.svg");
    report::plot(&all, focus, &svg).map_err(anyhow::Error::msg)?;
    println!(
        "wrote {}, {}, {}",
        summary.display(),
        shares.display(),
        svg.display()
    );
    Ok(())
}
