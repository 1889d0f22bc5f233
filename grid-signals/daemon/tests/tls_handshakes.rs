//! Handshakes between the daemons' rustls configurations under both trust modes: who
//! is identified as what, and what is refused.

use std::sync::Arc;
use std::time::Duration;

use grid_kit::pki::{Ca, Mint, SiteCert};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use grid_daemon::tls::{Fingerprint, Identity, Trust, client_config, peer_identity, server_config};

/// The server configuration of a daemon presenting `cert`, issued by `ca`, under `trust`.
fn server_presenting(cert: &SiteCert, ca: &Ca, trust: &Arc<Trust>) -> Arc<ServerConfig> {
    server_config(&cert.material(ca), Arc::clone(trust)).unwrap()
}

/// The client configuration of a daemon presenting `cert`, issued by `ca`, under `trust`,
/// expecting to reach `identity`.
fn client_presenting(
    cert: &SiteCert,
    ca: &Ca,
    trust: &Arc<Trust>,
    identity: Identity,
) -> Arc<ClientConfig> {
    client_config(&cert.material(ca), Arc::clone(trust), identity).unwrap()
}

fn spiffe_trust(ca: &Ca) -> Arc<Trust> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.cert()).unwrap();
    Arc::new(Trust::spiffe("a", "grid.test", roots))
}

/// What the server concluded about one connection: the classified identity, or the
/// handshake error.
async fn handshake(
    server: Arc<ServerConfig>,
    server_trust: Arc<Trust>,
    client: Arc<ClientConfig>,
) -> (Result<Option<Identity>, String>, Result<(), String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server_side = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        match acceptor.accept(tcp).await {
            Ok(mut tls) => {
                let id = peer_identity(tls.get_ref().1, &server_trust);
                let _ = tls.write_all(b"ok").await;
                let _ = tls.shutdown().await;
                Ok(id)
            }
            Err(e) => Err(e.to_string()),
        }
    });
    let client_side = async {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let connector = tokio_rustls::TlsConnector::from(client);
        let mut tls = connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        tls.read_to_end(&mut buf).await.map_err(|e| e.to_string())?;
        if buf == b"ok" {
            Ok(())
        } else {
            Err("no answer".into())
        }
    };
    let client_result = tokio::time::timeout(Duration::from_secs(10), client_side)
        .await
        .expect("client bounded");
    let server_result = tokio::time::timeout(Duration::from_secs(10), server_side)
        .await
        .expect("server bounded")
        .unwrap();
    (server_result, client_result)
}

#[tokio::test]
async fn spiffe_local_and_peer_are_identified_from_their_certificates() {
    let ca = Ca::new("ca");
    let trust = spiffe_trust(&ca);
    let server = server_presenting(&ca.site("grid.test", "a"), &ca, &trust);
    for (site, want) in [("a", Identity::Local), ("b", Identity::Peer("b".into()))] {
        let client = client_presenting(&ca.site("grid.test", site), &ca, &trust, Identity::Local);
        let (srv, cli) = handshake(server.clone(), trust.clone(), client).await;
        assert_eq!(srv, Ok(Some(want)));
        assert_eq!(cli, Ok(()));
    }
}

#[tokio::test]
async fn spiffe_a_certificate_of_another_domain_from_the_same_ca_is_classified_as_nobody() {
    let ca = Ca::new("ca");
    let trust = spiffe_trust(&ca);
    let server = server_presenting(&ca.site("grid.test", "a"), &ca, &trust);
    let client = client_presenting(&ca.site("other.test", "zz"), &ca, &trust, Identity::Local);
    let (srv, _) = handshake(server, trust, client).await;
    assert_eq!(srv, Ok(None));
}

#[tokio::test]
async fn spiffe_untrusted_ca_and_expired_certificates_are_refused() {
    let ca = Ca::new("ca");
    let rogue = Ca::new("rogue");
    let trust = spiffe_trust(&ca);
    let server = server_presenting(&ca.site("grid.test", "a"), &ca, &trust);
    let expired = ca.mint(&Mint {
        spiffe: Some("spiffe://grid.test/site/b".into()),
        expired: true,
        cn: "b",
    });
    for cert in [rogue.site("grid.test", "b"), expired] {
        let client = client_presenting(&cert, &ca, &trust, Identity::Local);
        let (srv, cli) = handshake(server.clone(), trust.clone(), client).await;
        assert!(srv.is_err(), "server accepted: {srv:?}");
        assert!(cli.is_err());
    }
}

#[tokio::test]
async fn client_refuses_a_server_with_the_wrong_identity() {
    let ca = Ca::new("ca");
    let trust = spiffe_trust(&ca);
    // The server is trusted site "b", but the client expected to reach the local operator.
    let server = server_presenting(&ca.site("grid.test", "b"), &ca, &trust);
    let client = client_presenting(&ca.site("grid.test", "a"), &ca, &trust, Identity::Local);
    let (_, cli) = handshake(server.clone(), trust.clone(), client).await;
    assert!(cli.is_err());
    let client = client_presenting(
        &ca.site("grid.test", "a"),
        &ca,
        &trust,
        Identity::Peer("b".into()),
    );
    let (srv, cli) = handshake(server, trust, client).await;
    assert_eq!(cli, Ok(()));
    assert_eq!(srv, Ok(Some(Identity::Local)));
}

#[tokio::test]
async fn pin_mode_accepts_pinned_and_refuses_unpinned_and_expired() {
    let ca = Ca::new("ca");
    let own = ca.site("grid.test", "a");
    let b = ca.site("grid.test", "b");
    let expired = ca.mint(&Mint {
        spiffe: None,
        expired: true,
        cn: "c",
    });
    let trust = Arc::new(
        Trust::pin(
            "a",
            &own.cert,
            [
                ("b".to_owned(), vec![Fingerprint::of_der(&b.cert)]),
                ("c".to_owned(), vec![Fingerprint::of_der(&expired.cert)]),
            ],
        )
        .unwrap(),
    );
    let server = server_presenting(&own, &ca, &trust);
    let ok = client_presenting(&b, &ca, &trust, Identity::Local);
    let (srv, cli) = handshake(server.clone(), trust.clone(), ok).await;
    assert_eq!(srv, Ok(Some(Identity::Peer("b".into()))));
    assert_eq!(cli, Ok(()));
    // Same CA, same SPIFFE name, but not the pinned certificate.
    let unpinned = client_presenting(&ca.site("grid.test", "b"), &ca, &trust, Identity::Local);
    assert!(
        handshake(server.clone(), trust.clone(), unpinned)
            .await
            .0
            .is_err()
    );
    let old = client_presenting(&expired, &ca, &trust, Identity::Local);
    let (srv, _) = handshake(server, trust, old).await;
    assert!(srv.unwrap_err().to_lowercase().contains("expired"));
}

#[tokio::test]
async fn a_configuration_built_before_a_trust_replacement_verifies_under_the_new_trust() {
    let ca = Ca::new("ca");
    let own = ca.site("grid.test", "a");
    let b = ca.site("grid.test", "b");
    let c = ca.site("grid.test", "c");
    let trust = spiffe_trust(&ca);
    let server = server_presenting(&own, &ca, &trust);
    let as_c = client_presenting(&c, &ca, &trust, Identity::Local);
    let (srv, _) = handshake(server.clone(), trust.clone(), as_c.clone()).await;
    assert_eq!(srv, Ok(Some(Identity::Peer("c".into()))));
    // The same running listener, now pinning only b: c is refused, b is b.
    let pinned = Trust::pin(
        "a",
        &own.cert,
        [("b".to_owned(), vec![Fingerprint::of_der(&b.cert)])],
    )
    .unwrap();
    trust.replace(pinned).unwrap();
    let fresh_c = client_presenting(&c, &ca, &trust, Identity::Local);
    let (srv, _) = handshake(server.clone(), trust.clone(), fresh_c).await;
    assert!(srv.is_err(), "{srv:?}");
    // A session resumed from before skips the chain check, not the classification:
    // it is nobody (403), never c.
    let (srv, _) = handshake(server.clone(), trust.clone(), as_c).await;
    assert!(matches!(srv, Ok(None) | Err(_)), "{srv:?}");
    let as_b = client_presenting(&b, &ca, &trust, Identity::Local);
    let (srv, cli) = handshake(server, trust, as_b).await;
    assert_eq!(srv, Ok(Some(Identity::Peer("b".into()))));
    assert_eq!(cli, Ok(()));
}
