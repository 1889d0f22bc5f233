//! Store throughput: ingesting a realistic relay body (50 sites x 4 providers, 21 rows a
//! batch, as an operator relays to its gateway) and reading `window_worst`.

use criterion::{BatchSize, Criterion, Throughput};
use grid_signals::batch::{Batch, BatchMeta, Fence, Row};
use grid_signals::store::{IngestReport, RelayBudget, Sender, Store, StoreConfig};
use std::hint::black_box;

const T0: u64 = 1_700_000_000_000;
const SITES: usize = 50;
const PROVIDERS: usize = 4;
const ENDPOINTS: usize = 8;

const CONTRACT: [&str; 13] = [
    "grid_provider_ready",
    "grid_provider_ready_endpoints",
    "grid_provider_in_flight_requests",
    "grid_provider_ttft_p50_seconds",
    "grid_provider_ttft_p90_seconds",
    "grid_provider_tpot_seconds",
    "grid_provider_error_ratio",
    "llm_d_epp_ready_endpoints",
    "llm_d_epp_average_running_requests",
    "llm_d_epp_average_queue_size",
    "llm_d_epp_average_kv_cache_utilization",
    "llm_d_epp_std_dev_kv_cache_utilization",
    "llm_d_epp_flow_control_queue_size",
];
const PER_ENDPOINT: &str = "llm_d_epp_per_endpoint_queue_size";

/// One provider's batch at `sequence`, stamped `now`.
fn provider_batch(site: usize, provider: usize, sequence: u64, now: u64) -> Batch {
    let mut rows: Vec<Row> = CONTRACT
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let value = ((site * 7 + provider * 3 + i) as u64 + sequence) as f64 * 0.25;
            Row::new(*name, vec![], value, now - 40).expect("valid row")
        })
        .collect();
    rows.extend((0..ENDPOINTS).map(|e| {
        let endpoint = format!("10.{site}.{provider}.{e}:8000");
        let value = ((e as u64 + sequence) % 5) as f64;
        Row::new(
            PER_ENDPOINT,
            vec![("model_server_endpoint".to_owned(), endpoint)],
            value,
            now - 40,
        )
        .expect("valid row")
    }));
    let meta = BatchMeta::new(
        format!("site-{site:02}"),
        format!("provider-{provider}"),
        format!("3f0c6d1e-{site:04}-{provider:04}-8000-00000000abcd"),
        Fence::new(T0 - 60_000, sequence),
        rows.len() as u64,
        3,
        now,
    )
    .expect("valid metadata");
    Batch::new(meta, rows)
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
    let rows = (SITES * PROVIDERS * (CONTRACT.len() + ENDPOINTS)) as u64;
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
