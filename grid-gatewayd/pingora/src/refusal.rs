//! The answer when grid sends a request nowhere: the gateway's own statuses and
//! OpenAI-style bodies (429 with Retry-After when shedding, 503 with Retry-After when no
//! site can serve, 404 for a model not served here, 400 for a body without a model).

use bytes::Bytes;
use grid_gatewayd::api_error::{ApiErrorKind, error_response};
use grid_gatewayd::request_rng::ThreadRng;
use grid_score::routing::{Route, RoutingView};

/// The answer to a request for `model` that [`crate::GridSelection`] gave no backend:
/// the view's pick says why (a refusal is rare and a pick is tens of nanoseconds). `None`
/// when the pick, asked again, routes after all (the view changed in between): the caller
/// selects again.
pub fn refusal(view: &RoutingView, model: &str) -> Option<http::Response<Bytes>> {
    let decision = view.pick(model, &mut ThreadRng);
    let (kind, message, retry_after_s) = match view.route(model, &decision) {
        Route::To { .. } => return None,
        Route::Shed { retry_after_s } => (
            ApiErrorKind::Shedding,
            format!("every site serving {model:?} is full; retry later"),
            Some(retry_after_s),
        ),
        Route::Unavailable { retry_after_s } => (
            ApiErrorKind::Unavailable,
            format!("no site can serve {model:?} now"),
            Some(retry_after_s),
        ),
        Route::UnknownModel => (
            ApiErrorKind::NotFound,
            format!("model {model:?} is not served here"),
            None,
        ),
    };
    Some(error_response(kind, &message, retry_after_s))
}

/// The answer to a body in which no model can be found.
pub fn no_model(why: &str) -> http::Response<Bytes> {
    error_response(ApiErrorKind::BadRequest, why, None)
}

/// The answer to a body longer than the proxy holds to find its model.
pub fn too_large(limit: usize) -> http::Response<Bytes> {
    error_response(
        ApiErrorKind::BodyTooLarge,
        &format!("the request body is larger than {limit} bytes"),
        None,
    )
}
