//! The fake EPP endpoint of the daemons' tests: a small hyper server on 127.0.0.1 whose
//! answer (an EPP body such as [`grid_sim::fake_epp`] writes, a status, a hang, a delay)
//! the test changes while it runs, counting requests and how many were in flight at once.
//! A whole simulated site behind it is [`crate::sim_site`].
#![allow(clippy::missing_panics_doc)] // a test fixture: every failure is the test's

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// What the fake answers next.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// 200 with this exposition.
    Body(Vec<u8>),
    /// This status, empty body.
    Status(u16),
    /// Accept the request, then never answer.
    Hang,
    /// Wait, then 200 with this body.
    Delay(Duration, Vec<u8>),
}

/// Counters shared with the test.
#[derive(Default)]
pub struct Stats {
    /// Requests received.
    pub requests: AtomicUsize,
    /// Requests being answered right now.
    pub in_flight: AtomicUsize,
    /// The most requests ever answered at once.
    pub max_in_flight: AtomicUsize,
}

/// A running fake EPP.
pub struct FakeEpp {
    /// Where it listens.
    pub addr: SocketAddr,
    /// What it answers; change it any time.
    pub behaviour: Arc<Mutex<Behaviour>>,
    /// Its counters.
    pub stats: Arc<Stats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeEpp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeEpp {
    /// Starts a plain-HTTP fake.
    pub async fn start(behaviour: Behaviour) -> Self {
        Self::start_with_tls(behaviour, None).await
    }

    /// Starts a fake, serving HTTPS when `tls` is given.
    pub async fn start_with_tls(
        behaviour: Behaviour,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let behaviour = Arc::new(Mutex::new(behaviour));
        let stats = Arc::new(Stats::default());
        let (b, s) = (behaviour.clone(), stats.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (b, s, tls) = (b.clone(), s.clone(), tls.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(req, b.clone(), s.clone()));
                    let http = hyper::server::conn::http1::Builder::new();
                    if let Some(tls) = tls {
                        if let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls).accept(tcp).await {
                            let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                        }
                    } else {
                        let _ = http.serve_connection(TokioIo::new(tcp), svc).await;
                    }
                });
            }
        });
        Self {
            addr,
            behaviour,
            stats,
            task,
        }
    }

    /// The base URL (`http://127.0.0.1:port`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Changes the answer.
    pub fn set(&self, behaviour: Behaviour) {
        *self.behaviour.lock().unwrap() = behaviour;
    }
}

struct InFlight(Arc<Stats>);

impl InFlight {
    fn enter(stats: Arc<Stats>) -> Self {
        let now = stats.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        stats.max_in_flight.fetch_max(now, Ordering::SeqCst);
        Self(stats)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn answer(
    _req: Request<Incoming>,
    behaviour: Arc<Mutex<Behaviour>>,
    stats: Arc<Stats>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    stats.requests.fetch_add(1, Ordering::SeqCst);
    let _guard = InFlight::enter(stats);
    let b = behaviour.lock().unwrap().clone();
    let ok = |body: Vec<u8>| {
        Response::builder()
            .header("content-type", "text/plain; version=0.0.4")
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };
    Ok(match b {
        Behaviour::Body(body) => ok(body),
        Behaviour::Status(code) => Response::builder()
            .status(code)
            .body(Full::new(Bytes::new()))
            .unwrap(),
        Behaviour::Hang => {
            std::future::pending::<()>().await;
            unreachable!()
        }
        Behaviour::Delay(d, body) => {
            tokio::time::sleep(d).await;
            ok(body)
        }
    })
}
