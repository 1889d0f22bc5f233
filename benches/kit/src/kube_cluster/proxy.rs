//! A fault-injecting HTTPS proxy in front of the real API server, for the faults the real
//! server will not produce on demand: 409 on the next N writes, a 5xx, a slow answer, a
//! dropped watch, the server gone (503 to everything). Every other request is passed
//! to the real server as it came (the operator's own token authenticates it there) and
//! its answer streamed back as it comes, so watches work through it.
//!
//! It serves the API server's own certificate, on 127.0.0.1, over HTTP/1.1. It logs
//! every request (method, path, query), so a test can count the operator's writes.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Which requests a [`Fault`] applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Every request.
    Any,
    /// POST, PUT, PATCH and DELETE whose path contains the text (empty: every write).
    Writes(String),
    /// Any request whose path contains the text.
    Path(String),
}

/// What a [`Fault`] does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Answer 409 Conflict (the real server's `Status`) without passing the request on.
    Conflict,
    /// Answer this 5xx with an `InternalError` `Status`, without passing it on.
    ServerError(u16),
    /// Wait this long, then pass it on.
    Delay(Duration),
}

/// An injected fault: `action` on the next `times` requests `target` matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Which requests.
    pub target: Target,
    /// How many of them.
    pub times: u32,
    /// What happens.
    pub action: Action,
}

/// One request, as the proxy saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    /// The method.
    pub method: Method,
    /// The path.
    pub path: String,
    /// The query string.
    pub query: String,
}

fn is_write(m: &Method) -> bool {
    matches!(
        *m,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

impl Target {
    fn matches(&self, method: &Method, path: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Writes(text) => is_write(method) && path.contains(text.as_str()),
            Self::Path(text) => path.contains(text.as_str()),
        }
    }
}

#[derive(Debug, Default)]
struct Shared {
    faults: Vec<Fault>,
    log: Vec<Logged>,
    unavailable: bool,
}

type Body = BoxBody<Bytes, std::io::Error>;
type Upstream = Client<hyper_rustls::HttpsConnector<HttpConnector>, Incoming>;

/// A running proxy. Dropping it stops it (and every stream through it).
pub struct FaultProxy {
    /// Where it listens.
    pub addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
    drops: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.drops.send_modify(|n| *n += 1);
        self.task.abort();
    }
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(
            Full::new(Bytes::from(body.to_string()))
                .map_err(|e: Infallible| match e {})
                .boxed(),
        )
        .expect("status response")
}

impl FaultProxy {
    /// A proxy on 127.0.0.1 in front of the API server at `addr`, serving its
    /// certificate and key (`serving`, PEM files) and trusting the CA in `ca_file`.
    pub async fn start(addr: SocketAddr, serving: &(PathBuf, PathBuf), ca_file: &Path) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain: Vec<_> = CertificateDer::pem_file_iter(&serving.0)
            .expect("serving certificate")
            .map(|c| c.expect("certificate PEM"))
            .collect();
        let key = PrivateKeyDer::from_pem_file(&serving.1).expect("serving key");
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server certificate");
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));

        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(ca_file).expect("CA file") {
            roots.add(c.expect("CA PEM")).expect("CA certificate");
        }
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(client)
            .https_only()
            .enable_http1()
            .build();
        let upstream: Upstream = Client::builder(TokioExecutor::new()).build(https);
        let origin = format!("https://{addr}");

        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (drops, _) = watch::channel(0u64);
        let task = {
            let shared = shared.clone();
            let drops = drops.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        continue;
                    };
                    let (acceptor, shared, drops, upstream, origin) = (
                        acceptor.clone(),
                        shared.clone(),
                        drops.clone(),
                        upstream.clone(),
                        origin.clone(),
                    );
                    tokio::spawn(async move {
                        let Ok(Ok(tls)) =
                            tokio::time::timeout(Duration::from_secs(5), acceptor.accept(tcp))
                                .await
                        else {
                            return;
                        };
                        let service = service_fn(move |req| {
                            handle(
                                req,
                                shared.clone(),
                                drops.clone(),
                                upstream.clone(),
                                origin.clone(),
                            )
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tls), service)
                            .await;
                    });
                }
            })
        };
        Self {
            addr,
            shared,
            drops,
            task,
        }
    }

    /// Its `https://` URL.
    #[must_use]
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Queues a fault.
    pub fn inject(&self, fault: Fault) {
        self.shared.lock().faults.push(fault);
    }

    /// Answers every request 503 (dropping every stream in flight), or passes them again.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.shared.lock().unavailable = unavailable;
        if unavailable {
            self.drop_streams();
        }
    }

    /// Cuts every answer in flight (a watch ends as if its connection dropped).
    pub fn drop_streams(&self) {
        self.drops.send_modify(|n| *n += 1);
    }

    /// Every request so far.
    #[must_use]
    pub fn log(&self) -> Vec<Logged> {
        self.shared.lock().log.clone()
    }

    /// How many writes (POST, PUT, PATCH, DELETE) went to a path containing `text`.
    #[must_use]
    pub fn writes_to(&self, text: &str) -> usize {
        self.shared
            .lock()
            .log
            .iter()
            .filter(|l| is_write(&l.method) && l.path.contains(text))
            .count()
    }
}

/// What the proxy does with one request, decided under the lock.
enum Decision {
    Answer(Response<Body>),
    Pass(Option<Duration>),
}

fn decide(shared: &Mutex<Shared>, method: &Method, path: &str, query: &str) -> Decision {
    let mut s = shared.lock();
    s.log.push(Logged {
        method: method.clone(),
        path: path.to_owned(),
        query: query.to_owned(),
    });
    if s.unavailable {
        return Decision::Answer(status(
            503,
            "ServiceUnavailable",
            "the test made the API server unavailable",
        ));
    }
    let Some(i) = s
        .faults
        .iter()
        .position(|f| f.times > 0 && f.target.matches(method, path))
    else {
        return Decision::Pass(None);
    };
    let fault = &mut s.faults[i];
    fault.times -= 1;
    let action = fault.action.clone();
    if fault.times == 0 {
        s.faults.remove(i);
    }
    match action {
        Action::Conflict => Decision::Answer(status(
            409,
            "Conflict",
            "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again (injected by the test proxy)",
        )),
        Action::ServerError(code) => {
            Decision::Answer(status(code, "InternalError", "injected by the test proxy"))
        }
        Action::Delay(d) => Decision::Pass(Some(d)),
    }
}

async fn handle(
    req: Request<Incoming>,
    shared: Arc<Mutex<Shared>>,
    drops: watch::Sender<u64>,
    upstream: Upstream,
    origin: String,
) -> Result<Response<Body>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or_default().to_owned();
    let mut dropped = drops.subscribe();
    match decide(&shared, &method, &path, &query) {
        Decision::Answer(r) => return Ok(r),
        Decision::Pass(Some(d)) => tokio::time::sleep(d).await,
        Decision::Pass(None) => {}
    }
    let (mut parts, body) = req.into_parts();
    let target = match parts.uri.path_and_query() {
        Some(pq) => format!("{origin}{pq}"),
        None => origin,
    };
    parts.uri = target.parse().expect("upstream URI");
    parts.headers.remove(http::header::HOST);
    let answer = tokio::select! {
        a = upstream.request(Request::from_parts(parts, body)) => a,
        _ = dropped.changed() => return Ok(status(503, "ServiceUnavailable", "dropped by the test proxy")),
    };
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            return Ok(status(
                502,
                "InternalError",
                &format!("the test proxy's upstream: {e}"),
            ));
        }
    };
    // The answer is streamed through a channel, so that a drop cuts it mid-stream.
    let (parts, mut body) = answer.into_parts();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(16);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                frame = body.frame() => match frame {
                    Some(Ok(f)) => if tx.send(Ok(f)).await.is_err() { return },
                    Some(Err(e)) => { let _ = tx.send(Err(std::io::Error::other(e))).await; return }
                    None => return,
                },
                _ = dropped.changed() => {
                    let _ = tx.send(Err(std::io::Error::other("dropped by the test proxy"))).await;
                    return;
                }
            }
        }
    });
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
    Ok(Response::from_parts(parts, StreamBody::new(stream).boxed()))
}
