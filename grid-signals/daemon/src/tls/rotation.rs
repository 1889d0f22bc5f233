//! The site's presented certificate, swappable while the daemon runs.
//!
//! Certificates are short-lived (cert-manager renews them at two thirds of their life), so
//! both daemons re-read their key and certificate without a restart. A [`CertSlot`] is
//! the rustls resolver every server and client configuration presents from: a reload
//! parses and validates the new pair first (the key must match the leaf, the leaf must be
//! currently valid) and swaps it in atomically, so new handshakes present it and
//! connections already open keep theirs. Any error keeps the old pair: a half-written or
//! mismatched renewal never takes a site off the grid.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::client::ResolvesClientCert;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{SignatureScheme, crypto::CryptoProvider};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};

use super::fingerprint::Fingerprint;
use super::identity::Trust;
use super::material::{TlsMaterial, provider, read_certs, read_key};
use crate::Error;

/// How often a daemon compares its certificate files with what it presents. A renewal is
/// picked up within this long (SIGHUP asks at once); reading two small PEM files every few
/// seconds costs nothing.
pub const CERT_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// What a [`CertSlot::reload`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reload {
    /// The files hold the pair already presented.
    Unchanged,
    /// A new pair is presented from now on.
    Rotated {
        /// The leaf presented until now.
        from: Fingerprint,
        /// The leaf presented from now on.
        to: Fingerprint,
    },
}

/// The certificate chain and key a daemon presents, and where they are read from.
#[derive(Debug)]
pub struct CertSlot {
    current: ArcSwap<CertifiedKey>,
    /// The certificate and key files a reload reads; `None` for material held in memory.
    files: Option<(PathBuf, PathBuf)>,
}

impl CertSlot {
    /// A slot presenting `material`'s chain and key, reloaded from `cert` and `key`.
    ///
    /// # Errors
    ///
    /// When the key does not match the leaf or the provider cannot load it.
    pub fn new(material: &TlsMaterial, cert: &Path, key: &Path) -> Result<Arc<Self>, Error> {
        Self::build(material, Some((cert.to_path_buf(), key.to_path_buf())))
    }

    /// A slot for material that has no files (tests, embedders holding PEM in memory):
    /// [`CertSlot::reload`] then finds nothing to read and keeps the pair.
    ///
    /// # Errors
    ///
    /// As [`CertSlot::new`].
    pub fn fixed(material: &TlsMaterial) -> Result<Arc<Self>, Error> {
        Self::build(material, None)
    }

    fn build(
        material: &TlsMaterial,
        files: Option<(PathBuf, PathBuf)>,
    ) -> Result<Arc<Self>, Error> {
        let certified = certified(
            material.chain.clone(),
            material.key.clone_key(),
            &provider(),
            files.as_ref(),
        )?;
        Ok(Arc::new(Self {
            current: ArcSwap::from_pointee(certified),
            files,
        }))
    }

    /// The chain and key presented now.
    pub fn certified(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }

    /// The leaf presented now.
    pub fn leaf(&self) -> CertificateDer<'static> {
        self.current.load().cert[0].clone()
    }

    /// Re-reads the files and presents the pair they hold if it differs, after checking
    /// it; in pin mode `trust` learns the new leaf as this site's own (keeping the
    /// previous one until the next rotation, so a local peer that has not reloaded yet is
    /// still recognised).
    ///
    /// # Errors
    ///
    /// When a file is unreadable, the key does not match the leaf, the leaf is not valid
    /// at `now`, or the new leaf is pinned for a peer. The old pair stays presented.
    pub fn reload(&self, trust: Option<&Trust>, now: UnixTime) -> Result<Reload, Error> {
        let Some((cert, key)) = &self.files else {
            return Ok(Reload::Unchanged);
        };
        let chain = read_certs(cert)?;
        let from = Fingerprint::of_der(&self.leaf());
        let to = Fingerprint::of_der(&chain[0]);
        if from == to {
            return Ok(Reload::Unchanged);
        }
        // Read only once the leaf changed: a renewal caught between its two writes reads
        // the old leaf and is left alone.
        let key = read_key(key)?;
        Trust::check_validity(&chain[0], now).map_err(|source| Error::Tls {
            context: "renewed certificate",
            source,
        })?;
        let certified = certified(chain, key, &provider(), self.files.as_ref())?;
        if let Some(trust) = trust {
            trust.rotate_local(to).map_err(|peer| Error::TlsMaterial {
                path: cert.clone(),
                reason: format!("the renewed leaf is pinned for peer `{peer}`"),
            })?;
        }
        self.current.store(Arc::new(certified));
        Ok(Reload::Rotated { from, to })
    }
}

/// The pair as rustls presents it, its key proven to be the leaf's. A mismatch read from
/// `files` (certificate, key) names both.
fn certified(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    provider: &CryptoProvider,
    files: Option<&(PathBuf, PathBuf)>,
) -> Result<CertifiedKey, Error> {
    let refused = |source: rustls::Error| match (&source, files) {
        (rustls::Error::InconsistentKeys(_), Some((cert, key))) => Error::KeyMismatch {
            cert: cert.clone(),
            key: key.clone(),
        },
        _ => Error::Tls {
            context: "certificate and key",
            source,
        },
    };
    let certified = CertifiedKey::from_der(chain, key, provider).map_err(refused)?;
    // from_der lets an unknown consistency pass; a renewal must prove its key matches.
    certified.keys_match().map_err(refused)?;
    Ok(certified)
}

impl ResolvesServerCert for CertSlot {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

impl ResolvesClientCert for CertSlot {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

grid_signals::label_values! {
    label "result";
    /// What a certificate check that found new files did; the label of
    /// `<daemon>_certificate_reloads_total`.
    pub enum ReloadResult {
        /// A new pair is presented.
        Rotated,
        /// The new files were refused (unreadable, mismatched key, not yet or no longer
        /// valid, a peer's pin); the old pair is still presented.
        Refused,
    }
}

/// `<daemon>_certificate_reloads_total{result}` and
/// `<daemon>_certificate_expiry_timestamp_seconds`, registered under the caller's prefix.
#[derive(Clone, Debug, Default)]
pub struct ReloadMetrics {
    reloads: prometheus_client::metrics::family::Family<
        ReloadResult,
        prometheus_client::metrics::counter::Counter,
    >,
    expiry: prometheus_client::metrics::gauge::Gauge,
}

/// The end of `leaf`'s validity (`notAfter`), in seconds since the Unix epoch; none when
/// it cannot be parsed.
pub fn not_after(leaf: &CertificateDer<'_>) -> Option<i64> {
    x509_parser::parse_x509_certificate(leaf.as_ref())
        .ok()
        .map(|(_, cert)| cert.validity().not_after.timestamp())
}

impl ReloadMetrics {
    /// Registers `certificate_reloads_total{result}` in `registry` (give it the daemon's
    /// prefix: `grid_operator`, `grid_gateway`).
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        let m = Self {
            reloads: grid_signals::labels::register_zeroed(
                registry,
                "certificate_reloads",
                "Certificate checks that found new files: rotated (presented from now on) or refused (the old pair kept)",
            ),
            expiry: prometheus_client::metrics::gauge::Gauge::default(),
        };
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "When the certificate presented now stops being valid (its notAfter), in seconds since the Unix epoch",
            m.expiry.clone(),
        );
        m
    }

    /// Sets the expiry gauge to `leaf`'s `notAfter` (the leaf presented now).
    pub fn presenting(&self, leaf: &CertificateDer<'_>) {
        if let Some(at) = not_after(leaf) {
            self.expiry.set(at);
        }
    }

    /// The expiry gauge: `notAfter` of the leaf presented, seconds since the Unix epoch.
    pub fn expiry(&self) -> i64 {
        self.expiry.get()
    }

    /// Checks that ended in `result`.
    pub fn count(&self, result: ReloadResult) -> u64 {
        self.reloads.get_or_create(&result).get()
    }

    fn inc(&self, result: ReloadResult) {
        self.reloads.get_or_create(&result).inc();
    }
}

/// Reloads `slot` every `every` and whenever SIGHUP arrives, until the task is dropped;
/// each rotation is logged at info with both fingerprints, each refusal at error with its
/// reason (the old pair stays presented).
pub async fn watch(
    slot: Arc<CertSlot>,
    trust: Option<Arc<Trust>>,
    every: std::time::Duration,
    metrics: ReloadMetrics,
) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    // The same refused files are counted and logged once, not at every check.
    let mut refused: Option<String> = None;
    metrics.presenting(&slot.leaf());
    loop {
        #[cfg(unix)]
        {
            let hangup = async {
                match hup.as_mut() {
                    Some(h) => {
                        h.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = ticker.tick() => {}
                () = hangup => tracing::info!("SIGHUP: checking the certificate files now"),
            }
        }
        #[cfg(not(unix))]
        ticker.tick().await;
        let (s, t) = (Arc::clone(&slot), trust.clone());
        let checked =
            tokio::task::spawn_blocking(move || s.reload(t.as_deref(), UnixTime::now())).await;
        let failure = match checked {
            Ok(Ok(Reload::Unchanged)) => None,
            Ok(Ok(Reload::Rotated { from, to })) => {
                metrics.inc(ReloadResult::Rotated);
                metrics.presenting(&slot.leaf());
                tracing::info!(%from, %to, "certificate rotated: new connections present the renewed pair");
                None
            }
            Ok(Err(e)) => Some(e.to_string()),
            Err(e) => Some(e.to_string()),
        };
        if failure.is_some() && failure != refused {
            metrics.inc(ReloadResult::Refused);
            tracing::error!(
                error = failure.as_deref().unwrap_or_default(),
                "renewed certificate refused; still presenting the previous pair"
            );
        }
        refused = failure;
    }
}

#[cfg(test)]
mod tests {
    use grid_kit::pki::{Ca, Mint, SiteCert};

    use super::*;

    fn material(cert: &SiteCert) -> TlsMaterial {
        TlsMaterial {
            chain: vec![cert.cert.clone()],
            key: cert.key(),
            roots: rustls::RootCertStore::empty(),
        }
    }

    /// A slot presenting `first`, reading its files from `dir`.
    fn slot(dir: &Path, first: &SiteCert) -> Arc<CertSlot> {
        let (c, k) = first.write(dir, "site");
        CertSlot::new(&material(first), &c, &k).unwrap()
    }

    fn fp(cert: &SiteCert) -> Fingerprint {
        Fingerprint::of_der(&cert.cert)
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused_naming_both_files() {
        let (ca, dir) = (Ca::new("ca"), tempfile::tempdir().unwrap());
        let (site, other) = (ca.site("grid.test", "a"), ca.site("grid.test", "b"));
        let (cert, _) = site.write(dir.path(), "site");
        let (_, key) = other.write(dir.path(), "other");
        let wrong = TlsMaterial {
            key: other.key(),
            ..material(&site)
        };
        let e = CertSlot::new(&wrong, &cert, &key).unwrap_err();
        assert!(
            matches!(&e, Error::KeyMismatch { cert: c, key: k } if *c == cert && *k == key),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(
            text.contains(&*cert.to_string_lossy()) && text.contains(&*key.to_string_lossy()),
            "{text}"
        );
        // A renewal whose key is another's names both files too, and keeps the old pair.
        let slot = slot(dir.path(), &site);
        let renewed = ca.site("grid.test", "a");
        let (c, k) = renewed.write(dir.path(), "site");
        std::fs::copy(&key, &k).unwrap();
        let e = slot.reload(None, UnixTime::now()).unwrap_err();
        assert!(
            matches!(&e, Error::KeyMismatch { cert: ec, key: ek } if *ec == c && *ek == k),
            "{e:?}"
        );
        assert_eq!(Fingerprint::of_der(&slot.leaf()), fp(&site));
    }

    #[test]
    fn a_renewed_pair_is_presented_after_a_reload_and_unchanged_files_are_left_alone() {
        let (ca, dir) = (Ca::new("ca"), tempfile::tempdir().unwrap());
        let (old, new) = (ca.site("grid.test", "a"), ca.site("grid.test", "a"));
        let slot = slot(dir.path(), &old);
        assert_eq!(
            slot.reload(None, UnixTime::now()).unwrap(),
            Reload::Unchanged
        );
        new.write(dir.path(), "site");
        assert_eq!(
            slot.reload(None, UnixTime::now()).unwrap(),
            Reload::Rotated {
                from: fp(&old),
                to: fp(&new)
            }
        );
        assert_eq!(slot.leaf(), new.cert);
        assert_eq!(
            slot.reload(None, UnixTime::now()).unwrap(),
            Reload::Unchanged
        );
    }

    #[test]
    fn a_renewal_whose_key_is_not_the_leafs_is_refused_and_the_old_pair_kept() {
        let (ca, dir) = (Ca::new("ca"), tempfile::tempdir().unwrap());
        let (old, new, other) = (
            ca.site("grid.test", "a"),
            ca.site("grid.test", "a"),
            ca.site("grid.test", "a"),
        );
        let slot = slot(dir.path(), &old);
        // The certificate is written before its key: a reload between the two writes.
        new.write(dir.path(), "site");
        let (_, other_key) = other.write(dir.path(), "other");
        std::fs::copy(other_key, dir.path().join("site.key")).unwrap();
        assert!(slot.reload(None, UnixTime::now()).is_err());
        assert_eq!(slot.leaf(), old.cert);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_expiry_gauge_reads_the_presented_leafs_not_after_and_follows_a_rotation() {
        let (ca, dir) = (Ca::new("ca"), tempfile::tempdir().unwrap());
        let (old, new) = (ca.site("grid.test", "a"), ca.site("grid.test", "a"));
        let slot = slot(dir.path(), &old);
        let metrics =
            ReloadMetrics::register(&mut prometheus_client::registry::Registry::default());
        let every = std::time::Duration::from_millis(50);
        let task = tokio::spawn(watch(Arc::clone(&slot), None, every, metrics.clone()));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let at = not_after(&old.cert).unwrap();
        assert!(at > 1_700_000_000, "{at}");
        assert_eq!(metrics.expiry(), at);
        // A renewal moves the gauge to its own notAfter.
        let shorter = ca.site_until("grid.test", "a", 2099);
        let _ = new;
        shorter.write(dir.path(), "site");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while metrics.count(ReloadResult::Rotated) == 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(every).await;
        }
        assert_eq!(metrics.count(ReloadResult::Rotated), 1);
        assert_eq!(metrics.expiry(), 4_070_908_800, "2099-01-01T00:00:00Z");
        assert_ne!(at, metrics.expiry());
        task.abort();
    }

    #[test]
    fn an_expired_renewal_is_refused() {
        let (ca, dir) = (Ca::new("ca"), tempfile::tempdir().unwrap());
        let old = ca.site("grid.test", "a");
        let expired = ca.mint(&Mint {
            spiffe: Some("spiffe://grid.test/site/a".into()),
            expired: true,
            cn: "a",
        });
        let slot = slot(dir.path(), &old);
        expired.write(dir.path(), "site");
        let err = slot.reload(None, UnixTime::now()).unwrap_err().to_string();
        assert!(err.contains("renewed certificate"), "{err}");
        assert_eq!(slot.leaf(), old.cert);
    }

    #[test]
    fn in_pin_mode_the_local_pin_follows_a_rotation_and_keeps_only_the_previous_leaf() {
        let (ca, dir) = (Ca::new("ca"), tempfile::tempdir().unwrap());
        let (first, second, third, peer) = (
            ca.site("grid.test", "a"),
            ca.site("grid.test", "a"),
            ca.site("grid.test", "a"),
            ca.site("grid.test", "b"),
        );
        let trust = Trust::pin("a", &first.cert, [("b".to_owned(), vec![fp(&peer)])]).unwrap();
        let slot = slot(dir.path(), &first);
        for next in [&second, &third] {
            next.write(dir.path(), "site");
            slot.reload(Some(&trust), UnixTime::now()).unwrap();
        }
        assert_eq!(
            trust.classify(&third.cert),
            Some(super::super::Identity::Local)
        );
        assert_eq!(
            trust.classify(&second.cert),
            Some(super::super::Identity::Local)
        );
        assert_eq!(trust.classify(&first.cert), None, "two rotations ago");
        // A renewal that is a peer's pinned certificate would make that peer local.
        peer.write(dir.path(), "site");
        assert!(slot.reload(Some(&trust), UnixTime::now()).is_err());
        assert_eq!(slot.leaf(), third.cert);
    }
}
