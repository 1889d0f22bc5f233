//! The fault suite: three sites on loopback with WAN-like links between them
//! ([`grid_kit::fault_relay`]), steady load through the gateway, and one fault at a time
//! injected on site `c`, held, then healed. Each fault gets a fresh grid, so no fault's
//! aftermath colours the next. What each run measured is one [`Row`]; the `grid-faults`
//! binary prints them as the markdown table `docs/operations.md` carries.
//!
//! Every loop is bounded in count and time: at most [`MAX_REQUESTS_PER_WORKER`] requests
//! per worker, each bounded by [`REQUEST_TIMEOUT`]; the fault is held [`Fault::hold`]; rejoining
//! is awaited at most [`REJOIN_LIMIT`]. Traffic goes to loopback only.
#![allow(clippy::missing_panics_doc)] // a test harness: every failure is the run's

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use grid_sim::site_model::SiteConfig;
use http::StatusCode;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::fault_ledger::{Evidence, FENCE_SAMPLE_EVERY, FenceWatch, settle_evidence};
use grid_kit::Error;
use grid_kit::clock::Stopwatch;
use grid_kit::load::{LoadClient, Protocol, chat_body};
use grid_kit::local_grid::{
    Cadence, GridSpec, Links, LocalGrid, SiteLink, SiteRouting, SiteSpec, TransportMode, routing_of,
};
use grid_kit::sim_site::{EppFault, SimSiteControl};

/// The model every site serves.
pub const MODEL: &str = "llama";
/// The sites: `a` holds the gateway, `b` and `c` are remote (behind relays).
pub const SITES: [&str; 3] = ["a", "b", "c"];
/// The site every fault is injected on.
pub const FAULTED: &str = "c";
/// Closed-loop workers driving the gateway: enough to keep every site busy, well under
/// the grid's capacity (3 sites x 2 endpoints x 4 slots).
pub const WORKERS: usize = 6;
/// Each request's bound, answer included: what a client gives up after.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests per worker at most, whatever the time.
pub const MAX_REQUESTS_PER_WORKER: u64 = 5_000;
/// Steady load before the fault.
pub const WARMUP: Duration = Duration::from_secs(2);
/// How long each fault is held ([`Fault::hold`]).
pub const HOLD: Duration = Duration::from_secs(8);
/// How long a fault that silences `c`'s signal is held: past the gateway's
/// `fresh_for_ms` (15 s), so the loss of signal can show (a frozen operator, for one, is
/// stopped this long).
pub const SILENCE_HOLD: Duration = Duration::from_secs(20);
/// How long the faulted site is given to become selectable again after healing.
pub const REJOIN_LIMIT: Duration = Duration::from_secs(15);
/// Start-up and first readings of every site, through the WAN links.
pub const MEASURED_WITHIN: Duration = Duration::from_secs(30);
/// How often the suite looks at the gateway's routing view.
pub const WATCH_EVERY: Duration = Duration::from_millis(20);
/// The peer flood: idle TCP connections held open at the faulted operator's signals port.
pub const PEER_FLOOD_CONNECTIONS: usize = 300;
/// The slow-client flood: connections to the gateway sending their headers byte by byte.
pub const SLOW_CLIENTS: usize = 200;
/// One header byte per slow client this often.
pub const SLOW_CLIENT_BYTE_EVERY: Duration = Duration::from_millis(500);
/// How long the slow EPP takes to answer: past the operator's scrape timeout.
pub const SLOW_EPP: Duration = Duration::from_secs(2);
/// How far the clock-step rows step an operator's clock back: twice the receivers' 10 min
/// bound on how far ahead a stamp may be, so every reading stamped before the step is
/// implausible after it.
pub const CLOCK_STEP_MS: i64 = 20 * 60 * 1000;

/// One fault of the suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Both of `c`'s links black-holed: bytes read, nothing forwarded, nothing answered.
    Partition,
    /// `c`'s operator aborted (no final fence write), started again after the hold.
    OperatorRestart,
    /// `c`'s operator frozen for the hold: every thread of its runtime stopped, as
    /// `SIGSTOP` stops a process (without namespaces: its peer link stalled instead, so
    /// `operator[0]`'s polls get no byte back).
    OperatorFrozen,
    /// `c`'s request link stalled: the upstream accepts and never answers.
    HungUpstream,
    /// `c`'s request link resets every connection.
    ResettingUpstream,
    /// `c`'s EPP reports zero ready endpoints (its model server fails requests with 503).
    EppZeroReady,
    /// `c`'s EPP answers 200 with no series.
    EppNoSeries,
    /// `c`'s EPP answers over 1 MiB.
    EppOversize,
    /// `c`'s EPP answers bytes that are no exposition.
    EppGarbage,
    /// `c`'s EPP answers after [`SLOW_EPP`].
    EppSlow,
    /// [`PEER_FLOOD_CONNECTIONS`] idle connections at `c`'s operator's signals port.
    PeerFlood,
    /// [`SLOW_CLIENTS`] connections to the gateway sending headers byte by byte.
    SlowClientFlood,
    /// Sites `a` (its operator and the gateway) and `c` get renewed certificates, written
    /// over their files under load.
    CertificateRotation,
    /// `c`'s operator clock steps back [`CLOCK_STEP_MS`] ms (and forward again at healing), as
    /// a host clock step would; every other clock stays.
    ClockStep,
    /// The same step on `a`'s operator, the one the gateway polls and reports to: the
    /// readings it stamped before the step now read as ahead of its clock.
    ClockStepLocal,
}

impl Fault {
    /// Every fault, in the order the suite runs them.
    pub const ALL: [Self; 15] = [
        Self::Partition,
        Self::OperatorRestart,
        Self::OperatorFrozen,
        Self::HungUpstream,
        Self::ResettingUpstream,
        Self::EppZeroReady,
        Self::EppNoSeries,
        Self::EppOversize,
        Self::EppGarbage,
        Self::EppSlow,
        Self::PeerFlood,
        Self::SlowClientFlood,
        Self::CertificateRotation,
        Self::ClockStep,
        Self::ClockStepLocal,
    ];

    /// Its name on the command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Self::Partition => "partition",
            Self::OperatorRestart => "operator-restart",
            Self::OperatorFrozen => "operator-frozen",
            Self::HungUpstream => "hung-upstream",
            Self::ResettingUpstream => "resetting-upstream",
            Self::EppZeroReady => "epp-zero-ready",
            Self::EppNoSeries => "epp-no-series",
            Self::EppOversize => "epp-oversize",
            Self::EppGarbage => "epp-garbage",
            Self::EppSlow => "epp-slow",
            Self::PeerFlood => "peer-flood",
            Self::SlowClientFlood => "slow-client-flood",
            Self::CertificateRotation => "certificate-rotation",
            Self::ClockStep => "clock-step",
            Self::ClockStepLocal => "clock-step-local",
        }
    }

    /// How long it is held.
    pub fn hold(self) -> Duration {
        match self {
            // A failing EPP reads not ready only once its last good scrape is older than
            // `staleMetricsSeconds`: held as long as a silence, so the row can show it.
            Self::Partition
            | Self::OperatorRestart
            | Self::OperatorFrozen
            | Self::EppOversize
            | Self::EppGarbage
            | Self::EppSlow
            // Past the gateway's 10 s `clientHeaderTimeoutSeconds`, so the closing shows.
            | Self::SlowClientFlood
            // Past `fresh_for_ms`, so a site the step silenced would show.
            | Self::ClockStep
            | Self::ClockStepLocal => SILENCE_HOLD,
            _ => HOLD,
        }
    }

    /// The site the fault is injected on: [`FAULTED`], except the local clock step.
    pub fn site(self) -> &'static str {
        match self {
            Self::ClockStepLocal => SITES[0],
            _ => FAULTED,
        }
    }

    /// Whether the design says the faulted site must leave selection during this fault. A
    /// body without the ready-endpoint series leaves readiness unknown, which never
    /// excludes; floods must not move a healthy site; a clock step moves every stamp and
    /// its reference together (stamps travel relative to the sender's `Date`), so it must
    /// not either. An upstream that hangs or resets while its EPP reports ready is
    /// weighed down by its serving failures, not excluded (exclusion reads signals only).
    pub fn expects_exclusion(self) -> bool {
        !matches!(
            self,
            Self::HungUpstream
                | Self::ResettingUpstream
                | Self::PeerFlood
                | Self::SlowClientFlood
                | Self::EppNoSeries
                | Self::CertificateRotation
                | Self::ClockStep
                | Self::ClockStepLocal
        )
    }
}

/// What one fault's run measured.
#[derive(Clone, Debug, Default)]
pub struct Row {
    /// The fault's name.
    pub fault: &'static str,
    /// Requests sent through the gateway.
    pub sent: u64,
    /// Answers by status.
    pub statuses: BTreeMap<u16, u64>,
    /// Requests with no answer, by how they failed.
    pub failures: BTreeMap<&'static str, u64>,
    /// 200 answers naming a site that the gateway's view excluded both when the request
    /// was sent and when its answer arrived.
    pub to_excluded: u64,
    /// 200 answers by serving site.
    pub by_site: BTreeMap<String, u64>,
    /// From injection until `c` left the gateway's preference (excluded, or unmeasured:
    /// sorted last), if it did within the hold.
    pub to_exclude: Option<Duration>,
    /// The exclusion reason seen first.
    pub reason: Option<&'static str>,
    /// From healing until `c` was measured and selectable again, if within
    /// [`REJOIN_LIMIT`].
    pub to_rejoin: Option<Duration>,
    /// Persisted fences or epoch marks that went backwards, described
    /// ([`crate::fault_ledger::FenceWatch`]).
    pub fences_lost: Vec<String>,
    /// Fences tracked and state directory reads made.
    pub fences_read: (usize, u64),
    /// The gateway's rejection evidence against what its operator persisted.
    pub evidence: Evidence,
    /// Anything else worth a column (flood outcomes).
    pub note: String,
}

fn site(name: &str) -> SiteSpec {
    SiteSpec::simulated(SiteConfig::new(name, 2, 4), MODEL, 100.0, 15)
}

/// The suite's grid spec: three sites, the test cadences.
pub fn spec() -> GridSpec {
    GridSpec {
        model: MODEL.to_owned(),
        sites: SITES.iter().map(|s| site(s)).collect(),
        cadence: Cadence::FAST,
        transport: TransportMode::Poll,
        shedding: None,
    }
}

fn failure_kind(e: &Error) -> &'static str {
    match e {
        Error::Timeout { .. } => "timeout",
        Error::Request(m) => {
            let m = m.to_ascii_lowercase();
            if m.contains("reset") {
                "reset"
            } else if m.contains("refused") {
                "refused"
            } else if m.contains("closed") || m.contains("incomplete") || m.contains("eof") {
                "closed"
            } else {
                "error"
            }
        }
        _ => "error",
    }
}

/// What one worker saw.
#[derive(Default)]
struct Tally {
    sent: u64,
    statuses: BTreeMap<u16, u64>,
    failures: BTreeMap<&'static str, u64>,
    to_excluded: u64,
    by_site: BTreeMap<String, u64>,
}

fn excluded_now(published: &grid_gateway::upstream::Published, site: &str) -> bool {
    matches!(
        routing_of(&published.load_full(), MODEL, site),
        SiteRouting::Excluded(_)
    )
}

async fn worker(
    client: LoadClient,
    uri: http::Uri,
    published: grid_gateway::upstream::Published,
    stop: Arc<AtomicBool>,
    index: usize,
) -> Tally {
    let mut t = Tally::default();
    while !stop.load(Ordering::Relaxed) && t.sent < MAX_REQUESTS_PER_WORKER {
        let excluded_at_send: Vec<bool> =
            SITES.iter().map(|s| excluded_now(&published, s)).collect();
        t.sent += 1;
        let stream = (t.sent + index as u64).is_multiple_of(2);
        match client.post_json(&uri, chat_body(MODEL, stream)).await {
            Ok(a) => {
                *t.statuses.entry(a.status.as_u16()).or_default() += 1;
                if a.status == StatusCode::OK
                    && let Some(site) = a.site
                {
                    let i = SITES.iter().position(|s| *s == site);
                    if i.is_some_and(|i| excluded_at_send[i]) && excluded_now(&published, &site) {
                        t.to_excluded += 1;
                    }
                    *t.by_site.entry(site).or_default() += 1;
                }
            }
            Err(e) => *t.failures.entry(failure_kind(&e)).or_default() += 1,
        }
    }
    t
}

/// Holds [`PEER_FLOOD_CONNECTIONS`] idle connections at `addr` until aborted; reports
/// how many it opened.
async fn peer_flood(addr: SocketAddr, opened: Arc<std::sync::atomic::AtomicUsize>) {
    let mut held = Vec::with_capacity(PEER_FLOOD_CONNECTIONS);
    for _ in 0..PEER_FLOOD_CONNECTIONS {
        if let Ok(Ok(s)) =
            tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr)).await
        {
            held.push(s);
            opened.fetch_add(1, Ordering::Relaxed);
        }
    }
    std::future::pending::<()>().await;
}

/// One slow client: a request's headers, one byte per [`SLOW_CLIENT_BYTE_EVERY`], for at
/// most `limit`. Returns whether the gateway closed it before the end.
async fn slow_client(addr: SocketAddr, limit: Duration) -> Option<bool> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    let head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: grid\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
    let watch = Stopwatch::start();
    for b in head {
        if watch.elapsed() >= limit {
            return Some(false);
        }
        if s.write_all(&[*b]).await.is_err() {
            return Some(true);
        }
        tokio::time::sleep(SLOW_CLIENT_BYTE_EVERY).await;
    }
    Some(false)
}

/// Whether a site is out of the gateway's preference: excluded (no pick can choose it),
/// or unmeasured (its signal is lost, so it sorts after every measured site: the design's
/// answer to a lost peer, which degrades to least preferred rather than excluded).
fn out_of_preference(r: &SiteRouting) -> bool {
    match r {
        SiteRouting::Candidate { state, .. } => *state == grid_score::CandidateState::Unmeasured,
        SiteRouting::Excluded(_) | SiteRouting::Absent => true,
    }
}

/// Polls the view every [`WATCH_EVERY`] until `cond` holds for `site` or `limit` passes;
/// returns the time taken and the routing then.
async fn watch_faulted(
    grid: &LocalGrid,
    site: &str,
    limit: Duration,
    cond: impl Fn(&SiteRouting) -> bool,
) -> (Option<Duration>, SiteRouting) {
    let watch = Stopwatch::start();
    loop {
        let r = grid.routing(site);
        if cond(&r) {
            return (Some(watch.elapsed()), r);
        }
        if watch.elapsed() >= limit {
            return (None, r);
        }
        tokio::time::sleep(WATCH_EVERY).await;
    }
}

/// The sites besides `faulted` out of preference at the end of the hold, as a note.
fn others_out(grid: &LocalGrid, faulted: &str) -> String {
    let out: Vec<&str> = SITES
        .iter()
        .copied()
        .filter(|s| *s != faulted && out_of_preference(&grid.routing(s)))
        .collect();
    if out.is_empty() {
        String::new()
    } else {
        format!("also out at the end of the hold: {}", out.join(", "))
    }
}

/// The gateway's counters that say why a site left preference (its polls by result,
/// readings dropped by reason, readings the scorer refused) and where every site stood.
async fn gateway_said(grid: &LocalGrid) -> String {
    let standing: Vec<String> = SITES
        .iter()
        .map(|s| format!("{s}: {:?}", grid.routing(s)))
        .collect();
    let counters = match grid_kit::operator_harness::read_metrics(grid.gateway_addr()).await {
        Ok(text) => text
            .lines()
            .filter(|l| {
                !l.starts_with('#')
                    && !l.ends_with(" 0")
                    && (l.contains("polls_total")
                        || l.contains("ingest_dropped_total")
                        || l.contains("readings_rejected"))
            })
            .collect::<Vec<_>>()
            .join(", "),
        Err(e) => format!("/metrics unread: {e}"),
    };
    format!(
        "when it left: {}; gateway counters: {counters}",
        standing.join("; ")
    )
}

/// What an injection left running, for its healing.
#[derive(Default)]
struct Injected {
    slow_clients: JoinSet<Option<bool>>,
    opened: Arc<std::sync::atomic::AtomicUsize>,
    flood: Option<tokio::task::JoinHandle<()>>,
    /// Whether the operator's runtime was frozen (rather than its relay stalled).
    frozen: bool,
}

/// Injects `fault` on [`FAULTED`].
fn inject(
    fault: Fault,
    grid: &mut LocalGrid,
    link: &SiteLink,
    control: &SimSiteControl,
) -> Injected {
    let mut injected = Injected::default();
    match fault {
        Fault::Partition => {
            // A namespaced site's link goes down; without namespaces its relays
            // black-hole instead (heal says which).
            if !grid.set_link(FAULTED, false).unwrap_or(false) {
                link.both(|c| c.set_black_hole(true));
            }
        }
        Fault::OperatorRestart => {
            grid.stop_operator(FAULTED);
        }
        Fault::OperatorFrozen => {
            // A namespaced operator's own runtime stops whole for the hold, as SIGSTOP
            // stops a process; without namespaces its peer relay stalls instead.
            injected.frozen = grid.freeze_operator(FAULTED, fault.hold());
            if !injected.frozen {
                link.peer.stall();
            }
        }
        Fault::HungUpstream => link.backend.stall(),
        Fault::ResettingUpstream => link.backend.set_resetting(true),
        Fault::EppZeroReady => control.drop_all_endpoints(),
        Fault::EppNoSeries => control.set_epp_fault(Some(EppFault::NoSeries)),
        Fault::EppOversize => control.set_epp_fault(Some(EppFault::Oversize)),
        Fault::EppGarbage => control.set_epp_fault(Some(EppFault::Garbage)),
        Fault::EppSlow => control.set_epp_fault(Some(EppFault::Slow(SLOW_EPP))),
        Fault::PeerFlood => {
            let addr = grid
                .operator_signals_addr(FAULTED)
                .expect("the faulted operator runs");
            injected.flood = Some(tokio::spawn(peer_flood(addr, Arc::clone(&injected.opened))));
        }
        Fault::SlowClientFlood => {
            let addr = grid.gateway_addr();
            for _ in 0..SLOW_CLIENTS {
                injected
                    .slow_clients
                    .spawn(slow_client(addr, Fault::SlowClientFlood.hold()));
            }
        }
        Fault::CertificateRotation => {
            for site in [SITES[0], FAULTED] {
                // The row's note then shows no rotation for the site.
                let _ = grid.renew_certificate(site);
            }
        }
        Fault::ClockStep => {
            grid.step_clock(FAULTED, -CLOCK_STEP_MS);
        }
        Fault::ClockStepLocal => {
            grid.step_clock(SITES[0], -CLOCK_STEP_MS);
        }
    }
    injected
}

/// Heals `fault`; returns the note its row carries.
async fn heal(
    fault: Fault,
    grid: &mut LocalGrid,
    link: &SiteLink,
    control: &SimSiteControl,
    injected: &mut Injected,
) -> Result<String, Error> {
    let mut note = String::new();
    match fault {
        Fault::Partition => {
            if grid.set_link(FAULTED, true)? {
                "veth link down".clone_into(&mut note);
            } else {
                link.both(|c| c.set_black_hole(false));
                "no namespaces here: relays black-holed".clone_into(&mut note);
            }
        }
        Fault::OperatorRestart => grid.start_operator(FAULTED).await?,
        Fault::OperatorFrozen => {
            if injected.frozen {
                note = format!("every operator thread stopped {} s", fault.hold().as_secs());
            } else {
                link.peer.clear_stall();
                "no namespaces here: peer relay stalled".clone_into(&mut note);
            }
        }
        Fault::HungUpstream => link.backend.clear_stall(),
        Fault::ResettingUpstream => link.backend.set_resetting(false),
        Fault::EppZeroReady => control.restore(),
        Fault::EppNoSeries | Fault::EppOversize | Fault::EppGarbage | Fault::EppSlow => {
            control.set_epp_fault(None);
        }
        Fault::PeerFlood => {
            if let Some(f) = injected.flood.take() {
                f.abort();
            }
            note = format!(
                "{} of {PEER_FLOOD_CONNECTIONS} flood connections opened",
                injected.opened.load(Ordering::Relaxed)
            );
        }
        Fault::SlowClientFlood => {
            let (mut closed, mut open, mut refused) = (0, 0, 0);
            while let Some(done) = injected.slow_clients.join_next().await {
                match done {
                    Ok(Some(true)) => closed += 1,
                    Ok(Some(false)) => open += 1,
                    _ => refused += 1,
                }
            }
            note = format!(
                "slow clients: {closed} closed by the gateway, {open} still open after {} s, {refused} not connected",
                Fault::SlowClientFlood.hold().as_secs()
            );
        }
        Fault::ClockStep => {
            grid.step_clock(FAULTED, CLOCK_STEP_MS);
        }
        Fault::ClockStepLocal => {
            grid.step_clock(SITES[0], CLOCK_STEP_MS);
        }
        Fault::CertificateRotation => {
            let taken = [SITES[0], FAULTED].map(|s| (s, grid.certificate_reloads(s)));
            note = taken
                .iter()
                .map(|(s, r)| match r {
                    Some((rotated, refused)) => {
                        format!("{s}: {rotated} rotated, {refused} refused")
                    }
                    None => format!("{s}: stopped"),
                })
                .collect::<Vec<_>>()
                .join("; ");
        }
    }
    Ok(note)
}

/// Runs one fault on a fresh grid and measures it.
pub async fn run(fault: Fault) -> Result<Row, Error> {
    let links = Links {
        namespaces: grid_kit::netns::available(),
        ..Links::WAN
    };
    let mut grid = LocalGrid::start_with_links(&spec(), links).await?;
    grid.wait_until("every site selectable", MEASURED_WITHIN, |g| {
        SITES.iter().all(|s| g.routing(s).selectable())
    })
    .await?;
    let link = grid
        .link(FAULTED)
        .expect("a remote site of a linked grid has links");
    let control = grid.control(FAULTED).expect("the sites are simulated");

    let fences_done = Arc::new(AtomicBool::new(false));
    let fences = tokio::spawn(watch_fences(
        FenceWatch::of(&grid),
        Arc::clone(&fences_done),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let client = LoadClient::new(Protocol::Http1, REQUEST_TIMEOUT);
    let uri: http::Uri = grid
        .chat_url()
        .parse()
        .map_err(|_| Error::Request("the gateway's URL".into()))?;
    let mut workers = JoinSet::new();
    for i in 0..WORKERS {
        workers.spawn(worker(
            client.clone(),
            uri.clone(),
            grid.published(),
            Arc::clone(&stop),
            i,
        ));
    }
    tokio::time::sleep(WARMUP).await;

    let mut row = Row {
        fault: fault.name(),
        ..Row::default()
    };
    let mut injected = inject(fault, &mut grid, &link, &control);
    let held = Stopwatch::start();
    let hold = fault.hold();
    let (to_exclude, seen) = watch_faulted(&grid, fault.site(), hold, out_of_preference).await;
    row.to_exclude = to_exclude;
    row.reason = match seen {
        SiteRouting::Excluded(reason) => Some(reason),
        SiteRouting::Candidate { .. } if to_exclude.is_some() => Some("unmeasured"),
        _ => None,
    };
    // A site that must stay in preference left it: what the gateway saw then goes in the
    // note, so the row explains itself.
    let unexpected = if to_exclude.is_some() && !fault.expects_exclusion() {
        gateway_said(&grid).await
    } else {
        String::new()
    };
    if let Some(rest) = hold.checked_sub(held.elapsed()) {
        tokio::time::sleep(rest).await;
    }

    let also = others_out(&grid, fault.site());
    let healed = heal(fault, &mut grid, &link, &control, &mut injected).await?;
    row.note = [healed.as_str(), also.as_str(), unexpected.as_str()]
        .into_iter()
        .filter(|n| !n.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    if row.to_exclude.is_some() || !fault.expects_exclusion() {
        let (to_rejoin, _) =
            watch_faulted(&grid, fault.site(), REJOIN_LIMIT, |r| !out_of_preference(r)).await;
        row.to_rejoin = to_rejoin;
    }

    stop.store(true, Ordering::Relaxed);
    row.evidence = settle_evidence(&grid, SITES[0]).await;
    while let Some(done) = workers.join_next().await {
        let Ok(t) = done else { continue };
        row.sent += t.sent;
        row.to_excluded += t.to_excluded;
        for (k, v) in t.statuses {
            *row.statuses.entry(k).or_default() += v;
        }
        for (k, v) in t.failures {
            *row.failures.entry(k).or_default() += v;
        }
        for (k, v) in t.by_site {
            *row.by_site.entry(k).or_default() += v;
        }
    }
    fences_done.store(true, Ordering::Relaxed);
    let mut fences = fences.await.unwrap_or_default();
    grid.shutdown().await;
    // After the graceful stop: the final fence writes must not fall below any earlier one.
    fences.read();
    row.fences_read = (fences.tracked(), fences.reads);
    row.fences_lost = fences.regressions;
    Ok(row)
}

/// Reads the state directories every [`FENCE_SAMPLE_EVERY`] until `done`; bounded by
/// the run's own bounds (it is stopped before the grid is).
async fn watch_fences(mut watch: FenceWatch, done: Arc<AtomicBool>) -> FenceWatch {
    while !done.load(Ordering::Relaxed) {
        watch.read();
        tokio::time::sleep(FENCE_SAMPLE_EVERY).await;
    }
    watch
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "—".to_owned(), |d| format!("{} ms", d.as_millis()))
}

fn pairs<K: std::fmt::Display>(m: &BTreeMap<K, u64>) -> String {
    if m.is_empty() {
        return "0".to_owned();
    }
    m.iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What became of `GatewayAgesRejected` once the evidence was persisted.
fn evidence_condition(e: &Evidence) -> String {
    match (e.unresolved, e.cleared_after) {
        (false, _) => String::new(),
        (true, Some(d)) => format!(
            ", GatewayAgesRejected True, cleared {} ms later",
            d.as_millis()
        ),
        (true, None) => ", GatewayAgesRejected still True".to_owned(),
    }
}

fn fences_column(r: &Row) -> String {
    let (tracked, reads) = r.fences_read;
    if r.fences_lost.is_empty() {
        format!("0 (of {tracked} over {reads} reads)")
    } else {
        r.fences_lost.join("; ")
    }
}

/// The markdown table of `rows`.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| fault | sent | answered (status: n) | 200s by site | failed (how: n) | 200s from an excluded site | out after | how | back after | fences lost | evidence observed / persisted | note |\n\
         | --- | ---: | --- | --- | --- | ---: | ---: | --- | ---: | --- | ---: | --- |\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {}{} | {} |",
            r.fault,
            r.sent,
            pairs(&r.statuses),
            pairs(&r.by_site),
            pairs(&r.failures),
            r.to_excluded,
            ms(r.to_exclude),
            r.reason.unwrap_or("—"),
            ms(r.to_rejoin),
            fences_column(r),
            r.evidence.observed,
            r.evidence.persisted,
            evidence_condition(&r.evidence),
            r.note,
        );
    }
    out
}
