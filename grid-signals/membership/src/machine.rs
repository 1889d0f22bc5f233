//! The membership state machine: foca's SWIM behind sealed datagrams and timers kept as
//! deadlines, fed by the driver through [`Membership::handle`] and
//! [`Membership::handle_timeout`], drained through [`Membership::poll`].

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::num::{NonZeroU8, NonZeroUsize};
use std::time::Duration;

use foca::{AccumulatingRuntime, Codec, Foca, OwnedNotification, PostcardCodec, State, Timer};

use crate::metrics::{Direction, MembershipMetrics, Refusal, Unsent};
use crate::overlay::{BroadcastRefusal, Handler, Version};
use crate::rng::{FocaRng, Rng, SplitMix64};
use crate::seal::{Role, SEAL_OVERHEAD, SESSION_MATERIAL_BYTES, Sessions};
use crate::{Error, Member};

/// The largest datagram sent or accepted: the IPv6 minimum MTU (1280) less the IPv6 and
/// UDP headers, so no path fragments it.
pub const MAX_DATAGRAM_BYTES: usize = 1232;
/// The largest SWIM message inside one datagram.
pub const MAX_PLAINTEXT_BYTES: usize = MAX_DATAGRAM_BYTES - SEAL_OVERHEAD;
/// Messages queued for a member while its session is agreed; more are dropped and
/// counted ([`Unsent::PendingFull`]). SWIM retries on its own, so a short queue suffices.
pub const PENDING_PER_MEMBER: usize = 8;
/// Members that may have messages queued at once.
pub const MAX_PENDING_MEMBERS: usize = 1024;
/// After a session with a member could not be agreed, the next attempt waits this long.
pub const SESSION_RETRY_MS: u64 = 1_000;
/// Sessions asked for ([`Output::Connect`]) and not yet answered, at most. Messages to
/// other members without a session wait in their queue, and a session is asked for them
/// as answers come in: announcing to hundreds of members believed down after their
/// sessions expired must not start hundreds of TLS exchanges at once.
pub const MAX_SESSIONS_CONNECTING: usize = 16;
/// Each message (a member's news, a batch version) is sent at least this many times.
pub const MIN_TRANSMISSIONS: u8 = 10;
/// Transmissions added per tenfold growth of the roster: infection-style dissemination
/// needs O(log n) rounds to reach every member, so a fixed count that suffices for tens of
/// sites leaves some of a thousand waiting for a digest round (memberlist and foca's WAN
/// preset use the same multiplier).
pub const TRANSMISSIONS_PER_DECADE: f64 = 4.0;

/// How many times each message is sent in a roster of `members` others.
pub fn transmissions(members: usize) -> u8 {
    #[allow(clippy::cast_precision_loss)]
    let scaled = ((members as f64 + 1.0).log10() * TRANSMISSIONS_PER_DECADE).ceil();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let scaled = scaled.clamp(0.0, f64::from(u8::MAX)) as u8;
    scaled.max(MIN_TRANSMISSIONS)
}

/// Members foca asks to probe a silent one indirectly, and sends each gossip or broadcast
/// message to, drawn at random (its `num_indirect_probes`).
const FANOUT: usize = 3;

/// Members believed down that are sent an announce each round. A member believed down
/// costs what a live one does, one datagram a round, while it is remembered; with halves
/// of 300 sites apart, announcing to eight a round healed in 5.1 s, to 64 in 3.5 s, to
/// all 150 in 2.9 s (`grid-swim-scale`).
pub const MAX_DOWN_ANNOUNCES: usize = 256;

/// Members by state are recounted (a walk of the whole roster) at every join, death and
/// suspicion, and otherwise at most this often: a refutation, which foca does not notify,
/// shows on the gauge within this long. Recounting after every datagram cost O(sites)
/// per datagram.
pub const MEMBER_RECOUNT_MS: u64 = 1_000;

/// The protocol's periods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timing {
    /// One membership round: a random member is probed once per period.
    pub probe_period: Duration,
    /// How long a probe waits for its ack before asking others to probe indirectly.
    pub probe_rtt: Duration,
    /// How long a suspect has to refute before it is declared down.
    pub suspect_to_down: Duration,
    /// How often a random member and every member believed down are sent an announce,
    /// so a partition heals and a newcomer learns the whole roster.
    pub announce: Duration,
    /// How often updates are pushed to a few members besides the probe cycle.
    pub gossip: Duration,
}

impl Default for Timing {
    /// One-second rounds: a dead site is suspected within about two rounds and declared
    /// down three seconds later.
    fn default() -> Self {
        Self {
            probe_period: Duration::from_secs(1),
            probe_rtt: Duration::from_millis(400),
            suspect_to_down: Duration::from_secs(3),
            announce: Duration::from_secs(1),
            gossip: Duration::from_millis(250),
        }
    }
}

impl Timing {
    fn foca(&self) -> foca::Config {
        let periodic = |frequency, n| {
            Some(foca::PeriodicParams {
                frequency,
                num_members: NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN),
            })
        };
        foca::Config {
            probe_period: self.probe_period,
            probe_rtt: self.probe_rtt,
            num_indirect_probes: NonZeroUsize::new(FANOUT).unwrap_or(NonZeroUsize::MIN),
            max_transmissions: NonZeroU8::new(MIN_TRANSMISSIONS).unwrap_or(NonZeroU8::MIN),
            suspect_to_down_after: self.suspect_to_down,
            remove_down_after: Some(Duration::from_secs(15 * 60)),
            max_packet_size: NonZeroUsize::new(MAX_PLAINTEXT_BYTES).unwrap_or(NonZeroUsize::MIN),
            notify_down_members: true,
            periodic_announce: periodic(self.announce, 1),
            // Every round, to every member believed down (up to the bound), so a healed
            // partition is noticed within one: a member declared down answers an announce
            // by learning it must renew its identity, and each answer's feed hands back the
            // renewed roster of its side, which dissemination alone would take rounds more
            // to spread. A member that renews announces at once as well
            // (`Membership::announce_to_down`).
            periodic_announce_to_down_members: periodic(self.probe_period, MAX_DOWN_ANNOUNCES),
            periodic_gossip: periodic(self.gossip, 3),
        }
    }
}

/// What the driver hands in.
#[derive(Debug)]
pub enum Input<'a> {
    /// A datagram arrived on the membership socket (opened in place).
    Datagram(&'a mut [u8]),
    /// A session was agreed over the signals listener with `member`, whose site name the
    /// TLS connection authenticated.
    Session {
        /// The identity the other end sent in the exchange.
        member: Member,
        /// The bytes both ends exported from that connection.
        material: [u8; SESSION_MATERIAL_BYTES],
        /// This site's end of the connection.
        role: Role,
    },
    /// A session this site asked for ([`Output::Connect`]) could not be agreed.
    SessionFailed {
        /// The member's site.
        site: String,
    },
}

/// What the driver carries out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send `datagram` to `to.host:to.gossip_port`.
    Transmit {
        /// The member.
        to: Member,
        /// Sealed, at most [`MAX_DATAGRAM_BYTES`].
        datagram: Vec<u8>,
    },
    /// Agree a session with `member` over its signals listener (this site initiates),
    /// then hand in [`Input::Session`] or [`Input::SessionFailed`].
    Connect(Member),
    /// A member joined, or came back under a new incarnation (its host may have moved).
    Up(Member),
    /// A member was declared down.
    Down(Member),
    /// `from` told of a batch version newer than any this member had heard of: pull it
    /// from `from` unless the store already holds it or newer.
    Heard {
        /// The member whose message carried it (who can serve it).
        from: Member,
        /// The version.
        version: Version,
    },
}

struct Due {
    at: u64,
    seq: u64,
    timer: Timer<Member>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

struct Pending {
    member: Member,
    queue: VecDeque<Vec<u8>>,
}

type Swim<R> = Foca<Member, PostcardCodec, FocaRng<R>, Handler>;

/// One site's membership.
pub struct Membership<R: Rng> {
    foca: Swim<R>,
    versions: Handler,
    runtime: AccumulatingRuntime<Member>,
    sessions: Sessions,
    timers: BinaryHeap<Reverse<Due>>,
    next_seq: u64,
    pending: HashMap<String, Pending>,
    /// Sites a session was asked for and not yet answered, and sites whose last attempt
    /// failed, with when the next may start.
    connecting: HashMap<String, Option<u64>>,
    outputs: VecDeque<Output>,
    /// The highest incarnation this site has sent under.
    own_incarnation: u16,
    metrics: MembershipMetrics,
    seal_buf: Vec<u8>,
    /// When members by state were last counted, if ever.
    counted_at: Option<u64>,
    timing: Timing,
    /// foca's `max_transmissions` now: [`transmissions`] of the roster.
    transmitting: u8,
    /// This machine's own draws (which members believed down a renewed identity announces
    /// to), split from the caller's generator before foca takes it.
    rng: SplitMix64,
}

impl<R: Rng> std::fmt::Debug for Membership<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("identity", self.foca.identity())
            .field("members", &self.foca.num_members())
            .field("sessions", &self.sessions)
            .finish_non_exhaustive()
    }
}

impl<R: Rng> Membership<R> {
    /// A site's membership under `identity`, knowing nobody yet; seeds come in as sessions
    /// the driver agreed with them ([`Input::Session`] as [`Role::Initiator`]).
    ///
    /// ```
    /// use grid_membership::{Member, Membership, MembershipMetrics, SplitMix64, Timing};
    /// let me = Member { site: "a".into(), host: "10.0.0.1".into(), signals_port: 9443,
    ///                   gossip_port: 7946, incarnation: 1 };
    /// let m = Membership::new(me, &Timing::default(), SplitMix64::new(7), MembershipMetrics::default())?;
    /// assert_eq!(m.live().count(), 0);
    /// # Ok::<(), grid_membership::Error>(())
    /// ```
    pub fn new(
        identity: Member,
        timing: &Timing,
        mut rng: R,
        metrics: MembershipMetrics,
    ) -> Result<Self, Error> {
        identity.check()?;
        let own_rng = SplitMix64::new(rng.next_u64());
        let versions = Handler::default();
        Ok(Self {
            foca: Foca::with_custom_broadcast(
                identity,
                timing.foca(),
                FocaRng(rng),
                PostcardCodec,
                versions.clone(),
            ),
            versions,
            runtime: AccumulatingRuntime::new(),
            sessions: Sessions::default(),
            timers: BinaryHeap::new(),
            next_seq: 0,
            pending: HashMap::new(),
            connecting: HashMap::new(),
            outputs: VecDeque::new(),
            own_incarnation: 0,
            metrics,
            seal_buf: Vec::with_capacity(MAX_DATAGRAM_BYTES),
            counted_at: None,
            timing: timing.clone(),
            transmitting: MIN_TRANSMISSIONS,
            rng: own_rng,
        })
    }

    /// This site's identity.
    pub fn identity(&self) -> &Member {
        self.foca.identity()
    }

    /// The members believed alive (suspects included, as SWIM treats them), this site
    /// excluded.
    pub fn live(&self) -> impl Iterator<Item = &Member> {
        self.foca.iter_members().map(foca::Member::id)
    }

    /// The live member of `site`, if [`Membership::live`] yields one.
    pub fn live_member(&self, site: &str) -> Option<&Member> {
        self.live().find(|m| m.site == site)
    }

    /// How many members [`Membership::live`] yields, without walking them.
    pub fn live_count(&self) -> usize {
        self.foca.num_members()
    }

    /// The series this membership records into.
    pub fn metrics(&self) -> &MembershipMetrics {
        &self.metrics
    }

    /// Sessions held.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Feeds one input at `now_ms`.
    pub fn handle(&mut self, now_ms: u64, input: Input<'_>) {
        match input {
            Input::Datagram(datagram) => self.datagram(now_ms, datagram),
            Input::Session {
                member,
                material,
                role,
            } => {
                if member.check().is_err() || member.site == self.identity().site {
                    self.metrics.unsent(Unsent::InvalidMember);
                    return;
                }
                self.sessions.install(now_ms, &member.site, &material, role);
                self.connecting.remove(&member.site);
                let known = self.live().any(|m| m == &member);
                if role == Role::Initiator && !known {
                    let result = self.foca.announce(member.clone(), &mut self.runtime);
                    ignore_operational(&result);
                }
                self.flush_pending(now_ms, &member.site);
                self.ask_waiting(now_ms);
                self.drain(now_ms);
            }
            Input::SessionFailed { site } => {
                self.connecting
                    .insert(site.clone(), Some(now_ms + SESSION_RETRY_MS));
                if let Some(p) = self.pending.remove(&site) {
                    for _ in p.queue {
                        self.metrics.unsent(Unsent::SessionFailed);
                    }
                }
                self.ask_waiting(now_ms);
            }
        }
    }

    fn datagram(&mut self, now_ms: u64, datagram: &mut [u8]) {
        self.metrics.traffic(Direction::Received, datagram.len());
        if datagram.len() > MAX_DATAGRAM_BYTES {
            self.metrics.refuse(Refusal::Oversized);
            return;
        }
        let (peer, plain) = match self.sessions.open(now_ms, datagram) {
            Ok(opened) => opened,
            Err(r) => {
                self.metrics.refuse(r.into());
                return;
            }
        };
        let Ok(header) = Codec::<Member>::decode_header(&mut PostcardCodec, plain) else {
            self.metrics.refuse(Refusal::Undecodable);
            return;
        };
        if header.src.site != peer || header.src.check().is_err() {
            self.metrics.refuse(Refusal::IdentityMismatch);
            return;
        }
        if let Err(e) = self.foca.handle_data(plain, &mut self.runtime) {
            let broadcast = self.versions.lock().last_refusal.take();
            self.metrics.refuse(match (e, broadcast) {
                (foca::Error::Decode(_), _) => Refusal::Undecodable,
                (foca::Error::CustomBroadcast(_), Some(BroadcastRefusal::Full)) => {
                    Refusal::VersionsFull
                }
                (foca::Error::CustomBroadcast(_), _) => Refusal::Broadcast,
                _ => Refusal::Protocol,
            });
        }
        self.drain(now_ms);
    }

    /// When the next timer is due (`now_ms` units), if any.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.timers.peek().map(|Reverse(d)| d.at)
    }

    /// Fires every timer due at `now_ms`.
    pub fn handle_timeout(&mut self, now_ms: u64) {
        while self.timers.peek().is_some_and(|Reverse(d)| d.at <= now_ms) {
            let Some(Reverse(due)) = self.timers.pop() else {
                break;
            };
            let result = self.foca.handle_timer(due.timer, &mut self.runtime);
            ignore_operational(&result);
            self.drain(now_ms);
        }
        self.connecting
            .retain(|_, retry| retry.is_none_or(|at| at > now_ms));
    }

    /// Disseminates a version of one of this site's own batches; `false` when it is not
    /// newer than one already given for its register (nothing is sent then).
    pub fn announce(&mut self, now_ms: u64, version: &Version) -> bool {
        let added = self.add_version(version);
        self.drain(now_ms);
        added
    }

    /// [`Membership::announce`], then pushed at once rather than left to ride the next
    /// rounds: one broadcast per three live members (foca draws the three of each), so
    /// most members hold the version one hop after it is given and the rest from them at
    /// their next gossip round. Each datagram spends one of the version's
    /// [`transmissions`], which bound the pushes: foca sends nothing once they are spent.
    /// For what must spread within a scrape (a readiness change); a load change rides the
    /// rounds. `false`, and nothing is pushed, when the version is not newer than one
    /// already given.
    pub fn announce_now(&mut self, now_ms: u64, version: &Version) -> bool {
        let added = self.add_version(version);
        if added {
            for _ in 0..self.foca.num_members().div_ceil(FANOUT) {
                let result = self.foca.broadcast(&mut self.runtime);
                ignore_operational(&result);
            }
        }
        self.drain(now_ms);
        added
    }

    /// Hands `version` to foca's broadcasts; `false` when it is not newer than the one
    /// held for its register.
    fn add_version(&mut self, version: &Version) -> bool {
        let mut wire = Vec::with_capacity(64);
        version.encode(&mut wire);
        self.foca.add_broadcast(&wire).unwrap_or(false)
    }

    /// Leaves the cluster: members learn it at once instead of after a suspicion.
    pub fn leave(&mut self, now_ms: u64) {
        let result = self.foca.leave_cluster(&mut self.runtime);
        ignore_operational(&result);
        self.drain(now_ms);
    }

    /// The next output, if any.
    pub fn poll(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// Moves what foca accumulated into outputs and timers.
    fn drain(&mut self, now_ms: u64) {
        let mut changed = false;
        while let Some((after, timer)) = self.runtime.to_schedule() {
            if matches!(timer, Timer::ChangeSuspectToDown { .. }) {
                self.metrics.suspected();
                changed = true;
            }
            let at = now_ms.saturating_add(u64::try_from(after.as_millis()).unwrap_or(u64::MAX));
            self.next_seq += 1;
            self.timers.push(Reverse(Due {
                at,
                seq: self.next_seq,
                timer,
            }));
        }
        let mut rejoined = false;
        while let Some(note) = self.runtime.to_notify() {
            match note {
                OwnedNotification::Rejoin(_) => rejoined = true,
                OwnedNotification::MemberUp(m) | OwnedNotification::Rename(_, m) => {
                    changed = true;
                    self.outputs.push_back(Output::Up(m));
                }
                OwnedNotification::MemberDown(m) => {
                    changed = true;
                    self.outputs.push_back(Output::Down(m));
                }
                _ => {}
            }
        }
        if rejoined {
            self.announce_to_down();
        }
        {
            let mut registers = self.versions.lock();
            while let Some((from, version)) = registers.heard.pop_front() {
                self.outputs.push_back(Output::Heard { from, version });
            }
        }
        while let Some((to, data)) = self.runtime.to_send() {
            if let Ok(h) = Codec::<Member>::decode_header(&mut PostcardCodec, &data[..])
                && h.src_incarnation > self.own_incarnation
            {
                self.metrics.refuted();
                self.own_incarnation = h.src_incarnation;
            }
            self.send(now_ms, to, &data);
        }
        if changed || recount_due(self.counted_at, now_ms) {
            self.count_members(now_ms);
        }
        if changed {
            self.scale_transmissions();
        }
    }

    /// A site that learnt it was declared down has just renewed its identity, and foca
    /// holds its rounds until it hears from a member again, so the members on the far side
    /// of a healed partition would hear the new identity a round later. It announces to
    /// them at once instead (up to [`MAX_DOWN_ANNOUNCES`], chosen at random): each that had
    /// not renewed yet learns from the answer that it must, and announces back.
    fn announce_to_down(&mut self) {
        let mut down: Vec<Member> = self
            .foca
            .iter_membership_state()
            .filter(|m| m.state() == State::Down)
            .map(|m| m.id().clone())
            .collect();
        let chosen = down.len().min(MAX_DOWN_ANNOUNCES);
        for i in 0..chosen {
            #[allow(clippy::cast_possible_truncation)]
            let j = i + (self.rng.next_u64() % (down.len() - i) as u64) as usize;
            down.swap(i, j);
        }
        for member in down.drain(..chosen) {
            let result = self.foca.announce(member, &mut self.runtime);
            ignore_operational(&result);
        }
    }

    /// Follows the roster's size with foca's transmissions; only that setting changes, which
    /// foca allows on a running instance.
    fn scale_transmissions(&mut self) {
        let wanted = transmissions(self.foca.num_members());
        if wanted == self.transmitting {
            return;
        }
        let mut config = self.timing.foca();
        config.max_transmissions = NonZeroU8::new(wanted).unwrap_or(NonZeroU8::MIN);
        if self.foca.set_config(config).is_ok() {
            self.transmitting = wanted;
        }
    }

    fn count_members(&mut self, now_ms: u64) {
        self.counted_at = Some(now_ms);
        let (mut alive, mut suspect, mut down) = (0, 0, 0);
        for m in self.foca.iter_membership_state() {
            match m.state() {
                State::Alive => alive += 1,
                State::Suspect => suspect += 1,
                State::Down => down += 1,
            }
        }
        self.metrics.set_members(alive, suspect, down);
    }

    fn send(&mut self, now_ms: u64, to: Member, plaintext: &[u8]) {
        if to.check().is_err() {
            self.metrics.unsent(Unsent::InvalidMember);
            return;
        }
        if self
            .sessions
            .seal(now_ms, &to.site, plaintext, &mut self.seal_buf)
        {
            self.metrics.traffic(Direction::Sent, self.seal_buf.len());
            self.outputs.push_back(Output::Transmit {
                to,
                datagram: self.seal_buf.clone(),
            });
            return;
        }
        let full =
            !self.pending.contains_key(&to.site) && self.pending.len() >= MAX_PENDING_MEMBERS;
        if full {
            self.metrics.unsent(Unsent::PendingFull);
            return;
        }
        let p = self
            .pending
            .entry(to.site.clone())
            .or_insert_with(|| Pending {
                member: to.clone(),
                queue: VecDeque::new(),
            });
        p.member = to.clone();
        if p.queue.len() >= PENDING_PER_MEMBER {
            self.metrics.unsent(Unsent::PendingFull);
        } else {
            p.queue.push_back(plaintext.to_vec());
        }
        if self.may_ask(now_ms, &to.site) {
            self.connecting.insert(to.site.clone(), None);
            self.outputs.push_back(Output::Connect(to));
        }
    }

    /// Whether a session may be asked for with `site` now: not asked already, not waiting
    /// out a failed attempt, and fewer than [`MAX_SESSIONS_CONNECTING`] unanswered.
    fn may_ask(&self, now_ms: u64, site: &str) -> bool {
        self.unasked(now_ms, site) && self.free_session_slots() > 0
    }

    /// Neither asked already nor waiting out a failed attempt.
    fn unasked(&self, now_ms: u64, site: &str) -> bool {
        match self.connecting.get(site) {
            Some(None) => false,
            Some(Some(retry)) => *retry <= now_ms,
            None => true,
        }
    }

    fn free_session_slots(&self) -> usize {
        let asked = self.connecting.values().filter(|c| c.is_none()).count();
        MAX_SESSIONS_CONNECTING.saturating_sub(asked)
    }

    /// Asks sessions for members whose messages wait without one, as slots allow.
    fn ask_waiting(&mut self, now_ms: u64) {
        let waiting: Vec<Member> = self
            .pending
            .values()
            .filter(|p| self.unasked(now_ms, &p.member.site))
            .take(self.free_session_slots())
            .map(|p| p.member.clone())
            .collect();
        for member in waiting {
            self.connecting.insert(member.site.clone(), None);
            self.outputs.push_back(Output::Connect(member));
        }
    }

    fn flush_pending(&mut self, now_ms: u64, site: &str) {
        let Some(p) = self.pending.remove(site) else {
            return;
        };
        for plaintext in p.queue {
            self.send(now_ms, p.member.clone(), &plaintext);
        }
    }
}

/// Whether members by state, last counted at `counted_at`, are due a recount at `now_ms`.
fn recount_due(counted_at: Option<u64>, now_ms: u64) -> bool {
    counted_at.is_none_or(|at| now_ms >= at.saturating_add(MEMBER_RECOUNT_MS))
}

/// foca's operational errors (an announce to a member it knows is down, a timer for a
/// member since removed) change nothing and are not inputs a peer sent, so they are not
/// refusals either: nothing to count or return.
fn ignore_operational(_: &Result<(), foca::Error>) {}

#[cfg(test)]
mod tests {
    use super::{
        Input, MAX_DOWN_ANNOUNCES, MAX_SESSIONS_CONNECTING, MEMBER_RECOUNT_MS, MIN_TRANSMISSIONS,
        Membership, Output, recount_due, transmissions,
    };
    use crate::{Member, MembershipMetrics, SplitMix64, Timing};

    fn connects(m: &mut Membership<SplitMix64>) -> Vec<String> {
        std::iter::from_fn(|| m.poll())
            .filter_map(|o| match o {
                Output::Connect(to) => Some(to.site),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn at_most_max_sessions_are_asked_for_at_once_and_a_waiting_one_is_asked_as_one_ends() {
        let mut m = Membership::new(
            Member::loopback("a"),
            &Timing::default(),
            SplitMix64::new(1),
            MembershipMetrics::default(),
        )
        .unwrap();
        for i in 0..=MAX_SESSIONS_CONNECTING {
            m.send(0, Member::loopback(&format!("s{i}")), b"probe");
        }
        let asked = connects(&mut m);
        assert_eq!(asked.len(), MAX_SESSIONS_CONNECTING);
        m.handle(
            10,
            Input::SessionFailed {
                site: asked[0].clone(),
            },
        );
        let next = connects(&mut m);
        assert_eq!(next.len(), 1);
        assert!(!asked.contains(&next[0]), "{next:?} was asked already");
    }

    #[test]
    fn a_renewed_identity_announces_to_at_most_max_down_announces_distinct_members_believed_down() {
        for down in [MAX_DOWN_ANNOUNCES - 1, MAX_DOWN_ANNOUNCES + 1] {
            let mut m = Membership::new(
                Member::loopback("a"),
                &Timing::default(),
                SplitMix64::new(3),
                MembershipMetrics::default(),
            )
            .unwrap();
            let members = (0..down).map(|i| foca::Member::down(Member::loopback(&format!("s{i}"))));
            m.foca.apply_many(members, false, &mut m.runtime).unwrap();
            while m.runtime.to_send().is_some() {}
            m.announce_to_down();
            let mut to: Vec<String> = std::iter::from_fn(|| m.runtime.to_send())
                .map(|(to, _)| to.site)
                .collect();
            let sent = to.len();
            to.sort();
            to.dedup();
            assert_eq!(to.len(), sent, "one announce per member");
            assert_eq!(sent, down.min(MAX_DOWN_ANNOUNCES));
        }
    }

    #[test]
    fn members_are_recounted_first_and_then_once_the_recount_period_has_passed() {
        assert!(recount_due(None, 0));
        assert!(!recount_due(Some(5_000), 5_000 + MEMBER_RECOUNT_MS - 1));
        assert!(recount_due(Some(5_000), 5_000 + MEMBER_RECOUNT_MS));
    }

    #[test]
    fn messages_are_sent_ten_times_up_to_315_members_and_more_from_316() {
        assert_eq!(transmissions(0), MIN_TRANSMISSIONS);
        assert_eq!(transmissions(315), MIN_TRANSMISSIONS);
        assert_eq!(transmissions(316), MIN_TRANSMISSIONS + 1);
        assert_eq!(transmissions(1_000), 13);
        assert_eq!(transmissions(usize::MAX), 78);
    }
}
