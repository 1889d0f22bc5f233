//! Pooled HTTP/1.1 connections to a site in the clear (an `http://` base URL: the local
//! site), driven from the request's own task with the gateway's own codec
//! ([`grid_h1_wire`]).
//!
//! hyper-util's pooled client spawns a task per connection and hands each answer's head
//! and every body frame across to the request's task through channels, behind a pool
//! keyed by a hash of `(scheme, authority)`; hyper's own client connection, driven from
//! the request's task, still hands the request to its dispatcher and the head back
//! through channels, and each chunk of the body through a one-frame channel. On a
//! streamed answer those hand-overs are most of a proxy's work (callgrind,
//! `docs/benchmarks.md`). Here a connection is a socket and its read buffer: the request's
//! head and body leave in one vectored write, the answer's head is parsed in place, and
//! the answer's body ([`PooledBody`]) decodes its frames out of the read buffer, reading
//! the socket when the buffer has nothing more, in the client connection's task. The
//! pool is the site's own (one per configured site, found with its slots), so taking a
//! connection is a lock and a pop.
//!
//! What the hyper-util client does that this keeps:
//! - **Reuse**: a connection goes back when its answer's body ended (or was known to be
//!   empty), the site did not ask to close it, its framing was unambiguous, and nothing
//!   followed the answer; the most recent is reused first.
//! - **Stale connections**: one taken from the pool is checked without waiting (a read
//!   that would block), so a site that closed it while idle is noticed and the connection
//!   dropped; a request that a closing pooled connection refused before any of it was
//!   written is sent again on a new connection ([`MAX_STALE_RETRIES`]).
//! - **Bounds**: connections are opened by the site client's own TCP connector under its
//!   connect bound ([`grid_gateway::upstream::plain_connector`]: `TCP_NODELAY`,
//!   `TCP_USER_TIMEOUT`), at most
//!   [`MAX_IDLE_PER_SITE`] idle connections are kept per site, and one idle longer than
//!   [`POOL_IDLE_TIMEOUT`] is closed when next seen (as the hyper-util client, without a pool
//!   timer, does). The answer's head is bounded in size by the codec and in time
//!   by the caller (`upstreamHeadersTimeoutSeconds`), each silence in its body by
//!   `IdleBody`.
//! - **Host**: the site's authority, as the hyper-util client sets it (the client's own
//!   `Host` is removed on the way in).
//!
//! The request is written whole before the answer is read: a site that answers early and
//! stops reading a body larger than the socket's buffers is seen as one that sent no
//! answer head in time (bodies are at most `bodyLimitBytes`).
//!
//! `https://` sites keep the hyper-util client: TLS, and HTTP/2 where the site offers it.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Buf as _, Bytes, BytesMut};
use http::{HeaderMap, Method, Response, Version};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tower_service::Service;

use crate::engine::BoxError;
use crate::engine::buffer_room::{Pace, make_read_room, release_room};
use crate::engine::timers::deadline_timer::DeadlineTimer;
use grid_gateway::upstream::PlainConnect;
pub(crate) use grid_gateway::upstream::{MAX_IDLE_PER_SITE, POOL_IDLE_TIMEOUT};
use grid_h1_wire::{
    self as h1_wire, AnswerHead, BodyDecoder, Decoded, MAX_INTERIM_ANSWERS, Parsed, WireError,
};

/// A request that a pooled connection refused before writing any of it (the site closed
/// it between the check at checkout and the write) is sent again this many times, on a
/// new connection: once, as the hyper-util client did.
pub(crate) const MAX_STALE_RETRIES: usize = 1;

/// One connection: its socket, what was read from it and not yet taken, the authority
/// it was opened to, and the timer that bounds its answers' heads.
struct Conn {
    io: TcpStream,
    read: BytesMut,
    /// How the site's reads have been coming: a streamed answer trickles.
    pace: Pace,
    authority: Arc<str>,
    head_timer: DeadlineTimer,
}

impl Conn {
    /// Whether an idle connection can carry a request: open, and with nothing unasked
    /// for from the site. Never waits: a read that would block is what an open, quiet
    /// connection answers.
    fn is_quiet(&mut self) -> bool {
        if !self.read.is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        matches!(self.io.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// Reads what the socket has into the read buffer: `Ready(Ok(0))` at its end.
    ///
    /// Through tokio's `poll_read`, which takes a read that did not fill the buffer as
    /// the socket drained: the next read waits for the reactor instead of asking the
    /// kernel, and the check at checkout ([`Conn::is_quiet`]) costs no system call on a
    /// quiet connection.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        make_read_room(&mut self.read, self.pace);
        let read = self.io.read_buf(&mut self.read);
        let polled = std::pin::pin!(read).poll(cx);
        if let Poll::Ready(Ok(n)) = polled {
            self.pace = Pace::of(n);
        }
        polled
    }

    /// Gives back an emptied buffer's room while the site trickles (the answer's frames
    /// still sharing it keep it until they are sent).
    fn release_room(&mut self) {
        if self.pace == Pace::Trickle {
            release_room(&mut self.read);
        }
    }
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// What went wrong on a connection to a site in the clear.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WireFailure {
    /// The socket failed (its `io::Error` is the source: a `TCP_USER_TIMEOUT` abort is
    /// found there).
    #[error("the connection failed: {0}")]
    Io(#[source] std::io::Error),
    /// The site's bytes are not a readable answer.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The site closed the connection before its answer's head.
    #[error("the site closed the connection before answering")]
    ClosedBeforeHead,
    /// No answer head by the request's deadline (`upstreamHeadersTimeoutSeconds`).
    #[error("the site sent no answer head in time")]
    HeadTimedOut,
}

/// Why a request to a site in the clear failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SiteError {
    /// No connection: nothing was sent.
    #[error("connecting to {authority}: {source}")]
    Connect {
        /// The site's `host[:port]`.
        authority: Arc<str>,
        /// What failed: the resolution, the TCP connect, or its bound.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The exchange failed after the request may have been sent.
    #[error("exchange with {authority}: {source}")]
    Exchange {
        /// The site's `host[:port]`.
        authority: Arc<str>,
        /// What failed.
        #[source]
        source: WireFailure,
    },
}

impl SiteError {
    /// Whether nothing was sent (the request may go elsewhere).
    pub(crate) fn is_connect(&self) -> bool {
        matches!(self, Self::Connect { .. })
    }

    /// Whether the site sent no answer head by the request's deadline.
    pub(crate) fn is_head_timeout(&self) -> bool {
        matches!(
            self,
            Self::Exchange {
                source: WireFailure::HeadTimedOut,
                ..
            }
        )
    }
}

/// A request as the pool sends it: borrowed from the client's, whose headers were
/// already cleaned of hop-by-hop ones and `Host`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Outgoing<'a> {
    /// The method.
    pub(crate) method: &'a Method,
    /// The origin-form target (path and query).
    pub(crate) target: &'a str,
    /// The header fields to forward.
    pub(crate) headers: &'a HeaderMap,
    /// The whole body.
    pub(crate) body: &'a Bytes,
}

/// One site's idle connections.
#[derive(Default)]
pub(crate) struct SitePool {
    idle: Mutex<Vec<Idle>>,
}

impl std::fmt::Debug for SitePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SitePool")
            .field("idle", &self.idle_count())
            .finish()
    }
}

impl SitePool {
    /// Idle connections held now.
    pub(crate) fn idle_count(&self) -> usize {
        self.idle.lock().map_or(0, |idle| idle.len())
    }

    /// Sends `out` to `authority` on an idle connection or a new one opened by
    /// `connector`, and reads the answer's head by `deadline` (the connect has its own,
    /// shorter bound); the answer's body reads the connection and returns it here when
    /// it ends.
    pub(crate) async fn send(
        self: &Arc<Self>,
        connector: &PlainConnect,
        authority: &str,
        out: Outgoing<'_>,
        deadline: tokio::time::Instant,
    ) -> Result<Response<PooledBody>, SiteError> {
        let mut head = BytesMut::new();
        h1_wire::encode_request(
            out.method,
            out.target,
            authority,
            out.headers,
            out.body.len(),
            &mut head,
        );
        let mut attempts = 0;
        loop {
            attempts += 1;
            let pooled = if attempts == 1 {
                self.take(authority)
            } else {
                None
            };
            let reused = pooled.is_some();
            let conn = match pooled {
                Some(conn) => conn,
                None => connect(connector, authority).await?,
            };
            match exchange(conn, &head, out.body, out.method, deadline).await {
                Ok((answer, conn)) => {
                    return self.answer(answer, conn).map_err(|e| SiteError::Exchange {
                        authority: Arc::from(authority),
                        source: e.into(),
                    });
                }
                Err(Failed::Unwritten(_)) if sent_again(reused, attempts) => {}
                Err(Failed::Unwritten(e) | Failed::After(e)) => {
                    return Err(SiteError::Exchange {
                        authority: Arc::from(authority),
                        source: e,
                    });
                }
            }
        }
    }

    /// The answer to hand on: its head, and a body that reads `conn`.
    ///
    /// # Errors
    ///
    /// A chunked body malformed in the bytes that came with the head: the exchange
    /// fails (a 502, since nothing of the answer was sent yet) rather than the answer
    /// being begun and then cut.
    fn answer(
        self: &Arc<Self>,
        head: AnswerHead,
        conn: Conn,
    ) -> Result<Response<PooledBody>, WireError> {
        let mut body = PooledBody {
            decoder: BodyDecoder::new(head.framing),
            first: None,
            reusable: head.reusable,
            conn: Some(conn),
            home: Some(Arc::clone(self)),
        };
        if head.framing == h1_wire::Framing::Chunked {
            body.decode_first()?;
        }
        let mut resp = Response::new(body);
        *resp.status_mut() = head.status;
        *resp.version_mut() = Version::HTTP_11;
        *resp.headers_mut() = head.headers;
        Ok(resp)
    }

    /// The most recent idle connection to `authority` that is still open and quiet.
    /// Those past [`POOL_IDLE_TIMEOUT`], to another authority (the site's base URL was
    /// reloaded), closed by the site, or holding bytes nobody asked for are dropped on
    /// the way.
    fn take(&self, authority: &str) -> Option<Conn> {
        loop {
            let idle = {
                let Ok(mut idle) = self.idle.lock() else {
                    return None;
                };
                idle.pop()?
            };
            if expired(idle.since, grid_gateway::clock::monotonic())
                || *idle.conn.authority != *authority
            {
                continue;
            }
            let mut conn = idle.conn;
            if conn.is_quiet() {
                return Some(conn);
            }
        }
    }

    fn give_back(&self, conn: Conn) {
        let Ok(mut idle) = self.idle.lock() else {
            return;
        };
        if idle.len() < MAX_IDLE_PER_SITE {
            idle.push(Idle {
                conn,
                since: grid_gateway::clock::monotonic(),
            });
        }
    }
}

/// Whether a request refused before any of it was written, on attempt `attempts` (from
/// 1), is sent again: only from a pooled connection (a new one that refuses is not stale
/// but failing), at most [`MAX_STALE_RETRIES`] times.
fn sent_again(reused: bool, attempts: usize) -> bool {
    reused && attempts <= MAX_STALE_RETRIES
}

/// Whether a connection idle since `since` is too old to reuse at `now`.
fn expired(since: Instant, now: Instant) -> bool {
    now.saturating_duration_since(since) > POOL_IDLE_TIMEOUT
}

/// A new connection to `authority` (`host[:port]`, port 80 by default).
async fn connect(connector: &PlainConnect, authority: &str) -> Result<Conn, SiteError> {
    let failed = |source: Box<dyn std::error::Error + Send + Sync>| SiteError::Connect {
        authority: Arc::from(authority),
        source,
    };
    let uri: http::Uri = format!("http://{authority}")
        .parse()
        .map_err(|e| failed(Box::new(e)))?;
    let io = connector.clone().call(uri).await.map_err(failed)?;
    Ok(Conn {
        io: io.into_inner(),
        read: BytesMut::new(),
        pace: Pace::default(),
        authority: Arc::from(authority),
        head_timer: DeadlineTimer::default(),
    })
}

/// How an exchange failed: before any byte of the request was written (it may be sent
/// again), or after.
#[derive(Debug)]
enum Failed {
    Unwritten(WireFailure),
    After(WireFailure),
}

/// Writes the request (`head`, then `body`) on `conn` and reads until the answer's final
/// head (interim 1xx answers skipped, at most [`MAX_INTERIM_ANSWERS`]), by `deadline`
/// on the connection's own timer.
async fn exchange(
    mut conn: Conn,
    head: &[u8],
    body: &[u8],
    method: &Method,
    deadline: tokio::time::Instant,
) -> Result<(AnswerHead, Conn), Failed> {
    let mut timer = std::mem::take(&mut conn.head_timer);
    let outcome = timer
        .within(deadline, exchange_unbounded(&mut conn, head, body, method))
        .await;
    conn.head_timer = timer;
    match outcome {
        Ok(Ok(answer)) => Ok((answer, conn)),
        Ok(Err(failed)) => Err(failed),
        // Whatever of the request left, the connection is dropped with it.
        Err(_passed) => Err(Failed::After(WireFailure::HeadTimedOut)),
    }
}

/// [`exchange`] without its deadline.
async fn exchange_unbounded(
    conn: &mut Conn,
    head: &[u8],
    body: &[u8],
    method: &Method,
) -> Result<AnswerHead, Failed> {
    // One vectored write where the socket takes it all (tokio's `write_all_buf`); what
    // is left unwritten says whether any of the request left.
    let mut request = bytes::Buf::chain(head, body);
    let total = request.remaining();
    if let Err(e) = conn.io.write_all_buf(&mut request).await {
        let e = WireFailure::Io(e);
        return Err(if request.remaining() == total {
            Failed::Unwritten(e)
        } else {
            Failed::After(e)
        });
    }
    let mut interim = 0;
    loop {
        match h1_wire::parse_head(&mut conn.read, method).map_err(|e| Failed::After(e.into()))? {
            Parsed::Head(_, answer) => return Ok(answer),
            Parsed::Interim(_) => {
                interim += 1;
                if interim > MAX_INTERIM_ANSWERS {
                    return Err(Failed::After(WireError::TooManyInterim.into()));
                }
                continue;
            }
            Parsed::Partial => {}
        }
        match std::future::poll_fn(|cx| conn.poll_fill(cx)).await {
            Ok(0) => return Err(Failed::After(WireFailure::ClosedBeforeHead)),
            Ok(_) => {}
            Err(e) => return Err(Failed::After(WireFailure::Io(e))),
        }
    }
}

/// An answer's body from a pooled connection, which it reads as it is asked for frames
/// and hands back to its site's pool when it ends.
pub(crate) struct PooledBody {
    decoder: BodyDecoder,
    /// Data decoded with the head (a chunked body's first frame), handed on first.
    first: Option<Bytes>,
    /// The answer allows the connection to carry another request.
    reusable: bool,
    conn: Option<Conn>,
    home: Option<Arc<SitePool>>,
}

impl PooledBody {
    /// Decodes the chunks that came in the same reads as the head, and whatever follows
    /// them there (the next chunk line, the trailers), keeping the data for the first
    /// frame: an error in those bytes is found before any of the answer is sent on.
    fn decode_first(&mut self) -> Result<(), WireError> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        if conn.read.is_empty() {
            return Ok(());
        }
        if let Decoded::Data(data) = self.decoder.decode(&mut conn.read)? {
            self.first = Some(data);
            // The decoder stops after the data it gathered: at bytes still to come, at
            // the end, or at an error, which is the exchange's too.
            self.decoder.decode(&mut conn.read)?;
        }
        Ok(())
    }

    fn finish(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        // Bytes after the answer's end were not asked for: the connection is not trusted.
        if self.reusable
            && conn.read.is_empty()
            && let Some(home) = self.home.take()
        {
            home.give_back(conn);
        }
    }

    fn fail(&mut self, e: WireFailure) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.conn = None;
        Poll::Ready(Some(Err(Box::new(e))))
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(data) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        loop {
            let Some(conn) = this.conn.as_mut() else {
                // Ended, failed, or cut: nothing more.
                return Poll::Ready(None);
            };
            match this.decoder.decode(&mut conn.read) {
                Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(Decoded::End) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Decoded::More) => conn.release_room(),
                Err(e) => return this.fail(e.into()),
            }
            match conn.poll_fill(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    this.conn = None;
                    return match this.decoder.eof() {
                        Ok(()) => Poll::Ready(None),
                        Err(e) => this.fail(e.into()),
                    };
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return this.fail(WireFailure::Io(e)),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && (self.decoder.is_done() || self.conn.is_none())
    }

    fn size_hint(&self) -> SizeHint {
        // A chunked body with its first frame decoded stays of unknown size: it is
        // framed toward the client as it came, chunk by chunk.
        if self.first.is_some() {
            return SizeHint::default();
        }
        self.decoder
            .remaining()
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

impl Drop for PooledBody {
    /// An answer known to be over (an empty body never asked for) keeps its connection;
    /// one cut short closes it, as the site would still be sending.
    fn drop(&mut self) {
        if self.decoder.is_done() {
            self.finish();
        }
    }
}

/// A site's answer body, from a pooled connection in the clear or from the hyper-util
/// client (`https://` sites).
pub(crate) enum SiteBody {
    /// Read from the client connection's task.
    Pooled(PooledBody),
    /// Read from the hyper-util client's connection task.
    Client(Incoming),
}

impl Body for SiteBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Self::Pooled(b) => Pin::new(b).poll_frame(cx),
            Self::Client(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Pooled(b) => b.is_end_stream(),
            Self::Client(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Pooled(b) => b.size_hint(),
            Self::Client(b) => b.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use std::time::Duration;

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::engine::buffer_room::STREAM_KEEP;

    const WAIT: Duration = Duration::from_secs(5);

    /// How a test site answers each request on a connection.
    #[derive(Clone, Copy)]
    enum Site {
        /// `ok`, and the connection kept open.
        KeepAlive,
        /// `ok`, then the connection closed a little later (the answer did not say so).
        CloseAfterOne,
        /// A head promising 100 bytes, 10 of them, then silence.
        Truncated,
        /// `hello world` in two chunks, a trailer, and the connection kept open.
        Chunked,
        /// `ok` with `Connection: close`, the connection kept open by the site.
        SaysClose,
        /// `ok`, then bytes nobody asked for.
        Extra,
        /// `100 Continue`, then `ok`.
        Interim,
        /// The connection closed without an answer.
        Hangup,
        /// Two chunks of a chunked body, then the connection closed.
        ChunkedCut,
        /// `ok` to the first request, then nothing to any later one, the connection kept
        /// open.
        AnswersOnce,
    }

    impl Site {
        fn answer(self) -> &'static [u8] {
            match self {
                Self::KeepAlive | Self::CloseAfterOne | Self::AnswersOnce => {
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                }
                Self::Truncated => b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789",
                Self::Chunked => {
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\nx-t: 1\r\n\r\n"
                }
                Self::SaysClose => b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
                Self::Extra => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokJUNK",
                Self::Interim => {
                    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                }
                Self::Hangup => b"",
                Self::ChunkedCut => {
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n"
                }
            }
        }

        /// Whether the site closes the connection right after answering.
        fn closes(self) -> bool {
            matches!(self, Self::Hangup | Self::ChunkedCut)
        }
    }

    /// A site on loopback: its authority and how many connections it accepted.
    async fn site(kind: Site) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut seen = Vec::new();
                    let mut answered = 0;
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            seen.drain(..end + 4);
                            let answer = match kind {
                                Site::AnswersOnce if answered > 0 => &b""[..],
                                _ => kind.answer(),
                            };
                            answered += 1;
                            if s.write_all(answer).await.is_err() || kind.closes() {
                                return;
                            }
                            match kind {
                                Site::CloseAfterOne => {
                                    // After the answer was read and pooled.
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                    return;
                                }
                                Site::Truncated => {
                                    tokio::time::sleep(WAIT).await;
                                    return;
                                }
                                _ => {}
                            }
                        }
                    }
                });
            }
        });
        (authority, accepted)
    }

    fn connector() -> PlainConnect {
        grid_gateway::upstream::plain_connector(WAIT)
    }

    /// A `GET /v1/models` to `authority` through `pool`, its connections opened by
    /// `connector`, its answer's head due within `bound`.
    async fn send_within(
        pool: &Arc<SitePool>,
        connector: &PlainConnect,
        authority: &str,
        bound: Duration,
    ) -> Result<Response<PooledBody>, SiteError> {
        let (headers, body) = (HeaderMap::new(), Bytes::new());
        let get = Outgoing {
            method: &Method::GET,
            target: "/v1/models",
            headers: &headers,
            body: &body,
        };
        let deadline = tokio::time::Instant::now() + bound;
        tokio::time::timeout(WAIT * 2, pool.send(connector, authority, get, deadline))
            .await
            .unwrap()
    }

    async fn send_via(
        pool: &Arc<SitePool>,
        connector: &PlainConnect,
        authority: &str,
    ) -> Result<Response<PooledBody>, SiteError> {
        send_within(pool, connector, authority, WAIT).await
    }

    async fn send(
        pool: &Arc<SitePool>,
        authority: &str,
    ) -> Result<Response<PooledBody>, SiteError> {
        send_via(pool, &connector(), authority).await
    }

    async fn fetch(pool: &Arc<SitePool>, authority: &str) -> Bytes {
        let resp = send(pool, authority).await.unwrap();
        tokio::time::timeout(WAIT, resp.into_body().collect())
            .await
            .unwrap()
            .unwrap()
            .to_bytes()
    }

    #[tokio::test]
    async fn sequential_requests_to_a_site_reuse_its_one_connection() {
        let (authority, accepted) = site(Site::KeepAlive).await;
        let pool = Arc::new(SitePool::default());
        for _ in 0..3 {
            assert_eq!(fetch(&pool, &authority).await, "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle_count(), 1);
    }

    #[tokio::test]
    async fn a_chunked_answer_is_read_whole_and_its_connection_reused() {
        let (authority, accepted) = site(Site::Chunked).await;
        let pool = Arc::new(SitePool::default());
        for _ in 0..2 {
            assert_eq!(fetch(&pool, &authority).await, "hello world");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    /// A site streaming one chunked answer: `events` chunks of `sizes`, one at each
    /// `tick` from the client, then the last chunk.
    async fn streaming_site(sizes: &'static [usize]) -> (String, tokio::sync::mpsc::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string();
        let (tick, mut ticks) = tokio::sync::mpsc::channel::<()>(1);
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = s.read(&mut buf).await;
            let head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
            s.write_all(head).await.unwrap();
            for &size in sizes {
                if ticks.recv().await.is_none() {
                    return;
                }
                let chunk = format!("{size:x}\r\n{}\r\n", "e".repeat(size));
                s.write_all(chunk.as_bytes()).await.unwrap();
            }
            let _ = ticks.recv().await;
            let _ = s.write_all(b"0\r\n\r\n").await;
        });
        (authority, tick)
    }

    /// The read buffer's room on `body`'s connection.
    fn read_room(body: &PooledBody) -> usize {
        body.conn.as_ref().map_or(0, |c| c.read.capacity())
    }

    /// The next data frame of `body`, after `tick` lets the site send it.
    async fn next_event(body: &mut PooledBody, tick: &tokio::sync::mpsc::Sender<()>) -> usize {
        tick.send(()).await.unwrap();
        let frame = tokio::time::timeout(WAIT, body.frame()).await.unwrap();
        frame.unwrap().unwrap().into_data().unwrap().len()
    }

    #[tokio::test]
    async fn a_trickling_answer_keeps_at_most_stream_keep_of_room_and_a_full_read_grows_it_again() {
        // Small events, then one whose reads fill the kept room, then small again.
        const SIZES: &[usize] = &[100, STREAM_KEEP - 100, 100, 4 * STREAM_KEEP, 100, 100];
        let (authority, tick) = streaming_site(SIZES).await;
        let pool = Arc::new(SitePool::default());
        let resp = send(&pool, &authority).await.unwrap();
        let mut body = resp.into_body();
        let mut rooms = Vec::new();
        for &size in SIZES {
            let mut got = next_event(&mut body, &tick).await;
            while got < size {
                let frame = tokio::time::timeout(WAIT, body.frame()).await.unwrap();
                got += frame.unwrap().unwrap().into_data().unwrap().len();
            }
            rooms.push(read_room(&body));
        }
        // Past the head's read, every trickled event leaves at most the kept room.
        assert!(
            rooms[1] <= STREAM_KEEP && rooms[2] <= STREAM_KEEP,
            "{rooms:?}"
        );
        // A large event is read into the larger reserve, then the room shrinks again.
        assert!(rooms[3] > STREAM_KEEP, "{rooms:?}");
        assert!(rooms[5] <= STREAM_KEEP, "{rooms:?}");
    }

    #[tokio::test]
    async fn an_interim_answer_is_skipped_for_the_final_one() {
        let (authority, _) = site(Site::Interim).await;
        let pool = Arc::new(SitePool::default());
        let resp = send(&pool, &authority).await.unwrap();
        assert_eq!(resp.status(), http::StatusCode::OK);
        assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "ok");
        assert_eq!(pool.idle_count(), 1);
    }

    #[tokio::test]
    async fn a_connection_the_site_said_it_closes_or_that_carried_more_is_not_pooled() {
        for kind in [Site::SaysClose, Site::Extra] {
            let (authority, _) = site(kind).await;
            let pool = Arc::new(SitePool::default());
            assert_eq!(fetch(&pool, &authority).await, "ok");
            assert_eq!(pool.idle_count(), 0);
        }
    }

    #[tokio::test]
    async fn a_site_that_hangs_up_before_answering_fails_the_exchange_not_the_connect() {
        let (authority, _) = site(Site::Hangup).await;
        let pool = Arc::new(SitePool::default());
        let Err(e) = send(&pool, &authority).await else {
            panic!("answered without an answer");
        };
        assert!(!e.is_connect(), "{e}");
        assert!(
            matches!(
                &e,
                SiteError::Exchange {
                    source: WireFailure::ClosedBeforeHead,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_chunked_body_cut_by_the_site_ends_in_an_error_after_its_chunks() {
        let (authority, _) = site(Site::ChunkedCut).await;
        let pool = Arc::new(SitePool::default());
        let mut body = send(&pool, &authority).await.unwrap().into_body();
        let mut got = Vec::new();
        let err = loop {
            match tokio::time::timeout(WAIT, body.frame()).await.unwrap() {
                Some(Ok(f)) => got.extend_from_slice(&f.into_data().unwrap()),
                Some(Err(e)) => break e,
                None => panic!("a cut body ended cleanly"),
            }
        };
        assert_eq!(got, b"hello world");
        assert!(err.to_string().contains("before the body's end"), "{err}");
        assert!(body.frame().await.is_none(), "nothing after the error");
        assert_eq!(pool.idle_count(), 0);
    }

    #[tokio::test]
    async fn a_connection_the_site_closed_while_idle_is_dropped_and_the_request_goes_on_a_new_one()
    {
        let (authority, accepted) = site(Site::CloseAfterOne).await;
        let pool = Arc::new(SitePool::default());
        assert_eq!(fetch(&pool, &authority).await, "ok");
        assert_eq!(
            pool.idle_count(),
            1,
            "the answer did not say it would close"
        );
        // Let the site's close reach this end.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(fetch(&pool, &authority).await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_answer_cut_short_closes_its_connection_instead_of_pooling_it() {
        let (authority, _) = site(Site::Truncated).await;
        let pool = Arc::new(SitePool::default());
        let resp = send(&pool, &authority).await.unwrap();
        let mut body = resp.into_body();
        let first = tokio::time::timeout(WAIT, body.frame())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(first.into_data().unwrap(), "0123456789");
        drop(body);
        assert_eq!(pool.idle_count(), 0);
    }

    #[tokio::test]
    async fn at_most_max_idle_per_site_connections_are_kept_idle() {
        let (authority, accepted) = site(Site::KeepAlive).await;
        let pool = Arc::new(SitePool::default());
        // Every answer's head is taken before any body is read, so each needs its own
        // connection.
        let mut answers = Vec::new();
        for _ in 0..=MAX_IDLE_PER_SITE {
            answers.push(send(&pool, &authority).await.unwrap());
        }
        assert_eq!(accepted.load(Ordering::SeqCst), MAX_IDLE_PER_SITE + 1);
        for a in answers {
            a.into_body().collect().await.unwrap();
        }
        assert_eq!(pool.idle_count(), MAX_IDLE_PER_SITE);
    }

    #[tokio::test]
    async fn a_connection_to_the_sites_former_authority_is_not_reused_after_a_reload() {
        let (before, _) = site(Site::KeepAlive).await;
        let (after, accepted) = site(Site::KeepAlive).await;
        let pool = Arc::new(SitePool::default());
        assert_eq!(fetch(&pool, &before).await, "ok");
        assert_eq!(fetch(&pool, &after).await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(
            pool.idle_count(),
            1,
            "the former authority's connection was dropped"
        );
    }

    /// A listener that never accepts, with the smallest backlog, its queue filled: the
    /// kernel ignores further handshakes, so a connect to it waits. The connections that
    /// filled it are held with it.
    async fn stalled_listener(bound: Duration) -> (String, (socket2::Socket, Vec<TcpStream>)) {
        let socket = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
        .unwrap();
        socket
            .bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        socket.listen(0).unwrap();
        let authority = socket
            .local_addr()
            .unwrap()
            .as_socket()
            .unwrap()
            .to_string();
        let mut held = Vec::new();
        for _ in 0..8 {
            match tokio::time::timeout(bound, TcpStream::connect(&authority)).await {
                Ok(Ok(s)) => held.push(s),
                _ => break,
            }
        }
        (authority, (socket, held))
    }

    #[tokio::test]
    async fn every_stalled_tcp_connect_toward_a_tls_site_counts_as_a_connect_timeout() {
        let bound = Duration::from_millis(200);
        let (authority, _held) = stalled_listener(bound).await;
        let tls = rustls::ClientConfig::builder_with_provider(grid_daemon::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let client = grid_gateway::upstream::site_client(tls, bound);
        let uri: http::Uri = format!("https://{authority}/v1/chat/completions")
            .parse()
            .unwrap();
        let attempts = (0..8).map(|_| {
            let mut req = http::Request::new(http_body_util::Full::new(Bytes::new()));
            *req.uri_mut() = uri.clone();
            client.request(req)
        });
        for failed in futures::future::join_all(attempts).await {
            let e = failed.expect_err("connected past a full backlog");
            assert!(e.is_connect(), "{e}");
            assert!(
                grid_gateway::upstream::is_connect_timeout(&e),
                "not counted as a connect timeout: {e:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_connect_that_outlasts_its_bound_fails_as_a_connect_timeout() {
        let bound = Duration::from_millis(200);
        let (authority, _held) = stalled_listener(bound).await;
        let pool = Arc::new(SitePool::default());
        let slow = grid_gateway::upstream::plain_connector(bound);
        let Err(e) = send_via(&pool, &slow, &authority).await else {
            panic!("connected past a full backlog");
        };
        assert!(e.is_connect(), "{e}");
        assert!(grid_gateway::upstream::is_connect_timeout(&e), "{e}");
    }

    #[tokio::test]
    async fn a_reused_connection_whose_site_sends_no_head_fails_at_the_deadline_and_is_dropped() {
        let (authority, accepted) = site(Site::AnswersOnce).await;
        let pool = Arc::new(SitePool::default());
        assert_eq!(fetch(&pool, &authority).await, "ok");
        assert_eq!(pool.idle_count(), 1);
        let bound = Duration::from_millis(200);
        let started = tokio::time::Instant::now();
        let Err(e) = send_within(&pool, &connector(), &authority, bound).await else {
            panic!("the site never answers a second request");
        };
        assert!(started.elapsed() >= bound, "not before the deadline");
        assert!(e.is_head_timeout(), "{e}");
        assert!(!e.is_connect(), "{e}");
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "on the pooled connection"
        );
        assert_eq!(
            pool.idle_count(),
            0,
            "a connection that timed out is not kept"
        );
    }

    #[tokio::test]
    async fn a_request_on_a_connection_that_is_gone_is_handed_back_unwritten() {
        let (authority, _) = site(Site::KeepAlive).await;
        let mut conn = connect(&connector(), &authority).await.unwrap();
        conn.io.shutdown().await.unwrap();
        let got = exchange(
            conn,
            b"GET / HTTP/1.1\r\nhost: s\r\n\r\n",
            b"",
            &Method::GET,
            tokio::time::Instant::now() + WAIT,
        )
        .await;
        assert!(
            matches!(got, Err(Failed::Unwritten(WireFailure::Io(_)))),
            "{:?}",
            got.err()
        );
    }

    #[tokio::test]
    async fn a_pooled_connection_whose_writing_half_is_gone_is_replaced_once() {
        let (authority, accepted) = site(Site::KeepAlive).await;
        let pool = Arc::new(SitePool::default());
        assert_eq!(fetch(&pool, &authority).await, "ok");
        // The pooled connection's writing half is gone, though it reads as quiet.
        {
            let mut idle = pool.idle.lock().unwrap();
            let conn = &mut idle[0].conn;
            socket2::SockRef::from(&conn.io)
                .shutdown(std::net::Shutdown::Write)
                .unwrap();
        }
        assert_eq!(fetch(&pool, &authority).await, "ok");
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "sent again on a new one"
        );
    }

    /// A site that answers its first request with `interim` 100s before a 200.
    async fn site_with_interim(interim: usize) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = s.read(&mut buf).await;
            let mut answer = b"HTTP/1.1 100 Continue\r\n\r\n".repeat(interim);
            answer.extend_from_slice(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
            let _ = s.write_all(&answer).await;
            tokio::time::sleep(WAIT).await;
        });
        authority
    }

    #[tokio::test]
    async fn the_most_interim_answers_are_skipped_and_one_more_fails_the_exchange() {
        let request = b"GET / HTTP/1.1\r\nhost: s\r\n\r\n";
        let authority = site_with_interim(MAX_INTERIM_ANSWERS).await;
        let conn = connect(&connector(), &authority).await.unwrap();
        let by = tokio::time::Instant::now() + WAIT;
        let (head, _) = exchange(conn, request, b"", &Method::GET, by)
            .await
            .unwrap();
        assert_eq!(head.status, http::StatusCode::OK);
        let authority = site_with_interim(MAX_INTERIM_ANSWERS + 1).await;
        let conn = connect(&connector(), &authority).await.unwrap();
        let by = tokio::time::Instant::now() + WAIT;
        let got = exchange(conn, request, b"", &Method::GET, by).await;
        assert!(
            matches!(
                got,
                Err(Failed::After(WireFailure::Wire(WireError::TooManyInterim)))
            ),
            "{:?}",
            got.err()
        );
    }

    #[test]
    fn a_refused_request_is_sent_again_once_and_only_from_a_pooled_connection() {
        assert!(sent_again(true, MAX_STALE_RETRIES));
        assert!(!sent_again(true, MAX_STALE_RETRIES + 1));
        assert!(!sent_again(false, 1));
    }

    #[test]
    fn a_connection_idle_for_the_idle_timeout_is_reused_and_one_idle_longer_is_not() {
        let since = grid_gateway::clock::monotonic();
        assert!(!expired(since, since + POOL_IDLE_TIMEOUT));
        assert!(expired(
            since,
            since + POOL_IDLE_TIMEOUT + Duration::from_nanos(1)
        ));
        assert!(
            !expired(since, since),
            "a clock read before `since` is not an age"
        );
    }
}
