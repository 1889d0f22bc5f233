//! `GatewayAgesRejected`: the operator's statement that a gateway discarded readings for
//! implausible ages and has not yet reported clean since.
//!
//! It explains discarded signals to a human. It never changes routing, the network phase
//! or any failure mode: nothing in grid reads it back.

use crate::record::{ReporterRecord, UNRESOLVED_RETENTION_MS};

/// The condition type, as it appears in the `GridNetwork` status.
pub const CONDITION_TYPE: &str = "GatewayAgesRejected";

/// Kubernetes condition status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ConditionStatus {
    /// Some reporter's evidence is unresolved.
    True,
    /// Every known reporter's evidence is resolved (or none ever reported).
    False,
}

/// Why the condition has its status: a closed set, CamelCase as Kubernetes reasons are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ConditionReason {
    /// At least one reporter's evidence is unresolved.
    ReadingsRejected,
    /// No reporter's evidence is unresolved.
    NoRejectedReadings,
    /// No reporter's evidence is unresolved because the last of it expired: its process
    /// was silent longer than [`UNRESOLVED_RETENTION_MS`]. Kept while the status
    /// stays False, so the reader sees the evidence was retired, not resolved.
    UnresolvedEvidenceExpired,
}

impl ConditionReason {
    /// The Kubernetes `reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadingsRejected => "ReadingsRejected",
            Self::NoRejectedReadings => "NoRejectedReadings",
            Self::UnresolvedEvidenceExpired => "UnresolvedEvidenceExpired",
        }
    }
}

/// The condition as persisted together with the reporter records it was derived from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// True while any reporter's evidence is unresolved.
    pub status: ConditionStatus,
    /// Follows the status.
    pub reason: ConditionReason,
    /// Names how many reporters are unresolved and which replicas they are.
    pub message: String,
    /// How many reporter identities (gateway processes) hold unresolved evidence.
    pub unresolved_replicas: u32,
    /// When the status last flipped, milliseconds since the Unix epoch.
    pub last_transition_ms: u64,
}

impl Condition {
    /// Derives the condition from the records; the transition time moves only when the
    /// status flips, as Kubernetes conditions expect. `expired` is how many unresolved
    /// records were just retired for silence: with nothing unresolved left, the reason
    /// says the evidence expired (and keeps saying so while the status stays False).
    pub(crate) fn derive(
        records: &[ReporterRecord],
        previous: Option<&Condition>,
        now_ms: u64,
        expired: usize,
    ) -> Self {
        let mut names: Vec<&str> = records
            .iter()
            .filter(|r| r.unresolved_since_ms.is_some())
            .map(|r| r.replica.as_str())
            .collect();
        let unresolved = names.len();
        names.sort_unstable();
        names.dedup();
        let still_expired = previous.filter(|p| {
            p.status == ConditionStatus::False
                && p.reason == ConditionReason::UnresolvedEvidenceExpired
        });
        let (status, reason, message) = if unresolved == 0 && expired > 0 {
            let days = UNRESOLVED_RETENTION_MS / 86_400_000;
            (
                ConditionStatus::False,
                ConditionReason::UnresolvedEvidenceExpired,
                format!(
                    "No gateway replica has unresolved rejections of implausible reading ages: \
                     the evidence of {expired} silent for more than {days} days expired unresolved"
                ),
            )
        } else if let (0, Some(p)) = (unresolved, still_expired) {
            (ConditionStatus::False, p.reason, p.message.clone())
        } else if unresolved == 0 {
            (
                ConditionStatus::False,
                ConditionReason::NoRejectedReadings,
                "No gateway replica has unresolved rejections of implausible reading ages"
                    .to_owned(),
            )
        } else {
            let (noun, verb) = if unresolved == 1 {
                ("replica", "has")
            } else {
                ("replicas", "have")
            };
            (
                ConditionStatus::True,
                ConditionReason::ReadingsRejected,
                format!(
                    "{unresolved} gateway {noun} rejected readings with implausible ages and {verb} \
                     not reported clean since ({}); those signals were discarded, routing is unchanged",
                    names.join(", ")
                ),
            )
        };
        let last_transition_ms = match previous {
            Some(p) if p.status == status => p.last_transition_ms,
            _ => now_ms,
        };
        Self {
            status,
            reason,
            message,
            unresolved_replicas: unresolved as u32,
            last_transition_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Epoch, Replica};

    fn record(epoch: u64, replica: &str, unresolved: bool) -> ReporterRecord {
        ReporterRecord {
            epoch: Epoch::new(epoch).unwrap(),
            replica: Replica::new(replica).unwrap(),
            sequence: 1,
            rejected: 1,
            clean: !unresolved,
            unresolved_since_ms: unresolved.then_some(10),
            last_accepted_ms: 10,
        }
    }

    #[test]
    fn the_condition_is_false_when_nothing_is_unresolved() {
        let c = Condition::derive(&[record(1, "gw-a", false)], None, 5, 0);
        assert_eq!(c.status, ConditionStatus::False);
        assert_eq!(c.reason.as_str(), "NoRejectedReadings");
        assert_eq!(c.unresolved_replicas, 0);
        assert_eq!(c.last_transition_ms, 5);
    }

    #[test]
    fn the_message_names_how_many_replicas_are_unresolved() {
        let records = [
            record(1, "gw-b", true),
            record(2, "gw-a", true),
            record(3, "gw-c", false),
        ];
        let c = Condition::derive(&records, None, 5, 0);
        assert_eq!(c.status, ConditionStatus::True);
        assert_eq!(c.unresolved_replicas, 2);
        assert!(
            c.message.starts_with("2 gateway replicas "),
            "{}",
            c.message
        );
        assert!(c.message.contains("(gw-a, gw-b)"), "{}", c.message);
        let one = Condition::derive(&records[..1], None, 5, 0);
        assert!(
            one.message.starts_with("1 gateway replica rejected"),
            "{}",
            one.message
        );
    }

    #[test]
    fn the_transition_time_moves_only_when_the_status_flips() {
        let first = Condition::derive(&[record(1, "gw-a", true)], None, 5, 0);
        let again = Condition::derive(
            &[record(1, "gw-a", true), record(2, "gw-b", true)],
            Some(&first),
            9,
            0,
        );
        assert_eq!(again.last_transition_ms, 5);
        let cleared = Condition::derive(&[record(1, "gw-a", false)], Some(&again), 12, 0);
        assert_eq!(cleared.last_transition_ms, 12);
    }
}
