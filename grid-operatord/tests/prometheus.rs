//! Debian's `prometheus` package (installed by `.ci/install`) checks the operator's
//! `/metrics` while it holds provider series of two sites: `promtool check metrics` finds
//! no problem, and a real Prometheus server scrapes it (negotiating `OpenMetrics`) and can
//! query the provider series. Missing binaries fail the tests: CI must not pass without
//! the checks.

use std::process::{Command, Stdio};
use std::sync::Arc;

use grid_kit::epp_server::{Behaviour, FakeEpp};
use grid_kit::operator_harness::{
    Grid, ProviderSpec, Site, epp_body, eventually, get_metrics, signals_url,
};
use grid_operatord::driver::{self, Options, Running};
use grid_operatord::state::{FileStateStore, StateStore};

/// Two running operators and what they scrape; everything stops when dropped.
struct TwoSites {
    /// a's `/metrics`.
    addr: std::net::SocketAddr,
    _running: (Running, Running),
    _epps: (FakeEpp, FakeEpp),
    _sites: (Site, Site),
}

/// Two operators: a scrapes a fake EPP and polls b, which scrapes another. Returns once
/// a's `/metrics` holds both sites' provider series.
async fn two_sites(grid: &Grid) -> TwoSites {
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
    TwoSites {
        addr,
        _running: (op_a, op_b),
        _epps: (epp_a, epp_b),
        _sites: (a, b),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_finds_no_problem_in_the_operator_metrics() {
    let grid = Grid::new();
    let sites = two_sites(&grid).await;
    let addr = sites.addr;
    let metrics = get_metrics(addr).await;
    if let Err(report) = grid_kit::promtool::check_metrics(&metrics) {
        panic!("{report}");
    }
}

/// A Prometheus server we started; killed (by its own pid) when dropped.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_server_scrapes_and_queries_the_operator() {
    let grid = Grid::new();
    let sites = two_sites(&grid).await;
    let addr = sites.addr;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: operator\n    static_configs:\n      - targets: ['{addr}']\n"
        ),
    )
    .unwrap();
    let web = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={web}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus is installed (bash .ci/install adds Debian's prometheus package)");
    let _server = Server(child);
    let query = |q: &'static str| async move {
        let url = format!("http://{web}/api/v1/query?query={q}");
        let fetched = grid_daemon::client::fetch(&grid_daemon::client::FetchTarget::new(
            url.parse().unwrap(),
            std::time::Duration::from_secs(2),
            None,
        ))
        .await
        .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&fetched.body).ok()?;
        Some(v["data"]["result"].as_array()?.clone())
    };
    eventually(
        "prometheus scraped the operator (up == 1)",
        60,
        || async move {
            query("up")
                .await
                .is_some_and(|r| r.iter().any(|s| s["value"][1] == "1"))
        },
    )
    .await;
    eventually(
        "prometheus holds both sites' readiness",
        30,
        || async move {
            query("grid_provider_ready").await.is_some_and(|r| {
                let sites: Vec<_> = r
                    .iter()
                    .filter_map(|s| s["metric"]["grid_site"].as_str())
                    .collect();
                sites.contains(&"a") && sites.contains(&"b")
            })
        },
    )
    .await;
    let counters = query("grid_operator_scrapes_total").await.unwrap();
    assert!(
        !counters.is_empty(),
        "counters scraped under their _total names"
    );
}
