//! `GET /v1/grid/routing`: why requests go where they go, read off the one routing view
//! the request path reads (one atomic load, no lock) and encoded off the request path.
//! The schema is grid-daemon's `evidence` (`docs/evidence.md`).

use grid_daemon::evidence::{
    CandidateRouting, Exclusion, GatewayRouting, LiveRoom, MAX_MODELS, ModelRouting, OperatorPolls,
    Recent,
};
use grid_score::catalog::TallyCounts;
use grid_score::routing::RoutingView;
use grid_score::{Candidate, CandidateEvidence, Excluded, Path, RouteSnapshot, UNMEASURED};

use grid_gateway::poller::{PollMetrics, PollResult};

/// Seconds from `ms` to `now_ms`, never negative.
fn age_s(now_ms: u64, ms: u64) -> f64 {
    now_ms.saturating_sub(ms) as f64 / 1_000.0
}

/// A finite value, or none (an unmeasured candidate's sentinel reads as none).
fn finite(v: f64) -> Option<f64> {
    (v.is_finite() && v != UNMEASURED).then_some(v)
}

/// What `model`'s requests did at each candidate, and the model's total picks.
fn recent_of(snapshot: &RouteSnapshot) -> (Vec<(&grid_score::CandidateKey, TallyCounts)>, u64) {
    let recent: Vec<_> = snapshot.recent().iter().map(|(k, c)| (k, *c)).collect();
    let total = recent.iter().map(|(_, c)| c.picks).sum();
    (recent, total)
}

fn recent_for(
    recent: &[(&grid_score::CandidateKey, TallyCounts)],
    total: u64,
    key: &grid_score::CandidateKey,
) -> Recent {
    let c = recent
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, c)| *c)
        .unwrap_or_default();
    Recent {
        picks: c.picks,
        share: (total > 0).then(|| c.picks as f64 / total as f64),
        refused: c.refused,
        failed: c.failed,
        retried_away: c.retried_away,
        retried_here: c.retried_here,
    }
}

fn live_room(now_ms: u64, e: &CandidateEvidence) -> Option<LiveRoom> {
    e.live_room.map(|r| LiveRoom {
        headroom: r.headroom,
        saturated: r.saturated,
        read_at_ms: r.stamp_ms,
        age_seconds: age_s(now_ms, r.stamp_ms),
    })
}

fn candidate(now_ms: u64, c: &Candidate, next_share: f64, recent: Recent) -> CandidateRouting {
    let e = c.evidence();
    let measured = c.state() != grid_score::CandidateState::Unmeasured;
    let turnover = c.signal().turnover_ms;
    CandidateRouting {
        site: c.key().site.to_string(),
        provider: c.key().provider.to_string(),
        standing: c.state().as_str().to_owned(),
        excluded: None,
        capacity: c.capacity(),
        soft_bound: e.soft_bound,
        hard_bound: e.hard_bound,
        rho: finite(c.rho()),
        score: finite(c.score()),
        headroom: measured.then_some(c.headroom()),
        live_factor: Some(c.live_factor()),
        turnover_seconds: (turnover >= 1.0).then(|| turnover / 1_000.0),
        signal_age_seconds: e.load_stamp_ms.map(|s| age_s(now_ms, s)),
        live_room: live_room(now_ms, e),
        failure_score: e.failures,
        full_until_ms: e.full_until_ms,
        next_share,
        recent,
    }
}

fn excluded(now_ms: u64, x: &Excluded, recent: Recent) -> CandidateRouting {
    let e = &x.evidence;
    CandidateRouting {
        site: x.key.site.to_string(),
        provider: x.key.provider.to_string(),
        standing: "excluded".to_owned(),
        excluded: Some(Exclusion {
            reason: x.reason.as_str().to_owned(),
            since_ms: x.since_ms,
            until_ms: x.until_ms,
        }),
        capacity: x.capacity,
        soft_bound: e.soft_bound,
        hard_bound: e.hard_bound,
        rho: None,
        score: None,
        headroom: None,
        live_factor: None,
        turnover_seconds: None,
        signal_age_seconds: e.load_stamp_ms.map(|s| age_s(now_ms, s)),
        live_room: live_room(now_ms, e),
        failure_score: e.failures,
        full_until_ms: e.full_until_ms,
        next_share: 0.0,
        recent,
    }
}

/// What a model's snapshot says of it, in the words `/readyz` uses (as labels).
fn state_of(view: &RoutingView, snapshot: &RouteSnapshot) -> &'static str {
    if snapshot.candidates().is_empty() {
        "unroutable"
    } else if snapshot.path() == Some(Path::Fallback) {
        "without_signals"
    } else if view.is_shedding(snapshot.model()) {
        "shedding"
    } else {
        "routed_by_load"
    }
}

fn model(now_ms: u64, view: &RoutingView, snapshot: &RouteSnapshot) -> ModelRouting {
    let (recent, total) = recent_of(snapshot);
    let shares = snapshot.plan_shares();
    let mut candidates: Vec<CandidateRouting> = snapshot
        .candidates()
        .iter()
        .zip(shares)
        .map(|(c, share)| candidate(now_ms, c, share, recent_for(&recent, total, c.key())))
        .collect();
    candidates.extend(
        snapshot
            .excluded()
            .iter()
            .map(|x| excluded(now_ms, x, recent_for(&recent, total, &x.key))),
    );
    ModelRouting {
        name: snapshot.model().to_string(),
        state: state_of(view, snapshot).to_owned(),
        path: snapshot.path().map(|p| p.as_str().to_owned()),
        refreshed_at_ms: snapshot.refreshed_at_ms(),
        grid_headroom: snapshot.grid_headroom(),
        candidates,
    }
}

/// The document for `view` at `now_ms`: every model in configuration order up to
/// [`MAX_MODELS`], or only `only` when given (none when it is not configured).
pub(crate) fn document(
    site: &str,
    view: &RoutingView,
    poll: &PollMetrics,
    only: Option<&str>,
    now_ms: u64,
) -> GatewayRouting {
    let snapshots: Vec<&RouteSnapshot> = view
        .catalog()
        .models()
        .iter()
        .filter(|m| only.is_none_or(|name| &*m.name == name))
        .filter_map(|m| view.table().get(&m.name))
        .collect();
    let left_out = snapshots.len().saturating_sub(MAX_MODELS);
    let models = snapshots
        .iter()
        .take(MAX_MODELS)
        .map(|s| model(now_ms, view, s))
        .collect();
    let span_ms = snapshots.first().map_or(0, |s| s.recent_span_ms());
    let ok = poll.polls(PollResult::Ok);
    let failed = PollResult::ALL
        .into_iter()
        .filter(|r| *r != PollResult::Ok)
        .map(|r| poll.polls(r))
        .sum();
    GatewayRouting {
        daemon: "gateway".to_owned(),
        site: site.to_owned(),
        generated_at_ms: now_ms,
        operator: OperatorPolls {
            ok,
            failed,
            last_failure: poll
                .last_failure()
                .map(grid_daemon::evidence::bounded_cause),
        },
        window_seconds: span_ms as f64 / 1_000.0,
        models,
        models_left_out: left_out,
    }
}

/// The `model` a query asks for (`model=NAME`, percent-decoded), when it asks.
pub(crate) fn model_query(query: Option<&str>) -> Option<String> {
    let value = query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("model="))?;
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    out.push(b);
                    i += 3;
                } else {
                    out.push(b'%');
                    i += 1;
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_document_a_configuration_allows_fits_the_document_cap() {
        use grid_daemon::evidence::MAX_DOCUMENT_BYTES;
        use grid_gateway::config::MAX_CANDIDATES_PER_MODEL;
        use grid_score::model_field::MAX_MODEL_NAME_BYTES;
        // Every name at its longest, every optional field present, every number at its
        // longest printed form.
        let label = "s".repeat(63);
        let x = -1.234_567_890_123_456_7e-300_f64;
        let candidate = CandidateRouting {
            site: label.clone(),
            provider: label.clone(),
            standing: "unmeasured".into(),
            excluded: Some(Exclusion {
                reason: "unit_series_stopped".into(),
                since_ms: Some(u64::MAX),
                until_ms: Some(u64::MAX),
            }),
            capacity: x,
            soft_bound: Some(x),
            hard_bound: Some(x),
            rho: Some(x),
            score: Some(x),
            headroom: Some(x),
            live_factor: Some(x),
            turnover_seconds: Some(x),
            signal_age_seconds: Some(x),
            live_room: Some(LiveRoom {
                headroom: Some(u64::MAX),
                saturated: true,
                read_at_ms: u64::MAX,
                age_seconds: x,
            }),
            failure_score: x,
            full_until_ms: Some(u64::MAX),
            next_share: x,
            recent: Recent {
                picks: u64::MAX,
                share: Some(x),
                refused: u64::MAX,
                failed: u64::MAX,
                retried_away: u64::MAX,
                retried_here: u64::MAX,
            },
        };
        let model = ModelRouting {
            name: "m".repeat(MAX_MODEL_NAME_BYTES),
            state: "without_signals".into(),
            path: Some("by_capacity".into()),
            refreshed_at_ms: u64::MAX,
            grid_headroom: Some(u64::MAX),
            candidates: vec![candidate; MAX_CANDIDATES_PER_MODEL],
        };
        let doc = GatewayRouting {
            daemon: "gateway".into(),
            site: label,
            generated_at_ms: u64::MAX,
            operator: OperatorPolls {
                ok: u64::MAX,
                failed: u64::MAX,
                last_failure: Some("f".repeat(grid_daemon::evidence::MAX_CAUSE_CHARS)),
            },
            window_seconds: x,
            models: vec![model; MAX_MODELS],
            models_left_out: usize::MAX,
        };
        let bytes = serde_json::to_vec(&doc).unwrap().len();
        assert!(bytes <= MAX_DOCUMENT_BYTES, "{bytes} bytes");
    }

    #[test]
    fn a_model_query_is_percent_decoded_and_absent_without_one() {
        assert_eq!(model_query(None), None);
        assert_eq!(model_query(Some("x=1")), None);
        assert_eq!(
            model_query(Some("x=1&model=meta%2Fllama+3")).as_deref(),
            Some("meta/llama 3")
        );
        assert_eq!(model_query(Some("model=50%")).as_deref(), Some("50%"));
    }
}
