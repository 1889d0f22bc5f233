//! Starting the operator binary from a file: relative paths mean what the gateway's mean
//! (the configuration file's directory, whatever the working directory), and a start
//! that is refused has created nothing.

use std::path::Path;
use std::time::Duration;

use grid_kit::daemon_process::Daemon;
use grid_kit::operator_harness::{Grid, Site};

const BIN: &str = env!("CARGO_BIN_EXE_grid-operatord");

/// `site`'s configuration text with its files named relative to its directory.
fn relative_text(site: &Site, state: &str) -> String {
    site.config_text(&[], &[])
        .lines()
        .map(|l| {
            if l.starts_with("stateDir") {
                format!("stateDir = \"{state}\"")
            } else if l.starts_with("cert =") {
                "cert = \"site.crt\"".to_owned()
            } else if l.starts_with("key =") {
                "key = \"site.key\"".to_owned()
            } else if l.starts_with("ca =") {
                "ca = \"ca.crt\"".to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn relative_paths_are_read_from_the_configuration_files_directory_not_the_working_one() {
    let grid = Grid::new();
    let site = grid.site("a");
    let dir = site.dir.path();
    let text = relative_text(&site, "state");
    let config = dir.join("operator.toml");
    std::fs::write(&config, text).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let mut op = Daemon::spawn_in(
        Path::new(BIN),
        &["--config", config.to_str().unwrap()],
        Some(elsewhere.path()),
    );
    op.wait_for_line("operator started", Duration::from_secs(20));
    assert!(dir.join("state/publisher-epoch.json").exists());
    assert!(!elsewhere.path().join("state").exists());
    op.signal("TERM");
    let status = op.wait_exit(Duration::from_secs(15)).expect("it exits");
    assert!(status.success(), "{}", op.seen.join("\n"));
}

#[test]
fn a_start_refused_for_a_missing_certificate_creates_no_state_directory() {
    let grid = Grid::new();
    let site = grid.site("a");
    let dir = site.dir.path();
    std::fs::remove_file(dir.join("site.crt")).unwrap();
    let config = dir.join("operator.toml");
    let state = dir.join("state/nested");
    std::fs::write(&config, relative_text(&site, state.to_str().unwrap())).unwrap();
    let mut op = Daemon::spawn(Path::new(BIN), &["--config", config.to_str().unwrap()]);
    let status = op.wait_exit(Duration::from_secs(15)).expect("it exits");
    assert!(!status.success(), "{}", op.seen.join("\n"));
    assert!(
        op.seen.iter().any(|l| l.contains("site.crt")),
        "{}",
        op.seen.join("\n")
    );
    assert!(
        !dir.join("state").exists(),
        "a refused start created its stateDir"
    );
}
