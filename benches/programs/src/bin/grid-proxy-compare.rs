//! `grid-proxy-compare`: the grid gateway against nginx and Envoy on the same instant
//! upstream, driven by wrk and h2load, printed as `docs/benchmarks.md`'s proxy table
//! (see `grid_programs::proxy_compare`). Needs `nginx`, `wrk` and `h2load` on the `PATH` and
//! Envoy from `.venv` (all installed by `.ci/install`), and the gateway built beside this
//! binary: `cargo build --release -p grid-gatewayd -p grid-programs --bins`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use grid_programs::proxy_compare::{
    Client, Lineup, Measured, Pinning, Profiled, callgrind_per_answer, sibling_binary,
};

/// Flags of the comparison.
#[derive(Debug, Parser)]
#[command(about = "The grid gateway against nginx and Envoy, with wrk and h2load")]
struct Args {
    /// Worker processes or threads of every proxy.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Closed-loop connections of the generator.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Seconds per measured run.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Envoy's binary.
    #[arg(long, default_value = ".venv/bin/envoy")]
    envoy: PathBuf,
    /// Instead of the table: the instructions per answer of the gateway and of nginx under
    /// callgrind, for each of the four cases (two runs of 200 and 1,200 answers each).
    #[arg(long)]
    callgrind: bool,
    /// With `--callgrind`: keep each run's profile in this folder, for
    /// `callgrind_annotate --inclusive=yes`.
    #[arg(long)]
    callgrind_out: Option<PathBuf>,
    /// With `--callgrind`: the generator's connections. One (the default) makes every
    /// answer wait for the next request, so the proxy parks between answers; the
    /// comparison's 32 keep it busy, as under load, where parking is rare.
    #[arg(long, default_value_t = 1)]
    callgrind_connections: usize,
    /// Only the cases whose client speaks this (`h1` or `h2`); both when absent.
    #[arg(long, value_parser = ["h1", "h2"])]
    client: Option<String>,
    /// Only the cases with this body (`plain` or `sse`); both when absent.
    #[arg(long, value_parser = ["plain", "sse"])]
    body: Option<String>,
    /// Every proxy on CPU 0 and everything else (this process, its upstream and
    /// operator, wrk and h2load) on CPU 1, with `taskset`: the proxy measured has a core
    /// to itself rather than being preempted by the generator. One worker only.
    #[arg(long)]
    pin: bool,
}

impl Args {
    /// The (client, streamed) cases asked for, in the table's order.
    fn cases(&self) -> Vec<(Client, bool)> {
        let mut cases = Vec::new();
        for (client, name) in [(Client::Http1, "h1"), (Client::Http2, "h2")] {
            for (stream, body) in [(false, "plain"), (true, "sse")] {
                let wanted =
                    |asked: &Option<String>, this: &str| asked.as_deref().is_none_or(|a| a == this);
                if wanted(&self.client, name) && wanted(&self.body, body) {
                    cases.push((client, stream));
                }
            }
        }
        cases
    }
}

fn cell(m: &Measured) -> String {
    format!(
        "{:.0} / {:.1} / {:.0} / {:.0}",
        m.rps, m.cpu_us, m.p50_us, m.p99_us
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.callgrind {
        println!(
            "| client | body | grid instructions per answer | nginx instructions per answer | grid/nginx |\n| --- | --- | ---: | ---: | ---: |"
        );
        let gatewayd = sibling_binary("grid-gatewayd");
        for (client, stream) in args.cases() {
            let mut per = [0.0; 2];
            for (i, proxy) in [Profiled::Grid, Profiled::Nginx].into_iter().enumerate() {
                per[i] = callgrind_per_answer(
                    (proxy, &gatewayd),
                    client,
                    stream,
                    (200, 1_200),
                    args.callgrind_connections,
                    args.callgrind_out.as_deref(),
                )
                .await?;
            }
            println!(
                "| {} | {} | {:.0} | {:.0} | {:.2}x |",
                client.as_str().split(' ').next().unwrap_or_default(),
                if stream { "SSE, 10 events" } else { "plain" },
                per[0],
                per[1],
                per[0] / per[1],
            );
        }
        return Ok(());
    }
    let pinning = if args.pin {
        anyhow::ensure!(
            args.workers == 1,
            "--pin gives the proxies one core: one worker"
        );
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        anyhow::ensure!(cores >= 2, "--pin needs two CPUs; this machine has {cores}");
        Pinning::TWO_CORES
    } else {
        Pinning::Shared
    };
    let lineup = Lineup::start(
        &sibling_binary("grid-gatewayd"),
        &args.envoy,
        args.workers,
        pinning,
    )
    .await?;
    println!(
        "{} worker(s) per proxy, {} connections, {} s per run{}; each cell: answers/s / proxy CPU us per answer / p50 us / p99 us\n",
        args.workers,
        args.connections,
        args.seconds,
        if args.pin {
            ", proxies pinned to CPU 0 and the rest to CPU 1"
        } else {
            ""
        }
    );
    println!(
        "| client | body | nginx | Envoy | grid | CPU grid/nginx | CPU grid/Envoy | rps grid/nginx | rps grid/Envoy |"
    );
    println!("| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |");
    let window = Duration::from_secs(args.seconds);
    for (client, stream) in args.cases() {
        let [n, e, g] = lineup.round(client, (stream, args.connections, window))?;
        println!(
            "| {} | {} | {} | {} | {} | {:.2}x | {:.2}x | {:.2}x | {:.2}x |",
            client.as_str(),
            if stream { "SSE, 10 events" } else { "plain" },
            cell(&n),
            cell(&e),
            cell(&g),
            g.cpu_us / n.cpu_us,
            g.cpu_us / e.cpu_us,
            g.rps / n.rps,
            g.rps / e.rps,
        );
        for (name, m) in [("nginx", n), ("envoy", e), ("grid", g)] {
            if m.failed > 0 {
                eprintln!("{name}: {} answers failed", m.failed);
            }
        }
    }
    Ok(())
}
