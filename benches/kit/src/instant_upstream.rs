//! An upstream that answers at once: the simulated site's OpenAI-style answers (the same
//! shapes, [`crate::sim_site::openai`]) with no queueing or service time, and an idle
//! EPP `/metrics`, so a benchmark of the gateway measures the gateway and the loopback,
//! not a model's sleep.
//!
//! Served on 127.0.0.1 (HTTP/1.1 and HTTP/2 with prior knowledge). A streamed answer is
//! sent as one frame per server-sent event, all ready at once.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::Error;
use crate::sim_site::openai::{self, Api, DONE, WORDS};
use grid_sim::fake_epp::{EppIdentity, FakeEpp};
use grid_sim::site_model::{SiteConfig, SiteModel};

/// Frames ready from the start.
struct Frames(VecDeque<Bytes>);

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

struct Answers {
    model: String,
    metrics: Bytes,
    full: Bytes,
    stream: Vec<Bytes>,
}

/// A running instant upstream. Dropping it stops accepting.
#[derive(Debug)]
pub struct InstantUpstream {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for InstantUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn respond(status: StatusCode, content_type: &'static str, frames: Vec<Bytes>) -> Response<Frames> {
    let mut r = Response::new(Frames(frames.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

async fn answer(answers: Arc<Answers>, request: Request<Incoming>) -> Response<Frames> {
    let route = (request.method().clone(), request.uri().path().to_owned());
    match (route.0, route.1.as_str()) {
        (Method::GET, "/metrics") => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            vec![answers.metrics.clone()],
        ),
        (Method::POST, "/v1/chat/completions") => {
            let Ok(body) = request.into_body().collect().await else {
                return respond(StatusCode::BAD_REQUEST, "text/plain", Vec::new());
            };
            match openai::parse_request(&body.to_bytes()) {
                Some(p) if p.model.as_deref() == Some(answers.model.as_str()) => {
                    if p.stream {
                        respond(StatusCode::OK, "text/event-stream", answers.stream.clone())
                    } else {
                        respond(
                            StatusCode::OK,
                            "application/json",
                            vec![answers.full.clone()],
                        )
                    }
                }
                _ => respond(StatusCode::BAD_REQUEST, "text/plain", Vec::new()),
            }
        }
        _ => respond(StatusCode::NOT_FOUND, "text/plain", Vec::new()),
    }
}

impl InstantUpstream {
    /// Binds 127.0.0.1 on a free port and serves `model`. Must run inside a tokio runtime.
    pub async fn start(model: &str) -> Result<Self, Error> {
        let idle = SiteModel::new(SiteConfig::new("instant", 1, 1024), 1)?;
        let metrics = FakeEpp::new(EppIdentity::new("instant", model)).render(&idle);
        let stream = (0..=WORDS.len())
            .map(|i| Bytes::from(openai::stream_chunk(Api::Chat, 1, model, "instant-ep-0", i)))
            .chain(std::iter::once(Bytes::from_static(DONE.as_bytes())))
            .collect();
        let answers = Arc::new(Answers {
            model: model.to_owned(),
            metrics: Bytes::from(metrics),
            full: Bytes::from(
                openai::full_response(Api::Chat, 1, model, "instant-ep-0").to_string(),
            ),
            stream,
        });
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let answers = Arc::clone(&answers);
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let answers = Arc::clone(&answers);
                        async move { Ok::<_, Infallible>(answer(answers, request).await) }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { addr, task })
    }

    /// `http://127.0.0.1:port`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{LoadClient, Protocol, chat_body};
    use std::time::Duration;

    #[tokio::test]
    async fn answers_chat_at_once_streamed_or_not_over_both_protocols() {
        let up = InstantUpstream::start("m").await.unwrap();
        let uri: http::Uri = format!("{}/v1/chat/completions", up.base_url())
            .parse()
            .unwrap();
        for protocol in [Protocol::Http1, Protocol::Http2] {
            let c = LoadClient::new(protocol, Duration::from_secs(5));
            let full = c.post_json(&uri, chat_body("m", false)).await.unwrap();
            assert_eq!(full.status, StatusCode::OK);
            let streamed = c.post_json(&uri, chat_body("m", true)).await.unwrap();
            assert_eq!(streamed.status, StatusCode::OK);
            assert!(streamed.bytes > full.bytes / 2, "{streamed:?}");
            let wrong = c.post_json(&uri, chat_body("other", false)).await.unwrap();
            assert_eq!(wrong.status, StatusCode::BAD_REQUEST);
        }
    }
}
