//! Admission: which arriving batch may move a provider's fence.

use super::Fence;

/// How far a publisher epoch may run ahead of the receiver's wall clock, in milliseconds
/// (10 minutes, SWIM's lease bound).
///
/// Epochs are wall-clock based, so one far in the future is a broken clock; retaining it
/// as a fence would refuse every honest batch until the receiver's clock caught up.
pub const MAX_EPOCH_LEAD_MS: u64 = 600_000;

/// Whether `epoch` is more than [`MAX_EPOCH_LEAD_MS`] ahead of `now_ms` (the receiver's
/// wall clock, milliseconds since the Unix epoch).
pub fn epoch_too_far(epoch: u64, now_ms: u64) -> bool {
    epoch > now_ms.saturating_add(MAX_EPOCH_LEAD_MS)
}

/// The verdict on one arriving batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Above the fence: it moves the fence and its rows may be stored.
    Advance,
    /// The exact complete publication already held: a no-op, not a drop.
    Repeat,
    /// At or below the fence and not an exact repeat: delayed data, dropped.
    Delayed,
    /// Its epoch is more than [`MAX_EPOCH_LEAD_MS`] ahead of the receiver's clock.
    Skew,
}

/// One provider's ordering state: its fence and the digest of the complete publication
/// held at that fence, if any.
///
/// The digest is what lets an exact repeat be told from a changed duplicate with the
/// same (epoch, sequence).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrderGate {
    fence: Option<Fence>,
    held: Option<u64>,
}

impl OrderGate {
    /// A gate that starts at a persisted fence (no publication held yet).
    pub const fn at(fence: Fence) -> Self {
        Self {
            fence: Some(fence),
            held: None,
        }
    }

    /// The highest (epoch, sequence) admitted so far.
    pub const fn fence(&self) -> Option<Fence> {
        self.fence
    }

    /// Judges a batch at `incoming` whose content digest is `digest`, at receiver
    /// wall-clock `now_ms` (milliseconds since the Unix epoch).
    ///
    /// The epoch bound is checked first, so a future epoch never reaches the fence.
    pub fn judge(&self, incoming: Fence, digest: u64, now_ms: u64) -> Admission {
        if epoch_too_far(incoming.epoch, now_ms) {
            return Admission::Skew;
        }
        self.judge_order(incoming, digest)
    }

    /// As [`Self::judge`] without the epoch bound: for a publisher's own batches, whose
    /// epoch it minted itself (see `store::Sender::Own`).
    pub fn judge_order(&self, incoming: Fence, digest: u64) -> Admission {
        match self.fence {
            Some(fence) if incoming < fence => Admission::Delayed,
            Some(fence) if incoming == fence => {
                if self.held == Some(digest) {
                    Admission::Repeat
                } else {
                    Admission::Delayed
                }
            }
            _ => Admission::Advance,
        }
    }

    /// Moves the fence to a batch judged [`Admission::Advance`]; the publication held
    /// before it no longer counts as a repeat.
    pub fn advance(&mut self, fence: Fence) {
        debug_assert!(self.fence.is_none_or(|f| f < fence));
        self.fence = Some(fence);
        self.held = None;
    }

    /// Records that the complete publication at the current fence, with this digest, is
    /// now held, so its exact repeat becomes idempotent.
    pub fn hold(&mut self, digest: u64) {
        self.held = Some(digest);
    }

    /// Raises the fence to a persisted one if that is higher (restart recovery).
    pub fn raise_to(&mut self, fence: Fence) {
        if self.fence.is_none_or(|f| f < fence) {
            self.fence = Some(fence);
            self.held = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Admission, Fence, MAX_EPOCH_LEAD_MS, OrderGate};

    const NOW: u64 = 1_700_000_000_000;

    #[test]
    fn first_batch_advances() {
        assert_eq!(
            OrderGate::default().judge(Fence::new(NOW, 0), 1, NOW),
            Admission::Advance
        );
    }

    #[test]
    fn epoch_exactly_at_the_lead_is_admitted() {
        let gate = OrderGate::default();
        assert_eq!(
            gate.judge(Fence::new(NOW + MAX_EPOCH_LEAD_MS, 0), 1, NOW),
            Admission::Advance
        );
    }

    #[test]
    fn epoch_one_past_the_lead_is_skew() {
        let gate = OrderGate::default();
        assert_eq!(
            gate.judge(Fence::new(NOW + MAX_EPOCH_LEAD_MS + 1, 0), 1, NOW),
            Admission::Skew
        );
    }

    #[test]
    fn future_epoch_never_reaches_the_fence() {
        let mut gate = OrderGate::at(Fence::new(NOW, 9));
        let far = Fence::new(NOW + MAX_EPOCH_LEAD_MS + 1, 0);
        assert_eq!(gate.judge(far, 1, NOW), Admission::Skew);
        // Nothing was retained: the honest next batch still advances.
        assert_eq!(gate.judge(Fence::new(NOW, 10), 1, NOW), Admission::Advance);
        gate.advance(Fence::new(NOW, 10));
        assert_eq!(gate.fence(), Some(Fence::new(NOW, 10)));
    }

    #[test]
    fn stale_sequence_is_refused() {
        let mut gate = OrderGate::default();
        gate.advance(Fence::new(NOW, 5));
        assert_eq!(gate.judge(Fence::new(NOW, 4), 1, NOW), Admission::Delayed);
        assert_eq!(
            gate.judge(Fence::new(NOW - 1, 99), 1, NOW),
            Admission::Delayed
        );
    }

    #[test]
    fn exact_repeat_of_held_publication_is_idempotent() {
        let mut gate = OrderGate::default();
        gate.advance(Fence::new(NOW, 5));
        gate.hold(42);
        assert_eq!(gate.judge(Fence::new(NOW, 5), 42, NOW), Admission::Repeat);
    }

    #[test]
    fn changed_duplicate_is_delayed() {
        let mut gate = OrderGate::default();
        gate.advance(Fence::new(NOW, 5));
        gate.hold(42);
        assert_eq!(gate.judge(Fence::new(NOW, 5), 43, NOW), Admission::Delayed);
    }

    #[test]
    fn repeat_of_a_rejected_payload_is_delayed() {
        // The fence moved for a batch whose payload was refused: nothing is held, so a
        // resend at that fence cannot slip in.
        let mut gate = OrderGate::default();
        gate.advance(Fence::new(NOW, 5));
        assert_eq!(gate.judge(Fence::new(NOW, 5), 42, NOW), Admission::Delayed);
    }

    #[test]
    fn raising_to_a_persisted_fence_only_moves_up() {
        let mut gate = OrderGate::at(Fence::new(NOW, 7));
        gate.raise_to(Fence::new(NOW, 3));
        assert_eq!(gate.fence(), Some(Fence::new(NOW, 7)));
        gate.raise_to(Fence::new(NOW + 1, 0));
        assert_eq!(gate.fence(), Some(Fence::new(NOW + 1, 0)));
    }
}
