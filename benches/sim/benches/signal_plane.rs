//! The signal plane at scale, end to end: a grid of 1,000 sites serving 10 models (one
//! provider per model at every site, 21 rows a batch) as one operator and its gateway
//! carry it, through the functions the daemons call.
//!
//! - `signal_plane/relay_encode_1000x10`: the operator's answer to its gateway's
//!   `GET /v1/site/signals`: grid-signals' `Site::relay` for the local audience, what
//!   grid-operatord's signals listener writes under its lock (unsigned: signatures travel
//!   with gossip pulls only);
//! - `signal_plane/gateway_poll_1000x10`: the gateway's handling of that answer, what
//!   grid-gateway's poller runs per poll: grid-score's `Refresher::ingest` (decode, judge
//!   and store every batch) then `Refresher::refresh` (expire, feed the scorer, order every
//!   model's candidates into the snapshot the request path reads, mirror the scorer's
//!   gauges); every provider one publication on since the last poll, the steady state;
//! - `signal_plane/gateway_refresh_1000x10`: the refresh alone.
//!
//! The operator's site publishes nothing of its own here: every site's publications reach
//! it as its polls of the peers bring them (`SiteInput::PeerBody`). What the store's and
//! the relay's caps leave out at this size is counted and printed after the figures, with
//! the body's size and the allocations per encode and per poll.

use std::alloc::System;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use grid_score::catalog::{CandidateSpec, Catalog, ModelSpec};
use grid_score::refresh::{Refreshed, Refresher};
use grid_score::{ScoreConfig, ScoreMetrics, UNMEASURED};
use grid_signals::exposition::MAX_EXPOSITION_BYTES;
use grid_signals::site::{Audience, Site, SiteConfig, SiteInput, SiteOutput};
use grid_signals::store::{DropReason, IngestReport, RelayBudget, RelayReport, StoreConfig};
use grid_sim::clock;
use grid_sim::provider_batches::{GridShape, T0, Values};
use prometheus_client::registry::Registry;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Sites of the grid.
const SITES: usize = 1_000;
/// Models it serves: one provider per model at every site.
const MODELS: usize = 10;
/// The grid: 10,000 providers of 21 rows.
const SHAPE: GridShape = GridShape {
    sites: SITES,
    providers: MODELS,
    endpoints: 8,
    values: Values::Serving,
};

/// The gateway's poll interval (`operator.pollIntervalSeconds`, default 1 s), also the
/// sites' scrape interval: between two polls every provider publishes once.
const POLL_INTERVAL_MS: u64 = 1_000;
/// Polls before measuring, so every learner has readings inside its windows.
const WARM_POLLS: usize = 5;
/// Encodes and polls the allocation counts and the summary's own timings average over.
const COUNTED: usize = 21;

/// Bytes in a MiB, for printing sizes.
const MIB: f64 = 1_048_576.0;

/// The operator's site name: outside the grid, so every site's rows arrive as a peer's.
const OPERATOR: &str = "operator";

/// One operator and its gateway, in step.
struct Plane {
    operator: Site,
    /// Sites whose publications the operator's store holds. A provider it has no room
    /// for is refused whole (`cap`) at every poll of its site and changes nothing held,
    /// so the steady state polls only these.
    held: Vec<usize>,
    gateway: Refresher,
    /// The gateway's score gauges, which every refresh mirrors its table into.
    gauges: ScoreMetrics,
    sequence: u64,
    /// On a whole second, so the relay's `Date` (whole seconds) is `now` itself.
    now: u64,
}

/// What the operator made of its first poll of every site.
#[derive(Default)]
struct Offered {
    /// Providers stored.
    stored: u64,
    /// Lines refused as `cap` (a provider's metadata line and its rows).
    refused_cap_lines: u64,
}

impl Plane {
    fn new() -> (Self, Offered) {
        let config = SiteConfig {
            site: OPERATOR.into(),
            epoch: 1,
            scrape_interval_ms: POLL_INTERVAL_MS,
            store: StoreConfig::default(),
        };
        let mut operator = Site::new(config, &[], T0);
        let mut offered = Offered::default();
        let mut held = Vec::new();
        for site in 0..SITES {
            let report = poll_peer(&mut operator, site, 0, T0);
            offered.stored += report.batches_stored;
            offered.refused_cap_lines += report.dropped.get(DropReason::Cap);
            if report.batches_stored > 0 {
                held.push(site);
            }
        }
        let gauges = ScoreMetrics::register(&mut Registry::default());
        let gateway = Refresher::new(
            Arc::new(catalog()),
            ScoreConfig::default(),
            StoreConfig::default(),
            Some(gauges.clone()),
        );
        let mut plane = Self {
            operator,
            held,
            gateway,
            gauges,
            sequence: 0,
            now: T0,
        };
        let mut body = Vec::new();
        for _ in 0..WARM_POLLS {
            body.clear();
            plane.advance_and_relay(&mut body);
            let refreshed = plane.poll(&body);
            assert!(refreshed.refused.is_empty(), "{:?}", refreshed.refused);
        }
        (plane, offered)
    }

    /// One poll interval on: every site held publishes its next batch, the operator polls
    /// it, and its answer to the gateway's poll is written into `body`.
    fn advance_and_relay(&mut self, body: &mut Vec<u8>) -> RelayReport {
        self.now += POLL_INTERVAL_MS;
        self.sequence += 1;
        for &site in &self.held {
            poll_peer(&mut self.operator, site, self.sequence, self.now);
        }
        self.relay(body)
    }

    /// The operator's answer to its gateway's poll, as its signals listener writes it.
    fn relay(&self, body: &mut Vec<u8>) -> RelayReport {
        self.operator.relay(
            Audience::Local,
            self.now,
            self.now,
            RelayBudget::default(),
            body,
        )
    }

    /// The gateway's poll cycle over `body`: ingest, then the refresh it publishes.
    fn poll(&mut self, body: &[u8]) -> Refreshed {
        self.ingest(body);
        self.gateway.refresh(self.now)
    }

    fn ingest(&mut self, body: &[u8]) -> IngestReport {
        self.gateway.ingest(body, self.now, self.now)
    }
}

/// The operator's poll of `site`: the peer's answer (its own providers' batches at
/// `sequence`, published at `now`) through the site machine.
fn poll_peer(operator: &mut Site, site: usize, sequence: u64, now: u64) -> IngestReport {
    ingest_peer(operator, site, &peer_body(site, sequence, now), now)
}

/// Site `site`'s answer to a peer's poll: its own providers' batches.
fn peer_body(site: usize, sequence: u64, now: u64) -> Vec<u8> {
    let mut body = Vec::new();
    for provider in 0..MODELS {
        SHAPE.batch(site, provider, sequence, now).write(&mut body);
    }
    body
}

/// The operator's handling of `body`, polled from `site` and dated `now`.
fn ingest_peer(operator: &mut Site, site: usize, body: &[u8], now: u64) -> IngestReport {
    let peer = SHAPE.site(site);
    operator.handle(
        now,
        SiteInput::PeerBody {
            peer: &peer,
            body,
            date_ms: now,
        },
    );
    let mut ingested = IngestReport::default();
    while let Some(output) = operator.poll() {
        if let SiteOutput::PeerIngested { report } = output {
            ingested = report;
        }
    }
    ingested
}

/// The gateway's catalog: model `model-p` served by provider `p` at every site.
fn catalog() -> Catalog {
    let models: Vec<ModelSpec> = (0..MODELS)
        .map(|provider| ModelSpec {
            name: format!("model-{provider}"),
            candidates: (0..SITES)
                .map(|site| CandidateSpec {
                    site: SHAPE.site(site),
                    provider: GridShape::provider(provider),
                    scheme: "http".into(),
                    authority: format!("{}.example:8000", SHAPE.site(site)),
                    prefix: String::new(),
                })
                .collect(),
        })
        .collect();
    Catalog::new(&models)
}

/// Allocations and reallocations `f` makes, per call, over [`COUNTED`] calls.
fn allocations_per_call(mut f: impl FnMut()) -> f64 {
    let region = Region::new(GLOBAL);
    for _ in 0..COUNTED {
        f();
    }
    let stats = region.change();
    (stats.allocations + stats.reallocations) as f64 / COUNTED as f64
}

/// Median and least of `samples`, in ms.
fn median_and_best_ms(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    (samples[samples.len() / 2] * 1e3, samples[0] * 1e3)
}

/// What a measured poll times.
#[derive(Clone, Copy)]
enum Timed {
    /// Ingest and refresh: the whole cycle.
    Poll,
    /// The refresh alone, after an untimed ingest.
    Refresh,
}

/// Criterion's timing over `iters` fresh polls: each advances the grid and writes the
/// operator's answer untimed, then the gateway handles it. Each refresh's view is dropped
/// inside the time, as the daemon drops the view it replaces.
fn over_fresh_polls(plane: &mut Plane, iters: u64, timed: Timed) -> Duration {
    let mut body = Vec::with_capacity(MAX_EXPOSITION_BYTES);
    let mut total = 0.0;
    for _ in 0..iters {
        body.clear();
        plane.advance_and_relay(&mut body);
        if let Timed::Refresh = timed {
            black_box(plane.ingest(&body));
        }
        total += clock::seconds(|| {
            if let Timed::Poll = timed {
                black_box(plane.ingest(&body));
            }
            black_box(plane.gateway.refresh(plane.now));
        })
        .1;
    }
    Duration::from_secs_f64(total)
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args();

    let ((mut plane, offered), setup_s) = clock::seconds(Plane::new);
    let mut body = Vec::with_capacity(MAX_EXPOSITION_BYTES);
    let relay = plane.relay(&mut body);

    let mut group = c.benchmark_group("signal_plane");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("relay_encode_1000x10", |b| {
        let mut out = Vec::with_capacity(MAX_EXPOSITION_BYTES);
        b.iter(|| {
            out.clear();
            black_box(plane.relay(&mut out))
        });
    });
    group.bench_function("gateway_poll_1000x10", |b| {
        b.iter_custom(|iters| over_fresh_polls(&mut plane, iters, Timed::Poll));
    });
    group.bench_function("gateway_refresh_1000x10", |b| {
        b.iter_custom(|iters| over_fresh_polls(&mut plane, iters, Timed::Refresh));
    });
    group.finish();
    c.final_summary();

    summary(&mut plane, &offered, &relay, body.len(), setup_s);
}

/// The sizes, what the caps left out, allocations, and the poll's halves timed apart.
fn summary(plane: &mut Plane, offered: &Offered, relay: &RelayReport, bytes: usize, setup_s: f64) {
    let encode_allocs = allocations_per_call(|| {
        let mut out = Vec::with_capacity(MAX_EXPOSITION_BYTES);
        black_box(plane.relay(&mut out));
    });
    let (mut ingest_s, mut refresh_s) = (Vec::new(), Vec::new());
    let (mut ingest_allocs, mut refresh_allocs) = (0, 0);
    let mut body = Vec::with_capacity(MAX_EXPOSITION_BYTES);
    let mut last = None;
    for _ in 0..COUNTED {
        body.clear();
        plane.advance_and_relay(&mut body);
        let region = Region::new(GLOBAL);
        let (report, s) = clock::seconds(|| plane.ingest(&body));
        let stats = region.change();
        ingest_allocs += stats.allocations + stats.reallocations;
        ingest_s.push(s);
        assert_eq!(report.dropped.total(), 0, "{report:?}");
        let region = Region::new(GLOBAL);
        let (refreshed, s) = clock::seconds(|| plane.gateway.refresh(plane.now));
        let stats = region.change();
        refresh_allocs += stats.allocations + stats.reallocations;
        refresh_s.push(s);
        last = Some(refreshed);
    }
    let refreshed = last.expect("polled");
    let (ingest_ms, ingest_best_ms) = median_and_best_ms(ingest_s);
    let (refresh_ms, refresh_best_ms) = median_and_best_ms(refresh_s);
    // The part of each refresh that mirrors its table into the score gauges.
    let publish_s = (0..COUNTED)
        .map(|_| clock::seconds(|| plane.gauges.publish(refreshed.view.table())).1)
        .collect();
    let (publish_ms, publish_best_ms) = median_and_best_ms(publish_s);
    let (round_s, round_stored) = operator_round(plane);
    let candidates: usize = refreshed
        .view
        .table()
        .iter()
        .map(|s| s.candidates().len() + s.excluded().len())
        .sum();
    let measured: usize = refreshed
        .view
        .table()
        .iter()
        .map(|s| {
            s.candidates()
                .iter()
                .filter(|c| c.score() != UNMEASURED)
                .count()
        })
        .sum();
    let paths: Vec<String> = refreshed
        .view
        .table()
        .iter()
        .map(|s| format!("{:?}", s.path()))
        .collect();
    let per_provider = bytes as f64 / relay.providers_written.max(1) as f64;
    let whole_table = per_provider * SHAPE.providers_total() as f64;
    println!(
        "summary: grid {SITES} sites x {MODELS} models = {} providers, {} rows each; set up in {setup_s:.1} s",
        SHAPE.providers_total(),
        SHAPE.rows_per_provider()
    );
    println!(
        "summary: operator's store held {} providers, refused {} ({} lines) as `cap` (store cap {})",
        offered.stored,
        SHAPE.providers_total() as u64 - offered.stored,
        offered.refused_cap_lines,
        grid_signals::store::MAX_PROVIDERS
    );
    println!(
        "summary: relay body {bytes} bytes, {} lines, {} providers written, {} left out (budget {} bytes, {} lines); {per_provider:.0} bytes a provider, the whole table would be {:.1} MiB",
        relay.lines,
        relay.providers_written,
        relay.providers_dropped,
        MAX_EXPOSITION_BYTES,
        grid_signals::store::DEFAULT_RELAY_MAX_LINES,
        whole_table / MIB
    );
    println!(
        "summary: gateway: {candidates} candidates in {} models, {measured} measured; paths {paths:?}",
        refreshed.view.table().len()
    );
    println!("summary: allocations per relay encode: {encode_allocs:.1}");
    println!(
        "summary: allocations per poll: ingest {:.1}, refresh {:.1}",
        ingest_allocs as f64 / COUNTED as f64,
        refresh_allocs as f64 / COUNTED as f64
    );
    println!(
        "summary: poll over {COUNTED} polls: ingest {ingest_ms:.3} ms median ({ingest_best_ms:.3} best), refresh {refresh_ms:.3} ms median ({refresh_best_ms:.3} best); poll interval {POLL_INTERVAL_MS} ms"
    );
    println!(
        "summary: of each refresh, mirroring the table into the score gauges: {publish_ms:.3} ms median ({publish_best_ms:.3} best)"
    );
    println!(
        "summary: operator's polls of all {SITES} peers, one round: {:.1} ms of ingest ({round_stored} providers stored, the rest `cap`)",
        round_s * 1e3
    );
}

/// One round of the operator's polls of every site, each one publication on: the time
/// its site machine spends ingesting the answers (built beforehand), and the providers
/// stored. Every ingest of a body first expires the whole store.
fn operator_round(plane: &mut Plane) -> (f64, u64) {
    plane.now += POLL_INTERVAL_MS;
    plane.sequence += 1;
    let bodies: Vec<Vec<u8>> = (0..SITES)
        .map(|site| peer_body(site, plane.sequence, plane.now))
        .collect();
    let (stored, s) = clock::seconds(|| {
        bodies
            .iter()
            .enumerate()
            .map(|(site, body)| {
                ingest_peer(&mut plane.operator, site, body, plane.now).batches_stored
            })
            .sum()
    });
    (s, stored)
}
