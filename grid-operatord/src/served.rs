//! `grid_operator_served_bytes_total{kind}`: the body bytes the signals listener answered
//! with, by what was asked for, so a site's signal traffic is visible beside the
//! membership datagrams (`grid_membership_bytes_total`). Bodies only: headers and TLS
//! framing add a few hundred bytes per answer.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

grid_signals::label_values! {
    label "kind";
    /// What an answer carried: the closed `kind` label set.
    pub enum Served {
        /// `GET /v1/site/signals` for the local gateway: everything held.
        RelayLocal,
        /// `GET /v1/site/signals` for a peer that polls (this site's own providers).
        RelayPeer,
        /// One batch a gossiping peer pulled.
        Batch,
        /// A digest a gossiping peer read.
        Digest,
    }
}

/// `grid_operator_served_bytes_total{kind}`.
#[derive(Clone, Debug, Default)]
pub struct ServedMetrics {
    bytes: Family<Served, Counter>,
}

impl ServedMetrics {
    /// Registers the series with every kind at 0.
    pub fn register(registry: &mut Registry) -> Self {
        Self {
            bytes: grid_signals::labels::register_zeroed(
                registry,
                "grid_operator_served_bytes",
                "Body bytes the signals listener answered with, by what was asked for",
            ),
        }
    }

    pub(crate) fn add(&self, kind: Served, body: usize) {
        self.bytes
            .get_or_create(&kind)
            .inc_by(u64::try_from(body).unwrap_or(u64::MAX));
    }

    /// Body bytes served of `kind` so far.
    pub fn count(&self, kind: Served) -> u64 {
        self.bytes.get_or_create(&kind).get()
    }
}
