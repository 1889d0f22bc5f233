//! The gateway's `/metrics` answers as the operator's does (text 0.0.4 that promtool
//! accepts unless `Accept` asks for `OpenMetrics`), and its probes tell a Kubernetes
//! kubelet what it needs: `/healthz` while serving, `/readyz` once a poll fed routing.

use grid_kit::gateway_harness::fake_model::FakeModel;
use grid_kit::gateway_harness::{http1_client, one, send, start_gateway};
use http::{Request, StatusCode};
use http_body_util::Full;

#[tokio::test]
async fn metrics_without_accept_are_text_004_that_promtool_accepts() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let a = send(
        &http1_client(),
        grid_kit::gateway_harness::get(&gw.url("/metrics")),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.headers["content-type"],
        grid_daemon::exposition::TEXT_CONTENT_TYPE
    );
    let text = String::from_utf8(a.body.to_vec()).unwrap();
    assert!(!text.contains("# EOF"), "{text}");
    if let Err(report) = grid_kit::promtool::check_metrics(&text) {
        panic!("{report}");
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn metrics_asked_for_openmetrics_are_openmetrics() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let req = Request::get(gw.url("/metrics"))
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )
        .body(Full::default())
        .unwrap();
    let a = send(&http1_client(), req).await;
    assert_eq!(
        a.headers["content-type"],
        grid_daemon::exposition::OPENMETRICS_CONTENT_TYPE
    );
    assert!(a.body.ends_with(b"# EOF\n"));
    gw.shutdown().await;
}

#[tokio::test]
async fn readyz_is_200_once_a_poll_was_attempted_and_reports_a_failing_operator_beside_it() {
    let up = FakeModel::start("a").await;
    // The harness's operator URL is a closed port: no poll ever succeeds. The gateway
    // still serves (by capacity, without signals), so it is ready: a readiness probe that
    // failed with the signals would take every gateway out at once.
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let c = http1_client();
    let health = send(&c, grid_kit::gateway_harness::get(&gw.url("/healthz"))).await;
    assert_eq!(health.status, StatusCode::OK);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let body = loop {
        let ready = send(&c, grid_kit::gateway_harness::get(&gw.url("/readyz"))).await;
        let body = String::from_utf8_lossy(&ready.body).into_owned();
        if ready.status == StatusCode::OK {
            break body;
        }
        assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(
            body.contains("no poll of the operator has been attempted"),
            "{body}"
        );
        assert!(tokio::time::Instant::now() < deadline, "{body}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(body.starts_with("ok\n"), "{body}");
    assert!(body.contains("operator: the last poll failed"), "{body}");
    assert!(body.contains("model m: routed without signals"), "{body}");
    // And it routes.
    let a = send(
        &c,
        grid_kit::gateway_harness::post(&gw.url("/v1/chat/completions"), r#"{"model":"m"}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    gw.shutdown().await;
}

#[tokio::test]
async fn per_model_gauges_are_there_before_the_first_poll_ends() {
    let up = FakeModel::start("a").await;
    // An operator that takes connections and never answers: the first poll is still
    // waiting when /metrics is read, until its connect bound (`connectTimeoutMs`, 2 s by
    // default) gives up on the handshake. A closed port fails at once, which raced the
    // read.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let operator = format!("https://{}", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            open.push(s);
        }
    });
    let gw = start_gateway(
        |c| c.operator.url = operator,
        &[("m", one("a", up.base_url()))],
    )
    .await;
    let c = http1_client();
    let a = send(&c, grid_kit::gateway_harness::get(&gw.url("/metrics"))).await;
    let text = String::from_utf8(a.body.to_vec()).unwrap();
    assert!(
        text.contains("grid_gateway_polls_total{result=\"timeout\"} 0"),
        "no poll has ended yet: {text}"
    );
    assert!(
        text.contains("grid_gateway_model_shedding{model=\"m\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("grid_gateway_model_routable{model=\"m\"} 1"),
        "{text}"
    );
    gw.shutdown().await;
    held.abort();
}
