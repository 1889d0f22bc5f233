//! Several Kubernetes clusters on one machine, each a site of one grid: every site in a
//! network namespace of its own on a shared switch ([`crate::netns::Lan`]), with its own
//! etcd and kube-apiserver ([`crate::kube_cluster::start_in`]), configured only by
//! applying the example manifests (`docs/examples/kubernetes/`) with the site's names,
//! addresses and certificates, then running what those manifests deploy:
//!
//! - the operator in controller mode (the default transport, gossip), as the example
//!   RBAC's `ServiceAccount`, with the Lease's election, listening where the Deployment
//!   says (`0.0.0.0:9443` for signals over TCP and UDP, `0.0.0.0:9090` for metrics);
//! - the gateway with the configuration the applied `ConfigMap` holds (`operator.catalog`:
//!   its models and candidates follow the resources);
//! - the site's provider, one of two model servers: grid's simulated model server with its
//!   EPP (`crate::sim_site`), or llm-d's own programs (`crate::llmd`: the real EPP
//!   against the site's API server, real inference simulators as the `Pod`s of its
//!   `InferencePool`, Envoy as its data path), all inside the site's namespace;
//! - the site's serving front: TLS on `:8443` with client certificates of the grid CA, in
//!   front of the model server, where the other sites' gateways send this site's share.
//!
//! There is no kubelet: the daemons run in this process, on runtimes whose threads live in
//! the site's namespace, and the site's TLS `Secret` is projected into files by
//! [`KubeGrid::project_secret`] as a kubelet mounts it (read back from the API server,
//! written key first). What the API server holds is the only configuration they get.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use grid_daemon::tls::Fingerprint;
use grid_operatord::controller::api::{self, ControllerMetrics};
use grid_operatord::controller::run::{self, Election, StartedDriver};
use grid_operatord::controller::source::KubeConfigSource;
use grid_operatord::controller::translate::Deployment;
use grid_sim::site_model::SiteConfig;
use tokio::sync::{oneshot, watch};

use crate::Error;
use crate::kube_cluster::{Cluster, Credentials, Keeper, repo_dir, start_in, write_kubeconfig};
use crate::llmd::{LlmdSite, LlmdSpec, Placement};
use crate::netns::Lan;
use crate::pki::{Ca, Mint, SiteCert, TRUST_DOMAIN};
use crate::sim_site::{SimSite, SimSiteConfig};

/// The model every example site serves (`docs/examples/kubernetes/resources.yaml`).
pub const MODEL: &str = "llama-3.1-8b-instruct";
/// The signals port the example Deployment and Service name (TCP and UDP).
pub const SIGNALS_PORT: u16 = 9443;
/// The metrics port of the example Deployment.
pub const METRICS_PORT: u16 = 9090;
/// The gateway's port in the example `ConfigMap`.
pub const GATEWAY_PORT: u16 = 8080;
/// The serving front's port the example `GridSite`s name.
pub const FRONT_PORT: u16 = 8443;
/// The `InferenceProvider`'s pool in the example (`spec.pool`).
pub const EXAMPLE_POOL: &str = "llama-pool";
/// The model servers' median service time: short, so a test's traffic takes seconds.
pub const SERVICE_MEDIAN_MS: f64 = 200.0;
/// The example's fingerprints, replaced by each site's own.
const EXAMPLE_PINS: [(&str, &str); 2] = [
    (
        "a",
        "5C:62:0B:E4:19:A7:3D:88:F1:06:C2:7B:94:DE:21:53:0A:BF:67:E8:3C:15:A9:72:D4:4E:81:B6:2F:C0:98:1D",
    ),
    (
        "b",
        "3A:1F:9C:00:5B:77:E2:41:0D:6C:8A:93:F4:12:BE:55:07:C9:2E:68:AB:31:D0:4F:96:7E:15:C3:88:2A:B6:F0",
    ),
];
/// The Lease timing of the sites' operators: shorter than the default, so a killed
/// writer's successor takes over within seconds.
pub const LEASE: grid_operatord::controller::lease::Timing =
    grid_operatord::controller::lease::Timing {
        duration: Duration::from_secs(3),
        renew: Duration::from_secs(1),
    };

/// What one site is: its name and its model server.
#[derive(Clone, Debug)]
pub struct SiteSpec {
    /// The site's name (`a`, `b`, ...): its namespace is `grid-site-<name>`.
    pub name: String,
    /// What serves its provider.
    pub server: ModelServer,
}

impl SiteSpec {
    /// Site `name` served by grid's simulated model server of `endpoints` x `slots`.
    #[must_use]
    pub fn simulated(name: &str, endpoints: usize, slots: usize) -> Self {
        Self {
            name: name.to_owned(),
            server: ModelServer::Simulated { endpoints, slots },
        }
    }

    /// Site `name` served by llm-d's real EPP and simulators as `spec` says (its pool
    /// is the provider's `pool`; its model is set to [`MODEL`]).
    #[must_use]
    pub fn llmd(name: &str, spec: LlmdSpec) -> Self {
        Self {
            name: name.to_owned(),
            server: ModelServer::Llmd(spec),
        }
    }

    /// One simulated site per `(endpoints, slots)` of `sizes`, named `a`, `b`, ... in
    /// order.
    pub fn sized(sizes: &[(usize, usize)]) -> Vec<Self> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &(endpoints, slots))| Self::simulated(&site_name(i), endpoints, slots))
            .collect()
    }
}

/// A site's model server, behind its provider.
#[derive(Clone, Debug)]
pub enum ModelServer {
    /// grid's simulated model server and its EPP (`crate::sim_site`).
    Simulated {
        /// Serving endpoints.
        endpoints: usize,
        /// Slots per endpoint.
        slots: usize,
    },
    /// llm-d's real EPP, inference simulators and Envoy (`crate::llmd`), in the site's
    /// Kubernetes namespace on its own API server.
    Llmd(LlmdSpec),
}

/// A running model server.
enum Server {
    Simulated(SimSite),
    Llmd(Box<LlmdSite>),
}

impl Server {
    /// Where its `OpenAI` API is, on the site namespace's loopback.
    fn api(&self) -> SocketAddr {
        match self {
            Self::Simulated(sim) => sim.addr(),
            Self::Llmd(site) => site.envoy,
        }
    }

    /// Its EPP's base URL and its `OpenAI` base URL, as the site's operator and gateway
    /// reach them.
    fn urls(&self) -> (String, String) {
        match self {
            Self::Simulated(sim) => {
                let url = format!("http://{}", sim.addr());
                (url.clone(), url)
            }
            Self::Llmd(site) => (format!("http://{}", site.epp_metrics), site.api_url()),
        }
    }
}

/// One running site.
pub struct KubeSite {
    /// Its name.
    pub name: String,
    /// Its Kubernetes namespace.
    pub namespace: String,
    /// Its address on the LAN.
    pub addr: Ipv4Addr,
    /// Its API server.
    pub cluster: Arc<Cluster>,
    /// Where the `Secret` is projected (`tls.crt`, `tls.key`, `ca.crt`).
    pub tls_dir: PathBuf,
    /// The operator's kubeconfig (its `ServiceAccount`'s token).
    pub operator_kubeconfig: PathBuf,
    /// Its current certificate.
    pub cert: SiteCert,
    /// The running operator, if any.
    pub operator: Option<RunningOperator>,
    /// The running gateway.
    pub gateway: Option<grid_gatewayd::driver::Running>,
    server: Option<Server>,
    front: Option<tokio::task::JoinHandle<()>>,
    keeper: Option<Keeper>,
    replicas: u32,
}

impl std::fmt::Debug for KubeSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSite")
            .field("name", &self.name)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl KubeSite {
    /// Its llm-d model server, when it has one.
    #[must_use]
    pub fn llmd(&self) -> Option<&LlmdSite> {
        match &self.server {
            Some(Server::Llmd(site)) => Some(site),
            _ => None,
        }
    }

    /// Its llm-d model server, to change (pods removed or added).
    pub fn llmd_mut(&mut self) -> Option<&mut LlmdSite> {
        match &mut self.server {
            Some(Server::Llmd(site)) => Some(site),
            _ => None,
        }
    }
}

/// An operator started in-process from its site's resources.
pub struct RunningOperator {
    /// Its driver starts.
    pub started: watch::Receiver<Option<StartedDriver>>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), grid_operatord::Error>>,
    /// The error it ended with, kept for a failure message (its task is awaited only
    /// when the grid stops).
    failed: watch::Receiver<Option<String>>,
}

impl std::fmt::Debug for RunningOperator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningOperator").finish_non_exhaustive()
    }
}

/// The grid.
pub struct KubeGrid {
    /// The sites, in spec order.
    pub sites: Vec<KubeSite>,
    /// The grid CA.
    pub ca: Ca,
    /// Where the sites' files are.
    pub dir: tempfile::TempDir,
    lan: Lan,
}

impl std::fmt::Debug for KubeGrid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeGrid")
            .field("sites", &self.sites)
            .finish_non_exhaustive()
    }
}

fn err(e: impl std::fmt::Display) -> Error {
    Error::Request(e.to_string())
}

/// Runs `f` on `handle` (a site's namespace) and waits for it here.
async fn on<T: Send + 'static>(
    handle: &tokio::runtime::Handle,
    f: impl Future<Output = T> + Send + 'static,
) -> T {
    handle.spawn(f).await.expect("a task in a site's namespace")
}

fn example(file: &str) -> Result<String, Error> {
    std::fs::read_to_string(repo_dir().join("docs/examples/kubernetes").join(file)).map_err(err)
}

/// The example resources for the grid's sites: the example's `GridSite` b repeated for
/// every site past the example's two.
fn grid_resources(names: &[&str]) -> Result<String, Error> {
    let text = example("resources.yaml")?;
    let docs: Vec<&str> = text.split("\n---\n").collect();
    let b = docs
        .iter()
        .find(|d| d.contains("kind: GridSite") && d.contains("\n  name: b\n"))
        .ok_or_else(|| err("the example has no GridSite b"))?;
    let mut out = Vec::new();
    for d in &docs {
        out.push((*d).to_owned());
        if std::ptr::eq(*d, *b) {
            for n in names.iter().skip(2) {
                out.push(
                    b.replace("\n  name: b\n", &format!("\n  name: {n}\n"))
                        .replace("grid-b.example.com", &format!("grid-{n}.example.com"))
                        .replace(EXAMPLE_PINS[1].1, &format!("PIN-OF-{n}")),
                );
            }
        }
    }
    Ok(out.join("\n---\n"))
}

impl KubeGrid {
    /// Starts every site: a LAN, an API server per site, the example manifests applied,
    /// the daemons they deploy running. Returns once every gateway serves (the grid may
    /// still be forming: see [`KubeGrid::wait_formed`]).
    ///
    /// # Errors
    ///
    /// When namespaces cannot be made (not root), the peers are not built, or a site
    /// does not start.
    pub async fn start(specs: &[SiteSpec]) -> Result<Self, Error> {
        let lan = Lan::create(specs.len())?;
        let dir = tempfile::tempdir().map_err(err)?;
        let ca = Ca::try_new("grid kube CA").map_err(err)?;
        // The API servers, all at once (each takes seconds).
        let clusters: Vec<_> = lan
            .sites
            .iter()
            .map(|s| {
                let ns = s.name.clone();
                std::thread::spawn(move || start_in(&ns))
            })
            .collect();
        let mut clusters_up = Vec::new();
        for t in clusters {
            clusters_up.push(
                t.join()
                    .map_err(|_| err("a cluster's start panicked"))?
                    .map_err(err)?,
            );
        }
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        let certs: Vec<SiteCert> = names.iter().map(|n| ca.site(TRUST_DOMAIN, n)).collect();
        let mut resources = grid_resources(&names)?;
        for (i, n) in names.iter().enumerate() {
            let addr = lan.sites[i].addr;
            resources = resources.replace(&format!("grid-{n}.example.com"), &addr.to_string());
            let pin = Fingerprint::of_der(&certs[i].cert).to_string();
            let placeholder = EXAMPLE_PINS
                .iter()
                .find(|(s, _)| s == n)
                .map_or_else(|| format!("PIN-OF-{n}"), |(_, p)| (*p).to_owned());
            resources = resources.replace(&placeholder, &pin);
        }
        let mut sites = Vec::new();
        for (i, ((spec, (cluster, keeper)), cert)) in
            specs.iter().zip(clusters_up).zip(certs).enumerate()
        {
            let site = start_site(
                &lan,
                i,
                spec,
                (cluster, keeper),
                cert,
                &ca,
                &resources,
                dir.path(),
            )
            .await?;
            sites.push(site);
        }
        let mut grid = Self {
            sites,
            ca,
            dir,
            lan,
        };
        for i in 0..grid.sites.len() {
            grid.start_operator(i)?;
        }
        for i in 0..grid.sites.len() {
            grid.start_gateway(i).await?;
        }
        Ok(grid)
    }

    /// The site's namespace runtime.
    pub fn handle(&self, i: usize) -> &tokio::runtime::Handle {
        self.lan.sites[i].handle()
    }

    /// Reads site `i`'s TLS `Secret` back from its API server and writes its keys into
    /// the site's TLS folder, the key before the certificate, as a kubelet projects a
    /// mounted `Secret`.
    ///
    /// # Errors
    ///
    /// kubectl's failure, or a file that cannot be written.
    pub fn project_secret(&self, i: usize) -> Result<(), Error> {
        project(&self.sites[i])
    }

    /// Starts site `i`'s operator (again), as a new replica of its Deployment would be:
    /// a new identity in the Lease.
    ///
    /// # Errors
    ///
    /// When its resources cannot be read within the start bound.
    pub fn start_operator(&mut self, i: usize) -> Result<(), Error> {
        let handle = self.handle(i).clone();
        let site = &mut self.sites[i];
        site.replicas += 1;
        let identity = format!("grid-operator-{}-{}", site.name, site.replicas);
        let deployment = Deployment {
            site: site.name.clone(),
            listen: grid_operatord::config::Listen {
                signals: SocketAddr::from(([0, 0, 0, 0], SIGNALS_PORT)),
                metrics: SocketAddr::from(([0, 0, 0, 0], METRICS_PORT)),
            },
            tls: grid_operatord::config::TlsFiles {
                cert: site.tls_dir.join("tls.crt"),
                key: site.tls_dir.join("tls.key"),
                ca: Some(site.tls_dir.join("ca.crt")),
            },
            state_label: format!("ConfigMap/grid-site-{}", site.name).into(),
        };
        let (kubeconfig, namespace) = (site.operator_kubeconfig.clone(), site.namespace.clone());
        let (tx, started) = watch::channel(None);
        let (stop, stopped) = oneshot::channel::<()>();
        let (kept, failed) = watch::channel(None);
        // Spawned on the site's runtime: its connections are made in its namespace.
        let task = handle.spawn(async move {
            let ended =
                run_operator(kubeconfig, namespace, deployment, identity, tx, stopped).await;
            if let Err(e) = &ended {
                kept.send_replace(Some(e.to_string()));
            }
            ended
        });
        site.operator = Some(RunningOperator {
            started,
            stop: Some(stop),
            task,
            failed,
        });
        Ok(())
    }

    /// Kills site `i`'s operator at once, as a crashed pod: no graceful stop, its Lease
    /// left to lapse.
    pub fn kill_operator(&mut self, i: usize) {
        if let Some(op) = self.sites[i].operator.take() {
            op.task.abort();
        }
    }

    /// Site `i`'s operator's driver once it runs (a writer: it holds the Lease).
    ///
    /// # Errors
    ///
    /// When it does not within `limit`, or has ended.
    pub async fn operator_running(
        &mut self,
        i: usize,
        limit: Duration,
    ) -> Result<StartedDriver, Error> {
        let op = self.sites[i]
            .operator
            .as_mut()
            .ok_or_else(|| err("no operator"))?;
        let wait = op.started.wait_for(Option::is_some);
        let started = tokio::time::timeout(limit, wait)
            .await
            .map_err(|_| {
                err(format!(
                    "site {i}'s operator did not start within {limit:?}"
                ))
            })?
            .map_err(err)?
            .clone();
        started.ok_or_else(|| err("no driver"))
    }

    async fn start_gateway(&mut self, i: usize) -> Result<(), Error> {
        let site = &self.sites[i];
        // The gateway's configuration is what the applied ConfigMap holds.
        let text = site
            .cluster
            .kubectl(
                &[
                    "get",
                    "configmap",
                    "grid-gateway",
                    "-n",
                    &site.namespace,
                    "-o",
                    "jsonpath={.data.gateway\\.toml}",
                ],
                None,
            )
            .map_err(err)?;
        // Where the example names the Service and the mounted Secret, this site's
        // operator is on its namespace's loopback and its Secret projected here.
        let text = text
            .replace(
                &format!(
                    "https://grid-operator-signals.{}.svc:{SIGNALS_PORT}",
                    site.namespace
                ),
                &format!("https://127.0.0.1:{SIGNALS_PORT}"),
            )
            .replace(
                &format!(
                    "identity = \"grid-operator-signals.{}.svc\"",
                    site.namespace
                ),
                "identity = \"127.0.0.1\"",
            )
            .replace("/etc/grid/tls", &site.tls_dir.display().to_string());
        let config = grid_gateway::config::Config::from_toml_str(&text)?;
        let gateway = on(self.handle(i), grid_gatewayd::driver::start(config)).await?;
        self.sites[i].gateway = Some(gateway);
        Ok(())
    }

    /// Waits until every gateway routes the model to every site (each site's provider in
    /// its catalog) and every site's relay holds every site's provider: the grid formed
    /// from the resources alone.
    ///
    /// # Errors
    ///
    /// When it has not within `limit`.
    pub async fn wait_formed(&self, limit: Duration) -> Result<Duration, Error> {
        let began = crate::clock::Stopwatch::start();
        let names: Vec<String> = self.sites.iter().map(|s| s.name.clone()).collect();
        loop {
            let mut formed = true;
            for (i, s) in self.sites.iter().enumerate() {
                let routed = s.gateway.as_ref().is_some_and(|g| {
                    let view = g.published().load();
                    view.catalog().get(MODEL).is_some_and(|m| {
                        names
                            .iter()
                            .all(|n| m.upstreams.iter().any(|u| &*u.site == n.as_str()))
                    })
                });
                formed &= routed && self.relay_holds_all(i).await;
            }
            if formed {
                return Ok(began.elapsed());
            }
            if began.elapsed() > limit {
                return Err(err(format!(
                    "the grid did not form within {limit:?}: {}",
                    self.describe().await
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// What each site's gateway routes and its operator holds, for a failure message.
    pub async fn describe(&self) -> String {
        let mut out = String::new();
        for (i, s) in self.sites.iter().enumerate() {
            let routed: Vec<String> = s.gateway.as_ref().map_or_else(Vec::new, |g| {
                let view = g.published().load();
                view.catalog()
                    .models()
                    .iter()
                    .map(|m| {
                        let sites: Vec<&str> = m.upstreams.iter().map(|u| &*u.site).collect();
                        format!("{}: {sites:?}", m.name)
                    })
                    .collect()
            });
            let started = s
                .operator
                .as_ref()
                .and_then(|o| o.started.borrow().as_ref().map(|d| d.epoch));
            let finished = s.operator.as_ref().is_some_and(|o| o.task.is_finished());
            let failed = s.operator.as_ref().and_then(|o| o.failed.borrow().clone());
            let ready = self.ready_lines(i).await;
            let _ = write!(
                out,
                "\n  site {}: operator epoch {started:?} (ended: {finished}, failed: {failed:?}); gateway routes {routed:?}; operator's readiness {ready:?}",
                s.name
            );
            if finished {
                let _ = write!(
                    out,
                    "\n    its namespace's sockets on the operator's ports: {:?}",
                    sockets_on(&self.lan.sites[i].name, &[METRICS_PORT, SIGNALS_PORT])
                );
            }
        }
        out
    }

    /// The `/metrics` page on `port` in site `i`'s namespace ([`METRICS_PORT`]: its
    /// operator's; [`GATEWAY_PORT`]: its gateway's).
    ///
    /// # Errors
    ///
    /// When it does not answer within 2 s.
    ///
    /// # Panics
    ///
    /// When site `i` does not exist.
    pub async fn metrics(&self, i: usize, port: u16) -> Result<String, Error> {
        let metrics = format!("http://127.0.0.1:{port}/metrics");
        let (_, body) = on(self.handle(i), async move {
            let client =
                crate::load::LoadClient::new(crate::load::Protocol::Http1, Duration::from_secs(2));
            client.get(&metrics.parse().expect("a URL")).await
        })
        .await?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    async fn ready_lines(&self, i: usize) -> Vec<String> {
        match self.metrics(i, METRICS_PORT).await {
            Ok(body) => body
                .lines()
                .filter(|l| {
                    l.starts_with("grid_provider_ready{")
                        || l.starts_with("grid_membership_members{")
                })
                .map(str::to_owned)
                .collect(),
            Err(e) => vec![e.to_string()],
        }
    }

    /// Whether site `i`'s relay (what its gateway polls) holds every site's provider.
    ///
    /// # Panics
    ///
    /// When site `i` does not exist.
    pub async fn relay_holds_all(&self, i: usize) -> bool {
        let names: Vec<String> = self.sites.iter().map(|s| s.name.clone()).collect();
        let metrics = format!("http://127.0.0.1:{METRICS_PORT}/metrics");
        let got = on(self.handle(i), async move {
            let client =
                crate::load::LoadClient::new(crate::load::Protocol::Http1, Duration::from_secs(2));
            client.get(&metrics.parse().expect("a URL")).await
        })
        .await;
        let Ok((status, body)) = got else {
            return false;
        };
        let text = String::from_utf8_lossy(&body);
        status.is_success()
            && names.iter().all(|n| {
                text.lines().any(|l| {
                    l.starts_with("grid_provider_ready{")
                        && l.contains(&format!("grid_site=\"{n}\""))
                        && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) == Some(1.0)
                })
            })
    }

    /// Sends `n` chat requests to site `i`'s gateway, `concurrency` at a time, each
    /// bounded by `timeout`: how many each site answered, and how many failed (not 200,
    /// or no answer), by what.
    ///
    /// # Panics
    ///
    /// When site `i` does not exist.
    pub async fn traffic(
        &self,
        i: usize,
        n: usize,
        concurrency: usize,
        timeout: Duration,
    ) -> Traffic {
        self.round(i, (n, concurrency), timeout, false).await
    }

    /// [`KubeGrid::traffic`] with streamed requests (`"stream": true`): an answer counts
    /// as answered when it is a 200 whose body (server-sent events) came to its end
    /// with no error.
    ///
    /// # Panics
    ///
    /// When site `i` does not exist.
    pub async fn traffic_streamed(
        &self,
        i: usize,
        n: usize,
        concurrency: usize,
        timeout: Duration,
    ) -> Traffic {
        self.round(i, (n, concurrency), timeout, true).await
    }

    async fn round(
        &self,
        i: usize,
        (n, concurrency): (usize, usize),
        timeout: Duration,
        stream: bool,
    ) -> Traffic {
        on(self.handle(i), async move {
            let client = crate::load::LoadClient::new(crate::load::Protocol::Http1, timeout);
            let uri: http::Uri = format!("http://127.0.0.1:{GATEWAY_PORT}/v1/chat/completions")
                .parse()
                .expect("a URL");
            let mut traffic = Traffic::default();
            let mut sent = 0;
            while sent < n {
                let batch = concurrency.min(n - sent);
                let answers = futures::future::join_all(
                    (0..batch)
                        .map(|_| client.post_json(&uri, crate::load::chat_body(MODEL, stream))),
                )
                .await;
                for a in answers {
                    match a {
                        Ok(a) if a.status.is_success() && (!stream || a.bytes > 0) => {
                            *traffic
                                .answered
                                .entry(a.site.unwrap_or_default())
                                .or_default() += 1;
                        }
                        Ok(a) => {
                            *traffic
                                .failed
                                .entry(a.status.as_u16().to_string())
                                .or_default() += 1;
                        }
                        Err(e) => *traffic.failed.entry(e.to_string()).or_default() += 1,
                    }
                }
                sent += batch;
            }
            traffic
        })
        .await
    }

    /// Takes site `i` off the LAN (`false`) or puts it back.
    ///
    /// # Errors
    ///
    /// When `ip` fails.
    pub fn set_link(&self, i: usize, up: bool) -> Result<(), Error> {
        self.lan.set_link(i, up)
    }

    /// Each site's persisted state as its API server holds it: (publisher-epoch mark,
    /// fences by (site, provider)), read with kubectl.
    pub fn state(&self) -> Vec<SiteState> {
        self.sites
            .iter()
            .map(|s| {
                let cm = s
                    .cluster
                    .kubectl(
                        &[
                            "get",
                            "configmap",
                            &format!("grid-site-{}", s.name),
                            "-n",
                            &s.namespace,
                            "-o",
                            "json",
                        ],
                        None,
                    )
                    .ok()
                    .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
                let data = cm.as_ref().map(|c| c["data"].clone()).unwrap_or_default();
                let mark = data["publisherEpochHighWaterMark"]
                    .as_str()
                    .and_then(|m| m.parse().ok());
                let fences = data["fences"]
                    .as_str()
                    .and_then(|f| serde_json::from_str::<grid_signals::batch::FenceSet>(f).ok())
                    .map(|f| {
                        f.records
                            .into_iter()
                            .map(|r| ((r.site, r.provider), (r.fence.epoch, r.fence.sequence)))
                            .collect()
                    })
                    .unwrap_or_default();
                (s.name.clone(), mark, fences)
            })
            .collect()
    }

    /// Stops every gateway and operator gracefully, then the API servers, then the
    /// namespaces.
    pub async fn stop(mut self) {
        for i in 0..self.sites.len() {
            let handle = self.handle(i).clone();
            let site = &mut self.sites[i];
            if let Some(g) = site.gateway.take() {
                on(&handle, g.shutdown()).await;
            }
            if let Some(mut op) = site.operator.take() {
                if let Some(stop) = op.stop.take() {
                    let _ = stop.send(());
                }
                let _ = tokio::time::timeout(Duration::from_secs(10), op.task).await;
            }
            if let Some(front) = site.front.take() {
                front.abort();
            }
            match site.server.take() {
                Some(Server::Simulated(sim)) => on(&handle, sim.stop()).await,
                // Its processes killed and its pods' namespaces removed; its objects go
                // with the API server.
                Some(Server::Llmd(site)) => drop(site),
                None => {}
            }
            drop(site.keeper.take());
        }
    }
}

/// Site operator's whole life in-process: its kubeconfig read, its resources followed,
/// then [`run::run`] until `stopped` resolves.
async fn run_operator(
    kubeconfig: PathBuf,
    namespace: String,
    deployment: Deployment,
    identity: String,
    tx: run::Started,
    stopped: oneshot::Receiver<()>,
) -> Result<(), grid_operatord::Error> {
    let file = kube::config::Kubeconfig::read_from(&kubeconfig).map_err(|e| {
        grid_operatord::Error::Kube {
            operation: "reading the kubeconfig",
            message: e.to_string(),
        }
    })?;
    let config =
        kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| grid_operatord::Error::Kube {
                operation: "reading the kubeconfig",
                message: e.to_string(),
            })?;
    let client = api::client_from(config, &namespace)?;
    let metrics = ControllerMetrics::new();
    let source = Arc::new(
        KubeConfigSource::start(client.clone(), &namespace, deployment, metrics.clone()).await?,
    );
    let setup = run::Setup {
        client,
        namespace,
        source,
        options: grid_operatord::driver::Options::default(),
        metrics,
        election: Some(Election {
            identity,
            timing: LEASE,
        }),
    };
    run::run(setup, tx, async {
        let _ = stopped.await;
    })
    .await
}

/// The sockets of namespace `ns` bound to any of `ports` (`ss`), every state: what held
/// a port an operator could not bind.
fn sockets_on(ns: &str, ports: &[u16]) -> Vec<String> {
    let listed = crate::kube_cluster::command_in(Some(ns), Path::new("ss"))
        .arg("-tuanpe")
        .output();
    let Ok(listed) = listed else {
        return vec!["ss could not run".into()];
    };
    String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter(|l| ports.iter().any(|p| l.contains(&format!(":{p} "))))
        .map(str::to_owned)
        .collect()
}

/// One site's persisted state: its name, its publisher-epoch mark, and its fences as
/// (epoch, sequence) by (site, provider).
pub type SiteState = (String, Option<u64>, BTreeMap<(String, String), (u64, u64)>);

/// What [`KubeGrid::traffic`] saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Answers (200) by the site `x-grid-site` named.
    pub answered: BTreeMap<String, u64>,
    /// Failures by status or error.
    pub failed: BTreeMap<String, u64>,
}

impl Traffic {
    /// Requests answered.
    pub fn total(&self) -> u64 {
        self.answered.values().sum()
    }

    /// Requests that failed.
    pub fn lost(&self) -> u64 {
        self.failed.values().sum()
    }
}

fn project(site: &KubeSite) -> Result<(), Error> {
    let data = site
        .cluster
        .kubectl(
            &[
                "get",
                "secret",
                &format!("grid-site-{}-tls", site.name),
                "-n",
                &site.namespace,
                "-o",
                "json",
            ],
            None,
        )
        .map_err(err)?;
    let secret: serde_json::Value = serde_json::from_str(&data).map_err(err)?;
    for key in ["tls.key", "tls.crt", "ca.crt"] {
        let b64 = secret["data"][key]
            .as_str()
            .ok_or_else(|| err(format!("the Secret has no {key}")))?;
        let bytes = base64_decode(b64).ok_or_else(|| err(format!("{key} is not base64")))?;
        write_atomic(&site.tls_dir.join(key), &bytes)?;
    }
    Ok(())
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// Standard base64 (what the API server returns a `Secret`'s data in).
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes().filter(|c| !c.is_ascii_whitespace()) {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// Writes `cert` and the CA as files `kubectl create secret --from-file` reads, and
/// applies the `Secret` `grid-site-<name>-tls` from them.
///
/// # Errors
///
/// kubectl's failure.
pub fn apply_secret(site: &KubeSite, cert: &SiteCert, ca: &Ca, dir: &Path) -> Result<(), Error> {
    let src = dir.join(format!("{}-secret-src", site.name));
    std::fs::create_dir_all(&src).map_err(err)?;
    let (crt, key) = cert.write(&src, "tls");
    let ca_file = src.join("ca.crt");
    std::fs::write(&ca_file, ca.pem()).map_err(err)?;
    let from = |k: &str, p: &Path| format!("--from-file={k}={}", p.display());
    let yaml = site
        .cluster
        .kubectl(
            &[
                "create",
                "secret",
                "generic",
                &format!("grid-site-{}-tls", site.name),
                "-n",
                &site.namespace,
                &from("tls.crt", &crt),
                &from("tls.key", &key),
                &from("ca.crt", &ca_file),
                "--dry-run=client",
                "-o",
                "yaml",
            ],
            None,
        )
        .map_err(err)?;
    site.cluster
        .kubectl(
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            Some(&yaml),
        )
        .map_err(err)?;
    Ok(())
}

/// Starts site `name`'s model server in its namespace (`ns_handle`'s), with its objects
/// (an llm-d site's pool and pods) in Kubernetes namespace `namespace` of `cluster`.
async fn start_server(
    server: &ModelServer,
    name: &str,
    namespace: &str,
    cluster: &Arc<Cluster>,
    ns_handle: &tokio::runtime::Handle,
) -> Result<Server, Error> {
    Ok(match server {
        ModelServer::Simulated { endpoints, slots } => {
            let mut site_config = SiteConfig::new(name.to_owned(), *endpoints, *slots);
            site_config.service.median_ms = SERVICE_MEDIAN_MS;
            let mut sim_config = SimSiteConfig::new(site_config, MODEL);
            sim_config.identity = grid_sim::fake_epp::EppIdentity::new(EXAMPLE_POOL, MODEL);
            Server::Simulated(on(ns_handle, SimSite::start(sim_config)).await?)
        }
        ModelServer::Llmd(llmd) => {
            // In the site's own namespace, as the example's `llama-epp` Service is.
            let mut llmd = llmd.clone();
            MODEL.clone_into(&mut llmd.model);
            let placement = Placement {
                cluster: cluster.clone(),
                handle: Some(ns_handle.clone()),
                namespace: Some(namespace.to_owned()),
            };
            Server::Llmd(Box::new(LlmdSite::start_in(llmd, placement).await?))
        }
    })
}

#[allow(clippy::too_many_arguments)]
async fn start_site(
    lan: &Lan,
    i: usize,
    spec: &SiteSpec,
    (cluster, keeper): (Arc<Cluster>, Keeper),
    cert: SiteCert,
    ca: &Ca,
    resources: &str,
    dir: &Path,
) -> Result<KubeSite, Error> {
    let ns_handle = lan.sites[i].handle().clone();
    let addr = lan.sites[i].addr;
    let name = spec.name.clone();
    let namespace = format!("grid-site-{name}");
    let tls_dir = dir.join(&name).join("tls");
    std::fs::create_dir_all(&tls_dir).map_err(err)?;
    // The example manifests, with this site's names.
    let site_a = "grid-site-a";
    let named = |text: String| text.replace(site_a, &namespace);
    let apply = |text: &str| -> Result<String, Error> {
        cluster
            .kubectl(&["apply", "--server-side", "-f", "-"], Some(text))
            .map_err(err)
    };
    apply(&named(example("namespace.yaml")?))?;
    apply(&named(example("rbac.yaml")?))?;

    // The model server and its EPP, then its front: TLS on the site's LAN address.
    let server = start_server(&spec.server, &name, &namespace, &cluster, &ns_handle).await?;
    let front_files = ca.issue(&dir.join(&name), "front", &[&addr.to_string()]);
    let front_tls = crate::pki::server_config(&front_files, &ca.pem());
    let front = on(
        &ns_handle,
        front::start(
            SocketAddr::from(([0, 0, 0, 0], FRONT_PORT)),
            front_tls,
            server.api(),
        ),
    )
    .await?;
    let (epp_url, api_url) = server.urls();
    let pool = match &spec.server {
        ModelServer::Simulated { .. } => EXAMPLE_POOL.to_owned(),
        ModelServer::Llmd(llmd) => llmd.pool.clone(),
    };
    let site = KubeSite {
        name: name.clone(),
        namespace: namespace.clone(),
        addr,
        cluster: cluster.clone(),
        tls_dir: tls_dir.clone(),
        operator_kubeconfig: dir.join(&name).join("operator.kubeconfig"),
        cert: cert.clone(),
        operator: None,
        gateway: None,
        server: Some(server),
        front: Some(front),
        keeper: Some(keeper),
        replicas: 0,
    };
    apply_secret(&site, &cert, ca, dir)?;
    project(&site)?;
    let resources = named(resources.to_owned())
        .replace(&format!("http://llama-epp.{namespace}.svc:9090"), &epp_url)
        .replace(&format!("http://llama.{namespace}.svc:8000"), &api_url)
        .replace(
            &format!("pool: {EXAMPLE_POOL}\n"),
            &format!("pool: {pool}\n"),
        );
    apply(&resources)?;
    for file in ["service.yaml", "deployment.yaml", "gateway.yaml"] {
        let text = named(example(file)?)
            .replace("--site=a", &format!("--site={name}"))
            .replace("site = \"a\"", &format!("site = \"{name}\""));
        apply(&text)?;
    }
    let token = cluster
        .kubectl(
            &[
                "create",
                "token",
                "grid-operator",
                "-n",
                &namespace,
                "--duration=2h",
            ],
            None,
        )
        .map_err(err)?;
    write_kubeconfig(
        &site.operator_kubeconfig,
        &format!("https://{}", cluster.addr),
        &cluster.ca_file,
        &Credentials::Token(token.trim()),
    )
    .map_err(err)?;
    Ok(site)
}

/// A site's serving front: TLS with client certificates of the grid CA, forwarding
/// every request to the model server over plain HTTP on the namespace's loopback.
mod front {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use hyper::body::Incoming;
    use hyper::service::service_fn;
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio::net::TcpListener;

    use crate::Error;

    pub(super) async fn start(
        addr: SocketAddr,
        tls: Arc<rustls::ServerConfig>,
        backend: SocketAddr,
    ) -> Result<tokio::task::JoinHandle<()>, Error> {
        let listener = TcpListener::bind(addr).await?;
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let client: Client<HttpConnector, Incoming> =
            Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        Ok(tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, client) = (acceptor.clone(), client.clone());
                tokio::spawn(async move {
                    let Ok(Ok(tls)) = tokio::time::timeout(
                        std::time::Duration::from_secs(5),
                        acceptor.accept(tcp),
                    )
                    .await
                    else {
                        return;
                    };
                    let service = service_fn(move |mut req: hyper::Request<Incoming>| {
                        let client = client.clone();
                        async move {
                            let pq = req
                                .uri()
                                .path_and_query()
                                .map_or("/", http::uri::PathAndQuery::as_str)
                                .to_owned();
                            *req.uri_mut() =
                                format!("http://{backend}{pq}").parse().expect("a URI");
                            req.headers_mut().remove(http::header::HOST);
                            // The gateway may speak HTTP/2 to the front; the model server
                            // behind it speaks HTTP/1.1.
                            *req.version_mut() = http::Version::HTTP_11;
                            client.request(req).await
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        }))
    }
}

/// Site `i`'s name in a grid of `n` (`a`, `b`, `c`, ...).
pub fn site_name(i: usize) -> String {
    char::from(b'a' + u8::try_from(i % 26).unwrap_or(0)).to_string()
}

/// The issued certificate's files, for a test that rotates it.
pub fn mint_site(ca: &Ca, name: &str) -> SiteCert {
    ca.mint(&Mint {
        spiffe: Some(format!("spiffe://{TRUST_DOMAIN}/site/{name}")),
        expired: false,
        cn: name,
    })
}
