//! `grid-gatewayd`: the thin binary around [`grid_gatewayd`].

use anyhow::Context as _;
use clap::Parser;
use grid_gateway::Config;

/// Every proxied answer allocates a few times (a head's buffer, a body's frames, the
/// request's state); mimalloc's thread-local free lists serve those in fewer
/// instructions than glibc's bins, and keep a worker's blocks on its own pages.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Command line of the gateway. Without a subcommand it runs from `--config`.
#[derive(Debug, Parser)]
#[command(version, about = "grid gateway", subcommand_negates_reqs = true)]
struct Args {
    /// Gateway configuration file (TOML); see docs/gateway.md (docs/examples/gateway.toml
    /// is an example to copy and edit).
    #[arg(long, required = true)]
    config: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Prints a daemon's routing evidence (`GET /v1/grid/routing`) as a table: a
    /// gateway's (why requests go where they go) or an operator's (what it concluded per
    /// provider and peer). Colour only on a terminal.
    Status {
        /// The gateway's listener or the operator's metrics listener, `http://host:port`
        /// (or the evidence URL itself, e.g. with `?model=NAME`).
        #[arg(long)]
        url: String,
        /// Print the JSON document as served instead of the table.
        #[arg(long)]
        json: bool,
    },
}

/// `status`: the table (or the document) on stdout; a failure on stderr, exit 1.
async fn status(url: &str, json: bool) -> anyhow::Result<()> {
    use std::io::{IsTerminal as _, Write as _};
    let url = grid_gatewayd::status::evidence_url(url)?;
    let body = grid_gatewayd::status::fetch(&url).await?;
    let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let text = grid_gatewayd::status::render(&url, &body, json, colour)?;
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Command::Status { url, json }) = args.command {
        return status(&url, json).await;
    }
    grid_daemon::logging::init();
    // mimalloc asks the kernel for transparent huge pages on its segments, and the first
    // touch of each zeroes 2 MiB inside the page fault, on the worker that touched it: a
    // burst of new streams then spent nearly half the gateway's CPU zeroing pages (and
    // opened 9,000 HTTP/2 streams in 1.3 s, 0.7 s without). Base pages are zeroed 4 KiB
    // at a time as they are used. Best effort: a kernel without the switch serves as it is.
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::info!(error = %e, "transparent huge pages stay as the kernel has them");
    }
    let Some(config_path) = args.config else {
        anyhow::bail!("give --config FILE, or a subcommand; see --help");
    };
    let args = RunArgs {
        config: config_path,
    };
    let config =
        Config::load(&args.config).with_context(|| format!("loading {}", args.config.display()))?;
    // Before the listener opens: a signal that arrives once the gateway serves must find
    // its handler, not the default action, which ends the process.
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    let stop = grid_daemon::shutdown::Handlers::install()
        .context("installing the SIGINT/SIGTERM handlers")?;
    let running = grid_gatewayd::driver::start(config).await?;
    let stop = stop.requested();
    tokio::pin!(stop);
    let stop = loop {
        #[cfg(unix)]
        tokio::select! {
            stop = &mut stop => break stop,
            _ = hup.recv() => reload(&running, &args.config).await,
        }
        #[cfg(not(unix))]
        break (&mut stop).await;
    }
    .context("installing the SIGINT/SIGTERM handlers")?;
    tracing::info!(
        signal = stop.as_str(),
        "shutting down: stopping the poller, draining requests"
    );
    running.shutdown().await;
    tracing::info!("drained; exiting");
    Ok(())
}

/// What running the gateway takes.
struct RunArgs {
    config: std::path::PathBuf,
}

/// SIGHUP: the models and candidates are re-read from `path` (the certificate too, by its
/// own watcher); a file that does not load is refused whole and the running models kept.
async fn reload(running: &grid_gatewayd::driver::Running, path: &std::path::Path) {
    let loaded = match Config::load(path) {
        Ok(config) => running.reload_models(&config).await,
        Err(e) => Err(e),
    };
    match loaded {
        Ok(()) => {
            tracing::info!(path = %path.display(), "SIGHUP: models reloaded (other settings take a restart)");
        }
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "SIGHUP: reload refused; the running models are kept");
        }
    }
}
