//! A fake OpenAI-compatible model server on loopback: JSON answers, SSE streams, and a
//! record of every request it saw.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// What the fake saw of one request.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The path and query it was asked for.
    pub path: String,
    /// The request headers.
    pub headers: HeaderMap,
    /// The request body.
    pub body: Bytes,
}

/// Pause between SSE events: long enough that a buffering proxy would visibly hold the
/// first event back, short enough for a quick test.
pub const SSE_GAP: Duration = Duration::from_millis(150);

/// SSE events in one streamed answer (before `[DONE]`).
pub const SSE_EVENTS: usize = 4;

/// How long a hanging fake stays silent: far past any bound a test configures, and still
/// finite so no task outlives its test by much.
pub const HANG: Duration = Duration::from_secs(60);

/// How the fake answers, settable at run time ([`FakeModel::set_behaviour`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Behaviour {
    /// Answers at once (the default).
    #[default]
    Answer,
    /// Reads the request, then sends nothing for [`HANG`]: no head, no body.
    HangBeforeHead,
    /// Sends the head and half of a plain answer's body, then nothing for [`HANG`].
    StallBody,
    /// Streams the first SSE event, then nothing for [`HANG`] (for `stream: true`).
    StallStream,
    /// Answers a streamed request (`stream: true`) with an endless stream of
    /// [`FLOOD_EVENT_BYTES`] SSE events, as fast as they are taken, until the gateway drops
    /// the answer (or [`HANG`] passes): what fills the socket buffers of a client that
    /// stopped reading. Each such answer counts in [`FakeModel::open_answers`] while it is
    /// being sent. Plain requests are answered as usual.
    Flood,
}

/// Bytes of one event of a [`Behaviour::Flood`] answer.
pub const FLOOD_EVENT_BYTES: usize = 16 * 1024;

/// A fake model server on 127.0.0.1 that records what it was sent.
pub struct FakeModel {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its name, echoed in its answers.
    pub name: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    extra: Extra,
    behaviour: Arc<Mutex<Behaviour>>,
    open: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeModel {
    /// Starts a plain-HTTP fake named `name` on 127.0.0.1.
    pub async fn start(name: &str) -> Self {
        Self::start_with(name, None, std::net::Ipv4Addr::LOCALHOST).await
    }

    /// Starts a plain-HTTP fake named `name` on `ip` (a namespace's end of its link:
    /// run it on the namespace's runtime).
    pub async fn start_on(name: &str, ip: std::net::Ipv4Addr) -> Self {
        Self::start_with(name, None, ip).await
    }

    /// Starts an HTTPS fake that requires a client certificate (the remote-site case).
    pub async fn start_tls(name: &str, tls: Arc<rustls::ServerConfig>) -> Self {
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        Self::start_with(name, Some(acceptor), std::net::Ipv4Addr::LOCALHOST).await
    }

    async fn start_with(
        name: &str,
        tls: Option<tokio_rustls::TlsAcceptor>,
        ip: std::net::Ipv4Addr,
    ) -> Self {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let extra: Extra = Arc::default();
        let behaviour = Arc::new(Mutex::new(Behaviour::default()));
        let open = Arc::new(AtomicUsize::new(0));
        let (name2, seen2, extra2) = (name.to_owned(), Arc::clone(&seen), Arc::clone(&extra));
        let (behaviour2, open2) = (Arc::clone(&behaviour), Arc::clone(&open));
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (name, seen, extra) = (name2.clone(), Arc::clone(&seen2), Arc::clone(&extra2));
                let behaviour = Arc::clone(&behaviour2);
                let open = Arc::clone(&open2);
                let tls = tls.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let (seen, extra) = (Arc::clone(&seen), Arc::clone(&extra));
                        let name = name.clone();
                        let behaviour = *behaviour.lock().unwrap();
                        let open = Arc::clone(&open);
                        async move {
                            let mut resp = handle(name, seen, behaviour, open, req).await?;
                            for (k, v) in extra.lock().unwrap().iter() {
                                resp.headers_mut().append(
                                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                                    http::HeaderValue::from_str(v).unwrap(),
                                );
                            }
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let builder = auto::Builder::new(TokioExecutor::new());
                    match tls {
                        None => {
                            let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                        }
                        Some(acceptor) => {
                            // A refused handshake (no or untrusted client certificate) just ends here.
                            if let Ok(tls) = acceptor.accept(stream).await {
                                let _ = builder.serve_connection(TokioIo::new(tls), svc).await;
                            }
                        }
                    }
                });
            }
        });
        Self {
            addr,
            name: name.to_owned(),
            seen,
            extra,
            behaviour,
            open,
            task,
        }
    }

    /// [`Behaviour::Flood`] answers still being sent: those the gateway has not dropped.
    pub fn open_answers(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Every request from now on is answered as `behaviour` says.
    pub fn set_behaviour(&self, behaviour: Behaviour) {
        *self.behaviour.lock().unwrap() = behaviour;
    }

    /// Every answer from now on carries these headers too (appended, so a name given
    /// twice is sent twice).
    pub fn set_response_headers(&self, headers: &[(&str, &str)]) {
        *self.extra.lock().unwrap() = headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
    }

    /// `http://` and its address.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `https://` and its address.
    pub fn https_base_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Every request seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

type Body = BoxBody<Bytes, Infallible>;

/// Headers every answer carries on top of its own (a site router's flow-control advice).
type Extra = Arc<Mutex<Vec<(String, String)>>>;

fn json(status: StatusCode, v: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        // Hop-by-hop and spoofed routing headers the gateway must not pass back as is.
        .header("connection", "x-upstream-hop")
        .header("x-upstream-hop", "1")
        .header("x-grid-site", "spoofed-by-upstream")
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .unwrap()
}

async fn handle(
    name: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    behaviour: Behaviour,
    open: Arc<AtomicUsize>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_owned();
    let headers = req.headers().clone();
    let body = req
        .into_body()
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .unwrap_or_default();
    seen.lock().unwrap().push(Seen {
        path: path.clone(),
        headers,
        body: body.clone(),
    });
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let model = v["model"].as_str().unwrap_or("").to_owned();
    match behaviour {
        Behaviour::HangBeforeHead => tokio::time::sleep(HANG).await,
        Behaviour::StallBody => return Ok(stalled_body()),
        Behaviour::StallStream if v["stream"] == true => return Ok(sse(name, model, 1)),
        Behaviour::Flood if v["stream"] == true => return Ok(flood(open)),
        // A plain request to a stalling stream server is answered as usual.
        Behaviour::Answer | Behaviour::StallStream | Behaviour::Flood => {}
    }
    let resp = match path.as_str() {
        "/v1/chat/completions" if v["stream"] == true => sse(name, model, SSE_EVENTS),
        "/v1/chat/completions" => json(
            StatusCode::OK,
            &serde_json::json!({
                "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": format!("hello from {name}")}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
            }),
        ),
        "/v1/completions" => json(
            StatusCode::OK,
            &serde_json::json!({
                "id": "cmpl-1", "object": "text_completion", "created": 1, "model": model,
                "choices": [{"index": 0, "text": format!("hello from {name}"), "finish_reason": "stop", "logprobs": null}]
            }),
        ),
        "/v1/embeddings" => json(
            StatusCode::OK,
            &serde_json::json!({
                "object": "list", "model": model,
                "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
                "usage": {"prompt_tokens": 1, "total_tokens": 1}
            }),
        ),
        _ => json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({"error": {"message": "no route", "type": "x", "code": null}}),
        ),
    };
    Ok(resp)
}

/// An endless SSE answer ([`Behaviour::Flood`]), counted in `open` until the gateway
/// drops it.
fn flood(open: Arc<AtomicUsize>) -> Response<Body> {
    let (mut tx, body) = http_body_util::channel::Channel::<Bytes, Infallible>::new(1);
    open.fetch_add(1, Ordering::SeqCst);
    tokio::spawn(async move {
        let mut event = b"data: ".to_vec();
        event.resize(FLOOD_EVENT_BYTES - 2, b'x');
        event.extend_from_slice(b"\n\n");
        let event = Bytes::from(event);
        let _ = tokio::time::timeout(HANG, async {
            while tx.send(Frame::data(event.clone())).await.is_ok() {}
        })
        .await;
        open.fetch_sub(1, Ordering::SeqCst);
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(body.boxed())
        .unwrap()
}

/// A plain JSON answer whose head and first half arrive, then nothing for [`HANG`].
fn stalled_body() -> Response<Body> {
    let whole = br#"{"id":"chatcmpl-1","object":"chat.completion","choices":[]}"#;
    let (mut tx, body) = http_body_util::channel::Channel::<Bytes, Infallible>::new(1);
    tokio::spawn(async move {
        let half = Bytes::from_static(&whole[..whole.len() / 2]);
        if tx.send(Frame::data(half)).await.is_ok() {
            tokio::time::sleep(HANG).await;
        }
    });
    Response::builder()
        .header("content-type", "application/json")
        .header("content-length", whole.len())
        .body(body.boxed())
        .unwrap()
}

/// A listener on 127.0.0.1 that accepts connections and never writes a byte: a hung TLS
/// handshake (`kill -STOP` on a site's ingress) or a site that accepted and froze. Each
/// socket is held for at most [`HANG`].
pub struct SilentListener {
    /// Where it listens.
    pub addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SilentListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SilentListener {
    /// Starts listening.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    tokio::time::sleep(HANG).await;
                    drop(stream);
                });
            }
        });
        Self {
            addr,
            accepted,
            task,
        }
    }

    /// `https://` and its address.
    pub fn https_base_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// `http://` and its address.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

/// An SSE answer whose `events` events are produced one by one with [`SSE_GAP`] between
/// them; with fewer than [`SSE_EVENTS`] it then stalls for [`HANG`] instead of ending.
fn sse(name: String, model: String, events: usize) -> Response<Body> {
    let (mut tx, body) = http_body_util::channel::Channel::<Bytes, Infallible>::new(1);
    tokio::spawn(async move {
        for i in 0..events {
            let chunk = serde_json::json!({
                "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": format!("{name}-{i} ")},
                             "finish_reason": if i + 1 == SSE_EVENTS { serde_json::json!("stop") } else { serde_json::Value::Null }}]
            });
            if tx
                .send(Frame::data(Bytes::from(format!("data: {chunk}\n\n"))))
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(SSE_GAP).await;
        }
        if events < SSE_EVENTS {
            tokio::time::sleep(HANG).await;
            return;
        }
        let _ = tx
            .send(Frame::data(Bytes::from_static(b"data: [DONE]\n\n")))
            .await;
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(body.boxed())
        .unwrap()
}
