//! Real operators at 3 to 20 sites on loopback, in either mode: how long a site's
//! zero-endpoint reading, and its return to ready endpoints, take to reach every other
//! site's relay (what its gateway reads), how long a dead site takes to be declared down everywhere, and the membership
//! bytes each site sends. The figures of the scale table in `docs/benchmarks.md` that a
//! simulation cannot give; `grid_sim::swim_scale` gives the 100 and 1,000 site ones.
//!
//! Every operator is a real driver (scrape loop, mTLS listener, SWIM on UDP, pollers or
//! gossip pulls) at the daemon's default intervals (1 s scrapes, 5 s peer polls), each
//! with a fake EPP. Loss is injected on the membership sockets
//! ([`grid_operatord::membership::LinkFaults`]); readings are taken from each operator's
//! store, which is what its relay serves.
#![allow(clippy::missing_panics_doc)] // a harness: every failure is the run's

use std::sync::Arc;
use std::time::Duration;

use grid_membership::Direction;
use grid_operatord::config::TransportMode;
use grid_operatord::driver::{self, Options, Running};
use grid_operatord::membership::LinkFaults;
use grid_operatord::state::{FileStateStore, StateStore};

use grid_kit::clock::Stopwatch;
use grid_kit::epp_server::{Behaviour, FakeEpp};
use grid_kit::operator_harness::{Grid, ProviderSpec, Site, epp_body, signals_url};
use grid_sim::swim_scale::Delays;

/// A peer URL nothing answers at: membership supplies the real one.
const NOWHERE: &str = "https://127.0.0.1:1/v1/site/signals";
/// How long one phase waits at most.
const PHASE_LIMIT: Duration = Duration::from_secs(60);

/// One run.
#[derive(Clone, Debug)]
pub struct Params {
    /// Sites.
    pub sites: usize,
    /// The signal transport.
    pub mode: TransportMode,
    /// Membership datagrams lost, per mille.
    pub loss_per_mille: u64,
    /// Readings changed (one site at a time) in the spread phase.
    pub changes: usize,
}

/// What a run measured; times in ms.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Per (change to zero ready endpoints, other site): time until that site's store
    /// held the zero, which takes the site out of selection; missed, the (change, site)
    /// pairs never reached within the phase.
    pub reach: Delays,
    /// The same for the changes back to ready endpoints (a count other than the last
    /// ready one): the site selectable again.
    pub rejoin: Delays,
    /// Per other site: time until its membership declared the dead site down; missed,
    /// the sites that had not within the phase.
    pub detect: Delays,
    /// Sealed membership datagram bytes each site sent per second in the spread phase.
    pub membership_bytes_per_site_s: f64,
    /// Signal body bytes each site served other sites per second in the same phase:
    /// relay bodies peers polled, batches and digests they pulled
    /// (`grid_operator_served_bytes_total`; headers and TLS framing not included).
    pub signal_bytes_per_site_s: f64,
}

fn ready_endpoints(op: &Running, site: &str) -> Option<f64> {
    let signals = grid_operatord::site_machine::lock(&op.signals);
    let entry = signals.all().entry(site, "m")?;
    entry
        .series("grid_provider_ready_endpoints")
        .next()
        .and_then(|s| s.latest())
        .map(|r| r.value)
}

async fn start(
    site: &Site,
    i: usize,
    p: &Params,
    epp: &FakeEpp,
    seed: Option<String>,
    faults: &Arc<LinkFaults>,
) -> Running {
    let peers: Vec<(String, String)> = (0..p.sites)
        .filter(|j| *j != i)
        .map(|j| {
            let url = if j == 0 { seed.clone() } else { None };
            (format!("s{j}"), url.unwrap_or_else(|| NOWHERE.to_owned()))
        })
        .collect();
    let peers: Vec<(&str, String)> = peers.iter().map(|(n, u)| (n.as_str(), u.clone())).collect();
    let mut config = site.config(&peers, &[ProviderSpec::of("m", epp)]);
    config.transport = p.mode;
    config.scrape_interval = Duration::from_secs(1);
    config.peer_poll_interval = Duration::from_secs(5);
    let state: Arc<dyn StateStore> = Arc::new(FileStateStore::open(site.state_dir()).unwrap());
    let options = Options {
        membership_faults: Some(faults.clone()),
        ..Options::default()
    };
    driver::start(config, None, state, options).await.unwrap()
}

/// Runs the phases: join, spread (changed readings), death.
pub async fn run(p: Params) -> Report {
    let grid = Grid::new();
    let sites: Vec<Site> = (0..p.sites).map(|i| grid.site(&format!("s{i}"))).collect();
    let mut epps = Vec::new();
    for _ in 0..p.sites {
        epps.push(FakeEpp::start(Behaviour::Body(epp_body(4, 1.0))).await);
    }
    let faults = Arc::new(LinkFaults::default());
    faults
        .loss_per_mille
        .store(p.loss_per_mille, std::sync::atomic::Ordering::Relaxed);
    let mut ops = vec![start(&sites[0], 0, &p, &epps[0], None, &faults).await];
    let seed = signals_url(ops[0].signals_addr);
    for i in 1..p.sites {
        ops.push(start(&sites[i], i, &p, &epps[i], Some(seed.clone()), &faults).await);
    }
    let all_hold = |ops: &[Running], value: f64| {
        ops.iter()
            .all(|op| (0..p.sites).all(|j| ready_endpoints(op, &format!("s{j}")) == Some(value)))
    };
    let joined = Stopwatch::start();
    while !all_hold(&ops, 4.0) && joined.elapsed() < PHASE_LIMIT {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut report = Report::default();
    let sent = |ops: &[Running]| -> u64 {
        ops.iter()
            .map(|op| op.membership_metrics.traffic_count(Direction::Sent).1)
            .sum()
    };
    let served = |ops: &[Running]| -> u64 {
        use grid_operatord::served::Served;
        ops.iter()
            .map(|op| {
                let s = &op.metrics.served;
                s.count(Served::RelayPeer) + s.count(Served::Batch) + s.count(Served::Digest)
            })
            .sum()
    };
    let (bytes0, served0, phase) = (sent(&ops), served(&ops), Stopwatch::start());
    let (mut reach, mut rejoin) = (Vec::new(), Vec::new());
    for k in 0..p.changes {
        // A change lands at a random offset from the pollers' and the scrapes' timers
        // (each change would otherwise start right after the poll that completed the last).
        let offset = (k as u64 * 2_654_435_761 + 12_345) % 5_000;
        tokio::time::sleep(Duration::from_millis(offset)).await;
        // Each site in turn reads zero, then back to three: out of selection and in again.
        let j = (k / 2) % p.sites;
        let value = if k % 2 == 0 { 0.0 } else { 3.0 };
        let running = if value == 0.0 { 0.0 } else { 1.0 };
        epps[j].set(Behaviour::Body(epp_body(value as u32, running)));
        let site = format!("s{j}");
        let changed = Stopwatch::start();
        let mut arrived: Vec<Option<u64>> = (0..p.sites).map(|i| (i == j).then_some(0)).collect();
        while arrived.iter().any(Option::is_none) && changed.elapsed() < PHASE_LIMIT {
            for (i, a) in arrived.iter_mut().enumerate() {
                if a.is_none() && ready_endpoints(&ops[i], &site) == Some(value) {
                    *a = Some(changed.elapsed().as_millis() as u64);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Both modes include the origin's wait for its next scrape (up to 1 s).
        let delays = if value == 0.0 {
            &mut reach
        } else {
            &mut rejoin
        };
        delays.extend(
            arrived
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != j)
                .map(|(_, a)| *a),
        );
    }
    report.reach = Delays::of(reach);
    report.rejoin = Delays::of(rejoin);
    let per_site_s = |bytes: u64| bytes as f64 / p.sites as f64 / phase.elapsed().as_secs_f64();
    report.membership_bytes_per_site_s = per_site_s(sent(&ops) - bytes0);
    report.signal_bytes_per_site_s = per_site_s(served(&ops) - served0);

    let victim = ops.pop().expect("at least one site");
    let victim_site = format!("s{}", p.sites - 1);
    drop(victim);
    let died = Stopwatch::start();
    let mut detected: Vec<Option<u64>> = vec![None; ops.len()];
    while detected.iter().any(Option::is_none) && died.elapsed() < PHASE_LIMIT {
        for (i, d) in detected.iter_mut().enumerate() {
            if d.is_none() && ops[i].membership.borrow().down.contains(&victim_site) {
                *d = Some(died.elapsed().as_millis() as u64);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    report.detect = Delays::of(detected);
    report
}
