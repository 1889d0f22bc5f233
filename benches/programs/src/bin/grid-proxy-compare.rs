//! `grid-proxy-compare`: the grid gateway against nginx and Envoy on the same instant
//! upstream, driven by wrk and h2load, printed as `docs/benchmarks.md`'s proxy table
//! (see `grid_programs::proxy_compare`). Needs `nginx`, `wrk` and `h2load` on the `PATH` and
//! Envoy from `.venv` (all installed by `.ci/install`), and the gateway built beside this
//! binary: `cargo build --release -p grid-gatewayd -p grid-programs --bins`.
//!
//! With `--streams`: thousands of long streamed answers held open through each proxy
//! (`grid_programs::proxy_compare::streams`), from `grid-ticking-upstream` beside this
//! binary.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use grid_kit::ticking_upstream::Ticks;
use grid_programs::proxy_compare::streams::{StreamsMeasured, TARGETS};
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
    /// Instead of the request table: the streams table (memory per open stream, CPU per
    /// event, delay added per event, time to open them all, first byte).
    #[arg(long)]
    streams: bool,
    /// With `--streams`: the numbers of streams held open at once.
    #[arg(long, value_delimiter = ',', default_value = "1000,9000")]
    stream_counts: Vec<usize>,
    /// With `--streams`: milliseconds between two events of a stream.
    #[arg(long, default_value_t = 500)]
    interval_ms: u64,
    /// With `--streams`: each stream's length, seconds.
    #[arg(long, default_value_t = 60)]
    stream_seconds: u64,
    /// With `--streams`: bytes per event.
    #[arg(long, default_value_t = 100)]
    event_bytes: usize,
    /// With `--streams`: run the gateway under this program and its arguments (one
    /// flag each), e.g. `--grid-under valgrind --grid-under --tool=massif` for what a
    /// stream holds; the gateway's command line is appended.
    #[arg(long, allow_hyphen_values = true)]
    grid_under: Vec<String>,
    /// With `--streams`: only these paths (`direct`, `nginx`, `envoy`, `grid`), the
    /// proxies measured in the order given (by default nginx, Envoy, then grid).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
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

fn clients(args: &Args) -> Vec<Client> {
    [(Client::Http1, "h1"), (Client::Http2, "h2")]
        .into_iter()
        .filter(|(_, name)| args.client.as_deref().is_none_or(|a| a == *name))
        .map(|(c, _)| c)
        .collect()
}

/// The client protocol, without the request comparison's generator names.
fn protocol(client: Client) -> &'static str {
    match client {
        Client::Http1 => "HTTP/1.1",
        Client::Http2 => "HTTP/2",
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn or_dash(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.decimals$}"))
}

/// The streams table: per client protocol and count, the direct path and each proxy.
async fn streams(args: &Args, pinning: Pinning) -> anyhow::Result<()> {
    let ticks = Ticks {
        interval: Duration::from_millis(args.interval_ms),
        events: u32::try_from(args.stream_seconds * 1_000 / args.interval_ms.max(1))?.max(1) + 1,
        event_bytes: args.event_bytes,
    };
    let gatewayd = sibling_binary("grid-gatewayd");
    let upstream = sibling_binary("grid-ticking-upstream");
    // A fresh lineup for every measured case: an allocator keeps what a process freed,
    // so a proxy that held streams before would show their memory as already there.
    let fresh = || {
        Lineup::start_with(
            (&gatewayd, &args.envoy, &args.grid_under),
            (args.workers, pinning),
            Some((&upstream, ticks)),
        )
    };
    let wanted = |target: &str| {
        target == "direct" || args.only.is_empty() || args.only.iter().any(|o| o == target)
    };
    let lineup = fresh().await?;
    println!(
        "{} worker(s) per proxy; streams of {} events of {} bytes every {} ms; load average at start {}{}\n",
        args.workers,
        ticks.events,
        ticks.event_bytes,
        args.interval_ms,
        load_average(),
        if args.pin {
            "; proxies pinned to CPU 0 and the rest to CPU 1"
        } else {
            ""
        }
    );
    println!("First byte of one stream at a time on an idle proxy, p50 us (added over direct):\n");
    let shown: Vec<&str> = TARGETS.into_iter().filter(|t| wanted(t)).collect();
    println!(
        "| client | {} |\n| --- |{}",
        shown.join(" | "),
        " ---: |".repeat(shown.len())
    );
    for client in clients(args) {
        let mut cells = Vec::new();
        let mut direct = 0.0;
        for target in TARGETS.into_iter().filter(|t| wanted(t)) {
            let us = lineup.idle_first_byte(target, client).await?;
            if target == "direct" {
                direct = us;
                cells.push(format!("{us:.0}"));
            } else {
                cells.push(format!("{us:.0} (+{:.0})", us - direct));
            }
        }
        println!("| {} | {} |", protocol(client), cells.join(" | "));
    }
    drop(lineup);
    println!(
        "\n| client | streams | path | open all, s | first byte p50, ms | delay per event p50 / p99, ms | added p50 / p99, ms | memory per stream, KiB | CPU per event, us | streams failed |"
    );
    println!("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let proxies: Vec<&str> = if args.only.is_empty() {
        TARGETS.into_iter().filter(|t| *t != "direct").collect()
    } else {
        args.only
            .iter()
            .map(String::as_str)
            .filter(|t| *t != "direct")
            .collect()
    };
    for client in clients(args) {
        for &n in &args.stream_counts {
            if proxies.is_empty() {
                let m = fresh().await?.streams("direct", client, n, ticks).await?;
                print_streams_row(client, n, "direct", &m, None);
            }
            // Each proxy is measured on a lineup of its own, the upstream included, with
            // the direct path measured on it right before: a proxy keeps connections to
            // the upstream idle after its run (Envoy all 9,000, for an hour), which held
            // the upstream's descriptors, so the next proxy's connects waited in its
            // backlog (grid's, bounded at 2 s, failed a third of its streams with 502).
            for &target in &proxies {
                let lineup = fresh().await?;
                let base = lineup.streams("direct", client, n, ticks).await?;
                print_streams_row(client, n, "direct", &base, None);
                let m = lineup.streams(target, client, n, ticks).await?;
                print_streams_row(client, n, target, &m, Some(&base));
            }
        }
    }
    println!("\nload average at end {}", load_average());
    Ok(())
}

/// One row of the streams table: `added` over `base`, the direct path measured right
/// before (none for the direct path's own row).
fn print_streams_row(
    client: Client,
    n: usize,
    target: &str,
    m: &StreamsMeasured,
    base: Option<&StreamsMeasured>,
) {
    println!(
        "| {} | {n} | {target} | {:.2} | {:.2} | {:.2} / {:.2} | {} | {} | {} | {} |",
        protocol(client),
        m.open_s,
        m.first_byte_p50_us / 1e3,
        m.delay_p50_us / 1e3,
        m.delay_p99_us / 1e3,
        base.map_or_else(
            || "-".to_owned(),
            |b| format!(
                "{:+.2} / {:+.2}",
                (m.delay_p50_us - b.delay_p50_us) / 1e3,
                (m.delay_p99_us - b.delay_p99_us) / 1e3
            )
        ),
        or_dash(m.kib_per_stream, 1),
        or_dash(m.cpu_us_per_event, 1),
        m.failed,
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.streams {
        let pinning = if args.pin {
            Pinning::TWO_CORES
        } else {
            Pinning::Shared
        };
        return streams(&args, pinning).await;
    }
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
