//! `grid-operatord`: the thin binary around [`grid_operatord`].

use std::sync::Arc;

use clap::Parser;
use grid_operatord::config::{ConfigSource, FileConfigSource};
use grid_operatord::driver::{self, Options};
use grid_operatord::state::FileStateStore;

/// Command line of the site operator.
#[derive(Debug, Parser)]
#[command(version, about = "grid site operator")]
struct Args {
    /// Operator configuration file (TOML); see docs/operator.md.
    #[arg(long)]
    config: std::path::PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let source: Arc<dyn ConfigSource> = Arc::new(FileConfigSource::new(&args.config));
    let config = source.load()?;
    let state = Arc::new(FileStateStore::open(&config.state_dir)?);
    let mut running = driver::start(config, Some(source), state, Options::default()).await?;
    tokio::select! {
        result = running.wait() => result?,
        _ = tokio::signal::ctrl_c() => {
            tracing::info!("interrupted; stopping every task, persisting the fences");
            running.shutdown().await?;
        }
    }
    Ok(())
}
