//! Versions of batches riding the membership's own messages: who holds which
//! `(site, provider)` batch at which `(publisher epoch, sequence)`.
//!
//! A version is a last-writer-wins register per `(site, provider)`, ordered by
//! `(epoch, sequence)`: a newer one replaces an older one still being disseminated, an
//! older or equal one is not passed on. The batch itself never rides a packet (a relay
//! body is larger than a datagram); a member that hears of a version newer than what it
//! holds pulls the whole batch from the member it heard it from, over the signals
//! listener's mutual TLS. So nothing is dropped for size, and a batch is never split.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use crate::Member;
use crate::member::{MAX_SITE_NAME_BYTES, is_label};

/// Longest provider name a version may carry (a DNS label, as configured).
pub const MAX_PROVIDER_NAME_BYTES: usize = 63;
/// `(site, provider)` registers a member keeps; a version for one more is refused and
/// counted ([`crate::Refusal::VersionsFull`]).
pub const MAX_VERSIONS: usize = 4096;
/// Versions heard and not yet taken by the driver; older ones are forgotten first (a
/// newer version of the same register supersedes them anyway).
pub const MAX_HEARD: usize = 1024;
const VERSION_TAG: u8 = 1;

/// One batch's place: the register and its value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Version {
    /// `grid_site` of the batch.
    pub site: String,
    /// `grid_provider` of the batch.
    pub provider: String,
    /// Its publisher epoch.
    pub epoch: u64,
    /// Its sequence within the epoch.
    pub sequence: u64,
}

impl Version {
    fn order(&self) -> (u64, u64) {
        (self.epoch, self.sequence)
    }

    /// Whether both name the same register.
    pub fn same_register(&self, other: &Self) -> bool {
        self.site == other.site && self.provider == other.provider
    }

    /// Wire form: tag, then each name as a length byte and its bytes, then the epoch and
    /// the sequence, big-endian.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(VERSION_TAG);
        for name in [&self.site, &self.provider] {
            out.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
            out.extend_from_slice(name.as_bytes());
        }
        out.extend_from_slice(&self.epoch.to_be_bytes());
        out.extend_from_slice(&self.sequence.to_be_bytes());
    }

    /// Reads the wire form; `None` for anything else (trailing bytes included).
    pub fn decode(mut data: &[u8]) -> Option<Self> {
        let (&tag, rest) = data.split_first()?;
        if tag != VERSION_TAG {
            return None;
        }
        data = rest;
        let mut name = |max: usize| -> Option<String> {
            let (&len, rest) = data.split_first()?;
            let len = usize::from(len);
            if len == 0 || len > max || rest.len() < len {
                return None;
            }
            let (bytes, rest) = rest.split_at(len);
            data = rest;
            let s = std::str::from_utf8(bytes).ok()?;
            is_label(s, max).then(|| s.to_owned())
        };
        let site = name(MAX_SITE_NAME_BYTES)?;
        let provider = name(MAX_PROVIDER_NAME_BYTES)?;
        if data.len() != 16 {
            return None;
        }
        let (e, s) = data.split_at(8);
        Some(Self {
            site,
            provider,
            epoch: u64::from_be_bytes(e.try_into().ok()?),
            sequence: u64::from_be_bytes(s.try_into().ok()?),
        })
    }
}

/// foca's dissemination key: a version replaces any older one of its register.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct VersionKey(Version);

impl foca::Invalidates for VersionKey {
    fn invalidates(&self, other: &Self) -> bool {
        self.0.same_register(&other.0) && self.0.order() >= other.0.order()
    }
}

/// Why a version broadcast was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BroadcastRefusal {
    #[error("malformed version broadcast")]
    Malformed,
    #[error("version registers full")]
    Full,
}

#[derive(Default)]
pub(crate) struct Registers {
    known: HashMap<(String, String), (u64, u64)>,
    /// Versions heard from another member, with that member, oldest first.
    pub(crate) heard: VecDeque<(Member, Version)>,
    pub(crate) last_refusal: Option<BroadcastRefusal>,
}

/// The handler foca calls for every version it receives or is given.
#[derive(Clone, Default)]
pub(crate) struct Handler(pub(crate) Arc<Mutex<Registers>>);

impl Handler {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Registers> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl foca::BroadcastHandler<Member> for Handler {
    type Key = VersionKey;
    type Error = BroadcastRefusal;

    fn receive_item(
        &mut self,
        data: &[u8],
        sender: Option<&Member>,
    ) -> Result<Option<VersionKey>, BroadcastRefusal> {
        let mut r = self.lock();
        let Some(version) = Version::decode(data) else {
            r.last_refusal = Some(BroadcastRefusal::Malformed);
            return Err(BroadcastRefusal::Malformed);
        };
        let key = (version.site.clone(), version.provider.clone());
        match r.known.get(&key) {
            Some(held) if *held >= version.order() => return Ok(None),
            None if r.known.len() >= MAX_VERSIONS => {
                r.last_refusal = Some(BroadcastRefusal::Full);
                return Err(BroadcastRefusal::Full);
            }
            _ => {}
        }
        r.known.insert(key, version.order());
        if let Some(from) = sender {
            if r.heard.len() >= MAX_HEARD {
                r.heard.pop_front();
            }
            r.heard.push_back((from.clone(), version.clone()));
        }
        Ok(Some(VersionKey(version)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use foca::{BroadcastHandler, Invalidates};

    fn v(site: &str, provider: &str, epoch: u64, sequence: u64) -> Version {
        Version {
            site: site.into(),
            provider: provider.into(),
            epoch,
            sequence,
        }
    }

    fn wire(v: &Version) -> Vec<u8> {
        let mut out = Vec::new();
        v.encode(&mut out);
        out
    }

    #[test]
    fn a_version_round_trips_and_a_byte_more_or_less_does_not_decode() {
        let x = v("a", "llama", 1_700_000_000_000, 42);
        let w = wire(&x);
        assert_eq!(Version::decode(&w), Some(x));
        assert_eq!(Version::decode(&w[..w.len() - 1]), None);
        let mut longer = w.clone();
        longer.push(0);
        assert_eq!(Version::decode(&longer), None);
    }

    #[test]
    fn names_at_their_longest_decode_and_one_byte_longer_do_not() {
        let at = v(
            &"s".repeat(MAX_SITE_NAME_BYTES),
            &"p".repeat(MAX_PROVIDER_NAME_BYTES),
            1,
            1,
        );
        assert!(Version::decode(&wire(&at)).is_some());
        let over = v("s", &"p".repeat(MAX_PROVIDER_NAME_BYTES + 1), 1, 1);
        assert_eq!(Version::decode(&wire(&over)), None);
        let bad = v("s", "p/..", 1, 1);
        assert_eq!(Version::decode(&wire(&bad)), None);
    }

    #[test]
    fn a_newer_version_replaces_an_older_one_of_its_register_only() {
        let old = VersionKey(v("a", "m", 1, 5));
        assert!(VersionKey(v("a", "m", 1, 6)).invalidates(&old));
        assert!(VersionKey(v("a", "m", 2, 0)).invalidates(&old));
        assert!(!VersionKey(v("a", "m", 1, 4)).invalidates(&old));
        assert!(!VersionKey(v("a", "n", 9, 9)).invalidates(&old));
    }

    #[test]
    fn an_old_or_repeated_version_is_not_passed_on_and_a_newer_one_is_heard_once() {
        let mut h = Handler::default();
        let from = Member {
            site: "b".into(),
            host: "127.0.0.1".into(),
            signals_port: 1,
            gossip_port: 1,
            incarnation: 1,
        };
        assert!(
            h.receive_item(&wire(&v("a", "m", 1, 5)), Some(&from))
                .unwrap()
                .is_some()
        );
        assert!(
            h.receive_item(&wire(&v("a", "m", 1, 5)), Some(&from))
                .unwrap()
                .is_none()
        );
        assert!(
            h.receive_item(&wire(&v("a", "m", 1, 4)), Some(&from))
                .unwrap()
                .is_none()
        );
        assert!(
            h.receive_item(&wire(&v("a", "m", 1, 6)), Some(&from))
                .unwrap()
                .is_some()
        );
        assert_eq!(h.lock().heard.len(), 2);
        assert!(h.receive_item(b"\x01junk", Some(&from)).is_err());
    }

    #[test]
    fn registers_beyond_the_maximum_are_refused() {
        let mut h = Handler::default();
        for i in 0..MAX_VERSIONS {
            assert!(
                h.receive_item(&wire(&v("a", &format!("p{i}"), 1, 1)), None)
                    .is_ok()
            );
        }
        assert_eq!(
            h.receive_item(&wire(&v("a", "one-more", 1, 1)), None),
            Err(BroadcastRefusal::Full)
        );
        // An existing register still advances.
        assert!(
            h.receive_item(&wire(&v("a", "p0", 1, 2)), None)
                .unwrap()
                .is_some()
        );
    }
}
