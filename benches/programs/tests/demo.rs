//! `grid-demo`'s run on a short clock: the outage scenario unfolds and is seen at the
//! gateway, the plain lines are printed, the plot is written, and a stop request ends the
//! run early and cleanly. Short cadences; every wait bounded.

use std::time::Duration;

use grid_kit::local_grid::Cadence;
use grid_programs::demo::scenario::Scenario;
use grid_programs::demo::{self, DemoConfig};

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
    assert_eq!(report.plot, dir.path().join("demo.svg"));
    // Each step applied is labelled on the plot, by its short text.
    for label in ["a loses endpoints", "a restored"] {
        assert!(svg.contains(&format!(">\n{label}\n</text>")), "{label}");
    }
    // Halfway through the outage, the gateway's routing evidence says why a is out.
    let during = report
        .evidence
        .iter()
        .find(|e| e.step == "a loses endpoints")
        .unwrap_or_else(|| panic!("{:?}", report.evidence));
    let a = during.document.models[0]
        .candidates
        .iter()
        .find(|c| c.site == "a")
        .unwrap();
    let reason = a.excluded.as_ref().map(|x| x.reason.as_str());
    assert!(
        matches!(reason, Some("no_ready_endpoints" | "not_ready")),
        "{during:#?}"
    );
    assert_eq!(a.standing, "excluded");
    assert!(a.next_share.abs() < f64::EPSILON);
    assert!(text.contains("routing evidence t="), "{text}");
    assert!(text.contains("excluded: no_ready_endpoints") || text.contains("excluded: not_ready"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn halfway_through_the_degrade_step_the_evidence_keeps_b_in_selection_and_names_every_site() {
    let dir = tempfile::tempdir().unwrap();
    let config = DemoConfig {
        scenario: Scenario::Degrade,
        ..config(dir.path(), 12)
    };
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let mut out = Vec::new();
    let report = tokio::time::timeout(
        Duration::from_secs(60),
        demo::run(&config, stopped, &mut out),
    )
    .await
    .expect("the run ends by itself")
    .expect("the run succeeds");
    let during = report
        .evidence
        .iter()
        .find(|e| e.step == "b degrades")
        .unwrap_or_else(|| panic!("{:?}", report.evidence));
    let model = &during.document.models[0];
    let sites: Vec<&str> = model.candidates.iter().map(|c| c.site.as_str()).collect();
    for site in ["a", "b", "c"] {
        assert!(sites.contains(&site), "{model:#?}");
    }
    // A slower site is weighted down, not excluded: it answers.
    let b = model.candidates.iter().find(|c| c.site == "b").unwrap();
    assert!(b.excluded.is_none(), "{model:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_legend_is_printed_once_before_the_run_and_a_relative_plot_path_comes_back_absolute() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), 600);
    // The same file, named relative to the current directory (the package's, under
    // cargo test): up to the root, then down to the temporary directory.
    let cwd = std::env::current_dir().unwrap();
    let mut relative = std::path::PathBuf::new();
    for _ in cwd.components().skip(1) {
        relative.push("..");
    }
    relative.push(dir.path().strip_prefix("/").unwrap());
    relative.push("relative.svg");
    assert!(relative.is_relative());
    config.plot = relative;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    // Stopped before the grid has been measured: the legend comes before anything else.
    let _ = stop.send(true);
    let mut out = Vec::new();
    let report = tokio::time::timeout(
        Duration::from_secs(40),
        demo::run(&config, stopped, &mut out),
    )
    .await
    .expect("the stop is honoured")
    .expect("the run succeeds");
    let text = String::from_utf8(out).unwrap();
    let legend = demo::screen::legend();
    assert_eq!(text.matches(&legend).count(), 1, "{text}");
    assert!(
        text.find(&legend) < text.find("gateway on http://"),
        "{text}"
    );
    assert!(report.plot.is_absolute(), "{}", report.plot.display());
    assert_eq!(
        report.plot,
        std::fs::canonicalize(dir.path())
            .unwrap()
            .join("relative.svg")
    );
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
