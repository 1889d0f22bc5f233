//! `grid-soak`: the local grid, every daemon a process of its own, under the demo's
//! traffic with bursts and faults for `--minutes` (30 by default), beside an operator
//! scraping a 1 MiB exposition every second. Prints whether any daemon's memory,
//! descriptors, `/metrics` series or threads grew after the warm-up, writes the samples
//! and the plots, and exits 1 when one did.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use grid_programs::soak::{self, SoakConfig, grid::Binaries};

/// Flags of the soak.
#[derive(Debug, Parser)]
#[command(about = "Run the local grid for minutes and fail when a daemon grows")]
struct Args {
    /// How long the load runs, in minutes.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(2..=24 * 60))]
    minutes: u64,
    /// Where the samples (CSV) and the plots (SVG) go.
    #[arg(long, default_value = "grid-soak")]
    out: PathBuf,
    /// Base offered load as a share of the grid's nominal capacity.
    #[arg(long, default_value_t = soak::LOAD)]
    load: f64,
    /// Seed of arrivals and service times.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Leave out operator x and its 1 MiB exposition.
    #[arg(long)]
    no_big: bool,
}

fn main() -> anyhow::Result<ExitCode> {
    let args = Args::parse();
    anyhow::ensure!(
        args.load.is_finite() && args.load > 0.0 && args.load <= 2.0,
        "--load must be within (0, 2]"
    );
    let binaries = Binaries::beside_this_program()?;
    let mut config = SoakConfig::new(
        Duration::from_secs(args.minutes * 60),
        std::path::absolute(&args.out).context("resolving --out")?,
        binaries,
    );
    config.load = args.load;
    config.seed = args.seed;
    config.big = !args.no_big;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let report = runtime.block_on(async {
        let mut out = std::io::stdout();
        soak::run(&config, &mut out).await
    })?;
    runtime.shutdown_timeout(Duration::from_secs(2));
    println!("\n{}", report.summary());
    if !report.passed() {
        eprint!("{}", report.failures());
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
