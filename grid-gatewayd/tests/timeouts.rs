//! Every wait of the gateway is bounded: a site that accepts and goes silent (before its
//! head, mid-body, mid-stream, during the TLS handshake) and a client that connects and
//! sends nothing or idles, each against short configured bounds on loopback.

use std::time::Duration;
use tokio::time::Instant;

use grid_kit::gateway_harness::fake_model::{Behaviour, FakeModel, SSE_EVENTS, SilentListener};
use grid_kit::gateway_harness::{
    Cand, EXCHANGE_TIMEOUT, Harness, http1_client, one, post, send, series, start_gateway,
};
use http::StatusCode;
use http_body_util::BodyExt as _;

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
const STREAM_CHAT: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

/// The bound the tests configure: short for a quick test, far above loopback latency.
const BOUND_MS: u64 = 300;

/// What "within the bound" allows: the bound plus generous scheduling slack on a busy CI
/// machine, still far below the fake's hang and the harness's exchange timeout.
const WITHIN: Duration = Duration::from_secs(5);

/// Site `site`'s live factor in the published view (1 with no failure seen).
fn live_factor(gw: &Harness, site: &str) -> f64 {
    let view = gw.gateway.as_ref().unwrap().published().load();
    view.table()
        .get("m")
        .and_then(|snap| {
            snap.candidates()
                .iter()
                .find(|c| &**c.site() == site)
                .map(grid_score::Candidate::live_factor)
        })
        .unwrap_or(1.0)
}

#[tokio::test]
async fn an_upstream_that_never_answers_gets_504_within_the_header_bound() {
    let up = FakeModel::start("a").await;
    up.set_behaviour(Behaviour::HangBeforeHead);
    let gw = start_gateway(
        |c| {
            // The header bound must exceed the connect bound (validate refuses otherwise).
            c.connect_timeout_ms = BOUND_MS / 2;
            c.upstream_headers_timeout_ms = BOUND_MS;
        },
        &[("m", one("a", up.base_url()))],
    )
    .await;
    let c = http1_client();
    for body in [CHAT, STREAM_CHAT] {
        let started = Instant::now();
        let a = send(&c, post(&gw.url("/v1/chat/completions"), body)).await;
        assert!(started.elapsed() < WITHIN, "{:?}", started.elapsed());
        assert!(
            started.elapsed() >= Duration::from_millis(BOUND_MS),
            "not before the bound"
        );
        assert_eq!(a.status, StatusCode::GATEWAY_TIMEOUT, "{:?}", a.body);
        assert_eq!(a.error_code(), "upstream_timeout");
        assert_eq!(a.json()["error"]["type"], "server_error");
    }
    assert_eq!(up.seen().len(), 2, "no retry once the request was sent");
    let text = gw.metrics().await;
    assert_eq!(
        series(
            &text,
            r#"grid_gateway_upstream_timeouts_total{site="a",phase="headers"}"#
        ),
        2,
        "{text}"
    );
    assert_eq!(
        series(
            &text,
            r#"grid_gateway_requests_total{outcome="upstream_timeout"}"#
        ),
        2,
        "{text}"
    );
    // Fed to routing as serving failures: the site's live factor drops (the answer wakes
    // an off-cycle refresh, so no poll is needed).
    let deadline = Instant::now() + WITHIN;
    while live_factor(&gw, "a") >= 1.0 {
        assert!(
            Instant::now() < deadline,
            "the timeouts never reached routing"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.shutdown().await;
}

/// Reads `body` until it ends or fails; `Err` when the stream was cut.
async fn read_to_end(
    mut body: hyper::body::Incoming,
) -> (
    Vec<u8>,
    Result<(), Box<dyn std::error::Error + Send + Sync>>,
) {
    let mut got = Vec::new();
    loop {
        match body.frame().await {
            None => return (got, Ok(())),
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    got.extend_from_slice(d);
                }
            }
            Some(Err(e)) => return (got, Err(e.into())),
        }
    }
}

async fn cut_after_idle(behaviour: Behaviour, body: &str, http2: bool) {
    let up = FakeModel::start("a").await;
    up.set_behaviour(behaviour);
    let gw = start_gateway(
        |c| c.upstream_idle_timeout_ms = BOUND_MS,
        &[("m", one("a", up.base_url()))],
    )
    .await;
    let client = if http2 {
        grid_kit::gateway_harness::http2_client()
    } else {
        http1_client()
    };
    let started = Instant::now();
    let resp = tokio::time::timeout(
        EXCHANGE_TIMEOUT,
        client.request(post(&gw.url("/v1/chat/completions"), body.to_owned())),
    )
    .await
    .expect("head within the exchange timeout")
    .expect("the head arrives");
    assert_eq!(resp.status(), StatusCode::OK);
    let (got, ended) = tokio::time::timeout(EXCHANGE_TIMEOUT, read_to_end(resp.into_body()))
        .await
        .expect("the stalled answer is cut, not held");
    assert!(started.elapsed() < WITHIN, "{:?}", started.elapsed());
    assert!(
        !got.is_empty(),
        "what the site sent before stalling arrived"
    );
    assert!(
        ended.is_err(),
        "the client sees the answer cut, not complete"
    );
    let text = gw.metrics().await;
    assert_eq!(
        series(
            &text,
            r#"grid_gateway_upstream_timeouts_total{site="a",phase="body"}"#
        ),
        1,
        "{text}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_stream_that_stalls_mid_answer_is_cut_after_the_idle_bound() {
    cut_after_idle(Behaviour::StallStream, STREAM_CHAT, false).await;
}

#[tokio::test]
async fn a_stream_that_stalls_mid_answer_is_cut_after_the_idle_bound_over_http2() {
    cut_after_idle(Behaviour::StallStream, STREAM_CHAT, true).await;
}

#[tokio::test]
async fn a_plain_answer_that_stalls_mid_body_is_cut_after_the_idle_bound() {
    cut_after_idle(Behaviour::StallBody, CHAT, false).await;
}

#[tokio::test]
async fn a_stream_with_gaps_shorter_than_the_idle_bound_is_relayed_whole() {
    // The fake's events are SSE_GAP (150 ms) apart: the bound is between frames, not on
    // the whole answer, which takes about 600 ms here.
    let up = FakeModel::start("a").await;
    let gw = start_gateway(
        |c| c.upstream_idle_timeout_ms = BOUND_MS,
        &[("m", one("a", up.base_url()))],
    )
    .await;
    let a = send(
        &http1_client(),
        post(&gw.url("/v1/chat/completions"), STREAM_CHAT),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    let text = std::str::from_utf8(&a.body).unwrap();
    assert_eq!(text.matches("data: {").count(), SSE_EVENTS, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_hung_tls_handshake_is_bounded_by_the_connect_timeout_and_retried_elsewhere() {
    let hung = SilentListener::start().await;
    let up = FakeModel::start("b").await;
    let cands = vec![
        Cand {
            site: "a",
            provider: "p",
            base_url: hung.https_base_url(),
        },
        Cand {
            site: "b",
            provider: "p",
            base_url: up.base_url(),
        },
    ];
    let gw = start_gateway(|c| c.connect_timeout_ms = BOUND_MS, &[("m", cands)]).await;
    let c = http1_client();
    // The pick draws a about half the time; bounded attempts until one did.
    for attempt in 0.. {
        assert!(attempt < 40, "site a was never drawn");
        let started = Instant::now();
        let a = send(&c, post(&gw.url("/v1/chat/completions"), CHAT)).await;
        assert!(started.elapsed() < WITHIN, "{:?}", started.elapsed());
        assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
        assert_eq!(a.site(), Some("b"), "served by the retry");
        if hung.accepted() > 0 {
            break;
        }
    }
    let text = gw.metrics().await;
    assert!(
        series(
            &text,
            r#"grid_gateway_upstream_timeouts_total{site="a",phase="connect"}"#
        ) >= 1,
        "{text}"
    );
    assert!(
        series(
            &text,
            r#"grid_gateway_retries_total{site="b",cause="connect"}"#
        ) >= 1,
        "{text}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_hung_tls_handshake_on_the_only_site_gives_502_within_the_connect_bound() {
    let hung = SilentListener::start().await;
    let gw = start_gateway(
        |c| c.connect_timeout_ms = BOUND_MS,
        &[("m", one("a", hung.https_base_url()))],
    )
    .await;
    let started = Instant::now();
    let a = send(&http1_client(), post(&gw.url("/v1/chat/completions"), CHAT)).await;
    assert!(started.elapsed() < WITHIN, "{:?}", started.elapsed());
    assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{:?}", a.body);
    assert_eq!(a.error_code(), "upstream_failed");
    gw.shutdown().await;
}
