//! grid as Envoy's external processor (`envoy.service.ext_proc.v3.ExternalProcessor`):
//! Envoy keeps the connections and the bytes, grid decides where each request goes and
//! reads what each answer says about its site. `docs/envoy.md` has the Envoy side.
//!
//! # One gRPC stream per request, three messages
//!
//! Envoy opens a stream per HTTP request and sends, with the processing mode the shipped
//! bootstrap sets (request headers `SEND`, request body `BUFFERED`, response headers
//! `SEND`, everything else `NONE`/`SKIP`):
//!
//! 1. **Request headers.** The method and path are classified by the gateway's own route
//!    table (`grid_gateway::routes::classify`): a `POST` to a proxied path waits for its body (the
//!    client's `x-grid-*` and `x-gateway-destination-endpoint` headers are removed, so a
//!    client cannot steer or forge routing); `GET /v1/models` is answered at once with the
//!    gateway's list; anything else gets the gateway's 404 or 405.
//! 2. **Request body**, buffered whole by Envoy (the cheapest mode that shows the JSON
//!    `model`: `STREAMED` would hand it over in pieces to be joined here anyway). Larger
//!    than `bodyLimitBytes`: 413. Its `model` is found by the gateway's scan, a site
//!    picked by the same pure routing core (`grid_gateway::pick::decide`, counted in
//!    `grid_gateway_score_decisions_total`), and Envoy told where to send it the way
//!    llm-d's endpoint picker does: `x-gateway-destination-endpoint: host:port` (the
//!    site's base URL authority) for an `ORIGINAL_DST` cluster with `use_http_header`,
//!    plus `x-grid-site` and, for a base URL with a path prefix, `:path`. A shed model
//!    gets an `ImmediateResponse` 429 with Retry-After, an unservable one 503 with
//!    Retry-After, an unknown one 404: the gateway's own OpenAI-style answers
//!    ([`grid_gateway::refusal`]).
//! 3. **Response headers**, the phase the flow-control headers must be read in (a band's
//!    occupancy changes while the model works, so a value taken at admission would be
//!    stale): `answer_evidence::take_live_evidence`, the proxy's own function, records them
//!    and the outcome (a 5xx is a serving failure) in the site's live slot, removes the
//!    site's `x-llm-d-flow-*` headers and sets the grid's headroom and `x-grid-site`. A
//!    plain answer's time to its head is its slot time, as in the proxy.
//!
//! From its answer to the body until the exchange is over, the request counts as one of
//! the gateway's own in flight at the chosen site (the live slot's guard, as the proxy and
//! the Pingora embedding hold it), so a refresh reads the site's queue with this
//! gateway's requests sent since the reading. After the response headers grid sends
//! nothing more and the answer's body never crosses the processor, but grid keeps the
//! stream open: Envoy ends it when the HTTP exchange ends (the answer's last byte, a
//! reset, the client gone), and that is the request's end.
//!
//! # Bounds
//!
//! Every wait on Envoy is bounded: a stream silent for longer than
//! [`stream_idle_timeout`] (the gateway's `upstreamHeadersTimeoutSeconds`, the longest
//! legitimate silence, the site's time to its answer head, plus [`STREAM_IDLE_MARGIN`])
//! is ended with `DEADLINE_EXCEEDED` and counted; a stream still open [`LONGEST_ANSWER`]
//! after its answer's head is ended (`OK`) and counted, its request no longer counted in
//! flight, and one past its head ends at once when the gateway stops; an HTTP/2
//! connection that stops answering pings is dropped after [`crate::engine::client::limits::HTTP2_KEEP_ALIVE_INTERVAL`] plus
//! [`crate::engine::client::limits::HTTP2_KEEP_ALIVE_TIMEOUT`]; one gRPC message is at most
//! [`max_message_bytes`] (the body limit plus [`MESSAGE_OVERHEAD_BYTES`]).

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::{
    HeaderValue as PbHeaderValue, HeaderValueOption, header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, HttpBody, HttpHeaders,
    ImmediateResponse, ProcessingRequest, ProcessingResponse, TrailersResponse, processing_request,
    processing_response,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use futures::{Stream, StreamExt as _};
use grid_score::catalog::Upstream;
use grid_score::live;
use http::{HeaderName, HeaderValue, Method, StatusCode, header};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tonic::{Status, Streaming};

use crate::engine::request_metrics::RequestMetrics;
use crate::engine::site::answer_evidence::{AnswerHeaders, Evidence, take_live_evidence};
use crate::engine::site::answer_timing::AnswerHead;
use crate::front_ends::http_api::models_body;
use grid_gateway::headers::{ROUTING_HEADER_PREFIX, SITE_HEADER};
use grid_gateway::pick::{Routed, decide};
use grid_gateway::refusal::{ApiErrorKind, Refusal, model_of};
use grid_gateway::routes::{Target, classify};
use grid_gateway::upstream::Published;

/// The request header Envoy's `ORIGINAL_DST` cluster reads the destination from
/// (`original_dst_lb_config.http_header_name`), as llm-d's endpoint picker sets it.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";

/// How much longer than `upstreamHeadersTimeoutSeconds` a stream may stay silent. The
/// longest silence on a healthy stream is between grid's answer to the body and Envoy's
/// response headers: the site's time to its answer head, which Envoy's route timeout
/// bounds (set it at most `upstreamHeadersTimeoutSeconds`, `docs/envoy.md`); the margin
/// covers Envoy's own connect and retry on top.
pub const STREAM_IDLE_MARGIN: Duration = Duration::from_secs(10);

/// What one gRPC message carries beyond the request body Envoy buffered: headers,
/// attributes, framing. The body itself is at most `bodyLimitBytes` (413 past it).
pub const MESSAGE_OVERHEAD_BYTES: usize = 64 << 10;

/// How long after its answer's head a request stays counted in flight at its site while
/// Envoy keeps its stream open: longer than any completion streams (an hour), so only a
/// stream Envoy never ends, which would hold the site's count up for good, is cut by it.
pub const LONGEST_ANSWER: Duration = Duration::from_secs(3600);

/// The longest silence on one processing stream before grid ends it.
pub fn stream_idle_timeout(upstream_headers: Duration) -> Duration {
    upstream_headers + STREAM_IDLE_MARGIN
}

/// The largest gRPC message grid decodes: a body of `body_limit` bytes and its overhead.
/// A bigger one is refused by the gRPC layer (`RESOURCE_EXHAUSTED`) before it is held.
pub fn max_message_bytes(body_limit: usize) -> usize {
    body_limit + MESSAGE_OVERHEAD_BYTES
}

grid_signals::label_values! {
    label "reason";
    /// Why grid ended a processing stream early (the `reason` of
    /// `grid_gateway_ext_proc_streams_failed_total`). Envoy applies its
    /// `failure_mode_allow` to the request (the shipped bootstrap: refused).
    pub(crate) enum StreamFailure {
        /// Envoy sent nothing for [`stream_idle_timeout`].
        IdleTimeout,
        /// A message the stream's phase does not expect: response headers before a site
        /// was chosen, a body before headers (a processing mode grid was not built for).
        OutOfOrder,
        /// Envoy kept the stream open [`LONGEST_ANSWER`] past its answer's head.
        LongestAnswer,
    }
}

/// The processor's own series; every decision and answer is counted in the gateway's.
#[derive(Clone, Debug, Default)]
pub(crate) struct ExtProcMetrics {
    /// `grid_gateway_ext_proc_streams_failed_total{reason}`.
    pub failed: Family<StreamFailure, Counter>,
}

impl ExtProcMetrics {
    /// Registers the handles under `grid_gateway_*`, every reason at zero.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        Self {
            failed: grid_signals::labels::register_zeroed(
                registry,
                "grid_gateway_ext_proc_streams_failed",
                "Envoy processing streams grid ended early, by reason",
            ),
        }
    }
}

/// What the processor serves with; the driver builds it from the gateway's own pieces.
pub(crate) struct Shared {
    /// The routing slot the poller publishes into (the gateway's).
    pub(crate) routes: Published,
    /// Woken after an answer carried live evidence.
    pub(crate) live_refresh: Arc<tokio::sync::Notify>,
    /// The gateway's request series.
    pub(crate) metrics: RequestMetrics,
    /// grid-score's decision series.
    pub(crate) score: grid_score::ScoreMetrics,
    /// The processor's own series.
    pub(crate) ext_proc: ExtProcMetrics,
    /// `bodyLimitBytes`.
    pub(crate) body_limit: usize,
    /// [`stream_idle_timeout`].
    pub(crate) idle: Duration,
    /// Turns `true` when the gateway stops: a stream past its answer's head has nothing
    /// left to do but count, and ends then rather than holding the drain up.
    pub(crate) stopping: tokio::sync::watch::Receiver<bool>,
}

/// The external processor: one per gateway, cloned per stream.
#[derive(Clone)]
pub(crate) struct ExtProc {
    inner: Arc<Shared>,
}

impl std::fmt::Debug for ExtProc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtProc")
            .field("idle", &self.inner.idle)
            .finish_non_exhaustive()
    }
}

/// Where one request's stream stands.
enum Phase {
    /// Waiting for the request headers.
    Headers,
    /// A proxied request whose body is awaited; its path (for a base URL's prefix) and
    /// the flow-control band it names.
    Body { path: String, band: live::BandKey },
    /// Sent to a site; waiting for its answer's head.
    Routed {
        upstream: Upstream,
        band: live::BandKey,
        sent: Instant,
        in_flight: live::InFlight,
    },
    /// The answer's head is through: the request stays counted at its site until Envoy
    /// ends the stream, or `until`.
    Answering {
        _in_flight: live::InFlight,
        until: tokio::time::Instant,
    },
    /// Nothing more to do: the stream ends.
    Done,
}

/// The reply to one message, or the error that ends the stream.
type Reply = Result<ProcessingResponse, Status>;

impl ExtProc {
    /// A processor over `shared`.
    pub(crate) fn new(shared: Shared) -> Self {
        Self {
            inner: Arc::new(shared),
        }
    }

    /// Turns `true` when the gateway stops.
    pub(crate) fn stopping(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.stopping.clone()
    }

    /// The tonic service, its message size bounded by [`max_message_bytes`].
    pub(crate) fn service(self) -> ExternalProcessorServer<Self> {
        let limit = max_message_bytes(self.inner.body_limit);
        ExternalProcessorServer::new(self).max_decoding_message_size(limit)
    }

    /// One request's stream: each message answered in turn, every wait for the next one
    /// bounded by the idle timeout before the answer's head and by [`LONGEST_ANSWER`]
    /// after it; ends when Envoy ends it, after an immediate answer, or at a bound.
    pub(crate) fn exchange<S>(self, inbound: S) -> impl Stream<Item = Reply> + Send + 'static
    where
        S: Stream<Item = Result<ProcessingRequest, Status>> + Unpin + Send + 'static,
    {
        futures::stream::unfold(
            (self, inbound, Phase::Headers),
            |(me, mut inbound, phase)| async move {
                if matches!(phase, Phase::Done) {
                    return None;
                }
                let idle = me.inner.idle;
                let waited = match &phase {
                    // Envoy sends nothing more until the exchange is over.
                    Phase::Answering { until, .. } => {
                        let mut stopping = me.inner.stopping.clone();
                        tokio::select! {
                            waited = tokio::time::timeout_at(*until, inbound.next()) => {
                                match waited {
                                    Err(_) => {
                                        me.failed(StreamFailure::LongestAnswer);
                                        tracing::debug!(
                                            limit = ?LONGEST_ANSWER,
                                            "an Envoy processing stream outlived the longest answer"
                                        );
                                        return None;
                                    }
                                    Ok(waited) => waited,
                                }
                            }
                            // A gateway whose stop sender is gone never stops this way.
                            Ok(_) = stopping.wait_for(|s| *s) => return None,
                        }
                    }
                    _ => match tokio::time::timeout(idle, inbound.next()).await {
                        Err(_) => {
                            me.failed(StreamFailure::IdleTimeout);
                            tracing::debug!(?idle, "an Envoy processing stream went silent");
                            let status = Status::deadline_exceeded(format!(
                                "no processing message within {idle:?}"
                            ));
                            return Some((Err(status), (me, inbound, Phase::Done)));
                        }
                        Ok(waited) => waited,
                    },
                };
                let message = match waited {
                    // Envoy closed or reset the stream (the exchange is over, a client
                    // left): the request's in-flight guard, if any, goes with the phase.
                    None | Some(Err(_)) => return None,
                    Some(Ok(m)) => m,
                };
                let (reply, next) = me.step(phase, message);
                let next = if reply.is_err() { Phase::Done } else { next };
                Some((reply, (me, inbound, next)))
            },
        )
    }

    fn failed(&self, reason: StreamFailure) {
        self.inner.ext_proc.failed.get_or_create(&reason).inc();
    }

    /// Answers one message in `phase`; the phase after it.
    fn step(&self, phase: Phase, message: ProcessingRequest) -> (Reply, Phase) {
        use processing_request::Request as In;
        match (phase, message.request) {
            (Phase::Headers, Some(In::RequestHeaders(h))) => self.request_headers(&h),
            (Phase::Body { path, band }, Some(In::RequestBody(b))) => {
                self.request_body(&path, band, &b)
            }
            (
                Phase::Routed {
                    upstream,
                    band,
                    sent,
                    in_flight,
                },
                Some(In::ResponseHeaders(h)),
            ) => (
                Ok(self.response_headers(&upstream, band, sent, &h)),
                Phase::Answering {
                    _in_flight: in_flight,
                    until: tokio::time::Instant::now() + LONGEST_ANSWER,
                },
            ),
            // Parts a wider processing mode sends that grid has no use for: let them pass.
            (phase, Some(In::ResponseBody(_))) => (
                Ok(reply(processing_response::Response::ResponseBody(
                    BodyResponse::default(),
                ))),
                phase,
            ),
            (phase, Some(In::RequestTrailers(_))) => (
                Ok(reply(processing_response::Response::RequestTrailers(
                    TrailersResponse::default(),
                ))),
                phase,
            ),
            (phase, Some(In::ResponseTrailers(_))) => (
                Ok(reply(processing_response::Response::ResponseTrailers(
                    TrailersResponse::default(),
                ))),
                phase,
            ),
            (_, other) => {
                self.failed(StreamFailure::OutOfOrder);
                let what = other.as_ref().map_or("an empty message", phase_name);
                tracing::warn!(message = what, "an Envoy processing message out of order");
                (
                    Err(Status::failed_precondition(format!(
                        "{what} out of order: grid expects request headers, the request body \
                         (BUFFERED), then response headers"
                    ))),
                    Phase::Done,
                )
            }
        }
    }

    fn request_headers(&self, h: &HttpHeaders) -> (Reply, Phase) {
        let headers = h.headers.as_ref().map_or(&[][..], |m| &m.headers[..]);
        let method = header_value(headers, ":method")
            .and_then(|m| Method::from_bytes(m).ok())
            .unwrap_or_default();
        let full_path = header_value(headers, ":path")
            .and_then(|p| std::str::from_utf8(p).ok())
            .unwrap_or("/");
        let path = full_path.split_once('?').map_or(full_path, |(p, _)| p);
        match classify(&method, path) {
            // No body: nothing names a model, the scan's own 400 (a headers reply cannot
            // carry a destination chosen from a body anyway).
            Ok(Target::Proxied) if h.end_of_stream => {
                let refusal = model_of(&[]).err().unwrap_or_else(|| {
                    Refusal::new(ApiErrorKind::BadRequest, "the request has no body")
                });
                (Ok(self.refuse(&refusal)), Phase::Done)
            }
            Ok(Target::Proxied) => {
                // What only grid may say about routing goes, whatever the client sent.
                let mut mutation = HeaderMutation::default();
                for v in headers {
                    let key = v.key.to_ascii_lowercase();
                    if (key.starts_with(ROUTING_HEADER_PREFIX) || key == DESTINATION_HEADER)
                        && !mutation.remove_headers.contains(&key)
                    {
                        mutation.remove_headers.push(key);
                    }
                }
                let common = CommonResponse {
                    header_mutation: Some(mutation),
                    ..CommonResponse::default()
                };
                (
                    Ok(reply(processing_response::Response::RequestHeaders(
                        HeadersResponse {
                            response: Some(common),
                        },
                    ))),
                    Phase::Body {
                        path: full_path.to_owned(),
                        // The band the answer's room describes.
                        band: live::BandKey::named(header_value(
                            headers,
                            live::BAND_REQUEST_HEADER,
                        )),
                    },
                )
            }
            Ok(Target::Models) => {
                self.inner.metrics.outcome("local");
                let mut answer =
                    http::Response::new(Bytes::from(models_body(&self.inner.routes.load())));
                answer.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                (Ok(immediate(&answer, "grid_models")), Phase::Done)
            }
            // The gateway's metrics and probes are its own listener's, not the API's that
            // Envoy fronts.
            Ok(Target::Metrics | Target::Healthz | Target::Readyz | Target::Routing) => (
                Ok(self.refuse(&Refusal::new(
                    ApiErrorKind::UnknownRoute,
                    format!("no route {path}: served on the gateway's own listener"),
                ))),
                Phase::Done,
            ),
            Err(refusal) => (Ok(self.refuse(&refusal)), Phase::Done),
        }
    }

    fn request_body(&self, path: &str, band: live::BandKey, b: &HttpBody) -> (Reply, Phase) {
        self.route(path, band, &b.body)
    }

    /// Picks the site for `body` (a request of `band`) and tells Envoy where to send
    /// it, or refuses.
    fn route(&self, path: &str, band: live::BandKey, body: &[u8]) -> (Reply, Phase) {
        let limit = self.inner.body_limit;
        if body.len() > limit {
            return (Ok(self.refuse(&Refusal::too_large(limit))), Phase::Done);
        }
        let model = match model_of(body) {
            Ok(m) => m,
            Err(refusal) => return (Ok(self.refuse(&refusal)), Phase::Done),
        };
        let view = self.inner.routes.load();
        let Routed { upstream } = match decide(&view, &self.inner.score, &model) {
            Ok(routed) => routed,
            Err(refusal) => return (Ok(self.refuse(&refusal)), Phase::Done),
        };
        self.inner.metrics.outcome("proxied");
        let mut mutation = HeaderMutation::default();
        set_header(
            &mut mutation,
            DESTINATION_HEADER,
            upstream.authority().as_bytes(),
        );
        set_header(
            &mut mutation,
            SITE_HEADER.as_str(),
            upstream.site.as_bytes(),
        );
        if !upstream.prefix().is_empty() {
            let prefixed = format!("{}{path}", upstream.prefix());
            set_header(&mut mutation, ":path", prefixed.as_bytes());
        }
        let common = CommonResponse {
            header_mutation: Some(mutation),
            // The destination is read at upstream selection; a route matched on headers
            // before grid spoke must be matched again (llm-d's picker does the same).
            clear_route_cache: true,
            ..CommonResponse::default()
        };
        let phase = Phase::Routed {
            upstream: upstream.clone(),
            band,
            sent: grid_gateway::clock::monotonic(),
            in_flight: upstream.in_flight(),
        };
        (
            Ok(reply(processing_response::Response::RequestBody(
                BodyResponse {
                    response: Some(common),
                },
            ))),
            phase,
        )
    }

    /// The answer's head: live evidence recorded and headers rewritten by the proxy's own
    /// function.
    fn response_headers(
        &self,
        upstream: &Upstream,
        band: live::BandKey,
        sent: Instant,
        h: &HttpHeaders,
    ) -> ProcessingResponse {
        let headers = h.headers.as_ref().map_or(&[][..], |m| &m.headers[..]);
        let status = header_value(headers, ":status")
            .and_then(|s| StatusCode::from_bytes(s).ok())
            .unwrap_or(StatusCode::BAD_GATEWAY);
        let streaming = header_value(headers, header::CONTENT_TYPE.as_str())
            .is_some_and(|v| v.starts_with(b"text/event-stream"));
        let mut head = EnvoyHead {
            headers,
            mutation: HeaderMutation::default(),
        };
        let evidence = Evidence {
            metrics: &self.inner.metrics,
            live_refresh: &self.inner.live_refresh,
        };
        let observation = take_live_evidence(
            evidence,
            upstream,
            band,
            status,
            &mut head,
            grid_gateway::headers::site_value(&upstream.site),
        );
        if status.is_success() {
            AnswerHead {
                sent,
                head: grid_gateway::clock::monotonic(),
                queue_ms: observation.queue_ms,
                streaming,
            }
            .record(upstream.live());
        }
        reply(processing_response::Response::ResponseHeaders(
            HeadersResponse {
                response: Some(CommonResponse {
                    header_mutation: Some(head.mutation),
                    ..CommonResponse::default()
                }),
            },
        ))
    }

    /// The gateway's own answer to a refused request, counted by its code.
    fn refuse(&self, refusal: &Refusal) -> ProcessingResponse {
        self.inner.metrics.outcome(refusal.kind.as_str());
        let answer: http::Response<Bytes> = refusal.to_response();
        immediate(&answer, &format!("grid_{}", refusal.kind.as_str()))
    }
}

#[tonic::async_trait]
impl ExternalProcessor for ExtProc {
    type ProcessStream = Pin<Box<dyn Stream<Item = Reply> + Send + 'static>>;

    async fn process(
        &self,
        request: tonic::Request<Streaming<ProcessingRequest>>,
    ) -> Result<tonic::Response<Self::ProcessStream>, Status> {
        Ok(tonic::Response::new(Box::pin(
            self.clone().exchange(request.into_inner()),
        )))
    }
}

/// An answer head as Envoy hands it over: read from its header protos, changed by a
/// mutation Envoy applies.
struct EnvoyHead<'a> {
    headers: &'a [PbHeaderValue],
    mutation: HeaderMutation,
}

impl AnswerHeaders for EnvoyHead<'_> {
    fn each(&self, f: &mut dyn FnMut(&str, &[u8])) {
        for h in self.headers {
            f(&h.key, value_of(h));
        }
    }

    fn remove(&mut self, name: &str) {
        if !self.mutation.remove_headers.iter().any(|n| n == name) {
            self.mutation.remove_headers.push(name.to_owned());
        }
    }

    fn set(&mut self, name: HeaderName, value: HeaderValue) {
        // An overwrite replaces every value the site sent, whichever order Envoy applies
        // removals and sets in: the name must not be removed as well.
        self.mutation.remove_headers.retain(|n| n != name.as_str());
        set_header(&mut self.mutation, name.as_str(), value.as_bytes());
    }
}

/// A header's value: `raw_value` as Envoy sends it, `value` from older Envoys.
fn value_of(h: &PbHeaderValue) -> &[u8] {
    if h.raw_value.is_empty() {
        h.value.as_bytes()
    } else {
        &h.raw_value
    }
}

/// The first value of `name` (lowercase) in Envoy's header list.
fn header_value<'a>(headers: &'a [PbHeaderValue], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(value_of)
}

/// Adds an overwrite of `name` to `mutation`.
fn set_header(mutation: &mut HeaderMutation, name: &str, value: &[u8]) {
    mutation.set_headers.push(HeaderValueOption {
        header: Some(PbHeaderValue {
            key: name.to_owned(),
            value: String::new(),
            raw_value: value.to_vec(),
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd.into(),
        ..HeaderValueOption::default()
    });
}

fn reply(response: processing_response::Response) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
        ..ProcessingResponse::default()
    }
}

/// Envoy answers the client with `answer` itself (status, headers, body); `details` is
/// what Envoy's access log shows as the response code details.
fn immediate(answer: &http::Response<Bytes>, details: &str) -> ProcessingResponse {
    let mut headers = HeaderMutation::default();
    for (name, value) in answer.headers() {
        set_header(&mut headers, name.as_str(), value.as_bytes());
    }
    reply(processing_response::Response::ImmediateResponse(
        ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(answer.status().as_u16()),
            }),
            headers: Some(headers),
            body: answer.body().to_vec(),
            grpc_status: None,
            details: details.to_owned(),
        },
    ))
}

fn phase_name(request: &processing_request::Request) -> &'static str {
    use processing_request::Request as In;
    match request {
        In::RequestHeaders(_) => "request headers",
        In::ResponseHeaders(_) => "response headers",
        In::RequestBody(_) => "a request body",
        In::ResponseBody(_) => "a response body",
        In::RequestTrailers(_) => "request trailers",
        In::ResponseTrailers(_) => "response trailers",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use envoy_types::pb::envoy::config::core::v3::HeaderMap as PbHeaderMap;
    use grid_score::catalog::{CandidateSpec, Catalog, ModelSpec};
    use grid_score::refresh::Refresher;

    const LIMIT: usize = 1024;
    const IDLE: Duration = Duration::from_secs(70);

    /// A processor routing model `m` to its one site `a`, at `127.0.0.1:8001` under the
    /// prefix `/v2` (unmeasured, so routed by the fallback path).
    fn processor() -> ExtProc {
        processor_stopping(tokio::sync::watch::channel(false).1)
    }

    /// [`processor`], ending its answered streams when `stopping` turns `true`.
    fn processor_stopping(stopping: tokio::sync::watch::Receiver<bool>) -> ExtProc {
        let catalog = Arc::new(Catalog::new(&[ModelSpec {
            name: "m".into(),
            candidates: vec![CandidateSpec {
                site: "a".into(),
                provider: "p".into(),
                scheme: "http".into(),
                authority: "127.0.0.1:8001".into(),
                prefix: "/v2".into(),
            }],
        }]));
        let mut registry = Registry::default();
        let score = grid_score::ScoreMetrics::register(&mut registry);
        let mut refresher = Refresher::new(
            catalog,
            grid_score::ScoreConfig::default(),
            grid_signals::store::StoreConfig::default(),
            Some(score.clone()),
        );
        let view = refresher.refresh(grid_gateway::clock::wall_ms()).view;
        ExtProc::new(Shared {
            routes: Arc::new(arc_swap::ArcSwap::from_pointee(view)),
            live_refresh: Arc::new(tokio::sync::Notify::new()),
            metrics: RequestMetrics::default(),
            score,
            ext_proc: ExtProcMetrics::default(),
            body_limit: LIMIT,
            idle: IDLE,
            stopping,
        })
    }

    fn headers(pairs: &[(&str, &str)], end_of_stream: bool) -> HttpHeaders {
        HttpHeaders {
            headers: Some(PbHeaderMap {
                headers: pairs
                    .iter()
                    .map(|(k, v)| PbHeaderValue {
                        key: (*k).to_owned(),
                        value: String::new(),
                        raw_value: v.as_bytes().to_vec(),
                    })
                    .collect(),
            }),
            end_of_stream,
            ..HttpHeaders::default()
        }
    }

    fn message(request: processing_request::Request) -> ProcessingRequest {
        ProcessingRequest {
            request: Some(request),
            ..ProcessingRequest::default()
        }
    }

    fn post(path: &str, extra: &[(&str, &str)]) -> ProcessingRequest {
        let mut pairs = vec![(":method", "POST"), (":path", path)];
        pairs.extend_from_slice(extra);
        message(processing_request::Request::RequestHeaders(headers(
            &pairs, false,
        )))
    }

    fn body(bytes: &[u8]) -> ProcessingRequest {
        message(processing_request::Request::RequestBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream: true,
            ..HttpBody::default()
        }))
    }

    fn answer_head(pairs: &[(&str, &str)]) -> ProcessingRequest {
        message(processing_request::Request::ResponseHeaders(headers(
            pairs, false,
        )))
    }

    /// The set headers of `mutation`, as (name, value) text.
    fn sets(mutation: &HeaderMutation) -> Vec<(String, String)> {
        mutation
            .set_headers
            .iter()
            .map(|o| {
                let h = o.header.as_ref().unwrap();
                (
                    h.key.clone(),
                    String::from_utf8(h.raw_value.clone()).unwrap(),
                )
            })
            .collect()
    }

    fn common(reply: &Reply) -> &CommonResponse {
        use processing_response::Response as Out;
        match reply.as_ref().unwrap().response.as_ref().unwrap() {
            Out::RequestHeaders(r) | Out::ResponseHeaders(r) => r.response.as_ref().unwrap(),
            Out::RequestBody(r) => r.response.as_ref().unwrap(),
            other => panic!("not a continue: {other:?}"),
        }
    }

    fn immediate_of(reply: &Reply) -> &ImmediateResponse {
        match reply.as_ref().unwrap().response.as_ref().unwrap() {
            processing_response::Response::ImmediateResponse(r) => r,
            other => panic!("not an immediate answer: {other:?}"),
        }
    }

    /// A chat body of exactly `len` bytes naming model `m`.
    fn chat_of_len(len: usize) -> Vec<u8> {
        let head = br#"{"model":"m","pad":""#;
        let tail = br#""}"#;
        let mut b = head.to_vec();
        b.resize(len - tail.len(), b'x');
        b.extend_from_slice(tail);
        assert_eq!(b.len(), len);
        b
    }

    #[test]
    fn a_proxied_request_is_sent_to_its_sites_authority_under_its_prefix_and_clients_cannot_steer_it()
     {
        let p = processor();
        let (reply, phase) = p.step(
            Phase::Headers,
            post(
                "/v1/chat/completions",
                &[("x-grid-site", "b"), (DESTINATION_HEADER, "10.0.0.1:1")],
            ),
        );
        let removed = &common(&reply)
            .header_mutation
            .as_ref()
            .unwrap()
            .remove_headers;
        assert_eq!(removed, &["x-grid-site", DESTINATION_HEADER]);
        let (reply, phase) = p.step(phase, body(br#"{"model":"m"}"#));
        let c = common(&reply);
        assert!(c.clear_route_cache);
        assert_eq!(
            sets(c.header_mutation.as_ref().unwrap()),
            [
                (DESTINATION_HEADER.to_owned(), "127.0.0.1:8001".to_owned()),
                ("x-grid-site".to_owned(), "a".to_owned()),
                (":path".to_owned(), "/v2/v1/chat/completions".to_owned()),
            ]
        );
        assert!(matches!(phase, Phase::Routed { .. }));
    }

    #[test]
    fn a_body_at_the_limit_is_routed_and_one_byte_more_is_refused_413() {
        let p = processor();
        let (_, phase) = p.step(Phase::Headers, post("/v1/completions", &[]));
        let (reply, phase) = p.step(phase, body(&chat_of_len(LIMIT)));
        assert!(common(&reply).clear_route_cache, "routed at the limit");
        assert!(matches!(phase, Phase::Routed { .. }));
        let (_, phase) = p.step(Phase::Headers, post("/v1/completions", &[]));
        let (reply, phase) = p.step(phase, body(&chat_of_len(LIMIT + 1)));
        let r = immediate_of(&reply);
        assert_eq!(r.status.unwrap().code, 413);
        assert!(matches!(phase, Phase::Done));
        assert_eq!(max_message_bytes(LIMIT), LIMIT + MESSAGE_OVERHEAD_BYTES);
    }

    #[test]
    fn an_answer_head_is_read_into_the_live_slot_its_flow_headers_stripped_and_the_grids_set() {
        let p = processor();
        let (_, phase) = p.step(Phase::Headers, post("/v1/chat/completions", &[]));
        let (_, phase) = p.step(phase, body(br#"{"model":"m"}"#));
        let Phase::Routed { upstream, .. } = &phase else {
            panic!("routed")
        };
        let upstream = upstream.clone();
        let (reply, phase) = p.step(
            phase,
            answer_head(&[
                (":status", "200"),
                ("x-llm-d-flow-band-headroom-requests", "0"),
                ("x-llm-d-flow-queue-duration-ms", "5"),
                ("x-llm-d-flow-something-else", "1"),
            ]),
        );
        assert!(
            matches!(phase, Phase::Answering { .. }),
            "the stream stays open after the head"
        );
        let m = common(&reply).header_mutation.as_ref().unwrap();
        // Every other flow header of the site is removed; the headroom is overwritten with
        // the grid's restatement of the request's own band at the chosen site.
        assert_eq!(
            m.remove_headers,
            [
                "x-llm-d-flow-queue-duration-ms",
                "x-llm-d-flow-something-else"
            ]
        );
        assert_eq!(
            sets(m),
            [
                (live::HEADROOM_HEADER.to_owned(), "0".to_owned()),
                ("x-grid-site".to_owned(), "a".to_owned())
            ]
        );
        let evidence = upstream.live().drain();
        let room = evidence.room().expect("a room signal");
        assert_eq!(room.headroom, Some(0));
        assert_eq!((evidence.answers, evidence.failures), (1, 0));
        drop(phase);

        // A 5xx is a serving failure, counted as the proxy counts it.
        let (_, phase) = p.step(Phase::Headers, post("/v1/chat/completions", &[]));
        let (_, phase) = p.step(phase, body(br#"{"model":"m"}"#));
        let _ = p.step(phase, answer_head(&[(":status", "503")]));
        assert_eq!(upstream.live().drain().failures, 1);
        let labels = crate::engine::request_metrics::SiteLabels { site: "a".into() };
        assert_eq!(
            p.inner.metrics.error_answers.get_or_create(&labels).get(),
            1
        );
    }

    #[test]
    fn the_headroom_told_the_client_is_the_requests_own_band_at_the_chosen_site() {
        let p = processor();
        let ask = |objective: Option<&str>, answer: &[(&str, &str)]| {
            let extra: Vec<(&str, &str)> = objective
                .map(|o| (live::BAND_REQUEST_HEADER, o))
                .into_iter()
                .collect();
            let (_, phase) = p.step(Phase::Headers, post("/v1/chat/completions", &extra));
            let (_, phase) = p.step(phase, body(br#"{"model":"m"}"#));
            let mut head = vec![(":status", "200")];
            head.extend_from_slice(answer);
            let (reply, _) = p.step(phase, answer_head(&head));
            sets(common(&reply).header_mutation.as_ref().unwrap())
                .into_iter()
                .find(|(n, _)| n == live::HEADROOM_HEADER)
                .map(|(_, v)| v)
        };
        let headroom = [("x-llm-d-flow-band-headroom-requests", "3")];
        assert_eq!(ask(Some("critical"), &headroom).as_deref(), Some("3"));
        // The default band has shown nothing: the other band's room is not its own.
        assert_eq!(ask(None, &[]), None);
        let headroom = [("x-llm-d-flow-band-headroom-requests", "40")];
        assert_eq!(ask(None, &headroom).as_deref(), Some("40"));
        // An answer without the header restates its own band's fresh room.
        assert_eq!(ask(Some("critical"), &[]).as_deref(), Some("3"));
        assert_eq!(ask(None, &[]).as_deref(), Some("40"));
    }

    #[test]
    fn an_unknown_model_route_or_method_is_answered_by_envoy_as_the_gateway_answers_it() {
        let p = processor();
        let (_, phase) = p.step(Phase::Headers, post("/v1/chat/completions", &[]));
        let (reply, _) = p.step(phase, body(br#"{"model":"nope"}"#));
        assert_eq!(immediate_of(&reply).status.unwrap().code, 404);
        let (_, phase) = p.step(Phase::Headers, post("/v1/chat/completions", &[]));
        let (reply, _) = p.step(phase, body(b"not json"));
        assert_eq!(immediate_of(&reply).status.unwrap().code, 400);
        let bodiless = message(processing_request::Request::RequestHeaders(headers(
            &[(":method", "POST"), (":path", "/v1/chat/completions")],
            true,
        )));
        let (reply, _) = p.step(Phase::Headers, bodiless);
        assert_eq!(immediate_of(&reply).status.unwrap().code, 400);
        let get = message(processing_request::Request::RequestHeaders(headers(
            &[(":method", "GET"), (":path", "/v1/chat/completions")],
            true,
        )));
        let (reply, _) = p.step(Phase::Headers, get);
        assert_eq!(immediate_of(&reply).status.unwrap().code, 405);
        let models = message(processing_request::Request::RequestHeaders(headers(
            &[(":method", "GET"), (":path", "/v1/models?x=1")],
            true,
        )));
        let (reply, _) = p.step(Phase::Headers, models);
        let r = immediate_of(&reply);
        assert_eq!(r.status.unwrap().code, 200);
        let list: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(list["data"][0]["id"], "m");
    }

    #[test]
    fn a_refusal_becomes_an_immediate_answer_with_retry_after_and_the_openai_body() {
        let p = processor();
        let r = p.refuse(&Refusal {
            kind: ApiErrorKind::Shedding,
            message: "full".into(),
            retry_after_s: Some(3),
        });
        let Some(processing_response::Response::ImmediateResponse(r)) = r.response else {
            panic!("immediate")
        };
        assert_eq!(r.status.unwrap().code, 429);
        let set = sets(r.headers.as_ref().unwrap());
        assert!(
            set.contains(&("retry-after".to_owned(), "3".to_owned())),
            "{set:?}"
        );
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["code"], "shedding");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(r.details, "grid_shedding");
    }

    #[test]
    fn a_message_out_of_order_ends_the_stream_and_is_counted() {
        let p = processor();
        let (reply, phase) = p.step(Phase::Headers, answer_head(&[(":status", "200")]));
        assert_eq!(reply.unwrap_err().code(), tonic::Code::FailedPrecondition);
        assert!(matches!(phase, Phase::Done));
        assert_eq!(
            p.inner
                .ext_proc
                .failed
                .get_or_create(&StreamFailure::OutOfOrder)
                .get(),
            1
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_silent_for_its_idle_bound_is_ended_and_counted_not_a_moment_before() {
        let p = processor();
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let mut out = Box::pin(p.clone().exchange(rx));
        tx.unbounded_send(Ok(post("/v1/chat/completions", &[])))
            .unwrap();
        assert!(out.next().await.unwrap().is_ok(), "headers answered");
        let silent_from = tokio::time::Instant::now();
        assert!(
            tokio::time::timeout(
                IDLE.checked_sub(Duration::from_millis(1)).unwrap(),
                out.next()
            )
            .await
            .is_err(),
            "still open just before the bound"
        );
        let ended = out.next().await.expect("an error ends it");
        assert_eq!(ended.unwrap_err().code(), tonic::Code::DeadlineExceeded);
        assert_eq!(silent_from.elapsed(), IDLE);
        assert!(out.next().await.is_none(), "and the stream is over");
        assert_eq!(
            p.inner
                .ext_proc
                .failed
                .get_or_create(&StreamFailure::IdleTimeout)
                .get(),
            1
        );
        assert_eq!(
            stream_idle_timeout(Duration::from_secs(60)),
            Duration::from_secs(60) + STREAM_IDLE_MARGIN
        );
        drop(tx);
    }

    /// Sends a request for `m` through `p`'s exchange up to its answer's head; the
    /// stream's sender (Envoy's side), the exchange, and the chosen site's upstream.
    async fn answered(
        p: &ExtProc,
    ) -> (
        futures::channel::mpsc::UnboundedSender<Result<ProcessingRequest, Status>>,
        Pin<Box<dyn Stream<Item = Reply> + Send>>,
        Upstream,
    ) {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let mut out: Pin<Box<dyn Stream<Item = Reply> + Send>> = Box::pin(p.clone().exchange(rx));
        let view = p.inner.routes.load();
        let upstream = view.catalog().get("m").unwrap().upstreams[0].clone();
        for m in [
            post("/v1/chat/completions", &[]),
            body(br#"{"model":"m"}"#),
            answer_head(&[(":status", "200")]),
        ] {
            tx.unbounded_send(Ok(m)).unwrap();
            assert!(out.next().await.unwrap().is_ok());
        }
        (tx, out, upstream)
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_counts_in_flight_at_its_site_from_its_routing_until_envoy_ends_the_stream() {
        let p = processor();
        let view = p.inner.routes.load();
        let slot = view.catalog().get("m").unwrap().upstreams[0].live_shared();
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let mut out = Box::pin(p.clone().exchange(rx));
        tx.unbounded_send(Ok(post("/v1/chat/completions", &[])))
            .unwrap();
        assert!(out.next().await.unwrap().is_ok());
        assert_eq!(slot.drain().outstanding, 0, "not before a site is chosen");
        tx.unbounded_send(Ok(body(br#"{"model":"m"}"#))).unwrap();
        assert!(out.next().await.unwrap().is_ok());
        assert_eq!(slot.drain().outstanding, 1, "from its routing");
        tx.unbounded_send(Ok(answer_head(&[(":status", "200")])))
            .unwrap();
        assert!(out.next().await.unwrap().is_ok());
        // The answer streams on; Envoy sends nothing while it does.
        assert!(
            tokio::time::timeout(IDLE * 2, out.next()).await.is_err(),
            "open past the idle bound once the head is through"
        );
        assert_eq!(slot.drain().outstanding, 1, "through its answer");
        drop(tx);
        assert!(out.next().await.is_none(), "Envoy ended it: so does grid");
        assert_eq!(slot.drain().outstanding, 0, "ended with the exchange");

        // Envoy resetting the stream ends the count as well.
        let (tx, mut out, upstream) = answered(&p).await;
        assert_eq!(upstream.live().drain().outstanding, 1);
        tx.unbounded_send(Err(Status::cancelled("reset"))).unwrap();
        assert!(out.next().await.is_none());
        assert_eq!(upstream.live().drain().outstanding, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_envoy_keeps_open_past_the_longest_answer_is_ended_and_counted_not_a_moment_before()
     {
        let p = processor();
        let (tx, mut out, upstream) = answered(&p).await;
        let head_at = tokio::time::Instant::now();
        assert!(
            tokio::time::timeout(
                LONGEST_ANSWER
                    .checked_sub(Duration::from_millis(1))
                    .unwrap(),
                out.next()
            )
            .await
            .is_err(),
            "still open just before the bound"
        );
        assert_eq!(upstream.live().drain().outstanding, 1);
        assert!(out.next().await.is_none(), "ended at the bound");
        assert_eq!(head_at.elapsed(), LONGEST_ANSWER);
        assert_eq!(upstream.live().drain().outstanding, 0);
        assert_eq!(
            p.inner
                .ext_proc
                .failed
                .get_or_create(&StreamFailure::LongestAnswer)
                .get(),
            1
        );
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_past_its_answers_head_ends_when_the_gateway_stops_and_one_before_it_does_not()
    {
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let p = processor_stopping(stopping);
        let (_answered_tx, mut answered, upstream) = answered(&p).await;
        let (routed_tx, rx) = futures::channel::mpsc::unbounded();
        let mut routed = Box::pin(p.clone().exchange(rx));
        for m in [post("/v1/chat/completions", &[]), body(br#"{"model":"m"}"#)] {
            routed_tx.unbounded_send(Ok(m)).unwrap();
            assert!(routed.next().await.unwrap().is_ok());
        }
        assert_eq!(upstream.live().drain().outstanding, 2);
        stop.send_replace(true);
        assert!(answered.next().await.is_none(), "ended on the stop");
        assert_eq!(upstream.live().drain().outstanding, 1);
        // One still waiting for its answer's head is answered when it comes.
        routed_tx
            .unbounded_send(Ok(answer_head(&[(":status", "200")])))
            .unwrap();
        assert!(routed.next().await.unwrap().is_ok());
        assert!(routed.next().await.is_none(), "and then ends");
        assert_eq!(upstream.live().drain().outstanding, 0);
    }
}
