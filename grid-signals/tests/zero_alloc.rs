//! The strict path allocates nothing: parsing every sample of a real scrape and of a
//! large EPP-shaped body, and looking at every label of every sample, makes zero heap
//! allocations. Counted by a wrapping global allocator; this file holds one test so no
//! other test allocates while it counts.

use std::alloc::System;
use std::fmt::Write as _;
use std::path::Path;

use grid_signals::exposition::{LabelValue, samples};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn fixture(relative: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures")
        .join(relative);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// An EPP-shaped body with many labels, escapes and `", "` separators, built up front.
fn epp_like() -> Vec<u8> {
    let mut body = String::from("# HELP q Queue.\n# TYPE q gauge\n");
    for i in 0..2000 {
        let _ = write!(
            body,
            "q{{pod=\"vllm-{i}\", model=\"m\\\"{}\\\"\", ns=\"a\\\\b\", zone=\"z\\n{}\",le=\"+Inf\",}} {}.5 {}\r\n",
            i % 7,
            i % 3,
            i,
            1_700_000_000_000u64 + i
        );
    }
    body.into_bytes()
}

/// Walks every sample and every label the way a consumer would, without allocating.
fn consume(body: &[u8]) -> (usize, f64) {
    let mut labels = 0usize;
    let mut sum = 0.0;
    for sample in samples(body) {
        let sample = sample.expect("fixture parses");
        for (name, value) in sample.labels {
            labels += name.len() + usize::from(value.eq_str("+Inf")) + value.raw().len();
        }
        let le: Option<LabelValue<'_>> = sample.labels.get("le");
        labels += usize::from(le.is_some());
        sum += sample.value + sample.timestamp_ms.unwrap_or(0) as f64;
    }
    (labels, sum)
}

fn strict_parsing_allocates_nothing_per_sample() {
    let bodies = [
        fixture("prometheus/alltypes.237mfs.prom.txt"),
        fixture("epp/llm_d_request_ttft_seconds_metric"),
        fixture("epp/flow_control_enqueue_duration_seconds_metric"),
        epp_like(),
    ];
    for body in &bodies {
        let region = Region::new(GLOBAL);
        let (labels, sum) = consume(body);
        let stats = region.change();
        assert!(labels > 0);
        std::hint::black_box(sum);
        assert_eq!(stats.allocations, 0, "{stats:?}");
        assert_eq!(stats.reallocations, 0, "{stats:?}");
    }
    // A line refused for a repeated label name (the check's slow path) allocates nothing
    // either: the error is plain data.
    let region = Region::new(GLOBAL);
    let refused = samples(b"m{a=\"1\", b=\"2\", a=\"3\"} 1\n").next();
    let stats = region.change();
    assert!(matches!(refused, Some(Err(_))), "{refused:?}");
    assert_eq!(stats.allocations, 0, "{stats:?}");
    // The counter works: an allocation in a region is seen.
    let region = Region::new(GLOBAL);
    let v = std::hint::black_box(vec![1u8; 64]);
    assert_eq!(region.change().allocations, 1);
    drop(v);
}

/// Runs without libtest's harness (`harness = false`): the harness's own threads allocate
/// at moments of their choosing, and a global counter cannot tell their allocations from
/// ours, so the only thread alive while counting is this one.
fn main() {
    strict_parsing_allocates_nothing_per_sample();
    println!("test strict_parsing_allocates_nothing_per_sample ... ok");
    println!("1 passed, 0 failed");
}
