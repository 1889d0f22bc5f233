//! `grid-operatord`: the thin binary around [`grid_operatord`].

use std::sync::Arc;

use anyhow::Context as _;
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
    grid_daemon::logging::init();
    let args = Args::parse();
    let source: Arc<dyn ConfigSource> = Arc::new(FileConfigSource::new(&args.config));
    let config = source.load()?;
    let state = Arc::new(FileStateStore::open(&config.state_dir)?);
    let mut running = driver::start(config, Some(source), state, Options::default()).await?;
    tokio::select! {
        result = running.wait() => result?,
        stop = grid_daemon::shutdown::requested() => {
            let signal = stop.context("installing the SIGINT/SIGTERM handlers")?.as_str();
            tracing::info!(signal, "stopping every task, persisting the fences");
            running.shutdown().await?;
            tracing::info!("fences persisted; exiting");
        }
    }
    Ok(())
}
