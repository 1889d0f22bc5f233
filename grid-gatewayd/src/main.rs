//! `grid-gatewayd`: the thin binary around [`grid_gatewayd`].

use anyhow::Context as _;
use clap::Parser;
use grid_gatewayd::Config;

/// Command line of the gateway.
#[derive(Debug, Parser)]
#[command(version, about = "grid gateway")]
struct Args {
    /// Gateway configuration file (TOML); see docs/gateway.md (docs/examples/gateway.toml
    /// is an example to copy and edit).
    #[arg(long)]
    config: std::path::PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    grid_daemon::logging::init();
    let args = Args::parse();
    let config =
        Config::load(&args.config).with_context(|| format!("loading {}", args.config.display()))?;
    let running = grid_gatewayd::driver::start(config).await?;
    let stop = grid_daemon::shutdown::requested()
        .await
        .context("installing the SIGINT/SIGTERM handlers")?;
    tracing::info!(
        signal = stop.as_str(),
        "shutting down: stopping the poller, draining requests"
    );
    running.shutdown().await;
    tracing::info!("drained; exiting");
    Ok(())
}
