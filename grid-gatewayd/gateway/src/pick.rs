//! One request's decision: the pick from the published view, counted, or the refusal.

use grid_score::catalog::Upstream;
use grid_score::routing::RoutingView;
use grid_score::{Decision, ScoreMetrics};

use crate::refusal::Refusal;
use crate::request_rng::ThreadRng;

/// Where one request goes. The headroom its client is told is the chosen site's own
/// band's, known once the site answers
/// ([`grid_score::live::LiveSlot::restated_headroom`]), not a figure of the pick.
#[derive(Debug)]
pub struct Routed<'v> {
    /// The chosen (site, provider).
    pub upstream: &'v Upstream,
}

/// Picks a site for `model` from `view` (one pick, counted in grid-score's decision
/// series `score`) or says how to refuse ([`Refusal::or_route`]).
///
/// # Errors
///
/// The refusal, when the view routes `model` nowhere.
pub fn decide<'v>(
    view: &'v RoutingView,
    score: &ScoreMetrics,
    model: &str,
) -> Result<Routed<'v>, Refusal> {
    // The model's snapshot is looked up once, and the pick counted on the series found
    // when the table was published.
    let snapshot = view.table().get(model);
    let decision = snapshot.map_or(Decision::UnknownModel, |s| s.pick(&mut ThreadRng));
    score.record_in(snapshot, &decision);
    let upstream = Refusal::or_route(model, view.route(model, &decision))?;
    upstream.tally().picked();
    Ok(Routed { upstream })
}
