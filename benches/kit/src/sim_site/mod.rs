//! A simulated site on loopback: an OpenAI-compatible model server whose requests really
//! wait for a slot and take their service time, and the EPP `/metrics` that reports it,
//! both living by one [`SiteModel`] in real time.
//!
//! Served on one port (HTTP/1.1 and HTTP/2, plain text):
//!
//! | route | answer |
//! | --- | --- |
//! | `POST /v1/chat/completions`, `/v1/completions` | JSON after the service time, or with `"stream": true` server-sent events: a chunk per word from the first token on, then `data: [DONE]` |
//! | `POST /v1/embeddings` | JSON after the prefill share of a service time (never streamed) |
//! | `GET /v1/models` | the one model served |
//! | `GET /metrics` | the EPP exposition of the live state ([`FakeEpp`]) |
//!
//! A request with no endpoint up is answered 503; one whose endpoint is taken away
//! while it waits or runs is answered 503 (or, mid-stream, ends with an error event). A
//! client that goes away frees its slot. A [`SimSiteControl`] degrades the site, takes
//! endpoints away and back, provisions flow-control bands, and reads its state;
//! [`SimSite::stop`] shuts it down.
//!
//! # Flow control and its headers
//!
//! With flow control on (`queue_per_endpoint`), every request passes a priority band of
//! the model ([`grid_sim::site_model::bands`]). A request asks for a band with the
//! `x-sim-priority` header (an integer, [`PRIORITY_HEADER`]; absent is band 0; anything
//! else is answered 400); a band that is not provisioned admits nothing and the request
//! falls back to band 0. The site is two layers, and the EPP layer owns these response
//! headers, llm-d's:
//!
//! | header | value | when |
//! | --- | --- | --- |
//! | `x-llm-d-flow-band-headroom-requests` | capacity - length of the band that admitted the request, clamped to 0 | on a served answer, read from the live band registry when its head is built; omitted when the band is unbounded, was removed since, the request did not pass flow control, or the capacity reader is absent or fails ([`CapacityReaderMode`]) |
//! | `x-llm-d-flow-queue-duration-ms` | ms the request waited in its band (`0`: none) | on a served answer that passed flow control |
//! | `x-llm-d-request-dropped-reason` | `rejected-saturated` (429: its band is full), `rejected-ttl-expired` (429: held past `flow_ttl_ms`), `rejected-no-endpoints` (503: no endpoint up, or the last one went away while it was held) | on a dropped request's answer |
//!
//! The band is the one that admitted the request, fixed when it entered the band: a band
//! provisioned afterwards does not change it. The head of a plain answer is built when
//! the request completes, that of a streamed one when it takes a slot; the headroom is
//! read then, never remembered from admission. Any copy of an `x-llm-d-flow-*` or
//! `x-llm-d-request-dropped-reason` header the model-server layer put on its answer
//! (`spoof_flow_headers` makes it) is removed before the EPP layer writes its own.
//!
//! One driver task sleeps until the model's next completion (or until an arrival wakes
//! it), advances the model to the clock and hands each request its events.

mod body;
pub mod flow_headers;
pub mod openai;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::Error;
use crate::clock::ElapsedClock;
use body::SimBody;
use flow_headers::FlowSignal;
pub use flow_headers::{
    CapacityReaderMode, FLOW_BAND_HEADROOM_HEADER, FLOW_QUEUE_DURATION_HEADER, PRIORITY_HEADER,
    REQUEST_DROPPED_REASON_HEADER,
};
use grid_sim::fake_epp::{EppIdentity, FakeEpp};
use grid_sim::site_model::{
    BandSnapshot, DropReason, FailReason, FlowAdmission, Priority, Refusal, RequestId, RequestSpec,
    SiteConfig, SiteEvent, SiteModel, bands::band_headroom,
};
use openai::Api;

/// The largest request body read; one byte more is answered 413.
pub const MAX_REQUEST_BODY_BYTES: usize = 1 << 20;
/// How long open connections get to finish after a stop before they are cut.
pub const SHUTDOWN_GRACE_MS: u64 = 1_000;

/// What a simulated site is.
#[derive(Clone, Debug, PartialEq)]
pub struct SimSiteConfig {
    /// Its endpoints, slots and service times.
    pub site: SiteConfig,
    /// Its EPP's pool, namespace and model.
    pub identity: EppIdentity,
    /// Fixes its service-time draws.
    pub seed: u64,
    /// Makes the model-server layer put spoofed copies of the EPP-owned flow headers on
    /// its answers, to show the EPP layer does not pass them on.
    pub spoof_flow_headers: bool,
    /// Where the EPP layer reads band capacity from (the live registry unless a test
    /// wants the reader absent or failing).
    pub capacity_reader: CapacityReaderMode,
}

impl SimSiteConfig {
    /// A site serving `model`, its EPP pool named after the site.
    pub fn new(site: SiteConfig, model: &str) -> Self {
        let identity = EppIdentity::new(site.name.clone(), model);
        Self {
            site,
            identity,
            seed: 1,
            spoof_flow_headers: false,
            capacity_reader: CapacityReaderMode::Live,
        }
    }
}

/// Why a request got an error status, counted per reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// No such route (404).
    NotFound,
    /// A known route with the wrong method (405).
    MethodNotAllowed,
    /// The body was over [`MAX_REQUEST_BODY_BYTES`] (413).
    BodyTooLarge,
    /// The body could not be read (400).
    BodyUnreadable,
    /// The body is not a JSON object with the expected field types (400).
    InvalidJson,
    /// The `model` field names another model (404).
    UnknownModel,
    /// No endpoint is up, at arrival or when the last one went away while the request
    /// was held by flow control (503, `rejected-no-endpoints`).
    NoReadyEndpoint,
    /// The request's endpoint was taken away while it waited or ran (503).
    EndpointRemoved,
    /// The `x-sim-priority` header is not one integer (400).
    InvalidPriority,
    /// Flow control refused it: its band is at capacity (429, `rejected-saturated`).
    Saturated,
    /// It waited in its band past the flow-control TTL (429, `rejected-ttl-expired`).
    TtlExpired,
}

impl Rejection {
    /// Every reason, in counter order.
    pub const ALL: [Self; 11] = [
        Self::NotFound,
        Self::MethodNotAllowed,
        Self::BodyTooLarge,
        Self::BodyUnreadable,
        Self::InvalidJson,
        Self::UnknownModel,
        Self::NoReadyEndpoint,
        Self::EndpointRemoved,
        Self::InvalidPriority,
        Self::Saturated,
        Self::TtlExpired,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::BodyTooLarge => "body_too_large",
            Self::BodyUnreadable => "body_unreadable",
            Self::InvalidJson => "invalid_json",
            Self::UnknownModel => "unknown_model",
            Self::NoReadyEndpoint => "no_ready_endpoint",
            Self::EndpointRemoved => "endpoint_removed",
            Self::InvalidPriority => "invalid_priority",
            Self::Saturated => "saturated",
            Self::TtlExpired => "ttl_expired",
        }
    }

    /// What flow control reports for it: the reasons it drops a request for.
    pub fn drop_reason(self) -> Option<DropReason> {
        match self {
            Self::NoReadyEndpoint => Some(DropReason::NoEndpoints),
            Self::Saturated => Some(DropReason::Saturated),
            Self::TtlExpired => Some(DropReason::TtlExpired),
            _ => None,
        }
    }

    fn from_refusal(refusal: Refusal) -> Self {
        match refusal {
            Refusal::NoReadyEndpoint => Self::NoReadyEndpoint,
            Refusal::Saturated => Self::Saturated,
        }
    }

    fn from_failure(reason: FailReason) -> Self {
        match reason {
            FailReason::EndpointRemoved => Self::EndpointRemoved,
            FailReason::NoEndpointLeft => Self::NoReadyEndpoint,
            FailReason::TtlExpired => Self::TtlExpired,
        }
    }

    fn status(self) -> StatusCode {
        match self {
            Self::NotFound | Self::UnknownModel => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyUnreadable | Self::InvalidJson | Self::InvalidPriority => {
                StatusCode::BAD_REQUEST
            }
            Self::NoReadyEndpoint | Self::EndpointRemoved => StatusCode::SERVICE_UNAVAILABLE,
            Self::Saturated | Self::TtlExpired => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

/// A site's state at one instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SiteStats {
    /// The site's clock (ms since it started).
    pub now_ms: u64,
    /// Endpoints up.
    pub ready_endpoints: usize,
    /// Slots on endpoints up.
    pub capacity: usize,
    /// Requests holding a slot.
    pub running: usize,
    /// Requests admitted and waiting (endpoint queues and flow control).
    pub waiting: usize,
    /// Requests answered successfully.
    pub requests: u64,
    /// Requests refused or dropped by the model.
    pub errors: u64,
    /// The degrade factor.
    pub degrade: f64,
}

type Waiter = mpsc::UnboundedSender<SiteEvent>;

struct Inner {
    model: SiteModel,
    epp: FakeEpp,
    waiters: HashMap<RequestId, Waiter>,
    capacity_reader: CapacityReaderMode,
}

impl Inner {
    /// Advances the model to `now` and hands every event to its request.
    fn advance_to(&mut self, now: u64) {
        self.model.advance(now);
        self.dispatch();
    }

    fn dispatch(&mut self) {
        while let Some(event) = self.model.poll_event() {
            let (id, terminal) = match event {
                SiteEvent::Started { id, .. } => (id, false),
                SiteEvent::Finished { id, .. } | SiteEvent::Failed { id, .. } => (id, true),
            };
            if let Some(waiter) = self.waiters.get(&id) {
                let _ = waiter.send(event);
            }
            if terminal {
                self.waiters.remove(&id);
            }
        }
    }
}

struct Shared {
    inner: Mutex<Inner>,
    clock: ElapsedClock,
    /// Wakes the driver when an arrival, cancel or control changed the next deadline.
    wake: Notify,
    shutdown: watch::Sender<bool>,
    rejections: [AtomicU64; Rejection::ALL.len()],
    model_name: String,
    spoof_flow_headers: bool,
    /// What `/metrics` answers instead of the live exposition, while set.
    epp_fault: Mutex<Option<EppFault>>,
    /// What every API request is answered with instead of being served, while set.
    answer_fault: Mutex<Option<AnswerFault>>,
    /// API requests answered by `answer_fault`.
    faulted_answers: AtomicU64,
}

/// What a failing model server answers to every API request (`POST` completions and
/// `GET /v1/models`) at once instead of serving it, while its EPP's `/metrics` stays live
/// and healthy: a site that fails fast where the signals say nothing is wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnswerFault {
    /// The status every request gets (500, 503, 429...).
    pub status: u16,
    /// A `Retry-After` in seconds with it, when set.
    pub retry_after_s: Option<u64>,
}

/// What a faulty EPP answers on `/metrics` instead of the live exposition: the cases the
/// operator's scrape must survive (the fault suite switches a site through them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EppFault {
    /// 200 with an empty body: no series at all.
    NoSeries,
    /// 200 with the live exposition padded past [`EPP_OVERSIZE_BYTES`] (over the 1 MiB
    /// exposition cap).
    Oversize,
    /// 200 with bytes that are no exposition.
    Garbage,
    /// The live exposition, after this delay.
    Slow(Duration),
}

/// How large an [`EppFault::Oversize`] answer is: just over the 1 MiB exposition cap.
pub const EPP_OVERSIZE_BYTES: usize = (1 << 20) + 4_096;

impl Shared {
    /// The error answer for `reason`, with the drop reason when flow control dropped it.
    fn reject(&self, reason: Rejection) -> Response<SimBody> {
        self.rejections[reason.index()].fetch_add(1, Ordering::Relaxed);
        let mut response = json_response(
            reason.status(),
            &openai::error_body(
                reason.as_str(),
                "invalid_request_error",
                reason.status().as_u16(),
            ),
        );
        if let Some(dropped) = reason.drop_reason() {
            flow_headers::own(
                response.headers_mut(),
                FlowSignal {
                    dropped: Some(dropped),
                    ..FlowSignal::default()
                },
            );
        }
        response
    }

    /// The model-server layer's answer head: spoofed flow headers when so configured.
    fn model_server_head(&self, response: &mut Response<SimBody>) {
        if self.spoof_flow_headers {
            flow_headers::spoof(response.headers_mut());
        }
    }

    /// The EPP layer, at response-header time: reads the band that admitted the request
    /// from the live registry now and owns the flow headers on `response`.
    fn epp_head(&self, response: &mut Response<SimBody>, flow: Option<FlowAdmission>) {
        let headroom = {
            let mut inner = self.inner.lock();
            inner.advance_to(self.clock.now_ms());
            let reader = inner.capacity_reader.reader(&inner.model);
            band_headroom(reader, flow.map(|f| f.band))
        };
        // Advancing may have started requests: the driver re-reads its deadline.
        self.wake.notify_one();
        flow_headers::own(
            response.headers_mut(),
            FlowSignal {
                headroom,
                queued_ms: flow.map(|f| f.queued_ms),
                dropped: None,
            },
        );
    }

    /// Runs `f` on the model advanced to the clock, then wakes the driver.
    fn with_model<R>(&self, f: impl FnOnce(&mut SiteModel) -> R) -> R {
        let out = {
            let mut inner = self.inner.lock();
            inner.advance_to(self.clock.now_ms());
            let out = f(&mut inner.model);
            inner.dispatch();
            out
        };
        self.wake.notify_one();
        out
    }
}

/// Steers a running simulated site and reads its state. Cheap to clone.
#[derive(Clone)]
pub struct SimSiteControl {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SimSiteControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimSiteControl")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl SimSiteControl {
    /// The site's slots (endpoints times slots per endpoint) and its median service time.
    pub fn slots_and_service(&self) -> (usize, Duration) {
        self.shared.with_model(|m| {
            let median_ms = m.config().service.median_ms;
            (m.capacity(), Duration::from_secs_f64(median_ms / 1_000.0))
        })
    }

    /// Every request that starts from now on takes `factor` times its service time.
    pub fn degrade(&self, factor: f64) -> Result<(), Error> {
        self.shared.with_model(|m| m.set_degrade(factor))?;
        Ok(())
    }

    /// Takes every endpoint away: what is running or waiting fails, new requests get 503,
    /// and the EPP reports zero ready endpoints.
    pub fn drop_all_endpoints(&self) {
        self.shared.with_model(|m| m.take_all_endpoints(m.now()));
    }

    /// Brings every endpoint back and the degrade factor to 1.
    pub fn restore(&self) {
        self.shared.with_model(|m| {
            m.restore_all_endpoints(m.now());
            let _ = m.set_degrade(1.0);
        });
    }

    /// Takes one endpoint away or brings it back.
    pub fn set_endpoint_up(&self, index: usize, up: bool) -> Result<(), Error> {
        self.shared
            .with_model(|m| m.set_endpoint_up(m.now(), index, up))?;
        Ok(())
    }

    /// Provisions flow-control band `priority` or changes its capacity (`None`:
    /// unbounded), as a control plane does at runtime; the EPP's exposition and response
    /// headers see it at once.
    pub fn set_band(&self, priority: Priority, capacity: Option<usize>) -> Result<(), Error> {
        self.shared.with_model(|m| m.set_band(priority, capacity))?;
        Ok(())
    }

    /// Deprovisions an empty band (not band 0).
    pub fn remove_band(&self, priority: Priority) -> Result<(), Error> {
        self.shared.with_model(|m| m.remove_band(priority))?;
        Ok(())
    }

    /// Band `priority` now, if provisioned.
    pub fn band_snapshot(&self, priority: Priority) -> Option<BandSnapshot> {
        self.shared.with_model(|m| m.band_snapshot(priority))
    }

    /// Switches where the EPP layer reads band capacity from.
    pub fn set_capacity_reader(&self, mode: CapacityReaderMode) {
        self.shared.inner.lock().capacity_reader = mode;
    }

    /// Makes `/metrics` answer `fault` instead of the live exposition (`None`: live again).
    pub fn set_epp_fault(&self, fault: Option<EppFault>) {
        *self.shared.epp_fault.lock() = fault;
    }

    /// Makes every API request get `fault` at once (`None`: served again).
    pub fn set_answer_fault(&self, fault: Option<AnswerFault>) {
        *self.shared.answer_fault.lock() = fault;
    }

    /// API requests answered by an [`AnswerFault`] so far.
    pub fn faulted_answers(&self) -> u64 {
        self.shared.faulted_answers.load(Ordering::Relaxed)
    }

    /// The state now.
    pub fn stats(&self) -> SiteStats {
        self.shared.with_model(|m| SiteStats {
            now_ms: m.now(),
            ready_endpoints: m.endpoints().filter(|e| e.up).count(),
            capacity: m.capacity(),
            running: m.running(),
            waiting: m.waiting(),
            requests: m.counters().requests,
            errors: m.counters().errors,
            degrade: m.degrade(),
        })
    }

    /// The EPP exposition now, as `GET /metrics` would answer.
    pub fn metrics(&self) -> Vec<u8> {
        let mut inner = self.shared.inner.lock();
        inner.advance_to(self.shared.clock.now_ms());
        let Inner { model, epp, .. } = &mut *inner;
        epp.render(model)
    }

    /// Requests answered with an error status for `reason` so far.
    pub fn rejections(&self, reason: Rejection) -> u64 {
        self.shared.rejections[reason.index()].load(Ordering::Relaxed)
    }

    /// Asks the site to stop (idempotent); [`SimSite::stop`] also waits for it.
    pub fn shutdown(&self) {
        self.shared.shutdown.send_replace(true);
    }
}

/// A running simulated site. Dropping it asks it to stop; [`SimSite::stop`] also waits.
pub struct SimSite {
    addr: SocketAddr,
    control: SimSiteControl,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for SimSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimSite")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl SimSite {
    /// Binds 127.0.0.1 on a free port and starts serving. Must run inside a tokio
    /// runtime.
    pub async fn start(config: SimSiteConfig) -> Result<Self, Error> {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST, config).await
    }

    /// As [`SimSite::start`], bound to `ip` (a namespace's end of its link, say).
    pub async fn start_on(ip: std::net::Ipv4Addr, config: SimSiteConfig) -> Result<Self, Error> {
        let model = SiteModel::new(config.site, config.seed)?;
        let listener = TcpListener::bind((ip, 0)).await?;
        let addr = listener.local_addr()?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                model,
                epp: FakeEpp::new(config.identity.clone()),
                waiters: HashMap::new(),
                capacity_reader: config.capacity_reader,
            }),
            clock: ElapsedClock::start(),
            wake: Notify::new(),
            shutdown,
            rejections: std::array::from_fn(|_| AtomicU64::new(0)),
            model_name: config.identity.model,
            spoof_flow_headers: config.spoof_flow_headers,
            epp_fault: Mutex::new(None),
            answer_fault: Mutex::new(None),
            faulted_answers: AtomicU64::new(0),
        });
        let task = tokio::spawn({
            let shared = Arc::clone(&shared);
            async move {
                tokio::join!(
                    serve(listener, Arc::clone(&shared), shutdown_rx.clone()),
                    drive(Arc::clone(&shared), shutdown_rx),
                );
                // Requests still waiting learn that nothing will come.
                shared.inner.lock().waiters.clear();
            }
        });
        Ok(Self {
            addr,
            control: SimSiteControl { shared },
            task: Some(task),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:port{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Its control handle.
    pub fn control(&self) -> SimSiteControl {
        self.control.clone()
    }

    /// Stops accepting, gives open connections [`SHUTDOWN_GRACE_MS`] to finish, cuts
    /// the rest, and returns once every task of the site has ended.
    pub async fn stop(mut self) {
        self.control.shutdown();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for SimSite {
    fn drop(&mut self) {
        self.control.shutdown();
    }
}

/// Resolves once a stop was asked (at once if it already was).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // The guard `wait_for` hands back is not `Send`; drop it here.
    let _ = shutdown.wait_for(|stop| *stop).await.map(|_| ());
}

async fn drive(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let deadline = shared.inner.lock().model.next_deadline();
        let sleep = async {
            match deadline {
                Some(ms) => tokio::time::sleep_until(shared.clock.instant_at(ms)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = sleep => {}
            () = shared.wake.notified() => {}
            () = stopped(&mut shutdown) => return,
        }
        shared.inner.lock().advance_to(shared.clock.now_ms());
    }
}

async fn serve(listener: TcpListener, shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    connections.spawn(connection(stream, Arc::clone(&shared), shutdown.clone()));
                }
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = stopped(&mut shutdown) => break,
        }
    }
    drop(listener);
    let drained = async { while connections.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(Duration::from_millis(SHUTDOWN_GRACE_MS), drained).await;
    connections.shutdown().await;
}

async fn connection(stream: TcpStream, shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let builder = auto::Builder::new(TokioExecutor::new());
    let service = service_fn(move |request| {
        let shared = Arc::clone(&shared);
        async move { Ok::<_, Infallible>(route(shared, request).await) }
    });
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        () = stopped(&mut shutdown) => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_millis(SHUTDOWN_GRACE_MS), conn.as_mut()).await;
        }
    }
}

fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<SimBody> {
    let mut response = Response::new(body::full(value.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

async fn route(shared: Arc<Shared>, request: Request<Incoming>) -> Response<SimBody> {
    let path = request.uri().path();
    let api = Api::from_path(path);
    let fault = *shared.answer_fault.lock();
    if let Some(fault) = fault.filter(|_| path != "/metrics") {
        shared.faulted_answers.fetch_add(1, Ordering::Relaxed);
        let status =
            StatusCode::from_u16(fault.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = json_response(
            status,
            &openai::error_body("site_fault", "server_error", fault.status),
        );
        if let Some(s) = fault.retry_after_s {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(s));
        }
        return response;
    }
    match (request.method(), path, api) {
        (&Method::GET, "/metrics", _) => {
            let fault = shared.epp_fault.lock().clone();
            if let Some(EppFault::Slow(delay)) = fault {
                tokio::time::sleep(delay).await;
            }
            let live = || {
                SimSiteControl {
                    shared: Arc::clone(&shared),
                }
                .metrics()
            };
            let text = match fault {
                None | Some(EppFault::Slow(_)) => live(),
                Some(EppFault::NoSeries) => Vec::new(),
                Some(EppFault::Garbage) => {
                    b"\x00\xff{not an exposition}\n\x7f garbage 1 2 3\n".to_vec()
                }
                Some(EppFault::Oversize) => {
                    let mut text = live();
                    let pad = b"# padding past the exposition cap\n";
                    while text.len() < EPP_OVERSIZE_BYTES {
                        text.extend_from_slice(pad);
                    }
                    text
                }
            };
            let mut response = Response::new(body::full(text));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            response
        }
        (&Method::GET, "/v1/models", _) => {
            json_response(StatusCode::OK, &openai::models(&shared.model_name))
        }
        (&Method::POST, _, Some(api)) => infer(shared, api, request).await,
        (_, "/metrics" | "/v1/models", _) | (_, _, Some(_)) => {
            shared.reject(Rejection::MethodNotAllowed)
        }
        _ => shared.reject(Rejection::NotFound),
    }
}

/// An admitted request: withdrawn from the model if dropped before it ended.
struct Admitted {
    shared: Arc<Shared>,
    id: RequestId,
    ended: bool,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if !self.ended {
            let id = self.id;
            self.shared.inner.lock().waiters.remove(&id);
            self.shared.with_model(|m| m.cancel(m.now(), id));
        }
    }
}

/// A request read, checked and admitted to the model: the guard that withdraws it, the
/// events the driver hands it, and whether it streams.
type Arrival = (Admitted, mpsc::UnboundedReceiver<SiteEvent>, bool);

/// Reads the request (its band, its body), checks it and admits it to the model; the
/// error answer when any of that refuses it.
async fn admit(
    shared: &Arc<Shared>,
    api: Api,
    request: Request<Incoming>,
) -> Result<Arrival, Response<SimBody>> {
    let Some(priority) = flow_headers::requested_priority(request.headers()) else {
        return Err(shared.reject(Rejection::InvalidPriority));
    };
    let body = match Limited::new(request.into_body(), MAX_REQUEST_BODY_BYTES)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return Err(shared.reject(Rejection::BodyTooLarge));
        }
        Err(_) => return Err(shared.reject(Rejection::BodyUnreadable)),
    };
    let Some(parsed) = openai::parse_request(&body) else {
        return Err(shared.reject(Rejection::InvalidJson));
    };
    if parsed
        .model
        .as_deref()
        .is_some_and(|m| m != shared.model_name)
    {
        return Err(shared.reject(Rejection::UnknownModel));
    }
    let streaming = parsed.stream && api != Api::Embeddings;
    let (tx, events) = mpsc::unbounded_channel();
    let admitted = {
        let mut inner = shared.inner.lock();
        inner.advance_to(shared.clock.now_ms());
        let service_ms = (api == Api::Embeddings).then(|| {
            let share = inner.model.config().service.prefill_share;
            ((inner.model.draw_service_ms() as f64 * share).round() as u64).max(1)
        });
        let spec = RequestSpec {
            streaming,
            service_ms,
        };
        let now = inner.model.now();
        let admitted = inner.model.arrive_prioritized(now, spec, priority);
        if let Ok(id) = admitted {
            inner.waiters.insert(id, tx);
            inner.dispatch();
        }
        admitted
    };
    let id = match admitted {
        Ok(id) => id,
        Err(refusal) => return Err(shared.reject(Rejection::from_refusal(refusal))),
    };
    shared.wake.notify_one();
    let admitted = Admitted {
        shared: Arc::clone(shared),
        id,
        ended: false,
    };
    Ok((admitted, events, streaming))
}

async fn infer(shared: Arc<Shared>, api: Api, request: Request<Incoming>) -> Response<SimBody> {
    let (mut admitted, mut events, streaming) = match admit(&shared, api, request).await {
        Ok(arrival) => arrival,
        Err(refused) => return refused,
    };
    let id = admitted.id;
    // Nothing answers before the request leaves flow control and takes a slot: what it
    // went through there is known from then on.
    let (endpoint, first_token_at, finish_at, flow) = loop {
        match events.recv().await {
            Some(SiteEvent::Started {
                endpoint,
                first_token_at,
                finish_at,
                flow,
                ..
            }) => break (endpoint, first_token_at, finish_at, flow),
            Some(SiteEvent::Finished { .. }) => {}
            Some(SiteEvent::Failed { reason, .. }) => {
                admitted.ended = true;
                return shared.reject(Rejection::from_failure(reason));
            }
            // The site is stopping.
            None => {
                admitted.ended = true;
                return shared.reject(Rejection::NoReadyEndpoint);
            }
        }
    };
    let name = endpoint_name(&shared, Some(endpoint));
    if streaming {
        let (chunks, body) = body::channel();
        let mut response = Response::new(body);
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-cache"),
        );
        shared.model_server_head(&mut response);
        shared.epp_head(&mut response, flow);
        let started = Started {
            name,
            first_token_at,
            finish_at,
        };
        tokio::spawn(stream(admitted, api, events, chunks, started));
        return response;
    }
    loop {
        match events.recv().await {
            Some(SiteEvent::Finished { .. }) => {
                admitted.ended = true;
                let mut response = json_response(
                    StatusCode::OK,
                    &openai::full_response(api, id, &shared.model_name, &name),
                );
                if let Ok(value) = header::HeaderValue::from_str(&name) {
                    response.headers_mut().insert("x-sim-endpoint", value);
                }
                shared.model_server_head(&mut response);
                shared.epp_head(&mut response, flow);
                return response;
            }
            Some(SiteEvent::Started { .. }) => {}
            Some(SiteEvent::Failed { reason, .. }) => {
                admitted.ended = true;
                return shared.reject(Rejection::from_failure(reason));
            }
            // The site is stopping.
            None => {
                admitted.ended = true;
                return shared.reject(Rejection::NoReadyEndpoint);
            }
        }
    }
}

/// Where a request runs: its endpoint's name, when its first token is out and when it
/// completes.
struct Started {
    name: String,
    first_token_at: u64,
    finish_at: u64,
}

fn endpoint_name(shared: &Shared, endpoint: Option<usize>) -> String {
    let inner = shared.inner.lock();
    endpoint
        .and_then(|e| inner.model.endpoints().nth(e))
        .map_or_else(String::new, |e| e.name.to_owned())
}

/// Writes a streamed answer: a chunk per word spread from the first token to the finish,
/// the finishing chunk and `[DONE]` when the model says the request completed.
async fn stream(
    mut admitted: Admitted,
    api: Api,
    mut events: mpsc::UnboundedReceiver<SiteEvent>,
    chunks: mpsc::Sender<Bytes>,
    started: Started,
) {
    let shared = Arc::clone(&admitted.shared);
    let id = admitted.id;
    let model = shared.model_name.clone();
    let words = openai::WORDS.len() as u64;
    let Started {
        name,
        first_token_at: first,
        finish_at: finish,
    } = started;
    let mut sent = 0u64;
    loop {
        let due = (sent < words).then(|| first + (finish - first) * sent / words);
        let next_word = async {
            match due {
                Some(ms) => tokio::time::sleep_until(shared.clock.instant_at(ms)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = next_word => {
                let chunk = openai::stream_chunk(api, id, &model, &name, sent as usize);
                if chunks.send(Bytes::from(chunk)).await.is_err() {
                    return; // the client went away: dropping `admitted` frees the slot
                }
                sent += 1;
            }
            event = events.recv() => match event {
                Some(SiteEvent::Started { .. }) => {}
                Some(SiteEvent::Finished { .. }) => {
                    admitted.ended = true;
                    for i in sent..=words {
                        let chunk = openai::stream_chunk(api, id, &model, &name, i as usize);
                        if chunks.send(Bytes::from(chunk)).await.is_err() {
                            return;
                        }
                    }
                    let _ = chunks.send(Bytes::from_static(openai::DONE.as_bytes())).await;
                    return;
                }
                Some(SiteEvent::Failed { reason, .. }) => {
                    admitted.ended = true;
                    shared.rejections[Rejection::from_failure(reason).index()].fetch_add(1, Ordering::Relaxed);
                    let error = openai::error_body(reason.as_str(), "server_error", 503);
                    let _ = chunks.send(Bytes::from(format!("data: {error}\n\n"))).await;
                    return;
                }
                None => {
                    admitted.ended = true;
                    return;
                }
            }
        }
    }
}
