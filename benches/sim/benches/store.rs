//! Store throughput: ingesting a realistic relay body (50 sites x 4 providers, 21 rows a
//! batch, as an operator relays to its gateway) and reading `window_worst`.

use criterion::{BatchSize, Criterion, Throughput};
use grid_signals::batch::Batch;
use grid_signals::store::{IngestReport, RelayBudget, Sender, Store, StoreConfig};
use grid_sim::provider_batches::{CONTRACT, GridShape, PER_ENDPOINT, T0, Values};
use std::hint::black_box;

/// 50 sites x 4 providers, 21 rows a batch: 4,200 rows, about 0.5 MiB of relay.
const SHAPE: GridShape = GridShape {
    sites: 50,
    providers: 4,
    endpoints: 8,
    values: Values::Arbitrary,
};
const SITES: usize = SHAPE.sites;
const PROVIDERS: usize = SHAPE.providers;

/// One provider's batch at `sequence`, stamped `now`.
fn provider_batch(site: usize, provider: usize, sequence: u64, now: u64) -> Batch {
    SHAPE.batch(site, provider, sequence, now)
}

/// The operator's store after `sequence` publications of every provider, and its relay.
fn operator(sequence: u64, now: u64) -> (Store, Vec<u8>) {
    let mut store = Store::new(StoreConfig::default());
    for seq in 0..=sequence {
        let at = now - (sequence - seq) * 1_000;
        for site in 0..SITES {
            for provider in 0..PROVIDERS {
                let mut report = IngestReport::default();
                store.ingest_batch(
                    provider_batch(site, provider, seq, at),
                    Sender::Local,
                    at,
                    at,
                    &mut report,
                );
            }
        }
    }
    let mut body = Vec::new();
    store.encode_relay(now, now, RelayBudget::default(), &mut body);
    (store, body)
}

fn ingest(c: &mut Criterion) {
    let now = T0;
    let (_, first) = operator(0, now);
    let (_, next) = operator(1, now + 1_000);
    let rows = (SHAPE.providers_total() * SHAPE.rows_per_provider()) as u64;
    let mut gateway = Store::new(StoreConfig::default());
    gateway.ingest(&first, Sender::Local, now, now);

    let mut group = c.benchmark_group("store_ingest");
    group.throughput(Throughput::Elements(rows));
    // Into an empty store: every series is created.
    group.bench_function("relay_50x4_into_empty", |b| {
        b.iter_batched(
            || Store::new(StoreConfig::default()),
            // The store is returned so that dropping it is not timed.
            |mut s| {
                let report = s.ingest(black_box(&first), Sender::Local, now, now);
                (s, report)
            },
            BatchSize::LargeInput,
        );
    });
    // The steady state: every provider advanced by one sequence since the last poll.
    group.bench_function("relay_50x4_advance", |b| {
        b.iter_batched(
            || gateway.clone(),
            |mut s| {
                let report = s.ingest(black_box(&next), Sender::Local, now + 1_000, now + 1_000);
                (s, report)
            },
            BatchSize::LargeInput,
        );
    });
    // Nothing changed since the last poll: every batch is an exact repeat.
    group.bench_function("relay_50x4_repeat", |b| {
        let mut s = gateway.clone();
        b.iter(|| black_box(s.ingest(black_box(&first), Sender::Local, now, now + 500)));
    });
    group.finish();

    let (operator_store, body) = operator(1, now + 1_000);
    let mut group = c.benchmark_group("store_relay");
    group.throughput(Throughput::Elements(rows));
    group.bench_function("encode_50x4", |b| {
        let mut out = Vec::with_capacity(body.len());
        b.iter(|| {
            out.clear();
            black_box(operator_store.encode_relay(
                now + 1_000,
                now + 1_000,
                RelayBudget::default(),
                &mut out,
            ))
        });
    });
    group.finish();
}

fn window_worst(c: &mut Criterion) {
    // One provider with full windows: 64 readings per series.
    let mut store = Store::new(StoreConfig::default());
    let mut now = T0;
    for seq in 0..64 {
        now = T0 + seq * 400;
        let mut report = IngestReport::default();
        store.ingest_batch(
            provider_batch(0, 0, seq, now),
            Sender::Local,
            now,
            now,
            &mut report,
        );
    }
    let entry = store.entry("site-00", "provider-0").expect("entry");
    let mut group = c.benchmark_group("store_window_worst");
    group.bench_function("one_series_64_readings", |b| {
        b.iter(|| {
            black_box(entry.window_worst(black_box("llm_d_epp_average_queue_size"), now, 10_000))
        });
    });
    group.bench_function("8_endpoints_x_64_readings", |b| {
        b.iter(|| black_box(entry.window_worst(black_box(PER_ENDPOINT), now, 10_000)));
    });
    group.bench_function("all_200_providers_x_13_metrics", |b| {
        let (full, _) = operator(15, T0 + 15_000);
        b.iter(|| {
            let mut sum = 0.0;
            for e in full.entries() {
                for m in CONTRACT {
                    sum += e.window_worst(m, T0 + 15_000, 10_000).unwrap_or(0.0);
                }
            }
            black_box(sum)
        });
    });
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    ingest(&mut c);
    window_worst(&mut c);
    c.final_summary();
}
