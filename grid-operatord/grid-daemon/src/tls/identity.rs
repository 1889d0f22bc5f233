//! Who a verified certificate belongs to.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::RootCertStore;
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
#[derive(Debug)]
pub struct Trust {
    site: String,
    kind: TrustKind,
}

#[derive(Debug)]
pub(crate) enum TrustKind {
    Pin {
        /// This site's own leaf, newest first: the current one and, after a rotation, the
        /// one before it (a local peer that has not reloaded yet still presents it).
        local: RwLock<Vec<Fingerprint>>,
        peers: HashMap<Fingerprint, String>,
    },
    Spiffe {
        domain: String,
        peers: HashSet<String>,
        roots: Arc<RootCertStore>,
    },
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
            kind: TrustKind::Pin {
                local: RwLock::new(vec![local]),
                peers: map,
            },
        })
    }

    /// SPIFFE mode: certificates chain to `roots` and name `spiffe://<domain>/site/<name>`.
    pub fn spiffe(
        site: &str,
        domain: &str,
        peers: impl IntoIterator<Item = String>,
        roots: RootCertStore,
    ) -> Self {
        Self {
            site: site.to_owned(),
            kind: TrustKind::Spiffe {
                domain: domain.to_owned(),
                peers: peers.into_iter().collect(),
                roots: Arc::new(roots),
            },
        }
    }

    /// This site's name.
    pub fn site(&self) -> &str {
        &self.site
    }

    pub(crate) fn kind(&self) -> &TrustKind {
        &self.kind
    }

    /// What a trusted leaf certificate may do: `None` when it is nobody this operator knows.
    pub fn classify(&self, leaf: &CertificateDer<'_>) -> Option<Identity> {
        match &self.kind {
            TrustKind::Pin { local, peers } => {
                let fp = Fingerprint::of_der(leaf);
                let local = local.read().unwrap_or_else(PoisonError::into_inner);
                if local.contains(&fp) {
                    Some(Identity::Local)
                } else {
                    peers.get(&fp).map(|name| Identity::Peer(name.clone()))
                }
            }
            TrustKind::Spiffe { domain, peers, .. } => {
                let name = spiffe_site(leaf, domain)?;
                if name == self.site {
                    Some(Identity::Local)
                } else if peers.contains(&name) {
                    Some(Identity::Peer(name))
                } else {
                    None
                }
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
        let TrustKind::Pin { local, peers } = &self.kind else {
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
        Trust::spiffe("a", "grid.test", ["b".to_owned()], roots)
    }

    #[test]
    fn spiffe_identities_map_to_local_peer_or_nobody() {
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
        assert_eq!(t.classify(&ca.site("grid.test", "c").cert), None);
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
