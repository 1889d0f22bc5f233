//! `grid-ticking-upstream`: the streams comparison's upstream in a process of its own
//! (`grid_kit::ticking_upstream`): every streamed chat request gets an event at once and
//! then one per interval, each stamped with its send instant. Runs until killed.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use grid_kit::ticking_upstream::{TickingUpstream, Ticks};

/// Flags of the upstream.
#[derive(Debug, Parser)]
#[command(about = "An upstream streaming long answers, one stamped event per interval")]
struct Args {
    /// Where to listen.
    #[arg(long)]
    listen: SocketAddr,
    /// The model it serves.
    #[arg(long, default_value = "bench")]
    model: String,
    /// Milliseconds between two events of one answer.
    #[arg(long, default_value_t = 500)]
    interval_ms: u64,
    /// Events per answer.
    #[arg(long, default_value_t = 120)]
    events: u32,
    /// Bytes per event on the wire.
    #[arg(long, default_value_t = 100)]
    event_bytes: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let ticks = Ticks {
        interval: Duration::from_millis(args.interval_ms),
        events: args.events,
        event_bytes: args.event_bytes,
    };
    let _up = TickingUpstream::start(args.listen, &args.model, ticks)?;
    tokio::signal::ctrl_c().await?;
    Ok(())
}
