//! Datagrams sealed per pair of sites, with keys agreed over the signals listener's
//! mutual TLS.
//!
//! A session is opened by one site (the initiator) posting to the other's signals
//! listener; both ends then export the same [`SESSION_MATERIAL_BYTES`] from that TLS
//! connection (RFC 5705, label [`EXPORTER_LABEL`]) and install it here. The first eight
//! bytes name the session on the wire, the rest is a ChaCha20-Poly1305 key. Only the two
//! ends of one authenticated handshake know it, so a datagram that opens under it was
//! sealed by the site the certificate named, and by nobody else.
//!
//! Wire form, all integers big-endian:
//!
//! ```text
//! version (1) | session id (8) | counter (8) | ciphertext | tag (16)
//! ```
//!
//! The first 17 bytes are authenticated as associated data. The nonce is the sender's
//! role (initiator 0, responder 1) followed by the counter, so the two directions of one
//! key never share a nonce; a sliding window of [`REPLAY_WINDOW`] counters refuses a
//! datagram seen before.

use std::collections::{HashMap, VecDeque};

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};

/// The TLS exporter label both ends derive a session from.
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-grid-membership-v1";
/// Exported bytes per session: an 8-byte id and a 32-byte key.
pub const SESSION_MATERIAL_BYTES: usize = 40;
/// The wire form's version byte.
pub const SEAL_VERSION: u8 = 1;
/// Bytes a seal adds to a plaintext: version, id, counter, tag.
pub const SEAL_OVERHEAD: usize = 1 + 8 + 8 + 16;
/// Counters older than the newest by this many are refused as replays.
pub const REPLAY_WINDOW: u64 = 64;
/// Sessions kept in all; installing one more forgets the oldest.
pub const MAX_SESSIONS: usize = 1024;
/// Sessions kept per peer: the newest and the one before, so a peer that re-keyed while
/// our datagrams under the old key were in flight still opens them.
pub const SESSIONS_PER_PEER: usize = 2;
/// A session seals for this long, then a new one is agreed; a peer whose trust was
/// withdrawn (a pin removed, a certificate expired) can speak at most this long after.
pub const SESSION_LIFETIME_MS: u64 = 10 * 60 * 1000;
/// How long past its lifetime a session still opens datagrams already in flight.
pub const SESSION_GRACE_MS: u64 = 60 * 1000;
/// Datagrams one session seals before it must be replaced (far below the nonce space).
pub const MAX_SEALS_PER_SESSION: u64 = 1 << 40;

/// Which end of the TLS connection a site was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The site that posted.
    Initiator,
    /// The site whose listener answered.
    Responder,
}

impl Role {
    fn byte(self) -> u8 {
        match self {
            Self::Initiator => 0,
            Self::Responder => 1,
        }
    }

    fn other(self) -> Self {
        match self {
            Self::Initiator => Self::Responder,
            Self::Responder => Self::Initiator,
        }
    }
}

/// Why a received datagram was refused; the `reason` label of
/// `grid_membership_datagrams_refused_total`, together with the protocol's reasons in
/// [`crate::Refusal`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SealRefusal {
    /// Shorter than a seal's overhead, or of an unknown version.
    Malformed,
    /// No session has this id (never agreed, expired, or evicted).
    UnknownSession,
    /// The tag did not verify: tampered, or sealed under another key.
    Forged,
    /// A counter seen before or older than the window.
    Replayed,
}

struct Session {
    id: [u8; 8],
    peer: String,
    key: LessSafeKey,
    role: Role,
    installed_ms: u64,
    sent: u64,
    /// The highest counter opened and a bitmap of the [`REPLAY_WINDOW`] below it.
    highest: Option<u64>,
    seen: u64,
}

impl Session {
    fn nonce(role: Role, counter: u64) -> Nonce {
        let mut n = [0u8; 12];
        n[0] = role.byte();
        n[4..].copy_from_slice(&counter.to_be_bytes());
        Nonce::assume_unique_for_key(n)
    }

    /// Whether `counter` is new; does not record it (a forged datagram must not move the
    /// window).
    fn fresh(&self, counter: u64) -> bool {
        match self.highest {
            None => true,
            Some(h) if counter > h => true,
            Some(h) => {
                let back = h - counter;
                back < REPLAY_WINDOW && self.seen & (1 << back) == 0
            }
        }
    }

    fn record(&mut self, counter: u64) {
        match self.highest {
            Some(h) if counter <= h => self.seen |= 1 << (h - counter),
            Some(h) => {
                let shift = counter - h;
                self.seen = if shift >= REPLAY_WINDOW {
                    0
                } else {
                    self.seen << shift
                };
                self.seen |= 1;
                self.highest = Some(counter);
            }
            None => {
                self.seen = 1;
                self.highest = Some(counter);
            }
        }
    }
}

/// Every session this site holds, bounded by [`MAX_SESSIONS`].
#[derive(Default)]
pub struct Sessions {
    by_id: HashMap<[u8; 8], Session>,
    /// Ids in installation order, oldest first.
    order: VecDeque<[u8; 8]>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("len", &self.by_id.len())
            .finish_non_exhaustive()
    }
}

impl Sessions {
    /// Installs the session exported from a TLS connection with `peer`, authenticated by
    /// that connection. Forgets the oldest session when full and the peer's oldest when it
    /// has [`SESSIONS_PER_PEER`].
    pub fn install(
        &mut self,
        now_ms: u64,
        peer: &str,
        material: &[u8; SESSION_MATERIAL_BYTES],
        role: Role,
    ) {
        let mut id = [0u8; 8];
        id.copy_from_slice(&material[..8]);
        let Ok(unbound) = UnboundKey::new(&CHACHA20_POLY1305, &material[8..]) else {
            return; // a 32-byte key is always accepted
        };
        self.remove(id);
        let same_peer: Vec<[u8; 8]> = self
            .order
            .iter()
            .filter(|i| self.by_id.get(*i).is_some_and(|s| s.peer == peer))
            .copied()
            .collect();
        if same_peer.len() >= SESSIONS_PER_PEER {
            self.remove(same_peer[0]);
        }
        while self.by_id.len() >= MAX_SESSIONS {
            let Some(oldest) = self.order.front().copied() else {
                break;
            };
            self.remove(oldest);
        }
        self.by_id.insert(
            id,
            Session {
                id,
                peer: peer.to_owned(),
                key: LessSafeKey::new(unbound),
                role,
                installed_ms: now_ms,
                sent: 0,
                highest: None,
                seen: 0,
            },
        );
        self.order.push_back(id);
    }

    fn remove(&mut self, id: [u8; 8]) {
        if self.by_id.remove(&id).is_some() {
            self.order.retain(|i| *i != id);
        }
    }

    /// Sessions held.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Whether `peer` has a session that may still seal at `now_ms`.
    pub fn can_seal(&self, now_ms: u64, peer: &str) -> bool {
        self.sealing(now_ms, peer).is_some()
    }

    fn sealing(&self, now_ms: u64, peer: &str) -> Option<[u8; 8]> {
        self.order
            .iter()
            .rev()
            .find(|id| {
                self.by_id.get(*id).is_some_and(|s| {
                    s.peer == peer
                        && now_ms.saturating_sub(s.installed_ms) < SESSION_LIFETIME_MS
                        && s.sent < MAX_SEALS_PER_SESSION
                })
            })
            .copied()
    }

    /// Seals `plaintext` for `peer` into `out` (cleared first) under its newest usable
    /// session; `false` when it has none, and a session must be agreed first.
    pub fn seal(&mut self, now_ms: u64, peer: &str, plaintext: &[u8], out: &mut Vec<u8>) -> bool {
        let Some(id) = self.sealing(now_ms, peer) else {
            return false;
        };
        let Some(s) = self.by_id.get_mut(&id) else {
            return false;
        };
        let counter = s.sent;
        s.sent += 1;
        out.clear();
        out.push(SEAL_VERSION);
        out.extend_from_slice(&s.id);
        out.extend_from_slice(&counter.to_be_bytes());
        let header_len = out.len();
        out.extend_from_slice(plaintext);
        let (header, body) = out.split_at_mut(header_len);
        let Ok(tag) = s.key.seal_in_place_separate_tag(
            Session::nonce(s.role, counter),
            Aad::from(&*header),
            body,
        ) else {
            return false;
        };
        out.extend_from_slice(tag.as_ref());
        true
    }

    /// Opens a received datagram in place, returning the peer that sealed it and the
    /// plaintext's range within `datagram`. A refused datagram changes nothing.
    pub fn open<'d>(
        &mut self,
        now_ms: u64,
        datagram: &'d mut [u8],
    ) -> Result<(&str, &'d [u8]), SealRefusal> {
        if datagram.len() < SEAL_OVERHEAD || datagram[0] != SEAL_VERSION {
            return Err(SealRefusal::Malformed);
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&datagram[1..9]);
        let mut counter = [0u8; 8];
        counter.copy_from_slice(&datagram[9..17]);
        let counter = u64::from_be_bytes(counter);
        let Some(s) = self.by_id.get_mut(&id) else {
            return Err(SealRefusal::UnknownSession);
        };
        if now_ms.saturating_sub(s.installed_ms) >= SESSION_LIFETIME_MS + SESSION_GRACE_MS {
            return Err(SealRefusal::UnknownSession);
        }
        if !s.fresh(counter) {
            return Err(SealRefusal::Replayed);
        }
        let (header, body) = datagram.split_at_mut(17);
        let plain = s
            .key
            .open_in_place(
                Session::nonce(s.role.other(), counter),
                Aad::from(&*header),
                body,
            )
            .map_err(|_| SealRefusal::Forged)?;
        s.record(counter);
        Ok((s.peer.as_str(), plain))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn material(seed: u8) -> [u8; SESSION_MATERIAL_BYTES] {
        let mut m = [0u8; SESSION_MATERIAL_BYTES];
        for (i, b) in m.iter_mut().enumerate() {
            *b = seed.wrapping_mul(31).wrapping_add(i as u8);
        }
        m
    }

    /// Site a initiated a session with b: a holds it for b, b for a.
    fn pair() -> (Sessions, Sessions) {
        let (mut a, mut b) = (Sessions::default(), Sessions::default());
        a.install(0, "b", &material(1), Role::Initiator);
        b.install(0, "a", &material(1), Role::Responder);
        (a, b)
    }

    fn sealed(from: &mut Sessions, to: &str, text: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        assert!(from.seal(0, to, text, &mut out));
        out
    }

    #[test]
    fn a_datagram_sealed_by_one_end_opens_at_the_other_naming_the_sender() {
        let (mut a, mut b) = pair();
        let mut d = sealed(&mut a, "b", b"ping");
        assert_eq!(d.len(), 4 + SEAL_OVERHEAD);
        let (peer, plain) = b.open(0, &mut d).unwrap();
        assert_eq!((peer, plain), ("a", &b"ping"[..]));
        let mut back = sealed(&mut b, "a", b"ack");
        assert_eq!(a.open(0, &mut back).unwrap(), ("b", &b"ack"[..]));
    }

    #[test]
    fn a_datagram_is_not_opened_twice() {
        let (mut a, mut b) = pair();
        let d = sealed(&mut a, "b", b"ping");
        assert!(b.open(0, &mut d.clone()).is_ok());
        assert_eq!(b.open(0, &mut d.clone()), Err(SealRefusal::Replayed));
    }

    #[test]
    fn a_late_datagram_inside_the_window_opens_and_one_past_it_is_a_replay() {
        let (mut a, mut b) = pair();
        let all: Vec<Vec<u8>> = (0..=REPLAY_WINDOW)
            .map(|_| sealed(&mut a, "b", b"x"))
            .collect();
        // Counter REPLAY_WINDOW arrives first; counter 1 is REPLAY_WINDOW - 1 behind.
        assert!(b.open(0, &mut all[REPLAY_WINDOW as usize].clone()).is_ok());
        assert!(b.open(0, &mut all[1].clone()).is_ok());
        // Counter 0 is REPLAY_WINDOW behind: outside the window.
        assert_eq!(b.open(0, &mut all[0].clone()), Err(SealRefusal::Replayed));
    }

    #[test]
    fn a_flipped_byte_anywhere_is_refused_and_does_not_move_the_window() {
        let (mut a, mut b) = pair();
        let d = sealed(&mut a, "b", b"ping");
        for i in 0..d.len() {
            let mut bad = d.clone();
            bad[i] ^= 0x40;
            let r = b.open(0, &mut bad);
            assert!(r.is_err(), "byte {i}");
        }
        assert!(
            b.open(0, &mut d.clone()).is_ok(),
            "the genuine datagram still opens"
        );
    }

    #[test]
    fn a_datagram_reflected_back_to_its_sender_does_not_open() {
        let (mut a, _) = pair();
        let mut d = sealed(&mut a, "b", b"ping");
        // The same key, but the nonce names the initiator: a is not the responder.
        assert_eq!(a.open(0, &mut d), Err(SealRefusal::Forged));
    }

    #[test]
    fn an_unknown_or_short_datagram_is_refused_by_kind() {
        let (_, mut b) = pair();
        assert_eq!(
            b.open(0, &mut [SEAL_VERSION; 10]),
            Err(SealRefusal::Malformed)
        );
        let mut other = Sessions::default();
        other.install(0, "b", &material(9), Role::Initiator);
        let mut d = sealed(&mut other, "b", b"ping");
        assert_eq!(b.open(0, &mut d), Err(SealRefusal::UnknownSession));
    }

    #[test]
    fn a_session_seals_until_its_lifetime_and_opens_until_its_grace_ends() {
        let (mut a, mut b) = pair();
        let d = sealed(&mut a, "b", b"x");
        let mut out = Vec::new();
        assert!(a.seal(SESSION_LIFETIME_MS - 1, "b", b"x", &mut out));
        assert!(!a.seal(SESSION_LIFETIME_MS, "b", b"x", &mut out));
        let edge = SESSION_LIFETIME_MS + SESSION_GRACE_MS;
        assert_eq!(
            b.open(edge, &mut d.clone()),
            Err(SealRefusal::UnknownSession)
        );
        assert!(b.open(edge - 1, &mut d.clone()).is_ok());
    }

    #[test]
    fn a_peer_keeps_its_two_newest_sessions_and_the_table_its_maximum() {
        let mut s = Sessions::default();
        for i in 0..3 {
            s.install(0, "b", &material(i), Role::Initiator);
        }
        assert_eq!(s.len(), SESSIONS_PER_PEER);
        let mut s = Sessions::default();
        for i in 0..=MAX_SESSIONS {
            let mut m = material(0);
            m[..8].copy_from_slice(&(i as u64).to_be_bytes());
            s.install(0, &format!("p{i}"), &m, Role::Initiator);
        }
        assert_eq!(s.len(), MAX_SESSIONS);
        assert!(!s.can_seal(0, "p0"), "the oldest was forgotten");
        assert!(s.can_seal(0, &format!("p{MAX_SESSIONS}")));
    }
}
