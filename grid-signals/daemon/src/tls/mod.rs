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
mod configs;
mod fingerprint;
mod identity;
mod material;
mod rotation;
mod signing;
mod verify;

pub use ca::{CaBundle, content_digest, watch_ca, webpki_client_following};
pub use configs::{
    client_config, client_config_presenting, peer_identity, server_config,
    server_config_presenting, webpki_client, webpki_client_presenting,
};
pub use fingerprint::Fingerprint;
pub use identity::{Identity, PinConflict, Trust};
pub use material::{ALPN_H2, ALPN_HTTP11, TlsMaterial, provider, read_roots};
pub use rotation::{
    CERT_CHECK_INTERVAL, CertSlot, Reload, ReloadMetrics, ReloadResult, not_after, watch,
};
pub use signing::{SIGNING_SCHEMES, SiteSigner, TrustCheck};
