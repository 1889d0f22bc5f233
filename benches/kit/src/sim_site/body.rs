//! Response bodies: a whole buffer, or chunks pushed by a task (server-sent events).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use tokio::sync::mpsc;

/// The body type every simulated-site response uses.
pub(super) type SimBody = BoxBody<Bytes, Infallible>;

/// A whole body.
pub(super) fn full(bytes: impl Into<Bytes>) -> SimBody {
    Full::new(bytes.into()).boxed()
}

/// A body fed chunk by chunk; it ends when the sender is dropped. When the client goes
/// away, hyper drops the body and the sender's next send fails, which is how the
/// streaming task learns to stop.
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

/// A streamed body and the sender that feeds it.
pub(super) fn channel() -> (mpsc::Sender<Bytes>, SimBody) {
    // A few chunks of slack: the writer paces itself by the model's times, not by this.
    let (tx, rx) = mpsc::channel(8);
    (tx, ChannelBody { rx }.boxed())
}
