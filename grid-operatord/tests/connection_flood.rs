//! A flood of peer connections (completed handshakes or half-open) never locks the local
//! gateway out of the signals listener.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use grid_daemon::client::{FetchTarget, fetch};
use grid_daemon::tls::{Identity, Trust, client_config, server_config};
use grid_kit::pki::{Ca, SiteCert};
use grid_operatord::listener::{Handler, HandlerFuture, Listener, ListenerMetrics, Timeouts};
use grid_operatord::slots::{MAX_PEER_CONNECTIONS, ShedReason, Slots};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use rustls::RootCertStore;
use rustls_pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};

/// Answers with who the listener says is calling.
struct WhoAmI;

impl Handler for WhoAmI {
    fn handle(&self, caller: Option<Identity>, _request: Request<Incoming>) -> HandlerFuture {
        let body = match caller {
            Some(Identity::Local) => "local".to_owned(),
            Some(Identity::Peer(p)) => format!("peer {p}"),
            None => "nobody".to_owned(),
        };
        Box::pin(async move { Response::new(Full::new(Bytes::from(body))) })
    }
}

struct Setup {
    addr: std::net::SocketAddr,
    slots: Arc<Slots>,
    metrics: ListenerMetrics,
    trust: Arc<Trust>,
    ca: Ca,
    _server: tokio::task::JoinHandle<()>,
}

async fn start(timeouts: Timeouts) -> Setup {
    let ca = Ca::new("ca");
    let mut roots = RootCertStore::empty();
    roots.add(ca.cert()).unwrap();
    let trust = Arc::new(Trust::spiffe("a", "grid.test", roots));
    let tls = server_config(
        &SiteCert::material(&ca.site("grid.test", "a"), &ca),
        trust.clone(),
    )
    .unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let slots = Slots::new();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = ListenerMetrics::register(&mut registry);
    let listener = Listener {
        tcp,
        tls,
        trust: trust.clone(),
        slots: slots.clone(),
        metrics: metrics.clone(),
        timeouts,
        handler: Arc::new(WhoAmI),
    };
    Setup {
        addr,
        slots,
        metrics,
        trust,
        ca,
        _server: tokio::spawn(listener.run()),
    }
}

async fn ask(setup: &Setup, site: &str) -> Result<Vec<u8>, String> {
    ask_in(setup, "grid.test", site).await
}

/// [`ask`] with a certificate naming `site` in trust domain `domain`.
async fn ask_in(setup: &Setup, domain: &str, site: &str) -> Result<Vec<u8>, String> {
    let cert = setup.ca.site(domain, site);
    let tls = client_config(
        &SiteCert::material(&cert, &setup.ca),
        setup.trust.clone(),
        Identity::Local,
    )
    .unwrap();
    let target = FetchTarget::new(
        format!("https://127.0.0.1:{}/v1/site/signals", setup.addr.port())
            .parse()
            .unwrap(),
        Duration::from_secs(5),
        Some(tls),
    );
    fetch(&target)
        .await
        .map(|f| f.body)
        .map_err(|e| e.class.as_str().to_owned())
}

fn total_shed(m: &ListenerMetrics) -> u64 {
    ShedReason::ALL.iter().map(|r| m.shed_count(*r)).sum()
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..600 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_peer_connections_leave_room_for_the_local_gateway() {
    let setup = start(Timeouts {
        handshake: Duration::from_secs(10),
        header_read: Duration::from_secs(60),
        max_age: Duration::from_secs(300),
    })
    .await;
    let peer = setup.ca.site("grid.test", "b");
    let peer_tls = client_config(
        &SiteCert::material(&peer, &setup.ca),
        setup.trust.clone(),
        Identity::Local,
    )
    .unwrap();
    // 300 peers complete their handshakes and then hold their connections idle.
    let mut held = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..300 {
        let (addr, tls) = (setup.addr, peer_tls.clone());
        tasks.spawn(async move {
            let tcp = TcpStream::connect(addr).await.ok()?;
            tokio_rustls::TlsConnector::from(tls)
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await
                .ok()
        });
    }
    while let Some(r) = tasks.join_next().await {
        if let Some(stream) = r.unwrap() {
            held.push(stream);
        }
    }
    let m = setup.metrics.clone();
    let slots = setup.slots.clone();
    wait_until("248 peers settled and 52 shed", || {
        slots.held() == (MAX_PEER_CONNECTIONS, 0) && total_shed(&m) == 52
    })
    .await;
    assert_eq!(m.shed_count(ShedReason::HandshakeTimeout), 0);
    // The local gateway still gets its answer while the peers hold every general slot.
    let answer = tokio::time::timeout(Duration::from_secs(10), ask(&setup, "a"))
        .await
        .expect("local answered in time");
    assert_eq!(answer.unwrap(), b"local");
    // Another peer is still refused.
    assert!(ask(&setup, "b").await.is_err());
    assert_eq!(setup.slots.held().0, MAX_PEER_CONNECTIONS);
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_connections_cannot_squat_on_the_reserved_slots() {
    // The handshake timeout is far longer than the test: only eviction can let the
    // local gateway in.
    let setup = start(Timeouts {
        handshake: Duration::from_secs(120),
        header_read: Duration::from_secs(60),
        max_age: Duration::from_secs(300),
    })
    .await;
    let mut half_open = Vec::new();
    for _ in 0..300 {
        half_open.push(TcpStream::connect(setup.addr).await.unwrap());
    }
    let slots = setup.slots.clone();
    wait_until("every slot taken by half-open connections", || {
        slots.held() == (MAX_PEER_CONNECTIONS, 8)
    })
    .await;
    let answer = tokio::time::timeout(Duration::from_secs(10), ask(&setup, "a"))
        .await
        .expect("local answered in time");
    assert_eq!(answer.unwrap(), b"local");
    // 300 - 256 arrivals each evicted one reserved handshake, and the local gateway one more.
    let m = setup.metrics.clone();
    wait_until("45 evictions", || m.shed_count(ShedReason::Evicted) == 45).await;
    drop(half_open);
}

#[tokio::test]
async fn a_trusted_stranger_is_served_as_nobody_and_an_untrusted_one_is_refused() {
    let setup = start(Timeouts::default()).await;
    assert_eq!(ask(&setup, "b").await.unwrap(), b"peer b");
    // Every site of the trust domain is a peer; the same CA's certificate for another
    // domain is trusted by chain and is nobody.
    assert_eq!(ask(&setup, "zz").await.unwrap(), b"peer zz");
    assert_eq!(ask_in(&setup, "other.test", "zz").await.unwrap(), b"nobody");
    let rogue = Ca::new("rogue");
    let cert = rogue.site("grid.test", "a");
    let tls = client_config(
        &SiteCert::material(&cert, &setup.ca),
        setup.trust.clone(),
        Identity::Local,
    )
    .unwrap();
    let target = FetchTarget::new(
        format!("https://127.0.0.1:{}/", setup.addr.port())
            .parse()
            .unwrap(),
        Duration::from_secs(5),
        Some(tls),
    );
    assert!(fetch(&target).await.is_err());
    let m = setup.metrics.clone();
    wait_until("handshake failure counted", || m.handshake_failures() == 1).await;
}

#[tokio::test]
async fn a_silent_connection_is_closed_at_the_header_read_timeout() {
    let setup = start(Timeouts {
        handshake: Duration::from_secs(5),
        header_read: Duration::from_millis(300),
        max_age: Duration::from_secs(300),
    })
    .await;
    let cert = setup.ca.site("grid.test", "b");
    let tls = client_config(
        &SiteCert::material(&cert, &setup.ca),
        setup.trust.clone(),
        Identity::Local,
    )
    .unwrap();
    let tcp = TcpStream::connect(setup.addr).await.unwrap();
    let _stream = tokio_rustls::TlsConnector::from(tls)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let m = setup.metrics.clone();
    let slots = setup.slots.clone();
    wait_until("header timeout shed", || {
        m.shed_count(ShedReason::HeaderTimeout) == 1 && slots.held() == (0, 0)
    })
    .await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_at_the_header_read_timeout() {
    use http_body_util::{BodyExt, Empty};
    let setup = start(Timeouts {
        handshake: Duration::from_secs(5),
        header_read: Duration::from_millis(300),
        max_age: Duration::from_secs(300),
    })
    .await;
    let cert = setup.ca.site("grid.test", "b");
    let tls = client_config(
        &SiteCert::material(&cert, &setup.ca),
        setup.trust.clone(),
        Identity::Local,
    )
    .unwrap();
    let tcp = TcpStream::connect(setup.addr).await.unwrap();
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let request = Request::get("/v1/site/signals")
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"peer b");
    // The connection stays open for keep-alive, idle: the server closes it.
    let m = setup.metrics.clone();
    let slots = setup.slots.clone();
    wait_until("idle keep-alive closed", || {
        m.shed_count(ShedReason::HeaderTimeout) == 1 && slots.held() == (0, 0)
    })
    .await;
    // The client's connection ends (the server drops it without close_notify).
    let ended = tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("client saw the close");
    assert!(ended.is_ok());
}

#[tokio::test]
async fn a_connection_that_never_finishes_its_handshake_is_shed_at_the_handshake_timeout() {
    let setup = start(Timeouts {
        handshake: Duration::from_millis(300),
        header_read: Duration::from_secs(60),
        max_age: Duration::from_secs(300),
    })
    .await;
    let _silent = TcpStream::connect(setup.addr).await.unwrap();
    let m = setup.metrics.clone();
    let slots = setup.slots.clone();
    wait_until("handshake timeout shed", || {
        m.shed_count(ShedReason::HandshakeTimeout) == 1 && slots.held() == (0, 0)
    })
    .await;
}

#[tokio::test]
async fn a_busy_connection_is_closed_gracefully_at_its_maximum_age() {
    use http_body_util::{BodyExt, Empty};
    let setup = start(Timeouts {
        handshake: Duration::from_secs(5),
        header_read: Duration::from_secs(60),
        max_age: Duration::from_millis(500),
    })
    .await;
    let cert = setup.ca.site("grid.test", "a");
    let tls = client_config(
        &SiteCert::material(&cert, &setup.ca),
        setup.trust.clone(),
        Identity::Local,
    )
    .unwrap();
    let tcp = TcpStream::connect(setup.addr).await.unwrap();
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut answered = 0;
    // Requests every 100 ms keep the connection busy; it is still closed after its age.
    for _ in 0..50 {
        let request = Request::get("/v1/site/signals")
            .header("host", "localhost")
            .body(Empty::<Bytes>::new())
            .unwrap();
        match sender.send_request(request).await {
            Ok(response) => {
                let body = response.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(&body[..], b"local");
                answered += 1;
            }
            Err(_) => break,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!((3..=10).contains(&answered), "answered {answered} requests");
    let slots = setup.slots.clone();
    wait_until("slot freed", || slots.held() == (0, 0)).await;
}

/// A TLS stream to the listener as `site`, offering `alpn`.
async fn connect_offering(
    setup: &Setup,
    site: &str,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let cert = setup.ca.site("grid.test", site);
    let mut tls = (*client_config(
        &SiteCert::material(&cert, &setup.ca),
        setup.trust.clone(),
        Identity::Local,
    )
    .unwrap())
    .clone();
    tls.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(setup.addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_client_offering_h2_is_served_over_http2_and_one_offering_http11_over_http11() {
    use http_body_util::{BodyExt, Empty};
    let setup = start(Timeouts::default()).await;
    let stream = connect_offering(&setup, "a", &[b"h2", b"http/1.1"]).await;
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    // Two requests at once on the one connection.
    let ask = |sender: &mut hyper::client::conn::http2::SendRequest<Empty<Bytes>>| {
        let request = Request::get("https://localhost/v1/site/signals")
            .body(Empty::<Bytes>::new())
            .unwrap();
        sender.send_request(request)
    };
    let (first, second) = tokio::join!(ask(&mut sender.clone()), ask(&mut sender));
    for response in [first.unwrap(), second.unwrap()] {
        assert_eq!(response.version(), http::Version::HTTP_2);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"local");
    }
    let old = connect_offering(&setup, "b", &[b"http/1.1"]).await;
    assert_eq!(old.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
}

#[tokio::test]
async fn an_http2_connection_without_a_request_in_flight_is_closed_at_the_header_read_timeout() {
    use http_body_util::{BodyExt, Empty};
    let setup = start(Timeouts {
        handshake: Duration::from_secs(5),
        header_read: Duration::from_millis(300),
        max_age: Duration::from_secs(300),
    })
    .await;
    let stream = connect_offering(&setup, "b", &[b"h2"]).await;
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let request = Request::get("https://localhost/v1/site/signals")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"peer b");
    let m = setup.metrics.clone();
    let slots = setup.slots.clone();
    wait_until("idle HTTP/2 connection closed", || {
        m.shed_count(ShedReason::HeaderTimeout) == 1 && slots.held() == (0, 0)
    })
    .await;
    let ended = tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("client saw the close");
    assert!(ended.is_ok());
}

#[tokio::test]
async fn the_signals_listener_advertises_its_http2_stream_limit() {
    use grid_operatord::listener::H2_MAX_CONCURRENT_STREAMS;
    let setup = start(Timeouts::default()).await;
    let stream = connect_offering(&setup, "a", &[b"h2"]).await;
    let (_client, mut conn) = h2::client::handshake(stream).await.unwrap();
    // Driving the connection a moment reads the server's SETTINGS.
    let _ = tokio::time::timeout(Duration::from_millis(300), &mut conn).await;
    assert_eq!(
        conn.max_concurrent_send_streams(),
        H2_MAX_CONCURRENT_STREAMS as usize
    );
}
