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
    /// Runs as a Kubernetes controller: the configuration comes from the namespace's
    /// `GridNetwork`, `GridSite`s and `InferenceProvider`s, the state from the site's
    /// `ConfigMap` and the `GridNetwork` status (docs/crds.md).
    Controller(Box<ControllerArgs>),
}

/// What the resources do not say: where this pod runs and what it presents.
#[derive(Debug, clap::Args)]
struct ControllerArgs {
    /// The namespace watched (the pod's own: `--namespace=$(POD_NAMESPACE)` from the
    /// downward API).
    #[arg(long)]
    namespace: String,
    /// This operator's site name.
    #[arg(long)]
    site: String,
    /// The API server URL; absent, the in-cluster service account (or KUBECONFIG).
    #[arg(long)]
    api_server: Option<String>,
    /// The site's certificate chain (PEM), e.g. from a mounted Secret.
    #[arg(long, default_value = "/etc/grid/tls/tls.crt")]
    cert: std::path::PathBuf,
    /// Its private key (PEM).
    #[arg(long, default_value = "/etc/grid/tls/tls.key")]
    key: std::path::PathBuf,
    /// The CA bundle (PEM); required in spiffe mode and for https EPPs without their own.
    #[arg(long)]
    ca: Option<std::path::PathBuf>,
    /// The signals listener (mTLS).
    #[arg(long, default_value = "0.0.0.0:9443")]
    signals_listen: std::net::SocketAddr,
    /// The Prometheus /metrics listener.
    #[arg(long, default_value = "0.0.0.0:9090")]
    metrics_listen: std::net::SocketAddr,
    /// This replica's identity in the site's Lease (the pod name); without it the
    /// operator runs without electing a writer (one replica per site only).
    #[arg(long)]
    identity: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match (args.command, args.config) {
        (Some(Command::Crds { out }), _) => crds(out.as_deref()),
        (Some(Command::Controller(args)), _) => run_controller(*args).await,
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
    // Before the listeners open (see grid_daemon::shutdown::Handlers).
    let stop = grid_daemon::shutdown::Handlers::install()
        .context("installing the SIGINT/SIGTERM handlers")?;
    let mut running = driver::start(config, Some(source), state, Options::default()).await?;
    tokio::select! {
        result = running.wait() => result?,
        stop = stop.requested() => {
            let signal = stop.context("waiting for SIGINT/SIGTERM")?.as_str();
            tracing::info!(signal, "stopping every task, persisting the fences");
            running.shutdown().await?;
            tracing::info!("fences persisted; exiting");
        }
    }
    Ok(())
}

async fn run_controller(args: ControllerArgs) -> anyhow::Result<()> {
    use grid_operatord::config::{Listen, TlsFiles};
    use grid_operatord::controller::{api, run, source::KubeConfigSource, translate::Deployment};
    grid_daemon::logging::init();
    let client = api::client(args.api_server.as_deref(), &args.namespace).await?;
    let deployment = Deployment {
        state_label: format!(
            "ConfigMap/{}{}",
            grid_operatord::controller::state_store::CONFIGMAP_PREFIX,
            args.site
        )
        .into(),
        site: args.site,
        listen: Listen {
            signals: args.signals_listen,
            metrics: args.metrics_listen,
        },
        tls: TlsFiles {
            cert: args.cert,
            key: args.key,
            ca: args.ca,
        },
    };
    let metrics = api::ControllerMetrics::new();
    let source = Arc::new(
        KubeConfigSource::start(client.clone(), &args.namespace, deployment, metrics.clone())
            .await?,
    );
    let (started, _) = tokio::sync::watch::channel(None);
    // Before the operator's listeners open (see grid_daemon::shutdown::Handlers).
    let handlers = grid_daemon::shutdown::Handlers::install();
    let stop = async {
        match async { handlers?.requested().await }.await {
            Ok(signal) => tracing::info!(
                signal = signal.as_str(),
                "stopping every task, persisting the fences"
            ),
            Err(e) => {
                tracing::error!(error = %e, "installing the SIGINT/SIGTERM handlers failed; stopping");
            }
        }
    };
    let election = args.identity.map(|identity| run::Election {
        identity,
        timing: grid_operatord::controller::lease::Timing::default(),
    });
    let setup = run::Setup {
        client,
        namespace: args.namespace,
        source,
        options: Options::default(),
        metrics,
        election,
    };
    run::run(setup, started, stop).await?;
    Ok(())
}
