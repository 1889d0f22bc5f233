//! The streams comparison: thousands of long streamed answers held open at once through
//! each proxy, what an LLM gateway carries. The same upstream for every proxy (a
//! `grid-ticking-upstream` process: one event at once, then one per interval, each
//! stamped with its send instant), clients in this process that read events as they come.
//!
//! Per proxy, client protocol and number of streams N, from one run:
//! - **open**: from the first request until every stream has its first event (N opened
//!   at once: what a listen backlog and an accept loop decide);
//! - **first byte**: each stream's first event minus its request's send instant, p50;
//! - **delay per event**: each event's arrival minus its send instant, p50 and p99, over
//!   the steady window (every stream open); the same read straight from the upstream is
//!   the baseline the proxies' added delay is measured against;
//! - **memory per stream**: the proxy's resident memory (every process, a master's
//!   workers included) with N streams open, sampled [`MEMORY_AT`] into the streams' life
//!   (past any step a proxy takes some seconds in), minus the same before they opened,
//!   over N;
//! - **CPU per event**: the proxy's CPU over the steady window over the events the
//!   clients read in it.
//!
//! HTTP/1.1 clients open one connection per stream; HTTP/2 clients open
//! [`H2_STREAMS_PER_CONNECTION`] streams per connection. Every wait is bounded: a stream
//! must open within [`OPEN_LIMIT`] and end within its length plus [`END_GRACE`].

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Buf, Bytes};
use grid_kit::Error;
use grid_kit::clock::Stopwatch;
use grid_kit::ticking_upstream::{Ticks, sent_ns_in, wall_ns};
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use super::{Client, Lineup, MODEL, PATH, Proxy, failed, free_port, request_body, spawn};

/// Streams one HTTP/2 client connection carries (under nginx's default
/// `http2_max_concurrent_streams` of 128).
pub const H2_STREAMS_PER_CONNECTION: usize = 100;
/// How long every stream of a run has to see its first event.
pub const OPEN_LIMIT: Duration = Duration::from_secs(60);
/// How long past its length a stream may take to end.
pub const END_GRACE: Duration = Duration::from_secs(30);
/// Where in the streams' life resident memory is sampled (a fraction of their length).
pub const MEMORY_AT: f64 = 0.8;
/// Where the steady window begins after every stream opened.
pub const SETTLE: Duration = Duration::from_secs(2);
/// First-byte probes per proxy on an idle machine, one at a time.
pub const IDLE_PROBES: usize = 200;
/// The most of a refused stream's answer body kept for the run's log.
pub const REFUSAL_BYTES: usize = 4_096;
/// How long the upstream process has to listen.
pub const UPSTREAM_READY_LIMIT: Duration = Duration::from_secs(10);

grid_signals::label_values! {
    /// Why a stream failed: the first step it did not get past. Named in the table as
    /// its snake-case label, listed in [`StreamFailure::ALL`]'s order.
    pub enum StreamFailure {
        /// The TCP connection was not made.
        Connect,
        /// The HTTP handshake (or, over HTTP/2, the connection's readiness) failed.
        Handshake,
        /// The request got no answer head (the connection or stream was closed or reset).
        Request,
        /// The answer's status was not a success.
        Status,
        /// The body broke off with an error.
        Body,
        /// The body ended cleanly with events missing.
        Short,
        /// The stream had not ended by its length plus [`END_GRACE`].
        Unfinished,
    }
}

/// How many streams of a run failed, by reason (indexed as [`StreamFailure::ALL`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Failures([usize; StreamFailure::ALL.len()]);

impl Failures {
    fn count(&mut self, why: StreamFailure, n: usize) {
        self.0[why as usize] += n;
    }

    /// Streams that failed for any reason.
    pub fn total(&self) -> usize {
        self.0.iter().sum()
    }
}

impl std::fmt::Display for Failures {
    /// The total, then each reason that occurred: `3395 (connect 3000, request 395)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.total())?;
        let mut sep = " (";
        for why in StreamFailure::ALL {
            let n = self.0[why as usize];
            if n > 0 {
                write!(f, "{sep}{} {n}", why.as_str())?;
                sep = ", ";
            }
        }
        if sep == ", " {
            write!(f, ")")?;
        }
        Ok(())
    }
}

/// One run's figures. Delays and first bytes are in microseconds; `None` where the
/// figure has no meaning (memory and CPU of the direct path).
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamsMeasured {
    /// Streams that opened and ended with a 200 and every event.
    pub streams_ok: usize,
    /// Streams that failed, were refused or lost events, by reason.
    pub failed: Failures,
    /// From the first request until every stream had its first event, seconds.
    pub open_s: f64,
    /// First byte, p50.
    pub first_byte_p50_us: f64,
    /// Delay per event, p50.
    pub delay_p50_us: f64,
    /// Delay per event, p99.
    pub delay_p99_us: f64,
    /// Resident memory per open stream, KiB.
    pub kib_per_stream: Option<f64>,
    /// CPU per event read by a client, microseconds.
    pub cpu_us_per_event: Option<f64>,
}

/// Starts `program` (`grid-ticking-upstream`) on a free loopback port, ticking as
/// `ticks` says, and waits until it accepts.
///
/// # Errors
/// It does not start or does not listen within [`UPSTREAM_READY_LIMIT`].
pub async fn start_upstream(program: &Path, ticks: Ticks, dir: &Path) -> Result<Proxy, Error> {
    let port = free_port()?;
    let listen = format!("127.0.0.1:{port}");
    let log = dir.join("upstream.log");
    let child = spawn(
        program,
        &[
            "--listen",
            &listen,
            "--model",
            MODEL,
            "--interval-ms",
            &ticks.interval.as_millis().to_string(),
            "--events",
            &ticks.events.to_string(),
            "--event-bytes",
            &ticks.event_bytes.to_string(),
        ],
        &[],
        &log,
    )?;
    let upstream = Proxy {
        name: "upstream",
        url: format!("http://{listen}"),
        log,
        children: vec![child],
    };
    let clock = Stopwatch::start();
    while TcpStream::connect(&listen).await.is_err() {
        if clock.elapsed() > UPSTREAM_READY_LIMIT {
            let said = std::fs::read_to_string(&upstream.log).unwrap_or_default();
            return Err(failed(format!(
                "{} did not listen: {said}",
                program.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(upstream)
}

/// The resident memory of every process of `proxy`, bytes.
fn rss_bytes(proxy: &Proxy) -> u64 {
    proxy
        .pids()
        .iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
        .filter_map(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .sum::<u64>()
        * 1024
}

/// What every stream of a run shares with the run's coordinator.
#[derive(Default)]
struct Shared {
    /// Streams that have their first event.
    opened: AtomicUsize,
    /// Streams that ended without one.
    never_opened: AtomicUsize,
    /// Whether events are in the steady window now.
    steady: AtomicBool,
    /// Events read in the steady window.
    steady_events: AtomicU64,
    /// The first unsuccessful answer's status and body, for the run's log.
    first_refusal: std::sync::OnceLock<String>,
}

/// What one stream saw.
struct Seen {
    /// `None` for a stream that ended with a success and every event.
    failure: Option<StreamFailure>,
    first_byte_ns: Option<u64>,
    /// Delays of the events read in the steady window, nanoseconds.
    delays_ns: Vec<u64>,
}

impl Seen {
    /// A stream that failed before it read anything.
    fn failed(why: StreamFailure) -> Self {
        Self {
            failure: Some(why),
            first_byte_ns: None,
            delays_ns: Vec::new(),
        }
    }
}

/// Reads one answer's body as it comes: the delay of each event, the first byte.
async fn read_events(
    answer: http::Response<hyper::body::Incoming>,
    sent_at: u64,
    events: u32,
    shared: &Shared,
) -> Seen {
    if !answer.status().is_success() {
        let status = answer.status();
        let body = http_body_util::Limited::new(answer.into_body(), REFUSAL_BYTES)
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes);
        let said = body
            .as_deref()
            .map(String::from_utf8_lossy)
            .unwrap_or_default();
        let _ = shared.first_refusal.set(format!("{status} {said}"));
        return Seen::failed(StreamFailure::Status);
    }
    let mut seen = Seen::failed(StreamFailure::Short);
    let mut body = answer.into_body();
    let mut carry: Vec<u8> = Vec::new();
    let mut read = 0u32;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            seen.failure = Some(StreamFailure::Body);
            return seen;
        };
        let Ok(mut data) = frame.into_data() else {
            continue;
        };
        let now = wall_ns();
        carry.extend_from_slice(data.chunk());
        data.advance(data.remaining());
        // Whole events only; a tail cut by this read waits for the next.
        let Some(end) = carry.windows(2).rposition(|w| w == b"\n\n") else {
            continue;
        };
        for sent in sent_ns_in(&carry[..end]) {
            if read == 0 {
                seen.first_byte_ns = Some(now.saturating_sub(sent_at));
                shared.opened.fetch_add(1, Ordering::Relaxed);
            }
            read += 1;
            if shared.steady.load(Ordering::Relaxed) {
                shared.steady_events.fetch_add(1, Ordering::Relaxed);
                seen.delays_ns.push(now.saturating_sub(sent));
            }
        }
        carry.drain(..end + 2);
    }
    if read == events {
        seen.failure = None;
    }
    seen
}

/// The streamed chat request: origin-form with a `Host` over HTTP/1.1, the absolute URL
/// (`:scheme` and `:authority`) over HTTP/2.
fn chat_request(url: &str, client: Client) -> Result<Request<Full<Bytes>>, Error> {
    let builder = match client {
        Client::Http1 => Request::post(PATH).header(http::header::HOST, host_port(url)),
        Client::Http2 => Request::post(format!("{url}{PATH}")),
    };
    builder
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(request_body(true))))
        .map_err(|e| failed(format!("request: {e}")))
}

/// One HTTP/1.1 stream on a connection of its own.
async fn h1_stream(addr: String, url: String, events: u32, shared: Arc<Shared>) -> Seen {
    let Ok(tcp) = TcpStream::connect(&addr).await else {
        return Seen::failed(StreamFailure::Connect);
    };
    let _ = tcp.set_nodelay(true);
    let Ok((mut send, conn)) = http1::handshake(TokioIo::new(tcp)).await else {
        return Seen::failed(StreamFailure::Handshake);
    };
    tokio::spawn(conn);
    let Ok(request) = chat_request(&url, Client::Http1) else {
        return Seen::failed(StreamFailure::Request);
    };
    let sent_at = wall_ns();
    match send.send_request(request).await {
        Ok(answer) => read_events(answer, sent_at, events, &shared).await,
        Err(_) => Seen::failed(StreamFailure::Request),
    }
}

/// One HTTP/2 stream on a shared connection.
async fn h2_stream(
    mut send: http2::SendRequest<Full<Bytes>>,
    url: String,
    events: u32,
    shared: Arc<Shared>,
) -> Seen {
    if send.ready().await.is_err() {
        return Seen::failed(StreamFailure::Handshake);
    }
    let Ok(request) = chat_request(&url, Client::Http2) else {
        return Seen::failed(StreamFailure::Request);
    };
    let sent_at = wall_ns();
    match send.send_request(request).await {
        Ok(answer) => read_events(answer, sent_at, events, &shared).await,
        Err(_) => Seen::failed(StreamFailure::Request),
    }
}

/// `stream`, counting it under `never_opened` when it ends without a first event.
async fn counted(stream: impl Future<Output = Seen>, shared: Arc<Shared>) -> Seen {
    let seen = stream.await;
    if seen.first_byte_ns.is_none() {
        shared.never_opened.fetch_add(1, Ordering::Relaxed);
    }
    seen
}

fn host_port(url: &str) -> String {
    url.trim_start_matches("http://").to_owned()
}

fn percentile_us(sorted_ns: &[u64], p: f64) -> f64 {
    if sorted_ns.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted_ns.len() as f64 * p).ceil() as usize).clamp(1, sorted_ns.len()) - 1;
    sorted_ns[i] as f64 / 1e3
}

/// Opens `n` streams to `url` over `client` at once and reads them to their end,
/// charging memory and CPU to `proxy` (none: the direct path).
///
/// # Errors
/// An HTTP/2 connection that cannot be opened.
pub async fn run(
    url: &str,
    proxy: Option<&Proxy>,
    client: Client,
    n: usize,
    ticks: Ticks,
) -> Result<StreamsMeasured, Error> {
    let shared = Arc::new(Shared::default());
    let addr = host_port(url);
    // The upstream shifts each stream's ticks by up to one interval (its phase).
    let length = ticks.interval * ticks.events;
    let rss_before = proxy.map(rss_bytes);
    let clock = Stopwatch::start();
    let mut tasks = tokio::task::JoinSet::new();
    match client {
        Client::Http1 => {
            for _ in 0..n {
                let s = Arc::clone(&shared);
                tasks.spawn(counted(
                    h1_stream(addr.clone(), url.to_owned(), ticks.events, Arc::clone(&s)),
                    s,
                ));
            }
        }
        Client::Http2 => {
            let mut left = n;
            while left > 0 {
                let here = left.min(H2_STREAMS_PER_CONNECTION);
                left -= here;
                let tcp = TcpStream::connect(&addr).await?;
                let _ = tcp.set_nodelay(true);
                let (send, conn) = http2::Builder::new(TokioExecutor::new())
                    .handshake(TokioIo::new(tcp))
                    .await
                    .map_err(|e| failed(format!("HTTP/2 to {url}: {e}")))?;
                tokio::spawn(conn);
                for _ in 0..here {
                    let s = Arc::clone(&shared);
                    tasks.spawn(counted(
                        h2_stream(send.clone(), url.to_owned(), ticks.events, Arc::clone(&s)),
                        s,
                    ));
                }
            }
        }
    }
    let settled =
        || shared.opened.load(Ordering::Relaxed) + shared.never_opened.load(Ordering::Relaxed);
    while settled() < n && clock.elapsed() < OPEN_LIMIT {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let open = clock.elapsed();
    tokio::time::sleep(SETTLE).await;
    let cpu_before = proxy.map(Proxy::cpu_ns);
    shared.steady.store(true, Ordering::Relaxed);
    let steady_from = clock.elapsed();
    let memory_at = open + length.mul_f64(MEMORY_AT);
    tokio::time::sleep(memory_at.saturating_sub(steady_from)).await;
    let rss_during = proxy.map(rss_bytes);
    let cpu_during = proxy.map(Proxy::cpu_ns);
    let events = shared.steady_events.load(Ordering::Relaxed);
    shared.steady.store(false, Ordering::Relaxed);
    let mut delays = Vec::new();
    let mut first_bytes = Vec::new();
    let (mut ok, mut failed_streams) = (0, Failures::default());
    let deadline = tokio::time::Instant::now() + length + END_GRACE;
    while let Ok(Some(done)) = tokio::time::timeout_at(deadline, tasks.join_next()).await {
        let seen = done.unwrap_or_else(|_| Seen::failed(StreamFailure::Unfinished));
        match seen.failure {
            None => ok += 1,
            Some(why) => failed_streams.count(why, 1),
        }
        first_bytes.extend(seen.first_byte_ns);
        delays.extend(seen.delays_ns);
    }
    failed_streams.count(StreamFailure::Unfinished, tasks.len());
    if let Some(refusal) = shared.first_refusal.get() {
        eprintln!("{url}: the first unsuccessful answer: {refusal}");
    }
    tasks.abort_all();
    delays.sort_unstable();
    first_bytes.sort_unstable();
    let kib_per_stream = rss_before
        .zip(rss_during)
        .map(|(b, d)| (d as f64 - b as f64) / 1024.0 / n as f64);
    let cpu_us_per_event = cpu_before
        .zip(cpu_during)
        .map(|(b, d)| d.saturating_sub(b) as f64 / 1e3 / events.max(1) as f64);
    Ok(StreamsMeasured {
        streams_ok: ok,
        failed: failed_streams,
        open_s: open.as_secs_f64(),
        first_byte_p50_us: percentile_us(&first_bytes, 0.5),
        delay_p50_us: percentile_us(&delays, 0.5),
        delay_p99_us: percentile_us(&delays, 0.99),
        kib_per_stream,
        cpu_us_per_event,
    })
}

/// The first byte of [`IDLE_PROBES`] streams opened one after another on an idle proxy
/// (each on a new connection, dropped at its first event), p50 in microseconds.
///
/// # Errors
/// A probe that does not get its first event within [`OPEN_LIMIT`].
pub async fn idle_first_byte_p50_us(url: &str, client: Client) -> Result<f64, Error> {
    let addr = host_port(url);
    let mut took = Vec::with_capacity(IDLE_PROBES);
    for _ in 0..IDLE_PROBES {
        let tcp = TcpStream::connect(&addr).await?;
        let _ = tcp.set_nodelay(true);
        let request = chat_request(url, client)?;
        let probe = async {
            let answer = match client {
                Client::Http1 => {
                    let (mut send, conn) = http1::handshake(TokioIo::new(tcp)).await.ok()?;
                    tokio::spawn(conn);
                    let sent_at = wall_ns();
                    (send.send_request(request).await.ok()?, sent_at)
                }
                Client::Http2 => {
                    let (mut send, conn) = http2::Builder::new(TokioExecutor::new())
                        .handshake(TokioIo::new(tcp))
                        .await
                        .ok()?;
                    tokio::spawn(conn);
                    let sent_at = wall_ns();
                    (send.send_request(request).await.ok()?, sent_at)
                }
            };
            let (answer, sent_at) = answer;
            let mut body = answer.into_body();
            while let Some(Ok(frame)) = body.frame().await {
                if frame.data_ref().is_some_and(|d| !d.is_empty()) {
                    return Some(wall_ns().saturating_sub(sent_at));
                }
            }
            None
        };
        match tokio::time::timeout(OPEN_LIMIT, probe).await {
            Ok(Some(ns)) => took.push(ns),
            _ => return Err(failed(format!("a first-byte probe of {url} got no event"))),
        }
    }
    took.sort_unstable();
    Ok(percentile_us(&took, 0.5))
}

/// Who is measured: the upstream read directly, then each proxy.
pub const TARGETS: [&str; 4] = ["direct", "nginx", "envoy", "grid"];

impl Lineup {
    /// The URL `client` reaches `target` (one of [`TARGETS`]) at, and the proxy to
    /// charge.
    fn target(&self, target: &str, client: Client) -> Option<(String, Option<&Proxy>)> {
        let pick = |pair: &(Proxy, Proxy)| match client {
            Client::Http1 => pair.0.url.clone(),
            Client::Http2 => pair.1.url.clone(),
        };
        match target {
            "direct" => Some((self.fed.upstream.base_url(), None)),
            "nginx" => Some((pick(&self.nginx), Some(&self.nginx.0))),
            "envoy" => Some((pick(&self.envoy), Some(&self.envoy.0))),
            "grid" => Some((self.grid.url.clone(), Some(&self.grid))),
            _ => None,
        }
    }

    /// One streams run through `target` (one of [`TARGETS`]).
    ///
    /// # Errors
    /// An unknown target, or a run that fails.
    pub async fn streams(
        &self,
        target: &str,
        client: Client,
        n: usize,
        ticks: Ticks,
    ) -> Result<StreamsMeasured, Error> {
        let (url, proxy) = self
            .target(target, client)
            .ok_or_else(|| failed(format!("no target {target}")))?;
        run(&url, proxy, client, n, ticks).await
    }

    /// The idle first byte through `target`, p50 microseconds.
    ///
    /// # Errors
    /// An unknown target, or a probe that fails.
    pub async fn idle_first_byte(&self, target: &str, client: Client) -> Result<f64, Error> {
        let (url, _) = self
            .target(target, client)
            .ok_or_else(|| failed(format!("no target {target}")))?;
        idle_first_byte_p50_us(&url, client).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_print_their_total_then_each_reason_that_occurred() {
        let mut f = Failures::default();
        assert_eq!(f.to_string(), "0");
        f.count(StreamFailure::Status, 3_580);
        f.count(StreamFailure::Connect, 2);
        assert_eq!(f.total(), 3_582);
        assert_eq!(f.to_string(), "3582 (connect 2, status 3580)");
    }
}
