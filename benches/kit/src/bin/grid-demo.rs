//! `grid-demo`: one command runs a whole local grid on loopback and shows it route.
//!
//! Three simulated sites of unequal capacity (the gateway's own, and two seen through
//! peer operators at the 5 s peer cadence), a real operator per site and one real gateway,
//! all in this process; OpenAI-style load through the gateway; a scripted scenario; a
//! live view every second; an SVG plot at the end. Ctrl-C stops it cleanly.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use grid_kit::demo::scenario::Scenario;
use grid_kit::demo::{self, DemoConfig};
use grid_kit::local_grid::Cadence;

const ABOUT: &str = "Run a whole local grid on loopback and watch it route";

/// `--help`'s text: what the demo does, then the legend it prints at start, so the
/// columns can be looked up without running it.
fn long_about() -> String {
    format!("{ABOUT}\n\n{}", demo::screen::legend())
}

/// Flags of the local-grid demo.
#[derive(Debug, Parser)]
#[command(about = ABOUT, long_about = long_about())]
struct Args {
    /// How long the load runs, in seconds (the scenario's steps scale with it).
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u64).range(10..=3600))]
    duration: u64,
    /// Base offered load as a fraction of the grid's nominal capacity.
    #[arg(long, default_value_t = 0.4)]
    load: f64,
    /// The scripted scenario.
    #[arg(long, value_enum, default_value_t = Scenario::Full)]
    scenario: Scenario,
    /// Where to write the SVG plot [default: grid-demo.svg in the current directory].
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Seed of arrivals and service times.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print plain lines even on a terminal.
    #[arg(long)]
    plain: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.load.is_finite() && args.load > 0.0 && args.load <= 5.0,
        "--load must be within (0, 5]"
    );
    let config = DemoConfig {
        duration: Duration::from_secs(args.duration),
        load: args.load,
        scenario: args.scenario,
        plot: demo::plot_path(args.plot.as_deref()).context("resolving the plot's path")?,
        cadence: Cadence::DEFAULT,
        seed: args.seed,
        live: !args.plain && std::io::stdout().is_terminal(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let report = runtime.block_on(async {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                let _ = stop.send(true);
            }
        });
        let mut out = std::io::stdout();
        demo::run(&config, stopped, &mut out).await
    })?;
    // Nothing of the grid may outlive the run: tasks still parked are dropped here.
    runtime.shutdown_timeout(Duration::from_secs(2));

    if report.interrupted {
        println!("\ngrid-demo: stopped by Ctrl-C; everything it started has stopped.");
    } else {
        println!("\ngrid-demo: done.");
    }
    let served: Vec<String> = report
        .served
        .iter()
        .map(|(site, n)| format!("{site} {n}"))
        .collect();
    println!(
        "answers: served {} | shed (429) {} | unavailable (503) {} | failed {}",
        served.join(", "),
        report.shed,
        report.unavailable,
        report.failed
    );
    println!("events:");
    for e in &report.events {
        println!("  {:>6.1} s  {}", e.at_ms as f64 / 1e3, e.text);
    }
    println!("plot written to {}", report.plot.display());
    Ok(())
}
