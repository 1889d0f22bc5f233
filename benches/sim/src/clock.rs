//! The one place this crate reads the clock: the component benches' timing loops. The
//! simulator itself runs in virtual time.

use std::time::{Duration, Instant};

/// Time `f` over `iterations` calls and return the mean cost of one call in nanoseconds.
#[allow(
    clippy::disallowed_methods,
    reason = "the benches' one named clock read"
)]
pub fn mean_ns(iterations: u32, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..iterations {
        f();
    }
    nanos(start.elapsed()) / f64::from(iterations.max(1))
}

fn nanos(d: Duration) -> f64 {
    d.as_secs_f64() * 1e9
}

/// Median and minimum of `batches` runs of [`mean_ns`], in ns per call. The median is
/// robust to a noisy neighbour on a shared machine; the minimum is the batch least
/// disturbed by other processes, the closest to the uncontended cost.
pub fn batch_ns(batches: usize, iterations: u32, mut f: impl FnMut()) -> (f64, f64) {
    let mut samples: Vec<f64> = (0..batches.max(1))
        .map(|_| mean_ns(iterations, &mut f))
        .collect();
    samples.sort_by(f64::total_cmp);
    (samples[samples.len() / 2], samples[0])
}

/// Wall seconds `f` took, for a run's progress line.
#[allow(
    clippy::disallowed_methods,
    reason = "the benches' one named clock read"
)]
pub fn seconds<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed().as_secs_f64())
}
