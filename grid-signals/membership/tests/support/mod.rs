//! A deterministic network of memberships in virtual time: sessions are agreed the
//! moment one is asked for (as the signals listener's exchange would, with material both
//! ends share), datagrams arrive after a fixed delay unless the link is cut or a loss
//! draw drops them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use grid_membership::{
    Input, Member, Membership, MembershipMetrics, Output, Rng, Role, SplitMix64, Timing,
};

pub(crate) struct Net {
    pub(crate) nodes: BTreeMap<String, Membership<SplitMix64>>,
    pub(crate) now: u64,
    pub(crate) delay_ms: u64,
    /// Per mille of datagrams lost.
    pub(crate) loss: u64,
    loss_rng: SplitMix64,
    pub(crate) cut: BTreeSet<(String, String)>,
    pub(crate) dead: BTreeSet<String>,
    in_flight: Vec<(u64, String, Vec<u8>)>,
    pub(crate) ups: HashMap<String, Vec<Member>>,
    pub(crate) downs: HashMap<String, Vec<Member>>,
    /// Versions each node heard, with whom from.
    pub(crate) heard: HashMap<String, Vec<(Member, grid_membership::Version)>>,
    sessions_made: u64,
    /// Every datagram sent, lost or not, and every session asked for so one can be:
    /// (when, from, to).
    pub(crate) sent: Vec<(u64, String, String)>,
}

pub(crate) fn member(site: &str, incarnation: u64) -> Member {
    Member {
        site: site.into(),
        host: "127.0.0.1".into(),
        signals_port: 9443,
        gossip_port: 7946,
        incarnation,
    }
}

impl Net {
    pub(crate) fn new(sites: &[&str], timing: &Timing) -> Self {
        let mut net = Self {
            nodes: BTreeMap::new(),
            now: 0,
            delay_ms: 5,
            loss: 0,
            loss_rng: SplitMix64::new(99),
            cut: BTreeSet::new(),
            dead: BTreeSet::new(),
            in_flight: Vec::new(),
            ups: HashMap::new(),
            downs: HashMap::new(),
            heard: HashMap::new(),
            sessions_made: 0,
            sent: Vec::new(),
        };
        for (i, s) in sites.iter().enumerate() {
            net.add(s, 1, timing, i as u64);
        }
        net
    }

    pub(crate) fn add(&mut self, site: &str, incarnation: u64, timing: &Timing, seed: u64) {
        let m = Membership::new(
            member(site, incarnation),
            timing,
            SplitMix64::new(seed + 1000 * incarnation),
            MembershipMetrics::default(),
        )
        .unwrap();
        self.nodes.insert(site.into(), m);
        self.dead.remove(site);
    }

    fn material(&mut self) -> [u8; 40] {
        self.sessions_made += 1;
        let mut m = [0u8; 40];
        for (i, chunk) in m.chunks_mut(8).enumerate() {
            let w = self
                .sessions_made
                .wrapping_mul(0x9E37_79B9)
                .wrapping_add(i as u64 * 7919);
            chunk.copy_from_slice(&w.to_be_bytes());
        }
        m
    }

    /// `from` agrees a session with `to` (the driver's seed step, or its answer to
    /// `Output::Connect`).
    pub(crate) fn connect(&mut self, from: &str, to: &str) {
        if self.dead.contains(to) || self.is_cut(from, to) {
            let now = self.now;
            if let Some(n) = self.nodes.get_mut(from) {
                n.handle(now, Input::SessionFailed { site: to.into() });
            }
            return;
        }
        let material = self.material();
        let now = self.now;
        let to_id = self.nodes[to].identity().clone();
        let from_id = self.nodes[from].identity().clone();
        self.nodes.get_mut(to).unwrap().handle(
            now,
            Input::Session {
                member: from_id,
                material,
                role: Role::Responder,
            },
        );
        self.nodes.get_mut(from).unwrap().handle(
            now,
            Input::Session {
                member: to_id,
                material,
                role: Role::Initiator,
            },
        );
    }

    fn is_cut(&self, a: &str, b: &str) -> bool {
        self.cut.contains(&(a.to_owned(), b.to_owned()))
            || self.cut.contains(&(b.to_owned(), a.to_owned()))
    }

    /// Cuts every link between the two groups.
    pub(crate) fn partition(&mut self, left: &[&str], right: &[&str]) {
        for a in left {
            for b in right {
                self.cut.insert(((*a).to_owned(), (*b).to_owned()));
            }
        }
    }

    pub(crate) fn heal(&mut self) {
        self.cut.clear();
    }

    /// `site` announces a version of its own batch.
    pub(crate) fn announce(&mut self, site: &str, version: &grid_membership::Version) -> bool {
        let now = self.now;
        let added = self.nodes.get_mut(site).unwrap().announce(now, version);
        self.pump();
        added
    }

    /// [`Net::announce`] through [`Membership::announce_now`].
    pub(crate) fn announce_now(&mut self, site: &str, version: &grid_membership::Version) -> bool {
        let now = self.now;
        let added = self.nodes.get_mut(site).unwrap().announce_now(now, version);
        self.pump();
        added
    }

    /// Delivers an arbitrary datagram to `to` now.
    pub(crate) fn inject(&mut self, to: &str, mut datagram: Vec<u8>) {
        let now = self.now;
        self.nodes
            .get_mut(to)
            .unwrap()
            .handle(now, Input::Datagram(&mut datagram));
        self.pump();
    }

    /// Drains every node's outputs into the network (one hop).
    fn pump(&mut self) {
        loop {
            let mut work = Vec::new();
            for (site, node) in &mut self.nodes {
                if self.dead.contains(site) {
                    while node.poll().is_some() {}
                    continue;
                }
                while let Some(o) = node.poll() {
                    work.push((site.clone(), o));
                }
            }
            if work.is_empty() {
                return;
            }
            for (site, o) in work {
                match o {
                    Output::Transmit { to, datagram } => {
                        self.sent.push((self.now, site.clone(), to.site.clone()));
                        if self.is_cut(&site, &to.site) || self.loss_draw() {
                            continue;
                        }
                        self.in_flight
                            .push((self.now + self.delay_ms, to.site, datagram));
                    }
                    Output::Connect(m) => {
                        self.sent.push((self.now, site.clone(), m.site.clone()));
                        if self.nodes.contains_key(&m.site) {
                            self.connect(&site, &m.site);
                        }
                    }
                    Output::Up(m) => self.ups.entry(site).or_default().push(m),
                    Output::Down(m) => self.downs.entry(site).or_default().push(m),
                    Output::Heard { from, version } => {
                        self.heard.entry(site).or_default().push((from, version));
                    }
                }
            }
        }
    }

    fn loss_draw(&mut self) -> bool {
        self.loss > 0 && self.loss_rng.next_u64() % 1000 < self.loss
    }

    /// Runs virtual time forward by `ms`, one millisecond step at a time.
    pub(crate) fn run(&mut self, ms: u64) {
        let end = self.now + ms;
        while self.now < end {
            self.now += 1;
            let now = self.now;
            let (due, rest): (Vec<_>, Vec<_>) =
                self.in_flight.drain(..).partition(|(at, _, _)| *at <= now);
            self.in_flight = rest;
            for (_, to, mut d) in due {
                if self.dead.contains(&to) {
                    continue;
                }
                if let Some(n) = self.nodes.get_mut(&to) {
                    n.handle(now, Input::Datagram(&mut d));
                }
            }
            for (site, n) in &mut self.nodes {
                if !self.dead.contains(site) && n.poll_timeout().is_some_and(|t| t <= now) {
                    n.handle_timeout(now);
                }
            }
            self.pump();
        }
    }

    /// The live members `site` knows, by name.
    pub(crate) fn view(&self, site: &str) -> BTreeSet<String> {
        self.nodes[site].live().map(|m| m.site.clone()).collect()
    }

    /// Whether every living node sees exactly every other living node.
    pub(crate) fn converged(&self) -> bool {
        let living: BTreeSet<String> = self
            .nodes
            .keys()
            .filter(|s| !self.dead.contains(*s))
            .cloned()
            .collect();
        living.iter().all(|s| {
            let mut expect = living.clone();
            expect.remove(s);
            self.view(s) == expect
        })
    }

    /// Runs until converged, at most `max_ms`; the time it took.
    pub(crate) fn run_until_converged(&mut self, max_ms: u64) -> Option<u64> {
        let start = self.now;
        while self.now - start < max_ms {
            if self.converged() {
                return Some(self.now - start);
            }
            self.run(10);
        }
        self.converged().then(|| self.now - start)
    }
}
