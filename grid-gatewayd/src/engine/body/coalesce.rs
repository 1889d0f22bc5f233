//! A site's answer body with the frames that are already there handed on together.
//!
//! # Why
//!
//! hyper's client hands an answer's body from the site's connection task to the
//! client's through a channel that holds one chunk. A stream whose events all sit in the
//! gateway's read buffer (a burst of tokens, a short answer sent at once) therefore
//! reaches the client's side one chunk per wake-up, and hyper's server flushes whenever
//! the body has nothing ready: one write to the client, and one chunk header (HTTP/1.1)
//! or DATA frame (HTTP/2), per event. nginx reads such a burst in one go and writes it in
//! one go.
//!
//! # How
//!
//! When a data frame arrives and the body is not known to be over, the frame is held and
//! whatever else the body has ready is gathered in the same call. Once it is pending,
//! the task yields (it wakes itself and returns `Pending`), which lets the site's
//! connection task hand over the next chunk if it has one; a body whose connection this
//! task polls itself (`Coalesce::driven_inline`) has nothing more coming, so it does not
//! yield. Frames gathered that way leave
//! as one, as soon as the site has nothing more ready, the body ends, or the batch reaches
//! [`MAX_COALESCED_FRAMES`] or [`MAX_COALESCED_BYTES`]. A frame with nothing behind it is
//! delayed by [`YIELDS_PER_FRAME`] scheduler passes, microseconds, never by a timer: a
//! stream's tokens, which come milliseconds apart, each still leave as they come. A body
//! whose length says it is over (a plain answer's one frame) passes without yielding.
//!
//! A pending body is asked again before its task yields by hyper's HTTP/1.1 server (its
//! write loop polls a pending body twice in one turn), so one yield would be spent before
//! the site's task ever ran: the batch would leave one frame at a time, as without this
//! wrapper. Hence two.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

/// Most frames handed on as one: bounds how many scheduler passes a burst waits.
pub const MAX_COALESCED_FRAMES: usize = 32;

/// Most bytes handed on as one (a batch stops growing once it holds this many): bounds the
/// copy and what a client waits for behind the first frame.
pub const MAX_COALESCED_BYTES: usize = 64 * 1024;

/// Times a held batch yields, with nothing new from the site, before it is handed on: the
/// second covers hyper's HTTP/1.1 server asking again within the same turn.
pub const YIELDS_PER_FRAME: u8 = 2;

/// What a batch of two or more frames is gathered into at first: room for some twenty
/// server-sent events of a token each, so a batch of them is copied without growing its
/// buffer on every frame (which cost more than the copies). A larger batch grows.
pub const GATHER_CAPACITY: usize = 4 * 1024;

/// Data gathered and not yet handed on.
#[derive(Default)]
enum Held {
    #[default]
    Nothing,
    /// One frame, kept as it came: no copy unless a second follows.
    One(Bytes),
    /// Several, copied together.
    Many(BytesMut),
}

impl Held {
    fn len(&self) -> usize {
        match self {
            Self::Nothing => 0,
            Self::One(b) => b.len(),
            Self::Many(b) => b.len(),
        }
    }

    fn push(&mut self, data: Bytes) {
        *self = match std::mem::take(self) {
            Self::Nothing => Self::One(data),
            Self::One(first) => {
                let need = first.len() + data.len();
                let mut many = BytesMut::with_capacity(need.max(GATHER_CAPACITY));
                many.extend_from_slice(&first);
                many.extend_from_slice(&data);
                Self::Many(many)
            }
            Self::Many(mut many) => {
                many.extend_from_slice(&data);
                Self::Many(many)
            }
        };
    }

    fn take(&mut self) -> Option<Bytes> {
        match std::mem::take(self) {
            Self::Nothing => None,
            Self::One(b) => Some(b),
            Self::Many(b) => Some(b.freeze()),
        }
    }
}

/// What the inner body yielded that must follow the held data (its end, trailers, an
/// error).
type After<E> = Option<Option<Result<Frame<Bytes>, E>>>;

/// `inner` with the frames it has ready handed on as one.
pub(crate) struct Coalesce<B: Body> {
    inner: B,
    held: Held,
    frames: usize,
    /// Yields since the last frame arrived.
    yields: u8,
    /// Yields a held batch waits for more: [`YIELDS_PER_FRAME`], or none for a body whose
    /// connection is polled from this task.
    max_yields: u8,
    after: After<B::Error>,
}

impl<B: Body> Coalesce<B> {
    /// A body read from another task (the site's connection task): a held batch yields
    /// for it to hand over more.
    pub(crate) fn new(inner: B) -> Self {
        Self::yielding(inner, YIELDS_PER_FRAME)
    }

    /// A body whose connection is polled when it is (a pooled connection in the clear,
    /// [`crate::engine::site::pool`]): once it is pending, the socket has nothing more, so what
    /// is held leaves at once, with no yield.
    pub(crate) fn driven_inline(inner: B) -> Self {
        Self::yielding(inner, 0)
    }

    fn yielding(inner: B, max_yields: u8) -> Self {
        Self {
            inner,
            held: Held::Nothing,
            frames: 0,
            yields: 0,
            max_yields,
            after: None,
        }
    }

    /// Wakes the task and returns `Pending`: one scheduler pass for the site's connection
    /// task to hand over what it has already read.
    fn yield_once(&mut self, cx: &Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.yields += 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn hand_on(&mut self) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.frames = 0;
        match self.held.take() {
            Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
            None => Poll::Ready(self.after.take().flatten()),
        }
    }
}

impl<B> Body for Coalesce<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        if let Some(after) = this.after.take() {
            // The held data left on the last call; what came after it follows now.
            return Poll::Ready(after);
        }
        // What is ready now is gathered in this one call; only when the inner body is
        // pending does the batch yield (or leave).
        loop {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) if frame.is_data() => {
                    let Ok(data) = frame.into_data() else {
                        unreachable!("is_data was checked")
                    };
                    let over = this.inner.is_end_stream();
                    if over && this.frames == 0 {
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    this.held.push(data);
                    this.frames += 1;
                    this.yields = 0;
                    if over
                        || this.frames >= MAX_COALESCED_FRAMES
                        || this.held.len() >= MAX_COALESCED_BYTES
                    {
                        return this.hand_on();
                    }
                }
                Poll::Ready(other) => {
                    if this.frames == 0 {
                        return Poll::Ready(other);
                    }
                    this.after = Some(other);
                    return this.hand_on();
                }
                Poll::Pending if this.frames > 0 && this.yields < this.max_yields => {
                    return this.yield_once(cx);
                }
                Poll::Pending if this.frames > 0 => return this.hand_on(),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames == 0
            && match &self.after {
                Some(None) => true,
                Some(Some(_)) => false,
                None => self.inner.is_end_stream(),
            }
    }

    fn size_hint(&self) -> SizeHint {
        let held = self.held.len() as u64;
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + held);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + held);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;
    use http_body_util::channel::Channel;
    use std::convert::Infallible;
    use std::time::Duration;

    #[test]
    fn a_batch_up_to_the_gather_capacity_and_one_past_it_leaves_whole_and_in_order() {
        for total in [GATHER_CAPACITY, GATHER_CAPACITY + 1] {
            let mut held = Held::Nothing;
            let mut want = Vec::new();
            let mut i = 0u8;
            while want.len() < total {
                let n = (total - want.len()).min(100);
                let frame = vec![i; n];
                want.extend_from_slice(&frame);
                held.push(Bytes::from(frame));
                i = i.wrapping_add(1);
            }
            if let Held::Many(b) = &held {
                if total <= GATHER_CAPACITY {
                    assert_eq!(b.capacity(), GATHER_CAPACITY, "never grown");
                }
            } else {
                panic!("{total} bytes in one frame");
            }
            assert_eq!(held.take().unwrap(), want, "{total} bytes");
            assert!(held.take().is_none());
        }
    }

    /// Every frame `body` yields, in order, each as its bytes.
    async fn frames<B: Body<Data = Bytes> + Unpin>(mut body: B) -> Vec<Bytes>
    where
        B::Error: std::fmt::Debug,
    {
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            out.push(frame.unwrap().into_data().unwrap());
        }
        out
    }

    #[tokio::test]
    async fn frames_ready_back_to_back_leave_as_one() {
        let (mut tx, inner) = Channel::<Bytes, Infallible>::new(16);
        for event in ["data: 1\n\n", "data: 2\n\n", "data: 3\n\n"] {
            tx.send_data(Bytes::from_static(event.as_bytes()))
                .await
                .unwrap();
        }
        drop(tx);
        let out = frames(Coalesce::new(inner)).await;
        assert_eq!(
            out,
            vec![Bytes::from_static(b"data: 1\n\ndata: 2\n\ndata: 3\n\n")]
        );
    }

    #[tokio::test]
    async fn a_frame_with_nothing_behind_it_leaves_without_waiting_for_the_next() {
        let (mut tx, inner) = Channel::<Bytes, Infallible>::new(4);
        tx.send_data(Bytes::from_static(b"first")).await.unwrap();
        let mut body = Coalesce::new(inner);
        let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("the first frame leaves while the site still holds the stream open");
        assert_eq!(first.unwrap().unwrap().into_data().unwrap(), "first");
        tx.send_data(Bytes::from_static(b"second")).await.unwrap();
        drop(tx);
        assert_eq!(frames(body).await, vec![Bytes::from_static(b"second")]);
    }

    #[tokio::test]
    async fn a_batch_stops_at_the_frame_bound() {
        let (mut tx, inner) = Channel::<Bytes, Infallible>::new(2 * MAX_COALESCED_FRAMES);
        for _ in 0..=MAX_COALESCED_FRAMES {
            tx.send_data(Bytes::from_static(b"x")).await.unwrap();
        }
        drop(tx);
        let out = frames(Coalesce::new(inner)).await;
        let lens: Vec<usize> = out.iter().map(Bytes::len).collect();
        assert_eq!(lens, vec![MAX_COALESCED_FRAMES, 1]);
    }

    #[tokio::test]
    async fn a_batch_stops_once_it_holds_the_byte_bound() {
        let (mut tx, inner) = Channel::<Bytes, Infallible>::new(8);
        let half = Bytes::from(vec![b'x'; MAX_COALESCED_BYTES / 2]);
        for _ in 0..3 {
            tx.send_data(half.clone()).await.unwrap();
        }
        drop(tx);
        let out = frames(Coalesce::new(inner)).await;
        let lens: Vec<usize> = out.iter().map(Bytes::len).collect();
        assert_eq!(lens, vec![MAX_COALESCED_BYTES, MAX_COALESCED_BYTES / 2]);
    }

    #[tokio::test]
    async fn an_error_behind_held_frames_follows_them() {
        let (mut tx, inner) = Channel::<Bytes, &'static str>::new(4);
        tx.send_data(Bytes::from_static(b"a")).await.unwrap();
        tx.send_data(Bytes::from_static(b"b")).await.unwrap();
        tx.abort("site reset");
        let mut body = Coalesce::new(inner);
        let data = body.frame().await.unwrap().unwrap();
        assert_eq!(data.into_data().unwrap(), "ab", "the data first");
        assert_eq!(body.frame().await.unwrap().unwrap_err(), "site reset");
    }

    #[tokio::test]
    async fn trailers_behind_held_frames_follow_them() {
        let (mut tx, inner) = Channel::<Bytes, Infallible>::new(4);
        tx.send_data(Bytes::from_static(b"a")).await.unwrap();
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        tx.send_trailers(trailers).await.unwrap();
        drop(tx);
        let mut body = Coalesce::new(inner);
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "a"
        );
        let last = body.frame().await.unwrap().unwrap();
        assert_eq!(last.trailers_ref().unwrap()["grpc-status"], "0");
        assert!(body.frame().await.is_none());
    }

    /// One poll of `body` with a waker that does nothing, as hyper's write loop makes it.
    fn poll_now<B: Body<Data = Bytes> + Unpin>(
        body: &mut Coalesce<B>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>>
    where
        B::Error: Unpin,
    {
        Pin::new(body).poll_frame(&mut Context::from_waker(std::task::Waker::noop()))
    }

    #[tokio::test]
    async fn a_body_asked_again_in_the_same_turn_still_gives_the_site_a_pass() {
        let (mut tx, inner) = Channel::<Bytes, Infallible>::new(4);
        let mut body = Coalesce::new(inner);
        tx.send_data(Bytes::from_static(b"a")).await.unwrap();
        assert!(poll_now(&mut body).is_pending(), "held, yielding");
        assert!(
            poll_now(&mut body).is_pending(),
            "hyper's HTTP/1.1 server asks again before its task yields: still held"
        );
        // The site's connection task runs: the next event arrives.
        tx.send_data(Bytes::from_static(b"b")).await.unwrap();
        assert!(poll_now(&mut body).is_pending(), "both held, yielding");
        assert!(
            poll_now(&mut body).is_pending(),
            "nothing new: the last pass"
        );
        let Poll::Ready(Some(Ok(frame))) = poll_now(&mut body) else {
            panic!("handed on once the site had nothing more for its passes");
        };
        assert_eq!(frame.into_data().unwrap(), "ab");
        drop(tx);
    }

    #[tokio::test]
    async fn an_answer_whose_end_is_already_read_leaves_with_its_end_known_in_one_call() {
        // A plain chunked answer read whole: its one chunk, then its end. Handed on in the
        // call that found them, hyper writes the head, the chunk and the end together;
        // a yield would have let it write the head alone first.
        let (mut tx, inner) = Channel::<Bytes, Infallible>::new(4);
        tx.send_data(Bytes::from_static(b"{}")).await.unwrap();
        drop(tx);
        let mut body = Coalesce::new(inner);
        let Poll::Ready(Some(Ok(frame))) = poll_now(&mut body) else {
            panic!("the frame and its end were both ready");
        };
        assert_eq!(frame.into_data().unwrap(), "{}");
        assert!(body.is_end_stream(), "the end is known with the frame");
    }

    #[tokio::test]
    async fn a_body_driven_inline_hands_on_what_is_ready_without_yielding() {
        let (mut tx, inner) = Channel::<Bytes, Infallible>::new(4);
        for part in ["a", "b", "c"] {
            tx.send_data(Bytes::from(part)).await.unwrap();
        }
        let mut body = Coalesce::driven_inline(inner);
        let Poll::Ready(Some(Ok(frame))) = poll_now(&mut body) else {
            panic!("held frames of an inline body leave once it is pending");
        };
        assert_eq!(frame.into_data().unwrap(), "abc");
        assert!(poll_now(&mut body).is_pending());
        drop(tx);
    }

    #[test]
    fn a_body_known_to_be_over_passes_its_frame_without_yielding() {
        let mut body = Coalesce::new(http_body_util::Full::new(Bytes::from_static(b"{}")));
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut body).poll_frame(&mut cx) else {
            panic!("a plain answer's one frame is ready on the first poll");
        };
        assert_eq!(frame.into_data().unwrap(), "{}");
        assert!(body.is_end_stream());
    }
}
