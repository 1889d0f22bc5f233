//! Which announced batches a member pulls, from whom, and how many at once: the one rule
//! the operator's gossip driver and the scale simulation both follow.
//!
//! A version heard ([`crate::Output::Heard`], or a line of a member's digest) is wanted
//! when it is newer than what the store holds for its register. Wanted registers are
//! pulled in requests, one per member asked, each carrying every register wanted from
//! that member (up to [`MAX_REGISTERS_PER_PULL`]; members take turns): a datagram brings several versions from
//! one member at once, and one request for all of them costs one TLS connection and one
//! round trip instead of one each. At most [`MAX_PULLS_IN_FLIGHT`] requests run; wanted
//! registers wait for a free one (up to [`MAX_WANTED`], beyond which a version is
//! deferred and the next digest round brings it again).
//!
//! A register is pulled once at a time: a newer version heard while its pull is in
//! flight is kept (the newest only) and handed back when the pull ends, to be weighed
//! against the store again.
//!
//! A version is usually heard from a relay, which passes the announcement on as soon as
//! it hears it, before its own pull of the batch has ended; asked that early, the relay
//! answers with the batch it held before. So a pull asked of anyone but the version's own
//! site hands the version back when it ends, as held by its own site, to be weighed
//! against the store once more: a relay that had the batch costs nothing more, one that
//! was behind (or failed) is followed at once by one pull from the site itself instead of
//! a wait for the next announcement or digest round. A pull asked of the site itself is
//! not repeated: the digests bring what it did not.
//!
//! ```
//! use grid_membership::pulls::{Heard, Pulls};
//! use grid_membership::{Member, Version};
//! let b = Member { site: "b".into(), host: "10.0.0.2".into(), signals_port: 9443,
//!                  gossip_port: 9443, incarnation: 1 };
//! let v = |provider: &str| Version { site: "b".into(), provider: provider.into(),
//!                                    epoch: 1, sequence: 1 };
//! let mut pulls = Pulls::new("a");
//! assert_eq!(pulls.heard(b.clone(), v("llama"), None), Heard::Wanted);
//! assert_eq!(pulls.heard(b.clone(), v("qwen"), None), Heard::Wanted);
//! let pull = pulls.poll_pull().unwrap();
//! assert_eq!((pull.from.site.as_str(), pull.versions.len()), ("b", 2));
//! // Asked of the versions' own site: nothing to hand back.
//! assert!(pulls.finished(&pull.versions, |_| Some(b.clone())).is_empty());
//! ```

use std::collections::{HashMap, VecDeque};

use crate::{Member, Version};

/// Requests in flight at once.
pub const MAX_PULLS_IN_FLIGHT: usize = 16;
/// Registers one request asks a member for: every batch at its largest, with a third
/// more for ages rewritten against the answer's `Date`, fits the body a fetch reads.
pub const MAX_REGISTERS_PER_PULL: usize = 12;
const _: () = assert!(
    MAX_REGISTERS_PER_PULL * grid_signals::store::MAX_HELD_BATCH_BYTES * 4 / 3
        <= grid_signals::exposition::MAX_EXPOSITION_BYTES
);
/// Registers wanted and waiting for a request; a version heard beyond that is deferred
/// to a digest round. Enough for every register of a 1,000-site grid of a few providers.
pub const MAX_WANTED: usize = 4096;

/// What [`Pulls::heard`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Heard {
    /// Wanted: a request [`Pulls::poll_pull`] hands out will carry it.
    Wanted,
    /// Not newer than what the store holds, or this site's own.
    Held,
    /// Its register is being pulled; it is handed back when that pull ends.
    Queued,
    /// [`MAX_WANTED`] registers are waiting already.
    Deferred,
}

/// One request to start: ask `from` for these versions' registers, then hand them to
/// [`Pulls::finished`] when it ends, however it ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pull {
    /// Who announced them, and so holds them.
    pub from: Member,
    /// At most [`MAX_REGISTERS_PER_PULL`], of distinct registers.
    pub versions: Vec<Version>,
}

type Register = (String, String);

/// A register being pulled.
#[derive(Debug)]
struct InFlight {
    /// The site of the member asked.
    asked: String,
    /// The newest version heard meanwhile, if any.
    next: Option<(Member, Version)>,
}

fn register(v: &Version) -> Register {
    (v.site.clone(), v.provider.clone())
}

fn newer(v: &Version, than: &Version) -> bool {
    (than.epoch, than.sequence) < (v.epoch, v.sequence)
}

/// The pulls of one member.
#[derive(Debug)]
pub struct Pulls {
    site: String,
    /// Registers being pulled.
    in_flight: HashMap<Register, InFlight>,
    /// Registers wanted, with whom from.
    wanted: HashMap<Register, (Member, Version)>,
    /// Each member's wanted registers, oldest first.
    queues: HashMap<String, VecDeque<Register>>,
    /// Members with a queue, in the order their turn comes: a request takes the first.
    turn: VecDeque<String>,
    requests: usize,
}

impl Pulls {
    /// The pulls of site `site`, which never pulls its own batches.
    pub fn new(site: &str) -> Self {
        Self {
            site: site.to_owned(),
            in_flight: HashMap::new(),
            wanted: HashMap::new(),
            queues: HashMap::new(),
            turn: VecDeque::new(),
            requests: 0,
        }
    }

    /// `from` holds `version`; `held` is the `(epoch, sequence)` the store holds for its
    /// register, if any.
    pub fn heard(&mut self, from: Member, version: Version, held: Option<(u64, u64)>) -> Heard {
        let fresh = held.is_none_or(|h| h < (version.epoch, version.sequence));
        if version.site == self.site || !fresh {
            return Heard::Held;
        }
        let key = register(&version);
        if let Some(InFlight { next, .. }) = self.in_flight.get_mut(&key) {
            if next.as_ref().is_none_or(|(_, v)| newer(&version, v)) {
                *next = Some((from, version));
            }
            return Heard::Queued;
        }
        if let Some((holder, held)) = self.wanted.get(&key) {
            if !newer(&version, held) {
                return Heard::Wanted;
            }
            // Newer: asked of whoever told of it, which the earlier holder may not be.
            if holder.site != from.site {
                if let Some(q) = self.queues.get_mut(&holder.site) {
                    q.retain(|k| *k != key);
                }
                self.enqueue(&from.site, key.clone());
            }
            self.wanted.insert(key, (from, version));
            return Heard::Wanted;
        }
        if self.wanted.len() >= MAX_WANTED {
            return Heard::Deferred;
        }
        self.enqueue(&from.site, key.clone());
        self.wanted.insert(key, (from, version));
        Heard::Wanted
    }

    fn enqueue(&mut self, member: &str, key: Register) {
        if let Some(q) = self.queues.get_mut(member) {
            q.push_back(key);
        } else {
            self.queues.insert(member.to_owned(), VecDeque::from([key]));
            self.turn.push_back(member.to_owned());
        }
    }

    /// The next request to start, while fewer than [`MAX_PULLS_IN_FLIGHT`] run: the
    /// member whose turn it is, asked for the registers wanted from it, oldest first, at
    /// most [`MAX_REGISTERS_PER_PULL`]; a member with more left waits for its next turn.
    pub fn poll_pull(&mut self) -> Option<Pull> {
        if self.requests >= MAX_PULLS_IN_FLIGHT {
            return None;
        }
        while let Some(member) = self.turn.pop_front() {
            let Some(queue) = self.queues.get_mut(&member) else {
                continue;
            };
            let (mut from, mut versions) = (None, Vec::new());
            while versions.len() < MAX_REGISTERS_PER_PULL
                && let Some(key) = queue.pop_front()
            {
                if let Some((m, v)) = self.wanted.remove(&key) {
                    from.get_or_insert(m);
                    versions.push(v);
                }
            }
            if queue.is_empty() {
                self.queues.remove(&member);
            } else {
                self.turn.push_back(member);
            }
            let Some(from) = from else {
                continue;
            };
            for v in &versions {
                let asked = from.site.clone();
                self.in_flight
                    .insert(register(v), InFlight { asked, next: None });
            }
            self.requests += 1;
            return Some(Pull { from, versions });
        }
        None
    }

    /// A request [`Pulls::poll_pull`] handed out ended, whatever it brought. What to hand
    /// to [`Pulls::heard`] again with what the store holds now: for each register, the
    /// newest version heard meanwhile, or else, when a relay was asked, the version asked
    /// for as held by its own site (`member_of` finds a live member by site; a site not
    /// live is left to the digests).
    pub fn finished(
        &mut self,
        versions: &[Version],
        member_of: impl Fn(&str) -> Option<Member>,
    ) -> Vec<(Member, Version)> {
        self.requests = self.requests.saturating_sub(1);
        versions
            .iter()
            .filter_map(|v| {
                let InFlight { asked, next } = self.in_flight.remove(&register(v))?;
                next.or_else(|| {
                    (asked != v.site)
                        .then(|| member_of(&v.site))
                        .flatten()
                        .map(|site| (site, v.clone()))
                })
            })
            .collect()
    }

    /// `member` was declared down: what was wanted from it is dropped instead of waiting
    /// for a request that can only time out; a digest round brings those versions from
    /// whoever else holds them. How many were dropped.
    pub fn forget(&mut self, member: &str) -> usize {
        let Some(queue) = self.queues.remove(member) else {
            return 0;
        };
        self.turn.retain(|m| m != member);
        queue
            .iter()
            .filter(|key| self.wanted.remove(*key).is_some())
            .count()
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.requests
    }

    /// Registers wanted and not yet in a request.
    pub fn wanted(&self) -> usize {
        self.wanted.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(site: &str, provider: &str, sequence: u64) -> Version {
        Version {
            site: site.into(),
            provider: provider.into(),
            epoch: 1,
            sequence,
        }
    }

    /// Finds every site as a live member.
    fn live() -> impl Fn(&str) -> Option<Member> {
        |site| Some(Member::loopback(site))
    }

    #[test]
    fn a_pull_asked_of_a_relay_hands_its_version_back_as_held_by_its_own_site() {
        let mut p = Pulls::new("a");
        let v = version("b", "m", 2);
        assert_eq!(
            p.heard(Member::loopback("c"), v.clone(), Some((1, 1))),
            Heard::Wanted
        );
        let pull = p.poll_pull().unwrap();
        assert_eq!(pull.from.site, "c");
        let again = p.finished(&pull.versions, live());
        assert_eq!(again, [(Member::loopback("b"), v.clone())]);
        // The relay had the batch: the store holds the version, nothing more is pulled.
        assert_eq!(
            p.heard(again[0].0.clone(), v.clone(), Some((1, 2))),
            Heard::Held
        );
        // The relay was behind: one pull from the site itself.
        assert_eq!(
            p.heard(again[0].0.clone(), v.clone(), Some((1, 1))),
            Heard::Wanted
        );
        let from_site = p.poll_pull().unwrap();
        assert_eq!(from_site.from.site, "b");
        // Asked of the site itself, the pull is not repeated, whatever it brought.
        assert!(p.finished(&from_site.versions, live()).is_empty());
        assert_eq!((p.in_flight(), p.wanted()), (0, 0));
    }

    #[test]
    fn a_pull_asked_of_a_relay_hands_back_nothing_when_its_site_is_not_live() {
        let mut p = Pulls::new("a");
        p.heard(Member::loopback("c"), version("b", "m", 2), None);
        let pull = p.poll_pull().unwrap();
        assert!(p.finished(&pull.versions, |_| None).is_empty());
    }

    #[test]
    fn a_version_no_newer_than_the_store_or_of_this_site_is_not_pulled() {
        let mut p = Pulls::new("a");
        assert_eq!(
            p.heard(Member::loopback("b"), version("b", "m", 3), Some((1, 3))),
            Heard::Held
        );
        assert_eq!(
            p.heard(Member::loopback("b"), version("b", "m", 3), Some((2, 1))),
            Heard::Held
        );
        assert_eq!(
            p.heard(Member::loopback("b"), version("a", "m", 9), None),
            Heard::Held
        );
        assert_eq!(p.poll_pull(), None);
        assert_eq!(
            p.heard(Member::loopback("b"), version("b", "m", 4), Some((1, 3))),
            Heard::Wanted
        );
        assert_eq!(p.poll_pull().map(|p| p.versions.len()), Some(1));
        assert_eq!(p.in_flight(), 1);
    }

    #[test]
    fn a_register_is_pulled_once_at_a_time_and_the_newest_heard_meanwhile_comes_back() {
        let mut p = Pulls::new("a");
        assert_eq!(
            p.heard(Member::loopback("b"), version("b", "m", 1), None),
            Heard::Wanted
        );
        let pull = p.poll_pull().unwrap();
        assert_eq!(
            p.heard(Member::loopback("c"), version("b", "m", 3), None),
            Heard::Queued
        );
        assert_eq!(
            p.heard(Member::loopback("d"), version("b", "m", 2), None),
            Heard::Queued
        );
        assert_eq!(p.poll_pull(), None);
        let next = p.finished(&pull.versions, live());
        assert_eq!(next.len(), 1);
        assert_eq!((next[0].0.site.as_str(), next[0].1.sequence), ("c", 3));
        assert_eq!(p.in_flight(), 0);
        assert!(p.finished(&pull.versions, live()).is_empty());
    }

    #[test]
    fn registers_wanted_from_one_member_go_in_one_request_and_others_in_their_own() {
        let mut p = Pulls::new("a");
        p.heard(Member::loopback("b"), version("b", "m", 1), None);
        p.heard(Member::loopback("c"), version("c", "m", 1), None);
        p.heard(Member::loopback("b"), version("d", "m", 1), None);
        // A newer version of a wanted register replaces it, from whoever told of it.
        p.heard(Member::loopback("e"), version("c", "m", 2), None);
        let first = p.poll_pull().unwrap();
        assert_eq!(first.from.site, "b");
        let asked: Vec<_> = first.versions.iter().map(|v| v.site.as_str()).collect();
        assert_eq!(asked, ["b", "d"]);
        let second = p.poll_pull().unwrap();
        assert_eq!(second.from.site, "e");
        assert_eq!(
            (
                second.versions[0].site.as_str(),
                second.versions[0].sequence
            ),
            ("c", 2)
        );
        assert_eq!(p.poll_pull(), None);
        assert_eq!((p.in_flight(), p.wanted()), (2, 0));
    }

    #[test]
    fn a_request_carries_at_most_max_registers_and_the_rest_go_in_the_next() {
        let mut p = Pulls::new("a");
        for i in 0..=MAX_REGISTERS_PER_PULL {
            p.heard(
                Member::loopback("b"),
                version("b", &format!("p{i}"), 1),
                None,
            );
        }
        assert_eq!(
            p.poll_pull().map(|p| p.versions.len()),
            Some(MAX_REGISTERS_PER_PULL)
        );
        assert_eq!(p.poll_pull().map(|p| p.versions.len()), Some(1));
    }

    #[test]
    fn what_was_wanted_from_a_member_declared_down_is_dropped_and_others_still_go() {
        let mut p = Pulls::new("a");
        p.heard(Member::loopback("b"), version("b", "m", 1), None);
        p.heard(Member::loopback("b"), version("d", "m", 1), None);
        p.heard(Member::loopback("c"), version("c", "m", 1), None);
        assert_eq!(p.forget("b"), 2);
        assert_eq!(p.forget("b"), 0);
        assert_eq!(p.wanted(), 1);
        assert_eq!(p.poll_pull().map(|p| p.from.site), Some("c".to_owned()));
        assert_eq!(p.poll_pull(), None);
        // Heard again later, from anyone, it is wanted again.
        assert_eq!(
            p.heard(Member::loopback("c"), version("b", "m", 1), None),
            Heard::Wanted
        );
    }

    #[test]
    fn a_member_with_more_wanted_than_one_request_carries_waits_for_its_next_turn() {
        let mut p = Pulls::new("a");
        for i in 0..=MAX_REGISTERS_PER_PULL {
            p.heard(
                Member::loopback("b"),
                version("b", &format!("p{i}"), 1),
                None,
            );
        }
        p.heard(Member::loopback("c"), version("c", "m", 1), None);
        let turns: Vec<(String, usize)> = std::iter::from_fn(|| p.poll_pull())
            .map(|pull| (pull.from.site, pull.versions.len()))
            .collect();
        assert_eq!(
            turns,
            [
                ("b".to_owned(), MAX_REGISTERS_PER_PULL),
                ("c".to_owned(), 1),
                ("b".to_owned(), 1)
            ]
        );
    }

    #[test]
    fn no_more_than_max_pulls_in_flight_start_and_the_next_waits_for_one_to_end() {
        let mut p = Pulls::new("a");
        let mut started = Vec::new();
        for i in 0..=MAX_PULLS_IN_FLIGHT {
            p.heard(
                Member::loopback(&format!("s{i}")),
                version(&format!("s{i}"), "m", 1),
                None,
            );
        }
        while let Some(pull) = p.poll_pull() {
            started.push(pull);
        }
        assert_eq!(started.len(), MAX_PULLS_IN_FLIGHT);
        assert_eq!(p.wanted(), 1);
        p.finished(&started[0].versions, live());
        assert_eq!(
            p.poll_pull().map(|p| p.from.site),
            Some(format!("s{MAX_PULLS_IN_FLIGHT}"))
        );
    }

    #[test]
    fn no_more_than_max_wanted_wait_and_one_more_is_deferred() {
        let mut p = Pulls::new("a");
        for i in 0..MAX_WANTED {
            let heard = p.heard(
                Member::loopback("b"),
                version("b", &format!("p{i}"), 1),
                None,
            );
            assert_eq!(heard, Heard::Wanted, "{i}");
        }
        let one_more = version("b", "over", 1);
        assert_eq!(
            p.heard(Member::loopback("b"), one_more.clone(), None),
            Heard::Deferred
        );
        p.poll_pull();
        assert_eq!(
            p.heard(Member::loopback("b"), one_more, None),
            Heard::Wanted
        );
    }
}
