//! The HTTP side of the signals listener: `GET /v1/site/signals` answered from the site
//! machine (grid-signals' [`Site`](grid_signals::site::Site), which decides what a peer may see) and
//! `POST /v1/site/signals/ingest` handed to the feedback task.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use grid_feedback::{Caller, ReceiverMetrics, RefusalReason, Reply};
use grid_signals::labels::register_zeroed;
use grid_signals::long_poll::{self, HoldRefusal, Holder, Holds, Wait};
use grid_signals::site::Audience;
use grid_signals::store::{IngestMetrics, RelayBudget};
use http::{Method, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::clock::Clock;
use crate::feedback::FeedbackHandle;
use crate::listener::{Handler, HandlerFuture};
use crate::served::Served;
use crate::site_machine::{SharedSignals, lock};
use grid_daemon::tls::Identity;

pub use grid_signals::wire::{CATALOG_PATH, INGEST_PATH, SIGNALS_CONTENT_TYPE, SIGNALS_PATH};

/// Who a relay body is for: the site's own certificate is its gateway, any peer gets
/// this site's rows only ([`Site::relay`](grid_signals::site::Site::relay) holds that rule).
fn audience(caller: &Identity) -> Audience {
    match caller {
        Identity::Local => Audience::Local,
        Identity::Peer(_) => Audience::Peer,
    }
}

grid_signals::label_values! {
    label "reason";
    /// Why the signals listener refused a request (feedback refusals are counted by
    /// grid-feedback); the label of `grid_operator_signals_refused_total`.
    pub enum Refusal {
        /// A trusted certificate that is neither this site nor a configured peer (403).
        Forbidden,
        /// A path the listener does not serve (404).
        NotFound,
        /// A method the path does not take (405).
        Method,
        /// A membership session whose caller is not a peer, or whose identity names
        /// another site than the caller's certificate (403).
        SessionIdentity,
        /// A membership session body that is not one valid identity (400).
        SessionBody,
        /// A membership session while the membership driver's queue is full (503).
        SessionBusy,
        /// A gossip batch pull whose query is not one site and one provider (400).
        GossipQuery,
        /// A membership session from a member declaring another signal transport mode
        /// than this site's (409; the answer says this site's).
        SessionMode,
    }
}

impl Refusal {
    fn status(self) -> StatusCode {
        match self {
            Self::Forbidden | Self::SessionIdentity => StatusCode::FORBIDDEN,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::Method => StatusCode::METHOD_NOT_ALLOWED,
            Self::SessionBody | Self::GossipQuery => StatusCode::BAD_REQUEST,
            Self::SessionBusy => StatusCode::SERVICE_UNAVAILABLE,
            Self::SessionMode => StatusCode::CONFLICT,
        }
    }
}

/// `grid_operator_signals_refused_total{reason}`.
#[derive(Clone, Debug, Default)]
pub struct RefusalMetrics {
    refused: Family<Refusal, Counter>,
}

impl RefusalMetrics {
    /// Registers the series with every reason at 0.
    pub fn register(registry: &mut Registry) -> Self {
        Self {
            refused: register_zeroed(
                registry,
                "grid_operator_signals_refused",
                "Signals-listener requests refused, by reason",
            ),
        }
    }

    /// Refusals for `reason` so far.
    pub fn count(&self, reason: Refusal) -> u64 {
        self.refused.get_or_create(&reason).get()
    }
}

/// `grid_operator_long_polls_held` and `grid_operator_long_polls_refused_total{reason}`.
#[derive(Clone, Debug, Default)]
pub struct LongPollMetrics {
    held: Gauge,
    refused: Family<HoldRefusal, Counter>,
}

impl LongPollMetrics {
    /// Registers the series, every reason at 0.
    pub fn register(registry: &mut Registry) -> Self {
        let held = Gauge::default();
        registry.register(
            "grid_operator_long_polls_held",
            "Long polls of /v1/site/signals held now, waiting for a readiness change",
            held.clone(),
        );
        Self {
            held,
            refused: register_zeroed(
                registry,
                "grid_operator_long_polls_refused",
                "Long polls of /v1/site/signals answered at once, stating no generation, because none could be held, by reason",
            ),
        }
    }

    /// Long polls answered at once for `reason` so far.
    pub fn refused(&self, reason: HoldRefusal) -> u64 {
        self.refused.get_or_create(&reason).get()
    }

    /// Long polls held now.
    pub fn held(&self) -> i64 {
        self.held.get()
    }
}

// A held poll keeps its connection: every connection can hold one, every configured peer
// its own, and a connection past its age closes once its held poll is answered.
const _: () = assert!(long_poll::MAX_HELD_POLLS == crate::slots::MAX_CONNECTIONS);
const _: () = assert!(
    crate::config::MAX_PEERS <= long_poll::MAX_HELD_POLLS - long_poll::LOCAL_RESERVED_HELD_POLLS
);
const _: () = assert!(long_poll::MAX_WAIT_MS < crate::slots::MAX_CONNECTION_AGE.as_millis() as u64);

/// The long polls the signals listener holds (grid-signals' [`Holds`]: at most
/// [`long_poll::MAX_HELD_POLLS`], a peer's share, the gateways' reserve), counted.
#[derive(Clone, Debug, Default)]
pub struct LongPolls {
    holds: Arc<Mutex<Holds>>,
    metrics: LongPollMetrics,
}

impl LongPolls {
    /// An empty table counting into `metrics`.
    pub fn new(metrics: LongPollMetrics) -> Self {
        Self {
            holds: Arc::default(),
            metrics,
        }
    }

    fn table(&self) -> MutexGuard<'_, Holds> {
        self.holds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A held poll for `caller`, given back when dropped; `None` (counted) when there is
    /// no room.
    pub fn hold(&self, caller: &Identity) -> Option<HeldPoll> {
        let peer = match caller {
            Identity::Local => None,
            Identity::Peer(name) => Some(name.clone()),
        };
        let holder = peer.as_deref().map_or(Holder::Local, Holder::Peer);
        let mut table = self.table();
        match table.hold(holder) {
            Ok(()) => {
                self.metrics.held.set(table.held() as i64);
                Some(HeldPoll {
                    polls: self.clone(),
                    peer,
                })
            }
            Err(reason) => {
                self.metrics.refused.get_or_create(&reason).inc();
                None
            }
        }
    }
}

/// One held long poll; dropping it gives it back.
#[derive(Debug)]
pub struct HeldPoll {
    polls: LongPolls,
    peer: Option<String>,
}

impl Drop for HeldPoll {
    fn drop(&mut self) {
        let mut table = self.polls.table();
        table.release(self.peer.as_deref().map_or(Holder::Local, Holder::Peer));
        self.polls.metrics.held.set(table.held() as i64);
    }
}

/// Answers the signals listener's requests.
#[derive(Clone, Debug)]
pub struct SignalsService {
    /// The stores.
    pub signals: SharedSignals,
    /// The feedback task.
    pub feedback: FeedbackHandle,
    /// Relay drop counter.
    pub metrics: IngestMetrics,
    /// Refused requests.
    pub refusals: RefusalMetrics,
    /// Body bytes served.
    pub served: crate::served::ServedMetrics,
    /// Feedback refusals, for the ones made before the receiver saw the request.
    pub feedback_metrics: ReceiverMetrics,
    /// The wall clock relays are stamped against and ingest reports received by.
    pub clock: Clock,
    /// The membership session exchange; `None` when membership does not run.
    pub membership: Option<crate::membership::Endpoint>,
    /// Gossip mode: peers may pull any batch held and its digest.
    pub gossip: bool,
    /// The local gateway's catalog, as the body of `GET /v1/site/catalog`.
    pub catalog: watch::Receiver<Bytes>,
    /// The long polls of `GET /v1/site/signals` held.
    pub long_polls: LongPolls,
}

fn empty(status: StatusCode) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = status;
    r
}

/// The `Date` the body's ages are relative to: HTTP dates have whole seconds, so the
/// reference is `now` rounded down to one, and the relay shifts stamps to match.
fn reference(now: u64) -> u64 {
    now - now % 1000
}

impl SignalsService {
    fn refuse(&self, reason: Refusal) -> Response<Full<Bytes>> {
        self.refusals.refused.get_or_create(&reason).inc();
        empty(reason.status())
    }

    /// The relay for `caller`. A long poll ([`Wait`] in the query) is held until the
    /// readiness generation of what the caller is served differs from the one it saw, at
    /// most the wait asked and [`long_poll::MAX_WAIT_MS`]; every answer states the
    /// generation its body was written at, but for a long poll there was no room to hold
    /// ([`LongPolls`]): that one is answered at once stating none, so its poller waits its
    /// interval as it would for an older operator.
    async fn serve_signals(
        self,
        caller: Option<Identity>,
        wait: Option<Wait>,
    ) -> Response<Full<Bytes>> {
        let Some(caller) = caller else {
            return self.refuse(Refusal::Forbidden);
        };
        let audience = audience(&caller);
        let mut state_generation = true;
        if let Some(wait) = wait {
            let mut readiness = self.signals.readiness();
            let current = readiness.borrow_and_update().get(audience);
            if let Some(hold_ms) = wait.hold_ms(current) {
                match self.long_polls.hold(&caller) {
                    Some(held) => {
                        let _ = tokio::time::timeout(
                            Duration::from_millis(hold_ms),
                            readiness.wait_for(|g| g.get(audience) != wait.seen),
                        )
                        .await;
                        drop(held);
                    }
                    None => state_generation = false,
                }
            }
        }
        let now = self.clock.wall_ms();
        let reference_ms = reference(now);
        let mut body = Vec::new();
        let (report, generation) = {
            let site = lock(&self.signals);
            let report = site.relay(
                audience,
                now,
                reference_ms,
                RelayBudget::default(),
                &mut body,
            );
            (report, site.readiness_generation(audience))
        };
        self.metrics.record_relay_dropped(report.providers_dropped);
        let kind = match caller {
            Identity::Local => Served::RelayLocal,
            Identity::Peer(_) => Served::RelayPeer,
        };
        self.served.add(kind, body.len());
        let mut r = signals_response(body, reference_ms);
        if state_generation {
            r.headers_mut().insert(
                long_poll::GENERATION_HEADER,
                header::HeaderValue::from(generation),
            );
        }
        r
    }

    /// Gossip mode: the `(site, provider)` batches a peer that heard of their versions
    /// asks for (`?site=..&provider=..`, repeated), each whole with its origin's signature
    /// and signing chain, those this site holds and the 1 MiB body cap allows; 404 when it
    /// holds none of them.
    fn serve_batch(&self, caller: Option<&Identity>, query: Option<&str>) -> Response<Full<Bytes>> {
        if !matches!(caller, Some(Identity::Peer(_))) {
            return self.refuse(Refusal::Forbidden);
        }
        let Some(registers) = query.and_then(crate::gossip::parse_batch_query) else {
            return self.refuse(Refusal::GossipQuery);
        };
        let now = self.clock.wall_ms();
        let reference_ms = reference(now);
        let mut body = Vec::new();
        let held = lock(&self.signals)
            .all()
            .encode_pulled(&registers, now, reference_ms, &mut body)
            .len();
        if held == 0 {
            return empty(StatusCode::NOT_FOUND);
        }
        self.served.add(Served::Batch, body.len());
        signals_response(body, reference_ms)
    }

    /// Gossip mode: the version of every batch this site holds, for anti-entropy.
    fn serve_digest(&self, caller: Option<&Identity>) -> Response<Full<Bytes>> {
        if !matches!(caller, Some(Identity::Peer(_))) {
            return self.refuse(Refusal::Forbidden);
        }
        let now = self.clock.wall_ms();
        let body = crate::gossip::write_digest(lock(&self.signals).all().held_fences(now));
        self.served.add(Served::Digest, body.len());
        let mut r = Response::new(Full::new(Bytes::from(body)));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain"),
        );
        r
    }
}

/// A relay body with its `Date` (the reference its ages are relative to).
fn signals_response(body: Vec<u8>, reference_ms: u64) -> Response<Full<Bytes>> {
    {
        let date = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_millis(reference_ms));
        let mut r = Response::new(Full::new(Bytes::from(body)));
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static(SIGNALS_CONTENT_TYPE),
        );
        if let Ok(v) = header::HeaderValue::from_str(&date) {
            h.insert(header::DATE, v);
        }
        h.insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-store"),
        );
        r
    }
}

impl SignalsService {
    async fn session(
        self,
        caller: Option<Identity>,
        request: Request<Incoming>,
    ) -> Response<Full<Bytes>> {
        use crate::membership::{MAX_SESSION_BODY_BYTES, SESSION_EXCHANGE_TIMEOUT, SessionRefusal};
        let Some(endpoint) = self.membership.clone() else {
            return self.refuse(Refusal::NotFound);
        };
        let material = request
            .extensions()
            .get::<crate::listener::SessionMaterial>()
            .copied();
        let peer = match &caller {
            Some(Identity::Peer(name)) => Some(name.clone()),
            _ => None,
        };
        let body = match tokio::time::timeout(
            SESSION_EXCHANGE_TIMEOUT,
            Limited::new(request.into_body(), MAX_SESSION_BODY_BYTES).collect(),
        )
        .await
        {
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(_)) => return self.refuse(Refusal::SessionBody),
            Err(_) => return empty(StatusCode::REQUEST_TIMEOUT),
        };
        match endpoint.accept(peer.as_deref(), material, &body) {
            Ok(own) => {
                let mut r = Response::new(Full::new(own));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    header::HeaderValue::from_static("application/json"),
                );
                r
            }
            Err(SessionRefusal::Body) => self.refuse(Refusal::SessionBody),
            Err(SessionRefusal::Identity) => self.refuse(Refusal::SessionIdentity),
            Err(SessionRefusal::Busy) => self.refuse(Refusal::SessionBusy),
            Err(SessionRefusal::Mode) => {
                let mut r = self.refuse(Refusal::SessionMode);
                if let Some(own) = endpoint.hello() {
                    *r.body_mut() = Full::new(own);
                    r.headers_mut().insert(
                        header::CONTENT_TYPE,
                        header::HeaderValue::from_static("application/json"),
                    );
                }
                r
            }
        }
    }

    /// The catalog, to this site's own gateway only: a peer's gateways follow their own
    /// site's resources.
    fn serve_catalog(&self, caller: Option<&Identity>) -> Response<Full<Bytes>> {
        if caller != Some(&Identity::Local) {
            return self.refuse(Refusal::Forbidden);
        }
        let mut r = Response::new(Full::new(self.catalog.borrow().clone()));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        r.headers_mut().insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-store"),
        );
        r
    }

    async fn ingest(
        self,
        caller: Option<Identity>,
        request: Request<Incoming>,
    ) -> Response<Full<Bytes>> {
        let received_ms = self.clock.wall_ms();
        let caller = match caller {
            Some(Identity::Local) => Caller::Local,
            // A peer or a trusted stranger: the receiver refuses and counts it.
            _ => Caller::Peer,
        };
        let headers: Vec<(Vec<u8>, Vec<u8>)> = request
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        // The body must be empty: one byte is enough to refuse it, so never read more.
        let body = match tokio::time::timeout(
            grid_feedback::INGEST_BUDGET,
            Limited::new(request.into_body(), 1).collect(),
        )
        .await
        {
            Ok(Ok(collected)) => collected.to_bytes().to_vec(),
            Ok(Err(_)) => vec![0],
            Err(_) => return empty(StatusCode::REQUEST_TIMEOUT),
        };
        let outcome = self
            .feedback
            .submit(caller, headers, body, received_ms)
            .await;
        feedback_response(outcome, &self.feedback_metrics)
    }
}

/// The answer to an ingest report: the receiver's reply, or a refusal made before the
/// receiver saw it, in the receiver's own form (its status, `x-grid-ingest-refusal`
/// naming the reason) and counted in the same series, so an overloaded operator says
/// why instead of a bare 503.
fn feedback_response(
    outcome: Result<Reply, RefusalReason>,
    metrics: &ReceiverMetrics,
) -> Response<Full<Bytes>> {
    match outcome {
        Ok(reply) => reply_response(&reply),
        Err(reason) => {
            metrics.record_refusal(reason);
            let mut r = empty(
                StatusCode::from_u16(reason.status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            );
            r.headers_mut().insert(
                grid_feedback::HEADER_REFUSAL,
                header::HeaderValue::from_static(reason.as_str()),
            );
            r
        }
    }
}

fn reply_response(reply: &Reply) -> Response<Full<Bytes>> {
    let mut r =
        empty(StatusCode::from_u16(reply.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR));
    for (name, value) in reply.headers() {
        if let Ok(v) = header::HeaderValue::from_str(&value) {
            r.headers_mut().insert(name, v);
        }
    }
    r
}

impl Handler for SignalsService {
    fn handle(&self, caller: Option<Identity>, request: Request<Incoming>) -> HandlerFuture {
        let path = request.uri().path().to_owned();
        let method = request.method().clone();
        match (path.as_str(), method) {
            (SIGNALS_PATH, Method::GET) => {
                let wait = request.uri().query().and_then(Wait::parse);
                Box::pin(self.clone().serve_signals(caller, wait))
            }
            (INGEST_PATH, Method::POST) => Box::pin(self.clone().ingest(caller, request)),
            (crate::membership::SESSION_PATH, Method::POST) => {
                Box::pin(self.clone().session(caller, request))
            }
            (CATALOG_PATH, Method::GET) => {
                let r = self.serve_catalog(caller.as_ref());
                Box::pin(async move { r })
            }
            (crate::gossip::BATCH_PATH, Method::GET) if self.gossip => {
                let r = self.serve_batch(caller.as_ref(), request.uri().query());
                Box::pin(async move { r })
            }
            (crate::gossip::DIGEST_PATH, Method::GET) if self.gossip => {
                let r = self.serve_digest(caller.as_ref());
                Box::pin(async move { r })
            }
            (SIGNALS_PATH | INGEST_PATH | CATALOG_PATH | crate::membership::SESSION_PATH, _) => {
                let r = self.refuse(Refusal::Method);
                Box::pin(async move { r })
            }
            _ => {
                let r = self.refuse(Refusal::NotFound);
                Box::pin(async move { r })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_feedback_queue_answers_503_naming_the_reason_and_counts_it() {
        let mut registry = Registry::default();
        let metrics = ReceiverMetrics::register(&mut registry);
        let r = feedback_response(Err(RefusalReason::Busy), &metrics);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            r.headers()
                .get(grid_feedback::HEADER_REFUSAL)
                .and_then(|v| v.to_str().ok()),
            Some("busy")
        );
        assert_eq!(metrics.refusal_count(RefusalReason::Busy), 1);
        let r = feedback_response(Err(RefusalReason::Deadline), &metrics);
        assert_eq!(
            r.headers()
                .get(grid_feedback::HEADER_REFUSAL)
                .and_then(|v| v.to_str().ok()),
            Some("deadline")
        );
    }

    #[test]
    fn a_poll_with_no_room_to_be_held_is_counted_by_reason_and_a_hold_is_given_back_on_drop() {
        let mut registry = Registry::default();
        let polls = LongPolls::new(LongPollMetrics::register(&mut registry));
        let b = Identity::Peer("b".into());
        let held: Vec<HeldPoll> = (0..long_poll::MAX_HELD_POLLS_PER_PEER)
            .map(|_| polls.hold(&b).expect("within b's share"))
            .collect();
        assert!(polls.hold(&b).is_none());
        assert_eq!(polls.metrics.refused(HoldRefusal::PeerFull), 1);
        assert_eq!(polls.metrics.refused(HoldRefusal::Full), 0);
        let local: Vec<HeldPoll> = (held.len()..long_poll::MAX_HELD_POLLS)
            .map(|_| polls.hold(&Identity::Local).expect("room left"))
            .collect();
        assert_eq!(
            polls.metrics.held(),
            long_poll::MAX_HELD_POLLS as i64,
            "every one held"
        );
        assert!(polls.hold(&Identity::Local).is_none());
        assert!(polls.hold(&Identity::Peer("c".into())).is_none());
        assert_eq!(polls.metrics.refused(HoldRefusal::Full), 2);
        drop(local);
        drop(held);
        assert_eq!(polls.metrics.held(), 0);
        assert!(polls.hold(&b).is_some(), "given back");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "grid_operator_long_polls_refused_total{reason=\"full\"} 2",
            "grid_operator_long_polls_refused_total{reason=\"peer_full\"} 1",
            "grid_operator_long_polls_held 0",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    #[test]
    fn reference_is_the_whole_second_the_date_header_can_say() {
        assert_eq!(reference(1_700_000_000_999), 1_700_000_000_000);
        assert_eq!(reference(1_700_000_000_000), 1_700_000_000_000);
    }
}
