//! The receiver's persisted state: every known reporter identity and the condition they
//! produce, written together so a 204 never runs ahead of what a restart would reload.
//!
//! Counters are serialized as decimal strings: they span the whole u64 range, which a
//! Kubernetes `int64` field or a JSON number read as a double cannot hold.

use crate::{Condition, Epoch, Replica, Report};

/// Everything the operator persists about gateway feedback.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReceiverState {
    /// One record per reporter identity, sorted by epoch, at most [`crate::MAX_REPORTERS`].
    pub reporters: Vec<ReporterRecord>,
    /// `GatewayAgesRejected`, derived from `reporters`.
    pub condition: Condition,
}

impl ReceiverState {
    /// The record of `epoch`, if the receiver holds one.
    pub fn reporter(&self, epoch: Epoch) -> Option<&ReporterRecord> {
        self.reporters
            .binary_search_by_key(&epoch, |r| r.epoch)
            .ok()
            .map(|i| &self.reporters[i])
    }
}

/// What the receiver remembers of one gateway process.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReporterRecord {
    /// The process.
    pub epoch: Epoch,
    /// Its diagnostic name, from its newest accepted report.
    pub replica: Replica,
    /// Newest accepted sequence.
    #[serde(with = "decimal_text")]
    pub sequence: u64,
    /// Cumulative counter of the newest accepted report.
    #[serde(with = "decimal_text")]
    pub rejected: u64,
    /// Clean flag of the newest accepted report.
    pub clean: bool,
    /// Since when (ms since the Unix epoch) this process's evidence is unresolved; `None`
    /// when resolved.
    pub unresolved_since_ms: Option<u64>,
    /// Freshness: when a report that changed this record was last accepted (ms since the
    /// Unix epoch). Exact duplicates do not move it.
    pub last_accepted_ms: u64,
}

impl ReporterRecord {
    /// Whether `report` is exactly the newest accepted one.
    pub(crate) fn is_exactly(&self, report: &Report) -> bool {
        self.sequence == report.sequence()
            && self.rejected == report.rejected()
            && self.clean == report.clean()
            && &self.replica == report.replica()
    }

    /// Whether the evidence can never be resolved: no later report can be newer or larger.
    pub fn is_terminal(&self) -> bool {
        self.sequence == u64::MAX || self.rejected == u64::MAX
    }
}

/// `u64` as a canonical decimal string, decoded with the wire's own rules.
mod decimal_text {
    use serde::{Deserialize, Deserializer, Serializer};

    // serde's `with` hands the field by reference.
    #[allow(clippy::trivially_copy_pass_by_ref)]
    pub(super) fn serialize<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        let text = String::deserialize(deserializer)?;
        crate::headers::parse_decimal("persisted counter", text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}
