//! Who a verified certificate belongs to.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use arc_swap::ArcSwap;
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::{CertificateDer, UnixTime};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::fingerprint::Fingerprint;

/// The authorization a caller's certificate grants; it comes from the certificate only,
/// never from a header or an address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// The site's own certificate: the local gateway (sees everything, may report feedback).
    Local,
    /// A configured peer site (sees only this site's providers).
    Peer(String),
}

/// The trust anchors and the identity map of one operator.
///
/// Chain or pin checks ([`Trust::check_validity`] and the verifiers in
/// [`crate::tls`]) decide whether a certificate is trusted at all; [`Trust::classify`] then
/// decides what it may do. A trusted certificate that classifies as nobody gets 403.
///
/// The map can be replaced while the daemon runs ([`Trust::replace`]): every handshake and
/// every certificate check reads the one in force at that moment, so a trust declared
/// anew (another mode, CA or pin set) applies to the next connection without a restart.
#[derive(Debug)]
pub struct Trust {
    site: String,
    kind: ArcSwap<TrustKind>,
}

#[derive(Debug)]
pub(crate) enum TrustKind {
    Pin {
        /// This site's own leaf, newest first: the current one and, after a rotation, the
        /// one before it (a local peer that has not reloaded yet still presents it).
        local: RwLock<Vec<Fingerprint>>,
        peers: HashMap<Fingerprint, String>,
    },
    /// Every site of the trust domain is a peer: the domain is the grid's trust, so a
    /// member that joins is verified by its certificate alone, and configured peers are
    /// only where membership starts (seeds).
    Spiffe {
        domain: String,
        roots: Arc<RootCertStore>,
        /// The client-certificate chain check, built once per trust map (the first
        /// handshake, or [`Trust::replace`], builds it).
        clients: OnceLock<Result<Arc<dyn ClientCertVerifier>, String>>,
    },
}

impl TrustKind {
    /// The chain check a client certificate passes in SPIFFE mode; `None` in pin mode.
    pub(crate) fn client_chain(&self) -> Option<Result<Arc<dyn ClientCertVerifier>, String>> {
        let Self::Spiffe { roots, clients, .. } = self else {
            return None;
        };
        Some(
            clients
                .get_or_init(|| {
                    WebPkiClientVerifier::builder_with_provider(
                        roots.clone(),
                        super::material::provider(),
                    )
                    .build()
                    .map_err(|e| e.to_string())
                })
                .clone(),
        )
    }
}

/// Why a pin-mode trust map cannot be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinConflict {
    /// A peer's fingerprint is this site's own certificate, which would let that peer act
    /// as the local gateway.
    OwnCertificate {
        /// The peer listing it.
        peer: String,
    },
    /// Two peers list the same fingerprint, so their rows could not be attributed.
    Shared {
        /// The first peer.
        first: String,
        /// The second peer.
        second: String,
    },
}

impl Trust {
    /// Pin mode: the local gateway is this site's own leaf; each peer its fingerprints.
    pub fn pin(
        site: &str,
        own_leaf: &CertificateDer<'_>,
        peers: impl IntoIterator<Item = (String, Vec<Fingerprint>)>,
    ) -> Result<Self, PinConflict> {
        let local = Fingerprint::of_der(own_leaf);
        let mut map = HashMap::new();
        for (name, fps) in peers {
            for fp in fps {
                if fp == local {
                    return Err(PinConflict::OwnCertificate { peer: name });
                }
                if let Some(first) = map.insert(fp, name.clone())
                    && first != name
                {
                    return Err(PinConflict::Shared {
                        first,
                        second: name,
                    });
                }
            }
        }
        Ok(Self {
            site: site.to_owned(),
            kind: ArcSwap::from_pointee(TrustKind::Pin {
                local: RwLock::new(vec![local]),
                peers: map,
            }),
        })
    }

    /// SPIFFE mode: certificates chain to `roots` and name `spiffe://<domain>/site/<name>`;
    /// `<name>` is this site (the local gateway) or a peer.
    pub fn spiffe(site: &str, domain: &str, roots: RootCertStore) -> Self {
        Self {
            site: site.to_owned(),
            kind: ArcSwap::from_pointee(TrustKind::Spiffe {
                domain: domain.to_owned(),
                roots: Arc::new(roots),
                clients: OnceLock::new(),
            }),
        }
    }

    /// Puts `next`'s map in force for every handshake and certificate check from now on;
    /// connections already open keep the identity they were classified as. In pin mode
    /// this site's own leaves carry over when both maps are pin maps, so a rotation
    /// in flight is not forgotten.
    ///
    /// # Errors
    ///
    /// `next` is another site's trust, or its CA cannot verify client certificates; the
    /// map in force is kept.
    pub fn replace(&self, next: Self) -> Result<(), String> {
        if next.site != self.site {
            return Err(format!(
                "the new trust is site `{}`'s, not `{}`'s",
                next.site, self.site
            ));
        }
        let next = next.kind.into_inner();
        if let Some(Err(e)) = next.client_chain() {
            return Err(e);
        }
        let current = self.kind.load();
        if let (TrustKind::Pin { local: was, .. }, TrustKind::Pin { local: now, peers }) =
            (&**current, &*next)
        {
            let was = was.read().unwrap_or_else(PoisonError::into_inner);
            let mut now = now.write().unwrap_or_else(PoisonError::into_inner);
            for fp in was.iter() {
                if !now.contains(fp) && !peers.contains_key(fp) && now.len() < 2 {
                    now.push(*fp);
                }
            }
        }
        self.kind.store(next);
        Ok(())
    }

    /// In SPIFFE mode, puts `roots` in force as the CA (a bundle rewritten in place),
    /// keeping the domain; pin mode has no CA to change.
    ///
    /// # Errors
    ///
    /// `roots` cannot verify client certificates; the map in force is kept.
    pub fn replace_roots(&self, roots: RootCertStore) -> Result<(), String> {
        let TrustKind::Spiffe { domain, .. } = &*self.kind() else {
            return Ok(());
        };
        self.replace(Self::spiffe(&self.site, domain, roots))
    }

    /// This site's name.
    pub fn site(&self) -> &str {
        &self.site
    }

    /// The map in force now.
    pub(crate) fn kind(&self) -> Arc<TrustKind> {
        self.kind.load_full()
    }

    /// Whether the map in force is a pin map.
    pub fn is_pin(&self) -> bool {
        matches!(**self.kind.load(), TrustKind::Pin { .. })
    }

    /// What a trusted leaf certificate may do: `None` when it is nobody this operator knows.
    pub fn classify(&self, leaf: &CertificateDer<'_>) -> Option<Identity> {
        match &**self.kind.load() {
            TrustKind::Pin { local, peers } => {
                let fp = Fingerprint::of_der(leaf);
                let local = local.read().unwrap_or_else(PoisonError::into_inner);
                if local.contains(&fp) {
                    Some(Identity::Local)
                } else {
                    peers.get(&fp).map(|name| Identity::Peer(name.clone()))
                }
            }
            TrustKind::Spiffe { domain, .. } => {
                let name = spiffe_site(leaf, domain)?;
                Some(if name == self.site {
                    Identity::Local
                } else {
                    Identity::Peer(name)
                })
            }
        }
    }

    /// In pin mode, `leaf` becomes this site's own certificate, the previous one still
    /// accepted until the next rotation (both daemons of a site reload on their own
    /// schedule); SPIFFE mode names the site in the certificate and needs nothing.
    ///
    /// # Errors
    ///
    /// The peer whose pin `leaf` is: it would let that peer act as the local gateway.
    pub fn rotate_local(&self, leaf: Fingerprint) -> Result<(), String> {
        let kind = self.kind.load();
        let TrustKind::Pin { local, peers } = &**kind else {
            return Ok(());
        };
        if let Some(peer) = peers.get(&leaf) {
            return Err(peer.clone());
        }
        let mut local = local.write().unwrap_or_else(PoisonError::into_inner);
        if local.first() != Some(&leaf) {
            local.insert(0, leaf);
            local.truncate(2);
        }
        Ok(())
    }

    /// Whether `now` is inside the certificate's validity period. Pin mode has no chain
    /// walk to do this, so an expired pinned certificate would otherwise be accepted.
    pub fn check_validity(leaf: &CertificateDer<'_>, now: UnixTime) -> Result<(), rustls::Error> {
        let (_, cert) = X509Certificate::from_der(leaf).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
        })?;
        let now = now.as_secs() as i64;
        let validity = cert.validity();
        if now < validity.not_before.timestamp() {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidYet,
            ));
        }
        if now > validity.not_after.timestamp() {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Expired,
            ));
        }
        Ok(())
    }
}

/// The site name in the certificate's one SPIFFE URI SAN under `domain`. An X.509-SVID
/// carries exactly one URI SAN; a certificate with several is refused rather than guessed.
fn spiffe_site(leaf: &CertificateDer<'_>, domain: &str) -> Option<String> {
    let (_, cert) = X509Certificate::from_der(leaf).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    let mut uris = san.value.general_names.iter().filter_map(|g| match g {
        GeneralName::URI(u) => Some(*u),
        _ => None,
    });
    let uri = uris.next()?;
    if uris.next().is_some() {
        return None;
    }
    let rest = uri.strip_prefix("spiffe://")?;
    let (dom, path) = rest.split_once('/')?;
    if dom != domain {
        return None;
    }
    let name = path.strip_prefix("site/")?;
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    valid.then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use grid_kit::pki::{Ca, Mint};

    fn spiffe_trust(ca: &Ca) -> Trust {
        let mut roots = RootCertStore::empty();
        roots.add(ca.cert()).unwrap();
        Trust::spiffe("a", "grid.test", roots)
    }

    #[test]
    fn spiffe_identities_map_to_local_any_other_site_of_the_domain_or_nobody() {
        let ca = Ca::new("ca");
        let t = spiffe_trust(&ca);
        assert_eq!(
            t.classify(&ca.site("grid.test", "a").cert),
            Some(Identity::Local)
        );
        assert_eq!(
            t.classify(&ca.site("grid.test", "b").cert),
            Some(Identity::Peer("b".into()))
        );
        assert_eq!(
            t.classify(&ca.site("grid.test", "c").cert),
            Some(Identity::Peer("c".into())),
            "a site no configuration names"
        );
        assert_eq!(t.classify(&ca.site("other.test", "a").cert), None);
        let no_uri = ca.mint(&Mint {
            spiffe: None,
            expired: false,
            cn: "a",
        });
        assert_eq!(t.classify(&no_uri.cert), None);
        let wrong_path = ca.mint(&Mint {
            spiffe: Some("spiffe://grid.test/ns/a".into()),
            expired: false,
            cn: "a",
        });
        assert_eq!(t.classify(&wrong_path.cert), None);
    }

    #[test]
    fn a_replaced_trust_classifies_from_the_next_call_and_keeps_the_rotated_own_leaf() {
        let ca = Ca::new("ca");
        let own = ca.site("grid.test", "a");
        let renewed = ca.site("grid.test", "a");
        let b = ca.site("grid.test", "b");
        let pins = |fps: Vec<Fingerprint>| {
            Trust::pin("a", &renewed.cert, [("b".to_owned(), fps)]).unwrap()
        };
        let t = Trust::pin("a", &own.cert, std::iter::empty()).unwrap();
        t.rotate_local(Fingerprint::of_der(&renewed.cert)).unwrap();
        assert_eq!(t.classify(&b.cert), None);
        t.replace(pins(vec![Fingerprint::of_der(&b.cert)])).unwrap();
        assert_eq!(t.classify(&b.cert), Some(Identity::Peer("b".into())));
        // A local peer that has not reloaded since the rotation is still local.
        assert_eq!(t.classify(&own.cert), Some(Identity::Local));
        assert_eq!(t.classify(&renewed.cert), Some(Identity::Local));
        // Pin to SPIFFE: the domain decides, the pins are gone.
        t.replace(spiffe_trust(&ca)).unwrap();
        assert!(!t.is_pin());
        assert_eq!(
            t.classify(&ca.site("grid.test", "c").cert),
            Some(Identity::Peer("c".into()))
        );
    }

    #[test]
    fn another_sites_trust_or_a_ca_that_cannot_verify_clients_is_not_put_in_force() {
        let ca = Ca::new("ca");
        let t = spiffe_trust(&ca);
        let other = Trust::spiffe("b", "grid.test", RootCertStore::empty());
        assert!(t.replace(other).is_err());
        let empty = Trust::spiffe("a", "grid.test", RootCertStore::empty());
        assert!(t.replace(empty).is_err());
        assert_eq!(
            t.classify(&ca.site("grid.test", "a").cert),
            Some(Identity::Local),
            "the map in force is kept"
        );
    }

    #[test]
    fn pin_identities_map_by_fingerprint() {
        let ca = Ca::new("ca");
        let own = ca.site("grid.test", "a");
        let b = ca.site("grid.test", "b");
        let t = Trust::pin(
            "a",
            &own.cert,
            [("b".to_owned(), vec![Fingerprint::of_der(&b.cert)])],
        )
        .unwrap();
        assert_eq!(t.classify(&own.cert), Some(Identity::Local));
        assert_eq!(t.classify(&b.cert), Some(Identity::Peer("b".into())));
        assert_eq!(t.classify(&ca.site("grid.test", "b").cert), None);
    }

    #[test]
    fn pinning_the_own_certificate_for_a_peer_is_refused() {
        let ca = Ca::new("ca");
        let own = ca.site("grid.test", "a");
        let err = Trust::pin(
            "a",
            &own.cert,
            [("b".to_owned(), vec![Fingerprint::of_der(&own.cert)])],
        )
        .unwrap_err();
        assert_eq!(err, PinConflict::OwnCertificate { peer: "b".into() });
        let x = Fingerprint::of_der(b"x");
        let err = Trust::pin(
            "a",
            &own.cert,
            [("b".to_owned(), vec![x]), ("c".to_owned(), vec![x])],
        )
        .unwrap_err();
        assert!(matches!(err, PinConflict::Shared { .. }));
    }

    #[test]
    fn expired_certificate_fails_the_validity_check() {
        let ca = Ca::new("ca");
        let expired = ca.mint(&Mint {
            spiffe: None,
            expired: true,
            cn: "old",
        });
        let now = UnixTime::since_unix_epoch(std::time::Duration::from_secs(1_800_000_000));
        assert_eq!(
            Trust::check_validity(&expired.cert, now),
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Expired
            ))
        );
        assert!(Trust::check_validity(&ca.site("d", "a").cert, now).is_ok());
    }
}
