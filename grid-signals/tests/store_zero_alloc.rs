//! Ingest allocates per body, not per row: re-ingesting an exact repeat of a relay body
//! (the gateway's common case, once a second) makes no heap allocation at all, and
//! advancing every provider of a warm store by one publication makes the same small
//! number of allocations for 20 rows as for 4,200. Counted by a wrapping global
//! allocator; this file runs without libtest's harness so no other thread allocates
//! while it counts.

use std::alloc::System;

use grid_signals::batch::{Batch, BatchMeta, Fence, Row};
use grid_signals::store::{IngestReport, MAX_SAMPLES_PER_SERIES, Sender, Store, StoreConfig};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const T0: u64 = 1_700_000_000_000;
const PROVIDERS: usize = 4;
/// The one-per-provider series, as the operator relays them.
const CONTRACT: [&str; 13] = grid_signals::epp::PROVIDER_SERIES;
const ENDPOINTS: usize = 8;
/// Rows of one provider's batch.
const ROWS: usize = CONTRACT.len() + ENDPOINTS;

/// A relay-shaped body: every provider of `sites` sites at `sequence`, stamped `now`
/// (13 contract series and 8 per-endpoint series each, as the operator relays them).
fn body(sites: usize, sequence: u64, now: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for site in 0..sites {
        for provider in 0..PROVIDERS {
            let mut rows: Vec<Row> = CONTRACT
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let value = (site + provider + i) as f64 + sequence as f64 * 0.25;
                    Row::new(*name, vec![], value, now - 40).unwrap()
                })
                .collect();
            rows.extend((0..ENDPOINTS).map(|e| {
                let endpoint = format!("10.{site}.{provider}.{e}:8000");
                let labels = vec![("model_server_endpoint".to_owned(), endpoint)];
                let value = ((e as u64 + sequence) % 5) as f64;
                Row::new("llm_d_epp_per_endpoint_queue_size", labels, value, now - 40).unwrap()
            }));
            let meta = BatchMeta::new(
                format!("site-{site:02}"),
                format!("provider-{provider}"),
                format!("uid-{site}-{provider}"),
                Fence::new(T0 - 60_000, sequence),
                rows.len() as u64,
                3,
                now,
            )
            .unwrap();
            Batch::new(meta, rows).write(&mut out);
        }
    }
    out
}

/// Allocations and reallocations made while `f` runs.
fn counted<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let region = Region::new(GLOBAL);
    let out = f();
    let stats = region.change();
    (out, stats.allocations + stats.reallocations)
}

fn reingesting_an_exact_repeat_allocates_nothing() {
    let sites = 50;
    let first = body(sites, 0, T0);
    let mut store = Store::new(StoreConfig::default());
    let stored = store.ingest(&first, Sender::Local, T0, T0);
    assert_eq!(stored.rows_stored, (sites * PROVIDERS * ROWS) as u64);
    while store.poll_event().is_some() {}
    for later in [500, 1_000, 1_500] {
        let (report, allocations) = counted(|| store.ingest(&first, Sender::Local, T0, T0 + later));
        assert_eq!(
            report,
            IngestReport {
                batches_repeated: (sites * PROVIDERS) as u64,
                ..IngestReport::default()
            }
        );
        assert_eq!(
            allocations,
            0,
            "a repeat of {} rows",
            sites * PROVIDERS * ROWS
        );
    }
}

/// Allocations of one advance of every provider, once every window is full (a full
/// window no longer grows, so what is left is ingest's own).
fn advance_allocations(sites: usize) -> usize {
    let mut store = Store::new(StoreConfig::default());
    let warm = MAX_SAMPLES_PER_SERIES as u64;
    for sequence in 0..warm {
        let now = T0 + sequence * 100;
        store.ingest(&body(sites, sequence, now), Sender::Local, now, now);
    }
    while store.poll_event().is_some() {}
    let now = T0 + warm * 100;
    let next = body(sites, warm, now);
    let (report, allocations) = counted(|| store.ingest(&next, Sender::Local, now, now));
    assert_eq!(report.rows_stored, (sites * PROVIDERS * ROWS) as u64);
    assert_eq!(report.dropped.total(), 0);
    allocations
}

fn advancing_a_warm_store_allocates_a_constant_per_body() {
    // The row buffers of one body: a handful of allocations, whatever its size.
    let small = advance_allocations(1);
    let large = advance_allocations(50);
    assert!(small <= 16, "{small} allocations for {ROWS} rows");
    assert_eq!(large, small, "{} rows", 50 * PROVIDERS * ROWS);
}

fn the_counter_sees_allocations() {
    let (v, allocations) = counted(|| std::hint::black_box(vec![1u8; 64]));
    assert_eq!(allocations, 1);
    drop(v);
}

/// Runs without libtest's harness (`harness = false`): the harness's own threads allocate
/// at moments of their choosing, and a global counter cannot tell their allocations from
/// ours, so the only thread alive while counting is this one.
fn main() {
    let tests: [(&str, fn()); 3] = [
        ("the_counter_sees_allocations", the_counter_sees_allocations),
        (
            "reingesting_an_exact_repeat_allocates_nothing",
            reingesting_an_exact_repeat_allocates_nothing,
        ),
        (
            "advancing_a_warm_store_allocates_a_constant_per_body",
            advancing_a_warm_store_allocates_a_constant_per_body,
        ),
    ];
    for (name, test) in tests {
        test();
        println!("test {name} ... ok");
    }
    println!("{} passed, 0 failed", tests.len());
}
