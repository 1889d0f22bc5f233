//! Reloading the models (what SIGHUP does): a new model routes, and a candidate kept keeps
//! its live slot, so what its answers taught (and answers still streaming) carry over; a
//! configuration that does not validate is refused whole.

use std::sync::Arc;
use std::time::Duration;

use grid_kit::gateway_harness::fake_model::FakeModel;
use grid_kit::gateway_harness::{Cand, http1_client, post, send, start_gateway};
use http::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloaded_models_route_at_once_and_kept_candidates_keep_their_live_state() {
    let (a, b) = (FakeModel::start("a").await, FakeModel::start("b").await);
    let gw = start_gateway(|_| {}, &[("m", vec![Cand::at("a", a.base_url())])]).await;
    let running = gw.gateway.as_ref().unwrap();
    let slot = |model: &str, site: &str| {
        running
            .published()
            .load()
            .catalog()
            .get(model)
            .and_then(|m| m.upstreams.iter().find(|u| &*u.site == site))
            .map(grid_score::catalog::Upstream::live_shared)
    };
    let before = slot("m", "a").unwrap();
    let c = http1_client();
    let n = r#"{"model":"n","messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(
        send(&c, post(&gw.url("/v1/chat/completions"), n))
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    let reloaded = grid_kit::gateway_harness::config(
        gw.dir.path(),
        &gw.pki,
        "https://127.0.0.1:9",
        &[
            ("m", vec![Cand::at("a", a.base_url())]),
            ("n", vec![Cand::at("b", b.base_url())]),
        ],
    );
    running.reload_models(&reloaded).await.unwrap();
    let start = tokio::time::Instant::now();
    while slot("n", "b").is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the reload is published"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        Arc::ptr_eq(&before, &slot("m", "a").unwrap()),
        "a kept candidate keeps its live slot"
    );
    let answer = send(&c, post(&gw.url("/v1/chat/completions"), n)).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.site(), Some("b"));

    // A configuration that does not validate changes nothing.
    let mut broken = reloaded.clone();
    broken.models.clear();
    assert!(running.reload_models(&broken).await.is_err());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(slot("n", "b").is_some());
    gw.shutdown().await;
}
