//! The real operator process under SIGTERM: it stops every task, persists its fences once
//! more and exits 0 (a supervisor's stop is not a crash).

use std::path::Path;
use std::time::Duration;

use grid_kit::daemon_process::{Daemon, log_field};
use grid_kit::epp_server::{Behaviour, FakeEpp};
use grid_kit::gateway_harness::{get, http1_client, send};
use grid_kit::operator_harness::{Grid, ProviderSpec, epp_body, eventually};
use grid_operatord::state::FENCES_FILE;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_run_logs_no_warning_and_sigterm_persists_the_fences_and_exits_zero() {
    let grid = Grid::new();
    let a = grid.site("a");
    let epp = FakeEpp::start(Behaviour::Body(epp_body(2, 1.0))).await;
    let text = a.config_text(
        &[],
        &[ProviderSpec {
            name: "llama".into(),
            url: epp.url(),
            timeout_s: 1.0,
        }],
    );
    let path = a.dir.path().join("operator.toml");
    std::fs::write(&path, text).unwrap();
    let mut op = Daemon::spawn(
        Path::new(env!("CARGO_BIN_EXE_grid-operatord")),
        &["--config", path.to_str().unwrap()],
    );
    let line = op.wait_for_line("operator started", Duration::from_secs(20));
    let metrics = log_field(&line, "metrics_addr").unwrap().to_owned();
    let c = http1_client();
    eventually("a complete scrape pass", 10, || {
        let (c, u) = (c.clone(), format!("http://{metrics}/readyz"));
        async move { send(&c, get(&u)).await.status == 200 }
    })
    .await;
    let fences = a.state_dir().join(FENCES_FILE);
    let _ = std::fs::remove_file(&fences);
    op.signal("TERM");
    let status = op.wait_exit(Duration::from_secs(15)).expect("it exits");
    assert!(status.success(), "{status:?}\n{}", op.seen.join("\n"));
    let written = std::fs::read_to_string(&fences).expect("fences persisted at the stop");
    assert!(written.contains("llama"), "{written}");
    assert!(
        op.loud_lines().is_empty(),
        "a healthy run warned:\n{}",
        op.seen.join("\n")
    );
}
