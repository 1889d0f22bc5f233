//! `GET /v1/grid/routing` on the metrics listener: what this operator concluded per
//! provider (readiness verdict and reason, last scrape), the fences it holds, and its
//! peers (membership, last poll or gossip exchange, why one is not polled). A read of
//! state the operator holds, bounded by grid-daemon's `evidence` caps.

use grid_daemon::evidence::{
    Exchange, HeldFence, MAX_HELD, MAX_PEERS, OperatorRouting, PeerEvidence, ProviderEvidence,
};
use grid_signals::epp::ReadyStatus;
use prometheus_client::metrics::gauge::Gauge;

use crate::peer_ledger::PeerLedger;
use crate::providers::{ScrapeMetrics, Verdicts};
use crate::site_machine::{SharedSignals, lock};

/// What the operator's evidence is read from.
#[derive(Debug)]
pub struct EvidenceSource {
    /// This site.
    pub site: String,
    /// Its network.
    pub network: String,
    /// `gossip` or `poll`.
    pub mode: &'static str,
    /// Its publisher epoch.
    pub epoch: u64,
    /// The configured peers' names, in configuration order.
    pub configured: Vec<String>,
    /// The providers' verdicts.
    pub verdicts: tokio::sync::watch::Receiver<Verdicts>,
    /// The providers' last scrapes.
    pub scrapes: ScrapeMetrics,
    /// The stores (their fences).
    pub signals: SharedSignals,
    /// Each peer's last exchange.
    pub ledger: PeerLedger,
    /// Who membership says is live; none when membership does not run.
    pub membership: Option<tokio::sync::watch::Receiver<crate::membership::View>>,
    /// `GatewayAgesRejected`.
    pub ages_rejected: Gauge,
    /// The wall clock ages are read against.
    pub clock: crate::clock::Clock,
}

fn age_s(now_ms: u64, at_ms: u64) -> f64 {
    now_ms.saturating_sub(at_ms) as f64 / 1_000.0
}

impl EvidenceSource {
    fn providers(&self, now_ms: u64) -> Vec<ProviderEvidence> {
        self.verdicts
            .borrow()
            .iter()
            .map(|v| {
                let name = v.provider.name.clone();
                ProviderEvidence {
                    ready: v.readiness.and_then(|r| match r.status {
                        ReadyStatus::Ready => Some(true),
                        ReadyStatus::NotReady => Some(false),
                        ReadyStatus::Unknown => None,
                    }),
                    reason: v.readiness.map(|r| r.reason.label().as_str().to_owned()),
                    last_scrape: self
                        .scrapes
                        .last_scrape(&name)
                        .map(|(result, at)| Exchange {
                            kind: "scrape".into(),
                            result: result.into(),
                            at_ms: at,
                            age_seconds: age_s(now_ms, at),
                        }),
                    name,
                }
            })
            .collect()
    }

    /// The document as of `now_ms`.
    pub fn document(&self, now_ms: u64) -> OperatorRouting {
        let providers = self.providers(now_ms);
        let mut fences = lock(&self.signals).export_fences().records;
        // This site's own first, then the peers', each by name.
        fences.sort_by(|a, b| {
            (a.site != self.site, &a.site, &a.provider).cmp(&(
                b.site != self.site,
                &b.site,
                &b.provider,
            ))
        });
        let held_left_out = fences.len().saturating_sub(MAX_HELD);
        let held = fences
            .into_iter()
            .take(MAX_HELD)
            .map(|r| HeldFence {
                site: r.site,
                provider: r.provider,
                epoch: r.fence.epoch,
                sequence: r.fence.sequence,
            })
            .collect();
        let view = self.membership.as_ref().map(|m| m.borrow().clone());
        let ledger = self.ledger.snapshot();
        let mut names: Vec<(String, bool)> =
            self.configured.iter().map(|n| (n.clone(), true)).collect();
        let mut others: Vec<String> = ledger
            .iter()
            .map(|(n, _)| n.clone())
            .chain(
                view.iter()
                    .flat_map(|v| v.live.keys().chain(v.down.iter()).cloned()),
            )
            .filter(|n| *n != self.site && !self.configured.contains(n))
            .collect();
        others.sort();
        others.dedup();
        names.extend(others.into_iter().map(|n| (n, false)));
        let peers_left_out = names.len().saturating_sub(MAX_PEERS);
        let peers = names
            .into_iter()
            .take(MAX_PEERS)
            .map(|(name, configured)| {
                let record = ledger
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, r)| r.clone())
                    .unwrap_or_default();
                let membership = match &view {
                    None => "off",
                    Some(v) if v.live.contains_key(&name) => "alive",
                    Some(v) if v.down.contains(&name) => "down",
                    Some(_) => "unknown",
                };
                PeerEvidence {
                    membership: membership.into(),
                    last_exchange: record.last.map(|(kind, result, at)| Exchange {
                        kind: kind.into(),
                        result: result.into(),
                        at_ms: at,
                        age_seconds: age_s(now_ms, at),
                    }),
                    last_ok_ms: record.last_ok_ms,
                    skipped: record.skipped.map(|r| r.as_str().to_owned()),
                    name,
                    configured,
                }
            })
            .collect();
        OperatorRouting {
            daemon: "operator".into(),
            site: self.site.clone(),
            network: self.network.clone(),
            mode: self.mode.into(),
            epoch: self.epoch,
            generated_at_ms: now_ms,
            gateway_ages_rejected: self.ages_rejected.get() != 0,
            providers,
            held,
            held_left_out,
            peers,
            peers_left_out,
        }
    }
}

#[cfg(test)]
mod tests {
    use grid_signals::batch::{Fence, FenceRecord, FenceSet};
    use grid_signals::site::{Site, SiteConfig};
    use grid_signals::store::StoreConfig;

    use super::*;

    fn source(configured: Vec<String>) -> EvidenceSource {
        let site = Site::new(
            SiteConfig {
                site: "a".into(),
                epoch: 1,
                scrape_interval_ms: 1_000,
                store: StoreConfig::default(),
            },
            &[],
            0,
        );
        EvidenceSource {
            site: "a".into(),
            network: "n".into(),
            mode: "poll",
            epoch: 1,
            configured,
            verdicts: tokio::sync::watch::channel(Vec::new()).1,
            scrapes: ScrapeMetrics::default(),
            signals: SharedSignals::new(site),
            ledger: PeerLedger::default(),
            membership: None,
            ages_rejected: Gauge::default(),
            clock: crate::clock::Clock::system(),
        }
    }

    #[test]
    fn the_document_lists_at_most_max_peers_and_says_how_many_it_left_out() {
        for (peers, left_out) in [(MAX_PEERS, 0), (MAX_PEERS + 1, 1)] {
            let names: Vec<String> = (0..peers).map(|i| format!("p{i:04}")).collect();
            let doc = source(names).document(1);
            assert_eq!((doc.peers.len(), doc.peers_left_out), (MAX_PEERS, left_out));
            assert!(
                doc.peers
                    .iter()
                    .all(|p| p.configured && p.membership == "off")
            );
        }
    }

    #[test]
    fn the_document_lists_every_fence_the_store_can_hold_own_first_and_the_store_refuses_more() {
        // MAX_HELD is the store's own cap: a store at it is listed whole, and one more
        // provider is refused by the store, never left out of the document.
        for (held, refused) in [(MAX_HELD, 0), (MAX_HELD + 1, 1)] {
            let s = source(Vec::new());
            let mut records: Vec<FenceRecord> = (0..held - 1)
                .map(|i| FenceRecord {
                    site: format!("peer{i:04}"),
                    provider: "p".into(),
                    fence: Fence::new(1_000, 1),
                })
                .collect();
            records.push(FenceRecord {
                site: "a".into(),
                provider: "own".into(),
                fence: Fence::new(1_000, 7),
            });
            records.sort_by(|x, y| (&x.site, &x.provider).cmp(&(&y.site, &y.provider)));
            let import = lock(&s.signals).import_fences(&FenceSet { records }, 2_000);
            assert_eq!(
                (import.applied, import.refused),
                (MAX_HELD, refused),
                "{import:?}"
            );
            let doc = s.document(2_000);
            assert_eq!((doc.held.len(), doc.held_left_out), (MAX_HELD, 0));
            assert_eq!((doc.held[0].site.as_str(), doc.held[0].sequence), ("a", 7));
        }
    }
}
