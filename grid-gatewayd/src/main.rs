//! `grid-gatewayd`: the thin binary around [`grid_gatewayd`].

use anyhow::Context as _;
use clap::Parser;
use grid_gatewayd::Config;

/// Command line of the gateway.
#[derive(Debug, Parser)]
#[command(version, about = "grid gateway")]
struct Args {
    /// Gateway configuration file (TOML); see docs/gateway.md. Without it the embedded
    /// example (docs/examples/gateway.toml) is used.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let config = match &args.config {
        Some(path) => Config::load(path).with_context(|| format!("loading {}", path.display()))?,
        None => Config::from_toml_str(grid_gatewayd::config::EXAMPLE_CONFIG_TOML)?,
    };
    let running = grid_gatewayd::driver::start(config).await?;
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    tracing::info!("shutting down: stopping the poller, draining requests");
    running.shutdown().await;
    Ok(())
}
