//! Remote sites are reached over TLS with the gateway's certificate, verified against the
//! grid CA.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use grid_kit::gateway_harness::fake_model::FakeModel;
use grid_kit::gateway_harness::{Cand, http1_client, post, send, series};
use grid_kit::pki::{Ca, server_config};
use http::StatusCode;

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test]
async fn remote_site_over_mutual_tls_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Ca::new("grid-ca");
    let site_files = pki.issue(dir.path(), "site-b", &["127.0.0.1"]);
    let up = FakeModel::start_tls("b", server_config(&site_files, &pki.pem())).await;
    let config = one_site_config(dir.path(), &pki, up.https_base_url());
    let gw = grid_gatewayd::driver::start(config).await.unwrap();
    let a = send(
        &http1_client(),
        post(
            &format!("http://{}/v1/chat/completions", gw.local_addr()),
            CHAT,
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    assert_eq!(a.site(), Some("b"));
    assert_eq!(up.seen().len(), 1);
    gw.shutdown().await;
}

#[tokio::test]
async fn remote_site_with_an_untrusted_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Ca::new("grid-ca");
    let rogue = Ca::new("rogue-ca");
    let site_files = rogue.issue(dir.path(), "site-b", &["127.0.0.1"]);
    let up = FakeModel::start_tls("b", server_config(&site_files, &pki.pem())).await;
    let config = one_site_config(dir.path(), &pki, up.https_base_url());
    let gw = grid_gatewayd::driver::start(config).await.unwrap();
    let a = send(
        &http1_client(),
        post(
            &format!("http://{}/v1/chat/completions", gw.local_addr()),
            CHAT,
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY);
    assert!(
        up.seen().is_empty(),
        "no request reaches a site the gateway cannot verify"
    );
    gw.shutdown().await;
}

/// A gateway's configuration routing model `m` to the one site `b` at `base_url`.
fn one_site_config(dir: &std::path::Path, pki: &Ca, base_url: String) -> grid_gateway::Config {
    grid_kit::gateway_harness::config(
        dir,
        pki,
        "https://127.0.0.1:9",
        &[(
            "m",
            vec![Cand {
                site: "b",
                provider: "p",
                base_url,
            }],
        )],
    )
}

/// A site over TLS, HTTP/1.1 only, that answers its first request with `answer` as bytes
/// (after reading the request's head and its `content-length` body); its `https` URL.
fn raw_tls_site(config: &rustls::ServerConfig, answer: &'static [u8]) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let mut config = config.clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let config = Arc::new(config);
    std::thread::spawn(move || {
        let (tcp, _) = listener.accept().unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let tls = rustls::StreamOwned::new(rustls::ServerConnection::new(config).unwrap(), tcp);
        answer_first_request(tls, answer);
    });
    url
}

/// The same site in the clear; its `http` URL.
fn raw_clear_site(answer: &'static [u8]) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let (tcp, _) = listener.accept().unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        answer_first_request(tcp, answer);
    });
    url
}

/// Reads one request (its head and `content-length` body) from `stream`, writes `answer`
/// and holds the connection until the gateway closes it (or the read bound passes).
fn answer_first_request(mut stream: impl std::io::Read + std::io::Write, answer: &[u8]) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "the gateway closed before its request's head");
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while got.len() < head_end + length {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "the gateway closed before its request's body");
        got.extend_from_slice(&buf[..n]);
    }
    stream.write_all(answer).unwrap();
    stream.flush().unwrap();
    let _ = stream.read(&mut buf);
}

#[tokio::test]
async fn a_remote_site_answer_coded_other_than_chunked_alone_is_a_failed_exchange() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Ca::new("grid-ca");
    let site_files = pki.issue(dir.path(), "site-b", &["127.0.0.1"]);
    let base_url = raw_tls_site(
        &server_config(&site_files, &pki.pem()),
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
          transfer-encoding: gzip, chunked\r\n\r\n2\r\n\x1f\x8b\r\n0\r\n\r\n",
    );
    let config = one_site_config(dir.path(), &pki, base_url);
    let gw = grid_gatewayd::driver::start(config).await.unwrap();
    let url = format!("http://{}", gw.local_addr());
    let a = send(
        &http1_client(),
        post(&format!("{url}/v1/chat/completions"), CHAT),
    )
    .await;
    // hyper's client decodes the chunks; forwarded, the body would lose its gzip coding.
    assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{:?}", a.body);
    assert_eq!(a.error_code(), "upstream_failed");
    let m = send(
        &http1_client(),
        grid_kit::gateway_harness::get(&format!("{url}/metrics")),
    )
    .await;
    let text = String::from_utf8(m.body.to_vec()).unwrap();
    assert_eq!(
        series(
            &text,
            r#"grid_gateway_upstream_failures_total{site="b",reason="request"}"#
        ),
        1,
        "{text}"
    );
    gw.shutdown().await;
}

/// A site's answer head of `bytes` bytes in all (status line and final CRLF included).
fn answer_with_head_of(bytes: usize) -> &'static [u8] {
    let start = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-pad: ";
    let end = "\r\n\r\n";
    let pad = bytes - start.len() - end.len();
    let answer = format!("{start}{}{end}{{}}", "a".repeat(pad));
    Box::leak(answer.into_bytes().into_boxed_slice())
}

/// A site's answer with `fields` header fields in all (`content-length` among them).
fn answer_with_fields(fields: usize) -> &'static [u8] {
    let mut answer = String::from("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n");
    for i in 1..fields {
        let _ = write!(answer, "x-field-{i}: v\r\n");
    }
    answer += "\r\n{}";
    Box::leak(answer.into_bytes().into_boxed_slice())
}

/// What the gateway answers a request routed to the one site at `base_url`.
async fn through_the_gateway(dir: &std::path::Path, pki: &Ca, base_url: String) -> StatusCode {
    let config = one_site_config(dir, pki, base_url);
    let gw = grid_gatewayd::driver::start(config).await.unwrap();
    // The gateway forwards the site's fields and adds its own: more than a client's
    // default field limit when the site's were at the gateway's.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http1_max_headers(4 * grid_h1_wire::MAX_ANSWER_HEADERS)
        .build(hyper_util::client::legacy::connect::HttpConnector::new());
    let a = send(
        &client,
        post(
            &format!("http://{}/v1/chat/completions", gw.local_addr()),
            CHAT,
        ),
    )
    .await;
    gw.shutdown().await;
    a.status
}

#[tokio::test]
async fn a_site_over_tls_is_held_to_the_answer_head_bounds_of_a_site_in_the_clear() {
    use grid_h1_wire::{MAX_ANSWER_HEAD_BYTES, MAX_ANSWER_HEADERS};
    let dir = tempfile::tempdir().unwrap();
    let pki = Ca::new("grid-ca");
    let site_files = pki.issue(dir.path(), "site-b", &["127.0.0.1"]);
    let tls = server_config(&site_files, &pki.pem());
    // The field count is exact on both paths. The byte bound is exact in the clear;
    // hyper's read buffer, which bounds a head over TLS, may take one read past it, so
    // the byte rows are a head within the bound and one of twice the bound.
    let rows = [
        (answer_with_fields(MAX_ANSWER_HEADERS), StatusCode::OK),
        (
            answer_with_fields(MAX_ANSWER_HEADERS + 1),
            StatusCode::BAD_GATEWAY,
        ),
        (answer_with_head_of(MAX_ANSWER_HEAD_BYTES), StatusCode::OK),
        (
            answer_with_head_of(2 * MAX_ANSWER_HEAD_BYTES),
            StatusCode::BAD_GATEWAY,
        ),
    ];
    for (answer, want) in rows {
        let head = answer.len() - 2;
        let over_tls = through_the_gateway(dir.path(), &pki, raw_tls_site(&tls, answer)).await;
        let in_the_clear = through_the_gateway(dir.path(), &pki, raw_clear_site(answer)).await;
        assert_eq!(
            (over_tls, in_the_clear),
            (want, want),
            "a head of {head} bytes: (over TLS, in the clear)"
        );
    }
}
