//! One trust model for both daemons: PEM loading, the pin and SPIFFE verifiers, and the
//! rustls configurations built on one crypto provider.
//!
//! Both trust modes end in the same place: rustls accepts a certificate only when it is
//! trusted (pinned, or chaining to the CA, and currently valid), and [`Trust::classify`]
//! maps the verified leaf to an [`Identity`] that decides what the caller may see. The
//! operator serves and polls its peers with it; the gateway reaches its operator with it
//! ([`Identity::Local`]: the operator presents the site's own certificate, so in pin mode
//! the gateway needs no CA at all). [`webpki_client`] is the other kind of client: a
//! server verified by chain and name (an `https` EPP, a remote site, an operator reached
//! by CA and name).

mod ca;
mod fingerprint;
mod identity;
mod rotation;
mod signing;
mod verify;

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

pub use ca::{CaBundle, content_digest, watch_ca, webpki_client_following};
pub use fingerprint::Fingerprint;
pub use identity::{Identity, PinConflict, Trust};
pub use rotation::{
    CERT_CHECK_INTERVAL, CertSlot, Reload, ReloadMetrics, ReloadResult, not_after, watch,
};
pub use signing::{SIGNING_SCHEMES, SiteSigner, TrustCheck};

use crate::Error;

/// ALPN protocol of HTTP/1.1: what peers poll with and what every signals listener
/// accepts, so an HTTP/1.1-only client (a peer, `curl --http1.1`) is always served.
pub const ALPN_HTTP11: &[u8] = b"http/1.1";

/// ALPN protocol of HTTP/2, which the signals listener prefers: the local gateway holds
/// one connection to its operator and multiplexes its polls and feedback POSTs over it.
pub const ALPN_H2: &[u8] = b"h2";

/// The one crypto provider every configuration is built on, made once per process.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    Arc::clone(PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())))
}

/// The site's certificate chain, key and trust anchors.
#[derive(Debug)]
pub struct TlsMaterial {
    /// Leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's private key.
    pub key: PrivateKeyDer<'static>,
    /// CA certificates; empty when none were configured.
    pub roots: RootCertStore,
}

impl Clone for TlsMaterial {
    fn clone(&self) -> Self {
        Self {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
            roots: self.roots.clone(),
        }
    }
}

impl TlsMaterial {
    /// Reads the PEM files: the chain (leaf first), its key and, when given, a CA bundle.
    pub fn load(cert: &Path, key: &Path, ca: Option<&Path>) -> Result<Self, Error> {
        let chain = read_certs(cert)?;
        let key = read_key(key)?;
        let roots = match ca {
            Some(ca) => read_roots(ca)?,
            None => RootCertStore::empty(),
        };
        Ok(Self { chain, key, roots })
    }

    /// The site's own leaf certificate.
    pub fn leaf(&self) -> &CertificateDer<'static> {
        &self.chain[0]
    }
}

/// Reads a CA bundle into a root store.
pub fn read_roots(path: &Path) -> Result<RootCertStore, Error> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path)? {
        roots.add(cert).map_err(|e| Error::TlsMaterial {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// Reads a PEM private key (PKCS#8, PKCS#1 or SEC1).
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, Error> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| Error::TlsMaterial {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let bad = |reason: String| Error::TlsMaterial {
        path: path.to_path_buf(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no CERTIFICATE block".into()));
    }
    Ok(certs)
}

/// The signals listener's configuration: client certificates required, verified under the
/// trust mode; presents `material` for good (see [`server_config_presenting`]).
pub fn server_config(
    material: &TlsMaterial,
    trust: Arc<Trust>,
) -> Result<Arc<ServerConfig>, Error> {
    server_config_presenting(CertSlot::fixed(material)?, trust)
}

/// [`server_config`] presenting whatever `slot` holds at each handshake, so a reloaded
/// certificate is presented to new connections.
pub fn server_config_presenting(
    slot: Arc<CertSlot>,
    trust: Arc<Trust>,
) -> Result<Arc<ServerConfig>, Error> {
    let provider = provider();
    let verifier = verify::ClientVerifier::new(trust, &provider).map_err(|e| Error::Tls {
        context: "client certificate verifier",
        source: rustls::Error::General(e),
    })?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| Error::Tls {
            context: "server protocol versions",
            source,
        })?
        .with_client_cert_verifier(Arc::new(verifier))
        .with_cert_resolver(slot);
    // The server's order decides: HTTP/2 when the client offers it, HTTP/1.1 otherwise.
    config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP11.to_vec()];
    Ok(Arc::new(config))
}

/// A client configuration that presents the site's certificate and accepts only a server
/// that is `expected` (a peer when polling, [`Identity::Local`] for the local operator).
pub fn client_config(
    material: &TlsMaterial,
    trust: Arc<Trust>,
    expected: Identity,
) -> Result<Arc<ClientConfig>, Error> {
    client_config_presenting(CertSlot::fixed(material)?, trust, expected)
}

/// [`client_config`] presenting whatever `slot` holds at each handshake.
pub fn client_config_presenting(
    slot: Arc<CertSlot>,
    trust: Arc<Trust>,
    expected: Identity,
) -> Result<Arc<ClientConfig>, Error> {
    let provider = provider();
    let verifier = verify::ServerVerifier::new(trust, expected, &provider);
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| Error::Tls {
            context: "client protocol versions",
            source,
        })?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_cert_resolver(slot);
    config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
    Ok(Arc::new(config))
}

/// A client whose server must chain to `roots` and carry the name dialled (system roots
/// are never used: a grid is a closed trust domain). With `identity`, it presents that
/// certificate (a gateway toward remote sites); without, none (an `https` EPP scrape).
pub fn webpki_client(
    roots: RootCertStore,
    identity: Option<&TlsMaterial>,
    context: &'static str,
) -> Result<ClientConfig, Error> {
    let slot = identity.map(CertSlot::fixed).transpose()?;
    webpki_client_presenting(roots, slot, context)
}

/// [`webpki_client`] presenting whatever `slot` holds at each handshake.
pub fn webpki_client_presenting(
    roots: RootCertStore,
    slot: Option<Arc<CertSlot>>,
    context: &'static str,
) -> Result<ClientConfig, Error> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| Error::Tls { context, source })?
        .with_root_certificates(roots);
    Ok(match slot {
        Some(slot) => builder.with_client_cert_resolver(slot),
        None => builder.with_no_client_auth(),
    })
}

/// The identity of the peer on an accepted connection, from its verified certificate.
pub fn peer_identity(conn: &rustls::ServerConnection, trust: &Trust) -> Option<Identity> {
    trust.classify(conn.peer_certificates()?.first()?)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use grid_kit::pki::{Ca, Mint, SiteCert};
    use rustls_pki_types::ServerName;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    fn material(cert: &SiteCert, ca: &Ca) -> TlsMaterial {
        let mut roots = RootCertStore::empty();
        roots.add(ca.cert()).unwrap();
        TlsMaterial {
            chain: vec![cert.cert.clone()],
            key: cert.key(),
            roots,
        }
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
        let server =
            server_config(&material(&ca.site("grid.test", "a"), &ca), trust.clone()).unwrap();
        for (site, want) in [("a", Identity::Local), ("b", Identity::Peer("b".into()))] {
            let client = client_config(
                &material(&ca.site("grid.test", site), &ca),
                trust.clone(),
                Identity::Local,
            )
            .unwrap();
            let (srv, cli) = handshake(server.clone(), trust.clone(), client).await;
            assert_eq!(srv, Ok(Some(want)));
            assert_eq!(cli, Ok(()));
        }
    }

    #[tokio::test]
    async fn spiffe_a_certificate_of_another_domain_from_the_same_ca_is_classified_as_nobody() {
        let ca = Ca::new("ca");
        let trust = spiffe_trust(&ca);
        let server =
            server_config(&material(&ca.site("grid.test", "a"), &ca), trust.clone()).unwrap();
        let client = client_config(
            &material(&ca.site("other.test", "zz"), &ca),
            trust.clone(),
            Identity::Local,
        )
        .unwrap();
        let (srv, _) = handshake(server, trust, client).await;
        assert_eq!(srv, Ok(None));
    }

    #[tokio::test]
    async fn spiffe_untrusted_ca_and_expired_certificates_are_refused() {
        let ca = Ca::new("ca");
        let rogue = Ca::new("rogue");
        let trust = spiffe_trust(&ca);
        let server =
            server_config(&material(&ca.site("grid.test", "a"), &ca), trust.clone()).unwrap();
        let expired = ca.mint(&Mint {
            spiffe: Some("spiffe://grid.test/site/b".into()),
            expired: true,
            cn: "b",
        });
        for cert in [rogue.site("grid.test", "b"), expired] {
            let client =
                client_config(&material(&cert, &ca), trust.clone(), Identity::Local).unwrap();
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
        let server =
            server_config(&material(&ca.site("grid.test", "b"), &ca), trust.clone()).unwrap();
        let client = client_config(
            &material(&ca.site("grid.test", "a"), &ca),
            trust.clone(),
            Identity::Local,
        )
        .unwrap();
        let (_, cli) = handshake(server.clone(), trust.clone(), client).await;
        assert!(cli.is_err());
        let client = client_config(
            &material(&ca.site("grid.test", "a"), &ca),
            trust.clone(),
            Identity::Peer("b".into()),
        )
        .unwrap();
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
        let server = server_config(&material(&own, &ca), trust.clone()).unwrap();
        let ok = client_config(&material(&b, &ca), trust.clone(), Identity::Local).unwrap();
        let (srv, cli) = handshake(server.clone(), trust.clone(), ok).await;
        assert_eq!(srv, Ok(Some(Identity::Peer("b".into()))));
        assert_eq!(cli, Ok(()));
        // Same CA, same SPIFFE name, but not the pinned certificate.
        let unpinned = client_config(
            &material(&ca.site("grid.test", "b"), &ca),
            trust.clone(),
            Identity::Local,
        )
        .unwrap();
        assert!(
            handshake(server.clone(), trust.clone(), unpinned)
                .await
                .0
                .is_err()
        );
        let old = client_config(&material(&expired, &ca), trust.clone(), Identity::Local).unwrap();
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
        let server = server_config(&material(&own, &ca), trust.clone()).unwrap();
        let as_c = client_config(&material(&c, &ca), trust.clone(), Identity::Local).unwrap();
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
        let fresh_c = client_config(&material(&c, &ca), trust.clone(), Identity::Local).unwrap();
        let (srv, _) = handshake(server.clone(), trust.clone(), fresh_c).await;
        assert!(srv.is_err(), "{srv:?}");
        // A session resumed from before skips the chain check, not the classification:
        // it is nobody (403), never c.
        let (srv, _) = handshake(server.clone(), trust.clone(), as_c).await;
        assert!(matches!(srv, Ok(None) | Err(_)), "{srv:?}");
        let as_b = client_config(&material(&b, &ca), trust.clone(), Identity::Local).unwrap();
        let (srv, cli) = handshake(server, trust, as_b).await;
        assert_eq!(srv, Ok(Some(Identity::Peer("b".into()))));
        assert_eq!(cli, Ok(()));
    }
}
