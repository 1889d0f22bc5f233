//! The gateway API's routing table: where a request is answered, judged by its method,
//! path and declared body length alone, before a byte of the body is read.
//!
//! The daemon's servers and its Envoy external processor answer every [`Target`];
//! grid-pingora and the embedding example proxy [`Target::Proxied`] and refuse the rest
//! as unknown routes. All of them judge a head here, so a wrong method or an oversized
//! declared body is refused the same way by each.

use grid_daemon::{evidence, probe};
use http::Method;

use crate::refusal::{ApiErrorKind, Refusal};

/// The routes that carry a `model` and are proxied.
pub const PROXIED_PATHS: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];

/// Where a request is answered. Exhaustive on purpose: a new route makes every front
/// end that matches on it decide how to answer it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A `POST` to one of [`PROXIED_PATHS`]: routed by its `model`.
    Proxied,
    /// `GET /v1/models`.
    Models,
    /// `GET /metrics`.
    Metrics,
    /// `GET /healthz`.
    Healthz,
    /// `GET /readyz`.
    Readyz,
    /// `GET /v1/grid/routing`: the routing evidence, beside `/metrics`.
    Routing,
}

/// The [`Target`] of `method` on `path`, or the refusal: 405 on a known route with the
/// wrong method, 404 otherwise.
///
/// # Errors
///
/// The refusal, when no route takes `method` on `path`.
pub fn classify(method: &Method, path: &str) -> Result<Target, Refusal> {
    let get = method == Method::GET;
    if PROXIED_PATHS.contains(&path) {
        if method == Method::POST {
            Ok(Target::Proxied)
        } else {
            Err(Refusal::new(ApiErrorKind::MethodNotAllowed, "use POST"))
        }
    } else if path == "/v1/models" {
        if get {
            Ok(Target::Models)
        } else {
            Err(Refusal::new(ApiErrorKind::MethodNotAllowed, "use GET"))
        }
    } else if get && path == "/metrics" {
        Ok(Target::Metrics)
    } else if get && path == evidence::ROUTING_PATH {
        Ok(Target::Routing)
    } else if get && path == probe::HEALTHZ_PATH {
        Ok(Target::Healthz)
    } else if get && path == probe::READYZ_PATH {
        Ok(Target::Readyz)
    } else {
        Err(unknown_route(path))
    }
}

/// 404 for `path`, which no route of this front end serves.
pub fn unknown_route(path: &str) -> Refusal {
    Refusal::new(ApiErrorKind::UnknownRoute, format!("no route {path}"))
}

/// [`classify`], and for a proxied request the body length its head declares: 413 above
/// `body_limit` (`bodyLimitBytes`), before a byte of the body is read, so a client
/// waiting to send its body (`Expect: 100-continue`) is refused instead of invited to.
///
/// # Errors
///
/// The refusal, when the head alone already refuses the request.
pub fn admit(
    method: &Method,
    path: &str,
    declared_len: u64,
    body_limit: usize,
) -> Result<Target, Refusal> {
    let target = classify(method, path)?;
    if target == Target::Proxied && declared_len > body_limit as u64 {
        return Err(Refusal::too_large(body_limit));
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxied_path_takes_only_post_and_the_models_list_only_get() {
        for path in PROXIED_PATHS {
            assert_eq!(classify(&Method::POST, path), Ok(Target::Proxied));
            let refused = classify(&Method::GET, path).unwrap_err();
            assert_eq!(refused.kind, ApiErrorKind::MethodNotAllowed);
        }
        assert_eq!(classify(&Method::GET, "/v1/models"), Ok(Target::Models));
        let refused = classify(&Method::POST, "/v1/models").unwrap_err();
        assert_eq!(refused.kind, ApiErrorKind::MethodNotAllowed);
        let refused = classify(&Method::POST, "/v2/anything").unwrap_err();
        assert_eq!(refused.kind, ApiErrorKind::UnknownRoute);
    }

    #[test]
    fn a_declared_body_at_the_limit_is_admitted_and_one_byte_more_is_refused() {
        let path = PROXIED_PATHS[0];
        assert_eq!(admit(&Method::POST, path, 100, 100), Ok(Target::Proxied));
        let refused = admit(&Method::POST, path, 101, 100).unwrap_err();
        assert_eq!(refused.kind, ApiErrorKind::BodyTooLarge);
        // Only a proxied body is judged by its length.
        assert_eq!(
            admit(&Method::GET, "/metrics", 101, 100),
            Ok(Target::Metrics)
        );
    }
}
