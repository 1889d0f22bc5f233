//! A fault-injecting TCP relay: what puts a WAN between the local grid's sites, since this
//! kernel has no `tc netem` and no toxiproxy is packaged. It listens on 127.0.0.1, forwards
//! each accepted connection to one target address, and applies the faults its
//! [`FaultControl`] sets while it runs:
//!
//! | fault | what a connection sees |
//! | --- | --- |
//! | [`Delay`] per direction | every chunk held `fixed + uniform(0, jitter)` after it was read, order kept |
//! | stall | nothing delivered (both directions) for a duration or until cleared; bytes are kept, not lost |
//! | reset | every open connection and every new one closed with RST |
//! | black-hole | bytes read and dropped, nothing forwarded, nothing answered; connections that lost bytes are reset when it clears (their streams are broken) |
//! | refuse | new connections closed with RST at once; open ones untouched |
//!
//! The relay is TCP-level, so TLS passes through it untouched; a client naming the relay's
//! `127.0.0.1` address still verifies a certificate with that IP SAN.
//!
//! Bounded: at most [`MAX_CONNECTIONS`] open at once (the rest are reset at accept and
//! counted), every chunk at most [`CHUNK_BYTES`], at most [`CHUNK_QUEUE`] chunks in flight
//! per direction, delays and stalls clamped to [`MAX_DELAY`] and [`MAX_STALL`]. Every task
//! ends when the [`FaultRelay`] is dropped. Jitter comes from a seeded `SplitMix64`, so a run
//! is reproducible.
#![allow(clippy::missing_panics_doc)] // a test fixture: every failure is the test's

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::Error;
use crate::clock::Stopwatch;

/// The most connections relayed at once; more are reset at accept (and counted as
/// refused). Above the suite's 300-connection floods, below any descriptor limit.
pub const MAX_CONNECTIONS: usize = 1_024;
/// The most bytes read (and so delayed) as one chunk.
pub const CHUNK_BYTES: usize = 16 * 1024;
/// The most chunks waiting for their delay per direction of one connection: beyond it the
/// reader waits, so a stalled link applies TCP back-pressure instead of buffering without
/// bound.
pub const CHUNK_QUEUE: usize = 64;
/// The longest delay (fixed plus jitter) a chunk can be given.
pub const MAX_DELAY: Duration = Duration::from_secs(30);
/// The longest timed stall; [`FaultControl::stall`] holds until cleared.
pub const MAX_STALL: Duration = Duration::from_secs(600);
/// How long the relay waits for its target's TCP connect before resetting the client.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Added delay of one direction: `fixed` plus a uniform draw in `[0, jitter]` per chunk,
/// plus, on `hiccup_per_mille` chunks in 1000, a `hiccup` (an occasional stall: order is
/// kept, so the chunks behind it wait too).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delay {
    /// Always added.
    pub fixed: Duration,
    /// The most added on top, drawn per chunk.
    pub jitter: Duration,
    /// Added to the chunks a hiccup falls on.
    pub hiccup: Duration,
    /// How many chunks in 1000 a hiccup falls on (drawn per chunk).
    pub hiccup_per_mille: u32,
}

impl Delay {
    /// No delay.
    pub const NONE: Self = Self::ms(0, 0);

    /// `fixed_ms` plus up to `jitter_ms`, no hiccups.
    pub const fn ms(fixed_ms: u64, jitter_ms: u64) -> Self {
        Self {
            fixed: Duration::from_millis(fixed_ms),
            jitter: Duration::from_millis(jitter_ms),
            hiccup: Duration::ZERO,
            hiccup_per_mille: 0,
        }
    }
}

/// A WAN-like one-way delay between sites: 20 ms plus up to 60 ms jitter (a 20-80 ms
/// link, as between regions), and an occasional stall: 300 ms more on one chunk in a
/// hundred.
pub const WAN: Delay = Delay {
    hiccup: Duration::from_millis(300),
    hiccup_per_mille: 10,
    ..Delay::ms(20, 60)
};

/// Which way bytes move through the relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the accepted client to the target (requests).
    ToTarget,
    /// From the target back to the client (answers).
    ToClient,
}

/// A stall in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stall {
    Until(Instant),
    Cleared,
}

/// Every fault in force: the relay's one piece of mutable state, published through a
/// `watch` so connections wake when it changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Faults {
    to_target: Delay,
    to_client: Delay,
    stall: Option<Stall>,
    resetting: bool,
    /// Bumped by [`FaultControl::reset_open`]: every connection open at that moment resets.
    reset_epoch: u64,
    black_hole: bool,
    refusing: bool,
}

/// What the relay did, for reports.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Connections accepted (including those reset or refused at once).
    pub accepted: AtomicU64,
    /// Connections reset at accept: refusing, resetting, or over [`MAX_CONNECTIONS`].
    pub refused: AtomicU64,
    /// Open connections reset by a reset fault or at the end of a black-hole.
    pub reset: AtomicU64,
    /// Bytes delivered towards the target.
    pub bytes_to_target: AtomicU64,
    /// Bytes delivered back to clients.
    pub bytes_to_client: AtomicU64,
    /// Bytes read and dropped by a black-hole.
    pub bytes_dropped: AtomicU64,
    /// Connections open now.
    pub open: AtomicUsize,
}

/// A cheap snapshot of [`RelayStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayCounts {
    /// See [`RelayStats::accepted`].
    pub accepted: u64,
    /// See [`RelayStats::refused`].
    pub refused: u64,
    /// See [`RelayStats::reset`].
    pub reset: u64,
    /// See [`RelayStats::bytes_to_target`].
    pub bytes_to_target: u64,
    /// See [`RelayStats::bytes_to_client`].
    pub bytes_to_client: u64,
    /// See [`RelayStats::bytes_dropped`].
    pub bytes_dropped: u64,
    /// See [`RelayStats::open`].
    pub open: usize,
}

/// A small seeded generator (SplitMix64): jitter reproducible from the relay's seed, and
/// no thread RNG in the kit.
#[derive(Clone, Copy, Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform draw in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct Shared {
    faults: watch::Sender<Faults>,
    rng: Mutex<SplitMix64>,
    stats: RelayStats,
    clock: Stopwatch,
}

impl Shared {
    fn now(&self) -> Instant {
        self.clock.origin() + self.clock.elapsed()
    }

    fn delay(&self, direction: Direction) -> Duration {
        let faults = *self.faults.borrow();
        let d = match direction {
            Direction::ToTarget => faults.to_target,
            Direction::ToClient => faults.to_client,
        };
        draw(d, &mut self.rng.lock())
    }
}

/// One chunk's delay under `d`, from `rng`.
fn draw(d: Delay, rng: &mut SplitMix64) -> Duration {
    let jitter = if d.jitter.is_zero() {
        Duration::ZERO
    } else {
        d.jitter.mul_f64(rng.unit())
    };
    let hiccup = if d.hiccup_per_mille > 0 && rng.unit() * 1000.0 < f64::from(d.hiccup_per_mille) {
        d.hiccup
    } else {
        Duration::ZERO
    };
    (d.fixed + jitter + hiccup).min(MAX_DELAY)
}

/// Sets the faults of a running relay. Cheap to clone; every setter takes effect at once
/// for open connections too.
#[derive(Clone)]
pub struct FaultControl {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FaultControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultControl")
            .field("faults", &*self.shared.faults.borrow())
            .field("counts", &self.counts())
            .finish()
    }
}

impl FaultControl {
    fn modify(&self, f: impl FnOnce(&mut Faults)) {
        self.shared.faults.send_modify(f);
    }

    /// Sets the added delay of one direction.
    pub fn set_delay(&self, direction: Direction, delay: Delay) {
        self.modify(|f| match direction {
            Direction::ToTarget => f.to_target = delay,
            Direction::ToClient => f.to_client = delay,
        });
    }

    /// Sets the same added delay both ways.
    pub fn set_delay_both(&self, delay: Delay) {
        self.modify(|f| {
            f.to_target = delay;
            f.to_client = delay;
        });
    }

    /// Holds every byte in both directions for `duration` (at most [`MAX_STALL`]), then
    /// delivers them in order.
    pub fn stall_for(&self, duration: Duration) {
        let until = self.shared.now() + duration.min(MAX_STALL);
        self.modify(|f| f.stall = Some(Stall::Until(until)));
    }

    /// Holds every byte in both directions until [`FaultControl::clear_stall`] (or
    /// [`FaultControl::heal`]).
    pub fn stall(&self) {
        self.modify(|f| f.stall = Some(Stall::Cleared));
    }

    /// Ends a stall: held bytes are delivered in order.
    pub fn clear_stall(&self) {
        self.modify(|f| f.stall = None);
    }

    /// While on, every open connection is reset and every new one is reset at accept.
    pub fn set_resetting(&self, on: bool) {
        self.modify(|f| f.resetting = on);
    }

    /// Resets every connection open now, once; new ones are relayed as before.
    pub fn reset_open(&self) {
        self.modify(|f| f.reset_epoch += 1);
    }

    /// While on, every byte read is dropped and nothing is answered (a partition that
    /// neither refuses nor resets); when it clears, connections that lost bytes are reset.
    pub fn set_black_hole(&self, on: bool) {
        self.modify(|f| f.black_hole = on);
    }

    /// While on, new connections are reset at accept (the closest a listening socket gets
    /// to refusing); open ones are untouched.
    pub fn set_refusing(&self, on: bool) {
        self.modify(|f| f.refusing = on);
    }

    /// Clears every fault but the delays.
    pub fn heal(&self) {
        self.modify(|f| {
            f.stall = None;
            f.resetting = false;
            f.black_hole = false;
            f.refusing = false;
        });
    }

    /// What the relay did so far.
    pub fn counts(&self) -> RelayCounts {
        let s = &self.shared.stats;
        RelayCounts {
            accepted: s.accepted.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            reset: s.reset.load(Ordering::Relaxed),
            bytes_to_target: s.bytes_to_target.load(Ordering::Relaxed),
            bytes_to_client: s.bytes_to_client.load(Ordering::Relaxed),
            bytes_dropped: s.bytes_dropped.load(Ordering::Relaxed),
            open: s.open.load(Ordering::Relaxed),
        }
    }
}

/// A running relay. Dropping it stops accepting and ends every connection.
pub struct FaultRelay {
    addr: SocketAddr,
    target: SocketAddr,
    control: FaultControl,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for FaultRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultRelay")
            .field("addr", &self.addr)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl Drop for FaultRelay {
    fn drop(&mut self) {
        // Aborting the accept task drops its JoinSet, which aborts every connection task.
        self.task.abort();
    }
}

impl FaultRelay {
    /// Starts a relay on 127.0.0.1 (a port the OS picks) forwarding to `target`, with no
    /// fault in force; `seed` seeds the jitter.
    pub async fn start(target: SocketAddr, seed: u64) -> Result<Self, Error> {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST, target, seed).await
    }

    /// As [`FaultRelay::start`], listening on `ip` (a namespace's end of its link, say).
    pub async fn start_on(
        ip: std::net::Ipv4Addr,
        target: SocketAddr,
        seed: u64,
    ) -> Result<Self, Error> {
        let listener = TcpListener::bind(SocketAddr::from((ip, 0))).await?;
        let addr = listener.local_addr()?;
        let (faults, _) = watch::channel(Faults {
            to_target: Delay::NONE,
            to_client: Delay::NONE,
            stall: None,
            resetting: false,
            reset_epoch: 0,
            black_hole: false,
            refusing: false,
        });
        let shared = Arc::new(Shared {
            faults,
            rng: Mutex::new(SplitMix64(seed)),
            stats: RelayStats::default(),
            clock: Stopwatch::start(),
        });
        let task = tokio::spawn(accept_loop(listener, target, Arc::clone(&shared)));
        Ok(Self {
            addr,
            target,
            control: FaultControl { shared },
            task,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where it forwards.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// The control handle.
    pub fn control(&self) -> FaultControl {
        self.control.clone()
    }
}

/// Closes `stream` with RST rather than FIN: `SO_LINGER` 0, then drop.
fn reset(stream: &impl std::os::fd::AsFd) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, shared: Arc<Shared>) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    // Ends only when the relay is dropped (this task is aborted, and with it the set).
    loop {
        // Reap finished connections so the set stays as small as the open count.
        while connections.try_join_next().is_some() {}
        let Ok((client, _)) = listener.accept().await else {
            // Out of descriptors or a transient error: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        shared.stats.accepted.fetch_add(1, Ordering::Relaxed);
        let _ = client.set_nodelay(true);
        let faults = *shared.faults.borrow();
        let permit = Arc::clone(&permits).try_acquire_owned();
        let (true, Ok(permit)) = (!faults.refusing && !faults.resetting, permit) else {
            shared.stats.refused.fetch_add(1, Ordering::Relaxed);
            reset(&client);
            continue;
        };
        let shared = Arc::clone(&shared);
        connections.spawn(async move {
            shared.stats.open.fetch_add(1, Ordering::Relaxed);
            relay_one(client, target, &shared, faults.black_hole).await;
            shared.stats.open.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
}

/// Why a connection's faults say it must end now.
fn must_reset(f: &Faults, epoch_at_open: u64, lost_bytes: bool) -> bool {
    f.resetting || f.reset_epoch != epoch_at_open || (lost_bytes && !f.black_hole)
}

/// Relays one connection until both directions end or a fault resets it.
///
/// The pumps borrow the sockets' halves (`TcpStream::split`), which unlike owned halves do
/// not shut the write side down when dropped: a reset must reach the peer as an RST, not
/// after a FIN.
async fn relay_one(mut client: TcpStream, target: SocketAddr, shared: &Arc<Shared>, holed: bool) {
    let mut faults = shared.faults.subscribe();
    let epoch = faults.borrow_and_update().reset_epoch;
    // A connection black-holed from the start never reaches the target: its stream is
    // broken from the first byte, so it is reset when the black-hole clears.
    let lost = AtomicBool::new(holed);
    let mut server = if holed {
        None
    } else {
        let Ok(Ok(s)) = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await
        else {
            reset(&client);
            return;
        };
        let _ = s.set_nodelay(true);
        Some(s)
    };
    let pumps = async {
        let (client_read, client_write) = client.split();
        match server.as_mut() {
            // Read and drop until the client leaves; never answer, never close first.
            None => drain(client_read, shared, &lost).await,
            Some(server) => {
                let (server_read, server_write) = server.split();
                let up = pump(
                    client_read,
                    server_write,
                    Direction::ToTarget,
                    shared,
                    &lost,
                );
                let down = pump(
                    server_read,
                    client_write,
                    Direction::ToClient,
                    shared,
                    &lost,
                );
                tokio::join!(up, down);
            }
        }
    };
    let must_reset = tokio::select! {
        () = pumps => false,
        () = reset_when(&mut faults, epoch, &lost) => true,
    };
    if must_reset {
        shared.stats.reset.fetch_add(1, Ordering::Relaxed);
        reset(&client);
        if let Some(server) = &server {
            reset(server);
        }
    }
}

/// Resolves when the faults say this connection must be reset.
async fn reset_when(faults: &mut watch::Receiver<Faults>, epoch: u64, lost: &AtomicBool) {
    loop {
        if must_reset(
            &faults.borrow_and_update(),
            epoch,
            lost.load(Ordering::Relaxed),
        ) {
            return;
        }
        if faults.changed().await.is_err() {
            // The relay is gone; its drop ends this task anyway.
            std::future::pending::<()>().await;
        }
    }
}

/// Reads and drops everything (a black-holed connection that never had a target).
async fn drain(mut src: ReadHalf<'_>, shared: &Shared, lost: &AtomicBool) {
    let mut buf = vec![0u8; CHUNK_BYTES];
    while let Ok(n @ 1..) = src.read(&mut buf).await {
        lost.store(true, Ordering::Relaxed);
        shared
            .stats
            .bytes_dropped
            .fetch_add(n as u64, Ordering::Relaxed);
    }
}

struct Chunk {
    due: Instant,
    bytes: Vec<u8>,
}

/// Moves one direction: a reader stamping each chunk with its due time (never earlier
/// than the previous chunk's, so order holds), a writer delivering each when due and no
/// stall is in force. The queue between them is bounded ([`CHUNK_QUEUE`]).
async fn pump(
    mut src: ReadHalf<'_>,
    mut dst: WriteHalf<'_>,
    direction: Direction,
    shared: &Shared,
    lost: &AtomicBool,
) {
    let (tx, mut rx) = mpsc::channel::<Chunk>(CHUNK_QUEUE);
    let reader = async move {
        let mut buf = vec![0u8; CHUNK_BYTES];
        let mut last_due = shared.now();
        while let Ok(n @ 1..) = src.read(&mut buf).await {
            if shared.faults.borrow().black_hole {
                lost.store(true, Ordering::Relaxed);
                shared
                    .stats
                    .bytes_dropped
                    .fetch_add(n as u64, Ordering::Relaxed);
                continue;
            }
            let due = (shared.now() + shared.delay(direction)).max(last_due);
            last_due = due;
            let chunk = Chunk {
                due,
                bytes: buf[..n].to_vec(),
            };
            if tx.send(chunk).await.is_err() {
                return;
            }
        }
        // End of stream (or a read error): the writer delivers what is queued, then ends.
    };
    let writer = async move {
        let mut faults = shared.faults.subscribe();
        while let Some(chunk) = rx.recv().await {
            tokio::time::sleep_until(chunk.due).await;
            wait_unstalled(&mut faults).await;
            if dst.write_all(&chunk.bytes).await.is_err() {
                return;
            }
            let counter = match direction {
                Direction::ToTarget => &shared.stats.bytes_to_target,
                Direction::ToClient => &shared.stats.bytes_to_client,
            };
            counter.fetch_add(chunk.bytes.len() as u64, Ordering::Relaxed);
        }
        let _ = dst.shutdown().await;
    };
    tokio::join!(reader, writer);
}

/// Returns when no stall is in force: a timed one ends by itself (at most [`MAX_STALL`]),
/// an untimed one when cleared.
async fn wait_unstalled(faults: &mut watch::Receiver<Faults>) {
    loop {
        let stall = faults.borrow_and_update().stall;
        match stall {
            None => return,
            Some(Stall::Until(until)) => {
                tokio::select! {
                    () = tokio::time::sleep_until(until) => return,
                    r = faults.changed() => if r.is_err() { return },
                }
            }
            Some(Stall::Cleared) => {
                if faults.changed().await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback: answers every byte back, until the client closes.
    async fn echo() -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut set = JoinSet::new();
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                set.spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        (addr, task)
    }

    async fn relay() -> (FaultRelay, tokio::task::JoinHandle<()>) {
        let (addr, task) = echo().await;
        (FaultRelay::start(addr, 7).await.unwrap(), task)
    }

    const GENEROUS: Duration = Duration::from_secs(10);

    /// Writes `data`, reads back exactly as many bytes, within [`GENEROUS`].
    async fn round_trip(stream: &mut TcpStream, data: &[u8]) -> std::io::Result<Vec<u8>> {
        let exchange = async {
            stream.write_all(data).await?;
            let mut back = vec![0u8; data.len()];
            stream.read_exact(&mut back).await?;
            Ok(back)
        };
        tokio::time::timeout(GENEROUS, exchange)
            .await
            .unwrap_or_else(|_| Err(std::io::Error::other("timed out")))
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8).collect()
    }

    /// Whether a read on `stream` sees the connection end (EOF or error) within `limit`.
    async fn ends_within(
        stream: &mut TcpStream,
        limit: Duration,
    ) -> Option<std::io::Result<usize>> {
        let mut buf = [0u8; 64];
        tokio::time::timeout(limit, stream.read(&mut buf))
            .await
            .ok()
    }

    #[tokio::test]
    async fn a_healthy_link_relays_every_byte_both_ways() {
        let (relay, _echo) = relay().await;
        let mut c = TcpStream::connect(relay.addr()).await.unwrap();
        let data = pattern(200_000);
        assert_eq!(round_trip(&mut c, &data).await.unwrap(), data);
        let counts = relay.control().counts();
        assert_eq!(counts.bytes_to_target, 200_000);
        assert_eq!(counts.bytes_to_client, 200_000);
    }

    #[tokio::test]
    async fn a_delayed_link_delivers_every_byte_in_order_and_no_sooner_than_the_delay() {
        let (relay, _echo) = relay().await;
        relay.control().set_delay_both(Delay::ms(100, 50));
        let mut c = TcpStream::connect(relay.addr()).await.unwrap();
        let data = pattern(300_000);
        let watch = Stopwatch::start();
        let back = round_trip(&mut c, &data).await.unwrap();
        // One delay each way at least; no upper bound but the generous one.
        assert!(
            watch.elapsed() >= Duration::from_millis(200),
            "{:?}",
            watch.elapsed()
        );
        assert_eq!(back, data);
    }

    #[test]
    fn jitter_is_reproducible_from_the_seed_and_stays_within_its_bound() {
        let draw = |seed| {
            let mut r = SplitMix64(seed);
            (0..100).map(|_| r.unit()).collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
        assert!(draw(3).iter().all(|u| (0.0..1.0).contains(u)));
    }

    #[test]
    fn the_wan_delay_stays_in_its_range_with_a_hiccup_on_about_one_chunk_in_a_hundred() {
        let mut rng = SplitMix64(7);
        let draws: Vec<Duration> = (0..10_000).map(|_| draw(WAN, &mut rng)).collect();
        let (low, high) = (WAN.fixed, WAN.fixed + WAN.jitter);
        let hiccups = draws.iter().filter(|d| **d > high).count();
        assert!(draws.iter().all(|d| *d >= low && *d <= high + WAN.hiccup));
        assert!((50..=150).contains(&hiccups), "{hiccups} hiccups in 10000");
        let none: Vec<Duration> = (0..1_000)
            .map(|_| draw(Delay::ms(20, 60), &mut rng))
            .collect();
        assert!(none.iter().all(|d| *d <= high), "no hiccups unless asked");
    }

    #[tokio::test]
    async fn a_stalled_link_holds_bytes_until_cleared_then_delivers_them_all() {
        let (relay, _echo) = relay().await;
        let control = relay.control();
        let mut c = TcpStream::connect(relay.addr()).await.unwrap();
        assert_eq!(round_trip(&mut c, b"before").await.unwrap(), b"before");
        control.stall();
        c.write_all(b"held").await.unwrap();
        let mut buf = [0u8; 4];
        let early = tokio::time::timeout(Duration::from_millis(300), c.read_exact(&mut buf)).await;
        assert!(early.is_err(), "nothing arrives while stalled");
        control.clear_stall();
        tokio::time::timeout(GENEROUS, c.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf, b"held");
    }

    #[tokio::test]
    async fn a_timed_stall_ends_by_itself() {
        let (relay, _echo) = relay().await;
        relay.control().stall_for(Duration::from_millis(200));
        let mut c = TcpStream::connect(relay.addr()).await.unwrap();
        let watch = Stopwatch::start();
        assert_eq!(round_trip(&mut c, b"later").await.unwrap(), b"later");
        assert!(
            watch.elapsed() >= Duration::from_millis(150),
            "{:?}",
            watch.elapsed()
        );
    }

    #[tokio::test]
    async fn a_reset_closes_open_connections_with_rst_and_new_ones_at_accept() {
        let (relay, _echo) = relay().await;
        let control = relay.control();
        let mut open = TcpStream::connect(relay.addr()).await.unwrap();
        assert_eq!(round_trip(&mut open, b"hi").await.unwrap(), b"hi");
        control.set_resetting(true);
        let ended = ends_within(&mut open, GENEROUS)
            .await
            .expect("the open one ends");
        assert!(
            matches!(&ended, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "an RST, not a FIN: {ended:?}"
        );
        let mut new = TcpStream::connect(relay.addr()).await.unwrap();
        assert!(round_trip(&mut new, b"x").await.is_err());
        control.set_resetting(false);
        let mut after = TcpStream::connect(relay.addr()).await.unwrap();
        assert_eq!(round_trip(&mut after, b"ok").await.unwrap(), b"ok");
        let counts = control.counts();
        assert!(counts.reset >= 1 && counts.refused >= 1, "{counts:?}");
    }

    #[tokio::test]
    async fn a_one_shot_reset_ends_open_connections_but_relays_new_ones() {
        let (relay, _echo) = relay().await;
        let mut open = TcpStream::connect(relay.addr()).await.unwrap();
        assert_eq!(round_trip(&mut open, b"hi").await.unwrap(), b"hi");
        relay.control().reset_open();
        assert!(ends_within(&mut open, GENEROUS).await.is_some());
        let mut new = TcpStream::connect(relay.addr()).await.unwrap();
        assert_eq!(round_trip(&mut new, b"ok").await.unwrap(), b"ok");
    }

    #[tokio::test]
    async fn a_black_hole_reads_everything_answers_nothing_and_resets_when_it_clears() {
        let (relay, _echo) = relay().await;
        let control = relay.control();
        let mut open = TcpStream::connect(relay.addr()).await.unwrap();
        assert_eq!(round_trip(&mut open, b"hi").await.unwrap(), b"hi");
        control.set_black_hole(true);
        let mut new = TcpStream::connect(relay.addr()).await.unwrap();
        open.write_all(b"lost").await.unwrap();
        new.write_all(b"lost too").await.unwrap();
        assert!(
            ends_within(&mut open, Duration::from_millis(300))
                .await
                .is_none()
        );
        assert!(
            ends_within(&mut new, Duration::from_millis(300))
                .await
                .is_none()
        );
        let dropped = || control.counts().bytes_dropped;
        let watch = Stopwatch::start();
        while dropped() < 12 && watch.elapsed() < GENEROUS {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(dropped(), 12);
        control.set_black_hole(false);
        assert!(
            ends_within(&mut open, GENEROUS).await.is_some(),
            "broken streams end"
        );
        assert!(ends_within(&mut new, GENEROUS).await.is_some());
        let mut after = TcpStream::connect(relay.addr()).await.unwrap();
        assert_eq!(round_trip(&mut after, b"ok").await.unwrap(), b"ok");
    }

    #[tokio::test]
    async fn a_refusing_relay_resets_new_connections_and_keeps_open_ones() {
        let (relay, _echo) = relay().await;
        let control = relay.control();
        let mut open = TcpStream::connect(relay.addr()).await.unwrap();
        assert_eq!(round_trip(&mut open, b"hi").await.unwrap(), b"hi");
        control.set_refusing(true);
        let mut new = TcpStream::connect(relay.addr()).await.unwrap();
        assert!(round_trip(&mut new, b"x").await.is_err());
        assert_eq!(round_trip(&mut open, b"still").await.unwrap(), b"still");
        control.heal();
        let mut after = TcpStream::connect(relay.addr()).await.unwrap();
        assert_eq!(round_trip(&mut after, b"ok").await.unwrap(), b"ok");
    }

    #[tokio::test]
    async fn dropping_the_relay_ends_its_connections() {
        let (relay, _echo) = relay().await;
        let mut open = TcpStream::connect(relay.addr()).await.unwrap();
        assert_eq!(round_trip(&mut open, b"hi").await.unwrap(), b"hi");
        let addr = relay.addr();
        drop(relay);
        assert!(ends_within(&mut open, GENEROUS).await.is_some());
        let watch = Stopwatch::start();
        while TcpStream::connect(addr).await.is_ok() && watch.elapsed() < GENEROUS {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "the listener is closed"
        );
    }
}
