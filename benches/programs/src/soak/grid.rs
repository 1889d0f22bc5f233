//! The soak's grid: the demo's three simulated sites in this process, and every daemon a
//! real process of its own (the `grid-operatord` and `grid-gatewayd` binaries), so each
//! one's memory, descriptors and threads can be read from `/proc`.
//!
//! ```text
//! sim a <-scrape- operator a <-poll- gateway --proxy--> sim a
//!                     |                      --proxy--> relay --> sim b, sim c
//!                     +--poll--> relay --> operator b (scrapes sim b), operator c (sim c)
//! big EPP (1 MiB, 400 endpoints) <-scrape every second- operator x (a grid of its own)
//! ```
//!
//! Every remote site sits behind two [`FaultRelay`]s, as in
//! `LocalGrid::start_with_links`: one before its operator's signals listener (operator a's
//! peer polls), one before its backend (the gateway's requests), both adding [`WAN`].
//! Everything listens on 127.0.0.1; certificates are minted into temporary directories
//! removed with the grid, and every process is killed when the grid is dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use grid_kit::Error;
use grid_kit::daemon_process::{Daemon, log_field};
use grid_kit::epp_server::{Behaviour, FakeEpp};
use grid_kit::fault_relay::{FaultControl, FaultRelay, WAN};
use grid_kit::local_grid::{Backend, Cadence, GridSpec, gateway_file};
use grid_kit::operator_harness::{DOMAIN, Grid, Site};
use grid_kit::pki::SiteFiles;
use grid_kit::sim_site::{SimSite, SimSiteControl};
use grid_signals::exposition::MAX_EXPOSITION_BYTES;

/// The provider name every site's operator publishes its backend under.
pub const PROVIDER: &str = "pool";
/// How long a daemon gets to log that it serves.
pub const START_WITHIN: Duration = Duration::from_secs(60);
/// How often operator x scrapes the big exposition.
pub const BIG_SCRAPE_EVERY: Duration = Duration::from_secs(1);
/// Endpoints in the big exposition (its per-endpoint series; the pool reads them ready).
pub const BIG_ENDPOINTS: u32 = 400;
/// Bytes left between the big exposition and the operator's 1 MiB cap: the body stays
/// just under it whatever the changing pool gauges' digits.
pub const BIG_HEADROOM_BYTES: usize = 256;
/// How the relays' jitter is seeded.
const RELAY_SEED: u64 = 1;

/// Where the daemons' binaries are.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// `grid-gatewayd`.
    pub gatewayd: PathBuf,
    /// `grid-operatord`.
    pub operatord: PathBuf,
}

impl Binaries {
    /// Beside this executable (a binary of `cargo build`), or one directory up (a test
    /// binary lives in `deps/` below the binaries `cargo test --workspace` builds).
    ///
    /// # Errors
    ///
    /// When either is not there: build them first (`cargo build -p grid-gatewayd -p
    /// grid-operatord`, with `--release` for a release run).
    pub fn beside_this_program() -> Result<Self, Error> {
        let exe = std::env::current_exe()?;
        let find = |name: &str| {
            exe.ancestors()
                .skip(1)
                .take(2)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
                .ok_or_else(|| {
                    Error::Request(format!(
                        "{name} is not beside {} nor one directory up: build it first \
                         (cargo build -p grid-gatewayd -p grid-operatord)",
                        exe.display()
                    ))
                })
        };
        Ok(Self {
            gatewayd: find("grid-gatewayd")?,
            operatord: find("grid-operatord")?,
        })
    }
}

/// A daemon process the soak watches.
pub struct Watched {
    /// Its name in the verdict (`gateway`, `operator a`...).
    pub name: String,
    /// The process.
    pub daemon: Daemon,
    /// Where its `/metrics` is served.
    pub metrics: SocketAddr,
}

/// A remote site's two relays.
struct Link {
    peer: FaultRelay,
    backend: FaultRelay,
}

/// The big exposition's EPP and the task that changes its pool gauges every scrape.
struct BigEpp {
    epp: FakeEpp,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for BigEpp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The running grid. Dropping it kills every daemon and stops every site and relay.
pub struct ProcessGrid {
    /// Every daemon: the gateway first, then operators a, b, c and x.
    pub watched: Vec<Watched>,
    sims: Vec<(String, SimSite)>,
    links: Vec<(String, Link)>,
    big: Option<BigEpp>,
    gateway_addr: SocketAddr,
    model: String,
    /// Holds the CA; each site's files live in its own temporary directory.
    _ca: Grid,
    _sites: Vec<Site>,
}

fn write_config(site: &Site, name: &str, text: &str) -> Result<PathBuf, Error> {
    let path = site.dir.path().join(name);
    std::fs::write(&path, text).map_err(|source| Error::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

fn seconds(ms: u64) -> f64 {
    ms as f64 / 1e3
}

/// An operator's configuration file: SPIFFE trust, `network`, the signals listener at
/// `signals`, these cadences, peers and one provider.
pub fn operator_text(
    site: &Site,
    network: &str,
    signals: &str,
    cadence: Cadence,
    peers: &[(&str, String)],
    provider_url: &str,
) -> String {
    use std::fmt::Write as _;
    let d = site.dir.path();
    let mut text = format!(
        "site = \"{name}\"\nnetwork = \"{network}\"\nstateDir = \"{state}\"\n\
         [listen]\nsignals = \"{signals}\"\nmetrics = \"127.0.0.1:0\"\n\
         [tls]\ncert = \"{cert}\"\nkey = \"{key}\"\nca = \"{ca}\"\n\
         [trust]\nmode = \"spiffe\"\ntrustDomain = \"{DOMAIN}\"\n\
         [signalTransport]\nmode = \"poll\"\n\
         [intervals]\nscrapeSeconds = {scrape}\npeerPollSeconds = {peer}\n",
        name = site.name,
        state = site.state_dir().display(),
        cert = d.join("site.crt").display(),
        key = d.join("site.key").display(),
        ca = d.join("ca.crt").display(),
        scrape = seconds(cadence.scrape_ms),
        peer = seconds(cadence.peer_poll_ms),
    );
    for (name, url) in peers {
        let _ = writeln!(
            text,
            "[[peers]]\nname = \"{name}\"\nurl = \"{url}\"\ntimeoutSeconds = {}",
            seconds(cadence.peer_poll_ms.clamp(1_000, 2_000))
        );
    }
    let _ = writeln!(
        text,
        "[[providers]]\nname = \"{PROVIDER}\"\nurl = \"{provider_url}\"\ntimeoutSeconds = {}",
        seconds(cadence.scrape_ms.clamp(500, 1_000))
    );
    text
}

/// The gateway's configuration file at `site` (the grid's first): the local grid's
/// (`local_grid::gateway_file`) listening on an ephemeral port, with SPIFFE trust.
pub fn gateway_text(
    site: &Site,
    spec: &GridSpec,
    operator: SocketAddr,
    candidates: &[(&str, String)],
) -> String {
    let d = site.dir.path();
    let files = SiteFiles {
        cert: d.join("site.crt"),
        key: d.join("site.key"),
        ca: d.join("ca.crt"),
    };
    let candidates: Vec<(&str, &str)> = candidates.iter().map(|(s, u)| (*s, u.as_str())).collect();
    let text = gateway_file(spec, &files, operator, &candidates).replace("{listen}", "127.0.0.1:0");
    format!("{text}[trust]\nmode = \"spiffe\"\ntrustDomain = \"{DOMAIN}\"\n")
}

/// The big exposition's pool gauges, changing with `seq`: what makes it a reading the
/// operator relays (400 endpoints ready), not only bytes it parses.
fn big_head(seq: u64) -> String {
    let running = 100 + seq % 300;
    let queue = seq % 7;
    format!(
        "# TYPE llm_d_epp_ready_endpoints gauge\n\
         llm_d_epp_ready_endpoints{{name=\"{PROVIDER}\"}} {BIG_ENDPOINTS}\n\
         # TYPE llm_d_epp_average_running_requests gauge\n\
         llm_d_epp_average_running_requests{{name=\"{PROVIDER}\"}} {running}\n\
         # TYPE llm_d_epp_average_queue_size gauge\n\
         llm_d_epp_average_queue_size{{name=\"{PROVIDER}\"}} {queue}\n\
         # TYPE llm_d_epp_average_kv_cache_utilization gauge\n\
         llm_d_epp_average_kv_cache_utilization{{name=\"{PROVIDER}\"}} 0.{queue}5\n"
    )
}

/// The big exposition's body for scrape `seq`: the pool gauges, then the deterministic
/// 400-endpoint EPP-shaped exposition ([`grid_sim::epp_exposition`]) filling it to just
/// under the 1 MiB cap.
pub fn big_body(seq: u64, tail: &str) -> Vec<u8> {
    let mut body = big_head(seq).into_bytes();
    body.extend_from_slice(tail.as_bytes());
    body
}

/// The part of the big body that never changes, sized so the whole stays under the cap.
pub fn big_tail() -> String {
    let head_most = big_head(u64::MAX).len() + 16;
    grid_sim::epp_exposition::epp_exposition(MAX_EXPOSITION_BYTES - head_most - BIG_HEADROOM_BYTES)
}

async fn start_big_epp() -> BigEpp {
    let tail = big_tail();
    let epp = FakeEpp::start(Behaviour::Body(big_body(0, &tail))).await;
    let behaviour = std::sync::Arc::clone(&epp.behaviour);
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(BIG_SCRAPE_EVERY);
        for seq in 1.. {
            tick.tick().await;
            let body = big_body(seq, &tail);
            if let Ok(mut b) = behaviour.lock() {
                *b = Behaviour::Body(body);
            }
        }
    });
    BigEpp { epp, task }
}

/// Starts `binary` on `config` and waits for `needle`; returns it with the line.
fn spawn(binary: &Path, config: &Path, needle: &str) -> (Daemon, String) {
    let config = config.to_string_lossy().into_owned();
    let mut daemon = Daemon::spawn(binary, &["--config", config.as_str()]);
    let line = daemon.wait_for_line(needle, START_WITHIN);
    (daemon, line)
}

fn addr_field(line: &str, key: &str) -> Result<SocketAddr, Error> {
    log_field(line, key)
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| Error::Request(format!("no {key} in {line:?}")))
}

/// Starts an operator process; returns it watched, with its signals address.
fn start_operator(
    binaries: &Binaries,
    site: &Site,
    text: &str,
) -> Result<(Watched, SocketAddr), Error> {
    let config = write_config(site, "operator.toml", text)?;
    let (daemon, line) = spawn(&binaries.operatord, &config, "operator started");
    let signals = addr_field(&line, "signals_addr")?;
    let metrics = addr_field(&line, "metrics_addr")?;
    Ok((
        Watched {
            name: format!("operator {}", site.name),
            daemon,
            metrics,
        },
        signals,
    ))
}

impl ProcessGrid {
    /// Starts the sites of `spec` (every one simulated; the first is the gateway's), their
    /// operators, the relays, the gateway and, with `big`, operator x on the big
    /// exposition.
    ///
    /// # Errors
    ///
    /// When a site, relay or daemon cannot be started, or a backend is not simulated.
    ///
    /// # Panics
    ///
    /// When a daemon does not log that it serves within [`START_WITHIN`] (its stderr is
    /// in the message).
    pub async fn start(spec: &GridSpec, binaries: &Binaries, big: bool) -> Result<Self, Error> {
        let ca = Grid::new();
        let mut sims = Vec::new();
        for s in &spec.sites {
            let Backend::Simulated(config) = &s.backend else {
                return Err(Error::Request(format!("site {} is not simulated", s.name)));
            };
            sims.push((s.name.clone(), SimSite::start(config.clone()).await?));
        }
        let sites: Vec<Site> = spec.sites.iter().map(|s| ca.site(&s.name)).collect();
        let local = grid_kit::ports::loopback_addr();
        let local_url = format!("https://{local}/v1/site/signals");
        let mut watched = Vec::new();
        let mut links = Vec::new();
        let mut peers = Vec::new();
        let mut candidates = vec![(spec.sites[0].name.as_str(), sims[0].1.url(""))];
        for (i, s) in spec.sites.iter().enumerate().skip(1) {
            let text = operator_text(
                &sites[i],
                "soak",
                "127.0.0.1:0",
                spec.cadence,
                &[(spec.sites[0].name.as_str(), local_url.clone())],
                &sims[i].1.url(""),
            );
            let (op, signals) = start_operator(binaries, &sites[i], &text)?;
            watched.push(op);
            let seed = RELAY_SEED.wrapping_mul(0x100).wrapping_add(i as u64 * 3);
            let peer = FaultRelay::start(signals, seed).await?;
            let backend = FaultRelay::start(sims[i].1.addr(), seed + 1).await?;
            peer.control().set_delay_both(WAN);
            backend.control().set_delay_both(WAN);
            peers.push((
                s.name.as_str(),
                format!("https://{}/v1/site/signals", peer.addr()),
            ));
            candidates.push((s.name.as_str(), format!("http://{}", backend.addr())));
            links.push((s.name.clone(), Link { peer, backend }));
        }
        let text = operator_text(
            &sites[0],
            "soak",
            &local.to_string(),
            spec.cadence,
            &peers,
            &sims[0].1.url(""),
        );
        let (op, _) = start_operator(binaries, &sites[0], &text)?;
        watched.insert(0, op);

        let config = write_config(
            &sites[0],
            "gateway.toml",
            &gateway_text(&sites[0], spec, local, &candidates),
        )?;
        let (daemon, line) = spawn(&binaries.gatewayd, &config, "gateway serving");
        let gateway_addr = addr_field(&line, "local_addr")?;
        watched.insert(
            0,
            Watched {
                name: "gateway".into(),
                daemon,
                metrics: gateway_addr,
            },
        );

        let mut all_sites = sites;
        let big = if big {
            let epp = start_big_epp().await;
            let site = ca.site("x");
            let cadence = Cadence {
                scrape_ms: BIG_SCRAPE_EVERY.as_millis() as u64,
                ..Cadence::DEFAULT
            };
            let text = operator_text(&site, "big", "127.0.0.1:0", cadence, &[], &epp.epp.url());
            let (op, _) = start_operator(binaries, &site, &text)?;
            watched.push(op);
            all_sites.push(site);
            Some(epp)
        } else {
            None
        };
        Ok(Self {
            watched,
            sims,
            links,
            big,
            gateway_addr,
            model: spec.model.clone(),
            _ca: ca,
            _sites: all_sites,
        })
    }

    /// `http://<gateway>/v1/chat/completions`.
    pub fn chat_url(&self) -> String {
        format!("http://{}/v1/chat/completions", self.gateway_addr)
    }

    /// The gateway's address.
    pub fn gateway_addr(&self) -> SocketAddr {
        self.gateway_addr
    }

    /// The model served.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The site names, the gateway's first.
    pub fn site_names(&self) -> Vec<String> {
        self.sims.iter().map(|(n, _)| n.clone()).collect()
    }

    /// A simulated site's control handle.
    pub fn control(&self, site: &str) -> Option<SimSiteControl> {
        self.sims
            .iter()
            .find(|(n, _)| n == site)
            .map(|(_, s)| s.control())
    }

    /// A remote site's relay controls: (its peer link, its request link).
    pub fn link(&self, site: &str) -> Option<(FaultControl, FaultControl)> {
        self.links
            .iter()
            .find(|(n, _)| n == site)
            .map(|(_, l)| (l.peer.control(), l.backend.control()))
    }

    /// Scrapes of the big exposition so far (`None` without one).
    pub fn big_scrapes(&self) -> Option<usize> {
        self.big.as_ref().map(|b| {
            b.epp
                .stats
                .requests
                .load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    /// Asks every daemon to stop (`SIGTERM`), waits up to `within` for each, then stops
    /// the sites. A daemon still running is killed when the grid is dropped.
    pub async fn stop(mut self, within: Duration) {
        for w in &self.watched {
            w.daemon.signal("TERM");
        }
        let mut watched = std::mem::take(&mut self.watched);
        let _ = tokio::task::spawn_blocking(move || {
            for w in &mut watched {
                let _ = w.daemon.wait_exit(within);
            }
        })
        .await;
        for (_, sim) in self.sims.drain(..) {
            sim.stop().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_big_body_stays_just_under_the_cap_whatever_its_gauges_read() {
        let tail = big_tail();
        for seq in [0, 1, 299, 12_345, u64::MAX] {
            let n = big_body(seq, &tail).len();
            assert!(n <= MAX_EXPOSITION_BYTES, "{n}");
            // The filler ends at a whole series line, so the body falls short of the
            // size asked for by less than one line of the exposition's longest family.
            assert!(
                n >= MAX_EXPOSITION_BYTES - 8 * 1024,
                "{n}: just under 1 MiB"
            );
        }
        assert!(tail.matches("llm_d_epp_per_endpoint_queue_size{").count() == 400);
    }

    #[test]
    fn the_big_body_is_a_valid_exposition_with_the_pool_reading() {
        let body = big_body(7, &big_tail());
        let mut ready = None;
        for line in grid_signals::exposition::lines(&body) {
            if let grid_signals::exposition::Line::Sample(s) = line.unwrap()
                && s.name == "llm_d_epp_ready_endpoints"
            {
                ready = Some(s.value);
            }
        }
        assert_eq!(ready, Some(f64::from(BIG_ENDPOINTS)));
    }

    #[test]
    fn the_operator_and_gateway_files_parse_as_their_daemons_read_them() {
        let ca = Grid::new();
        let site = ca.site("a");
        let text = operator_text(
            &site,
            "soak",
            "127.0.0.1:0",
            Cadence::FAST,
            &[("b", "https://127.0.0.1:9/v1/site/signals".into())],
            "http://127.0.0.1:8000",
        );
        let c = grid_operatord::config::Config::from_toml(&text, Path::new("o.toml")).unwrap();
        assert_eq!(c.scrape_interval, Duration::from_millis(200));
        assert_eq!(c.peers.len(), 1);
        let spec = crate::demo::grid_spec(Cadence::FAST, 1);
        let text = gateway_text(
            &site,
            &spec,
            "127.0.0.1:9".parse().unwrap(),
            &[
                ("a", "http://127.0.0.1:1".into()),
                ("b", "http://127.0.0.1:2".into()),
            ],
        );
        let g = grid_gateway::Config::from_toml_str(&text).unwrap();
        assert_eq!(g.models[0].candidates.len(), 2);
        assert!(g.availability.shedding.enabled);
    }
}
