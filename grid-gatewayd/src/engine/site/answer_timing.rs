//! How long each answer held its site's slot, read off the proxied body and left in the
//! site's live slot, from which grid-score learns the site's turnover (see
//! `grid_score::live`). Two clock reads per answer (its first data frame, its end) and
//! three atomic adds per time recorded; nothing per frame beyond a branch. What each time
//! means (a wait stated or not) is `LiveSlot`'s rule, the one the simulator calls too.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use bytes::Bytes;
use grid_score::live::LiveSlot;
use http_body::{Body, Frame, SizeHint};

/// What is known of an answer when its head arrives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AnswerHead {
    /// When the request went to the site.
    pub(crate) sent: Instant,
    /// When the head arrived.
    pub(crate) head: Instant,
    /// The flow-control wait the site's header stated, ms.
    pub(crate) queue_ms: Option<u64>,
    /// A server-sent event stream (`text/event-stream`): its slot is held from its first
    /// data frame to its end.
    pub(crate) streaming: bool,
}

impl AnswerHead {
    /// Records what the head alone tells: a plain answer's head comes when it is done
    /// (`LiveSlot::record_plain_answer`).
    pub(crate) fn record(&self, slot: &LiveSlot) {
        if !self.streaming {
            slot.record_plain_answer(millis(self.head - self.sent), self.queue_ms);
        }
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A streamed answer's body, timed: its first data frame is its first token, its end the
/// slot freed.
pub(crate) struct TimedBody<B> {
    inner: B,
    slot: Arc<LiveSlot>,
    head: AnswerHead,
    first: Option<Instant>,
    ended: bool,
}

impl<B> TimedBody<B> {
    pub(crate) fn new(inner: B, slot: Arc<LiveSlot>, head: AnswerHead) -> Self {
        Self {
            inner,
            slot,
            head,
            first: None,
            ended: false,
        }
    }
}

impl<B> TimedBody<B> {
    fn end(&mut self) {
        if !self.ended {
            self.ended = true;
            if let Some(first) = self.first {
                self.slot
                    .record_served(millis(grid_gateway::clock::monotonic() - first));
            }
        }
    }
}

impl<B> Body for TimedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            Some(Ok(f)) if f.is_data() && this.first.is_none() && this.head.streaming => {
                let now = grid_gateway::clock::monotonic();
                this.first = Some(now);
                this.slot
                    .record_first_byte(millis(now - this.head.sent), this.head.queue_ms);
            }
            _ => {}
        }
        // The end is the last frame when the transport flags it (HTTP/2's END_STREAM,
        // a known length), else the `None` after it.
        if matches!(frame, None | Some(Ok(_))) && (frame.is_none() || this.inner.is_end_stream()) {
            this.end();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;
    use std::time::Duration;

    fn head(streaming: bool, queue_ms: Option<u64>, sent_ago: Duration) -> AnswerHead {
        let now = grid_gateway::clock::monotonic();
        AnswerHead {
            sent: now.checked_sub(sent_ago).unwrap_or(now),
            head: now,
            queue_ms,
            streaming,
        }
    }

    #[tokio::test]
    async fn a_stream_records_its_first_byte_less_the_wait_and_its_time_from_first_to_last() {
        let slot = Arc::new(LiveSlot::new());
        let (mut tx, body) =
            http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(4);
        let timed = TimedBody::new(
            body,
            slot.clone(),
            head(true, Some(100), Duration::from_millis(300)),
        );
        let reader = tokio::spawn(async move {
            timed
                .collect()
                .await
                .map(http_body_util::Collected::to_bytes)
        });
        tx.send_data(Bytes::from_static(b"data: 1\n\n"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        tx.send_data(Bytes::from_static(b"data: 2\n\n"))
            .await
            .unwrap();
        drop(tx);
        let all = reader.await.unwrap().unwrap();
        assert_eq!(
            &all[..],
            b"data: 1\n\ndata: 2\n\n",
            "the body passes unchanged"
        );
        let e = slot.drain();
        assert_eq!((e.first_bytes.count, e.served.count), (1, 1));
        let first = e.first_bytes.geometric_mean_ms().unwrap();
        assert!(
            (190.0..1_000.0).contains(&first),
            "300 ms less the 100 ms wait: {first}"
        );
        let held = e.served.geometric_mean_ms().unwrap();
        assert!(
            (55.0..1_000.0).contains(&held),
            "first to last byte: {held}"
        );
    }

    #[tokio::test]
    async fn without_the_wait_header_a_first_byte_is_not_a_speed() {
        let slot = Arc::new(LiveSlot::new());
        let body = http_body_util::Full::new(Bytes::from_static(b"data: x\n\n"));
        let timed = TimedBody::new(body, slot.clone(), head(true, None, Duration::ZERO));
        timed.collect().await.unwrap();
        let e = slot.drain();
        assert_eq!(
            (e.first_bytes.count, e.served.count),
            (0, 1),
            "the end still counts"
        );
    }

    #[test]
    fn a_plain_answer_holds_its_slot_from_sending_to_its_head_less_the_wait_or_is_kept_apart_without_one()
     {
        let slot = LiveSlot::new();
        head(false, Some(200), Duration::from_millis(1_200)).record(&slot);
        let e = slot.drain();
        assert_eq!(e.served.count, 1);
        let held = e.served.geometric_mean_ms().unwrap();
        assert!((990.0..1_100.0).contains(&held), "{held}");
        head(false, None, Duration::from_millis(1_200)).record(&slot);
        let e = slot.drain();
        assert_eq!(
            (e.served.count, e.unstated.count),
            (0, 1),
            "without the wait header it is not a held time, but kept apart"
        );
        let took = e.unstated.geometric_mean_ms().unwrap();
        assert!((1_190.0..1_300.0).contains(&took), "{took}");
        head(false, Some(1_500), Duration::from_millis(1_200)).record(&slot);
        assert_eq!(
            slot.drain().served.count,
            0,
            "a stated wait longer than the exchange cannot be true: nothing learned"
        );
    }
}
