//! The membership and overlay code alone at scale: grid-membership's real state machine
//! for every site, in virtual time, over a simulated WAN (delay, jitter, loss, a
//! partition), with the operator's gossip driver reduced to its timing (a pull or a
//! digest costs one round trip, a pull from a member out of reach its timeout) and its
//! pull rule the driver's own ([`grid_membership::pulls::Pulls`]: what is wanted, one
//! request per member for every register wanted from it, at most 16 in flight).
//!
//! What it measures, for the scale table in `docs/benchmarks.md`:
//!
//! - how long a joining grid takes to converge from one seed;
//! - how long a batch version takes to be held by every member (announce, then a pull from
//!   whoever told of it, answered with what that member holds when the request reaches
//!   it, or a digest round for a member that missed it);
//! - how long a dead site takes to be declared down everywhere;
//! - bytes per site per second (sealed datagrams, pulls and digests);
//! - rounds to converge after a healed partition.
//!
//! Poll mode's figures beside them come from its schedule (each site polls every other once
//! per `peerPollSeconds`), not from this simulation: poll has no protocol to simulate.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use grid_membership::pulls::Pulls;
use grid_membership::{
    Direction, Input, Member, Membership, MembershipMetrics, Output, Rng, Role, SplitMix64, Timing,
    Version,
};

/// One scale run.
#[derive(Clone, Debug)]
pub struct Params {
    /// Sites.
    pub sites: usize,
    /// Datagrams lost, per mille.
    pub loss_per_mille: u64,
    /// One-way delay, uniform in this range (ms).
    pub delay_ms: (u64, u64),
    /// Bytes of one relayed batch (a pull's body).
    pub batch_bytes: u64,
    /// Batch versions announced during the spread phase.
    pub announcements: usize,
    /// The seed of everything random.
    pub seed: u64,
}

/// What one run measured; times in ms.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Sites.
    pub sites: usize,
    /// From every site knowing only the seed to every site knowing every other.
    pub join_ms: Option<u64>,
    /// Per (announcement, member): time until the member held the version; missed, the
    /// members that never held it within the phase.
    pub spread: Delays,
    /// Per member: time from a site's death to the member declaring it down; missed,
    /// the members that had not when the phase ended.
    pub detect: Delays,
    /// Bytes each site sent per second in steady state (datagrams, pulls, digests).
    pub bytes_per_site_s: f64,
    /// Of which sealed membership datagrams.
    pub datagram_bytes_per_site_s: f64,
    /// From healing a partition into halves to every site seeing every other again.
    pub heal_ms: Option<u64>,
}

enum Event {
    Datagram {
        to: usize,
        data: Vec<u8>,
    },
    /// A pull `to` asked of `from` reached it: it answers with the batches it holds now,
    /// which may be older than those asked for (a relay still pulling them).
    PullArrived {
        to: usize,
        from: usize,
        versions: Vec<Version>,
    },
    /// A pull `to` started ended: with the sequences served, one per version asked for
    /// (none when it failed).
    Pulled {
        to: usize,
        versions: Vec<Version>,
        served: Vec<u64>,
    },
    Digest {
        to: usize,
        from: usize,
    },
}

struct Queued {
    at: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// Bytes of one digest line (`site provider epoch sequence`).
const DIGEST_LINE_BYTES: u64 = 40;
/// Request and header bytes of one pull or digest fetch.
const FETCH_OVERHEAD_BYTES: u64 = 300;
const DIGEST_INTERVAL_MS: u64 = 1_000;
/// The operator's `PULL_TIMEOUT`: a pull from a member that cannot be reached fails then.
const PULL_TIMEOUT_MS: u64 = 2_000;
/// The operator's `SEED_INTERVAL`: a site whose seed is not a live member contacts it again.
const SEED_INTERVAL_MS: u64 = 5_000;

struct World {
    p: Params,
    nodes: Vec<Membership<SplitMix64>>,
    index: HashMap<String, usize>,
    queue: BinaryHeap<Reverse<Queued>>,
    seq: u64,
    now: u64,
    rng: SplitMix64,
    dead: Vec<bool>,
    /// Partition side of each site while a partition holds.
    side: Option<Vec<bool>>,
    /// The newest version each member holds, per origin site.
    held: Vec<BTreeMap<String, u64>>,
    /// Each member's pulls, under the rule the operator's driver follows.
    pulls: Vec<Pulls>,
    /// Bytes sent by pulls and digests, per site.
    fetch_bytes: Vec<u64>,
    next_digest: Vec<u64>,
    downs: Vec<Vec<(String, u64)>>,
    material: u64,
    next_seed: u64,
    /// (deadline, site) of every membership timer and digest tick; stale entries are
    /// skipped when popped (the site's own deadline moved).
    wakeups: BinaryHeap<Reverse<(u64, usize)>>,
}

fn member(i: usize) -> Member {
    Member {
        site: format!("s{i}"),
        host: "127.0.0.1".into(),
        signals_port: 9443,
        gossip_port: 9443,
        incarnation: 1,
    }
}

impl World {
    fn new(p: Params) -> Self {
        let mut rng = SplitMix64::new(p.seed);
        let nodes = (0..p.sites)
            .map(|i| {
                Membership::new(
                    member(i),
                    &Timing::default(),
                    SplitMix64::new(p.seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9)),
                    MembershipMetrics::default(),
                )
                .expect("a valid identity")
            })
            .collect();
        let next_digest: Vec<u64> = (0..p.sites)
            .map(|_| rng.next_u64() % DIGEST_INTERVAL_MS)
            .collect();
        let wakeups = next_digest
            .iter()
            .enumerate()
            .map(|(i, t)| Reverse((*t, i)))
            .collect();
        Self {
            index: (0..p.sites).map(|i| (format!("s{i}"), i)).collect(),
            nodes,
            queue: BinaryHeap::new(),
            seq: 0,
            now: 0,
            rng,
            dead: vec![false; p.sites],
            side: None,
            held: vec![BTreeMap::new(); p.sites],
            pulls: (0..p.sites).map(|i| Pulls::new(&format!("s{i}"))).collect(),
            fetch_bytes: vec![0; p.sites],
            next_digest,
            downs: vec![Vec::new(); p.sites],
            material: 0,
            next_seed: SEED_INTERVAL_MS,
            wakeups,
            p,
        }
    }

    fn delay(&mut self) -> u64 {
        let (lo, hi) = self.p.delay_ms;
        lo + self.rng.next_u64() % (hi - lo + 1)
    }

    fn linked(&self, a: usize, b: usize) -> bool {
        !self.dead[a] && !self.dead[b] && self.side.as_ref().is_none_or(|s| s[a] == s[b])
    }

    fn push(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.queue.push(Reverse(Queued {
            at,
            seq: self.seq,
            event,
        }));
    }

    /// Agrees a session at once (the mTLS exchange's cost is not what is measured).
    fn connect(&mut self, from: usize, to: usize) {
        if !self.linked(from, to) {
            let site = format!("s{to}");
            self.nodes[from].handle(self.now, Input::SessionFailed { site });
            return;
        }
        self.material += 1;
        let mut m = [0u8; 40];
        m[..8].copy_from_slice(&self.material.to_be_bytes());
        m[8..16].copy_from_slice(&(self.material ^ 0xA5A5).to_be_bytes());
        let now = self.now;
        self.nodes[to].handle(
            now,
            Input::Session {
                member: member(from),
                material: m,
                role: Role::Responder,
            },
        );
        self.nodes[from].handle(
            now,
            Input::Session {
                member: member(to),
                material: m,
                role: Role::Initiator,
            },
        );
    }

    fn drain(&mut self, i: usize) {
        if let Some(t) = self.nodes[i].poll_timeout() {
            self.wakeups.push(Reverse((t, i)));
        }
        while let Some(o) = self.nodes[i].poll() {
            if self.dead[i] {
                continue;
            }
            match o {
                Output::Transmit { to, datagram } => {
                    let Some(&j) = self.index.get(&to.site) else {
                        continue;
                    };
                    let lost = self.rng.next_u64() % 1000 < self.p.loss_per_mille;
                    if self.linked(i, j) && !lost {
                        let at = self.now + self.delay();
                        self.push(
                            at,
                            Event::Datagram {
                                to: j,
                                data: datagram,
                            },
                        );
                    }
                }
                Output::Connect(m) => {
                    if let Some(&j) = self.index.get(&m.site) {
                        self.connect(i, j);
                    }
                }
                Output::Heard { from, version } => {
                    let Some(&j) = self.index.get(&from.site) else {
                        continue;
                    };
                    self.hear(i, j, version);
                }
                Output::Down(m) => {
                    self.pulls[i].forget(&m.site);
                    self.downs[i].push((m.site, self.now));
                }
                Output::Up(_) => {}
            }
        }
        self.start_pulls(i);
    }

    /// Member `i` hears that `j` holds `version`; the rule decides whether it is wanted.
    fn hear(&mut self, i: usize, j: usize, version: Version) {
        let held = self.held[i].get(&version.site).map(|s| (1, *s));
        let _ = self.pulls[i].heard(member(j), version, held);
    }

    /// Member `i` starts every request the rule allows: one round trip and the batches'
    /// bytes sent by the member asked, or, when it cannot be reached, a failure at the
    /// pull's timeout.
    fn start_pulls(&mut self, i: usize) {
        while let Some(pull) = self.pulls[i].poll_pull() {
            let Some(&j) = self.index.get(&pull.from.site) else {
                self.pulls[i].finished(&pull.versions, |_| None);
                continue;
            };
            if self.linked(i, j) {
                self.fetch_bytes[j] += self.p.batch_bytes * pull.versions.len() as u64;
                self.fetch_bytes[i] += FETCH_OVERHEAD_BYTES;
                let at = self.now + self.delay();
                self.push(
                    at,
                    Event::PullArrived {
                        to: i,
                        from: j,
                        versions: pull.versions,
                    },
                );
            } else {
                let at = self.now + PULL_TIMEOUT_MS;
                self.push(
                    at,
                    Event::Pulled {
                        to: i,
                        versions: pull.versions,
                        served: Vec::new(),
                    },
                );
            }
        }
    }

    /// A pull `to` asked of `from` reaches it: `from` answers with what it holds now.
    fn pull_arrived(&mut self, to: usize, from: usize, versions: Vec<Version>) {
        let served = versions
            .iter()
            .map(|v| {
                let held = self.held[from].get(&v.site).copied().unwrap_or(0);
                held.min(v.sequence)
            })
            .collect();
        let at = self.now + self.delay();
        self.push(
            at,
            Event::Pulled {
                to,
                versions,
                served,
            },
        );
    }

    /// A pull `to` started ends with `served` (empty when it failed): the store takes
    /// what came, and the rule decides what is pulled next.
    fn pulled(&mut self, to: usize, versions: &[Version], served: &[u64]) {
        if !self.dead[to] {
            for (version, sequence) in versions.iter().zip(served) {
                let held = self.held[to].entry(version.site.clone()).or_insert(0);
                *held = (*held).max(*sequence);
            }
        }
        let nodes = &self.nodes;
        let live = |site: &str| nodes[to].live_member(site).cloned();
        for (from, next) in self.pulls[to].finished(versions, live) {
            if let Some(&j) = self.index.get(&from.site) {
                self.hear(to, j, next);
            }
        }
        self.start_pulls(to);
    }

    fn step_to(&mut self, end: u64) {
        loop {
            let next_event = self.queue.peek().map(|Reverse(q)| q.at);
            let next_timer = self.wakeups.peek().map(|Reverse((t, _))| *t);
            let Some(t) = [next_event, next_timer, Some(self.next_seed)]
                .into_iter()
                .flatten()
                .min()
            else {
                self.now = end;
                return;
            };
            if t > end {
                self.now = end;
                return;
            }
            self.now = self.now.max(t);
            let now = self.now;
            while self.queue.peek().is_some_and(|Reverse(q)| q.at <= now) {
                let Some(Reverse(q)) = self.queue.pop() else {
                    break;
                };
                match q.event {
                    Event::Datagram { to, mut data } => {
                        if !self.dead[to] {
                            self.nodes[to].handle(now, Input::Datagram(&mut data));
                            self.drain(to);
                        }
                    }
                    Event::PullArrived { to, from, versions } => {
                        self.pull_arrived(to, from, versions);
                    }
                    Event::Pulled {
                        to,
                        versions,
                        served,
                    } => self.pulled(to, &versions, &served),
                    Event::Digest { to, from } => {
                        let theirs: Vec<(String, u64)> = self.held[from]
                            .iter()
                            .map(|(s, q)| (s.clone(), *q))
                            .collect();
                        for (site, sequence) in theirs {
                            let version = Version {
                                site,
                                provider: "p".into(),
                                epoch: 1,
                                sequence,
                            };
                            self.hear(to, from, version);
                        }
                        self.start_pulls(to);
                    }
                }
            }
            if self.next_seed <= now {
                self.next_seed += SEED_INTERVAL_MS;
                for i in 1..self.nodes.len() {
                    if !self.dead[i] && self.nodes[i].live_member("s0").is_none() {
                        self.connect(i, 0);
                        self.drain(i);
                        self.drain(0);
                    }
                }
            }
            while self.wakeups.peek().is_some_and(|Reverse((t, _))| *t <= now) {
                let Some(Reverse((_, i))) = self.wakeups.pop() else {
                    break;
                };
                if !self.dead[i] && self.nodes[i].poll_timeout().is_some_and(|t| t <= now) {
                    self.nodes[i].handle_timeout(now);
                    self.drain(i);
                }
                if self.next_digest[i] <= now {
                    self.next_digest[i] += DIGEST_INTERVAL_MS;
                    self.wakeups.push(Reverse((self.next_digest[i], i)));
                    self.ask_digest(i);
                }
            }
        }
    }

    fn ask_digest(&mut self, i: usize) {
        if self.dead[i] {
            return;
        }
        let live: Vec<usize> = self.nodes[i]
            .live()
            .filter_map(|m| self.index.get(&m.site).copied())
            .collect();
        if live.is_empty() {
            return;
        }
        let j = live[(self.rng.next_u64() % live.len() as u64) as usize];
        if !self.linked(i, j) {
            return;
        }
        self.fetch_bytes[j] += DIGEST_LINE_BYTES * self.held[j].len() as u64;
        self.fetch_bytes[i] += FETCH_OVERHEAD_BYTES;
        let at = self.now + self.delay() + self.delay();
        self.push(at, Event::Digest { to: i, from: j });
    }

    fn converged(&self) -> bool {
        let living = self.dead.iter().filter(|d| !**d).count();
        (0..self.nodes.len())
            .filter(|i| !self.dead[*i])
            .all(|i| self.nodes[i].live_count() == living - 1)
    }

    fn run_until_converged(&mut self, max_ms: u64) -> Option<u64> {
        let start = self.now;
        while self.now - start < max_ms {
            if self.converged() {
                return Some(self.now - start);
            }
            let to = self.now + 50;
            self.step_to(to);
        }
        None
    }

    fn sent_bytes(&self) -> u64 {
        let datagrams: u64 = self
            .nodes
            .iter()
            .map(|n| n.metrics().traffic_count(Direction::Sent).1)
            .sum();
        datagrams + self.fetch_bytes.iter().sum::<u64>()
    }

    fn datagram_bytes(&self) -> u64 {
        self.nodes
            .iter()
            .map(|n| n.metrics().traffic_count(Direction::Sent).1)
            .sum()
    }
}

/// How long something took to reach each member, in ms, and how many it never reached:
/// what the membership and gossip scale runs report for a spread and a detection alike.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delays {
    /// The median of the members reached.
    pub p50_ms: u64,
    /// The 99th percentile (nearest rank) of the members reached.
    pub p99_ms: u64,
    /// Members never reached within the phase.
    pub missed: usize,
}

impl Delays {
    /// From each member's delay, `None` for one never reached.
    pub fn of(delays: impl IntoIterator<Item = Option<u64>>) -> Self {
        let mut missed = 0;
        let mut reached: Vec<u64> = delays
            .into_iter()
            .filter_map(|d| {
                missed += usize::from(d.is_none());
                d
            })
            .collect();
        reached.sort_unstable();
        let at = |p: f64| {
            let rank = ((reached.len().saturating_sub(1)) as f64 * p).round() as usize;
            reached.get(rank).copied().unwrap_or(0)
        };
        Self {
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            missed,
        }
    }

    /// The table cell: `p50 / p99 s (missed)`, seconds with `decimals` places.
    pub fn cell(&self, decimals: usize) -> String {
        format!(
            "{:.decimals$} / {:.decimals$} s ({})",
            self.p50_ms as f64 / 1000.0,
            self.p99_ms as f64 / 1000.0,
            self.missed
        )
    }
}

/// Runs the phases in order: join, steady state, spread, death, partition and heal.
pub fn run(p: Params) -> Report {
    let n = p.sites;
    let announcements = p.announcements;
    let mut w = World::new(p);
    let mut report = Report {
        sites: n,
        ..Report::default()
    };
    for i in 1..n {
        w.connect(i, 0);
        w.drain(i);
        w.drain(0);
    }
    report.join_ms = w.run_until_converged(120_000);

    // Steady state: ten seconds of traffic with one version per site per second (each site
    // publishes once per scrape pass).
    let (bytes0, dg0, t0) = (w.sent_bytes(), w.datagram_bytes(), w.now);
    let mut sequence = 0;
    for _ in 0..10 {
        sequence += 1;
        for i in 0..n {
            let v = Version {
                site: format!("s{i}"),
                provider: "p".into(),
                epoch: 1,
                sequence,
            };
            let now = w.now;
            w.held[i].insert(format!("s{i}"), sequence);
            w.nodes[i].announce(now, &v);
            w.drain(i);
        }
        let to = w.now + 1_000;
        w.step_to(to);
    }
    let secs = (w.now - t0) as f64 / 1000.0;
    report.bytes_per_site_s = (w.sent_bytes() - bytes0) as f64 / n as f64 / secs;
    report.datagram_bytes_per_site_s = (w.datagram_bytes() - dg0) as f64 / n as f64 / secs;

    // Spread: one site at a time announces a new version; every other member's time to
    // hold it.
    let mut reach = Vec::new();
    for k in 0..announcements {
        let origin = (w.rng.next_u64() % n as u64) as usize;
        sequence += 1;
        let site = format!("s{origin}");
        let v = Version {
            site: site.clone(),
            provider: "p".into(),
            epoch: 1,
            sequence,
        };
        let start = w.now;
        w.held[origin].insert(site.clone(), sequence);
        w.nodes[origin].announce(start, &v);
        w.drain(origin);
        let mut arrived = vec![None; n];
        arrived[origin] = Some(0);
        while w.now - start < 30_000 && arrived.iter().any(Option::is_none) {
            let to = w.now + 10;
            w.step_to(to);
            for (i, a) in arrived.iter_mut().enumerate() {
                if a.is_none() && w.held[i].get(&site).is_some_and(|s| *s >= sequence) {
                    *a = Some(w.now - start);
                }
            }
        }
        reach.extend(
            arrived
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != origin)
                .map(|(_, a)| *a),
        );
        let _ = k;
    }
    report.spread = Delays::of(reach);

    // Death: one site stops answering.
    let victim = n - 1;
    let victim_site = format!("s{victim}");
    w.dead[victim] = true;
    let died = w.now;
    let to = w.now + 30_000;
    w.step_to(to);
    report.detect = Delays::of((0..n - 1).map(|i| {
        w.downs[i]
            .iter()
            .find(|(s, at)| *s == victim_site && *at >= died)
            .map(|(_, at)| at - died)
    }));

    // Partition into halves long enough for each side to declare the other down, then heal.
    w.side = Some((0..n).map(|i| i < n / 2).collect());
    let to = w.now + 20_000;
    w.step_to(to);
    w.side = None;
    report.heal_ms = w.run_until_converged(120_000);
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_rank_the_members_reached_and_count_the_rest_as_missed() {
        let d = Delays::of((1..=100).map(Some).chain([None, None]));
        assert_eq!(
            d,
            Delays {
                p50_ms: 51,
                p99_ms: 99,
                missed: 2
            }
        );
        assert_eq!(d.cell(2), "0.05 / 0.10 s (2)");
        assert_eq!(
            Delays::of([None]),
            Delays {
                missed: 1,
                ..Delays::default()
            }
        );
    }

    /// A grid of `sites` under 1% loss and 20-80 ms one way.
    fn lossy(sites: usize, announcements: usize, seed: u64) -> Params {
        Params {
            sites,
            loss_per_mille: 10,
            delay_ms: (20, 80),
            batch_bytes: 800,
            announcements,
            seed,
        }
    }

    #[test]
    fn a_small_grid_joins_spreads_detects_and_heals_under_loss() {
        let r = run(lossy(8, 5, 1));
        assert!(r.join_ms.is_some(), "{r:?}");
        assert_eq!(r.spread.missed, 0, "{r:?}");
        assert_eq!(r.detect.missed, 0, "{r:?}");
        assert!(r.heal_ms.is_some(), "{r:?}");
        assert!(r.bytes_per_site_s > r.datagram_bytes_per_site_s, "{r:?}");
    }

    /// Most members hear a version from a relay, which passes it on before its own pull
    /// has brought the batch; one asked that early answers with its older batch. Waiting
    /// for the next digest round put this tail at 1.3 to 2.1 s; a pull from the version's
    /// own site once the relay's answer came back behind keeps it under a second.
    #[test]
    fn a_version_heard_from_relays_still_pulling_it_reaches_every_member_within_a_second() {
        for seed in 1..=3 {
            let r = run(lossy(10, 40, seed));
            assert_eq!(r.spread.missed, 0, "{r:?}");
            assert!(r.spread.p99_ms < 1_000, "seed {seed}: {:?}", r.spread);
        }
    }
}
