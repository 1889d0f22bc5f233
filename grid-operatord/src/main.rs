//! `grid-operatord`: the thin binary around [`grid_operatord`].

use clap::Parser;

/// Command line of the site operator.
#[derive(Debug, Parser)]
#[command(version, about = "grid site operator")]
struct Args {
    /// Operator configuration file (TOML); see docs/operator.md.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::bail!(
        "grid-operatord cannot serve yet (config {:?}): the daemon lands with issue 8",
        args.config
    )
}
