//! `maxConnectionsPerSite`: a request past a site's cap waits the connect bound for a
//! slot, then fails over as a failed connect does, and is counted; a slot frees when its
//! answer ends.

use std::time::Duration;

use bytes::Bytes;
use grid_kit::gateway_harness::fake_model::FakeModel;
use grid_kit::gateway_harness::{get, http1_client, one, post, send, start_gateway};
use http::StatusCode;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
const STREAM: &str = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

/// A streamed answer through `gw`, its first event read: its request holds its site's
/// slot until the rest is.
async fn first_event(
    c: &Client<HttpConnector, Full<Bytes>>,
    gw: &grid_kit::gateway_harness::Harness,
) -> hyper::body::Incoming {
    let streaming = tokio::time::timeout(
        Duration::from_secs(10),
        c.request(post(&gw.url("/v1/chat/completions"), STREAM)),
    )
    .await
    .unwrap()
    .unwrap();
    let mut body = streaming.into_body();
    let _first = body.frame().await.unwrap().unwrap();
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_a_sites_cap_fails_over_after_the_connect_bound_and_is_counted() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(
        |c| {
            c.max_connections_per_site = 1;
            c.connect_timeout_ms = 200;
        },
        &[("m", one("a", up.base_url()))],
    )
    .await;
    let c = http1_client();
    // A stream holds a's only slot until its last event.
    let body = first_event(&c, &gw).await;
    let full = send(&c, post(&gw.url("/v1/chat/completions"), CHAT)).await;
    assert_eq!(full.status, StatusCode::BAD_GATEWAY, "nowhere else to go");
    let metrics = send(&c, get(&gw.url("/metrics"))).await;
    let text = String::from_utf8(metrics.body.to_vec()).unwrap();
    assert!(
        text.contains(r#"grid_gateway_upstream_failures_total{site="a",reason="site_full"} 1"#),
        "{text}"
    );
    // The stream ends, its slot frees, and the next request is served.
    body.collect().await.unwrap();
    let next = send(&c, post(&gw.url("/v1/chat/completions"), CHAT)).await;
    assert_eq!(next.status, StatusCode::OK);
    gw.shutdown().await;
}

/// This gateway's requests outstanding at candidate (m, `site`), as its routing reads
/// them (the live slot's count of requests sent and not yet ended), read without draining
/// the slot's evidence, which the gateway's own refresh takes.
fn outstanding(gw: &grid_kit::gateway_harness::Harness, site: &str) -> u32 {
    gw.gateway
        .as_ref()
        .unwrap()
        .published()
        .load()
        .catalog()
        .get("m")
        .and_then(|m| m.upstreams.iter().find(|u| &*u.site == site))
        .map(|u| u.live().outstanding())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_counts_as_outstanding_at_its_site_until_its_answer_ends_and_a_failed_one_until_it_fails()
 {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(
        |c| {
            c.connect_timeout_ms = 200;
            c.upstream_headers_timeout_ms = 300;
        },
        &[("m", one("a", up.base_url()))],
    )
    .await;
    let c = http1_client();
    assert_eq!(outstanding(&gw, "a"), 0);
    // A stream stays outstanding past its head, until its last event.
    let body = first_event(&c, &gw).await;
    assert_eq!(outstanding(&gw, "a"), 1, "the stream is under way");
    body.collect().await.unwrap();
    // The answer's end reaches the gateway's side of the exchange a moment after the
    // client's.
    let ended = tokio::time::Instant::now();
    while outstanding(&gw, "a") != 0 {
        assert!(
            ended.elapsed() < Duration::from_secs(5),
            "the stream's end is counted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A plain answer, and one the site never heads (cut by the head bound), both end.
    assert_eq!(
        send(&c, post(&gw.url("/v1/chat/completions"), CHAT))
            .await
            .status,
        StatusCode::OK
    );
    up.set_behaviour(grid_kit::gateway_harness::fake_model::Behaviour::HangBeforeHead);
    let hung = send(&c, post(&gw.url("/v1/chat/completions"), CHAT)).await;
    assert!(hung.status.is_server_error(), "{}", hung.status);
    assert_eq!(
        outstanding(&gw, "a"),
        0,
        "every exchange that ended is counted out"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_one_of_its_sites_slots_counts_as_outstanding_there_until_its_wait_fails()
 {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(
        |c| {
            c.max_connections_per_site = 1;
            // The slot wait: long enough to read the count while the request waits.
            c.connect_timeout_ms = 3_000;
        },
        &[("m", one("a", up.base_url()))],
    )
    .await;
    let c = http1_client();
    // A stream stalled after its first event holds a's only slot.
    up.set_behaviour(grid_kit::gateway_harness::fake_model::Behaviour::StallStream);
    let body = first_event(&c, &gw).await;
    assert_eq!(outstanding(&gw, "a"), 1, "the stream is under way");
    let waiting = {
        let c = c.clone();
        let req = post(&gw.url("/v1/chat/completions"), CHAT);
        tokio::spawn(async move { send(&c, req).await })
    };
    // Bound to a, it counts there while it waits for the slot: the picks that follow
    // weigh a by it. Read until its wait fails (the connect bound), at most 10 s.
    let sent = tokio::time::Instant::now();
    while outstanding(&gw, "a") != 2 {
        assert!(
            !waiting.is_finished() && sent.elapsed() < Duration::from_secs(10),
            "the waiting request is never counted at its site"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let failed = waiting.await.unwrap();
    assert_eq!(failed.status, StatusCode::BAD_GATEWAY, "nowhere else to go");
    assert_eq!(
        outstanding(&gw, "a"),
        1,
        "its wait failed, and it is counted out; the stream still holds the slot"
    );
    drop(body);
    gw.shutdown().await;
}
