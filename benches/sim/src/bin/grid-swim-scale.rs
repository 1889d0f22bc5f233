//! `grid-swim-scale`: the membership and overlay code alone at 20 to 1,000 sites in
//! virtual time (see `grid_sim::swim_scale`), printed as the scale table of
//! `docs/benchmarks.md`, with poll mode's figures from its schedule beside them.

use clap::Parser;
use grid_sim::swim_scale::{Params, Report, run};

/// Flags of the scale run.
#[derive(Debug, Parser)]
#[command(about = "SWIM membership and gossip overlay at scale, in virtual time")]
struct Args {
    /// Grid sizes to run.
    #[arg(long, value_delimiter = ',', default_value = "20,100,1000")]
    sites: Vec<usize>,
    /// Datagrams lost, per mille.
    #[arg(long, default_value_t = 10)]
    loss: u64,
    /// Smallest one-way delay, ms.
    #[arg(long, default_value_t = 20)]
    delay_min: u64,
    /// Largest one-way delay, ms.
    #[arg(long, default_value_t = 80)]
    delay_max: u64,
    /// Bytes of one relayed batch.
    #[arg(long, default_value_t = 800)]
    batch_bytes: u64,
    /// Poll mode's `peerPollSeconds`, for its figures.
    #[arg(long, default_value_t = 5.0)]
    poll_seconds: f64,
    /// Versions announced in the spread phase.
    #[arg(long, default_value_t = 20)]
    announcements: usize,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn ms(v: Option<u64>) -> String {
    v.map_or_else(
        || "never".to_owned(),
        |v| format!("{:.1} s", v as f64 / 1000.0),
    )
}

fn main() {
    let a = Args::parse();
    println!(
        "loss {}‰, one-way delay {}-{} ms, batch {} B, poll every {} s\n",
        a.loss, a.delay_min, a.delay_max, a.batch_bytes, a.poll_seconds
    );
    println!(
        "| sites | mode | join | reading reaches a member p50 / p99 (missed) | dead site down everywhere p50 / p99 (missed) | bytes per site per s (datagrams) | heal after a partition |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for &sites in &a.sites {
        let (r, took): (Report, f64) = grid_sim::clock::seconds(|| {
            run(Params {
                sites,
                loss_per_mille: a.loss,
                delay_ms: (a.delay_min, a.delay_max),
                batch_bytes: a.batch_bytes,
                announcements: a.announcements,
                seed: a.seed,
            })
        });
        println!(
            "| {sites} | gossip | {} | {} | {} | {:.0} ({:.0}) | {} |",
            ms(r.join_ms),
            r.spread.cell(2),
            r.detect.cell(1),
            r.bytes_per_site_s,
            r.datagram_bytes_per_site_s,
            ms(r.heal_ms),
        );
        // Poll: each site polls every other once per interval at a random phase, so a
        // reading waits half an interval on average, plus one round trip; a dead site's
        // readings age out 30 s (the store TTL) after its last good poll. Each site
        // sends its body to every peer and polls every peer once per interval.
        let rtt = (a.delay_min + a.delay_max) as f64 / 1000.0;
        let p = a.poll_seconds;
        let peers = (sites - 1) as f64;
        println!(
            "| {sites} | poll (schedule) | — | {:.2} / {:.2} s | {:.1} / {:.1} s | {:.0} | — |",
            p / 2.0 + rtt,
            p * 0.99 + rtt,
            30.0 + p / 2.0,
            30.0 + p * 0.99,
            peers * (a.batch_bytes as f64 + 300.0) / p,
        );
        eprintln!("{sites} sites simulated in {took:.1} s");
    }
}
