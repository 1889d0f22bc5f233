//! One table of requests through every front end of grid-gateway: the daemon's own
//! HTTP/1.1 server, its HTTP/2 server, a real Envoy with the daemon's external
//! processor, grid-pingora's proxy and the embedding example. All are started from one
//! gateway configuration and poll one fake operator (a site with room for `open`, a full
//! one for `full`, one without ready endpoints for `down`); for every row each front end
//! gives the same status, the same OpenAI-style body and the same Retry-After.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use grid_gateway::Config;
use grid_gateway::config::Shedding;
use grid_gatewayd::driver::{self, Running};
use grid_kit::envoy::Envoy;
use grid_kit::gateway_harness::fake_model::FakeModel;
use grid_kit::gateway_harness::fake_operator::{FakeOperator, SiteLoad};
use grid_kit::gateway_harness::{Cand, closed_port_url};
use grid_kit::pingora_proxy::PingoraProxy;
use grid_kit::pki::{Ca, server_config};
use http::{Method, Request, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

// The example itself, compiled into this test: its `serve` is what the table runs
// (its `main` is not).
#[allow(dead_code, unreachable_pub)]
#[path = "../../../grid-gatewayd/gateway/examples/embedded_proxy.rs"]
mod embedded_proxy;

/// The body limit of every front end: the most grid-pingora can hold.
const LIMIT: usize = grid_pingora::MAX_REPLAYED_BODY_BYTES;
/// Retry-After of a shed model.
const SHED_RETRY_AFTER_S: u64 = 2;
/// Retry-After of a model no site can serve.
const UNAVAILABLE_RETRY_AFTER_S: u64 = 7;
/// Until every front end has polled the operator and sees what it relays.
const SETTLED_WITHIN: Duration = Duration::from_secs(20);
/// One exchange.
const EXCHANGE: Duration = Duration::from_secs(10);

type Body = BoxBody<Bytes, Infallible>;

/// A request of the table.
struct Row {
    name: &'static str,
    method: Method,
    path: &'static str,
    body: Bytes,
    /// Sent without a length (chunked over HTTP/1.1): judged as it is read, not by its head.
    unframed: bool,
    expect: Expect,
}

/// What every front end must answer.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Proxied to site `a`, which answers 200.
    Routed,
    /// Refused by grid with this status, code and Retry-After.
    Refused(u16, &'static str, Option<u64>),
}

fn chat(model: &str) -> Bytes {
    Bytes::from(format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#
    ))
}

/// A chat request for `open` padded to exactly `len` bytes.
fn chat_of_length(len: usize) -> Bytes {
    let head = r#"{"model":"open","messages":[],"pad":""#;
    let tail = r#""}"#;
    let pad = "x".repeat(len - head.len() - tail.len());
    Bytes::from(format!("{head}{pad}{tail}"))
}

fn table() -> Vec<Row> {
    let row = |name, method, path, body, expect| Row {
        name,
        method,
        path,
        body,
        unframed: false,
        expect,
    };
    let chat_path = "/v1/chat/completions";
    vec![
        row(
            "routed",
            Method::POST,
            chat_path,
            chat("open"),
            Expect::Routed,
        ),
        row(
            "unknown model",
            Method::POST,
            chat_path,
            chat("nosuch"),
            Expect::Refused(404, "model_not_found", None),
        ),
        row(
            "every site full",
            Method::POST,
            chat_path,
            chat("full"),
            Expect::Refused(429, "shedding", Some(SHED_RETRY_AFTER_S)),
        ),
        row(
            "no site can serve",
            Method::POST,
            chat_path,
            chat("down"),
            Expect::Refused(503, "unavailable", Some(UNAVAILABLE_RETRY_AFTER_S)),
        ),
        row(
            "no model",
            Method::POST,
            chat_path,
            Bytes::from_static(br#"{"messages":[]}"#),
            Expect::Refused(400, "invalid_request", None),
        ),
        row(
            "body at the limit",
            Method::POST,
            chat_path,
            chat_of_length(LIMIT),
            Expect::Routed,
        ),
        row(
            "declared body over the limit",
            Method::POST,
            chat_path,
            chat_of_length(LIMIT + 1),
            Expect::Refused(413, "body_too_large", None),
        ),
        Row {
            unframed: true,
            ..row(
                "unframed body over the limit",
                Method::POST,
                chat_path,
                chat_of_length(LIMIT + 1),
                Expect::Refused(413, "body_too_large", None),
            )
        },
        row(
            "wrong method",
            Method::GET,
            chat_path,
            Bytes::new(),
            Expect::Refused(405, "method_not_allowed", None),
        ),
        row(
            "unknown route",
            Method::POST,
            "/v2/anything",
            chat("open"),
            Expect::Refused(404, "unknown_url", None),
        ),
    ]
}

/// One answer, as compared across front ends.
#[derive(Debug, PartialEq)]
struct Answer {
    status: StatusCode,
    /// The JSON body of a refusal; `None` for a routed answer.
    body: Option<serde_json::Value>,
    retry_after: Option<String>,
    site: Option<String>,
}

/// Where a front end is reached, and how.
struct FrontEnd {
    name: &'static str,
    addr: SocketAddr,
    http2: bool,
}

fn client(http2: bool) -> Client<HttpConnector, Body> {
    Client::builder(TokioExecutor::new())
        .http2_only(http2)
        .build(HttpConnector::new())
}

async fn ask(front: &FrontEnd, row: &Row) -> Answer {
    let body: Body = if row.unframed {
        let frames = futures::stream::iter([Ok::<_, Infallible>(Frame::data(row.body.clone()))]);
        StreamBody::new(frames).boxed()
    } else {
        Full::new(row.body.clone()).boxed()
    };
    let mut req = Request::builder()
        .method(row.method.clone())
        .uri(format!("http://{}{}", front.addr, row.path));
    if !row.body.is_empty() {
        req = req.header("content-type", "application/json");
    }
    let exchange = async {
        let resp = client(front.http2)
            .request(req.body(body).unwrap())
            .await
            .unwrap_or_else(|e| panic!("{}: {}: {e}", front.name, row.name));
        let (parts, body) = resp.into_parts();
        let bytes = body
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes)
            .unwrap_or_default();
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let site = header("x-grid-site");
        Answer {
            status: parts.status,
            body: site
                .is_none()
                .then(|| serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null)),
            retry_after: header("retry-after"),
            site,
        }
    };
    tokio::time::timeout(EXCHANGE, exchange)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{}: {}: no answer within {EXCHANGE:?}",
                front.name, row.name
            )
        })
}

fn meets(answer: &Answer, expect: Expect) -> bool {
    match expect {
        Expect::Routed => answer.status == StatusCode::OK && answer.site.as_deref() == Some("a"),
        Expect::Refused(status, code, retry_after) => {
            answer.status.as_u16() == status
                && answer
                    .body
                    .as_ref()
                    .is_some_and(|b| b["error"]["code"] == code)
                && answer.retry_after == retry_after.map(|s| s.to_string())
        }
    }
}

/// The gateway configuration every front end starts from.
fn config(dir: &std::path::Path, pki: &Ca, operator: &FakeOperator, open_site: String) -> Config {
    let mut config = grid_kit::gateway_harness::config(
        dir,
        pki,
        &operator.url(),
        &[
            ("open", vec![Cand::at("a", open_site)]),
            ("full", vec![Cand::at("b", closed_port_url())]),
            ("down", vec![Cand::at("c", closed_port_url())]),
        ],
    );
    config.operator.poll_interval_ms = 200;
    config.body_limit_bytes = LIMIT;
    config.unavailable_retry_after_s = UNAVAILABLE_RETRY_AFTER_S;
    config.availability.shedding = Shedding {
        enabled: true,
        full_after_ms: Some(1),
        room_after_ms: Some(60_000),
        retry_after_s: Some(SHED_RETRY_AFTER_S),
    };
    config.ext_proc_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    config.validate().unwrap();
    config
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// `row`'s answer from `front` once it meets the row's expectation, asked again every
/// 100 ms until [`SETTLED_WITHIN`] has passed on `clock`.
async fn settled_answer(
    front: &FrontEnd,
    row: &Row,
    clock: &grid_kit::clock::Stopwatch,
    envoy: &Envoy,
) -> Answer {
    loop {
        // A listener that is not up yet (Pingora's opens once its services run).
        let mut answer = match tokio::net::TcpStream::connect(front.addr).await {
            Ok(_) => Some(ask(front, row).await),
            Err(_) => None,
        };
        if let Some(met) = answer.take_if(|a| meets(a, row.expect)) {
            return met;
        }
        assert!(
            clock.elapsed() < SETTLED_WITHIN,
            "{}: {}: not {:?} within {SETTLED_WITHIN:?}: {answer:?}\nenvoy: {}",
            front.name,
            row.name,
            row.expect,
            envoy.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_front_end_refuses_the_same_request_with_the_same_answer() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Ca::new("grid-ca");
    let op_files = pki.issue(dir.path(), "operator", &["operator.a.grid"]);
    let operator = FakeOperator::start(server_config(&op_files, &pki.pem())).await;
    operator.set("a", SiteLoad::idle());
    operator.set("b", SiteLoad::full());
    operator.set(
        "c",
        SiteLoad {
            ready_endpoints: 0,
            ..SiteLoad::idle()
        },
    );
    let site = FakeModel::start("a").await;
    let config = config(dir.path(), &pki, &operator, site.base_url());

    let daemon: Running = driver::start(config.clone()).await.unwrap();
    let envoy_port = free_addr().port();
    let envoy = Envoy::start(
        &grid_kit::envoy::ext_proc_bootstrap(envoy_port, daemon.ext_proc_addr().unwrap()),
        dir.path(),
        envoy_port,
    )
    .await
    .expect("envoy starts");
    let pingora = PingoraProxy::start(&Config {
        listen: free_addr(),
        ..config.clone()
    })
    .expect("grid-pingora starts");
    let example_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let example_addr = example_listener.local_addr().unwrap();
    let example_config = config.clone();
    let example =
        tokio::spawn(async move { embedded_proxy::serve(&example_config, example_listener).await });

    let fronts = [
        FrontEnd {
            name: "daemon, HTTP/1.1",
            addr: daemon.local_addr(),
            http2: false,
        },
        FrontEnd {
            name: "daemon, HTTP/2",
            addr: daemon.local_addr(),
            http2: true,
        },
        FrontEnd {
            name: "Envoy with the daemon's external processor",
            addr: envoy.listen,
            http2: false,
        },
        FrontEnd {
            name: "grid-pingora",
            addr: pingora.listen(),
            http2: false,
        },
        FrontEnd {
            name: "the embedding example",
            addr: example_addr,
            http2: false,
        },
    ];
    let rows = table();
    // Each front end polls on its own: until each sees the operator's relay, every row.
    let clock = grid_kit::clock::Stopwatch::start();
    let mut answers = Vec::new();
    for front in &fronts {
        let mut mine = Vec::new();
        for row in &rows {
            mine.push(settled_answer(front, row, &clock, &envoy).await);
        }
        answers.push(mine);
    }
    // The same answer, body included, from every front end for every row.
    for (i, row) in rows.iter().enumerate() {
        let first = &answers[0][i];
        for (front, theirs) in fronts.iter().zip(&answers).skip(1) {
            assert_eq!(
                &theirs[i], first,
                "{}: {} answers differently from {}",
                row.name, front.name, fronts[0].name
            );
        }
    }
    example.abort();
    drop(pingora);
    drop(envoy);
    tokio::time::timeout(Duration::from_secs(10), daemon.shutdown())
        .await
        .expect("the daemon stops in time");
}
