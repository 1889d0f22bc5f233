//! A request body read whole (its `model` is in it) within its size limit and time bound.
//!
//! Nearly every body arrives with its head: the gateway's HTTP/1.1 server hands it on as
//! one frame, already in the connection's buffer. Such a body is taken as that frame,
//! without a copy, a list of frames or a timer; `http_body_util`'s `Limited` and
//! `Collect` built a list and joined it, and `tokio::time::timeout` read the clock, for
//! every body. A body in several frames is joined into one buffer, and a body that is
//! not all there at the first look is waited for within the bound, whose timer starts
//! then (the first look never waits, so the bound is the same).

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::Body;
use http_body_util::BodyExt as _;

use crate::engine::BoxError;

/// Why a request body was not read.
#[derive(Debug)]
pub(crate) enum BodyFailure {
    /// It is longer than the limit (413).
    TooLarge,
    /// It did not arrive within the bound (408).
    TimedOut,
    /// Reading it failed (400).
    Read(BoxError),
}

/// `body`, whole, when it is at most `limit` bytes and arrives within `bound`.
pub(crate) async fn read_whole<B>(
    body: B,
    limit: usize,
    bound: Duration,
) -> Result<Bytes, BodyFailure>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut whole = pin!(gather(body, limit));
    let first_look = std::future::poll_fn(|cx| Poll::Ready(whole.as_mut().poll(cx))).await;
    if let Poll::Ready(read) = first_look {
        return read;
    }
    tokio::time::timeout(bound, whole)
        .await
        .unwrap_or(Err(BodyFailure::TimedOut))
}

/// Every data frame of `body` (trailers are not forwarded, so they are dropped), the
/// first kept as it came until a second one arrives.
async fn gather<B>(body: B, limit: usize) -> Result<Bytes, BodyFailure>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = pin!(body);
    let mut first: Option<Bytes> = None;
    let mut joined = BytesMut::new();
    let mut len = 0usize;
    while let Some(frame) = body.as_mut().frame().await {
        let frame = frame.map_err(|e| BodyFailure::Read(e.into()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        len = len.saturating_add(data.len());
        if len > limit {
            return Err(BodyFailure::TooLarge);
        }
        if data.is_empty() {
            continue;
        }
        match first.take() {
            None if joined.is_empty() => first = Some(data),
            None => joined.extend_from_slice(&data),
            Some(earlier) => {
                joined.reserve(len);
                joined.extend_from_slice(&earlier);
                joined.extend_from_slice(&data);
            }
        }
    }
    Ok(first.unwrap_or_else(|| joined.freeze()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Frame;
    use http_body_util::{Full, StreamBody};

    const BOUND: Duration = Duration::from_secs(5);

    type Part = Result<Frame<Bytes>, std::io::Error>;

    fn frames(parts: Vec<Part>) -> impl Body<Data = Bytes, Error = std::io::Error> {
        StreamBody::new(futures::stream::iter(parts))
    }

    fn data(s: &'static str) -> Frame<Bytes> {
        Frame::data(Bytes::from_static(s.as_bytes()))
    }

    #[tokio::test]
    async fn a_body_in_one_frame_is_that_frame_not_a_copy() {
        let sent = Bytes::from_static(b"{\"model\":\"m\"}");
        let read = read_whole(Full::new(sent.clone()), 64, BOUND)
            .await
            .unwrap();
        assert_eq!(read, sent);
        assert_eq!(
            read.as_ptr(),
            sent.as_ptr(),
            "the frame is handed on as it came"
        );
    }

    #[tokio::test]
    async fn frames_are_joined_in_order_and_trailers_dropped() {
        let body = frames(vec![
            Ok(data("ab")),
            Ok(Frame::data(Bytes::new())),
            Ok(data("cd")),
            Ok(data("e")),
            Ok(Frame::trailers(http::HeaderMap::new())),
        ]);
        assert_eq!(read_whole(body, 64, BOUND).await.unwrap(), "abcde");
    }

    #[tokio::test]
    async fn a_body_of_exactly_the_limit_is_read_and_one_byte_more_is_too_large() {
        let body = frames(vec![Ok(data("abc")), Ok(data("de"))]);
        assert_eq!(read_whole(body, 5, BOUND).await.unwrap(), "abcde");
        let body = frames(vec![Ok(data("abc")), Ok(data("def"))]);
        assert!(matches!(
            read_whole(body, 5, BOUND).await,
            Err(BodyFailure::TooLarge)
        ));
        assert!(matches!(
            read_whole(Full::new(Bytes::from_static(b"abcdef")), 5, BOUND).await,
            Err(BodyFailure::TooLarge)
        ));
    }

    #[tokio::test]
    async fn an_empty_body_is_empty() {
        let read = read_whole(Full::new(Bytes::new()), 0, BOUND).await.unwrap();
        assert!(read.is_empty());
    }

    #[tokio::test]
    async fn a_failed_read_says_why() {
        let body = frames(vec![Ok(data("ab")), Err(std::io::Error::other("reset"))]);
        match read_whole(body, 64, BOUND).await {
            Err(BodyFailure::Read(e)) => assert_eq!(e.to_string(), "reset"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_arriving_times_out_at_the_bound() {
        let (mut tx, body) = http_body_util::channel::Channel::<Bytes, std::io::Error>::new(4);
        tx.send_data(Bytes::from_static(b"ab")).await.unwrap();
        let started = tokio::time::Instant::now();
        let read = read_whole(body, 64, BOUND).await;
        assert!(matches!(read, Err(BodyFailure::TimedOut)), "{read:?}");
        assert_eq!(started.elapsed(), BOUND);
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_ends_late_but_within_the_bound_is_read() {
        let (mut tx, body) = http_body_util::channel::Channel::<Bytes, std::io::Error>::new(4);
        tx.send_data(Bytes::from_static(b"ab")).await.unwrap();
        let late = tokio::spawn(async move {
            tokio::time::sleep(BOUND.saturating_sub(Duration::from_millis(1))).await;
            tx.send_data(Bytes::from_static(b"cd")).await.unwrap();
        });
        assert_eq!(read_whole(body, 64, BOUND).await.unwrap(), "abcd");
        late.await.unwrap();
    }
}
