//! The soak's two-minute form: the whole local grid, every daemon a process of its own,
//! under the demo's traffic with bursts and faults, beside an operator scraping a 1 MiB
//! exposition every second, judged by the soak's own rules (`grid_programs::soak::verdict`).
//! It fails when any daemon's memory, descriptors, `/metrics` series or threads grew
//! after the warm-up.
//!
//! It runs the daemons' binaries that `cargo test --workspace` builds beside this test's
//! own directory (alone: `cargo build -p grid-gatewayd -p grid-operatord` first).
//!
//! # Why it catches a leak and not the noise
//!
//! [`CI_SOAK`] is four 30 s cycles: the first is warm-up, the second the baseline window,
//! the fourth the late window, so the two compared medians lie 60 s apart. The traffic
//! is the demo's: 0.4 of the grid's nominal 30.9 requests/s outside bursts and 3.5 times
//! that for a fifth of each cycle, about 18 requests/s on average, every one of them
//! read whole by the gateway. A gateway keeping 4 KiB of each request grows by
//! 18 x 60 x 4 KiB = 4.2 MiB between the two medians; the rule allows 5% of its median
//! resident memory (about 1 MiB for a gateway of some 20 MiB in a debug build), so it
//! catches a leak down to about 1 KiB a request. Against the noise: both windows hold a
//! whole cycle each, with the same steps at the same offsets, so the bursts and faults
//! weigh the same in both medians, and a median ignores the few samples a loaded machine
//! delays; descriptors get 10% plus 8 for the pooled connections a burst leaves open,
//! threads 2 for a runtime's blocking pool.

use std::time::Duration;

use grid_programs::soak::{self, SoakConfig, grid::Binaries};

/// The soak's length in the test suite: a warm-up cycle and three judged ones.
const CI_SOAK: Duration = Duration::from_secs(120);
/// How long the whole test may take: the soak, start-up and shutdown.
const CI_LIMIT: Duration = Duration::from_secs(240);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_minutes_of_traffic_bursts_and_faults_grow_no_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let binaries = Binaries::beside_this_program().unwrap();
    let config = SoakConfig::new(CI_SOAK, dir.path().to_owned(), binaries);
    let mut out = std::io::stdout();
    let report = tokio::time::timeout(CI_LIMIT, soak::run(&config, &mut out))
        .await
        .expect("the soak ends in time")
        .expect("the soak runs");
    let summary = report.summary();
    println!("{summary}");
    assert!(report.passed(), "{summary}");
    assert!(report.big_scrapes.unwrap_or(0) >= 100, "{summary}");
    assert!(report.files.iter().all(|f| f.is_file()), "{summary}");
}
