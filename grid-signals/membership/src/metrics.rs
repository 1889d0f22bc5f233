//! The membership series, registered into the caller's registry.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use grid_signals::labels::register_zeroed;

grid_signals::label_values! {
    label "reason";
    /// Why a received datagram was refused: the closed `reason` label set.
    #[non_exhaustive]
    pub enum Refusal {
        /// Longer than [`crate::MAX_DATAGRAM_BYTES`].
        Oversized,
        /// Shorter than a seal, or of an unknown seal version.
        Malformed,
        /// Sealed under no session this site holds.
        UnknownSession,
        /// Its tag did not verify.
        Forged,
        /// Opened before, or older than the replay window.
        Replayed,
        /// Opened, but the SWIM message inside did not decode.
        Undecodable,
        /// Opened, but its sender's identity names another site than the session's, or
        /// is not a valid identity.
        IdentityMismatch,
        /// Decoded, but the protocol refused it (from ourselves, stale, malformed
        /// payload).
        Protocol,
        /// A batch version it carried was malformed.
        Broadcast,
        /// A batch version it carried named one register more than
        /// [`crate::overlay::MAX_VERSIONS`].
        VersionsFull,
    }
}

impl From<crate::SealRefusal> for Refusal {
    fn from(r: crate::SealRefusal) -> Self {
        match r {
            crate::SealRefusal::Malformed => Self::Malformed,
            crate::SealRefusal::UnknownSession => Self::UnknownSession,
            crate::SealRefusal::Forged => Self::Forged,
            crate::SealRefusal::Replayed => Self::Replayed,
        }
    }
}

grid_signals::label_values! {
    label "reason";
    /// Why a datagram this site meant to send was not: the closed `reason` label set.
    #[non_exhaustive]
    pub enum Unsent {
        /// No session with the member yet, and its queue of
        /// [`crate::PENDING_PER_MEMBER`] was full.
        PendingFull,
        /// The session could not be agreed; what waited for it is dropped.
        SessionFailed,
        /// The member's identity is not one this site would contact.
        InvalidMember,
    }
}

grid_signals::label_values! {
    label "state";
    /// A member's state: the closed `state` label set.
    pub enum StateLabel {
        /// Answering probes.
        Alive,
        /// Suspected; still treated as alive until it refutes or times out.
        Suspect,
        /// Declared down.
        Down,
    }
}

grid_signals::label_values! {
    label "direction";
    /// Traffic direction: the closed `direction` label set.
    pub enum Direction {
        /// Sent by this site.
        Sent,
        /// Received and opened.
        Received,
    }
}

/// Series handles; clones share their values.
#[derive(Clone, Debug, Default)]
pub struct MembershipMetrics {
    members: Family<StateLabel, Gauge>,
    suspicions: Counter,
    refutations: Counter,
    messages: Family<Direction, Counter>,
    bytes: Family<Direction, Counter>,
    refused: Family<Refusal, Counter>,
    unsent: Family<Unsent, Counter>,
}

impl MembershipMetrics {
    /// Registers every series under `grid_membership_*`, every labelled one with each
    /// value at 0.
    pub fn register(registry: &mut Registry) -> Self {
        let members = register_zeroed(
            registry,
            "grid_membership_members",
            "Members this site knows, by state (itself excluded)",
        );
        let suspicions = Counter::default();
        registry.register(
            "grid_membership_suspicions",
            "Members this site began to suspect",
            suspicions.clone(),
        );
        let refutations = Counter::default();
        registry.register(
            "grid_membership_refutations",
            "Suspicions of this site it refuted by raising its incarnation",
            refutations.clone(),
        );
        Self {
            members,
            suspicions,
            refutations,
            messages: register_zeroed(
                registry,
                "grid_membership_messages",
                "Membership datagrams by direction",
            ),
            bytes: register_zeroed(
                registry,
                "grid_membership_bytes",
                "Membership datagram bytes on the wire (sealed) by direction",
            ),
            refused: register_zeroed(
                registry,
                "grid_membership_datagrams_refused",
                "Received membership datagrams refused, by reason",
            ),
            unsent: register_zeroed(
                registry,
                "grid_membership_datagrams_unsent",
                "Membership datagrams this site dropped before sending, by reason",
            ),
        }
    }

    pub(crate) fn refuse(&self, reason: Refusal) {
        self.refused.get_or_create(&reason).inc();
    }

    pub(crate) fn unsent(&self, reason: Unsent) {
        self.unsent.get_or_create(&reason).inc();
    }

    pub(crate) fn traffic(&self, direction: Direction, bytes: usize) {
        self.messages.get_or_create(&direction).inc();
        self.bytes.get_or_create(&direction).inc_by(bytes as u64);
    }

    pub(crate) fn suspected(&self) {
        self.suspicions.inc();
    }

    pub(crate) fn refuted(&self) {
        self.refutations.inc();
    }

    pub(crate) fn set_members(&self, alive: usize, suspect: usize, down: usize) {
        let set = |state, n: usize| {
            self.members
                .get_or_create(&state)
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        };
        set(StateLabel::Alive, alive);
        set(StateLabel::Suspect, suspect);
        set(StateLabel::Down, down);
    }

    /// Received datagrams refused for `reason`.
    pub fn refused(&self, reason: Refusal) -> u64 {
        self.refused.get_or_create(&reason).get()
    }

    /// Datagrams dropped before sending for `reason`.
    pub fn unsent_count(&self, reason: Unsent) -> u64 {
        self.unsent.get_or_create(&reason).get()
    }

    /// Members in `state`.
    pub fn members(&self, state: StateLabel) -> i64 {
        self.members.get_or_create(&state).get()
    }

    /// Datagrams and bytes in `direction`.
    pub fn traffic_count(&self, direction: Direction) -> (u64, u64) {
        (
            self.messages.get_or_create(&direction).get(),
            self.bytes.get_or_create(&direction).get(),
        )
    }

    /// Suspicions begun.
    pub fn suspicions(&self) -> u64 {
        self.suspicions.get()
    }

    /// Suspicions of this site refuted.
    pub fn refutations(&self) -> u64 {
        self.refutations.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_is_exported_from_zero_as_the_docs_spell_it() {
        let mut registry = Registry::default();
        let m = MembershipMetrics::register(&mut registry);
        m.refuse(Refusal::UnknownSession);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "grid_membership_members{state=\"alive\"} 0",
            "grid_membership_datagrams_refused_total{reason=\"unknown_session\"} 1",
            "grid_membership_datagrams_refused_total{reason=\"versions_full\"} 0",
            "grid_membership_datagrams_unsent_total{reason=\"pending_full\"} 0",
            "grid_membership_bytes_total{direction=\"received\"} 0",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(!text.contains("UnknownSession"), "{text}");
    }
}
