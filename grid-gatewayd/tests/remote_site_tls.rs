//! Remote sites are reached over TLS with the gateway's certificate, verified against the
//! grid CA.

use grid_kit::gateway_harness::fake_model::FakeModel;
use grid_kit::gateway_harness::{Cand, http1_client, post, send};
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
