//! grid-pingora's proxy holds a client that stops reading to the gateway's
//! `clientWriteTimeoutSeconds` (Pingora's downstream write timeout): the site's answer is
//! dropped once the client has taken nothing for the bound, not when the client leaves.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use grid_kit::gateway_harness::fake_model::{Behaviour, FakeModel};
use grid_kit::pingora_proxy::PingoraProxy;
use grid_kit::pki;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::Instant;

const STREAM_CHAT: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

/// The write bound configured: short for a test, long next to loopback.
const BOUND: Duration = Duration::from_secs(2);

/// The proxy's start, and what "at the bound" allows on a loaded machine.
const SLACK: Duration = Duration::from_secs(20);

fn free_loopback_addr() -> SocketAddr {
    grid_kit::ports::loopback_addr()
}

/// A gateway configuration for `grid-pingora`: model `m` on `site_url`, an operator that
/// never answers (the site stays unmeasured, routed by the fallback path).
fn config(dir: &Path, listen: SocketAddr, site_url: &str) -> std::path::PathBuf {
    let ca = pki::Ca::new("test-grid-ca");
    let files = ca.issue(dir, "gateway", &["gateway.a.grid"]);
    let toml = format!(
        r#"site = "a"
listen = "{listen}"
clientWriteTimeoutSeconds = {bound}
bodyLimitBytes = {body_limit}

[operator]
url = "https://127.0.0.1:9"
identity = "operator.a.grid"

[tls]
cert = "{cert}"
key = "{key}"
ca = "{ca}"

[[models]]
name = "m"
candidates = [{{ site = "a", provider = "p", baseUrl = "{site_url}" }}]
"#,
        bound = BOUND.as_secs_f64(),
        body_limit = grid_pingora::MAX_REPLAYED_BODY_BYTES,
        cert = files.cert.display(),
        key = files.key.display(),
        ca = files.ca.display(),
    );
    let path = dir.join("gateway.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_has_its_answer_dropped_at_the_write_bound() {
    let site = FakeModel::start("a").await;
    site.set_behaviour(Behaviour::Flood);
    let dir = tempfile::tempdir().unwrap();
    let listen = free_loopback_addr();
    let conf = config(dir.path(), listen, &site.base_url());
    let proxy = PingoraProxy::start(&grid_gateway::Config::load(&conf).unwrap())
        .expect("grid-pingora starts");
    // A client with a tiny receive buffer that reads the answer's first bytes, then stops.
    let started = Instant::now();
    let mut client = loop {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(1024).unwrap();
        if let Ok(c) = socket.connect(listen).await {
            break c;
        }
        assert!(started.elapsed() < SLACK, "grid-pingora never listened");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    send_stream_request(&mut client).await;
    let mut first = [0u8; 12];
    client.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let deadline = Instant::now() + SLACK;
    while site.open_answers() == 0 {
        assert!(Instant::now() < deadline, "the site never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stalled = Instant::now();
    while site.open_answers() > 0 {
        assert!(
            stalled.elapsed() < BOUND + SLACK,
            "the site's answer outlived the write bound"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(stalled.elapsed() >= BOUND / 2, "cut before the bound");
    drop(client);
    drop(proxy);
}

async fn send_stream_request(client: &mut TcpStream) {
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{STREAM_CHAT}",
        STREAM_CHAT.len()
    );
    client.write_all(request.as_bytes()).await.unwrap();
}
