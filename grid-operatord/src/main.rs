//! `grid-operatord`: the thin binary around [`grid_operatord`].

use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use grid_operatord::config::{ConfigSource, FileConfigSource};
use grid_operatord::driver::{self, Options};
use grid_operatord::state::FileStateStore;

/// Command line of the site operator. Without a subcommand it runs from `--config`, the
/// standalone file mode.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "grid site operator",
    args_conflicts_with_subcommands = true
)]
struct Args {
    /// Operator configuration file (TOML); see docs/operator.md.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Prints the CRDs (`CustomResourceDefinition`s) generated from the resource types (one YAML
    /// stream for `kubectl apply -f -`), or writes one file per CRD into `--out`.
    Crds {
        /// Directory to write `gridnetworks.yaml`, `gridsites.yaml` and
        /// `inferenceproviders.yaml` into (docs/crds in this repository).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match (args.command, args.config) {
        (Some(Command::Crds { out }), _) => crds(out.as_deref()),
        (None, Some(path)) => run_file_mode(path).await,
        (None, None) => anyhow::bail!("give --config FILE (file mode) or a subcommand; see --help"),
    }
}

fn crds(out: Option<&std::path::Path>) -> anyhow::Result<()> {
    use grid_operatord::controller::crd_yaml;
    let Some(dir) = out else {
        print!("{}", crd_yaml::crds_yaml());
        return Ok(());
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, text) in crd_yaml::crd_files() {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

async fn run_file_mode(path: std::path::PathBuf) -> anyhow::Result<()> {
    grid_daemon::logging::init();
    let source: Arc<dyn ConfigSource> = Arc::new(FileConfigSource::new(&path));
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
