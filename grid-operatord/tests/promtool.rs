//! `promtool check metrics` (Debian's `prometheus` package, installed by `.ci/install`)
//! accepts the operator's `/metrics` while it holds provider series of two sites. Missing
//! `promtool` fails the test: CI must not pass without the check.

mod support;

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::Arc;

use grid_operatord::driver::{self, Options};
use grid_operatord::state::{FileStateStore, StateStore};
use support::fake_epp::{Behaviour, FakeEpp};
use support::site::{Grid, ProviderSpec, epp_body, eventually, get_metrics, signals_url};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_finds_no_problem_in_the_operator_metrics() {
    let grid = Grid::new();
    let (a, b) = (grid.site("a"), grid.site("b"));
    let epp_a = FakeEpp::start(Behaviour::Body(epp_body(2, 1.0))).await;
    let epp_b = FakeEpp::start(Behaviour::Body(epp_body(3, 1.0))).await;
    let spec = |name: &str, epp: &FakeEpp| ProviderSpec {
        name: name.to_owned(),
        url: epp.url(),
        timeout_s: 1.0,
    };
    let start = |config, dir| async move {
        let state: Arc<dyn StateStore> = Arc::new(FileStateStore::open(dir).unwrap());
        driver::start(config, None, state, Options::default())
            .await
            .unwrap()
    };
    let op_b = start(
        b.config(
            &[("a", "https://127.0.0.1:1/v1/site/signals".into())],
            &[spec("mistral", &epp_b)],
        ),
        b.state_dir(),
    )
    .await;
    let op_a = start(
        a.config(
            &[("b", signals_url(op_b.signals_addr))],
            &[spec("llama", &epp_a)],
        ),
        a.state_dir(),
    )
    .await;
    let addr = op_a.metrics_addr;
    eventually("both sites on /metrics", 15, || async move {
        let m = get_metrics(addr).await;
        m.contains("grid_provider_ready{grid_site=\"b\"")
            && m.contains("grid_provider_ready{grid_site=\"a\"")
    })
    .await;
    let metrics = get_metrics(addr).await;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is installed (bash .ci/install adds Debian's prometheus package)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(metrics.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool: {report}\n--- metrics:\n{metrics}"
    );
    assert!(report.trim().is_empty(), "promtool: {report}");
}
