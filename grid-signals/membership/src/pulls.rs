//! Which announced batches a member pulls, from whom, and how many at once: the one rule
//! the operator's gossip driver and the scale simulation both follow.
//!
//! A version heard ([`crate::Output::Heard`], or a line of a member's digest) is pulled
//! when it is newer than what the store holds for its register. A register is pulled
//! once at a time: a newer version heard while its pull is in flight is kept (the newest
//! only) and handed back when the pull ends, to be weighed against the store again. At
//! most [`MAX_PULLS_IN_FLIGHT`] pulls run; a version heard beyond that is deferred, and
//! the next digest round brings it again. Whether a pull succeeded does not matter here:
//! a failed one leaves the store behind, so the register is wanted the next time it is
//! heard.

use std::collections::HashMap;

use crate::{Member, Version};

/// Pulls in flight at once; a version heard beyond that waits for a digest round.
pub const MAX_PULLS_IN_FLIGHT: usize = 16;

/// What [`Pulls::heard`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Heard {
    /// Start this pull from `from`; hand [`Pulls::finished`] its register when it ends.
    Pull {
        /// Who announced it, and so holds it.
        from: Member,
        /// The version.
        version: Version,
    },
    /// Not newer than what the store holds, or this site's own.
    Held,
    /// Its register is being pulled; it is handed back when that pull ends.
    Queued,
    /// [`MAX_PULLS_IN_FLIGHT`] are in flight.
    Deferred,
}

/// The pulls of one member.
#[derive(Debug)]
pub struct Pulls {
    site: String,
    /// Registers being pulled, each with the newest version heard meanwhile, if any.
    in_flight: HashMap<(String, String), Option<(Member, Version)>>,
}

impl Pulls {
    /// The pulls of site `site`, which never pulls its own batches.
    pub fn new(site: &str) -> Self {
        Self {
            site: site.to_owned(),
            in_flight: HashMap::new(),
        }
    }

    /// `from` holds `version`; `held` is the `(epoch, sequence)` the store holds for its
    /// register, if any.
    pub fn heard(&mut self, from: Member, version: Version, held: Option<(u64, u64)>) -> Heard {
        let newer = held.is_none_or(|h| h < (version.epoch, version.sequence));
        if version.site == self.site || !newer {
            return Heard::Held;
        }
        let key = (version.site.clone(), version.provider.clone());
        if let Some(next) = self.in_flight.get_mut(&key) {
            let newest = next
                .as_ref()
                .is_none_or(|(_, v)| (v.epoch, v.sequence) < (version.epoch, version.sequence));
            if newest {
                *next = Some((from, version));
            }
            return Heard::Queued;
        }
        if self.in_flight.len() >= MAX_PULLS_IN_FLIGHT {
            return Heard::Deferred;
        }
        self.in_flight.insert(key, None);
        Heard::Pull { from, version }
    }

    /// The pull of `(site, provider)` ended, ingested or not; the version heard meanwhile,
    /// to hand to [`Pulls::heard`] again with what the store holds now.
    pub fn finished(&mut self, site: &str, provider: &str) -> Option<(Member, Version)> {
        self.in_flight
            .remove(&(site.to_owned(), provider.to_owned()))
            .flatten()
    }

    /// Pulls in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(site: &str) -> Member {
        Member {
            site: site.into(),
            host: "127.0.0.1".into(),
            signals_port: 1,
            gossip_port: 1,
            incarnation: 1,
        }
    }

    fn version(site: &str, provider: &str, sequence: u64) -> Version {
        Version {
            site: site.into(),
            provider: provider.into(),
            epoch: 1,
            sequence,
        }
    }

    #[test]
    fn a_version_no_newer_than_the_store_or_of_this_site_is_not_pulled() {
        let mut p = Pulls::new("a");
        assert_eq!(
            p.heard(member("b"), version("b", "m", 3), Some((1, 3))),
            Heard::Held
        );
        assert_eq!(
            p.heard(member("b"), version("b", "m", 3), Some((2, 1))),
            Heard::Held
        );
        assert_eq!(
            p.heard(member("b"), version("a", "m", 9), None),
            Heard::Held
        );
        assert!(matches!(
            p.heard(member("b"), version("b", "m", 4), Some((1, 3))),
            Heard::Pull { .. }
        ));
        assert_eq!(p.in_flight(), 1);
    }

    #[test]
    fn a_register_is_pulled_once_at_a_time_and_the_newest_heard_meanwhile_comes_back() {
        let mut p = Pulls::new("a");
        assert!(matches!(
            p.heard(member("b"), version("b", "m", 1), None),
            Heard::Pull { .. }
        ));
        assert_eq!(
            p.heard(member("c"), version("b", "m", 3), None),
            Heard::Queued
        );
        assert_eq!(
            p.heard(member("d"), version("b", "m", 2), None),
            Heard::Queued
        );
        let (from, next) = p.finished("b", "m").unwrap();
        assert_eq!((from.site.as_str(), next.sequence), ("c", 3));
        assert_eq!(p.in_flight(), 0);
        assert_eq!(p.finished("b", "m"), None);
    }

    #[test]
    fn no_more_than_max_pulls_in_flight_start_and_one_more_is_deferred() {
        let mut p = Pulls::new("a");
        for i in 0..MAX_PULLS_IN_FLIGHT {
            let heard = p.heard(member("b"), version("b", &format!("p{i}"), 1), None);
            assert!(matches!(heard, Heard::Pull { .. }), "{i}: {heard:?}");
        }
        let one_more = version("b", "over", 1);
        assert_eq!(
            p.heard(member("b"), one_more.clone(), None),
            Heard::Deferred
        );
        assert_eq!(p.finished("b", "p0"), None);
        assert!(matches!(
            p.heard(member("b"), one_more, None),
            Heard::Pull { .. }
        ));
    }
}
