//! What the receiver remembers of one gateway process, and how long it remembers it.
//!
//! Counters are serialized as decimal strings: they span the whole u64 range, which a
//! Kubernetes `int64` field or a JSON number read as a double cannot hold.

use crate::{Epoch, Replica, Report};

/// How long a reporter's unresolved evidence survives its silence (7 days): past it, with
/// no report of that process accepted, the next write retires it, counts it in
/// `grid_operator_feedback_evidence_expired_total` and, once nothing unresolved is left,
/// clears `GatewayAgesRejected` with reason `UnresolvedEvidenceExpired`. Until then
/// unresolved evidence survives silence, replacement and restart, as the spec requires;
/// the bound exists because a gateway process that is gone can never report clean, so
/// without it the condition could never clear.
pub const UNRESOLVED_RETENTION_MS: u64 = 7 * 24 * 3_600_000;
/// How long a reporter whose evidence is resolved is remembered after its last accepted
/// report (1 hour): then it is retired, so its slot is free and `overflow` means every
/// slot holds unresolved evidence. A retired clean process that reports again is a new
/// identity, judged from zero.
pub const RESOLVED_RETENTION_MS: u64 = 3_600_000;

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
