//! The API listener's waits and limits: a client that connects and sends nothing, sends
//! its head slowly, or idles between requests is closed after its bound; connections past
//! the cap are closed at once while open ones keep working.

use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;
use grid_kit::gateway_harness::fake_model::FakeModel;
use grid_kit::gateway_harness::{get, http1_client, one, series, start_gateway};
use http::StatusCode;
use http_body_util::BodyExt as _;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The bound the tests configure: short for a quick test, far above loopback latency.
const BOUND_MS: u64 = 300;

/// What "within the bound" allows: the bound plus generous scheduling slack.
const WITHIN: Duration = Duration::from_secs(5);

/// Whether the gateway closes `stream` within [`WITHIN`] (end of stream or reset).
async fn closed_by_gateway(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + WITHIN;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            // An answer (e.g. a 408) before the close is fine; keep reading.
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn a_connection_that_sends_no_request_is_closed_after_the_header_bound() {
    let gw = start_gateway(
        |c| c.client_header_timeout_ms = BOUND_MS,
        &[("m", one("a", "http://127.0.0.1:9".into()))],
    )
    .await;
    let mut silent = TcpStream::connect(gw.addr).await.unwrap();
    let mut slow = TcpStream::connect(gw.addr).await.unwrap();
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    assert!(closed_by_gateway(&mut silent).await, "silent connection");
    assert!(closed_by_gateway(&mut slow).await, "slow-header connection");
    assert!(started.elapsed() >= Duration::from_millis(BOUND_MS));
    let text = gw.metrics().await;
    assert_eq!(
        series(
            &text,
            r#"grid_gateway_connections_closed_total{reason="header_timeout"}"#
        ),
        2,
        "{text}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_bound() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(
        |c| c.client_idle_timeout_ms = BOUND_MS,
        &[("m", one("a", up.base_url()))],
    )
    .await;
    for http2 in [false, true] {
        let tcp = TcpStream::connect(gw.addr).await.unwrap();
        let io = TokioIo::new(tcp);
        // The client keeps its side (`_keep`): only the gateway may end the connection.
        let (resp, conn, _keep): (_, _, Box<dyn std::any::Any + Send>) = if http2 {
            let (mut send, conn) =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                    .await
                    .unwrap();
            let conn = tokio::spawn(conn);
            let resp = send.send_request(models_request()).await.unwrap();
            (resp, conn, Box::new(send))
        } else {
            let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            let conn = tokio::spawn(conn);
            let resp = send.send_request(models_request()).await.unwrap();
            (resp, conn, Box::new(send))
        };
        assert_eq!(resp.status(), StatusCode::OK);
        resp.into_body().collect().await.unwrap();
        tokio::time::timeout(WITHIN, conn)
            .await
            .unwrap_or_else(|_| panic!("idle connection (http2: {http2}) held open"))
            .unwrap()
            .ok();
    }
    let text = gw.metrics().await;
    assert!(
        series(
            &text,
            r#"grid_gateway_connections_closed_total{reason="idle_timeout"}"#
        ) >= 2,
        "{text}"
    );
    gw.shutdown().await;
}

fn models_request() -> http::Request<http_body_util::Empty<Bytes>> {
    http::Request::get("/v1/models")
        .header("host", "gateway")
        .body(http_body_util::Empty::new())
        .unwrap()
}

/// `n` kept-alive HTTP/1.1 connections to `addr`, each having been served a request.
async fn open_served(
    addr: std::net::SocketAddr,
    n: usize,
) -> Vec<hyper::client::conn::http1::SendRequest<http_body_util::Empty<Bytes>>> {
    let mut open = Vec::new();
    for _ in 0..n {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        let resp = send.send_request(models_request()).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        resp.into_body().collect().await.unwrap();
        open.push(send);
    }
    open
}

#[tokio::test]
async fn connections_past_the_cap_are_closed_at_once_and_counted_while_open_ones_keep_working() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|c| c.max_connections = 2, &[("m", one("a", up.base_url()))]).await;
    let mut open = open_served(gw.addr, 2).await;
    let mut extra = TcpStream::connect(gw.addr).await.unwrap();
    assert!(
        closed_by_gateway(&mut extra).await,
        "the connection past the cap is closed"
    );
    for send in &mut open {
        let resp = send.send_request(models_request()).await.unwrap();
        assert_eq!(
            resp.status(),
            StatusCode::OK,
            "an open connection still works"
        );
        resp.into_body().collect().await.unwrap();
    }
    // Once one closes, a new connection is served again.
    drop(open.pop());
    let deadline = Instant::now() + WITHIN;
    loop {
        let tcp = TcpStream::connect(gw.addr).await.unwrap();
        if let Ok((mut send, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await
        {
            tokio::spawn(conn);
            if let Ok(resp) = send.send_request(models_request()).await {
                assert_eq!(resp.status(), StatusCode::OK);
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no connection admitted after one closed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // `/metrics` needs a connection slot of its own: free one more.
    drop(open);
    let deadline = Instant::now() + WITHIN;
    let text = loop {
        let text = tokio::time::timeout(WITHIN, async {
            let c = http1_client();
            c.request(get(&gw.url("/metrics"))).await
        })
        .await;
        if let Ok(Ok(resp)) = text {
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            break String::from_utf8(body.to_vec()).unwrap();
        }
        assert!(Instant::now() < deadline, "metrics never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        series(
            &text,
            r#"grid_gateway_connections_refused_total{reason="limit"}"#
        ) >= 1,
        "{text}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_client_that_trickles_its_body_gets_408_after_the_body_bound() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(
        |c| c.client_body_timeout_ms = BOUND_MS,
        &[("m", one("a", up.base_url()))],
    )
    .await;
    let tcp = TcpStream::connect(gw.addr).await.unwrap();
    let (mut rx, mut tx) = tcp.into_split();
    tx.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n",
    )
    .await
    .unwrap();
    let started = Instant::now();
    // One byte every 50 ms: the connection is never idle, the body never complete (150
    // bytes of the 200 declared, 7.5 s, far past the bound).
    let trickle = tokio::spawn(async move {
        for _ in 0..150 {
            if tx.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let left = WITHIN.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, rx.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => answer.extend_from_slice(&buf[..n]),
            other => panic!("no answer head within {WITHIN:?}: {other:?}"),
        }
    }
    let elapsed = started.elapsed();
    trickle.abort();
    let text = String::from_utf8_lossy(&answer).to_string();
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(elapsed >= Duration::from_millis(BOUND_MS), "{elapsed:?}");
    let m = gw.metrics().await;
    assert_eq!(
        series(&m, r#"grid_gateway_requests_total{outcome="body_timeout"}"#),
        1,
        "{m}"
    );
    // Nothing reached the site.
    assert!(up.seen().is_empty());
    gw.shutdown().await;
}

/// Sends `GET path` on a new connection and reads until the gateway closes it: the whole
/// answer, or nothing when it closed without one.
async fn probe_once(addr: std::net::SocketAddr, path: &str) -> String {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let _ = tcp
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: gateway\r\n\r\n").as_bytes())
        .await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(WITHIN, tcp.read_to_end(&mut got)).await;
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn a_gateway_at_its_connection_cap_still_answers_probes_on_its_reserved_connections() {
    use grid_gatewayd::engine::client::limits::RESERVED_PROBE_CONNECTIONS;
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|c| c.max_connections = 2, &[("m", one("a", up.base_url()))]).await;
    let open = open_served(gw.addr, 2).await;
    // Every regular connection is taken: a scrape and the probes still get through.
    let metrics = probe_once(gw.addr, "/metrics").await;
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        metrics.contains("grid_gateway_connections_open 2"),
        "{metrics}"
    );
    for path in ["/healthz", "/readyz"] {
        let answer = probe_once(gw.addr, path).await;
        assert!(answer.starts_with("HTTP/1.1 "), "{path}: {answer}");
    }
    // Anything else on a reserved connection is closed unanswered.
    assert_eq!(probe_once(gw.addr, "/v1/models").await, "");
    // With every reserved connection held by a client that sends nothing, one more is
    // closed at once even for a probe.
    let mut silent = Vec::new();
    for _ in 0..RESERVED_PROBE_CONNECTIONS {
        let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
        tcp.write_all(b"GET /metr").await.unwrap();
        silent.push(tcp);
    }
    assert_eq!(
        probe_once(gw.addr, "/metrics").await,
        "",
        "past the reserve"
    );
    // A silent reserved connection gives its place back within its head bound.
    for tcp in &mut silent {
        assert!(closed_by_gateway(tcp).await);
    }
    let metrics = probe_once(gw.addr, "/metrics").await;
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        series(
            &metrics,
            r#"grid_gateway_connections_refused_total{reason="limit"}"#
        ) >= 2 + RESERVED_PROBE_CONNECTIONS as u64,
        "{metrics}"
    );
    drop(open);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_slow_second_head_on_a_kept_alive_connection_is_held_to_the_header_bound() {
    let gw = start_gateway(
        |c| {
            c.client_header_timeout_ms = BOUND_MS;
            // Far past the test: only the header bound can close the connection in time.
            c.client_idle_timeout_ms = 600_000;
        },
        &[("m", one("a", "http://127.0.0.1:9".into()))],
    )
    .await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: g\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(WITHIN, s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed before the first answer");
        answer.extend_from_slice(&buf[..n]);
    }
    assert!(answer.starts_with(b"HTTP/1.1 200 OK\r\n"));
    // The second head begins and never ends.
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: g\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    assert!(
        closed_by_gateway(&mut s).await,
        "a head trickled on a kept-alive connection held it past the header bound"
    );
    // The gateway saw the head begin a little before `started`.
    assert!(started.elapsed() >= Duration::from_millis(BOUND_MS - 50));
    let text = gw.metrics().await;
    assert_eq!(
        series(
            &text,
            r#"grid_gateway_connections_closed_total{reason="header_timeout"}"#
        ),
        1,
        "{text}"
    );
    gw.shutdown().await;
}

/// The backlog the kernel keeps for the listening socket on `port` (`ss`'s Send-Q of a
/// listening socket), from iproute2 as installed by `.ci/install`.
fn listen_backlog_of(port: u16) -> u32 {
    let out = std::process::Command::new("ss")
        .args(["-ltnH", &format!("sport = :{port}")])
        .output()
        .expect("ss from iproute2");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .next()
        .unwrap_or_else(|| panic!("no listener on {port}: {text}"));
    // State Recv-Q Send-Q Local Peer: Send-Q is the backlog of a listening socket.
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

#[tokio::test]
async fn the_api_listener_asks_the_kernel_for_the_configured_backlog() {
    let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let gw = start_gateway(
        |c| c.listen_backlog = 7,
        &[("m", one("a", "http://127.0.0.1:9".into()))],
    )
    .await;
    assert_eq!(listen_backlog_of(gw.addr.port()), 7);
    gw.shutdown().await;
    let gw = start_gateway(|_| {}, &[("m", one("a", "http://127.0.0.1:9".into()))]).await;
    assert_eq!(
        listen_backlog_of(gw.addr.port()),
        grid_gateway::config::DEFAULT_LISTEN_BACKLOG.min(somaxconn),
        "the default, as far as the kernel allows"
    );
    gw.shutdown().await;
}
