//! What the operator last exchanged with each peer, whichever transport carried it (a
//! poll, a gossip pull or digest), and why it does not poll a member now: written by the
//! pollers and the gossip tasks, read by the routing evidence.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

grid_signals::label_values! {
    /// Why a member is not polled: the closed `reason` label set of
    /// `grid_operator_peer_polls_skipped_total`.
    pub enum SkipReason {
        /// A member no configured peer names (so with no configured URL to try) was
        /// declared down: it is polled again once it is live.
        MemberDown,
        /// A live member this site cannot verify (no client for it could be built).
        Unverifiable,
    }
}

/// The most peers the ledger remembers: past it, a member first heard of is not
/// recorded (the configured peers, recorded first, always are).
pub const MAX_LEDGER_PEERS: usize = 1_024;

/// What the operator last exchanged with each peer (a poll, a gossip pull or digest) and
/// why it does not poll one now: what its routing evidence shows. Written by the pollers
/// and the gossip tasks, read by `GET /v1/grid/routing`.
#[derive(Clone, Debug, Default)]
pub struct PeerLedger {
    peers: Arc<Mutex<BTreeMap<String, PeerRecord>>>,
}

/// One peer's entry in the [`PeerLedger`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerRecord {
    /// The last exchange: its kind (`poll`, `batch`, `digest`), result and when it ended.
    pub last: Option<(&'static str, &'static str, u64)>,
    /// When one last succeeded.
    pub last_ok_ms: Option<u64>,
    /// Why it is not polled now, while it is not.
    pub skipped: Option<SkipReason>,
}

impl PeerLedger {
    fn with(&self, peer: &str, f: impl FnOnce(&mut PeerRecord)) {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(r) = peers.get_mut(peer) {
            f(r);
        } else if peers.len() < MAX_LEDGER_PEERS {
            f(peers.entry(peer.to_owned()).or_default());
        }
    }

    /// An exchange of `kind` with `peer` ended with `result` (`ok` or a failure) at `at_ms`.
    pub fn exchange(&self, peer: &str, kind: &'static str, result: &'static str, at_ms: u64) {
        self.with(peer, |r| {
            r.last = Some((kind, result, at_ms));
            if result == "ok" {
                r.last_ok_ms = Some(at_ms);
            }
        });
    }

    /// `peer` is not polled now for `reason`, or (`None`) is polled again.
    pub fn skipped(&self, peer: &str, reason: Option<SkipReason>) {
        self.with(peer, |r| r.skipped = reason);
    }

    /// Every peer recorded, by name.
    pub fn snapshot(&self) -> Vec<(String, PeerRecord)> {
        self.peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peer_ledger_remembers_at_most_its_cap_and_keeps_updating_those_it_has() {
        let ledger = PeerLedger::default();
        for i in 0..=MAX_LEDGER_PEERS {
            ledger.exchange(&format!("p{i:05}"), "poll", "ok", 1);
        }
        let names = ledger.snapshot();
        assert_eq!(names.len(), MAX_LEDGER_PEERS);
        assert!(
            !names
                .iter()
                .any(|(n, _)| *n == format!("p{MAX_LEDGER_PEERS:05}"))
        );
        ledger.exchange("p00000", "poll", "timeout", 2);
        let first = &ledger.snapshot()[0].1;
        assert_eq!(
            (first.last, first.last_ok_ms),
            (Some(("poll", "timeout", 2)), Some(1))
        );
    }
}
