//! A real Kubernetes API server for the controller's tests: etcd and kube-apiserver, built
//! from their published Go modules by `.ci/install` (`benches/kit/peers/build`, versions
//! pinned in `benches/kit/peers/kube/go.mod`), started once per test process on loopback.
//!
//! The server authenticates client certificates from the test CA ([`crate::pki`]) and
//! service-account tokens, and authorizes with `--authorization-mode=RBAC` alone. At start
//! the generated CRDs (`docs/crds/`) are applied with kubectl. Every test then takes a
//! namespace of its own ([`KubeTest`]), into which the example RBAC
//! (`docs/examples/kubernetes/rbac.yaml`) is applied as it is, with only its namespace
//! changed, and the operator's client runs as that `ServiceAccount`, with a token the
//! server issued: the least-privilege Role in the examples is what the tests run under.
//!
//! The operator's client reaches the server through a [`proxy::FaultProxy`] of its own,
//! which injects the faults the real server will not produce on demand (409 on the next N
//! writes, a 5xx, a slow answer, a dropped watch, the server gone); everything else is the
//! real server's own answer.
//!
//! Bounds: the start waits for `/readyz` at most [`START_DEADLINE`]; every kubectl call is
//! bounded by [`KUBECTL_DEADLINE`]. The processes are started under `setpriv --pdeathsig
//! KILL` from a thread that lives as long as the test process, so they die with it
//! however it ends; their data lives in a temporary folder removed by the next start
//! when its process is gone.
#![allow(clippy::missing_panics_doc)] // a test fixture: every failure is the test's

pub mod proxy;

use std::io::Write as _;
use std::net::SocketAddr;

use crate::ports::loopback_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::clock::Stopwatch;

use serde_json::{Value, json};

use crate::pki::{Ca, Mint};

pub use proxy::{Action, Fault, FaultProxy, Logged, Target};

/// The longest the server may take from its start to a ready `/readyz`.
pub const START_DEADLINE: Duration = Duration::from_secs(120);
/// The longest one kubectl call may take.
pub const KUBECTL_DEADLINE: Duration = Duration::from_secs(60);
/// The name of the operator's `ServiceAccount` in the example RBAC.
pub const OPERATOR_ACCOUNT: &str = "grid-operator";
/// The namespace the example manifests name, replaced by each test's own.
pub const EXAMPLE_NAMESPACE: &str = "grid-site-a";

/// Where this crate's folder is (the repository's `benches/kit`).
fn kit_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The repository's root folder.
#[must_use]
pub fn repo_dir() -> PathBuf {
    kit_dir().join("../..")
}

/// The folder holding `kube-apiserver`, `kubectl` and `etcd`: `GRID_KUBE_PEERS` when set,
/// else what `benches/kit/peers/build --locate` prints (it builds nothing).
///
/// # Errors
///
/// When the peers were not built (`.ci/install` builds them).
pub fn peers_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("GRID_KUBE_PEERS") {
        return Ok(dir.into());
    }
    let out = Command::new("bash")
        .arg(kit_dir().join("peers/build"))
        .arg("--locate")
        .output()
        .map_err(|e| format!("running benches/kit/peers/build: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// One running etcd and kube-apiserver, shared by every test of the process.
#[derive(Debug)]
pub struct Cluster {
    /// The API server's address.
    pub addr: SocketAddr,
    /// The folder of its PKI and kubeconfigs.
    pub dir: PathBuf,
    /// The admin's kubeconfig (a `system:masters` client certificate).
    pub admin_kubeconfig: PathBuf,
    /// The CA that signed the serving certificate and the client certificates (PEM file).
    pub ca_file: PathBuf,
    /// The serving certificate and key (PEM files), which the fault proxies serve too.
    pub serving: (PathBuf, PathBuf),
    /// Where `kubectl` is.
    pub kubectl: PathBuf,
    /// The network namespace it runs in (`None`: this one's loopback).
    pub netns: Option<String>,
    /// How long the start took, to a ready `/readyz` with the CRDs established.
    pub started_in: Duration,
}

static CLUSTER: OnceLock<Result<Arc<Cluster>, String>> = OnceLock::new();

/// The process's cluster, started on first use.
///
/// # Panics
///
/// When it cannot start (the peers are not built, or it is not ready within
/// [`START_DEADLINE`]): the message says why.
pub fn cluster() -> Arc<Cluster> {
    match CLUSTER.get_or_init(start_keeper) {
        Ok(c) => c.clone(),
        Err(e) => panic!("the test Kubernetes API server did not start: {e}"),
    }
}

/// The process's shared cluster: its keeper is never dropped.
fn start_keeper() -> Result<Arc<Cluster>, String> {
    let (cluster, keeper) = start_kept(None)?;
    std::mem::forget(keeper);
    Ok(cluster)
}

/// Keeps a cluster's processes: dropping it kills them and waits for them.
#[derive(Debug)]
pub struct Keeper {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Keeper {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A cluster inside network namespace `netns` (made by the caller, e.g.
/// [`crate::netns::Lan`]), on that namespace's loopback; it lives until the [`Keeper`]
/// is dropped, which must happen before the namespace is removed.
///
/// # Errors
///
/// As [`cluster`] says: the peers are not built, or it is not ready in time.
pub fn start_in(netns: &str) -> Result<(Arc<Cluster>, Keeper), String> {
    start_kept(Some(netns.to_owned()))
}

/// Starts the processes from a thread of their own that waits until its keeper is
/// dropped (then kills them), so that `--pdeathsig` (which follows the thread that
/// started a process) kills them too if the test process dies first.
fn start_kept(netns: Option<String>) -> Result<(Arc<Cluster>, Keeper), String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("kube-cluster".into())
        .spawn(move || {
            let mut children = Vec::new();
            let started = Cluster::start(&mut children, netns.as_deref());
            let ok = started.is_ok();
            let _ = tx.send(started);
            if ok {
                // Until the keeper is dropped (its sender with it).
                let _ = stopped.recv();
            }
            for mut c in children {
                let _ = c.kill();
                let _ = c.wait();
            }
        })
        .map_err(|e| e.to_string())?;
    let keeper = Keeper {
        stop: Some(stop),
        thread: Some(thread),
    };
    let cluster = rx
        .recv_timeout(START_DEADLINE + KUBECTL_DEADLINE)
        .map_err(|e| format!("no word from the starting thread: {e}"))??;
    eprintln!(
        "kube_cluster: etcd and kube-apiserver at {}{} ready, CRDs established, in {} ms",
        cluster.addr,
        cluster
            .netns
            .as_deref()
            .map(|n| format!(" in {n}"))
            .unwrap_or_default(),
        cluster.started_in.as_millis()
    );
    Ok((cluster, keeper))
}

/// Removes the data folders of earlier test processes that are gone.
fn sweep_stale(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("grid-kube-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// `program` to run, inside `netns` when one is given.
pub(crate) fn command_in(netns: Option<&str>, program: &Path) -> Command {
    match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(program);
            c
        }
        None => Command::new(program),
    }
}

fn spawn(
    children: &mut Vec<Child>,
    (program, netns): (&Path, Option<&str>),
    args: &[String],
    log: &Path,
) -> Result<(), String> {
    let out = std::fs::File::create(log).map_err(|e| e.to_string())?;
    let mut command = Command::new("setpriv");
    command.args(["--pdeathsig", "KILL", "--"]);
    if let Some(ns) = netns {
        command.args(["ip", "netns", "exec", ns]);
    }
    let child = command
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(out)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", program.display()))?;
    children.push(child);
    Ok(())
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// The files kube-apiserver is started with.
struct ApiserverFiles<'a> {
    serving: &'a (PathBuf, PathBuf),
    ca: &'a Path,
    sa_key: &'a Path,
    sa_pub: &'a Path,
    cert_dir: &'a Path,
}

fn etcd_args(data: &Path, client: u16, peer: u16) -> Vec<String> {
    vec![
        "--name=grid".into(),
        format!("--data-dir={}", data.display()),
        format!("--listen-client-urls=http://127.0.0.1:{client}"),
        format!("--advertise-client-urls=http://127.0.0.1:{client}"),
        format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
        format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
        format!("--initial-cluster=grid=http://127.0.0.1:{peer}"),
        // A test store: its data dies with the process anyway.
        "--unsafe-no-fsync".into(),
        "--log-level=warn".into(),
    ]
}

fn apiserver_args(f: &ApiserverFiles<'_>, etcd: u16, secure: u16) -> Vec<String> {
    let issuer = "https://kubernetes.default.svc.cluster.local";
    vec![
        format!("--etcd-servers=http://127.0.0.1:{etcd}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={secure}"),
        format!("--tls-cert-file={}", f.serving.0.display()),
        format!("--tls-private-key-file={}", f.serving.1.display()),
        format!("--client-ca-file={}", f.ca.display()),
        "--authorization-mode=RBAC".into(),
        format!("--service-account-issuer={issuer}"),
        format!("--api-audiences={issuer}"),
        format!("--service-account-key-file={}", f.sa_pub.display()),
        format!("--service-account-signing-key-file={}", f.sa_key.display()),
        // A configuration value the server requires, not an address anything is sent
        // to: no Service of these tests gets a ClusterIP used.
        "--service-cluster-ip-range=10.96.0.0/24".into(),
        // The `kubernetes` Service's endpoints would name the advertised address, which
        // may not be loopback: nothing here uses them.
        "--endpoint-reconciler-type=none".into(),
        format!("--cert-dir={}", f.cert_dir.display()),
        "--enable-priority-and-fairness=false".into(),
        "--profiling=false".into(),
        "--v=1".into(),
    ]
}

impl Cluster {
    fn start(children: &mut Vec<Child>, netns: Option<&str>) -> Result<Arc<Self>, String> {
        static STARTS: AtomicU64 = AtomicU64::new(0);
        let began = Stopwatch::start();
        let peers = peers_dir()?;
        let root = std::env::temp_dir();
        sweep_stale(&root);
        let n = STARTS.fetch_add(1, Ordering::Relaxed);
        let dir = root
            .join(format!("grid-kube-{}", std::process::id()))
            .join(n.to_string());
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;

        // The PKI: one CA for the serving certificate and the admin's client certificate;
        // a key of its own to sign service-account tokens.
        let ca = Ca::try_new("grid test kube CA").map_err(|e| e.to_string())?;
        let ca_file = dir.join("ca.crt");
        std::fs::write(&ca_file, ca.pem()).map_err(|e| e.to_string())?;
        let serving = ca
            .try_mint_for(
                &["localhost", "127.0.0.1"],
                &Mint {
                    spiffe: None,
                    expired: false,
                    cn: "kube-apiserver",
                },
            )
            .map_err(|e| e.to_string())?;
        let serving = serving.write(&dir, "apiserver");
        let admin = ca
            .try_mint_client("admin", "system:masters")
            .map_err(|e| e.to_string())?;
        let (admin_cert, admin_key) = admin.write(&dir, "admin");
        let sa_key = dir.join("sa.key");
        let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
        std::fs::write(&sa_key, key.serialize_pem()).map_err(|e| e.to_string())?;
        let sa_pub = dir.join("sa.pub");
        std::fs::write(&sa_pub, key.public_key_pem()).map_err(|e| e.to_string())?;

        let (client, peer, secure) = (loopback_port(), loopback_port(), loopback_port());
        spawn(
            children,
            (&peers.join("etcd"), netns),
            &etcd_args(&dir.join("etcd"), client, peer),
            &dir.join("etcd.log"),
        )?;
        let files = ApiserverFiles {
            serving: &serving,
            ca: &ca_file,
            sa_key: &sa_key,
            sa_pub: &sa_pub,
            cert_dir: &dir.join("certs"),
        };
        spawn(
            children,
            (&peers.join("kube-apiserver"), netns),
            &apiserver_args(&files, client, secure),
            &dir.join("kube-apiserver.log"),
        )?;
        let admin_kubeconfig = dir.join("admin.kubeconfig");
        write_kubeconfig(
            &admin_kubeconfig,
            &format!("https://127.0.0.1:{secure}"),
            &ca_file,
            &Credentials::Cert(&admin_cert, &admin_key),
        )?;
        let cluster = Self {
            addr: SocketAddr::from(([127, 0, 0, 1], secure)),
            dir: dir.clone(),
            admin_kubeconfig,
            ca_file,
            serving,
            kubectl: peers.join("kubectl"),
            netns: netns.map(str::to_owned),
            started_in: Duration::ZERO,
        };
        cluster.wait_ready(children, &began)?;
        let crds = repo_dir().join("docs/crds");
        cluster.kubectl(
            &[
                "apply",
                "--server-side",
                "-f",
                crds.to_str().unwrap_or_default(),
            ],
            None,
        )?;
        cluster.kubectl(
            &[
                "wait",
                "--for=condition=Established",
                "crd",
                "--all",
                "--timeout=30s",
            ],
            None,
        )?;
        Ok(Arc::new(Self {
            started_in: began.elapsed(),
            ..cluster
        }))
    }

    /// Waits until `/readyz` answers ok, at most [`START_DEADLINE`] from `began`; fails
    /// at once when a peer exits.
    fn wait_ready(&self, children: &mut [Child], began: &Stopwatch) -> Result<(), String> {
        let dir = &self.dir;
        loop {
            for c in children.iter_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    return Err(format!(
                        "a peer exited ({status}) while starting; etcd:\n{}\nkube-apiserver:\n{}",
                        tail(&dir.join("etcd.log")),
                        tail(&dir.join("kube-apiserver.log"))
                    ));
                }
            }
            let ready = self
                .kubectl(&["get", "--raw=/readyz", "--request-timeout=2s"], None)
                .is_ok_and(|o| o.trim() == "ok");
            if ready {
                return Ok(());
            }
            if began.elapsed() > START_DEADLINE {
                return Err(format!(
                    "/readyz not ok within {START_DEADLINE:?}; kube-apiserver:\n{}",
                    tail(&dir.join("kube-apiserver.log"))
                ));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Runs kubectl as the admin with `args` (and `stdin`, if any), bounded by
    /// [`KUBECTL_DEADLINE`]; its standard output.
    ///
    /// # Errors
    ///
    /// A non-zero exit, with what it printed; or the deadline.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        self.kubectl_as(&self.admin_kubeconfig, args, stdin)
    }

    /// [`Cluster::kubectl`] with another kubeconfig.
    ///
    /// # Errors
    ///
    /// A non-zero exit, with what it printed; or the deadline.
    pub fn kubectl_as(
        &self,
        kubeconfig: &Path,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, String> {
        let mut child = command_in(self.netns.as_deref(), &self.kubectl)
            .env("KUBECONFIG", kubeconfig)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting kubectl: {e}"))?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes())
                .map_err(|e| format!("kubectl's stdin: {e}"))?;
        }
        let began = Stopwatch::start();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if began.elapsed() < KUBECTL_DEADLINE => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "kubectl {args:?}: no exit within {KUBECTL_DEADLINE:?}"
                    ));
                }
            }
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("kubectl's output: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "kubectl {args:?} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

/// How a kubeconfig authenticates.
#[derive(Debug)]
pub enum Credentials<'a> {
    /// A client certificate and its key (PEM files).
    Cert(&'a Path, &'a Path),
    /// A bearer token.
    Token(&'a str),
}

/// Writes a kubeconfig for `server`, trusting `ca`, authenticating with `credentials`.
///
/// # Errors
///
/// When the file cannot be written.
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    credentials: &Credentials<'_>,
) -> Result<(), String> {
    let user = match credentials {
        Credentials::Cert(cert, key) => json!({
            "client-certificate": cert, "client-key": key,
        }),
        Credentials::Token(token) => json!({ "token": token }),
    };
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": "test", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "current-context": "test",
    });
    // JSON is YAML: kubectl and kube read it alike.
    std::fs::write(path, config.to_string()).map_err(|e| e.to_string())
}

/// Where each resource type the tests touch lives: (API path prefix, apiVersion, kind).
///
/// # Panics
///
/// For a plural the tests do not use.
#[must_use]
pub fn type_of(plural: &str) -> (&'static str, &'static str, &'static str) {
    match plural {
        "gridnetworks" => (
            "/apis/grid.llm-d.io/v1alpha1",
            "grid.llm-d.io/v1alpha1",
            "GridNetwork",
        ),
        "gridsites" => (
            "/apis/grid.llm-d.io/v1alpha1",
            "grid.llm-d.io/v1alpha1",
            "GridSite",
        ),
        "inferenceproviders" => (
            "/apis/grid.llm-d.io/v1alpha1",
            "grid.llm-d.io/v1alpha1",
            "InferenceProvider",
        ),
        "configmaps" => ("/api/v1", "v1", "ConfigMap"),
        "leases" => (
            "/apis/coordination.k8s.io/v1",
            "coordination.k8s.io/v1",
            "Lease",
        ),
        other => panic!("no resource type {other} in the test table"),
    }
}

static NAMESPACES: AtomicU64 = AtomicU64::new(0);

/// One test's namespace on the shared [`Cluster`], with the example RBAC applied, the
/// operator's token, an admin client, and the operator's fault proxy.
pub struct KubeTest {
    /// The namespace.
    pub ns: String,
    /// The cluster.
    pub cluster: Arc<Cluster>,
    /// The operator's way in: a proxy in front of the real server that injects faults.
    pub proxy: FaultProxy,
    /// The operator's kubeconfig: its `ServiceAccount`'s token, through the proxy.
    pub operator_kubeconfig: PathBuf,
    admin: kube::Client,
}

impl std::fmt::Debug for KubeTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeTest")
            .field("ns", &self.ns)
            .field("proxy", &self.proxy)
            .finish_non_exhaustive()
    }
}

impl KubeTest {
    /// A fresh namespace on the process's cluster (started on first use), with the
    /// example RBAC in it and a proxy for the operator.
    pub async fn start() -> Self {
        let n = NAMESPACES.fetch_add(1, Ordering::Relaxed);
        let ns = format!("grid-t{n}");
        let cluster = tokio::task::spawn_blocking(cluster).await.expect("cluster");
        let (c, name) = (cluster.clone(), ns.clone());
        let token = tokio::task::spawn_blocking(move || {
            c.kubectl(&["create", "namespace", &name], None)?;
            let rbac =
                std::fs::read_to_string(repo_dir().join("docs/examples/kubernetes/rbac.yaml"))
                    .map_err(|e| e.to_string())?;
            let rbac = rbac.replace(
                &format!("namespace: {EXAMPLE_NAMESPACE}"),
                &format!("namespace: {name}"),
            );
            c.kubectl(&["apply", "--server-side", "-f", "-"], Some(&rbac))?;
            c.kubectl(
                &[
                    "create",
                    "token",
                    OPERATOR_ACCOUNT,
                    "-n",
                    &name,
                    "--duration=2h",
                ],
                None,
            )
        })
        .await
        .expect("kubectl")
        .expect("the test namespace with the example RBAC");
        let proxy = FaultProxy::start(cluster.addr, &cluster.serving, &cluster.ca_file).await;
        let operator_kubeconfig = cluster.dir.join(format!("{ns}-operator.kubeconfig"));
        write_kubeconfig(
            &operator_kubeconfig,
            &proxy.url(),
            &cluster.ca_file,
            &Credentials::Token(token.trim()),
        )
        .expect("the operator's kubeconfig");
        let admin = client_for(&cluster.admin_kubeconfig, &ns).await;
        Self {
            ns,
            cluster,
            proxy,
            operator_kubeconfig,
            admin,
        }
    }

    /// kube's configuration for the operator (its token, through the proxy), before the
    /// operator's own bounds are put on it.
    pub async fn operator_config(&self) -> kube::Config {
        config_for(&self.operator_kubeconfig, &self.ns).await
    }

    /// An admin client, straight to the server (no faults).
    #[must_use]
    pub fn admin(&self) -> kube::Client {
        self.admin.clone()
    }

    fn path(&self, plural: &str, name: Option<&str>) -> String {
        let (prefix, _, _) = type_of(plural);
        let ns = &self.ns;
        match name {
            Some(n) => format!("{prefix}/namespaces/{ns}/{plural}/{n}"),
            None => format!("{prefix}/namespaces/{ns}/{plural}"),
        }
    }

    async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, kube::Error> {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body.map(|b| b.to_string().into_bytes()).unwrap_or_default())
            .expect("request");
        self.admin.request::<Value>(req).await
    }

    fn with_type(plural: &str, mut object: Value) -> Value {
        let (_, api_version, kind) = type_of(plural);
        object["apiVersion"] = json!(api_version);
        object["kind"] = json!(kind);
        object
    }

    /// Creates `object` (its `apiVersion` and `kind` filled in) as the admin.
    pub async fn create(&self, plural: &str, object: Value) -> Value {
        let object = Self::with_type(plural, object);
        self.call(http::Method::POST, &self.path(plural, None), Some(&object))
            .await
            .unwrap_or_else(|e| panic!("creating {plural} {object}: {e}"))
    }

    /// The object, if it exists.
    pub async fn get(&self, plural: &str, name: &str) -> Option<Value> {
        match self
            .call(http::Method::GET, &self.path(plural, Some(name)), None)
            .await
        {
            Ok(v) => Some(v),
            Err(kube::Error::Api(s)) if s.code == 404 => None,
            Err(e) => panic!("reading {plural}/{name}: {e}"),
        }
    }

    /// Replaces `object`'s spec (or data) as the admin, at the resourceVersion read just
    /// before: an edit, as `kubectl edit` makes one.
    pub async fn replace(&self, plural: &str, object: Value) -> Value {
        self.put(plural, object, false).await
    }

    /// Replaces `object`'s status through the status subresource, as another controller
    /// might.
    pub async fn replace_status(&self, plural: &str, object: Value) -> Value {
        self.put(plural, object, true).await
    }

    async fn put(&self, plural: &str, object: Value, status: bool) -> Value {
        let name = object["metadata"]["name"]
            .as_str()
            .expect("a name")
            .to_owned();
        let mut path = self.path(plural, Some(&name));
        if status {
            path.push_str("/status");
        }
        let object = Self::with_type(plural, object);
        // The operator may write the object between the read and the write (its status,
        // say): a 409 is read again and retried, as an editor would.
        for _ in 0..10 {
            let held = self
                .get(plural, &name)
                .await
                .expect("the object to replace");
            let mut object = object.clone();
            object["metadata"]["resourceVersion"] = held["metadata"]["resourceVersion"].clone();
            match self.call(http::Method::PUT, &path, Some(&object)).await {
                Ok(v) => return v,
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => panic!("replacing {plural}/{name}: {e}"),
            }
        }
        panic!("replacing {plural}/{name}: 10 conflicts in a row");
    }

    /// Deletes the object and waits until it is gone.
    pub async fn delete(&self, plural: &str, name: &str) {
        self.call(http::Method::DELETE, &self.path(plural, Some(name)), None)
            .await
            .unwrap_or_else(|e| panic!("deleting {plural}/{name}: {e}"));
        for _ in 0..100 {
            if self.get(plural, name).await.is_none() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{plural}/{name} was not gone within 5 s");
    }

    /// Injects `fault` into the operator's proxy.
    pub fn inject(&self, fault: Fault) {
        self.proxy.inject(fault);
    }

    /// Makes the operator's proxy answer every request 503 and drop every stream, or
    /// pass requests again.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.proxy.set_unavailable(unavailable);
    }

    /// How many writes the operator sent whose path contains `text`.
    #[must_use]
    pub fn writes_to(&self, text: &str) -> usize {
        self.proxy.writes_to(text)
    }

    /// kubectl as the admin, in this test's namespace.
    ///
    /// # Errors
    ///
    /// kubectl's failure.
    pub async fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        let mut all: Vec<String> = vec!["-n".into(), self.ns.clone()];
        all.extend(args.iter().map(|s| (*s).to_owned()));
        let stdin = stdin.map(str::to_owned);
        let c = self.cluster.clone();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = all.iter().map(String::as_str).collect();
            c.kubectl(&args, stdin.as_deref())
        })
        .await
        .expect("kubectl")
    }
}

async fn config_for(kubeconfig: &Path, ns: &str) -> kube::Config {
    let file = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut config =
        kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
            .await
            .expect("kube config");
    ns.clone_into(&mut config.default_namespace);
    config
}

async fn client_for(kubeconfig: &Path, ns: &str) -> kube::Client {
    kube::Client::try_from(config_for(kubeconfig, ns).await).expect("kube client")
}
