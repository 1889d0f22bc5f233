//! Encoding what the store holds back to exposition: the operator's relay to its gateway.

use super::Store;
use crate::exposition::MAX_EXPOSITION_BYTES;

/// Default line budget of a relay body. At roughly 100 bytes a line, the byte budget
/// ([`MAX_EXPOSITION_BYTES`]) is normally reached first; the line budget bounds the
/// receiver's per-line work when lines are short.
pub const DEFAULT_RELAY_MAX_LINES: usize = 16_384;

/// How much one relay body may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelayBudget {
    /// Most bytes; the default is the receiver's body cap, so a relay is never `body_cap`.
    pub max_bytes: usize,
    /// Most lines (metadata lines and rows).
    pub max_lines: usize,
}

impl Default for RelayBudget {
    fn default() -> Self {
        Self {
            max_bytes: MAX_EXPOSITION_BYTES,
            max_lines: DEFAULT_RELAY_MAX_LINES,
        }
    }
}

/// What one relay encoding did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Providers written (each as one whole batch).
    pub providers_written: u64,
    /// Providers left out because their batch did not fit the budget.
    pub providers_dropped: u64,
    /// Lines written.
    pub lines: u64,
    /// Bytes written.
    pub bytes: u64,
}

impl Store {
    /// Appends to `out` the last complete publication of every provider whose publication is
    /// at most one TTL old at `now_ms`, as whole batches with their original fences, in (site,
    /// provider) order.
    ///
    /// Stamps are moved by `reference_ms - now_ms`, so each reading's age relative to
    /// `reference_ms` (the `Date` the daemon sends the body with) equals its age now; pass
    /// the same clock reading for both unless re-dating. A publication is never split:
    /// one that does not fit what is left of `budget` is left out whole and counted, and
    /// smaller ones after it may still fit.
    ///
    /// Re-sending an unchanged publication yields the same bytes, so the receiver sees an
    /// exact repeat (idempotent, not a drop).
    pub fn encode_relay(
        &self,
        now_ms: u64,
        reference_ms: u64,
        budget: RelayBudget,
        out: &mut Vec<u8>,
    ) -> RelayReport {
        let shift = (i128::from(reference_ms) - i128::from(now_ms))
            .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        let mut report = RelayReport::default();
        let mut scratch = Vec::new();
        for entry in self.entries() {
            let Some(publication) = &entry.publication else {
                continue;
            };
            if publication.meta.stamp_ms().saturating_add(self.config.ttl_ms) < now_ms {
                continue;
            }
            scratch.clear();
            publication.write_shifted(&mut scratch, shift);
            let lines = publication.lines();
            let fits = report.bytes + scratch.len() as u64 <= budget.max_bytes as u64
                && report.lines + lines <= budget.max_lines as u64;
            if fits {
                out.extend_from_slice(&scratch);
                report.providers_written += 1;
                report.lines += lines;
                report.bytes += scratch.len() as u64;
            } else {
                report.providers_dropped += 1;
            }
        }
        report
    }
}
