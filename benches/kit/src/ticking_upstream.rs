//! An upstream that streams long answers the way a model server generates them: every
//! streamed chat request gets one server-sent event at once and then one every
//! `interval`, `events` in all, then `data: [DONE]`. After the first event each answer's
//! ticks are shifted by a phase of its own within one interval ([`phase`]), spread
//! evenly over the answers, so the events of N answers leave at an even rate whatever
//! instants the answers opened at. Each event carries the wall-clock
//! instant it was handed to the socket (`"sent_ns"`, nanoseconds since the Unix epoch),
//! so a client in another process on the same machine reads the delay each event took
//! to reach it ([`sent_ns_in`]). It also serves an idle EPP `/metrics`, so a real
//! operator can feed a gateway from it.
//!
//! The wall clock, not a monotonic one: the sender and the reader are different
//! processes, and `CLOCK_REALTIME` is the clock both read the same; over a benchmark's
//! minutes its slewing is far below the microseconds measured.
//!
//! Served on 127.0.0.1, HTTP/1.1 and HTTP/2 with prior knowledge.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep};

use crate::Error;
pub use crate::clock::wall_ns;
use crate::sim_site::openai::{self, DONE};
use grid_sim::fake_epp::{EppIdentity, FakeEpp};
use grid_sim::site_model::{SiteConfig, SiteModel};

/// The upstream's listen backlog: as the gateway's own default (`listenBacklog`, 4,096)
/// and nginx's; the kernel caps it at `net.core.somaxconn`.
pub const UPSTREAM_BACKLOG: u32 = 4_096;

/// The key before each event's send instant.
pub const SENT_KEY: &[u8] = b"\"sent_ns\":";
/// The smallest event this upstream writes: `data: {"sent_ns":<20 digits>,"p":""}` and a blank line.
pub const MIN_EVENT_BYTES: usize = 47;

/// How the answers tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticks {
    /// Between two events of one answer.
    pub interval: Duration,
    /// Events per answer, the first sent at once.
    pub events: u32,
    /// Each event's size on the wire (at least [`MIN_EVENT_BYTES`]).
    pub event_bytes: usize,
}

/// How far after one interval the second event of the `k`th streamed answer is sent
/// (and every later one, at fixed intervals after it): `interval` times the fractional
/// part of `k` over the golden ratio, a sequence that covers the interval evenly for any
/// number of answers.
///
/// Without it each answer's events keep the phase of the instant it opened: a proxy that
/// opened 9,000 answers in a burst had the upstream send, and the clients read, their
/// events in bursts every interval for the whole run, so the tail of the delay per event
/// measured how the streams happened to open, not what the proxy adds to an event.
pub fn phase(k: u64, interval: Duration) -> Duration {
    /// 1 / golden ratio.
    const STEP: f64 = 0.618_033_988_749_894_9;
    interval.mul_f64((k as f64 * STEP).fract())
}

/// One event sent now, padded to `bytes`.
fn event(bytes: usize) -> Bytes {
    let head = format!("data: {{\"sent_ns\":{:020},\"p\":\"", wall_ns());
    let tail = "\"}\n\n";
    let pad = bytes.saturating_sub(head.len() + tail.len());
    let mut out = String::with_capacity(head.len() + pad + tail.len());
    out.push_str(&head);
    out.extend(std::iter::repeat_n('x', pad));
    out.push_str(tail);
    Bytes::from(out)
}

/// Every send instant in `bytes` (whole events only: an instant split across two reads
/// is not read, and a client that keeps its unread tail reads it with the next).
pub fn sent_ns_in(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        let at = rest.windows(SENT_KEY.len()).position(|w| w == SENT_KEY)?;
        let digits = &rest[at + SENT_KEY.len()..];
        let n = digits.iter().take_while(|b| b.is_ascii_digit()).count();
        if n == 0 || n == digits.len() {
            rest = &[];
            return None;
        }
        rest = &digits[n..];
        std::str::from_utf8(&digits[..n]).ok()?.parse().ok()
    })
}

/// A streamed answer's body: an event at once, then one per tick.
struct Ticking {
    ticks: Ticks,
    sent: u32,
    next: Pin<Box<Sleep>>,
    done: bool,
}

impl Body for Ticking {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.sent == self.ticks.events {
            self.done = true;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(DONE.as_bytes())))));
        }
        if self.sent > 0 {
            if self.next.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // Fixed deadlines, not fixed gaps: a late tick does not shift the later ones.
            let at = self.next.deadline() + self.ticks.interval;
            self.next.as_mut().reset(at);
        }
        self.sent += 1;
        Poll::Ready(Some(Ok(Frame::data(event(self.ticks.event_bytes)))))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// Either a fixed body or a ticking one.
type Answer = Either<Full<Bytes>, Ticking>;

struct Shared {
    model: String,
    metrics: Bytes,
    full: Bytes,
    ticks: Ticks,
    /// Streamed answers begun so far (the next one's [`phase`] index).
    streamed: std::sync::atomic::AtomicU64,
}

fn respond(status: StatusCode, content_type: &'static str, body: Answer) -> Response<Answer> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

async fn answer(shared: Arc<Shared>, request: Request<Incoming>) -> Response<Answer> {
    let empty = || Either::Left(Full::new(Bytes::new()));
    match (request.method().clone(), request.uri().path()) {
        (Method::GET, "/metrics") => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            Either::Left(Full::new(shared.metrics.clone())),
        ),
        (Method::POST, "/v1/chat/completions") => {
            let Ok(body) = request.into_body().collect().await else {
                return respond(StatusCode::BAD_REQUEST, "text/plain", empty());
            };
            match openai::parse_request(&body.to_bytes()) {
                Some(p) if p.model.as_deref() == Some(shared.model.as_str()) => {
                    if p.stream {
                        let k = shared
                            .streamed
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let interval = shared.ticks.interval;
                        let ticking = Ticking {
                            ticks: shared.ticks,
                            sent: 0,
                            next: Box::pin(tokio::time::sleep_until(
                                Instant::now() + interval + phase(k, interval),
                            )),
                            done: false,
                        };
                        respond(StatusCode::OK, "text/event-stream", Either::Right(ticking))
                    } else {
                        respond(
                            StatusCode::OK,
                            "application/json",
                            Either::Left(Full::new(shared.full.clone())),
                        )
                    }
                }
                _ => respond(StatusCode::BAD_REQUEST, "text/plain", empty()),
            }
        }
        _ => respond(StatusCode::NOT_FOUND, "text/plain", empty()),
    }
}

/// A running ticking upstream. Dropping it stops accepting.
#[derive(Debug)]
pub struct TickingUpstream {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for TickingUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TickingUpstream {
    /// Serves `model` on `addr` (port 0: one the kernel picks). Must run inside a tokio
    /// runtime.
    ///
    /// # Errors
    /// An event smaller than [`MIN_EVENT_BYTES`], or an address that cannot be bound.
    pub fn start(addr: SocketAddr, model: &str, ticks: Ticks) -> Result<Self, Error> {
        if ticks.event_bytes < MIN_EVENT_BYTES {
            return Err(Error::Io(std::io::Error::other(format!(
                "events of {} bytes: at least {MIN_EVENT_BYTES}",
                ticks.event_bytes
            ))));
        }
        let idle = SiteModel::new(SiteConfig::new("ticking", 1, 1024), 1)?;
        let metrics = FakeEpp::new(EppIdentity::new("ticking", model)).render(&idle);
        let shared = Arc::new(Shared {
            model: model.to_owned(),
            metrics: Bytes::from(metrics),
            full: Bytes::from(
                openai::full_response(openai::Api::Chat, 1, model, "ticking-ep-0").to_string(),
            ),
            ticks,
            streamed: std::sync::atomic::AtomicU64::new(0),
        });
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        // The proxies measured open thousands of upstream connections at once; tokio's
        // default backlog (1,024) dropped their SYNs and made them all wait for the retry.
        let listener = socket.listen(UPSTREAM_BACKLOG)?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    // Out of descriptors: wait for some to be closed rather than spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let shared = Arc::clone(&shared);
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let shared = Arc::clone(&shared);
                        async move { Ok::<_, Infallible>(answer(shared, request).await) }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { addr, task })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:port`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::chat_body;
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;

    #[test]
    fn events_are_the_size_asked_and_carry_their_send_instant() {
        let before = wall_ns();
        let e = event(100);
        let after = wall_ns();
        assert_eq!(e.len(), 100);
        let sent: Vec<u64> = sent_ns_in(&e).collect();
        assert_eq!(sent.len(), 1);
        assert!((before..=after).contains(&sent[0]), "{sent:?}");
        assert_eq!(event(MIN_EVENT_BYTES).len(), MIN_EVENT_BYTES);
    }

    #[tokio::test]
    async fn the_upstream_listens_with_its_backlog_as_the_kernel_reports_it() {
        let ticks = Ticks {
            interval: Duration::from_millis(20),
            events: 1,
            event_bytes: 80,
        };
        let up = TickingUpstream::start(SocketAddr::from(([127, 0, 0, 1], 0)), "m", ticks).unwrap();
        let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // `ss` reports a listener's backlog in its Send-Q column.
        let out = std::process::Command::new("ss")
            .args(["-Hltn", &format!("sport = :{}", up.addr().port())])
            .output()
            .unwrap();
        let line = String::from_utf8(out.stdout).unwrap();
        let backlog: u32 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
        assert_eq!(backlog, UPSTREAM_BACKLOG.min(somaxconn), "{line}");
    }

    #[test]
    fn the_phases_of_any_number_of_answers_cover_the_interval_evenly() {
        let interval = Duration::from_millis(500);
        for n in [10_u64, 1_000, 9_000] {
            let mut bins = [0_u64; 10];
            for k in 0..n {
                let p = phase(k, interval);
                assert!(p < interval, "{p:?}");
                bins[(p.as_nanos() * 10 / interval.as_nanos()) as usize] += 1;
            }
            // Each tenth of the interval holds a tenth of the answers, give or take one
            // and a hundredth of them.
            for (i, &b) in bins.iter().enumerate() {
                assert!(
                    b.abs_diff(n / 10) <= 1 + n / 100,
                    "n {n}, bin {i}: {bins:?}"
                );
            }
        }
        assert_eq!(phase(0, interval), Duration::ZERO);
    }

    #[test]
    fn an_instant_cut_by_the_end_of_a_read_is_not_read() {
        let two = [event(60), event(60)].concat();
        assert_eq!(sent_ns_in(&two).count(), 2);
        assert_eq!(sent_ns_in(&two[..60 + 20]).count(), 1);
        assert_eq!(sent_ns_in(b"\"sent_ns\":123").count(), 0);
    }

    #[tokio::test]
    async fn a_streamed_answer_ticks_its_events_then_ends() {
        let ticks = Ticks {
            interval: Duration::from_millis(20),
            events: 4,
            event_bytes: 80,
        };
        let up = TickingUpstream::start(SocketAddr::from(([127, 0, 0, 1], 0)), "m", ticks).unwrap();
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let request = Request::post(format!("{}/v1/chat/completions", up.base_url()))
            .body(Full::new(chat_body("m", true)))
            .unwrap();
        let start = wall_ns();
        let answer = client.request(request).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        let sent: Vec<u64> = sent_ns_in(&body).collect();
        assert_eq!(sent.len(), 4, "{body:?}");
        assert!(body.ends_with(DONE.as_bytes()));
        // The last event left three intervals after the first.
        assert!(sent[3] - sent[0] >= 3 * 20_000_000 - 1_000_000, "{sent:?}");
        assert!(sent[0] >= start);
    }
}
