//! The answer when grid sends a request nowhere: grid-gateway's refusals, the same
//! status, OpenAI-style body and Retry-After every other front end gives, and the body
//! limit Pingora can honour.

use bytes::Bytes;
use grid_gateway::Config;
use grid_gateway::refusal::Refusal;
use grid_gateway::request_rng::ThreadRng;
use grid_score::routing::RoutingView;

use crate::Error;

/// The largest request body grid-pingora can route: the model is read from the whole
/// body before the site is chosen, and Pingora sends a body read that early upstream
/// only from its retry buffer, which holds this much (`BODY_BUF_LIMIT`).
pub const MAX_REPLAYED_BODY_BYTES: usize = 64 * 1024;

/// The answer to a request for `model` that [`crate::GridSelection`] gave no backend:
/// the view's pick says why (a refusal is rare and a pick is tens of nanoseconds). `None`
/// when the pick, asked again, routes after all (the view changed in between): the caller
/// selects again.
pub fn refusal(view: &RoutingView, model: &str) -> Option<http::Response<Bytes>> {
    let decision = view.pick(model, &mut ThreadRng);
    Refusal::or_route(model, view.route(model, &decision))
        .err()
        .map(|refused| refused.to_response())
}

/// `config`'s `bodyLimitBytes`, the limit every front end refuses a body above, when
/// grid-pingora can honour it.
///
/// # Errors
///
/// [`Error::BodyLimit`] when it is above [`MAX_REPLAYED_BODY_BYTES`]: a proxy that
/// refused at a lower limit than the daemon would answer the same request differently.
pub fn body_limit(config: &Config) -> Result<usize, Error> {
    let configured = config.body_limit_bytes;
    if configured > MAX_REPLAYED_BODY_BYTES {
        return Err(Error::BodyLimit {
            configured,
            most: MAX_REPLAYED_BODY_BYTES,
        });
    }
    Ok(configured)
}
