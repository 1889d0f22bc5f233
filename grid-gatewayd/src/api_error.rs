//! OpenAI-style error answers: `{"error": {"message", "type", "code"}}`.
//!
//! Clients written for OpenAI-compatible servers (the official SDKs retry on 429 and 5xx and honour
//! Retry-After) understand these without knowing grid exists.

use bytes::Bytes;
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
    /// (`site_slots::SITE_SHARE_DIVISOR`).
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
