//! The gateway's HTTP surface against fake model servers on loopback: routing, headers,
//! streaming, and every error answer that needs no signals.

use std::time::Duration;

use bytes::Bytes;
use grid_kit::gateway_harness::fake_model::{FakeModel, SSE_EVENTS, SSE_GAP};
use grid_kit::gateway_harness::{
    Cand, closed_port_url, get, http1_client, http2_client, one, post, send, start_gateway,
};
use http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Full};

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test]
async fn chat_completion_is_proxied_with_body_unchanged_and_site_header_added() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let body = format!("{CHAT}  \n");
    let req = Request::post(gw.url("/v1/chat/completions?trace=1"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-test")
        .header("x-grid-site", "b")
        .header("x-grid-priority", "high")
        .header("connection", "x-client-hop")
        .header("x-client-hop", "1")
        .header("x-request-id", "r1")
        .body(Full::new(Bytes::from(body.clone())))
        .unwrap();
    let a = send(&http1_client(), req).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.site(), Some("a"));
    assert_eq!(a.json()["choices"][0]["message"]["content"], "hello from a");
    // Response hop-by-hop headers (named in Connection) are not passed back.
    assert!(a.headers.get("x-upstream-hop").is_none());

    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(
        seen[0].body,
        body.as_bytes(),
        "body forwarded byte for byte"
    );
    let h = &seen[0].headers;
    assert_eq!(h["authorization"], "Bearer sk-test");
    assert_eq!(h["x-request-id"], "r1");
    assert!(
        h.get("x-grid-site").is_none() && h.get("x-grid-priority").is_none(),
        "{h:?}"
    );
    assert!(h.get("x-client-hop").is_none(), "{h:?}");
    gw.shutdown().await;
}

#[tokio::test]
async fn completions_and_embeddings_are_proxied_too() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let c = http1_client();
    let a = send(
        &c,
        post(&gw.url("/v1/completions"), r#"{"model":"m","prompt":"x"}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["object"], "text_completion");
    let a = send(
        &c,
        post(&gw.url("/v1/embeddings"), r#"{"input":"x","model":"m"}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["data"][0]["object"], "embedding");
    assert_eq!(a.site(), Some("a"));
    gw.shutdown().await;
}

#[tokio::test]
async fn http2_clients_are_served() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let a = send(&http2_client(), post(&gw.url("/v1/chat/completions"), CHAT)).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.site(), Some("a"));
    gw.shutdown().await;
}

#[tokio::test]
async fn streamed_answer_is_relayed_event_by_event_without_buffering() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    for client in [http1_client(), http2_client()] {
        let resp = tokio::time::timeout(
            grid_kit::gateway_harness::EXCHANGE_TIMEOUT,
            client.request(post(&gw.url("/v1/chat/completions"), body)),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        assert_eq!(resp.headers()["x-grid-site"], "a");
        let start = tokio::time::Instant::now();
        let mut body = resp.into_body();
        let mut text = String::new();
        let mut first_at = None;
        while let Some(frame) =
            tokio::time::timeout(grid_kit::gateway_harness::EXCHANGE_TIMEOUT, body.frame())
                .await
                .unwrap()
        {
            if let Ok(data) = frame.unwrap().into_data() {
                first_at.get_or_insert_with(|| start.elapsed());
                text.push_str(std::str::from_utf8(&data).unwrap());
            }
        }
        let total = start.elapsed();
        // The upstream spends (SSE_EVENTS - 1) gaps producing the stream; a buffering proxy
        // would deliver nothing before all of them passed.
        let produced = SSE_GAP * (SSE_EVENTS as u32 - 1);
        assert!(
            first_at.unwrap() < produced / 2,
            "first event after {first_at:?}, stream took {total:?}"
        );
        assert!(total + Duration::from_millis(20) >= produced, "{total:?}");
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.len(), SSE_EVENTS + 1, "{text}");
        assert_eq!(*events.last().unwrap(), "data: [DONE]");
        for (i, e) in events[..SSE_EVENTS].iter().enumerate() {
            assert!(e.contains(&format!("a-{i} ")), "{e}");
        }
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn malformed_requests_get_openai_style_400() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let c = http1_client();
    for body in [
        "{not json",
        r#"{"messages":[]}"#,
        r#"{"model":7}"#,
        r#"{"model":"m","model":"m"}"#,
        "",
    ] {
        let a = send(&c, post(&gw.url("/v1/chat/completions"), body)).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(a.error_code(), "invalid_request");
        assert_eq!(a.json()["error"]["type"], "invalid_request_error");
        assert!(!a.json()["error"]["message"].as_str().unwrap().is_empty());
    }
    assert!(up.seen().is_empty(), "nothing malformed reaches a site");
    gw.shutdown().await;
}

#[tokio::test]
async fn unknown_model_route_and_method_get_404_and_405() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let c = http1_client();
    let a = send(
        &c,
        post(&gw.url("/v1/chat/completions"), r#"{"model":"other"}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.error_code(), "model_not_found");
    let a = send(&c, post(&gw.url("/v1/nope"), CHAT)).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.error_code(), "unknown_url");
    let a = send(&c, get(&gw.url("/v1/chat/completions"))).await;
    assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED);
    gw.shutdown().await;
}

#[tokio::test]
async fn body_limit_is_enforced_at_its_boundary_with_and_without_content_length() {
    let up = FakeModel::start("a").await;
    let limit = grid_gateway::config::MIN_BODY_LIMIT_BYTES;
    let gw = start_gateway(
        |c| c.body_limit_bytes = limit,
        &[("m", one("a", up.base_url()))],
    )
    .await;
    let c = http1_client();
    let padded = |n: usize| {
        let head = r#"{"model":"m","pad":""#;
        let tail = r#""}"#;
        format!("{head}{}{tail}", "x".repeat(n - head.len() - tail.len()))
    };
    let a = send(&c, post(&gw.url("/v1/chat/completions"), padded(limit))).await;
    assert_eq!(a.status, StatusCode::OK, "exactly at the limit is accepted");
    let a = send(&c, post(&gw.url("/v1/chat/completions"), padded(limit + 1))).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(a.error_code(), "body_too_large");

    // Chunked (no Content-Length): the limit is enforced while reading.
    let (mut tx, body) =
        http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(4);
    let big = padded(limit + 1);
    tokio::spawn(async move {
        for chunk in big.as_bytes().chunks(100) {
            let _ = tx.send_data(Bytes::copy_from_slice(chunk)).await;
        }
    });
    let req = Request::post(gw.url("/v1/chat/completions"))
        .body(body)
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(hyper_util::client::legacy::connect::HttpConnector::new());
    let resp = tokio::time::timeout(
        grid_kit::gateway_harness::EXCHANGE_TIMEOUT,
        client.request(req),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        up.seen().len(),
        1,
        "only the at-limit request reached the site"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn refused_connection_is_retried_once_on_another_site() {
    let up = FakeModel::start("b").await;
    let cands = vec![
        Cand {
            site: "a",
            provider: "p",
            base_url: closed_port_url(),
        },
        Cand {
            site: "b",
            provider: "p",
            base_url: up.base_url(),
        },
    ];
    let gw = start_gateway(|_| {}, &[("m", cands)]).await;
    let c = http1_client();
    // Whichever site the pick draws first, every request ends at b.
    for _ in 0..8 {
        let a = send(&c, post(&gw.url("/v1/chat/completions"), CHAT)).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.site(), Some("b"));
    }
    let metrics = send(&c, get(&gw.url("/metrics"))).await;
    let text = std::str::from_utf8(&metrics.body).unwrap();
    assert!(
        text.contains(r#"grid_gateway_upstream_failures_total{site="a",reason="connect"}"#),
        "{text}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn failed_only_site_gives_502() {
    let gw = start_gateway(|_| {}, &[("m", one("a", closed_port_url()))]).await;
    let a = send(&http1_client(), post(&gw.url("/v1/chat/completions"), CHAT)).await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY);
    assert_eq!(a.error_code(), "upstream_failed");
    assert_eq!(a.json()["error"]["type"], "server_error");
    gw.shutdown().await;
}

#[tokio::test]
async fn models_lists_configured_models_and_metrics_count_outcomes() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(
        |_| {},
        &[
            ("m", one("a", up.base_url())),
            ("e", one("a", up.base_url())),
        ],
    )
    .await;
    let c = http1_client();
    let a = send(&c, get(&gw.url("/v1/models"))).await;
    assert_eq!(a.status, StatusCode::OK);
    let ids: Vec<String> = a.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["m", "e"]);
    send(&c, post(&gw.url("/v1/chat/completions"), CHAT)).await;
    send(&c, post(&gw.url("/v1/chat/completions"), "{")).await;
    let m = send(&c, get(&gw.url("/metrics"))).await;
    let text = std::str::from_utf8(&m.body).unwrap();
    assert!(
        text.contains(r#"grid_gateway_requests_total{outcome="proxied"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"grid_gateway_requests_total{outcome="invalid_request"} 1"#),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("grid_gateway_score_decisions_total{")
                && l.contains(r#"site="a""#)
                && l.contains(r#"outcome="routed""#)),
        "{text}"
    );
    for series in [
        "grid_gateway_polls_total",
        "grid_signals_ingest_dropped_total",
        "grid_signals_feedback_failures_total",
        "grid_gateway_score_rho{",
        "grid_gateway_model_shedding{",
    ] {
        assert!(text.contains(series), "{series} missing: {text}");
    }
    gw.shutdown().await;
}
