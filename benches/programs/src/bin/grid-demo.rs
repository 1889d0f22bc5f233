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
use grid_kit::local_grid::Cadence;
use grid_programs::demo::scenario::Scenario;
use grid_programs::demo::{self, DemoConfig};

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
    /// Run the grid as three Kubernetes clusters instead: each site in a network
    /// namespace of its own with its own etcd and kube-apiserver, configured by the
    /// example manifests, printing the kubectl commands that inspect it (needs root and
    /// the Kubernetes peers `.ci/install` builds).
    #[arg(long)]
    kubernetes: bool,
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
    if args.kubernetes {
        let outcome = runtime.block_on(kubernetes(Duration::from_secs(args.duration)));
        runtime.shutdown_timeout(Duration::from_secs(2));
        return outcome;
    }
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

/// `--kubernetes`: three clusters, the grid they form, traffic through every gateway for
/// `duration` (or until Ctrl-C), and the kubectl commands that inspect each cluster.
async fn kubernetes(duration: Duration) -> anyhow::Result<()> {
    use grid_kit::kube_grid::{KubeGrid, SiteSpec};
    let sizes = [(1, 2), (2, 2), (4, 2)];
    let specs = SiteSpec::sized(&sizes);
    println!(
        "grid-demo --kubernetes: starting three clusters (an etcd and a kube-apiserver each)..."
    );
    let grid = KubeGrid::start(&specs)
        .await
        .context("starting the clusters (as root, after bash .ci/install)")?;
    let formed = grid.wait_formed(Duration::from_secs(90)).await?;
    println!("the grid formed from the resources in {formed:?}\n");
    for s in &grid.sites {
        let netns = s.cluster.netns.as_deref().unwrap_or_default();
        let kubectl = format!(
            "ip netns exec {netns} env KUBECONFIG={} {} -n {}",
            s.cluster.admin_kubeconfig.display(),
            s.cluster.kubectl.display(),
            s.namespace
        );
        println!(
            "site {} ({} slots, at {}), inspect it with:",
            s.name,
            specs
                .iter()
                .zip(sizes)
                .find(|(p, _)| p.name == s.name)
                .map_or(0, |(_, (endpoints, slots))| endpoints * slots),
            s.addr
        );
        println!("  {kubectl} get gridnetworks,gridsites,inferenceproviders");
        println!("  {kubectl} get inferenceprovider llama -o jsonpath='{{.status.conditions}}'");
        println!("  {kubectl} get configmap grid-site-{} -o yaml", s.name);
        println!("  {kubectl} get lease grid-operator-{} -o yaml", s.name);
    }
    println!("\ntraffic through every gateway, 60 requests each per round (Ctrl-C stops):");
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = stop.send(true);
        }
    });
    let began = grid_kit::clock::Stopwatch::start();
    while began.elapsed() < duration && !*stopped.borrow() {
        let rounds = futures::future::join_all(
            (0..grid.sites.len()).map(|i| grid.traffic(i, 60, 12, Duration::from_secs(30))),
        );
        let traffic = tokio::select! {
            t = rounds => t,
            _ = stopped.changed() => break,
        };
        let line: Vec<String> = grid
            .sites
            .iter()
            .zip(&traffic)
            .map(|(s, t)| format!("gateway {}: {:?} lost {}", s.name, t.answered, t.lost()))
            .collect();
        println!(
            "  {:>5.1} s  {}",
            began.elapsed().as_secs_f64(),
            line.join(" | ")
        );
    }
    grid.stop().await;
    println!("grid-demo --kubernetes: stopped; every cluster and namespace is gone.");
    Ok(())
}
