//! The answers a gateway makes itself instead of routing: OpenAI-style errors
//! (`{"error": {"message", "type", "code"}}`), one [`Refusal`] per reason.
//!
//! Every front end (the daemon's HTTP/1.1 and HTTP/2 servers, its Envoy external
//! processor, grid-pingora, the embedding example) refuses through these functions, so
//! the same request is refused with the same status, body and Retry-After whichever
//! front end carried it. Clients written for OpenAI-compatible servers (the official
//! SDKs retry on 429 and 5xx and honour Retry-After) understand them without knowing grid
//! exists.

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use grid_score::catalog::Upstream;
use grid_score::model_field::find_model;
use grid_score::routing::Route;
use http::{HeaderValue, Response, StatusCode, header};

/// Every way the gateway itself answers a request with an error. The label is the `code`
/// field and the metric reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ApiErrorKind {
    /// 400: the body is not JSON or has no usable `model`.
    BadRequest,
    /// 404: no such model.
    NotFound,
    /// 404: no such route.
    UnknownRoute,
    /// 405: the route exists with another method.
    MethodNotAllowed,
    /// 413: the body is larger than `bodyLimitBytes`.
    BodyTooLarge,
    /// 431: the HTTP/1.1 request head is larger than the gateway reads.
    HeadTooLarge,
    /// 501: the HTTP/1.1 request body has a transfer coding other than `chunked` alone.
    NotImplemented,
    /// 408: the body did not arrive whole within `clientBodyTimeoutSeconds`.
    BodyTimeout,
    /// 429: the model is shedding (every healthy site full).
    Shedding,
    /// 429: the request's connection already holds its share of the chosen site's slots
    /// (the daemon's per-connection share of a site).
    ConnectionShare,
    /// 503: every candidate of the model is excluded.
    Unavailable,
    /// 502: the chosen site failed before any byte of its answer was sent.
    UpstreamFailed,
    /// 504: the chosen site sent no answer head within `upstreamHeadersTimeoutSeconds`.
    UpstreamTimeout,
}

impl ApiErrorKind {
    /// The HTTP status.
    pub fn status(self) -> StatusCode {
        match self {
            Self::BadRequest => StatusCode::BAD_REQUEST,
            Self::NotFound | Self::UnknownRoute => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::HeadTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::NotImplemented => StatusCode::NOT_IMPLEMENTED,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::Shedding | Self::ConnectionShare => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::UpstreamFailed => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The OpenAI-style `type` field.
    pub fn error_type(self) -> &'static str {
        match self {
            Self::BadRequest
            | Self::NotFound
            | Self::UnknownRoute
            | Self::MethodNotAllowed
            | Self::BodyTooLarge
            | Self::HeadTooLarge
            | Self::NotImplemented
            | Self::BodyTimeout => "invalid_request_error",
            Self::Shedding | Self::ConnectionShare => "rate_limit_error",
            Self::Unavailable | Self::UpstreamFailed | Self::UpstreamTimeout => "server_error",
        }
    }

    /// The OpenAI-style `code` field, also the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadRequest => "invalid_request",
            Self::NotFound => "model_not_found",
            Self::UnknownRoute => "unknown_url",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::BodyTooLarge => "body_too_large",
            Self::HeadTooLarge => "head_too_large",
            Self::NotImplemented => "not_implemented",
            Self::BodyTimeout => "body_timeout",
            Self::Shedding => "shedding",
            Self::ConnectionShare => "connection_share",
            Self::Unavailable => "unavailable",
            Self::UpstreamFailed => "upstream_failed",
            Self::UpstreamTimeout => "upstream_timeout",
        }
    }
}

/// Builds the JSON answer; `retry_after_s` adds a Retry-After header.
pub fn error_response<B: From<Bytes>>(
    kind: ApiErrorKind,
    message: &str,
    retry_after_s: Option<u64>,
) -> Response<B> {
    let body = serde_json::json!({
        "error": { "message": message, "type": kind.error_type(), "code": kind.as_str() }
    });
    let mut resp = Response::new(B::from(Bytes::from(body.to_string())));
    *resp.status_mut() = kind.status();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(s) = retry_after_s {
        h.insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    resp
}

/// An answer the gateway makes itself instead of routing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Status, `type` and `code`.
    pub kind: ApiErrorKind,
    /// The `message`.
    pub message: String,
    /// Retry-After seconds, on 429 and 503.
    pub retry_after_s: Option<u64>,
}

impl Refusal {
    /// A refusal without Retry-After.
    pub fn new(kind: ApiErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// Where `route` sends a request for `model`, or why it is refused: 404 for a model
    /// not served here, 429 when every site is full, 503 when no site can serve it, both
    /// with Retry-After.
    ///
    /// # Errors
    ///
    /// The refusal, for every route but [`Route::To`].
    pub fn or_route<'v>(model: &str, route: Route<'v>) -> Result<&'v Upstream, Self> {
        match route {
            Route::To { upstream, .. } => Ok(upstream),
            Route::UnknownModel => Err(Self::new(
                ApiErrorKind::NotFound,
                format!("model {model:?} is not served here"),
            )),
            Route::Shed { retry_after_s } => Err(Self {
                retry_after_s: Some(retry_after_s),
                ..Self::new(
                    ApiErrorKind::Shedding,
                    format!("every site serving {model:?} is full; retry later"),
                )
            }),
            Route::Unavailable { retry_after_s } => Err(Self {
                retry_after_s: Some(retry_after_s),
                ..Self::new(
                    ApiErrorKind::Unavailable,
                    format!("no site can serve {model:?} now"),
                )
            }),
        }
    }

    /// 413: the body is larger than `bodyLimitBytes`.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            ApiErrorKind::BodyTooLarge,
            format!("the request body is larger than {limit} bytes"),
        )
    }

    /// 408: the body did not arrive whole within `bound` (`clientBodyTimeoutSeconds`).
    pub fn body_timeout(bound: Duration) -> Self {
        Self::new(
            ApiErrorKind::BodyTimeout,
            format!("the request body did not arrive within {bound:?}"),
        )
    }

    /// 400: the body could not be read (`why`, the reader's error).
    pub fn unreadable_body(why: &dyn std::fmt::Display) -> Self {
        Self::new(
            ApiErrorKind::BadRequest,
            format!("reading the request body: {why}"),
        )
    }

    /// 429: the request's connection already holds its share of the slots of the site
    /// chosen for `model`.
    pub fn connection_share(model: &str) -> Self {
        Self::new(
            ApiErrorKind::ConnectionShare,
            format!(
                "this connection already has its share of the requests in flight to the site chosen for {model:?}"
            ),
        )
    }

    /// 504: the site chosen for `model` sent no answer head in time.
    pub fn upstream_timed_out(model: &str) -> Self {
        Self::new(
            ApiErrorKind::UpstreamTimeout,
            format!("the site chosen for {model:?} sent no answer in time"),
        )
    }

    /// 502: the site chosen for `model` failed before answering.
    pub fn upstream_failed(model: &str) -> Self {
        Self::new(
            ApiErrorKind::UpstreamFailed,
            format!("the site chosen for {model:?} failed before answering"),
        )
    }

    /// The answer itself: status, JSON body, Retry-After when set.
    pub fn to_response<B: From<Bytes>>(&self) -> Response<B> {
        error_response(self.kind, &self.message, self.retry_after_s)
    }
}

/// The request body's `model` (a single-pass scan, `grid_score::model_field`), or 400.
///
/// # Errors
///
/// The 400 refusal, naming what the body lacks.
pub fn model_of(body: &[u8]) -> Result<Cow<'_, str>, Refusal> {
    find_model(body).map_err(|e| Refusal::new(ApiErrorKind::BadRequest, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_body_has_the_openai_shape() {
        let r: Response<Bytes> = error_response(ApiErrorKind::Shedding, "full", Some(3));
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
        let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(v["error"]["message"], "full");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(v["error"]["code"], "shedding");
    }

    #[test]
    fn no_retry_after_unless_asked() {
        let r: Response<Bytes> = error_response(ApiErrorKind::NotFound, "x", None);
        assert_eq!(r.status(), 404);
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
    }
}
