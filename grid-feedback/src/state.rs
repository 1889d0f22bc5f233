//! The receiver's persisted state: every known reporter identity and the condition they
//! produce, written together so a 204 never runs ahead of what a restart would reload.

use crate::Epoch;
use crate::condition::Condition;
use crate::record::ReporterRecord;

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
