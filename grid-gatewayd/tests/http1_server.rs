//! The gateway's own HTTP/1.1 server, spoken to byte by byte the way clients (and
//! attackers) do: pipelining, chunked and `100-continue` bodies, HTTP/1.0, heads that
//! frame their body two ways or are too large, bodies the API does not read, and a client
//! that leaves while its answer streams.

use std::time::Duration;

use grid_gatewayd::engine::client::limits::LINGER;
use grid_kit::gateway_harness::fake_model::{Behaviour, FakeModel};
use grid_kit::gateway_harness::{one, series, start_gateway};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// What "at once" allows on loopback, with generous scheduling slack.
const WITHIN: Duration = Duration::from_secs(5);

fn chat(model: &str, word: &str) -> String {
    format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"{word}"}}]}}"#)
}

fn post(body: &str, extra: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
}

/// Everything the gateway sends on `stream` until it closes it (or [`WITHIN`] passes,
/// which fails the test: every case here ends with the gateway's close).
async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut all = Vec::new();
    let deadline = Instant::now() + WITHIN;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(read) = tokio::time::timeout(left, stream.read(&mut buf)).await else {
            panic!(
                "the gateway did not close within {WITHIN:?}; read so far: {}",
                String::from_utf8_lossy(&all)
            )
        };
        match read {
            Ok(0) | Err(_) => return String::from_utf8_lossy(&all).into_owned(),
            Ok(n) => all.extend_from_slice(&buf[..n]),
        }
    }
}

/// Sends `wire` on a new connection and reads until the gateway closes it: exactly one
/// answer, with status line `status` (what followed it in `wire` was never served). The
/// whole answer is returned.
async fn one_answer_then_close(addr: std::net::SocketAddr, wire: &str, status: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(wire.as_bytes()).await.unwrap();
    let text = read_to_close(&mut s).await;
    assert!(
        text.starts_with(&format!("HTTP/1.1 {status}\r\n")),
        "{text}"
    );
    assert_eq!(
        text.matches("HTTP/1.1 ").count(),
        1,
        "nothing after the one answer: {text}"
    );
    text
}

/// Reads from `stream` until `want` has arrived; what arrived.
async fn read_until(stream: &mut TcpStream, want: &str) -> String {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(WITHIN, async {
        while !String::from_utf8_lossy(&all).contains(want) {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed before {want:?}: {}",
                String::from_utf8_lossy(&all)
            );
            all.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {want:?} within {WITHIN:?}"));
    String::from_utf8_lossy(&all).into_owned()
}

#[tokio::test]
async fn pipelined_requests_on_one_connection_are_answered_in_order() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let wire = format!(
        "{}{}GET /healthz HTTP/1.1\r\nhost: g\r\nconnection: close\r\n\r\n",
        post(&chat("m", "first"), ""),
        post(&chat("m", "second"), "")
    );
    s.write_all(wire.as_bytes()).await.unwrap();
    let text = read_to_close(&mut s).await;
    let statuses: Vec<&str> = text
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| &text[i + 9..i + 12])
        .collect();
    assert_eq!(statuses, ["200", "200", "200"], "{text}");
    let (first, second, probe) = (
        text.find("hello from a").unwrap(),
        text.rfind("hello from a").unwrap(),
        text.rfind("HTTP/1.1 200").unwrap(),
    );
    assert!(
        first < second && second < probe,
        "answers in request order: {text}"
    );
    let seen: Vec<String> = up
        .seen()
        .iter()
        .map(|s| String::from_utf8_lossy(&s.body).into_owned())
        .collect();
    assert_eq!(seen, [chat("m", "first"), chat("m", "second")]);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_chunked_request_body_reaches_the_site_whole() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let body = chat("m", "chunked");
    let (head, tail) = body.split_at(10);
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ntransfer-encoding: chunked\r\n\
             connection: close\r\n\r\n{:x};ext=1\r\n{head}\r\n",
            head.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    s.write_all(format!("{:x}\r\n{tail}\r\n0\r\n\r\n", tail.len()).as_bytes())
        .await
        .unwrap();
    let text = read_to_close(&mut s).await;
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("hello from a"), "{text}");
    assert_eq!(up.seen()[0].body, body.as_bytes());
    gw.shutdown().await;
}

/// A site that answers every request on its first connection with `answer`, as bytes,
/// after reading the request's head and its `content-length` body.
async fn raw_site(answer: &'static [u8]) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let head_end = loop {
            if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "the gateway closed before its request's head");
            got.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while got.len() < head_end + length {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "the gateway closed before its request's body");
            got.extend_from_slice(&buf[..n]);
        }
        s.write_all(answer).await.unwrap();
        // Held open: the answer's end is its last chunk, not the close.
        let _ = tokio::time::timeout(WITHIN, s.read(&mut buf)).await;
    });
    (url, task)
}

#[tokio::test]
async fn a_chunked_answer_with_a_stray_content_length_reaches_the_client_whole_and_chunked() {
    // The chunks frame the answer (RFC 9112 section 6.3); the length frames nothing and
    // must not be what the client is told.
    let (url, site) = raw_site(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\
          content-length: 3\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    .await;
    let gw = start_gateway(|_| {}, &[("m", one("a", url))]).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(post(&chat("m", "hi"), "connection: close\r\n").as_bytes())
        .await
        .unwrap();
    let text = read_to_close(&mut s).await;
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(head.contains("transfer-encoding: chunked"), "{text}");
    assert!(!head.contains("content-length"), "{text}");
    assert_eq!(body, "b\r\nhello world\r\n0\r\n\r\n", "{text}");
    gw.shutdown().await;
    site.abort();
}

#[tokio::test]
async fn a_client_waiting_for_100_continue_gets_it_before_it_sends_its_body() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let body = chat("m", "patient");
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let wire = post(&body, "expect: 100-continue\r\nconnection: close\r\n");
    let head = &wire[..wire.len() - body.len()];
    s.write_all(head.as_bytes()).await.unwrap();
    let interim = read_until(&mut s, "\r\n\r\n").await;
    assert_eq!(interim, "HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(body.as_bytes()).await.unwrap();
    let text = read_to_close(&mut s).await;
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    gw.shutdown().await;
}

#[tokio::test]
async fn an_http_1_0_client_gets_a_framed_answer_and_the_close() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let body = chat("m", "old");
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let wire = post(&body, "").replacen("HTTP/1.1", "HTTP/1.0", 1);
    s.write_all(wire.as_bytes()).await.unwrap();
    let text = read_to_close(&mut s).await;
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("connection: close\r\n"), "{text}");
    assert!(text.contains("content-length: "), "{text}");
    assert!(text.contains("hello from a"), "{text}");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_request_that_frames_its_body_two_ways_is_refused_and_the_connection_closed() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    // The classic smuggling shape: a proxy reading the length and one reading the
    // chunks would disagree on where the second request starts.
    let smuggled = "GET /metrics HTTP/1.1\r\nhost: g\r\n\r\n";
    let wire = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-length: 4\r\n\
         transfer-encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}"
    );
    let text = one_answer_then_close(gw.addr, &wire, "400 Bad Request").await;
    assert!(text.contains("\"code\":\"invalid_request\""), "{text}");
    assert!(up.seen().is_empty(), "nothing reached the site");
    let metrics = gw.metrics().await;
    assert_eq!(
        series(
            &metrics,
            r#"grid_gateway_requests_total{outcome="invalid_request"}"#
        ),
        1,
        "{metrics}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_head_past_the_size_limit_is_refused_with_431_and_one_at_it_is_served() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let with_head_of = |total: usize| {
        let start = "GET /healthz HTTP/1.1\r\nhost: g\r\nconnection: close\r\nx-fill: ";
        let end = "\r\n\r\n";
        format!(
            "{start}{}{end}",
            "a".repeat(total - start.len() - end.len())
        )
    };
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(with_head_of(grid_h1_wire::MAX_REQUEST_HEAD_BYTES).as_bytes())
        .await
        .unwrap();
    let text = read_to_close(&mut s).await;
    assert!(
        text.starts_with("HTTP/1.1 200 OK\r\n"),
        "{}",
        &text[..80.min(text.len())]
    );
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(with_head_of(grid_h1_wire::MAX_REQUEST_HEAD_BYTES + 1).as_bytes())
        .await
        .unwrap();
    let text = read_to_close(&mut s).await;
    assert!(
        text.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
        "{text}"
    );
    assert!(text.contains("\"code\":\"head_too_large\""), "{text}");
    let metrics = gw.metrics().await;
    assert_eq!(
        series(
            &metrics,
            r#"grid_gateway_requests_total{outcome="head_too_large"}"#
        ),
        1,
        "{metrics}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_body_the_api_does_not_read_closes_the_connection_so_it_is_never_read_as_a_request() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let hidden = "GET /metrics HTTP/1.1\r\nhost: g\r\n\r\n";
    let wire = format!(
        "GET /healthz HTTP/1.1\r\nhost: g\r\ncontent-length: {}\r\n\r\n{hidden}",
        hidden.len()
    );
    let text = one_answer_then_close(gw.addr, &wire, "200 OK").await;
    assert!(text.contains("connection: close\r\n"), "{text}");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_client_that_leaves_while_its_answer_streams_ends_its_connection_at_once() {
    let up = FakeModel::start("a").await;
    up.set_behaviour(Behaviour::StallStream);
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let body = r#"{"model":"m","stream":true,"messages":[]}"#;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(post(body, "").as_bytes()).await.unwrap();
    let first = read_until(&mut s, "data: ").await;
    assert!(first.contains("transfer-encoding: chunked\r\n"), "{first}");
    let open = |m: &str| series(m, "grid_gateway_connections_open");
    assert_eq!(
        open(&gw.metrics().await),
        2,
        "this one and the metrics read's"
    );
    drop(s);
    // The site stalls for a minute and the idle bound is longer still: only the
    // client's close can end this request now.
    let deadline = Instant::now() + WITHIN;
    loop {
        let now = open(&gw.metrics().await);
        if now == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "{now} connections still open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn a_client_still_sending_a_refused_body_reads_its_413_and_the_linger_ends() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(
        |c| c.body_limit_bytes = 1024,
        &[("m", one("a", up.base_url()))],
    )
    .await;
    // Far more than the socket buffers hold: the client is still writing when the
    // gateway answers and closes. Without lingering, the close resets the connection
    // with the body unread, and the reset can destroy the answer before it is read.
    let len = 8 << 20;
    let s = TcpStream::connect(gw.addr).await.unwrap();
    let (mut rx, mut tx) = s.into_split();
    let sending = tokio::spawn(async move {
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-length: {len}\r\n\r\n"
        );
        tx.write_all(head.as_bytes()).await.ok()?;
        let block = vec![b' '; 64 * 1024];
        for _ in 0..len / block.len() {
            tx.write_all(&block).await.ok()?;
        }
        Some(tx)
    });
    // A client busy writing reads its answer late: long after the gateway's close.
    tokio::time::sleep(LINGER / 2).await;
    let mut all = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let deadline = Instant::now() + WITHIN;
    while !String::from_utf8_lossy(&all).contains("body_too_large") {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => all.extend_from_slice(&buf[..n]),
            other => panic!(
                "no 413 before {other:?}; read: {}",
                String::from_utf8_lossy(&all)
            ),
        }
    }
    let text = String::from_utf8_lossy(&all);
    assert!(
        text.starts_with("HTTP/1.1 413 Payload Too Large\r\n"),
        "{text}"
    );
    assert!(text.contains("connection: close\r\n"), "{text}");
    // The gateway stops reading after LINGER: the client's writes then fail.
    let ended = tokio::time::timeout(LINGER + WITHIN, sending).await;
    assert!(ended.is_ok(), "the gateway read the refused body for ever");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_request_with_any_transfer_coding_but_chunked_alone_is_refused_with_501_and_the_connection_closed()
 {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let codings = ["gzip, chunked", "gzip", "identity", "chunked, gzip"];
    for coding in codings {
        let wire = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\n\
             transfer-encoding: {coding}\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n\
             GET /metrics HTTP/1.1\r\nhost: g\r\n\r\n"
        );
        let text = one_answer_then_close(gw.addr, &wire, "501 Not Implemented").await;
        assert!(
            text.contains("\"code\":\"not_implemented\""),
            "{coding}: {text}"
        );
        assert!(text.contains("connection: close\r\n"), "{text}");
    }
    assert!(up.seen().is_empty(), "nothing reached the site");
    let metrics = gw.metrics().await;
    assert_eq!(
        series(
            &metrics,
            r#"grid_gateway_requests_total{outcome="not_implemented"}"#
        ),
        codings.len() as u64,
        "{metrics}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn an_http_1_1_request_without_host_or_with_two_is_refused_and_http_1_0_needs_none() {
    let gw = start_gateway(|_| {}, &[("m", one("a", "http://127.0.0.1:9".into()))]).await;
    for wire in [
        "GET /healthz HTTP/1.1\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nhost: g\r\nhost: h\r\n\r\n",
    ] {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(wire.as_bytes()).await.unwrap();
        let text = read_to_close(&mut s).await;
        assert!(
            text.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{wire:?}: {text}"
        );
        assert!(text.contains("\"code\":\"invalid_request\""), "{text}");
    }
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").await.unwrap();
    let text = read_to_close(&mut s).await;
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_request_body_with_a_bare_lf_in_a_chunk_extension_is_refused_with_400() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(|_| {}, &[("m", one("a", up.base_url()))]).await;
    let body = chat("m", "x");
    // Read by a parser that ends the chunk line at the LF, the extension is a chunk of
    // its own: the two would disagree on where the body ends.
    let wire = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ntransfer-encoding: chunked\r\n\r\n\
         {:x};a\nb\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(wire.as_bytes()).await.unwrap();
    let text = read_to_close(&mut s).await;
    assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{text}");
    assert!(text.contains("control byte"), "{text}");
    assert!(up.seen().is_empty(), "nothing reached the site");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_site_answer_coded_other_than_chunked_alone_is_a_failed_exchange() {
    let (url, site) = raw_site(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
          transfer-encoding: gzip, chunked\r\n\r\n2\r\n\x1f\x8b\r\n0\r\n\r\n",
    )
    .await;
    let gw = start_gateway(|_| {}, &[("m", one("a", url))]).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(post(&chat("m", "hi"), "connection: close\r\n").as_bytes())
        .await
        .unwrap();
    let text = read_to_close(&mut s).await;
    assert!(text.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{text}");
    assert!(text.contains("\"code\":\"upstream_failed\""), "{text}");
    let metrics = gw.metrics().await;
    assert_eq!(
        series(
            &metrics,
            r#"grid_gateway_upstream_failures_total{site="a",reason="request"}"#
        ),
        1,
        "{metrics}"
    );
    gw.shutdown().await;
    site.abort();
}

#[tokio::test]
async fn a_site_answer_whose_first_chunk_has_a_nul_in_its_extension_is_a_failed_exchange() {
    let (url, site) = raw_site(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n\
          5;x=\x00\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    let gw = start_gateway(|_| {}, &[("m", one("a", url))]).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(post(&chat("m", "hi"), "connection: close\r\n").as_bytes())
        .await
        .unwrap();
    let text = read_to_close(&mut s).await;
    // Found with the head, before any of the answer was sent: a 502, not a 200 cut.
    assert!(text.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{text}");
    assert!(!text.contains("hello"), "{text}");
    gw.shutdown().await;
    site.abort();
}

#[tokio::test]
async fn a_client_waiting_for_100_continue_on_a_request_refused_by_its_head_gets_the_refusal() {
    let up = FakeModel::start("a").await;
    let gw = start_gateway(
        |c| c.body_limit_bytes = 1024,
        &[("m", one("a", up.base_url()))],
    )
    .await;
    for (head, status) in [
        (
            "POST /v1/nothing-here HTTP/1.1\r\nhost: g\r\ncontent-length: 10\r\n",
            "404 Not Found",
        ),
        (
            "PUT /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-length: 10\r\n",
            "405 Method Not Allowed",
        ),
        (
            "POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-length: 1025\r\n",
            "413 Payload Too Large",
        ),
    ] {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(format!("{head}expect: 100-continue\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let text = read_to_close(&mut s).await;
        assert!(
            text.starts_with(&format!("HTTP/1.1 {status}\r\n")),
            "{head:?}: {text}"
        );
        assert!(!text.contains("100 Continue"), "{text}");
        assert!(
            text.contains("connection: close\r\n"),
            "its body was not read: {text}"
        );
    }
    // A body at the limit is still asked for.
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-length: 1024\r\n\
          expect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    assert_eq!(
        read_until(&mut s, "\r\n\r\n").await,
        "HTTP/1.1 100 Continue\r\n\r\n"
    );
    drop(s);
    assert!(up.seen().is_empty());
    gw.shutdown().await;
}
