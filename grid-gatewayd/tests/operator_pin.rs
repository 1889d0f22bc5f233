//! The gateway pins its operator in pin mode, as the operator pins its local gateway:
//! both present the site's own certificate, so the gateway needs no CA to reach its
//! operator, and any other certificate (even one the grid CA signed) is refused.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use grid_gateway::Config;
use grid_gateway::config::{Candidate, OperatorConfig, OperatorTrust, TlsFiles};
use grid_gateway::poller::PollResult;
use grid_gatewayd::driver;
use grid_kit::gateway_harness::fake_model::FakeModel;
use grid_kit::gateway_harness::fake_operator::{FakeOperator, SiteLoad};
use grid_kit::pki::{Ca, SiteFiles, server_config};

/// The gateway's config in pin mode: its own certificate, no `tls.ca`.
fn pinned_config(site: &SiteFiles, operator_url: &str, model_url: &str) -> Config {
    let mut operator = OperatorConfig::new(operator_url, "localhost");
    operator.poll_interval_ms = 100;
    let mut config = Config::new(
        "a",
        SocketAddr::from(([127, 0, 0, 1], 0)),
        operator,
        TlsFiles::new(&site.cert, &site.key, None::<PathBuf>),
    )
    .with_model("m", [Candidate::new("a", "p", model_url)]);
    config.trust = OperatorTrust::Pin;
    config.validate().unwrap();
    config
}

/// Polls of each result after the gateway ran for about a second against `operator`.
async fn polls_against(
    operator_files: &SiteFiles,
    gateway_files: &SiteFiles,
    ca: &Ca,
) -> (u64, u64) {
    let operator = FakeOperator::start(server_config(operator_files, &ca.pem())).await;
    operator.set("a", SiteLoad::idle());
    let model = FakeModel::start("a").await;
    let config = pinned_config(gateway_files, &operator.url(), &model.base_url());
    let gateway = driver::start(config).await.unwrap();
    let poll = gateway.handles().poll.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while poll.polls(PollResult::Ok) + poll.polls(PollResult::Transport) < 3
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let counts = (
        poll.polls(PollResult::Ok),
        poll.polls(PollResult::Transport),
    );
    tokio::time::timeout(Duration::from_secs(10), gateway.shutdown())
        .await
        .expect("gateway drains in time");
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_pin_mode_the_gateway_reaches_an_operator_presenting_the_sites_own_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("grid-ca");
    let site = ca.issue(dir.path(), "site-a", &["localhost"]);
    let (ok, transport) = polls_against(&site, &site, &ca).await;
    assert!(
        ok >= 1,
        "no poll succeeded ({transport} transport failures)"
    );
    assert_eq!(transport, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_pin_mode_the_gateway_refuses_an_operator_with_another_certificate_of_the_same_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("grid-ca");
    let site = ca.issue(dir.path(), "site-a", &["localhost"]);
    let other = ca.issue(dir.path(), "impostor", &["localhost"]);
    let (ok, transport) = polls_against(&other, &site, &ca).await;
    assert_eq!(
        ok, 0,
        "a certificate other than the site's own was accepted"
    );
    assert!(transport >= 1);
}
