//! Remote sites are reached over TLS with the gateway's certificate, verified against the
//! grid CA.

use std::io::{Read as _, Write as _};
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
    let config = grid_kit::gateway_harness::config(
        dir.path(),
        &pki,
        "https://127.0.0.1:9",
        &[(
            "m",
            vec![Cand {
                site: "b",
                provider: "p",
                base_url: up.https_base_url(),
            }],
        )],
    );
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
    let config = grid_kit::gateway_harness::config(
        dir.path(),
        &pki,
        "https://127.0.0.1:9",
        &[(
            "m",
            vec![Cand {
                site: "b",
                provider: "p",
                base_url: up.https_base_url(),
            }],
        )],
    );
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
        let mut tls = rustls::StreamOwned::new(rustls::ServerConnection::new(config).unwrap(), tcp);
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let head_end = loop {
            if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = tls.read(&mut buf).unwrap();
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
            let n = tls.read(&mut buf).unwrap();
            assert!(n > 0, "the gateway closed before its request's body");
            got.extend_from_slice(&buf[..n]);
        }
        tls.write_all(answer).unwrap();
        tls.flush().unwrap();
        // Held open until the gateway closes (or the read bound passes).
        let _ = tls.read(&mut buf);
    });
    url
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
    let config = grid_kit::gateway_harness::config(
        dir.path(),
        &pki,
        "https://127.0.0.1:9",
        &[(
            "m",
            vec![Cand {
                site: "b",
                provider: "p",
                base_url,
            }],
        )],
    );
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
