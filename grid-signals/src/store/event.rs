//! What the store tells its reader besides readings: learning resets and expiries.

use std::collections::VecDeque;

use super::MAX_PENDING_EVENTS;
use crate::batch::Revision;

/// An event for the ordering step, drained with [`super::Store::poll_event`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreEvent {
    /// A new learning lifetime started for the provider: forget its learned capacity
    /// ceilings and its load and congestion history, then learn afresh.
    ///
    /// Raised once per lifetime start: a revision change (uid, generation or publisher
    /// epoch), the first complete batch after a zero-sample one, or the first one ever.
    Reset {
        /// `grid_site` of the provider.
        site: String,
        /// `grid_provider` of the provider.
        provider: String,
        /// The revision now learned.
        revision: Revision,
    },
    /// The provider's entry is gone (no readings for longer than the fence retention):
    /// drop everything learned about it.
    Expired {
        /// `grid_site` of the provider.
        site: String,
        /// `grid_provider` of the provider.
        provider: String,
    },
    /// Events were lost because nobody polled: reset everything learned.
    Resync,
}

impl StoreEvent {
    fn key(&self) -> Option<(&str, &str)> {
        match self {
            Self::Reset { site, provider, .. } | Self::Expired { site, provider } => {
                Some((site, provider))
            }
            Self::Resync => None,
        }
    }
}

/// A bounded queue that keeps at most one pending event per provider (the newest
/// supersedes: a reset after an expiry, or an expiry after a reset, both leave the
/// reader forgetting the same history).
#[derive(Clone, Debug, Default)]
pub(crate) struct EventQueue {
    pending: VecDeque<StoreEvent>,
}

impl EventQueue {
    pub(crate) fn push(&mut self, event: StoreEvent) {
        let key = event.key();
        if let Some(slot) = self.pending.iter_mut().find(|e| e.key() == key) {
            *slot = event;
            return;
        }
        if self.pending.len() >= MAX_PENDING_EVENTS {
            self.pending.clear();
            self.pending.push_back(StoreEvent::Resync);
            if key.is_none() {
                return;
            }
        }
        self.pending.push_back(event);
    }

    pub(crate) fn pop(&mut self) -> Option<StoreEvent> {
        self.pending.pop_front()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expired(i: usize) -> StoreEvent {
        StoreEvent::Expired {
            site: format!("s{i}"),
            provider: "p".into(),
        }
    }

    #[test]
    fn events_for_one_provider_coalesce_to_the_newest() {
        let mut q = EventQueue::default();
        q.push(expired(1));
        let reset = StoreEvent::Reset {
            site: "s1".into(),
            provider: "p".into(),
            revision: Revision {
                uid: "u".into(),
                generation: 1,
                epoch: 1,
            },
        };
        q.push(reset.clone());
        assert_eq!(q.len(), 1);
        assert_eq!(q.pop(), Some(reset));
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn queue_holds_max_pending_events_and_one_more_collapses_into_resync() {
        let mut q = EventQueue::default();
        for i in 0..MAX_PENDING_EVENTS {
            q.push(expired(i));
        }
        assert_eq!(q.len(), MAX_PENDING_EVENTS);
        assert_eq!(q.pop(), Some(expired(0)));
        q.push(expired(0));
        assert_eq!(q.len(), MAX_PENDING_EVENTS);
        q.push(expired(MAX_PENDING_EVENTS));
        assert_eq!(q.pop(), Some(StoreEvent::Resync));
        assert_eq!(q.pop(), Some(expired(MAX_PENDING_EVENTS)));
        assert_eq!(q.pop(), None);
    }
}
