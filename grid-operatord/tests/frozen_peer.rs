//! A frozen peer, for real: a peer operator process stopped with SIGSTOP (a stuck host, a
//! debugger, a cgroup freeze) makes its polls time out without stopping the poller, and
//! once continued it is polled again and its rows come back. The frozen process itself
//! then still stops cleanly.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use grid_kit::daemon_process::{Daemon, log_field};
use grid_kit::epp_server::{Behaviour, FakeEpp};
use grid_kit::operator_harness::{Grid, ProviderSpec, epp_body, eventually, signals_url};
use grid_operatord::driver::{self, Options};
use grid_operatord::peers::PollOutcome;
use grid_operatord::state::{FileStateStore, StateStore};
use grid_signals::epp::ScrapeFailure;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_frozen_by_sigstop_times_out_and_is_polled_again_once_continued() {
    let grid = Grid::new();
    let (a, b) = (grid.site("a"), grid.site("b"));
    let epp_b = FakeEpp::start(Behaviour::Body(epp_body(7, 1.0))).await;
    let spec = ProviderSpec {
        name: "mistral".into(),
        url: epp_b.url(),
        timeout_s: 1.0,
    };
    // b, a real process, admits a as a peer (it never reaches it: only a polls).
    let path = b.dir.path().join("operator.toml");
    std::fs::write(
        &path,
        b.config_text(
            &[("a", "https://127.0.0.1:1/v1/site/signals".into())],
            &[spec],
        ),
    )
    .unwrap();
    let mut op_b = Daemon::spawn(
        Path::new(env!("CARGO_BIN_EXE_grid-operatord")),
        &["--config", path.to_str().unwrap()],
    );
    let line = op_b.wait_for_line("operator started", Duration::from_secs(20));
    let b_addr: std::net::SocketAddr = log_field(&line, "signals_addr").unwrap().parse().unwrap();
    let state: Arc<dyn StateStore> = Arc::new(FileStateStore::open(a.state_dir()).unwrap());
    let op_a = driver::start(
        a.config(&[("b", signals_url(b_addr))], &[]),
        None,
        state,
        Options::default(),
    )
    .await
    .unwrap();
    let polls = op_a.metrics.polls.clone();
    eventually("a polls b", 15, || {
        let polls = polls.clone();
        async move { polls.count("b", PollOutcome::Ok) >= 1 }
    })
    .await;

    op_b.signal("STOP");
    eventually("a's polls of the frozen b time out", 15, || {
        let polls = polls.clone();
        async move { polls.count("b", PollOutcome::Failed(ScrapeFailure::Timeout)) >= 1 }
    })
    .await;
    let ok_while_frozen = polls.count("b", PollOutcome::Ok);
    op_b.signal("CONT");
    eventually("a polls b again once it runs", 15, || {
        let polls = polls.clone();
        async move { polls.count("b", PollOutcome::Ok) > ok_while_frozen }
    })
    .await;

    op_b.signal("TERM");
    let status = op_b.wait_exit(Duration::from_secs(15)).expect("it exits");
    assert!(status.success(), "{}", op_b.seen.join("\n"));
}
