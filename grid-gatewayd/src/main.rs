//! `grid-gatewayd`: the thin binary around [`grid_gatewayd`].

use clap::Parser;

/// Command line of the gateway.
#[derive(Debug, Parser)]
#[command(version, about = "grid gateway")]
struct Args {
    /// Gateway configuration file (TOML); see docs/gateway.md.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::bail!(
        "grid-gatewayd cannot serve yet (config {:?}): the daemon lands with issue 9",
        args.config
    )
}
