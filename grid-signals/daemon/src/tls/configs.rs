//! The rustls configurations both daemons use: the signals listener's (client
//! certificates verified under the trust mode), the pinned or CA-verified client toward
//! a peer or the local operator, and the webpki client toward an `https` EPP or site.

use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore, ServerConfig};

use super::identity::{Identity, Trust};
use super::material::{ALPN_H2, ALPN_HTTP11, TlsMaterial, provider};
use super::rotation::CertSlot;
use super::verify;
use crate::Error;

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
