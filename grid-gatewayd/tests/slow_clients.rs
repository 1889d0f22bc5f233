//! Clients that stop taking their answers cannot hold a site: a write to a client that
//! makes no progress for `clientWriteTimeoutSeconds` ends its exchange (HTTP/1.1: the
//! connection closed; HTTP/2: the stream reset), which cancels the site's answer and frees
//! its slot, and one HTTP/2 connection holds at most its share of a site's slots. Each
//! attack runs against a site that also serves ordinary requests, which are answered
//! throughout. The attackers are real sockets on loopback: an HTTP/1.1 client with a tiny
//! receive buffer that never reads, and HTTP/2 streams held at a zero flow-control window
//! by the `h2` client.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use grid_kit::gateway_harness::fake_model::{Behaviour, FakeModel};
use grid_kit::gateway_harness::{Harness, http1_client, one, post, send, series, start_gateway};
use http::StatusCode;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use tokio::time::Instant;

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
const STREAM_CHAT: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

/// The write bound the tests configure: long enough that every attacker holds its slot
/// before any is cut, short for a test.
const BOUND_MS: u64 = 2_000;

/// The site's slots: room for every attacker and the ordinary requests beside them.
const SITE_SLOTS: usize = 64;

/// What "within the bound" allows on a busy CI machine.
const SLACK: Duration = Duration::from_secs(10);

/// A gateway routing `m` to `site`, with the write bound and the site's slots above.
async fn gateway(site: &FakeModel) -> Harness {
    start_gateway(
        |c| {
            c.client_write_timeout_ms = BOUND_MS;
            c.max_connections_per_site = SITE_SLOTS;
        },
        &[("m", one("a", site.base_url()))],
    )
    .await
}

/// Waits until `done` holds for the gateway's `/metrics`, at most `within`.
async fn until(gw: &Harness, within: Duration, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + within;
    loop {
        let text = gw.metrics().await;
        if done(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "never: {what}\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn in_use(text: &str) -> u64 {
    series(text, r#"grid_gateway_site_slots_in_use{site="a"}"#)
}

/// An HTTP/1.1 client that asks for a streamed answer and never reads a byte of it, its
/// receive buffer as small as the kernel allows so its window shuts at once.
async fn non_reader(addr: SocketAddr) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(1024).unwrap();
    socket.set_nonblocking(true).unwrap();
    let socket = tokio::net::TcpSocket::from_std_stream(socket.into());
    let mut stream = socket.connect(addr).await.unwrap();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{STREAM_CHAT}",
        STREAM_CHAT.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

/// Waits until the gateway has dropped every answer the site was sending (the site's
/// work cancelled), at most [`SLACK`].
async fn all_answers_dropped(site: &FakeModel) {
    let deadline = Instant::now() + SLACK;
    while site.open_answers() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} answers still sent",
            site.open_answers()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An ordinary request to the attacked site, answered whole.
async fn ordinary(gw: &Harness) {
    let a = send(&http1_client(), post(&gw.url("/v1/chat/completions"), CHAT)).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    assert_eq!(a.site(), Some("a"));
}

#[tokio::test]
async fn fifty_http1_clients_that_stop_reading_are_cut_at_the_write_bound_and_free_their_slots() {
    const ATTACKERS: usize = 50;
    let site = FakeModel::start("a").await;
    site.set_behaviour(Behaviour::Flood);
    let gw = gateway(&site).await;
    let started = Instant::now();
    let mut attackers = Vec::new();
    for _ in 0..ATTACKERS {
        attackers.push(non_reader(gw.addr).await);
    }
    until(&gw, SLACK, "every attacker holds a slot", |t| {
        in_use(t) == ATTACKERS as u64
    })
    .await;
    // While they hold their slots, the site serves everyone else.
    for _ in 0..3 {
        ordinary(&gw).await;
    }
    let text = gw.metrics().await;
    assert_eq!(
        series(
            &text,
            r#"grid_gateway_connections_closed_total{reason="write_timeout"}"#
        ),
        0,
        "served while the attack held its slots, not after it was cut"
    );
    let text = until(
        &gw,
        Duration::from_millis(BOUND_MS) + SLACK,
        "every attacker cut at the bound",
        |t| {
            series(
                t,
                r#"grid_gateway_connections_closed_total{reason="write_timeout"}"#,
            ) == ATTACKERS as u64
                && in_use(t) == 0
        },
    )
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(BOUND_MS),
        "not before the bound"
    );
    assert_eq!(in_use(&text), 0, "every slot freed");
    all_answers_dropped(&site).await;
    ordinary(&gw).await;
    drop(attackers);
    gw.shutdown().await;
}

/// One HTTP/2 connection whose streams all have a zero flow-control window: the gateway
/// can send their heads but not a byte of their bodies.
async fn zero_window_connection(addr: SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake(tcp)
        .await
        .unwrap();
    tokio::spawn(conn);
    send.ready().await.unwrap()
}

/// Opens a streamed chat on `send`; its answer is never given any window.
fn held_stream(send: &mut h2::client::SendRequest<Bytes>) -> h2::client::ResponseFuture {
    let req = http::Request::post("http://gateway/v1/chat/completions")
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let (resp, mut body) = send.send_request(req, false).unwrap();
    body.send_data(Bytes::from_static(STREAM_CHAT.as_bytes()), true)
        .unwrap();
    resp
}

#[tokio::test]
async fn six_http2_connections_of_zero_window_streams_hold_a_bounded_share_until_cut() {
    const CONNECTIONS: usize = 6;
    const STREAMS: usize = 20;
    let share = grid_gatewayd::engine::client::limits::site_share(SITE_SLOTS);
    assert!(
        CONNECTIONS * share < SITE_SLOTS && share < STREAMS,
        "the test needs room beside the attack and streams past the share"
    );
    let site = FakeModel::start("a").await;
    site.set_behaviour(Behaviour::Flood);
    let gw = gateway(&site).await;
    let mut answers = Vec::new();
    let mut connections = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut send = zero_window_connection(gw.addr).await;
        for _ in 0..STREAMS {
            answers.push(held_stream(&mut send));
        }
        connections.push(send);
    }
    let held = (CONNECTIONS * share) as u64;
    let refused = (CONNECTIONS * (STREAMS - share)) as u64;
    until(&gw, SLACK, "each connection holds its share", |t| {
        in_use(t) == held
            && series(
                t,
                r#"grid_gateway_requests_total{outcome="connection_share"}"#,
            ) == refused
    })
    .await;
    ordinary(&gw).await;
    let text = gw.metrics().await;
    assert_eq!(in_use(&text), held, "the attack still holds its share");
    assert_eq!(
        series(
            &text,
            r#"grid_gateway_streams_reset_total{reason="write_timeout"}"#
        ),
        0
    );
    until(
        &gw,
        Duration::from_millis(BOUND_MS) + SLACK,
        "every held stream reset at the bound",
        |t| {
            series(
                t,
                r#"grid_gateway_streams_reset_total{reason="write_timeout"}"#,
            ) == held + refused
                && in_use(t) == 0
        },
    )
    .await;
    // Each stream got its head, then a reset: its body never came.
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for answer in answers {
        let resp = tokio::time::timeout(SLACK, answer).await.unwrap().unwrap();
        *statuses.entry(resp.status().as_u16()).or_default() += 1;
        let mut body = resp.into_body();
        let frame = tokio::time::timeout(SLACK, body.data()).await.unwrap();
        assert!(
            matches!(frame, Some(Err(ref e)) if e.reason() == Some(h2::Reason::CANCEL)),
            "{frame:?}"
        );
    }
    assert_eq!(statuses[&200], CONNECTIONS * share);
    assert_eq!(statuses[&429], CONNECTIONS * (STREAMS - share));
    all_answers_dropped(&site).await;
    ordinary(&gw).await;
    drop(connections);
    gw.shutdown().await;
}
