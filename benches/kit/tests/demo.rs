//! `grid-demo`'s run on a short clock: the outage scenario unfolds and is seen at the
//! gateway, the plain lines are printed, the plot is written, and a stop request ends the
//! run early and cleanly. Short cadences; every wait bounded.

use std::time::Duration;

use grid_kit::demo::scenario::Scenario;
use grid_kit::demo::{self, DemoConfig};
use grid_kit::local_grid::Cadence;

fn config(dir: &std::path::Path, seconds: u64) -> DemoConfig {
    DemoConfig {
        duration: Duration::from_secs(seconds),
        load: 0.3,
        scenario: Scenario::Outage,
        plot: dir.join("demo.svg"),
        cadence: Cadence::FAST,
        seed: 3,
        live: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_outage_run_shows_the_site_leave_and_rejoin_and_writes_its_plot() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 12);
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let mut out = Vec::new();
    let report = tokio::time::timeout(
        Duration::from_secs(60),
        demo::run(&config, stopped, &mut out),
    )
    .await
    .expect("the run ends by itself")
    .expect("the run succeeds");
    let text = String::from_utf8(out).unwrap();
    assert!(!report.interrupted);
    let events: Vec<&str> = report.events.iter().map(|e| e.text.as_str()).collect();
    let dropped = events
        .iter()
        .position(|e| *e == ">> a loses all its endpoints")
        .unwrap_or_else(|| panic!("{events:?}"));
    let left = events
        .iter()
        .position(|e| e.starts_with("a left selection"))
        .unwrap_or_else(|| panic!("{events:?}"));
    let back = events
        .iter()
        .rposition(|e| e.starts_with("a is in selection"))
        .unwrap_or_else(|| panic!("{events:?}"));
    assert!(dropped < left && left < back, "{events:?}");
    // One plain line per second, each naming every site.
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("t=")).collect();
    assert!(lines.len() >= 9, "{text}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("| a ") && l.contains("| c "))
    );
    assert!(report.served.iter().map(|(_, n)| n).sum::<u64>() > 0);
    let svg = std::fs::read_to_string(&report.plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("rho per site"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_request_ends_the_run_early_and_still_writes_the_plot() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 600);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(8)).await;
        let _ = stop.send(true);
    });
    let mut out = Vec::new();
    let report = tokio::time::timeout(
        Duration::from_secs(40),
        demo::run(&config, stopped, &mut out),
    )
    .await
    .expect("the stop is honoured")
    .expect("the run succeeds");
    assert!(report.interrupted);
    assert!(report.plot.exists());
}
