//! `grid-gatewayd`: the thin binary around [`grid_gatewayd`].

use anyhow::Context as _;
use clap::Parser;
use grid_gatewayd::Config;

/// Every proxied answer allocates a few times (a head's buffer, a body's frames, the
/// request's state); mimalloc's thread-local free lists serve those in fewer
/// instructions than glibc's bins, and keep a worker's blocks on its own pages.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
