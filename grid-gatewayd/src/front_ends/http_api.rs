//! The OpenAI-compatible HTTP surface: routes, body admission, proxying, errors.
//!
//! # Request bodies are held, answers stream
//!
//! A request body is read into memory up to `bodyLimitBytes` (413 beyond, decided
//! before anything is sent upstream) within `clientBodyTimeoutSeconds` of its head (408
//! past it: a client trickling its body would otherwise hold its connection and buffer
//! for as long as it likes, the listener's idle bound not applying while a request is in
//! flight), scanned for its `model` field and forwarded unchanged. Holding it is what makes the 413 and 400 answers exact and what allows the
//! one retry below. The answer is never held: its frames are passed on as they arrive,
//! so `stream: true` server-sent events reach the client token by token (frames that
//! arrive together leave together, [`crate::engine::body::coalesce`]).
//!
//! # One retry, only when nothing was sent
//!
//! When connecting to the chosen site fails (refused, unreachable, TLS handshake
//! refused, connect timeout), no byte of the request has left the gateway, so it is
//! safe to try once more on a different site chosen from the same snapshot. Any failure
//! after the request may have been sent is answered 502 without retry: completions are
//! not idempotent (a retried generation costs the site twice and may answer
//! differently). A failure after the answer started cannot be turned into an error
//! status; the client sees the stream cut.
//!
//! # Every wait on a site is bounded
//!
//! Connecting (TCP and TLS) by `connectTimeoutSeconds` (a connect failure: retried once),
//! sending until the answer's head by `upstreamHeadersTimeoutSeconds` (504, not retried:
//! the request was sent), each silence inside the answer body by
//! `upstreamIdleTimeoutSeconds` (the answer is cut, [`crate::engine::body::idle`]). Each one that
//! runs out is counted in `grid_gateway_upstream_timeouts_total{site,phase}` and recorded
//! in the site's live slot as a serving failure, exactly as a refused connection or a 5xx
//! is: a site that hangs is weighed down like one that fails.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use prometheus_client::registry::Registry;

use crate::engine::BoxError;
use crate::engine::body::coalesce::Coalesce;
use crate::engine::body::idle::{IdleBody, IdleReport};
use crate::engine::client::request_body::{BodyFailure, read_whole};
use crate::engine::request_metrics::{
    RequestMetrics, RetryLabels, RetrySkipped, TimeoutPhase, UpstreamFailure, UpstreamFailureLabels,
};
use crate::engine::site::answer_evidence::{Evidence, take_live_evidence};
use crate::engine::site::answer_timing::{AnswerHead, TimedBody};
use crate::engine::site::slots::{ConnectionShare, NoSlot, SiteSlots};
use grid_daemon::{exposition, probe};
use grid_gateway::headers::{sanitize_request, strip_hop_by_hop};
use grid_gateway::pick::{Routed, decide};
use grid_gateway::poller::{PollMetrics, PollResult};
use grid_gateway::refusal::{ApiErrorKind, Refusal, model_of};
use grid_gateway::request_rng::ThreadRng;
use grid_gateway::routes::{Target, admit};
use grid_score::catalog::Upstream;
use grid_score::live;
use grid_score::retry::{AttemptEnd, RetryBudget, RetryCause, goes_elsewhere};
use grid_score::routing::{RETRY_PATH, RoutingView};

use crate::engine::site::pool::{Outgoing, SiteBody, SiteError};
use crate::engine::site::slots::Slot;
use grid_gateway::upstream::Published;
use grid_gateway::upstream::{HttpClient, PlainConnect};

/// Boxed response body: either a streamed upstream answer or a small local one.
pub(crate) type ResponseBody = BoxBody<Bytes, BoxError>;

/// A probe's answer ([`grid_daemon::probe`]): `/healthz` is `ok` while the process
/// serves; `/readyz` says whether this gateway can serve and, beside it, what the grid
/// lets it route (`readiness`).
fn probe(ready: bool, readiness: &str) -> Response<ResponseBody> {
    let (status, mut text) = probe::answer(ready, "no poll of the operator has been attempted yet");
    text.push_str(readiness);
    let mut r = Response::new(full(text));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(probe::CONTENT_TYPE),
    );
    r
}

/// The request handler shared by every connection.
#[derive(Clone)]
pub(crate) struct Api {
    inner: Arc<Inner>,
}

/// What a handler serves with; the driver builds it once.
pub(crate) struct Inner {
    /// The routing slot requests read.
    pub(crate) routes: Published,
    /// Woken after a response carried live evidence: the poller refreshes off-cycle.
    pub(crate) live_refresh: Arc<tokio::sync::Notify>,
    /// The client of serving sites over TLS (those in the clear use their own pool).
    pub(crate) client: HttpClient,
    /// What the pools of sites in the clear open connections with.
    pub(crate) plain: PlainConnect,
    /// `bodyLimitBytes`.
    pub(crate) body_limit: usize,
    /// `clientBodyTimeoutSeconds`: the whole body read, from the head's arrival.
    pub(crate) body_timeout: Duration,
    /// The bounds on waiting for a site's answer.
    pub(crate) waits: UpstreamWaits,
    /// Each site's slots (`maxConnectionsPerSite`), swapped whole by a model reload.
    pub(crate) site_slots: Arc<arc_swap::ArcSwap<SiteSlots>>,
    /// Request series.
    pub(crate) metrics: RequestMetrics,
    /// grid-score's decision series.
    pub(crate) score: grid_score::ScoreMetrics,
    /// What `/metrics` encodes; it already holds `metrics` and `score`.
    pub(crate) registry: Arc<Registry>,
    /// Read by `/readyz` and the routing evidence.
    pub(crate) poll: PollMetrics,
    /// This gateway's site (`site`), named by the routing evidence.
    pub(crate) site: Arc<str>,
    /// The retries refused requests may still take (`grid_score::retry`); sampled every
    /// second by the driver's timer.
    pub(crate) retry_budget: Arc<RetryBudget>,
}

/// The bounds on waiting for a site's answer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UpstreamWaits {
    /// For a slot of a full site: the connect bound, the wait for a connection.
    pub(crate) slot: Duration,
    /// Sending until the answer's head (`upstreamHeadersTimeoutSeconds`).
    pub(crate) headers: Duration,
    /// Each silence inside the answer body (`upstreamIdleTimeoutSeconds`).
    pub(crate) idle: Duration,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("body_limit", &self.inner.body_limit)
            .finish_non_exhaustive()
    }
}

fn full(b: impl Into<Bytes>) -> ResponseBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

/// `refusal`'s answer, marked with its kind so [`Api::handle`] counts the outcome.
fn refused(refusal: &Refusal) -> Response<ResponseBody> {
    let mut r = refusal
        .to_response::<Full<Bytes>>()
        .map(|b| b.map_err(|never| match never {}).boxed());
    // Read back by `handle` to count the outcome; extensions never reach the wire.
    r.extensions_mut().insert(refusal.kind);
    r
}

/// The `GET /v1/models` body: the models with at least one routable site, in the
/// OpenAI-style list format.
pub(crate) fn models_body(view: &RoutingView) -> String {
    let data: Vec<_> = view
        .catalog()
        .models()
        .iter()
        .filter(|m| view.is_routable(&m.name))
        .map(|m| serde_json::json!({"id": &*m.name, "object": "model", "created": 0, "owned_by": "grid"}))
        .collect();
    serde_json::json!({"object": "list", "data": data}).to_string()
}

impl Api {
    /// A handler over `inner`.
    pub(crate) fn new(inner: Inner) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The answer to a request whose HTTP/1.1 head could not be read (the gateway's own
    /// server found it malformed, too large or ambiguously framed), counted as its
    /// outcome like every other refusal.
    pub(crate) fn refuse_head(&self, kind: ApiErrorKind, message: &str) -> Response<ResponseBody> {
        self.inner.metrics.outcome(kind.as_str());
        refused(&Refusal::new(kind, message))
    }

    /// Where a request is answered, judged by its head alone ([`admit`]: 404, 405, 413
    /// above `bodyLimitBytes`). Made by [`Api::handle`] and by the HTTP/1.1 server before
    /// it sends `100 Continue`.
    pub(crate) fn admit(
        &self,
        method: &Method,
        path: &str,
        declared_len: u64,
    ) -> Result<Target, Refusal> {
        admit(method, path, declared_len, self.inner.body_limit)
    }

    /// The answer refusing a request by its head alone ([`Api::admit`]), counted as its
    /// outcome; `None` when the head is admitted.
    pub(crate) fn refuse_by_head(
        &self,
        method: &Method,
        path: &str,
        declared_len: u64,
    ) -> Option<Response<ResponseBody>> {
        let refusal = self.admit(method, path, declared_len).err()?;
        self.inner.metrics.outcome(refusal.kind.as_str());
        Some(refused(&refusal))
    }

    /// Answers one request. Never fails: every problem becomes an OpenAI-style answer.
    /// `share` is what the request's connection holds of each site's slots (HTTP/2; an
    /// HTTP/1.1 connection carries one request at a time and passes none).
    pub(crate) async fn handle<B>(
        &self,
        req: Request<B>,
        share: Option<&Arc<ConnectionShare>>,
    ) -> Response<ResponseBody>
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        // A declared length is the body's size hint (both servers read it into the body
        // when they framed it).
        let declared_len = req.body().size_hint().lower();
        let target = self.admit(req.method(), req.uri().path(), declared_len);
        let proxied = matches!(target, Ok(Target::Proxied));
        let resp = match target {
            Ok(Target::Proxied) => self.proxy(req, share).await,
            Ok(Target::Models) => {
                let mut r = Response::new(full(models_body(&self.inner.routes.load())));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                r
            }
            Ok(Target::Metrics) => self.metrics(&req),
            Ok(Target::Routing) => self.routing(&req),
            Ok(Target::Healthz) => probe(true, ""),
            Ok(Target::Readyz) => {
                // Ready once the listener serves, the configuration loaded and a poll was
                // attempted, whatever it found.
                let ready = PollResult::ALL
                    .into_iter()
                    .any(|r| self.inner.poll.polls(r) > 0);
                probe(ready, &self.readiness())
            }
            Err(refusal) => refused(&refusal),
        };
        // Every answer `proxy` gives that is not its own refusal came from a site: known
        // without looking `x-grid-site` up in the answer's map.
        let outcome = match resp.extensions().get::<ApiErrorKind>() {
            Some(kind) => kind.as_str(),
            None if proxied => crate::engine::request_metrics::PROXIED,
            None => "local",
        };
        self.inner.metrics.outcome(outcome);
        resp
    }

    /// What `/readyz` says beside the gateway's own readiness: whether its polls succeed
    /// (why the last failed, when it did) and what each model can be routed to. Reported,
    /// never folded into the status: a readiness probe failing every gateway at once when
    /// the signals are lost would turn a monitoring outage into a total one.
    fn readiness(&self) -> String {
        use std::fmt::Write as _;
        let mut text = String::new();
        let _ = match self.inner.poll.last_failure() {
            Some(cause) => writeln!(text, "operator: the last poll failed: {cause}"),
            None if self.inner.poll.polls(PollResult::Ok) > 0 => {
                writeln!(text, "operator: polls succeed")
            }
            None => writeln!(text, "operator: no poll has ended yet"),
        };
        let view = self.inner.routes.load();
        for m in view.catalog().models() {
            let state = match view.table().get(&m.name) {
                Some(s) if s.candidates().is_empty() => "unroutable: every site is out",
                Some(s) if s.path() == Some(grid_score::Path::Fallback) => {
                    "routed without signals, by capacity"
                }
                Some(_) if view.is_shedding(&m.name) => "shedding: every site is full",
                Some(_) => "routed by load",
                None => "not in the routing table",
            };
            let _ = writeln!(text, "model {}: {state}", m.name);
        }
        text
    }

    /// The routing evidence (`GET /v1/grid/routing[?model=NAME]`): read off the view
    /// requests read, encoded here, off the request path.
    fn routing<B>(&self, req: &Request<B>) -> Response<ResponseBody> {
        let only = crate::front_ends::routing_evidence::model_query(req.uri().query());
        let view = self.inner.routes.load();
        let doc = crate::front_ends::routing_evidence::document(
            &self.inner.site,
            &view,
            &self.inner.poll,
            only.as_deref(),
            grid_gateway::clock::wall_ms(),
        );
        let body = serde_json::to_vec(&doc).unwrap_or_default();
        let mut r = Response::new(full(body));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    }

    /// The exposition negotiated as the operator's is: `OpenMetrics` when `Accept` names
    /// it, text 0.0.4 otherwise (what `promtool check metrics` and `curl` read).
    fn metrics<B>(&self, req: &Request<B>) -> Response<ResponseBody> {
        let (text, kind) = exposition::negotiate_for(&self.inner.registry, req.headers());
        let mut r = Response::new(full(text));
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
        r
    }

    async fn proxy<B>(
        &self,
        req: Request<B>,
        share: Option<&Arc<ConnectionShare>>,
    ) -> Response<ResponseBody>
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        // A declared length above the limit was refused by `admit`, before a byte of the
        // body was read; one that is not declared is bounded as it is read.
        let limit = self.inner.body_limit;
        let (mut parts, body) = req.into_parts();
        let bound = self.inner.body_timeout;
        let body = match read_whole(body, limit, bound).await {
            Ok(body) => body,
            Err(BodyFailure::TooLarge) => return refused(&Refusal::too_large(limit)),
            Err(BodyFailure::TimedOut) => return refused(&Refusal::body_timeout(bound)),
            Err(BodyFailure::Read(e)) => return refused(&Refusal::unreadable_body(&e)),
        };
        let model = match model_of(&body) {
            Ok(m) => m,
            Err(refusal) => return refused(&refusal),
        };
        sanitize_request(&mut parts.headers);
        let path_and_query = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));

        // The flow-control band the request names: what its answer's room describes.
        let band = live::BandKey::named(
            parts
                .headers
                .get(live::BAND_REQUEST_HEADER)
                .map(HeaderValue::as_bytes),
        );
        let view = self.inner.routes.load();
        let mut upstream = match decide(&view, &self.inner.score, &model) {
            Ok(Routed { upstream }) => upstream,
            Err(refusal) => return refused(&refusal),
        };
        let mut retried = false;
        loop {
            let attempt = self
                .send_to(upstream, share, &parts, &path_and_query, &body, band)
                .await;
            let end = match attempt {
                Ok(resp) => {
                    // A site's own refusal (503, 429) goes elsewhere when it can; what
                    // cannot is passed on as the site said it.
                    let refused = goes_elsewhere(AttemptEnd::Answered(resp.status().as_u16()));
                    match refused.filter(|_| !retried) {
                        Some(cause) => match self.retry_target(&view, &model, upstream, cause) {
                            Some(next) => {
                                drop(resp);
                                upstream = next;
                                retried = true;
                                continue;
                            }
                            None => return resp,
                        },
                        None => return resp,
                    }
                }
                Err(Failed::Path(message)) => {
                    return refused(&Refusal::new(ApiErrorKind::BadRequest, message));
                }
                Err(Failed::ShareUsed) => return refused(&Refusal::connection_share(&model)),
                Err(Failed::Connect) => AttemptEnd::NotSent,
                Err(Failed::Exchange) => AttemptEnd::ResetBeforeAnswer,
                Err(Failed::HeadersTimedOut) => AttemptEnd::NoAnswerInTime,
            };
            if !retried
                && let Some(cause) = goes_elsewhere(end)
                && let Some(next) = self.retry_target(&view, &model, upstream, cause)
            {
                upstream = next;
                retried = true;
                continue;
            }
            return match end {
                AttemptEnd::NoAnswerInTime => refused(&Refusal::upstream_timed_out(&model)),
                _ => refused(&Refusal::upstream_failed(&model)),
            };
        }
    }

    /// Where a request `failed` refused for `cause` goes next: the least-loaded routable
    /// site of `model` other than the one that refused it, when the retry budget allows
    /// one (`grid_score::retry`). Counted either way.
    fn retry_target<'v>(
        &self,
        view: &'v RoutingView,
        model: &str,
        failed: &Upstream,
        cause: RetryCause,
    ) -> Option<&'v Upstream> {
        let metrics = &self.inner.metrics;
        let Some(next) = view.retry_target(model, &failed.site, &mut ThreadRng) else {
            metrics.retry_skipped(RetrySkipped::NoOtherSite);
            return None;
        };
        if !self
            .inner
            .retry_budget
            .try_retry(grid_gateway::clock::wall_ms(), metrics.requests_total())
        {
            metrics.retry_skipped(RetrySkipped::Budget);
            return None;
        }
        let labels = RetryLabels {
            site: next.site.to_string(),
            cause,
        };
        metrics.retries.get_or_create(&labels).inc();
        failed.tally().retried_away();
        next.tally().retried_here();
        tracing::debug!(site = %next.site, path = RETRY_PATH, cause = cause.as_str(), "retrying on another site");
        Some(next)
    }

    /// One attempt at one upstream: the answer streamed back with `x-grid-site`, or why
    /// it failed (counted here). What the answer's head says about the site (its
    /// flow-control headers, a 5xx, a failed exchange) goes to the site's live slot, as
    /// room of the request's `band`; the site's flow-control headers are replaced by the
    /// grid's restatement of that band's headroom at that site.
    async fn send_to(
        &self,
        upstream: &Upstream,
        share: Option<&Arc<ConnectionShare>>,
        parts: &http::request::Parts,
        path_and_query: &http::uri::PathAndQuery,
        body: &Bytes,
        band: live::BandKey,
    ) -> Result<Response<ResponseBody>, Failed> {
        let waits = self.inner.waits;
        // Counted at its site before any wait for a slot (a tuple's parts run in order):
        // the picks that follow weigh the site by the requests bound to it; dropped with a
        // failed wait, else kept with the answer below.
        let (counted, slot) = (upstream.in_flight(), self.site_slot(upstream, share).await?);
        // A site in the clear goes over its own pool, driven from this task; TLS sites
        // over the hyper-util client.
        let pool = slot.pool.as_ref().filter(|_| upstream.scheme() == "http");
        let uri = if pool.is_some() {
            grid_gateway::upstream::origin_uri_for(upstream, path_and_query)
        } else {
            grid_gateway::upstream::uri_for(upstream, path_and_query)
        }
        .map_err(|e| Failed::Path(format!("request path: {e}")))?;
        let sent = grid_gateway::clock::monotonic();
        // The answer head's bound, from sending: a site in the clear keeps it on its
        // connection's timer (`deadline_timer`), the hyper-util client on one of its own.
        let head_by = tokio::time::Instant::now() + waits.headers;
        let exchange = async {
            if let Some(pool) = pool {
                let out = Outgoing {
                    method: &parts.method,
                    target: uri.path_and_query().map_or("/", |pq| pq.as_str()),
                    headers: &parts.headers,
                    body,
                };
                pool.send(&self.inner.plain, upstream.authority(), out, head_by)
                    .await
                    .map(|r| r.map(SiteBody::Pooled))
                    .map_err(|e| {
                        if e.is_head_timeout() {
                            SiteFailure::HeadTimedOut
                        } else {
                            SiteFailure::Pooled(e)
                        }
                    })
            } else {
                let mut out = Request::new(Full::new(body.clone()));
                *out.method_mut() = parts.method.clone();
                *out.uri_mut() = uri.clone();
                *out.headers_mut() = grid_gateway::headers::without_host(&parts.headers);
                match tokio::time::timeout_at(head_by, self.inner.client.request(out)).await {
                    // hyper's client decodes the chunks and keeps the field: an answer
                    // coded otherwise too cannot be forwarded as framed (the pool's codec
                    // refuses it by the same rule).
                    Ok(Ok(r)) if grid_h1_wire::coded_other_than_chunked(r.headers()) => {
                        Err(SiteFailure::Coded)
                    }
                    Ok(answered) => answered
                        .map(|r| r.map(SiteBody::Client))
                        .map_err(SiteFailure::Client),
                    Err(_) => Err(SiteFailure::HeadTimedOut),
                }
            }
        };
        // Counted in flight until the answer ends or the exchange fails: the guard is in
        // what the answer holds, dropped with it.
        let site_slot = Slot::held(slot.permit, slot.share, Some(counted));
        let site_header = slot.header;
        match exchange.await {
            Ok(resp) => {
                let (mut rparts, rbody) = resp.into_parts();
                let inline = matches!(rbody, SiteBody::Pooled(_));
                strip_hop_by_hop(&mut rparts.headers);
                let head = AnswerHead {
                    sent,
                    head: grid_gateway::clock::monotonic(),
                    queue_ms: None,
                    streaming: rparts
                        .headers
                        .get(header::CONTENT_TYPE)
                        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream")),
                };
                let observation = take_live_evidence(
                    self.evidence(),
                    upstream,
                    band,
                    rparts.status,
                    &mut rparts.headers,
                    site_header,
                );
                let head = AnswerHead {
                    queue_ms: observation.queue_ms,
                    ..head
                };
                let rbody = IdleBody::new(
                    rbody,
                    waits.idle,
                    IdleReport {
                        metrics: self.inner.metrics.clone(),
                        site: Arc::clone(&upstream.site),
                        slot: upstream.live_shared(),
                        live_refresh: Arc::clone(&self.inner.live_refresh),
                        _site_slot: site_slot,
                    },
                );
                // Outermost, so the timing sees each frame as the site sent it.
                let body = if rparts.status.is_success() {
                    head.record(upstream.live());
                    if head.streaming {
                        coalesced(TimedBody::new(rbody, upstream.live_shared(), head), inline)
                    } else {
                        coalesced(rbody, inline)
                    }
                } else {
                    coalesced(rbody, inline)
                };
                Ok(Response::from_parts(rparts, body))
            }
            Err(e) => Err(self.exchange_failed(upstream, &e)),
        }
    }

    /// Counts a failed exchange and feeds it to routing: whether it failed as a connect
    /// (nothing of the request arrived: it may go elsewhere) or after.
    fn exchange_failed(&self, upstream: &Upstream, e: &SiteFailure) -> Failed {
        self.serving_failure(upstream);
        let (error, is_connect): (&(dyn std::error::Error + 'static), bool) = match e {
            SiteFailure::Client(e) => (e, e.is_connect()),
            SiteFailure::Pooled(e) => (e, e.is_connect()),
            SiteFailure::Coded => (&CODED, false),
            SiteFailure::HeadTimedOut => {
                // The exchange was dropped with its connection (HTTP/1.1) or its stream
                // was reset (HTTP/2): the site's late answer goes nowhere.
                self.inner
                    .metrics
                    .timed_out(&upstream.site, TimeoutPhase::Headers);
                self.count_failure(upstream, UpstreamFailure::Request);
                let bound = self.inner.waits.headers;
                tracing::warn!(site = %upstream.site, ?bound, "upstream sent no answer head in time");
                return Failed::HeadersTimedOut;
            }
        };
        let unacknowledged = !is_connect && grid_gateway::upstream::is_unacknowledged(error);
        let connect = is_connect || unacknowledged;
        if grid_gateway::upstream::is_connect_timeout(error) {
            self.inner
                .metrics
                .timed_out(&upstream.site, TimeoutPhase::Connect);
        }
        self.count_failure(
            upstream,
            if unacknowledged {
                UpstreamFailure::Unacknowledged
            } else if connect {
                UpstreamFailure::Connect
            } else {
                UpstreamFailure::Request
            },
        );
        tracing::warn!(site = %upstream.site, error = %error, connect, "upstream failed");
        if connect {
            Failed::Connect
        } else {
            Failed::Exchange
        }
    }
}

impl Api {
    /// One of `upstream`'s slots (`maxConnectionsPerSite`), held until the answer ends,
    /// within the share of them `share` (the request's connection) may hold.
    async fn site_slot(
        &self,
        upstream: &Upstream,
        share: Option<&Arc<ConnectionShare>>,
    ) -> Result<Slot, Failed> {
        let bound = self.inner.waits.slot;
        // A clone of the map's Arc, not a guard: the wait below may outlive a reload.
        self.inner
            .site_slots
            .load_full()
            .acquire(&upstream.site, bound, share)
            .await
            .map_err(|no| match no {
                NoSlot::SiteFull => {
                    // Nothing was sent: failed over as a failed connect, never counted
                    // against the site in routing (the congestion is this gateway's).
                    self.count_failure(upstream, UpstreamFailure::SiteFull);
                    tracing::warn!(site = %upstream.site, ?bound, "every slot of the site stayed taken");
                    Failed::Connect
                }
                // The client's own excess: answered as such, not spread to other sites.
                NoSlot::ShareUsed => Failed::ShareUsed,
            })
    }

    /// What [`take_live_evidence`] records with.
    fn evidence(&self) -> Evidence<'_> {
        Evidence {
            metrics: &self.inner.metrics,
            live_refresh: &self.inner.live_refresh,
        }
    }

    /// Records a failed or timed-out exchange in the site's live slot and wakes a refresh:
    /// routing weighs the site down as it does for a 5xx.
    fn serving_failure(&self, upstream: &Upstream) {
        upstream.live().record_failure();
        upstream.tally().failed();
        self.inner.live_refresh.notify_one();
    }

    fn count_failure(&self, upstream: &Upstream, reason: UpstreamFailure) {
        let labels = UpstreamFailureLabels {
            site: upstream.site.to_string(),
            reason,
        };
        self.inner
            .metrics
            .upstream_failures
            .get_or_create(&labels)
            .inc();
    }
}

/// A site's failed exchange, from either client.
enum SiteFailure {
    Client(hyper_util::client::legacy::Error),
    Pooled(SiteError),
    /// No answer head by the deadline, from either.
    HeadTimedOut,
    /// An answer with a transfer coding other than `chunked` alone, from hyper's client.
    Coded,
}

/// What a [`SiteFailure::Coded`] answer is.
static CODED: grid_h1_wire::WireError = grid_h1_wire::WireError::AnswerCoding;

/// Why one upstream attempt failed.
enum Failed {
    /// The request path cannot be joined to the base URL.
    Path(String),
    /// Connecting failed: nothing was sent.
    Connect,
    /// The exchange failed after the request may have been sent.
    Exchange,
    /// No answer head within `upstreamHeadersTimeoutSeconds` (the request was sent).
    HeadersTimedOut,
    /// The request's connection already holds its share of the site's slots.
    ShareUsed,
}

/// `body` with its ready frames handed on together ([`Coalesce`]): without yielding for
/// a body whose connection this task polls (`inline`).
fn coalesced<B>(body: B, inline: bool) -> ResponseBody
where
    B: http_body::Body<Data = Bytes> + Unpin + Send + Sync + 'static,
    B::Error: Into<BoxError> + Unpin + Send + Sync,
{
    let body = if inline {
        Coalesce::driven_inline(body)
    } else {
        Coalesce::new(body)
    };
    body.map_err(Into::into).boxed()
}
