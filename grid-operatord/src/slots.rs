//! Connection slots of the signals listener: a flood of peers or half-open connections
//! must never lock the local gateway out.
//!
//! Who a connection belongs to is only known after its TLS handshake, so admission is in
//! two steps. At accept, a connection takes one of the [`MAX_PEER_CONNECTIONS`] general
//! slots if one is free, otherwise one of the [`LOCAL_RESERVED_CONNECTIONS`] reserved
//! slots. After the handshake, a connection in a reserved slot keeps it only if it is the
//! local gateway; any other caller moves to a general slot if one has freed up, or is
//! shed. While every slot is taken, a new connection evicts the oldest connection that is
//! still handshaking in a reserved slot: half-open connections cannot squat on the
//! reserved slots, and the local gateway's own handshake (milliseconds) is only lost if
//! eight more connections arrive during it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use grid_daemon::tls::Identity;

/// Connections the signals listener holds at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Slots only the local gateway can keep past its handshake.
pub const LOCAL_RESERVED_CONNECTIONS: usize = 8;
/// The most connections peers (and unidentified callers) can hold.
pub const MAX_PEER_CONNECTIONS: usize = MAX_CONNECTIONS - LOCAL_RESERVED_CONNECTIONS;
/// Time a connection has to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a connection has to send a request's headers, including between keep-alive
/// requests.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Age after which a connection is closed gracefully (after its current request), so a
/// long-lived connection cannot hold a slot forever.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(300);

grid_signals::label_values! {
    label "reason";
    /// Why a connection was shed; the label of `grid_operator_connections_shed_total`.
    pub enum ShedReason {
        /// Every slot was taken by a connection past its handshake.
        Full,
        /// A peer (or unidentified caller) finished its handshake in a reserved slot while
        /// every general slot was taken.
        PeerLimit,
        /// Evicted while handshaking in a reserved slot to make room for a new connection.
        Evicted,
        /// The TLS handshake did not finish within [`HANDSHAKE_TIMEOUT`].
        HandshakeTimeout,
        /// Request headers did not arrive within [`HEADER_READ_TIMEOUT`].
        HeaderTimeout,
        /// `accept` failed (out of descriptors, a reset before accept): counted, backed
        /// off, and the listener goes on.
        AcceptError,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    General,
    Reserved,
}

#[derive(Debug)]
struct Handshaking {
    id: u64,
    evicted: Arc<Eviction>,
}

/// Shared between a reserved slot and the eviction queue.
#[derive(Debug, Default)]
struct Eviction {
    done: AtomicBool,
    notify: Notify,
}

#[derive(Debug, Default)]
struct Counts {
    general: usize,
    reserved: usize,
    handshaking: VecDeque<Handshaking>,
    next_id: u64,
}

/// The slot table, shared by the accept loop and every connection task.
#[derive(Debug, Default)]
pub struct Slots {
    counts: Mutex<Counts>,
}

/// One held slot; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    kind: Kind,
    id: u64,
    eviction: Option<Arc<Eviction>>,
}

impl Slots {
    /// An empty table.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        // A panic while holding this lock cannot leave the counts half-updated (each
        // critical section is a few integer updates), so a poisoned lock is still usable.
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Slots held right now: (general, reserved).
    pub fn held(&self) -> (usize, usize) {
        let c = self.lock();
        (c.general, c.reserved)
    }

    /// Admits a just-accepted connection, evicting the oldest reserved handshake when
    /// every slot is taken; `Err(Full)` when no slot can be had.
    pub fn admit(self: &Arc<Self>) -> Result<Slot, ShedReason> {
        let mut c = self.lock();
        let id = c.next_id;
        c.next_id += 1;
        if c.general < MAX_PEER_CONNECTIONS {
            c.general += 1;
            return Ok(self.slot(Kind::General, id, None));
        }
        if c.reserved >= LOCAL_RESERVED_CONNECTIONS {
            // Take over the oldest reserved handshake: its count passes to the newcomer.
            let oldest = c.handshaking.pop_front().ok_or(ShedReason::Full)?;
            oldest.evicted.done.store(true, Ordering::SeqCst);
            oldest.evicted.notify.notify_one();
        } else {
            c.reserved += 1;
        }
        let eviction = Arc::new(Eviction::default());
        c.handshaking.push_back(Handshaking {
            id,
            evicted: eviction.clone(),
        });
        Ok(self.slot(Kind::Reserved, id, Some(eviction)))
    }

    fn slot(self: &Arc<Self>, kind: Kind, id: u64, eviction: Option<Arc<Eviction>>) -> Slot {
        Slot {
            slots: self.clone(),
            kind,
            id,
            eviction,
        }
    }
}

impl Slot {
    /// Resolves once this slot was evicted (never for a general or settled slot); race
    /// it against the handshake.
    pub async fn evicted(&self) {
        match &self.eviction {
            Some(e) => loop {
                let notified = e.notify.notified();
                if e.done.load(Ordering::SeqCst) {
                    return;
                }
                notified.await;
            },
            None => std::future::pending().await,
        }
    }

    fn is_evicted(&self) -> bool {
        self.eviction
            .as_ref()
            .is_some_and(|e| e.done.load(Ordering::SeqCst))
    }

    /// Decides whether the connection may keep a slot now that its identity is known.
    pub fn settle(mut self, identity: Option<&Identity>) -> Result<Slot, ShedReason> {
        if self.is_evicted() {
            return Err(ShedReason::Evicted);
        }
        if self.kind == Kind::General {
            return Ok(self);
        }
        let slots = self.slots.clone();
        let mut c = slots.lock();
        c.handshaking.retain(|h| h.id != self.id);
        self.eviction = None;
        if identity == Some(&Identity::Local) {
            return Ok(self);
        }
        if c.general < MAX_PEER_CONNECTIONS {
            c.general += 1;
            c.reserved -= 1;
            self.kind = Kind::General;
            return Ok(self);
        }
        Err(ShedReason::PeerLimit)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.is_evicted() {
            // Its count was handed to the connection that evicted it.
            return;
        }
        let mut c = self.slots.lock();
        match self.kind {
            Kind::General => c.general -= 1,
            Kind::Reserved => {
                c.reserved -= 1;
                let id = self.id;
                c.handshaking.retain(|h| h.id != id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill_general(slots: &Arc<Slots>) -> Vec<Slot> {
        (0..MAX_PEER_CONNECTIONS)
            .map(|_| slots.admit().unwrap())
            .collect()
    }

    #[test]
    fn limits_add_up() {
        assert_eq!(MAX_CONNECTIONS, 256);
        assert_eq!(MAX_PEER_CONNECTIONS, 248);
        assert_eq!(LOCAL_RESERVED_CONNECTIONS, 8);
    }

    #[test]
    fn the_249th_connection_gets_a_reserved_slot() {
        let slots = Slots::new();
        let general = fill_general(&slots);
        assert_eq!(slots.held(), (MAX_PEER_CONNECTIONS, 0));
        let extra = slots.admit().unwrap();
        assert_eq!(extra.kind, Kind::Reserved);
        assert_eq!(slots.held(), (MAX_PEER_CONNECTIONS, 1));
        drop(general);
        drop(extra);
        assert_eq!(slots.held(), (0, 0));
    }

    #[test]
    fn a_peer_in_a_reserved_slot_is_shed_and_local_keeps_it() {
        let slots = Slots::new();
        let _general = fill_general(&slots);
        let peer = slots.admit().unwrap();
        assert_eq!(
            peer.settle(Some(&Identity::Peer("b".into()))).unwrap_err(),
            ShedReason::PeerLimit
        );
        assert_eq!(slots.held().1, 0);
        let stranger = slots.admit().unwrap();
        assert_eq!(stranger.settle(None).unwrap_err(), ShedReason::PeerLimit);
        let local = slots
            .admit()
            .unwrap()
            .settle(Some(&Identity::Local))
            .unwrap();
        assert_eq!(local.kind, Kind::Reserved);
        assert_eq!(slots.held(), (MAX_PEER_CONNECTIONS, 1));
    }

    #[test]
    fn a_peer_in_a_reserved_slot_moves_to_a_freed_general_slot() {
        let slots = Slots::new();
        let mut general = fill_general(&slots);
        let peer = slots.admit().unwrap();
        general.pop();
        let peer = peer.settle(Some(&Identity::Peer("b".into()))).unwrap();
        assert_eq!(peer.kind, Kind::General);
        assert_eq!(slots.held(), (MAX_PEER_CONNECTIONS, 0));
    }

    #[test]
    fn at_256_settled_connections_the_next_is_shed_as_full() {
        let slots = Slots::new();
        let _general = fill_general(&slots);
        let locals: Vec<_> = (0..LOCAL_RESERVED_CONNECTIONS)
            .map(|_| {
                slots
                    .admit()
                    .unwrap()
                    .settle(Some(&Identity::Local))
                    .unwrap()
            })
            .collect();
        assert_eq!(
            slots.held(),
            (MAX_PEER_CONNECTIONS, LOCAL_RESERVED_CONNECTIONS)
        );
        assert_eq!(slots.admit().unwrap_err(), ShedReason::Full);
        drop(locals);
        assert!(slots.admit().is_ok());
    }

    #[tokio::test]
    async fn when_full_a_new_connection_evicts_the_oldest_reserved_handshake() {
        let slots = Slots::new();
        let _general = fill_general(&slots);
        let half_open: Vec<_> = (0..LOCAL_RESERVED_CONNECTIONS)
            .map(|_| slots.admit().unwrap())
            .collect();
        let newcomer = slots.admit().unwrap();
        tokio::time::timeout(Duration::from_secs(1), half_open[0].evicted())
            .await
            .expect("oldest handshake evicted");
        assert!(!half_open[1].is_evicted());
        assert_eq!(
            slots.held(),
            (MAX_PEER_CONNECTIONS, LOCAL_RESERVED_CONNECTIONS)
        );
        let mut half_open = half_open.into_iter();
        let evicted = half_open.next().unwrap();
        assert_eq!(
            evicted.settle(Some(&Identity::Local)).unwrap_err(),
            ShedReason::Evicted
        );
        assert_eq!(
            slots.held(),
            (MAX_PEER_CONNECTIONS, LOCAL_RESERVED_CONNECTIONS)
        );
        let local = newcomer.settle(Some(&Identity::Local)).unwrap();
        drop(half_open);
        assert_eq!(slots.held(), (MAX_PEER_CONNECTIONS, 1));
        drop(local);
        assert_eq!(slots.held(), (MAX_PEER_CONNECTIONS, 0));
    }
}
