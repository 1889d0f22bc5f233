//! One Pingora `Backend` per site of grid's catalog.
//!
//! Pingora's backends are socket addresses; grid's sites are base URLs. Each backend
//! carries its site's name in its extensions ([`SiteOf`]), which is how selection and
//! health find the site again without a map per request.

use std::collections::{BTreeSet, HashMap};
use std::net::ToSocketAddrs as _;

use async_trait::async_trait;
use grid_gateway::upstream::Published;
use grid_score::catalog::Upstream;
use pingora_load_balancing::Backend;
use pingora_load_balancing::discovery::ServiceDiscovery;

use crate::Error;

/// The site a backend is, in its `ext`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteOf {
    /// `grid_site`.
    pub site: std::sync::Arc<str>,
    /// Whether the site's base URL is `https`.
    pub tls: bool,
    /// The host to present in TLS SNI and `Host`.
    pub host: String,
}

/// The backend of `upstream`: its authority resolved, its site in `ext`.
///
/// # Errors
///
/// When the authority does not resolve.
pub fn backend_of(upstream: &Upstream) -> Result<Backend, Error> {
    let authority = upstream.authority();
    let default_port = if upstream.scheme() == "https" {
        443
    } else {
        80
    };
    let with_port = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_owned()
    } else {
        format!("{authority}:{default_port}")
    };
    let resolve_error = |source| Error::Resolve {
        site: upstream.site.to_string(),
        authority: authority.to_owned(),
        source,
    };
    let addr = with_port
        .to_socket_addrs()
        .map_err(resolve_error)?
        .next()
        .ok_or_else(|| Error::NoAddress {
            site: upstream.site.to_string(),
            authority: authority.to_owned(),
        })?;
    let mut backend = Backend {
        addr: pingora_core::protocols::l4::socket::SocketAddr::Inet(addr),
        weight: 1,
        ext: http::Extensions::new(),
    };
    let host = with_port
        .rsplit_once(':')
        .map_or(with_port.as_str(), |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    backend.ext.insert(SiteOf {
        site: upstream.site.clone(),
        tls: upstream.scheme() == "https",
        host,
    });
    Ok(backend)
}

/// Pingora's service discovery over grid's catalog: one backend per site (a site serving
/// several models, or through several providers, is one backend: grid picks the site).
#[derive(Clone, Debug)]
pub struct SiteBackends {
    published: Published,
}

impl SiteBackends {
    /// The sites of whatever view `published` holds when asked.
    pub fn new(published: Published) -> Self {
        Self { published }
    }

    /// The backends now, each site once.
    ///
    /// # Errors
    ///
    /// The first site whose authority does not resolve.
    pub fn list(&self) -> Result<BTreeSet<Backend>, Error> {
        let view = self.published.load();
        let mut seen = std::collections::HashSet::new();
        let mut out = BTreeSet::new();
        for model in view.catalog().models() {
            for upstream in &model.upstreams {
                if seen.insert(upstream.site.clone()) {
                    out.insert(backend_of(upstream)?);
                }
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl ServiceDiscovery for SiteBackends {
    async fn discover(&self) -> pingora_core::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        let backends = self.list().map_err(|e| {
            pingora_core::Error::because(
                pingora_core::ErrorType::InternalError,
                "listing grid's sites",
                e,
            )
        })?;
        Ok((backends, HashMap::new()))
    }
}

/// The peer Pingora connects to for `backend`: its address, TLS and SNI from its site
/// (a backend grid did not list is plain HTTP with no SNI).
pub fn peer_of(backend: &Backend) -> pingora_core::upstreams::peer::HttpPeer {
    let (tls, host) = backend
        .ext
        .get::<SiteOf>()
        .map_or((false, String::new()), |s| (s.tls, s.host.clone()));
    pingora_core::upstreams::peer::HttpPeer::new(backend.addr.clone(), tls, host)
}
