//! The membership driver: owns the UDP socket (bound on the signals listener's own
//! address and port number), the protocol's timers and the session exchanges, feeds
//! grid-membership's [`Membership`] and publishes who is live for the peer pollers.
//!
//! A session is agreed by a `POST /v1/site/membership/session` over the mutual-TLS
//! signals listener: the body carries the initiator's identity, the answer the
//! responder's, and both ends export the same key material from that connection
//! ([`SessionMaterial`]). The listener already decided who the caller is, so a member
//! whose identity names another site than its certificate is refused there.
//!
//! Every wait is bounded: an exchange (connect, TLS, request, answer) by
//! [`SESSION_EXCHANGE_TIMEOUT`], a host lookup by [`RESOLVE_TIMEOUT`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use grid_membership::seal::SESSION_MATERIAL_BYTES;
use grid_membership::{
    Input, MAX_DATAGRAM_BYTES, Member, Membership, MembershipMetrics, Output, Role, Timing,
};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use rand::{RngCore, SeedableRng, rngs::SmallRng};
use rustls_pki_types::ServerName;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};

use crate::clock;
use crate::listener::SessionMaterial;
use grid_daemon::tls::{self, CertSlot, Identity, Trust};

pub use grid_signals::wire::SESSION_PATH;

/// Largest identity body either end of an exchange reads.
pub const MAX_SESSION_BODY_BYTES: usize = 1024;
/// The whole of one exchange, connect to answer, on the initiator; the body read on the
/// responder.
pub const SESSION_EXCHANGE_TIMEOUT: Duration = Duration::from_secs(3);
/// One lookup of a member's host name.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a lookup's answer (an address, or none) is used before the name is looked up
/// again.
pub const RESOLVED_FOR: Duration = Duration::from_secs(30);
/// Sessions peers agreed that wait for the driver; more are answered 503.
pub const ACCEPTED_QUEUE: usize = 64;
/// How often a configured peer that is not a live member is contacted as a seed.
pub const SEED_INTERVAL: Duration = Duration::from_secs(5);
/// The receive buffer: one byte over the largest datagram, so an oversized one is seen
/// as such instead of truncated.
const RECV_BUFFER_BYTES: usize = MAX_DATAGRAM_BYTES + 1;

/// Faults the membership socket suffers, for the test kit and the scale harness (`tc
/// netem` is not available in this kernel): datagrams lost at random, and sockets cut
/// off. Shared by every operator of one harness; the daemon never sets it.
#[derive(Debug, Default)]
pub struct LinkFaults {
    /// Datagrams dropped, per mille, each way.
    pub loss_per_mille: std::sync::atomic::AtomicU64,
    /// Membership ports whose datagrams are dropped, to and from (a partition).
    pub cut: std::sync::Mutex<BTreeSet<u16>>,
}

impl LinkFaults {
    /// Whether a datagram between `a` and `b` is dropped.
    fn drops(&self, a: u16, b: u16, rng: &mut SmallRng) -> bool {
        let cut = self
            .cut
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if cut.contains(&a) || cut.contains(&b) {
            return true;
        }
        drop(cut);
        let loss = self
            .loss_per_mille
            .load(std::sync::atomic::Ordering::Relaxed);
        loss > 0 && rng.next_u64() % 1000 < loss
    }

    /// Cuts `port` off, or heals it.
    pub fn set_cut(&self, port: u16, cut: bool) {
        let mut set = self
            .cut
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if cut {
            set.insert(port);
        } else {
            set.remove(&port);
        }
    }
}

/// Who membership says is there, for the peer pollers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// Live members (suspects included) by site.
    pub live: BTreeMap<String, Member>,
    /// Sites declared down and not back since.
    pub down: BTreeSet<String>,
}

/// A session body: the sender's identity and the signal transport mode it runs. The
/// mode is a field beside the identity's, so an older operator reads the body as the
/// identity alone and sends none (then nothing is known of its mode and nothing is
/// refused for it).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Hello {
    #[serde(flatten)]
    member: Member,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mode: Option<String>,
}

/// Which members run another signal transport mode than this site: one grid runs one
/// mode, and a member of another is refused at its session exchange, logged once, and
/// counted in `grid_operator_membership_mode_mismatch` (members in that state now).
#[derive(Clone, Debug)]
pub struct ModeMismatch {
    own: &'static str,
    peers: Arc<std::sync::Mutex<BTreeSet<String>>>,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl ModeMismatch {
    /// Registers the gauge, at 0, for a site running `own`.
    pub fn register(
        registry: &mut prometheus_client::registry::Registry,
        own: crate::config::TransportMode,
    ) -> Self {
        let m = Self {
            own: own.as_str(),
            peers: Arc::default(),
            gauge: prometheus_client::metrics::gauge::Gauge::default(),
        };
        registry.register(
            "grid_operator_membership_mode_mismatch",
            "Members whose session exchange declared another signal transport mode than this site's (refused)",
            m.gauge.clone(),
        );
        m
    }

    /// The mode this site runs.
    pub fn own(&self) -> &'static str {
        self.own
    }

    /// The members in mismatch now, by site.
    pub fn peers(&self) -> Vec<String> {
        self.lock().iter().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes what `site` declared (`None`: an older operator that says nothing) and
    /// whether its session may be agreed. The first mismatch of a site is logged, and so
    /// is its end.
    fn agrees(&self, site: &str, theirs: Option<&str>) -> bool {
        let mut peers = self.lock();
        let agrees = theirs.is_none_or(|m| m == self.own);
        if agrees {
            if peers.remove(site) {
                tracing::info!(peer = %site, mode = self.own, "member now runs this site's signal transport mode");
            }
        } else if peers.insert(site.to_owned()) {
            tracing::warn!(
                peer = %site,
                ours = self.own,
                theirs = theirs.unwrap_or_default(),
                "member runs another signal transport mode: its session is refused (one grid runs one mode)"
            );
        }
        self.gauge.set(peers.len() as i64);
        agrees
    }

    fn hello(&self, member: &Member) -> Option<Bytes> {
        serde_json::to_vec(&Hello {
            member: member.clone(),
            mode: Some(self.own.to_owned()),
        })
        .ok()
        .map(Bytes::from)
    }
}

/// The listener's half of the exchange.
#[derive(Clone, Debug)]
pub struct Endpoint {
    own: Member,
    accepted: mpsc::Sender<(Member, [u8; SESSION_MATERIAL_BYTES])>,
    modes: ModeMismatch,
}

/// Why the listener refused an exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionRefusal {
    /// The body is not one identity within [`MAX_SESSION_BODY_BYTES`].
    Body,
    /// The caller is not a peer, or its identity names another site than its
    /// certificate.
    Identity,
    /// The driver's queue is full.
    Busy,
    /// The caller runs another signal transport mode: the body of the refusal
    /// ([`Endpoint::hello`]) says which this site runs.
    Mode,
}

impl Endpoint {
    /// Answers a peer's exchange: `peer` is the site its certificate proved, `material`
    /// what its connection exported, `body` the identity it sent.
    pub fn accept(
        &self,
        peer: Option<&str>,
        material: Option<SessionMaterial>,
        body: &[u8],
    ) -> Result<Bytes, SessionRefusal> {
        let (Some(peer), Some(material)) = (peer, material) else {
            return Err(SessionRefusal::Identity);
        };
        let hello: Hello = serde_json::from_slice(body).map_err(|_| SessionRefusal::Body)?;
        let member = hello.member;
        if member.check().is_err() {
            return Err(SessionRefusal::Body);
        }
        if member.site != peer {
            return Err(SessionRefusal::Identity);
        }
        if !self.modes.agrees(&member.site, hello.mode.as_deref()) {
            return Err(SessionRefusal::Mode);
        }
        self.accepted
            .try_send((member, material.0))
            .map_err(|_| SessionRefusal::Busy)?;
        self.hello().ok_or(SessionRefusal::Body)
    }

    /// This site's session body: its identity and its mode.
    pub fn hello(&self) -> Option<Bytes> {
        self.modes.hello(&self.own)
    }
}

/// The caller's generator, handed to the pure crate.
struct Seeded(SmallRng);

impl grid_membership::Rng for Seeded {
    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
}

/// Everything the driver needs; `start` binds and splits it.
pub struct Driver {
    membership: Membership<Seeded>,
    udp: UdpSocket,
    accepted: mpsc::Receiver<(Member, [u8; SESSION_MATERIAL_BYTES])>,
    results: (mpsc::Sender<Exchanged>, mpsc::Receiver<Exchanged>),
    view: watch::Sender<View>,
    certificate: Arc<CertSlot>,
    trust: Arc<Trust>,
    /// Configured peers with a URL: (site, host, signals port); the latest declared,
    /// read at every seed contact.
    seeds: watch::Receiver<Vec<crate::live::Seed>>,
    /// Host lookups, found or not, each kept for [`RESOLVED_FOR`]: a name that does not
    /// resolve costs one bounded lookup per period, not one per datagram.
    resolved: HashMap<(String, u16), (Option<SocketAddr>, u64)>,
    /// Gossip mode's signal path; `None` under poll.
    gossip: Option<crate::gossip::Gossip>,
    rng: SmallRng,
    faults: Option<Arc<LinkFaults>>,
    port: u16,
    modes: ModeMismatch,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("membership", &self.membership)
            .finish_non_exhaustive()
    }
}

enum Exchanged {
    Up(Member, [u8; SESSION_MATERIAL_BYTES]),
    Failed(String),
}

/// What `start` hands back.
pub struct Started {
    /// The driver task's body.
    pub driver: Driver,
    /// The listener's half.
    pub endpoint: Endpoint,
    /// Who is live.
    pub view: watch::Receiver<View>,
}

/// Creates the membership of `own` on `udp`, with `seeds` to contact, and, in gossip
/// mode, the signal path that rides it.
pub(crate) fn start(
    own: Member,
    udp: UdpSocket,
    seeds: watch::Receiver<Vec<crate::live::Seed>>,
    (certificate, trust): (Arc<CertSlot>, Arc<Trust>),
    metrics: MembershipMetrics,
    gossip: Option<crate::gossip::Gossip>,
    (faults, modes): (Option<Arc<LinkFaults>>, ModeMismatch),
) -> Result<Started, grid_membership::Error> {
    let port = own.gossip_port;
    let membership = Membership::new(
        own.clone(),
        &Timing::default(),
        Seeded(SmallRng::from_os_rng()),
        metrics,
    )?;
    let (tx, accepted) = mpsc::channel(ACCEPTED_QUEUE);
    let (view_tx, view) = watch::channel(View::default());
    Ok(Started {
        driver: Driver {
            membership,
            udp,
            accepted,
            results: mpsc::channel(ACCEPTED_QUEUE),
            view: view_tx,
            certificate,
            trust,
            seeds,
            resolved: HashMap::new(),
            gossip,
            rng: SmallRng::from_os_rng(),
            faults,
            port,
            modes: modes.clone(),
        },
        endpoint: Endpoint {
            own,
            accepted: tx,
            modes,
        },
        view,
    })
}

impl Driver {
    /// Runs until the task is aborted.
    pub async fn run(mut self) {
        let mut buf = vec![0u8; RECV_BUFFER_BYTES];
        let mut seed_tick = tokio::time::interval(SEED_INTERVAL);
        seed_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut announce_tick = tokio::time::interval(crate::gossip::ANNOUNCE_CHECK);
        announce_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut digest_tick = tokio::time::interval(crate::gossip::DIGEST_INTERVAL);
        digest_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Gossip: a change of this site's own readiness is announced at once, not at the
        // next announce check.
        let mut own_readiness = self.gossip.as_ref().map(|g| {
            let rx = g.signals.readiness();
            let seen = rx.borrow().peer;
            (rx, seen)
        });
        loop {
            let wake = self.membership.poll_timeout().map(|at| {
                let now = clock::monotonic_ms();
                tokio::time::Instant::now() + Duration::from_millis(at.saturating_sub(now))
            });
            let timer = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            // Sessions before datagrams: the other end of an exchange may seal its first
            // datagram as soon as it holds the session, and that datagram can be on the
            // socket before this loop has taken the same session from its queue (the
            // listener queues it before answering; an initiator's result comes through
            // a task). Taken in any order, it would be refused as `unknown_session` and
            // a join would wait for the next seed contact.
            tokio::select! {
                biased;
                Some((member, material)) = self.accepted.recv() => {
                    self.membership.handle(
                        clock::monotonic_ms(),
                        Input::Session { member, material, role: Role::Responder },
                    );
                }
                Some(result) = self.results.1.recv() => {
                    let now = clock::monotonic_ms();
                    match result {
                        Exchanged::Up(member, material) => self.membership.handle(
                            now,
                            Input::Session { member, material, role: Role::Initiator },
                        ),
                        Exchanged::Failed(site) => {
                            self.membership.handle(now, Input::SessionFailed { site });
                        }
                    }
                }
                received = self.udp.recv_from(&mut buf) => {
                    if let Ok((n, from)) = received {
                        let dropped = self
                            .faults
                            .as_ref()
                            .is_some_and(|f| f.drops(from.port(), self.port, &mut self.rng));
                        if !dropped {
                            self.membership.handle(clock::monotonic_ms(), Input::Datagram(&mut buf[..n]));
                        }
                    }
                }
                () = timer => self.membership.handle_timeout(clock::monotonic_ms()),
                _ = seed_tick.tick() => self.contact_seeds(),
                _ = announce_tick.tick(), if self.gossip.is_some() => self.announce_own(false),
                () = own_readiness_moved(&mut own_readiness) => self.announce_own(true),
                _ = digest_tick.tick(), if self.gossip.is_some() => self.ask_digest(),
                Some(done) = next_fetched(&mut self.gossip) => {
                    if let Some(g) = &mut self.gossip {
                        let live = &self.membership;
                        g.finished(done, |site| live.live_member(site).cloned());
                    }
                }
            }
            self.carry_out().await;
        }
    }

    /// Announces every own batch newer than the last announced. A readiness change
    /// (`urgent`) pushes them to the members at once ([`Membership::announce_now`]), so a
    /// site leaving or rejoining selection reaches the others within its scrape and a
    /// hop; the periodic tick leaves them to the gossip rounds.
    fn announce_own(&mut self, urgent: bool) {
        let Some(g) = &mut self.gossip else {
            return;
        };
        let now = clock::monotonic_ms();
        for version in g.own_news() {
            if urgent {
                self.membership.announce_now(now, &version);
            } else {
                self.membership.announce(now, &version);
            }
        }
    }

    /// One random live member's digest, compared with what is held.
    fn ask_digest(&mut self) {
        let Some(g) = &self.gossip else {
            return;
        };
        let live: Vec<&Member> = self.membership.live().collect();
        if live.is_empty() {
            return;
        }
        let pick = usize::try_from(self.rng.next_u64() % live.len() as u64).unwrap_or(0);
        g.spawn_digest(live[pick].clone());
    }

    /// Seeds not live yet are contacted; a live one is reached through SWIM.
    fn contact_seeds(&self) {
        let live: BTreeSet<&str> = self.membership.live().map(|m| m.site.as_str()).collect();
        for (site, host, port) in self.seeds.borrow().iter() {
            if !live.contains(site.as_str()) {
                self.exchange(site.clone(), host.clone(), *port);
            }
        }
    }

    fn exchange(&self, site: String, host: String, port: u16) {
        let own = self.membership.identity().clone();
        let tls = tls::client_config_presenting(
            Arc::clone(&self.certificate),
            self.trust.clone(),
            Identity::Peer(site.clone()),
        );
        let results = self.results.0.clone();
        let modes = self.modes.clone();
        tokio::spawn(async move {
            let outcome = match tls {
                Ok(tls) => agree(tls, &host, port, &own, &site, &modes).await,
                Err(_) => None,
            };
            let message = if let Some((member, material)) = outcome {
                Exchanged::Up(member, material)
            } else {
                tracing::debug!(%site, %host, port, "membership session not agreed");
                Exchanged::Failed(site)
            };
            let _ = results.send(message).await;
        });
    }

    async fn carry_out(&mut self) {
        let mut changed = false;
        while let Some(output) = self.membership.poll() {
            match output {
                Output::Transmit { to, datagram } => {
                    let dropped = self
                        .faults
                        .as_ref()
                        .is_some_and(|f| f.drops(self.port, to.gossip_port, &mut self.rng));
                    if dropped {
                        continue;
                    }
                    if let Some(addr) = self.resolve(&to.host, to.gossip_port).await {
                        let _ = self.udp.send_to(&datagram, addr).await;
                    }
                }
                Output::Connect(m) => self.exchange(m.site.clone(), m.host.clone(), m.signals_port),
                Output::Up(_) => changed = true,
                Output::Down(m) => {
                    changed = true;
                    if let Some(g) = &mut self.gossip {
                        g.member_down(&m);
                    }
                }
                Output::Heard { from, version } => {
                    if let Some(g) = &mut self.gossip {
                        g.heard(from, version);
                    }
                }
            }
        }
        if let Some(g) = &mut self.gossip {
            g.start_pulls();
        }
        if changed {
            let live: BTreeMap<String, Member> = self
                .membership
                .live()
                .map(|m| (m.site.clone(), m.clone()))
                .collect();
            self.view.send_modify(|v| {
                for site in v.live.keys() {
                    if !live.contains_key(site) {
                        v.down.insert(site.clone());
                    }
                }
                for site in live.keys() {
                    v.down.remove(site);
                }
                v.live = live;
            });
        }
    }

    async fn resolve(&mut self, host: &str, port: u16) -> Option<SocketAddr> {
        if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse() {
            return Some(SocketAddr::new(ip, port));
        }
        let key = (host.to_owned(), port);
        let now = clock::monotonic_ms();
        if let Some((found, until)) = self.resolved.get(&key)
            && *until > now
        {
            return *found;
        }
        let found = bounded_lookup(tokio::net::lookup_host((host, port))).await;
        // Bounded like the session table: members are at most a few thousand.
        if self.resolved.len() >= grid_membership::seal::MAX_SESSIONS {
            self.resolved.retain(|_, (_, until)| *until > now);
            if self.resolved.len() >= grid_membership::seal::MAX_SESSIONS {
                self.resolved.clear();
            }
        }
        let until = now + u64::try_from(RESOLVED_FOR.as_millis()).unwrap_or(u64::MAX);
        self.resolved.insert(key, (found, until));
        found
    }
}

/// The first address `lookup` gives within [`RESOLVE_TIMEOUT`]; `None` when it fails,
/// gives none, or does not answer in time (a resolver that never answers costs one bound,
/// not the driver).
async fn bounded_lookup<A: Iterator<Item = SocketAddr>>(
    lookup: impl Future<Output = std::io::Result<A>>,
) -> Option<SocketAddr> {
    tokio::time::timeout(RESOLVE_TIMEOUT, lookup)
        .await
        .ok()
        .and_then(Result::ok)
        .and_then(|mut addrs| addrs.next())
}

/// Resolves once the readiness generation of this site's own providers (what a peer is
/// served, [`crate::site_machine::Generations::peer`]) differs from the one it last resolved
/// at; never without gossip.
async fn own_readiness_moved(
    readiness: &mut Option<(watch::Receiver<crate::site_machine::Generations>, u64)>,
) {
    let Some((rx, seen)) = readiness else {
        return std::future::pending().await;
    };
    let moved = rx.wait_for(|g| g.peer != *seen).await.map(|g| g.peer);
    match moved {
        Ok(generation) => *seen = generation,
        // The site is gone (the operator is stopping): nothing more to announce.
        Err(_) => std::future::pending().await,
    }
}

/// The next finished gossip fetch; never, under poll.
async fn next_fetched(
    gossip: &mut Option<crate::gossip::Gossip>,
) -> Option<crate::gossip::Fetched> {
    match gossip {
        Some(g) => g.next_done().await,
        None => std::future::pending().await,
    }
}

/// One exchange with `site` at `host:port`, bounded by [`SESSION_EXCHANGE_TIMEOUT`] from
/// connect to answer; `None` when it did not finish in time, failed, or the answer names
/// another site.
async fn agree(
    tls: Arc<rustls::ClientConfig>,
    host: &str,
    port: u16,
    own: &Member,
    site: &str,
    modes: &ModeMismatch,
) -> Option<(Member, [u8; SESSION_MATERIAL_BYTES])> {
    let (hello, material) = tokio::time::timeout(
        SESSION_EXCHANGE_TIMEOUT,
        initiate(tls, host, port, own, modes),
    )
    .await
    .ok()
    .flatten()
    .filter(|(h, _)| h.member.site == site)?;
    // Refused (409) or agreed, the answer says the responder's mode.
    let agreed = modes.agrees(site, hello.mode.as_deref());
    Some((hello.member, material?)).filter(|_| agreed)
}

/// The initiator's exchange: mutual TLS to the member's signals listener, the POST, the
/// answer, and the material exported from that connection.
async fn initiate(
    tls: Arc<rustls::ClientConfig>,
    host: &str,
    port: u16,
    own: &Member,
    modes: &ModeMismatch,
) -> Option<(Hello, Option<[u8; SESSION_MATERIAL_BYTES]>)> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let tcp = tokio::net::TcpStream::connect((bare, port)).await.ok()?;
    let name = ServerName::try_from(bare.to_owned())
        .unwrap_or_else(|_| ServerName::try_from("peer.invalid").expect("a valid DNS name"));
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .ok()?;
    let material = SessionMaterial::export(stream.get_ref().1)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    let conn = tokio::spawn(conn);
    let body = modes.hello(own)?;
    let request = http::Request::post(SESSION_PATH)
        .header(http::header::HOST, format!("{host}:{port}"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .ok()?;
    let response = sender.send_request(request).await.ok()?;
    let status = response.status();
    let answered = if status == http::StatusCode::OK || status == http::StatusCode::CONFLICT {
        Limited::new(response.into_body(), MAX_SESSION_BODY_BYTES)
            .collect()
            .await
            .ok()
            .map(http_body_util::Collected::to_bytes)
    } else {
        None
    };
    conn.abort();
    let hello: Hello = serde_json::from_slice(&answered?).ok()?;
    hello.member.check().ok()?;
    // A refusal for the mode agrees no session, but says the responder's mode.
    let material = (status == http::StatusCode::OK).then_some(material.0);
    Some((hello, material))
}

#[cfg(test)]
mod tests {
    use super::*;
    use grid_kit::operator_harness::{DOMAIN, Grid};

    #[test]
    fn a_member_of_another_mode_is_refused_and_counted_until_it_declares_this_one() {
        let mut registry = prometheus_client::registry::Registry::default();
        let modes = ModeMismatch::register(&mut registry, crate::config::TransportMode::Poll);
        assert!(!modes.agrees("b", Some("gossip")));
        assert!(!modes.agrees("b", Some("gossip")), "refused every time");
        assert!(!modes.agrees("c", Some("gossip")));
        assert_eq!(modes.gauge.get(), 2);
        // An older operator that declares nothing is not refused for it.
        assert!(modes.agrees("d", None));
        assert!(modes.agrees("b", Some("poll")));
        assert_eq!(
            (modes.peers(), modes.gauge.get()),
            (vec!["c".to_owned()], 1)
        );
    }

    /// A client presenting site `a`'s certificate that accepts only site `peer`.
    fn client_for(peer: &str) -> Arc<rustls::ClientConfig> {
        let grid = Grid::new();
        grid.client(&grid.ca.site(DOMAIN, "a"), "a", peer)
    }

    #[tokio::test(start_paused = true)]
    async fn a_lookup_that_never_answers_gives_up_at_resolve_timeout_and_one_just_inside_is_used() {
        let started = tokio::time::Instant::now();
        let never = std::future::pending::<std::io::Result<std::vec::IntoIter<SocketAddr>>>();
        assert_eq!(bounded_lookup(never).await, None);
        assert_eq!(started.elapsed(), RESOLVE_TIMEOUT);
        let addr: SocketAddr = "127.0.0.1:7".parse().unwrap();
        let just_inside = async move {
            tokio::time::sleep(
                RESOLVE_TIMEOUT
                    .checked_sub(Duration::from_millis(1))
                    .unwrap(),
            )
            .await;
            Ok(vec![addr].into_iter())
        };
        assert_eq!(bounded_lookup(just_inside).await, Some(addr));
        let just_late = async move {
            tokio::time::sleep(RESOLVE_TIMEOUT + Duration::from_millis(1)).await;
            Ok(vec![addr].into_iter())
        };
        assert_eq!(bounded_lookup(just_late).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_exchange_with_a_peer_that_accepts_and_never_answers_gives_up_at_its_bound() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // Accepts, then holds the connection without a byte of TLS.
        let _held = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(3_600)).await;
            drop(tcp);
        });
        let own = Member {
            site: "a".into(),
            host: "127.0.0.1".into(),
            signals_port: 1,
            gossip_port: 1,
            incarnation: 1,
        };
        let modes = ModeMismatch::register(
            &mut prometheus_client::registry::Registry::default(),
            crate::config::TransportMode::Gossip,
        );
        let started = tokio::time::Instant::now();
        let agreed = tokio::time::timeout(
            SESSION_EXCHANGE_TIMEOUT * 3,
            agree(client_for("b"), "127.0.0.1", port, &own, "b", &modes),
        )
        .await
        .expect("the exchange ended on its own bound");
        assert!(agreed.is_none());
        let took = started.elapsed();
        assert!(
            took >= SESSION_EXCHANGE_TIMEOUT
                && took < SESSION_EXCHANGE_TIMEOUT + Duration::from_secs(1),
            "{took:?}"
        );
    }
}
