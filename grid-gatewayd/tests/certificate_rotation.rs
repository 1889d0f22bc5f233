//! The gateway re-reads its certificate without a restart: a renewal is presented on new
//! connections to remote sites (and its operator) within one check.

use std::time::Duration;

use grid_kit::gateway_harness::fake_model::FakeModel;
use grid_kit::gateway_harness::{Cand, http1_client, post, send};
use grid_kit::pki::{Ca, server_config};
use http::StatusCode;

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_reaches_remote_sites_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (pki, rogue) = (Ca::new("grid-ca"), Ca::new("rogue-ca"));
    let site_files = pki.issue(dir.path(), "site-b", &["127.0.0.1"]);
    // Site b admits only clients the grid CA signed.
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
    // The gateway starts with a certificate b does not trust.
    let wrong = tempfile::tempdir().unwrap();
    let stale = rogue.issue(wrong.path(), "gateway", &["gateway.a.grid"]);
    let (cert, key) = (config.tls.cert.clone(), config.tls.key.clone());
    let good = (std::fs::read(&cert).unwrap(), std::fs::read(&key).unwrap());
    std::fs::copy(&stale.cert, &cert).unwrap();
    std::fs::copy(&stale.key, &key).unwrap();
    let gw = grid_gatewayd::driver::start(config).await.unwrap();
    let url = format!("http://{}/v1/chat/completions", gw.local_addr());
    let c = http1_client();
    assert_eq!(
        send(&c, post(&url, CHAT)).await.status,
        StatusCode::BAD_GATEWAY,
        "b refuses the rogue certificate"
    );
    // The renewal lands (key first, then the certificate, as an atomic renewal would).
    std::fs::write(&key, &good.1).unwrap();
    std::fs::write(&cert, &good.0).unwrap();
    let limit = grid_daemon::tls::CERT_CHECK_INTERVAL * 3;
    let start = tokio::time::Instant::now();
    loop {
        let a = send(&c, post(&url, CHAT)).await;
        if a.status == StatusCode::OK {
            assert_eq!(a.site(), Some("b"));
            break;
        }
        assert!(
            start.elapsed() < limit,
            "still {} after {limit:?}",
            a.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    gw.shutdown().await;
}
