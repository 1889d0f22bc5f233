//! An HTTP/2 client that stops answering the gateway's pings (a peer that vanished without
//! a FIN, or froze) is dropped after `server::HTTP2_KEEP_ALIVE_INTERVAL` plus
//! `server::HTTP2_KEEP_ALIVE_TIMEOUT`, even while a request of its is in flight, and
//! counted. Time is paused: the minute of keep-alive passes at once.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use grid_gatewayd::engine::client::limits::{HTTP2_KEEP_ALIVE_INTERVAL, HTTP2_KEEP_ALIVE_TIMEOUT};
use grid_kit::gateway_harness::fake_model::{Behaviour, FakeModel};
use grid_kit::gateway_harness::{one, series, start_gateway};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// A connection whose reading side can be frozen: from then on nothing the gateway sends
/// (its pings included) is read, while writes still go.
struct Freezable {
    tcp: TcpStream,
    frozen: Arc<AtomicBool>,
}

impl AsyncRead for Freezable {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.frozen.load(Ordering::SeqCst) {
            return Poll::Pending;
        }
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Freezable {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[tokio::test(start_paused = true)]
async fn an_http2_client_that_stops_answering_pings_is_dropped_and_counted() {
    let up = FakeModel::start("a").await;
    up.set_behaviour(Behaviour::HangBeforeHead);
    let gw = start_gateway(
        // The request stays in flight past the keep-alive bound: only the pings can end it.
        |c| c.upstream_headers_timeout_ms = 3_600_000,
        &[("m", one("a", up.base_url()))],
    )
    .await;
    let frozen = Arc::new(AtomicBool::new(false));
    let io = Freezable {
        tcp: TcpStream::connect(gw.addr).await.unwrap(),
        frozen: Arc::clone(&frozen),
    };
    let (send, conn) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let mut send = send.ready().await.unwrap();
    let req = http::Request::post("http://gateway/v1/chat/completions")
        .body(())
        .unwrap();
    let (_answer, mut body) = send.send_request(req, false).unwrap();
    body.send_data(Bytes::from_static(CHAT.as_bytes()), true)
        .unwrap();
    let until_seen = Instant::now() + Duration::from_secs(10);
    while up.seen().is_empty() {
        assert!(
            Instant::now() < until_seen,
            "the request never reached the site"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    frozen.store(true, Ordering::SeqCst);
    let frozen_at = Instant::now();
    let bound = HTTP2_KEEP_ALIVE_INTERVAL + HTTP2_KEEP_ALIVE_TIMEOUT;
    loop {
        let text = gw.metrics().await;
        let closed = series(
            &text,
            r#"grid_gateway_connections_closed_total{reason="ping_timeout"}"#,
        );
        if closed == 1 {
            break;
        }
        assert!(
            frozen_at.elapsed() <= bound + Duration::from_secs(1),
            "still open {:?} after the client froze\n{text}",
            frozen_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        frozen_at.elapsed() >= HTTP2_KEEP_ALIVE_TIMEOUT,
        "not before a ping went unanswered"
    );
    gw.shutdown().await;
}
