//! A healthy start is quiet: the real gateway binary, polling a healthy operator, logs
//! nothing at WARN or above (a newcomer must be able to read any warning as a problem).
//! It runs without transparent huge pages (each one's first touch zeroes 2 MiB on the
//! request path).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use grid_kit::daemon_process::Daemon;
use grid_kit::epp_server::{Behaviour, FakeEpp};
use grid_kit::gateway_harness::fake_model::FakeModel;
use grid_kit::operator_harness::{Grid, ProviderSpec, epp_body};
use grid_operatord::driver::{self, Options};
use grid_operatord::state::{FileStateStore, StateStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_start_logs_no_warning_and_runs_without_transparent_huge_pages() {
    let grid = Grid::new();
    let a = grid.site("a");
    let epp = FakeEpp::start(Behaviour::Body(epp_body(2, 1.0))).await;
    let provider = ProviderSpec {
        name: "p".into(),
        url: epp.url(),
        timeout_s: 1.0,
    };
    let state: Arc<dyn StateStore> = Arc::new(FileStateStore::open(a.state_dir()).unwrap());
    let op = driver::start(a.config(&[], &[provider]), None, state, Options::default())
        .await
        .unwrap();
    let model = FakeModel::start("a").await;
    let d = a.dir.path();
    let text = a.gateway_text(
        ("127.0.0.1:0", op.signals_addr.port(), 0.2),
        ("m", "p", &model.base_url()),
    );
    let path = d.join("gateway.toml");
    std::fs::write(&path, text).unwrap();
    let mut gw = Daemon::spawn(
        Path::new(env!("CARGO_BIN_EXE_grid-gatewayd")),
        &["--config", path.to_str().unwrap()],
    );
    gw.wait_for_line("gateway serving", Duration::from_secs(20));
    let status = std::fs::read_to_string(format!("/proc/{}/status", gw.pid())).unwrap();
    let thp = status.lines().find(|l| l.starts_with("THP_enabled:"));
    assert_eq!(
        thp.map(|l| l.split_whitespace().nth(1)),
        Some(Some("0")),
        "{status}"
    );
    // Several polls' worth of a healthy gateway.
    tokio::time::sleep(Duration::from_secs(2)).await;
    gw.signal("TERM");
    let status = gw.wait_exit(Duration::from_secs(40)).expect("it exits");
    assert!(status.success(), "{}", gw.seen.join("\n"));
    assert!(
        gw.loud_lines().is_empty(),
        "a healthy start warned:\n{}",
        gw.seen.join("\n")
    );
    assert!(
        gw.seen.iter().all(|l| !l.contains("poll failed")),
        "{}",
        gw.seen.join("\n")
    );
}
