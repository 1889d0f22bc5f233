//! hyper's real HTTP/1.1 connections as the reference the differential targets hold
//! grid-h1-wire to: its server connection reads a client's requests, its client
//! connection a site's answer, both from bytes in memory, on one current-thread runtime
//! made once per process. hyper's chunked decoder is private; driving its connections is
//! the only way to ask it.
//!
//! Also where a target notes the classes of input grid refuses and hyper accepts (grid
//! is allowed to be stricter): each class is printed once per process, so a long run's
//! log lists them.

// Each target uses its half: the requests' server or the answers' client.
#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::convert::Infallible;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::LazyLock;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, Version, header};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Incoming;
use hyper::service::service_fn;

/// The one runtime: no I/O or timer driver, nothing here waits on either.
static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime")
});

/// A connection whose peer sent `bytes` and then closed its side; what is written to it
/// is dropped. A site's bytes come only once the request was written: a client that
/// reads before it asked takes them for an unasked-for answer.
struct Wire {
    bytes: Vec<u8>,
    at: usize,
    /// Whether the peer has been written to (a client's peer answers only then).
    asked: bool,
    /// The read waiting for the peer to be asked.
    waiting: Option<Waker>,
}

impl Wire {
    fn new(bytes: &[u8], asked: bool) -> Self {
        Self {
            bytes: bytes.to_vec(),
            at: 0,
            asked,
            waiting: None,
        }
    }
}

impl hyper::rt::Read for Wire {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.asked {
            self.waiting = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = buf.remaining().min(self.bytes.len() - self.at);
        let at = self.at;
        buf.put_slice(&self.bytes[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

impl hyper::rt::Write for Wire {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.asked = true;
        if let Some(waiting) = self.waiting.take() {
            waiting.wake();
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// One request a server read whole: what both readers must agree on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request1 {
    pub method: String,
    pub target: String,
    pub version: Version,
    pub body: Vec<u8>,
}

/// The requests hyper's server connection reads whole from `wire`, in order, until it
/// stops (a malformed request, a request that closes the connection, the end of the
/// bytes). Each is answered 404 with no body once its body was read: not a success, so a
/// `CONNECT` does not turn the connection into a tunnel.
pub fn hyper_requests(wire: &[u8]) -> Vec<Request1> {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let service = {
        let seen = Rc::clone(&seen);
        service_fn(move |req: Request<Incoming>| {
            let seen = Rc::clone(&seen);
            async move {
                let (parts, body) = req.into_parts();
                if let Ok(body) = body.collect().await {
                    seen.borrow_mut().push(Request1 {
                        method: parts.method.to_string(),
                        target: parts.uri.to_string(),
                        version: parts.version,
                        body: body.to_bytes().to_vec(),
                    });
                }
                let mut answer = Response::new(Empty::<Bytes>::new());
                *answer.status_mut() = StatusCode::NOT_FOUND;
                Ok::<_, Infallible>(answer)
            }
        })
    };
    let io = Wire::new(wire, true);
    RUNTIME.block_on(async {
        let mut builder = hyper::server::conn::http1::Builder::new();
        // Half-close: the bytes' end is the client's end of sending, not a hang-up (hyper
        // otherwise drops what is pipelined behind an answer once it reads the end).
        builder.header_read_timeout(None).half_close(true);
        let _ = builder.serve_connection(io, service).await;
    });
    seen.take()
}

/// A site's answer as a client read it whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer1 {
    pub status: StatusCode,
    /// The header fields, without `Transfer-Encoding` (grid decodes it and drops it).
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// The answer hyper's client connection reads from `wire` to a `method` request, or its
/// error (as text).
pub fn hyper_answer(wire: &[u8], method: &Method) -> Result<Answer1, String> {
    let io = Wire::new(wire, false);
    let mut request = Request::new(Empty::<Bytes>::new());
    *request.method_mut() = method.clone();
    *request.uri_mut() = http::Uri::from_static("/");
    RUNTIME.block_on(async {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| e.to_string())?;
        let exchange = async {
            let answer = send.send_request(request).await.map_err(|e| e.to_string())?;
            let (parts, body) = answer.into_parts();
            let body = body.collect().await.map_err(|e| e.to_string())?;
            let mut headers = parts.headers;
            headers.remove(header::TRANSFER_ENCODING);
            Ok(Answer1 {
                status: parts.status,
                headers,
                body: body.to_bytes().to_vec(),
            })
        };
        let (answered, _) = tokio::join!(exchange, conn);
        answered
    })
}

thread_local! {
    static NOTED: RefCell<BTreeSet<String>> = const { RefCell::new(BTreeSet::new()) };
}

/// Notes that grid refused, for `class`, what hyper accepted: printed the first time.
pub fn stricter(target: &str, class: String) {
    NOTED.with(|noted| {
        if noted.borrow_mut().insert(class.clone()) {
            eprintln!("{target}: grid stricter than hyper: {class}");
        }
    });
}
