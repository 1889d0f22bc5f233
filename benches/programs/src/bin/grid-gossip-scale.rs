//! `grid-gossip-scale`: real operators at 3 to 20 sites on loopback, gossip against poll,
//! at the daemon's default intervals (see `grid_programs::gossip_scale`).

use clap::Parser;
use grid_operatord::config::TransportMode;
use grid_programs::gossip_scale::{Params, run};

/// Flags of the run.
#[derive(Debug, Parser)]
#[command(about = "Real operators at 3-20 sites: gossip against poll")]
struct Args {
    /// Grid sizes.
    #[arg(long, value_delimiter = ',', default_value = "3,10,20")]
    sites: Vec<usize>,
    /// Membership datagrams lost, per mille.
    #[arg(long, default_value_t = 10)]
    loss: u64,
    /// Readings changed per run.
    #[arg(long, default_value_t = 6)]
    changes: usize,
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    println!(
        "loss {}‰ on membership datagrams, scrapes 1 s, peer polls 5 s, loopback\n",
        a.loss
    );
    println!(
        "| sites | mode | zero-endpoint reading reaches another site p50 / p99 (missed) | back to ready endpoints p50 / p99 (missed) | dead site down everywhere p50 / p99 (missed) | membership bytes per site per s | signal bytes per site per s |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for &sites in &a.sites {
        for mode in [TransportMode::Gossip, TransportMode::Poll] {
            let r = run(Params {
                sites,
                mode,
                loss_per_mille: a.loss,
                changes: a.changes,
            })
            .await;
            println!(
                "| {sites} | {} | {} | {} | {} | {:.0} | {:.0} |",
                mode.as_str(),
                r.reach.cell(2),
                r.rejoin.cell(2),
                r.detect.cell(1),
                r.membership_bytes_per_site_s,
                r.signal_bytes_per_site_s,
            );
        }
    }
}
