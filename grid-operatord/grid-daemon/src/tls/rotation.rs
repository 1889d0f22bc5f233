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
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};

use super::{Fingerprint, TlsMaterial, Trust, provider, read_certs};
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
    cert: PathBuf,
    key: PathBuf,
}

impl CertSlot {
    /// A slot presenting `material`'s chain and key, reloaded from `cert` and `key`.
    ///
    /// # Errors
    ///
    /// When the key does not match the leaf or the provider cannot load it.
    pub fn new(material: &TlsMaterial, cert: &Path, key: &Path) -> Result<Arc<Self>, Error> {
        let certified = certified(
            material.chain.clone(),
            material.key.clone_key(),
            &provider(),
        )?;
        Ok(Arc::new(Self {
            current: ArcSwap::from_pointee(certified),
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        }))
    }

    /// A slot for material that has no files (tests, embedders holding PEM in memory):
    /// [`CertSlot::reload`] then finds nothing to read and keeps the pair.
    ///
    /// # Errors
    ///
    /// As [`CertSlot::new`].
    pub fn fixed(material: &TlsMaterial) -> Result<Arc<Self>, Error> {
        Self::new(material, Path::new(""), Path::new(""))
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
        if self.cert.as_os_str().is_empty() {
            return Ok(Reload::Unchanged);
        }
        let chain = read_certs(&self.cert)?;
        let from = Fingerprint::of_der(&self.leaf());
        let to = Fingerprint::of_der(&chain[0]);
        if from == to {
            return Ok(Reload::Unchanged);
        }
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(|e| Error::TlsMaterial {
            path: self.key.clone(),
            reason: e.to_string(),
        })?;
        Trust::check_validity(&chain[0], now).map_err(|source| Error::Tls {
            context: "renewed certificate",
            source,
        })?;
        let certified = certified(chain, key, &provider())?;
        if let Some(trust) = trust {
            trust.rotate_local(to).map_err(|peer| Error::TlsMaterial {
                path: self.cert.clone(),
                reason: format!("the renewed leaf is pinned for peer `{peer}`"),
            })?;
        }
        self.current.store(Arc::new(certified));
        Ok(Reload::Rotated { from, to })
    }
}

fn certified(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, Error> {
    let certified = CertifiedKey::from_der(chain, key, provider).map_err(|source| Error::Tls {
        context: "certificate and key",
        source,
    })?;
    // from_der lets an unknown consistency pass; a renewal must prove its key matches.
    certified.keys_match().map_err(|source| Error::Tls {
        context: "certificate and key",
        source,
    })?;
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
    /// What a certificate check that found new files did; the label of
    /// `<daemon>_certificate_reloads_total`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum ReloadResult {
        /// A new pair is presented.
        Rotated = "rotated",
        /// The new files were refused (unreadable, mismatched key, not yet or no longer
        /// valid, a peer's pin); the old pair is still presented.
        Refused = "refused",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ReloadLabels {
    result: ReloadResult,
}

/// `<daemon>_certificate_reloads_total{result}`, registered under the caller's prefix.
#[derive(Clone, Debug, Default)]
pub struct ReloadMetrics {
    reloads: prometheus_client::metrics::family::Family<
        ReloadLabels,
        prometheus_client::metrics::counter::Counter,
    >,
}

impl ReloadMetrics {
    /// Registers `certificate_reloads_total{result}` in `registry` (give it the daemon's
    /// prefix: `grid_operator`, `grid_gateway`).
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        let m = Self::default();
        for result in ReloadResult::ALL {
            let _ = m.reloads.get_or_create(&ReloadLabels { result });
        }
        registry.register(
            "certificate_reloads",
            "Certificate checks that found new files: rotated (presented from now on) or refused (the old pair kept)",
            m.reloads.clone(),
        );
        m
    }

    /// Checks that ended in `result`.
    pub fn count(&self, result: ReloadResult) -> u64 {
        self.reloads.get_or_create(&ReloadLabels { result }).get()
    }

    fn inc(&self, result: ReloadResult) {
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
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
        match checked {
            Ok(Ok(Reload::Unchanged)) => {}
            Ok(Ok(Reload::Rotated { from, to })) => {
                metrics.inc(ReloadResult::Rotated);
                tracing::info!(%from, %to, "certificate rotated: new connections present the renewed pair");
            }
            Ok(Err(e)) => {
                metrics.inc(ReloadResult::Refused);
                tracing::error!(error = %e, "renewed certificate refused; still presenting the previous pair");
            }
            Err(e) => {
                metrics.inc(ReloadResult::Refused);
                tracing::error!(error = %e, "certificate check failed; still presenting the previous pair");
            }
        }
    }
}
