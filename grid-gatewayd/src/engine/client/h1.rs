//! The gateway's own HTTP/1.1 server: one task per client connection reads request
//! heads with `grid_h1_wire::parse_request`, hands each request to the API, and writes
//! the answer with `grid_h1_wire::encode_answer_head` and its body framed in the same
//! buffer.
//!
//! A server connection with a dispatcher of its own (hyper's) moves every request body,
//! answer and flush through its own state machine and channels; on a proxied answer that
//! plumbing costs more than the proxying (`docs/benchmarks.md`). What such a server does
//! that a client can see is done here too:
//!
//! - keep-alive by the version and `Connection`, pipelined requests answered in order;
//! - a request body read from the connection only as the API asks for it (through
//!   [`ClientBody`], which holds the connection's read side until the body ends), with
//!   `100 Continue` sent first when the client waits for it and the API admits its head
//!   (`Api::admit`: otherwise the refusal goes instead); a body the API did not read
//!   to its end closes the connection after the answer, since its remainder would be
//!   read as the next request;
//! - a client that closes its side while its answer is awaited or streamed ends the
//!   request, which cancels the work on the site, as hyper's server does;
//! - the answer framed by its length when known (by the body or the site's
//!   `Content-Length`), chunked otherwise (closed at its end for an HTTP/1.0 client);
//!   `HEAD` gets the head only; a body that fails midway is cut (no last chunk), so the
//!   client sees the answer incomplete rather than complete;
//! - frames that are ready together leave in one write, the head with them.
//!
//! A head that cannot be read is answered (400, or 431 past the size limit), counted in
//! `grid_gateway_requests_total{outcome}`, and the connection closed. Every wait is
//! bounded by the listener's watchdog (no head, or no request in flight, past its bound)
//! and, inside a request, by the API's own bounds.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use grid_h1_wire::{
    AnswerFraming, BodyDecoder, ConnectionField, Decoded, Framing, LAST_CHUNK, RequestHead,
    WireError, encode_answer_head, encode_chunk, parse_request,
};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::{Body as _, Frame, SizeHint};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{oneshot, watch};

use crate::engine::buffer_room::{Pace, keep_stream_room, make_read_room, release_room};
use crate::engine::client::connection_watch::{Activity, InFlight};
use crate::engine::client::limits::{LINGER, LINGER_MAX_BYTES, Limits, PROBE_HEAD_TIMEOUT};
use crate::engine::client::write_bound::write_all_within;
use crate::engine::timers::deadline_timer::DeadlineTimer;
use crate::front_ends::http_api::{Api, ResponseBody};
use grid_gateway::refusal::ApiErrorKind;
use grid_gateway::routes::Target;

/// Answer bytes gathered before they are written, even when more frames are ready.
pub(crate) const WRITE_HIGH_WATER: usize = 64 * 1024;

/// Room a connection's answer buffer starts with: an answer head and a plain answer's
/// body fit; a larger batch grows it.
const WRITE_INITIAL: usize = 1024;

/// Room made to notice a client closing (or pipelining) while its answer streams: the
/// read that tells it is usually empty, and a pipelined request grows it.
const WATCH_RESERVE: usize = 256;

/// What a client waiting on `Expect: 100-continue` is sent before its body is read.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// A connection's read side and what was read from it but not yet used.
#[derive(Debug)]
pub(crate) struct Reader {
    half: OwnedReadHalf,
    buf: BytesMut,
}

impl Reader {
    /// Reads more; 0 at the client's end of stream.
    async fn fill(&mut self) -> std::io::Result<usize> {
        make_read_room(&mut self.buf, Pace::Bursts);
        self.half.read_buf(&mut self.buf).await
    }

    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        make_read_room(&mut self.buf, Pace::Bursts);
        let read = self.half.read_buf(&mut self.buf);
        std::pin::pin!(read).poll(cx)
    }

    /// Reads more while an answer streams, into little room: see
    /// [`STREAM_KEEP`](crate::engine::buffer_room::STREAM_KEEP).
    async fn watch(&mut self) -> std::io::Result<usize> {
        if self.buf.capacity() == self.buf.len() {
            self.buf.reserve(WATCH_RESERVE);
        }
        self.half.read_buf(&mut self.buf).await
    }
}

/// A request body read from the client's connection as it is polled. It holds the
/// connection's read side, and gives it back to the connection when it ends or is
/// dropped (with the decoder's state: a body dropped before its end leaves bytes that are
/// not a request head).
pub(crate) struct ClientBody {
    reading: Option<Reading>,
}

struct Reading {
    reader: Reader,
    decoder: BodyDecoder,
    back: oneshot::Sender<Returned>,
}

/// The read side coming back from a [`ClientBody`].
struct Returned {
    reader: Reader,
    /// The body was read to its end: what follows in the buffer is the next request.
    whole: bool,
}

impl ClientBody {
    fn empty() -> Self {
        Self { reading: None }
    }

    fn give_back(&mut self) {
        if let Some(r) = self.reading.take() {
            let whole = r.decoder.is_done();
            let _ = r.back.send(Returned {
                reader: r.reader,
                whole,
            });
        }
    }
}

impl Drop for ClientBody {
    fn drop(&mut self) {
        self.give_back();
    }
}

impl http_body::Body for ClientBody {
    type Data = Bytes;
    type Error = WireError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, WireError>>> {
        loop {
            let Some(r) = self.reading.as_mut() else {
                return Poll::Ready(None);
            };
            match r.decoder.decode(&mut r.reader.buf) {
                Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(Decoded::End) => {
                    self.give_back();
                    return Poll::Ready(None);
                }
                Ok(Decoded::More) => {}
                Err(e) => return Poll::Ready(Some(Err(e))),
            }
            match ready!(r.reader.poll_fill(cx)) {
                Ok(0) => {
                    let cut = r.decoder.eof().err().unwrap_or(WireError::Truncated);
                    return Poll::Ready(Some(Err(cut)));
                }
                Ok(_) => {}
                Err(_) => return Poll::Ready(Some(Err(WireError::Truncated))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.reading.as_ref().is_none_or(|r| r.decoder.is_done())
    }

    fn size_hint(&self) -> SizeHint {
        match self.reading.as_ref().map(|r| r.decoder.remaining()) {
            None => SizeHint::with_exact(0),
            Some(Some(n)) => SizeHint::with_exact(n),
            Some(None) => SizeHint::default(),
        }
    }
}

/// The `Date` of the answers, formatted once per second.
struct DateCache {
    second: u64,
    text: Bytes,
}

impl DateCache {
    fn new() -> Self {
        Self {
            second: u64::MAX,
            text: Bytes::new(),
        }
    }

    fn now(&mut self) -> Bytes {
        let now = grid_gateway::clock::system_time();
        let second = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if second != self.second {
            self.second = second;
            self.text = Bytes::from(httpdate::fmt_http_date(now));
        }
        self.text.clone()
    }
}

/// One connection's writing side and its per-connection state.
struct Writer {
    half: OwnedWriteHalf,
    out: BytesMut,
    date: DateCache,
    /// `clientWriteTimeoutSeconds`: how long a write may make no progress.
    bound: Duration,
    /// The bound's timer, made the first time a write has to wait.
    timer: DeadlineTimer,
}

impl Writer {
    /// Writes what is gathered; fails with `ClientStalled` past the write bound.
    async fn flush(&mut self) -> std::io::Result<()> {
        let written =
            write_all_within(&mut self.half, &self.out, self.bound, &mut self.timer).await;
        self.out.clear();
        written
    }

    /// Writes `bytes` alone, under the same bound.
    async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        write_all_within(&mut self.half, bytes, self.bound, &mut self.timer).await
    }
}

/// Serves HTTP/1.1 on `stream`, whose first bytes (read while telling HTTP/1.1 from
/// HTTP/2) are `read`, until the client closes, a request asks to close, or `drain` is
/// set (an idle connection closes at once, a busy one after its answer). `drained`
/// resolves when it is set (`listener::drained`: one future for the connection's life).
/// A write that makes no progress for `write_bound` ends the connection with
/// `ClientStalled` (`write_bound`).
pub(crate) async fn serve(
    stream: TcpStream,
    read: BytesMut,
    api: Api,
    activity: Arc<Activity>,
    write_bound: Duration,
    (drain, mut drained): (watch::Receiver<bool>, impl Future<Output = ()> + Unpin),
) -> std::io::Result<()> {
    let (half, write) = stream.into_split();
    let mut reader = Reader { half, buf: read };
    let mut writer = Writer::new(write, write_bound);
    loop {
        let Some(head) = next_head(&mut reader, &mut writer, &api, &activity, &mut drained).await?
        else {
            return Ok(());
        };
        match exchange(head, reader, &mut writer, &api, &activity, &drain).await? {
            (Some(kept), true) => reader = kept,
            (rest, _) => {
                let _ = writer.half.shutdown().await;
                if let Some(mut rest) = rest {
                    linger(&mut rest).await;
                }
                return Ok(());
            }
        }
    }
}

impl Writer {
    fn new(half: OwnedWriteHalf, bound: Duration) -> Self {
        Self {
            half,
            out: BytesMut::with_capacity(WRITE_INITIAL),
            date: DateCache::new(),
            bound,
            timer: DeadlineTimer::default(),
        }
    }
}

/// Answers one probe (`GET` of `/metrics`, `/healthz` or `/readyz`) on a connection
/// taken past the connection cap (`limits::RESERVED_PROBE_CONNECTIONS`), then closes it:
/// `false` when it was anything else (no head within `limits::PROBE_HEAD_TIMEOUT`, not a
/// probe, not HTTP/1.1), which is closed unanswered as the cap closes any connection.
pub(crate) async fn answer_probe(stream: TcpStream, api: Api, limits: Limits) -> bool {
    let (half, write) = stream.into_split();
    let mut reader = Reader {
        half,
        buf: BytesMut::new(),
    };
    let bound = limits.header_timeout.min(PROBE_HEAD_TIMEOUT);
    let read = tokio::time::timeout(bound, async {
        loop {
            match parse_request(&mut reader.buf) {
                Ok(Some(head)) => return Some(head),
                Ok(None) => {}
                Err(_) => return None,
            }
            if !matches!(reader.fill().await, Ok(n) if n > 0) {
                return None;
            }
        }
    })
    .await;
    let Ok(Some(head)) = read else {
        return false;
    };
    let probe = matches!(
        grid_gateway::routes::classify(&head.method, head.uri.path()),
        Ok(Target::Metrics | Target::Healthz | Target::Readyz | Target::Routing)
    );
    if !probe || head.framing != Framing::Empty {
        return false;
    }
    let version = head.version;
    let mut req = Request::new(ClientBody::empty());
    *req.method_mut() = head.method;
    *req.uri_mut() = head.uri;
    *req.version_mut() = version;
    *req.headers_mut() = head.headers;
    let resp = api.handle(req, None).await;
    let mut writer = Writer::new(write, limits.write_timeout);
    if write_answer(resp, false, version, false, &mut writer, None)
        .await
        .is_ok()
    {
        let _ = writer.half.shutdown().await;
    }
    true
}

/// Reads and drops what the client still sends, for at most [`LINGER`] and
/// [`LINGER_MAX_BYTES`], or until it closes its side.
async fn linger(reader: &mut Reader) {
    let mut left = LINGER_MAX_BYTES;
    let _ = tokio::time::timeout(LINGER, async {
        loop {
            reader.buf.clear();
            match reader.fill().await {
                Ok(0) | Err(_) => return,
                Ok(n) if n >= left => return,
                Ok(n) => left -= n,
            }
        }
    })
    .await;
}

/// The next request head, `None` when the connection is to end (the client closed
/// between requests, the head could not be read and was answered, or draining began
/// with nothing read: `drained` resolved, and is not polled again). A head that is not
/// whole at its first look is told to `activity`, once: from its first bytes it is held
/// to the header bound, not the idle one.
async fn next_head(
    reader: &mut Reader,
    writer: &mut Writer,
    api: &Api,
    activity: &Activity,
    drained: &mut (impl Future<Output = ()> + Unpin),
) -> std::io::Result<Option<RequestHead>> {
    let mut begun = false;
    loop {
        match parse_request(&mut reader.buf) {
            Ok(Some(head)) => return Ok(Some(head)),
            Ok(None) => {}
            Err(e) => {
                let kind = match e {
                    WireError::RequestHeadTooLarge => ApiErrorKind::HeadTooLarge,
                    WireError::RequestCoding => ApiErrorKind::NotImplemented,
                    _ => ApiErrorKind::BadRequest,
                };
                let resp = api.refuse_head(kind, &e.to_string());
                write_answer(resp, false, Version::HTTP_11, false, writer, None).await?;
                let _ = writer.half.shutdown().await;
                linger(reader).await;
                return Ok(None);
            }
        }
        let idle = reader.buf.is_empty();
        if !idle && !begun {
            begun = true;
            activity.head_started(grid_gateway::clock::monotonic());
        }
        tokio::select! {
            biased;
            n = reader.fill() => if n? == 0 {
                return Ok(None);
            },
            () = &mut *drained, if idle => return Ok(None),
        }
    }
}

/// What woke a request's wait for its answer.
enum Wake {
    Answer(Response<ResponseBody>),
    Back(Result<Returned, oneshot::error::RecvError>),
    Read(std::io::Result<usize>),
}

/// Reads more from the client when the connection holds its read side and has room:
/// what tells a client that closed its side (0) from one that sends its next request
/// early (kept, up to one head's worth).
async fn watch_client(own: &mut Option<Reader>) -> std::io::Result<usize> {
    match own {
        Some(r) if r.buf.len() < grid_h1_wire::MAX_REQUEST_HEAD_BYTES => r.watch().await,
        _ => std::future::pending().await,
    }
}

/// One request and its answer: the read side when the connection still has it, and
/// whether the connection stays open.
async fn exchange(
    head: RequestHead,
    reader: Reader,
    writer: &mut Writer,
    api: &Api,
    activity: &Arc<Activity>,
    drain: &watch::Receiver<bool>,
) -> std::io::Result<(Option<Reader>, bool)> {
    let guard = InFlight::start(activity);
    let is_head = head.method == Method::HEAD;
    // `own`: the read side while the connection holds it; `back`: where it comes back
    // from the body that holds it.
    let (body, mut own, mut back) = if head.framing == Framing::Empty {
        (ClientBody::empty(), Some(reader), None)
    } else {
        if head.expects_continue && reader.buf.is_empty() {
            // The head is judged before the body is asked for (`Api::admit`): a request
            // the API refuses by its head alone gets that answer instead of the 100, and
            // its unread body closes the connection after it.
            let declared_len = match head.framing {
                Framing::Length(n) => n,
                _ => 0,
            };
            if let Some(refused) = api.refuse_by_head(&head.method, head.uri.path(), declared_len) {
                let kept =
                    write_answer(refused, false, head.version, is_head, writer, Some(reader))
                        .await?;
                drop(guard);
                return Ok(kept);
            }
            writer.send(CONTINUE).await?;
        }
        let (tx, rx) = oneshot::channel();
        let reading = Reading {
            reader,
            decoder: BodyDecoder::new(head.framing),
            back: tx,
        };
        let body = ClientBody {
            reading: Some(reading),
        };
        (body, None, Some(rx))
    };
    let mut whole = head.framing == Framing::Empty;
    let mut req = Request::new(body);
    *req.method_mut() = head.method;
    *req.uri_mut() = head.uri;
    *req.version_mut() = head.version;
    *req.headers_mut() = head.headers;
    // The handling (routing, the site's connection, its answer head: most of this
    // task's state) lives on the heap until the answer's head, so the connection's task
    // is sized by what an answer needs while it streams: one allocation per request
    // against memory held per open stream for its whole life.
    let resp = {
        let mut handled = Box::pin(api.handle(req, None));
        loop {
            let wake = tokio::select! {
                biased;
                resp = &mut handled => Wake::Answer(resp),
                returned = async { back.as_mut().expect("enabled only while awaited").await },
                    if back.is_some() => Wake::Back(returned),
                n = watch_client(&mut own) => Wake::Read(n),
            };
            match wake {
                Wake::Answer(resp) => break resp,
                Wake::Back(returned) => {
                    back = None;
                    if let Ok(r) = returned {
                        whole = r.whole;
                        own = Some(r.reader);
                    }
                }
                // The client is gone: dropping the request cancels its work on the site.
                Wake::Read(Ok(0) | Err(_)) => return Ok((None, false)),
                Wake::Read(Ok(_)) => {}
            }
        }
    };
    if let Some(mut rx) = back.take()
        && let Ok(r) = rx.try_recv()
    {
        whole = r.whole;
        own = Some(r.reader);
    }
    let stays = head.keep_alive && whole && own.is_some() && !*drain.borrow();
    let kept = write_answer(resp, stays, head.version, is_head, writer, own).await?;
    drop(guard);
    Ok(kept)
}

/// How a step of an answer's body went.
enum Step {
    /// Bytes are gathered and the body has more to come.
    More,
    /// The body ended (its bytes, and the last chunk, are gathered).
    End,
    /// The body failed, or gave more than its length: the answer is cut.
    Cut,
}

/// Gathers every frame of `body` that is ready into `out`, framed as `framing`, up to
/// [`WRITE_HIGH_WATER`]; pending only when nothing was gathered.
fn poll_gather(
    body: &mut ResponseBody,
    framing: AnswerFraming,
    left: &mut u64,
    out: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<Step> {
    loop {
        if out.len() >= WRITE_HIGH_WATER {
            return Poll::Ready(Step::More);
        }
        let frame = match Pin::new(&mut *body).poll_frame(cx) {
            Poll::Pending if out.is_empty() => return Poll::Pending,
            Poll::Pending => return Poll::Ready(Step::More),
            Poll::Ready(None) => {
                if framing == AnswerFraming::Chunked {
                    out.extend_from_slice(LAST_CHUNK);
                } else if matches!(framing, AnswerFraming::Length(_)) && *left > 0 {
                    return Poll::Ready(Step::Cut);
                }
                return Poll::Ready(Step::End);
            }
            Poll::Ready(Some(Err(_))) => return Poll::Ready(Step::Cut),
            Poll::Ready(Some(Ok(frame))) => frame,
        };
        // Trailers are not forwarded over HTTP/1.1 (as hyper's server did not).
        let Ok(data) = frame.into_data() else {
            continue;
        };
        match framing {
            AnswerFraming::Chunked => encode_chunk(&data, out),
            AnswerFraming::Length(_) => {
                let Some(rest) = left.checked_sub(data.len() as u64) else {
                    return Poll::Ready(Step::Cut);
                };
                *left = rest;
                out.extend_from_slice(&data);
            }
            AnswerFraming::UntilClose | AnswerFraming::None => out.extend_from_slice(&data),
        }
    }
}

/// Writes `resp` to the client: the read side when the connection still has it, and
/// whether the connection stays open after it (`stays`, and the answer ended as
/// framed).
async fn write_answer(
    resp: Response<ResponseBody>,
    stays: bool,
    version: Version,
    is_head: bool,
    writer: &mut Writer,
    mut own: Option<Reader>,
) -> std::io::Result<(Option<Reader>, bool)> {
    let (parts, mut body) = resp.into_parts();
    let status = parts.status;
    let no_body = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    // The body's own length, never the head's `Content-Length`: a site's chunked answer
    // may carry one that frames nothing (its body is as long as its chunks say), and
    // every body that is framed by a length knows it.
    let known = if body.is_end_stream() {
        Some(0)
    } else {
        body.size_hint().exact()
    };
    let framing = match known {
        _ if no_body => AnswerFraming::None,
        Some(n) => AnswerFraming::Length(n),
        None if version == Version::HTTP_11 => AnswerFraming::Chunked,
        None => AnswerFraming::UntilClose,
    };
    let stays = stays && framing != AnswerFraming::UntilClose;
    let connection = match (stays, version) {
        (false, _) => ConnectionField::Close,
        (true, Version::HTTP_10) => ConnectionField::KeepAlive,
        (true, _) => ConnectionField::Default,
    };
    let date = writer.date.now();
    encode_answer_head(
        status,
        &parts.headers,
        framing,
        connection,
        &date,
        &mut writer.out,
    );
    // Written: a site's header values share the buffer its head was read into, which a
    // streamed answer would otherwise keep for as long as it streams.
    drop(parts);
    if is_head || no_body || known == Some(0) {
        writer.flush().await?;
        return Ok((own, stays));
    }
    let mut left = known.unwrap_or(0);
    loop {
        let step = tokio::select! {
            biased;
            step = poll_fn(|cx| poll_gather(&mut body, framing, &mut left, &mut writer.out, cx)) => step,
            n = watch_client(&mut own) => match n {
                // The client is gone: dropping the body cancels its work on the site.
                Ok(0) | Err(_) => return Ok((None, false)),
                Ok(_) => continue,
            },
        };
        let batch = writer.out.len();
        writer.flush().await?;
        match step {
            Step::More => {
                keep_stream_room(&mut writer.out, batch);
                if let Some(r) = own.as_mut() {
                    release_room(&mut r.buf);
                }
            }
            Step::End => return Ok((own, stays)),
            Step::Cut => return Ok((own, false)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::{Bytes, BytesMut};
    use http::{HeaderValue, Response, StatusCode, Version};
    use http_body_util::BodyExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::engine::buffer_room::READ_MIN_ROOM;

    /// Both ends of a loopback connection: the server's, the client's.
    async fn connection() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (server, client)
    }

    #[tokio::test]
    async fn watching_a_client_with_no_room_left_makes_watch_reserve_of_room_not_a_read_reserve() {
        let (server, mut client) = connection().await;
        let (half, _) = server.into_split();
        let mut reader = Reader {
            half,
            buf: BytesMut::new(),
        };
        client.write_all(&[b'x'; 2 * WATCH_RESERVE]).await.unwrap();
        let n = reader.watch().await.unwrap();
        assert!((1..=WATCH_RESERVE).contains(&n), "{n}");
        assert!(
            reader.buf.capacity() < READ_MIN_ROOM,
            "{}",
            reader.buf.capacity()
        );
    }

    #[test]
    fn a_plain_answers_head_and_small_body_fit_the_initial_write_room() {
        let mut out = BytesMut::with_capacity(WRITE_INITIAL);
        let mut headers = http::HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("x-grid-site", HeaderValue::from_static("site-a"));
        headers.insert(
            "x-request-id",
            HeaderValue::from_static("0123456789abcdef0123456789abcdef"),
        );
        encode_answer_head(
            StatusCode::OK,
            &headers,
            AnswerFraming::Length(300),
            ConnectionField::Default,
            b"Sun, 06 Dec 2026 02:00:00 GMT",
            &mut out,
        );
        out.extend_from_slice(&[b'{'; 300]);
        assert_eq!(out.capacity(), WRITE_INITIAL, "{} bytes", out.len());
    }

    #[tokio::test]
    async fn an_answer_head_once_written_no_longer_holds_the_site_buffer_its_values_share() {
        let (server, mut client) = connection().await;
        let (_, half) = server.into_split();
        // A site's header value is a slice of the buffer its head was read into.
        let site_buffer = Bytes::from(vec![b'a'; 8 * 1024]);
        let value = HeaderValue::from_maybe_shared(site_buffer.slice(0..6)).unwrap();
        let (mut events, body) =
            http_body_util::channel::Channel::<Bytes, crate::engine::BoxError>::new(1);
        let resp = Response::builder()
            .header("x-grid-site", value)
            .body(body.boxed())
            .unwrap();
        let writing = tokio::spawn(async move {
            let mut writer = Writer::new(half, Duration::from_secs(5));
            write_answer(resp, true, Version::HTTP_11, false, &mut writer, None).await
        });
        events
            .send_data(Bytes::from_static(b"data: 1\n\n"))
            .await
            .unwrap();
        // The head and the first event reached the client: the answer streams on.
        let mut got = Vec::new();
        while !got.ends_with(b"data: 1\n\n\r\n") {
            let mut chunk = [0u8; 512];
            let n = tokio::time::timeout(Duration::from_secs(5), client.read(&mut chunk))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&chunk[..n]);
        }
        assert!(!writing.is_finished());
        assert!(
            site_buffer.is_unique(),
            "a streaming answer still holds its site's read buffer"
        );
        drop(events);
        writing.await.unwrap().unwrap();
    }
}
