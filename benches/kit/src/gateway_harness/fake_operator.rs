//! A fake local operator on loopback: the mTLS signals listener a gateway polls. It relays
//! one batch per site from a mutable load table, dates each body, and answers feedback
//! POSTs with the 204 echo (after a settable delay), recording what it received. It
//! speaks HTTP/2 and HTTP/1.1, as the real signals listener does, and counts the TCP
//! connections it accepts.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// What the relay says about one site's provider `p`.
#[derive(Clone, Copy, Debug)]
pub struct SiteLoad {
    /// `llm_d_epp_ready_endpoints`.
    pub ready_endpoints: u32,
    /// `llm_d_epp_average_running_requests`.
    pub running_avg: f64,
    /// `llm_d_epp_average_queue_size`.
    pub queued_avg: f64,
    /// `llm_d_epp_average_kv_cache_utilization`.
    pub kv_mean: f64,
    /// Endpoints reporting a per-endpoint queue, and how many of them have work waiting.
    pub units: u32,
    /// Serving units reporting a waiting queue.
    pub units_waiting: u32,
    /// `llm_d_epp_flow_control_queue_size`.
    pub flow_held: f64,
    /// Added to every sample stamp (a large value makes the gateway drop rows as skew).
    pub stamp_offset_ms: u64,
}

impl SiteLoad {
    /// A ready, idle site.
    pub fn idle() -> Self {
        Self {
            ready_endpoints: 2,
            running_avg: 0.0,
            queued_avg: 0.0,
            kv_mean: 0.05,
            units: 2,
            units_waiting: 0,
            flow_held: 0.0,
            stamp_offset_ms: 0,
        }
    }

    /// Every unit busy with work waiting and the KV cache full.
    pub fn full() -> Self {
        Self {
            ready_endpoints: 2,
            running_avg: 8.0,
            queued_avg: 4.0,
            kv_mean: 1.0,
            units: 2,
            units_waiting: 2,
            flow_held: 3.0,
            stamp_offset_ms: 0,
        }
    }
}

/// One feedback POST as received.
#[derive(Clone, Debug)]
pub struct FeedbackSeen {
    /// `x-grid-ingest-epoch`.
    pub epoch: String,
    /// `x-grid-ingest-sequence`.
    pub sequence: u64,
    /// The cumulative rejected count reported.
    pub rejected: u64,
    /// Whether the report said clean.
    pub clean: bool,
}

#[derive(Default)]
struct State {
    /// The publisher epoch, fixed for the fake's life as a real operator's is per
    /// process (a changing epoch is a new revision and resets learning).
    epoch: u64,
    sites: BTreeMap<String, SiteLoad>,
    sequence: u64,
    polls: u64,
    feedback: Vec<FeedbackSeen>,
    /// TCP connections accepted so far.
    connections: u64,
    /// How long each feedback POST is held before it is answered.
    ingest_delay: std::time::Duration,
    /// How long each relay GET is held before it is answered.
    relay_delay: std::time::Duration,
}

/// A fake operator: serves a relay body built from the loads the test sets, over mTLS, and records feedback POSTs.
pub struct FakeOperator {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeOperator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeOperator {
    /// Starts serving with `tls` (which decides which clients it accepts).
    pub async fn start(tls: Arc<rustls::ServerConfig>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Publisher epochs are wall-clock based; a minute ago is well inside the lead bound.
        let epoch = grid_gateway::clock::wall_ms() - 60_000;
        let state = Arc::new(Mutex::new(State {
            epoch,
            ..State::default()
        }));
        let st = Arc::clone(&state);
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                st.lock().unwrap().connections += 1;
                let (acceptor, st) = (acceptor.clone(), Arc::clone(&st));
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let svc = service_fn(move |req| handle(Arc::clone(&st), req));
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        Self { addr, state, task }
    }

    /// Its `https://` base URL.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Sets `site`'s load for the next relay.
    pub fn set(&self, site: &str, load: SiteLoad) {
        self.state
            .lock()
            .unwrap()
            .sites
            .insert(site.to_owned(), load);
    }

    /// Relay requests received so far (each answered once the relay delay has passed).
    pub fn polls(&self) -> u64 {
        self.state.lock().unwrap().polls
    }

    /// TCP connections accepted so far (a gateway holds exactly one).
    pub fn connections(&self) -> u64 {
        self.state.lock().unwrap().connections
    }

    /// Holds every later feedback POST for `delay` before answering it (a slow persist).
    pub fn set_ingest_delay(&self, delay: std::time::Duration) {
        self.state.lock().unwrap().ingest_delay = delay;
    }

    /// Holds every later relay GET for `delay` before answering it (an operator that
    /// stalls mid-poll).
    pub fn set_relay_delay(&self, delay: std::time::Duration) {
        self.state.lock().unwrap().relay_delay = delay;
    }

    /// Every feedback report received.
    pub fn feedback(&self) -> Vec<FeedbackSeen> {
        self.state.lock().unwrap().feedback.clone()
    }
}

async fn handle(
    state: Arc<Mutex<State>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    match (req.method().as_str(), req.uri().path()) {
        ("GET", grid_signals::wire::SIGNALS_PATH) => {
            let delay = {
                let mut st = state.lock().unwrap();
                st.polls += 1;
                st.relay_delay
            };
            tokio::time::sleep(delay).await;
            // Stamped when answered, as a real operator's relay is.
            let now = grid_gateway::clock::wall_ms();
            let date = httpdate::fmt_http_date(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(now),
            );
            let body = {
                let mut st = state.lock().unwrap();
                st.sequence += 1;
                relay(&st.sites, st.epoch, st.sequence, now)
            };
            Ok(Response::builder()
                .header("date", date)
                .header("content-type", grid_signals::wire::SIGNALS_CONTENT_TYPE)
                .body(Full::new(Bytes::from(body)))
                .unwrap())
        }
        ("POST", grid_signals::wire::INGEST_PATH) => {
            let h = req.headers().clone();
            let _ = req.into_body().collect().await;
            let get = |n: &str| {
                h.get(n)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned()
            };
            let seen = FeedbackSeen {
                epoch: get("x-grid-ingest-epoch"),
                sequence: get("x-grid-ingest-sequence").parse().unwrap_or(0),
                rejected: get("x-grid-ingest-rejected").parse().unwrap_or(0),
                clean: get("x-grid-ingest-clean") == "true",
            };
            let delay = {
                let mut st = state.lock().unwrap();
                st.feedback.push(seen);
                st.ingest_delay
            };
            tokio::time::sleep(delay).await;
            Ok(Response::builder()
                .status(StatusCode::NO_CONTENT)
                .header("x-grid-ingest-epoch", get("x-grid-ingest-epoch"))
                .header("x-grid-ingest-sequence", get("x-grid-ingest-sequence"))
                .body(Full::new(Bytes::new()))
                .unwrap())
        }
        _ => Ok(Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::new()))
            .unwrap()),
    }
}

/// One complete batch per site (provider `p`), every sample stamped `now`.
fn relay(sites: &BTreeMap<String, SiteLoad>, epoch: u64, sequence: u64, now: u64) -> String {
    let mut out = String::new();
    for (site, l) in sites {
        let t = now + l.stamp_offset_ms;
        let mut rows = vec![
            (
                "grid_provider_ready".to_owned(),
                String::new(),
                f64::from(u8::from(l.ready_endpoints > 0)),
            ),
            (
                "llm_d_epp_ready_endpoints".to_owned(),
                String::new(),
                f64::from(l.ready_endpoints),
            ),
            (
                "llm_d_epp_average_running_requests".to_owned(),
                String::new(),
                l.running_avg,
            ),
            (
                "llm_d_epp_average_queue_size".to_owned(),
                String::new(),
                l.queued_avg,
            ),
            (
                "llm_d_epp_average_kv_cache_utilization".to_owned(),
                String::new(),
                l.kv_mean,
            ),
            (
                "llm_d_epp_std_dev_kv_cache_utilization".to_owned(),
                String::new(),
                0.0,
            ),
            (
                "llm_d_epp_flow_control_queue_size".to_owned(),
                String::new(),
                l.flow_held,
            ),
        ];
        for u in 0..l.units {
            rows.push((
                "llm_d_epp_per_endpoint_queue_size".to_owned(),
                format!(",model_server_endpoint=\"10.0.0.{u}:8000\""),
                if u < l.units_waiting { 2.0 } else { 0.0 },
            ));
        }
        let _ = writeln!(
            out,
            "grid_provider_config_generation{{grid_site=\"{site}\",grid_provider=\"p\",provider_uid=\"uid-{site}\",publisher_epoch=\"{epoch}\",batch_sequence=\"{sequence}\",batch_samples=\"{}\"}} 1 {t}",
            rows.len()
        );
        for (name, extra, v) in rows {
            let _ = writeln!(
                out,
                "{name}{{grid_site=\"{site}\",grid_provider=\"p\"{extra}}} {v} {t}"
            );
        }
    }
    out
}
