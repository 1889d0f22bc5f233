//! Bounded long polls of a signals relay: a poll answered early when what the relay says
//! about readiness changed, so a site leaving or rejoining selection reaches every poller
//! within a scrape instead of a poll interval later.
//!
//! The poller sends the readiness generation it last saw ([`crate::store::Store::readiness_generation`],
//! from the answer's [`GENERATION_HEADER`]) and how long it lets the server hold the poll,
//! never longer than its own interval. The server answers at once when its generation
//! differs, else when it moves or at the bound ([`Wait::hold_ms`]), and states its
//! generation (unless it had no room to hold the poll, below). The poller's next poll
//! ([`LongPoll`]):
//!
//! - after an answer stating a generation: at once, but never sooner than
//!   [`MIN_POLL_SPACING_MS`] after the previous poll started, so a server whose readiness
//!   keeps moving is polled at a bounded rate;
//! - after an answer stating none (an older server, which ignores the wait and answers at
//!   once; or a server that had no room to hold it) or a failure: one interval after the
//!   previous poll started, exactly as a plain poller, so an older server never makes it
//!   spin; the next poll is plain too;
//! - after an answer stating the very generation the poll said it had seen, before the
//!   wait ran out (a server, or something between, that did not hold it): one interval
//!   after the previous poll started too.
//!
//! A server holds at most [`MAX_HELD_POLLS`] polls at once ([`Holds`]), a peer at most
//! [`MAX_HELD_POLLS_PER_PEER`] of them, and [`LOCAL_RESERVED_HELD_POLLS`] are left to the
//! site's own gateways; a poll it has no room to hold is answered at once, stating no
//! generation, so its poller falls back to its interval.
//!
//! Pure: times are the poller's monotonic milliseconds, handed in.

use std::collections::BTreeMap;

/// The answer header stating the server's readiness generation (a decimal `u64`).
pub const GENERATION_HEADER: &str = "x-grid-readiness-generation";
/// The query parameter naming the generation the poller last saw.
pub const SEEN_PARAM: &str = "readiness";
/// The query parameter naming how long (ms) the poller lets the server hold the poll.
pub const WAIT_PARAM: &str = "wait_ms";
/// The longest a server holds one poll, whatever it was asked: a minute, the slowest poll
/// interval a gateway accepts, and well within the signals listener's connection age
/// (a connection past its age closes once its held poll is answered).
pub const MAX_WAIT_MS: u64 = 60_000;
/// The least time between the starts of two polls of one server: a quarter of the
/// default scrape interval, so a change every scrape is never delayed by it, while a
/// server that answers early every time is polled at most four times a second.
pub const MIN_POLL_SPACING_MS: u64 = 250;
/// The most polls one server holds at once: as many as its signals listener admits
/// connections, so every connection can hold one.
pub const MAX_HELD_POLLS: usize = 256;
/// Held polls only the site's own gateways can take, so peers holding theirs never make
/// the site's own routing wait a poll interval.
pub const LOCAL_RESERVED_HELD_POLLS: usize = 8;
/// The most polls one peer holds at once: its one poller, and one more while a
/// replacement (a restarted or a re-adopted poller) overlaps an old poll.
pub const MAX_HELD_POLLS_PER_PEER: usize = 2;

/// What a long poll asks of the server: hold the answer until the readiness generation
/// differs from `seen`, at most `wait_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wait {
    /// The generation the poller last saw.
    pub seen: u64,
    /// The longest the server may hold the answer (ms).
    pub wait_ms: u64,
}

impl Wait {
    /// The query string carrying it (`readiness=..&wait_ms=..`).
    pub fn query(&self) -> String {
        format!("{SEEN_PARAM}={}&{WAIT_PARAM}={}", self.seen, self.wait_ms)
    }

    /// Reads it from a query string; `None` unless both parameters are there once each
    /// as decimal numbers (anything else is a plain poll, answered at once). Other
    /// parameters are ignored.
    pub fn parse(query: &str) -> Option<Self> {
        let (mut seen, mut wait_ms) = (None, None);
        for pair in query.split('&') {
            let (name, value) = pair.split_once('=')?;
            let slot = match name {
                SEEN_PARAM => &mut seen,
                WAIT_PARAM => &mut wait_ms,
                _ => continue,
            };
            if slot.is_some() || value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            *slot = Some(value.parse::<u64>().ok()?);
        }
        Some(Self {
            seen: seen?,
            wait_ms: wait_ms?,
        })
    }

    /// How long a server whose generation is `current` holds this poll: `None` to answer
    /// at once (the generation moved since the poller saw it, or no wait was asked),
    /// else the wait asked, at most [`MAX_WAIT_MS`].
    pub fn hold_ms(&self, current: u64) -> Option<u64> {
        (current == self.seen && self.wait_ms > 0).then(|| self.wait_ms.min(MAX_WAIT_MS))
    }
}

/// Reads the generation an answer states, from its [`GENERATION_HEADER`] value.
pub fn parse_generation(value: &str) -> Option<u64> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// One poller's schedule (see the module docs): when its next poll starts and what it
/// asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LongPoll {
    interval_ms: u64,
    /// The generation the last answer stated; `None` after a failure or an answer that
    /// stated none.
    seen: Option<u64>,
    started_ms: Option<u64>,
}

impl LongPoll {
    /// A poller of the given interval (ms), its first poll plain.
    pub fn new(interval_ms: u64) -> Self {
        Self {
            interval_ms,
            seen: None,
            started_ms: None,
        }
    }

    /// The poll interval.
    pub fn interval_ms(&self) -> u64 {
        self.interval_ms
    }

    /// What the next poll asks: a wait of the interval (at most [`MAX_WAIT_MS`]) once the
    /// server stated a generation; `None` (a plain poll) before that, after a failure or
    /// after an answer that stated none.
    pub fn wait(&self) -> Option<Wait> {
        self.seen.map(|seen| Wait {
            seen,
            wait_ms: self.interval_ms.min(MAX_WAIT_MS),
        })
    }

    /// A poll starts at `now_ms`.
    pub fn started(&mut self, now_ms: u64) {
        self.started_ms = Some(now_ms);
    }

    /// The poll was answered at `now_ms`, stating `generation` (or none); returns when
    /// the next one starts.
    pub fn answered(&mut self, now_ms: u64, generation: Option<u64>) -> u64 {
        let start = self.started_ms.unwrap_or(now_ms);
        // What this poll asked: an answer stating the generation it had seen before its
        // wait ran out was not held.
        let unheld = self.wait().is_some_and(|w| {
            generation == Some(w.seen) && now_ms.saturating_sub(start) < w.wait_ms
        });
        self.seen = generation;
        let after = if generation.is_some() && !unheld {
            MIN_POLL_SPACING_MS
        } else {
            self.interval_ms
        };
        now_ms.max(start.saturating_add(after))
    }

    /// The poll failed at `now_ms` (every attempt); returns when the next one starts.
    pub fn failed(&mut self, now_ms: u64) -> u64 {
        self.seen = None;
        let start = self.started_ms.unwrap_or(now_ms);
        now_ms.max(start.saturating_add(self.interval_ms))
    }
}

/// Who asks a server to hold a poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder<'a> {
    /// The site's own gateway (any of its replicas).
    Local,
    /// The peer site of that name.
    Peer(&'a str),
}

crate::label_values! {
    label "reason";
    /// Why a server answered a long poll at once instead of holding it (the `reason`
    /// label of the operator's `grid_operator_long_polls_refused_total`).
    pub enum HoldRefusal {
        /// Every held poll the caller may take is taken: [`MAX_HELD_POLLS`] in all, or
        /// all but the [`LOCAL_RESERVED_HELD_POLLS`] for a peer.
        Full,
        /// The peer holds [`MAX_HELD_POLLS_PER_PEER`] already.
        PeerFull,
    }
}

/// The polls a server holds (see the module docs): taken with [`Holds::hold`], given back
/// with [`Holds::release`] once the poll is answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holds {
    local: usize,
    /// Per peer; a peer holding none has no entry, so at most [`MAX_HELD_POLLS`] entries.
    peers: BTreeMap<String, usize>,
    peers_held: usize,
}

impl Holds {
    /// Polls held now.
    pub fn held(&self) -> usize {
        self.local + self.peers_held
    }

    /// Takes a held poll for `holder`, or says why there is none.
    pub fn hold(&mut self, holder: Holder<'_>) -> Result<(), HoldRefusal> {
        if self.held() >= MAX_HELD_POLLS {
            return Err(HoldRefusal::Full);
        }
        match holder {
            Holder::Local => self.local += 1,
            Holder::Peer(name) => {
                if self.peers_held >= MAX_HELD_POLLS - LOCAL_RESERVED_HELD_POLLS {
                    return Err(HoldRefusal::Full);
                }
                let held = self.peers.get(name).copied().unwrap_or(0);
                if held >= MAX_HELD_POLLS_PER_PEER {
                    return Err(HoldRefusal::PeerFull);
                }
                self.peers.insert(name.to_owned(), held + 1);
                self.peers_held += 1;
            }
        }
        Ok(())
    }

    /// Gives back a poll [`Holds::hold`] took for `holder` (one never taken is ignored).
    pub fn release(&mut self, holder: Holder<'_>) {
        match holder {
            Holder::Local => self.local = self.local.saturating_sub(1),
            Holder::Peer(name) => {
                let Some(held) = self.peers.get_mut(name) else {
                    return;
                };
                *held -= 1;
                if *held == 0 {
                    self.peers.remove(name);
                }
                self.peers_held -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_round_trips_through_its_query_and_anything_else_is_a_plain_poll() {
        let w = Wait {
            seen: 42,
            wait_ms: 5_000,
        };
        assert_eq!(w.query(), "readiness=42&wait_ms=5000");
        assert_eq!(Wait::parse(&w.query()), Some(w));
        assert_eq!(Wait::parse("wait_ms=5000&x=1&readiness=42"), Some(w));
        for plain in [
            "",
            "readiness=42",
            "wait_ms=5000",
            "readiness=-1&wait_ms=5",
            "readiness=4&readiness=4&wait_ms=5",
            "readiness=&wait_ms=5",
            "readiness=1&wait_ms=99999999999999999999999",
            "readiness",
        ] {
            assert_eq!(Wait::parse(plain), None, "{plain:?}");
        }
    }

    #[test]
    fn a_server_answers_at_once_when_its_generation_moved_and_holds_at_most_max_wait() {
        let w = Wait {
            seen: 7,
            wait_ms: MAX_WAIT_MS,
        };
        assert_eq!(w.hold_ms(8), None);
        assert_eq!(w.hold_ms(6), None, "a restarted server counts anew");
        assert_eq!(w.hold_ms(7), Some(MAX_WAIT_MS));
        let longer = Wait {
            seen: 7,
            wait_ms: MAX_WAIT_MS + 1,
        };
        assert_eq!(longer.hold_ms(7), Some(MAX_WAIT_MS));
        let none = Wait {
            seen: 7,
            wait_ms: 0,
        };
        assert_eq!(none.hold_ms(7), None);
    }

    #[test]
    fn the_generation_header_is_a_decimal_number_or_nothing() {
        assert_eq!(parse_generation("0"), Some(0));
        assert_eq!(parse_generation("18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_generation("18446744073709551616"), None);
        assert_eq!(parse_generation(" 1"), None);
        assert_eq!(parse_generation(""), None);
    }

    #[test]
    fn the_first_poll_is_plain_and_a_stated_generation_turns_the_next_into_a_long_poll() {
        let mut p = LongPoll::new(5_000);
        assert_eq!(p.wait(), None);
        p.started(0);
        assert_eq!(p.answered(30, Some(3)), MIN_POLL_SPACING_MS);
        assert_eq!(
            p.wait(),
            Some(Wait {
                seen: 3,
                wait_ms: 5_000
            })
        );
        // Held to its bound: the next starts at once.
        p.started(250);
        assert_eq!(p.answered(5_250, Some(3)), 5_250);
    }

    #[test]
    fn a_server_answering_early_every_time_is_polled_at_most_once_per_spacing() {
        let mut p = LongPoll::new(5_000);
        p.started(1_000);
        assert_eq!(
            p.answered(1_000 + MIN_POLL_SPACING_MS - 1, Some(9)),
            1_000 + MIN_POLL_SPACING_MS
        );
        p.started(1_000);
        assert_eq!(
            p.answered(1_000 + MIN_POLL_SPACING_MS, Some(10)),
            1_000 + MIN_POLL_SPACING_MS
        );
        p.started(1_000);
        assert_eq!(
            p.answered(1_000 + MIN_POLL_SPACING_MS + 1, Some(11)),
            1_000 + MIN_POLL_SPACING_MS + 1
        );
    }

    #[test]
    fn an_older_server_that_answers_at_once_is_polled_at_the_interval_and_plainly() {
        let mut p = LongPoll::new(5_000);
        let mut at = 0;
        for _ in 0..10 {
            p.started(at);
            let next = p.answered(at + 3, None);
            assert_eq!(next, at + 5_000);
            assert_eq!(p.wait(), None);
            at = next;
        }
    }

    #[test]
    fn a_failed_poll_waits_the_interval_and_the_next_is_plain() {
        let mut p = LongPoll::new(1_000);
        p.started(0);
        p.answered(10, Some(1));
        p.started(250);
        assert_eq!(p.failed(400), 1_250);
        assert_eq!(
            p.failed(2_000),
            2_000,
            "a failure past the interval: at once"
        );
        assert_eq!(p.wait(), None);
    }

    #[test]
    fn an_answer_repeating_the_generation_seen_before_the_wait_ran_out_was_not_held() {
        let mut p = LongPoll::new(5_000);
        p.started(0);
        assert_eq!(p.answered(5, Some(4)), MIN_POLL_SPACING_MS);
        // Asked to hold while at 4, answered at once at 4: the interval.
        p.started(MIN_POLL_SPACING_MS);
        assert_eq!(
            p.answered(MIN_POLL_SPACING_MS + 4_999, Some(4)),
            MIN_POLL_SPACING_MS + 5_000
        );
        // Held the whole wait: at once; moved early: after the spacing.
        p.started(10_000);
        assert_eq!(p.answered(15_000, Some(4)), 15_000);
        p.started(15_000);
        assert_eq!(p.answered(15_010, Some(5)), 15_000 + MIN_POLL_SPACING_MS);
    }

    #[test]
    fn a_server_holds_at_most_max_held_polls_and_leaves_the_reserve_to_its_gateways() {
        let mut h = Holds::default();
        let names: Vec<String> = (0..MAX_HELD_POLLS).map(|i| format!("p{i}")).collect();
        for name in &names[..MAX_HELD_POLLS - LOCAL_RESERVED_HELD_POLLS] {
            assert_eq!(h.hold(Holder::Peer(name)), Ok(()));
        }
        let last = &names[MAX_HELD_POLLS - LOCAL_RESERVED_HELD_POLLS];
        assert_eq!(h.hold(Holder::Peer(last)), Err(HoldRefusal::Full));
        for _ in 0..LOCAL_RESERVED_HELD_POLLS {
            assert_eq!(h.hold(Holder::Local), Ok(()));
        }
        assert_eq!(h.held(), MAX_HELD_POLLS);
        assert_eq!(h.hold(Holder::Local), Err(HoldRefusal::Full));
        h.release(Holder::Local);
        assert_eq!(h.hold(Holder::Local), Ok(()));
        h.release(Holder::Peer(&names[0]));
        assert_eq!(h.hold(Holder::Peer(last)), Ok(()));
        // Gateways alone may take every one.
        let mut h = Holds::default();
        for _ in 0..MAX_HELD_POLLS {
            assert_eq!(h.hold(Holder::Local), Ok(()));
        }
        assert_eq!(h.hold(Holder::Local), Err(HoldRefusal::Full));
        assert_eq!(h.hold(Holder::Peer("b")), Err(HoldRefusal::Full));
    }

    #[test]
    fn a_peer_holds_at_most_its_share_and_release_gives_it_back() {
        let mut h = Holds::default();
        for _ in 0..MAX_HELD_POLLS_PER_PEER {
            assert_eq!(h.hold(Holder::Peer("b")), Ok(()));
        }
        assert_eq!(h.hold(Holder::Peer("b")), Err(HoldRefusal::PeerFull));
        assert_eq!(h.hold(Holder::Peer("c")), Ok(()));
        h.release(Holder::Peer("b"));
        assert_eq!(h.hold(Holder::Peer("b")), Ok(()));
        for _ in 0..MAX_HELD_POLLS_PER_PEER {
            h.release(Holder::Peer("b"));
        }
        h.release(Holder::Peer("c"));
        // Released more than held: ignored, and nothing is left behind.
        h.release(Holder::Peer("b"));
        h.release(Holder::Local);
        assert_eq!(h, Holds::default());
    }

    #[test]
    fn the_wait_asked_is_the_interval_up_to_max_wait() {
        for (interval, asked) in [
            (1_000, 1_000),
            (MAX_WAIT_MS, MAX_WAIT_MS),
            (MAX_WAIT_MS + 1, MAX_WAIT_MS),
        ] {
            let mut p = LongPoll::new(interval);
            p.started(0);
            p.answered(1, Some(0));
            assert_eq!(p.wait().map(|w| w.wait_ms), Some(asked));
        }
    }
}
