//! HTTP/2 streams share their connection's task (`http2_streams`): on one connection, a
//! stream stuck on a silent site does not hold the others, and a stream the client
//! resets or a connection it drops ends the requests on it.

use std::time::Duration;

use bytes::Bytes;
use grid_kit::gateway_harness::fake_model::{Behaviour, FakeModel};
use grid_kit::gateway_harness::{EXCHANGE_TIMEOUT, one, series, start_gateway};
use http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The header bound the silent site runs into: long next to a loopback answer.
const HEADERS_BOUND_MS: u64 = 2_000;

fn chat(model: &str) -> Request<Full<Bytes>> {
    let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    Request::post("/v1/chat/completions")
        .header("host", "gateway")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// One HTTP/2 connection to `addr` (prior knowledge), driven by its own task.
async fn connect(addr: std::net::SocketAddr) -> SendRequest<Full<Bytes>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    send
}

#[tokio::test]
async fn a_stream_on_a_silent_site_does_not_hold_the_other_streams_of_its_connection() {
    let silent = FakeModel::start("a").await;
    silent.set_behaviour(Behaviour::HangBeforeHead);
    let live = FakeModel::start("b").await;
    let gw = start_gateway(
        |c| {
            // The header bound must exceed the connect bound (validate refuses otherwise).
            c.connect_timeout_ms = HEADERS_BOUND_MS / 2;
            c.upstream_headers_timeout_ms = HEADERS_BOUND_MS;
        },
        &[
            ("slow", one("a", silent.base_url())),
            ("fast", one("b", live.base_url())),
        ],
    )
    .await;
    let mut send = connect(gw.addr).await;
    let stuck = tokio::spawn(send.send_request(chat("slow")));
    // The stuck stream is in flight at the site before the others start.
    let deadline = Instant::now() + EXCHANGE_TIMEOUT;
    while silent.seen().is_empty() {
        assert!(Instant::now() < deadline, "the silent site was never asked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    for _ in 0..3 {
        let resp = tokio::time::timeout(EXCHANGE_TIMEOUT, send.send_request(chat("fast")))
            .await
            .expect("answered")
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        resp.into_body().collect().await.unwrap();
    }
    assert!(
        started.elapsed() < Duration::from_millis(HEADERS_BOUND_MS),
        "the other streams waited {:?}, as long as the stuck one",
        started.elapsed()
    );
    assert!(!stuck.is_finished(), "the stuck stream is still waiting");
    let resp = tokio::time::timeout(EXCHANGE_TIMEOUT, stuck)
        .await
        .expect("the stuck stream ends at its bound")
        .unwrap()
        .unwrap();
    assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_connection_the_client_drops_ends_the_requests_in_flight_on_it() {
    let silent = FakeModel::start("a").await;
    silent.set_behaviour(Behaviour::HangBeforeHead);
    let gw = start_gateway(
        |c| c.upstream_headers_timeout_ms = 30_000,
        &[("slow", one("a", silent.base_url()))],
    )
    .await;
    let mut send = connect(gw.addr).await;
    let first = tokio::spawn(send.send_request(chat("slow")));
    let second = tokio::spawn(send.send_request(chat("slow")));
    let deadline = Instant::now() + EXCHANGE_TIMEOUT;
    while silent.seen().len() < 2 {
        assert!(Instant::now() < deadline, "the silent site was never asked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(in_flight(&gw).await >= 1, "the connection is open");
    drop(send);
    first.abort();
    second.abort();
    // The client's connection task ends with its last handle: the gateway sees the
    // connection close, and drops the two streams with it, long before the header bound.
    let deadline = Instant::now() + EXCHANGE_TIMEOUT;
    while in_flight(&gw).await != 0 {
        assert!(
            Instant::now() < deadline,
            "the connection and its streams outlived the client"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.shutdown().await;
}

/// `grid_gateway_connections_open`, less the connection that reads it.
async fn in_flight(gw: &grid_kit::gateway_harness::Harness) -> u64 {
    let text = gw.metrics().await;
    series(&text, "grid_gateway_connections_open") - 1
}
