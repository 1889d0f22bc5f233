//! What a site's answer head tells about the site, read once, whichever proxy carried it.
//!
//! The gateway's own proxy holds the answer's head as an [`http::HeaderMap`]; Envoy hands
//! grid's external processor the same head as a list of header protos and takes back a
//! mutation. Both go through [`take_live_evidence`], so the rule lives in one place: the
//! site's flow-control headers are read strictly (refusals counted), the answer's outcome
//! and its room signal are recorded in the site's live slot, every `x-llm-d-flow-*` header
//! the site sent is removed (the router owns those headers: a model server must not
//! speak for the grid), and the grid's own headroom and `x-grid-site` are set.
//! [`AnswerHeaders`] is the one thing the two callers differ in: how a head is read and
//! changed.

use grid_score::catalog::Upstream;
use grid_score::live;
use http::{HeaderName, HeaderValue, StatusCode};

use crate::engine::request_metrics::{FlowRefusalLabels, RequestMetrics, SiteLabels};
use grid_gateway::headers::SITE_HEADER;

/// A `Retry-After` value (RFC 9110 section 10.2.3: delay seconds, or an HTTP date) as
/// milliseconds from `now`; `None` when it is neither.
pub(crate) fn retry_after_ms(value: &[u8], now: std::time::SystemTime) -> Option<u64> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // Past u64's seconds, as far off as can be said (the hold is bounded anyway).
        return Some(
            text.parse::<u64>()
                .unwrap_or(u64::MAX)
                .saturating_mul(1_000),
        );
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(
        at.duration_since(now)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    )
}

/// An answer head as a proxy holds it: read in order, headers removed by name, set.
pub(crate) trait AnswerHeaders {
    /// Calls `f` with every header's (lowercase) name and raw value, in order, repeated
    /// names once per value.
    fn each(&self, f: &mut dyn FnMut(&str, &[u8]));
    /// Removes every value of `name` (lowercase).
    fn remove(&mut self, name: &str);
    /// Sets `name` to `value`, replacing whatever the site sent under it.
    fn set(&mut self, name: HeaderName, value: HeaderValue);
}

impl AnswerHeaders for http::HeaderMap {
    fn each(&self, f: &mut dyn FnMut(&str, &[u8])) {
        for (name, value) in self {
            f(name.as_str(), value.as_bytes());
        }
    }

    fn remove(&mut self, name: &str) {
        http::HeaderMap::remove(self, name);
    }

    fn set(&mut self, name: HeaderName, value: HeaderValue) {
        self.insert(name, value);
    }
}

/// What the request path needs to record live evidence: its counters and the poller's
/// off-cycle refresh.
#[derive(Clone, Copy)]
pub(crate) struct Evidence<'a> {
    /// `grid_gateway_flow_headers_refused_total`, `grid_gateway_upstream_error_answers_total`.
    pub(crate) metrics: &'a RequestMetrics,
    /// Woken when the answer said something about room or serving.
    pub(crate) live_refresh: &'a tokio::sync::Notify,
}

/// Reads the site's flow-control headers (strictly, refusals counted), records them and
/// the answer's outcome (a 5xx is a serving failure) in `upstream`'s live slot as room of
/// the request's `band`, removes every `x-llm-d-flow-*` header, and sets the grid's
/// `x-llm-d-flow-band-headroom-requests` and `x-grid-site` (to `site_header`, the site's
/// name as [`grid_gateway::headers::site_value`] makes it). The headroom the client sees
/// is the chosen site's own band's, as grid-score restates it
/// ([`live::LiveSlot::restated_headroom`]): never another band's or another site's. No
/// lock; allocates only when a site sent flow headers to strip; reads the wall clock once.
pub(crate) fn take_live_evidence(
    evidence: Evidence<'_>,
    upstream: &Upstream,
    band: live::BandKey,
    status: StatusCode,
    headers: &mut impl AnswerHeaders,
    site_header: Option<HeaderValue>,
) -> live::FlowObservation {
    let mut flow = live::FlowHeaders::new();
    let mut strip: Vec<String> = Vec::new();
    headers.each(&mut |name, value| {
        flow.observe(name, value);
        if live::is_flow_header(name) && !strip.iter().any(|s| s == name) {
            strip.push(name.to_owned());
        }
    });
    for name in &strip {
        headers.remove(name);
    }
    let (observation, refusals) = flow.finish();
    for (header, reason) in refusals.iter() {
        let labels = FlowRefusalLabels { header, reason };
        evidence.metrics.flow_refused.get_or_create(&labels).inc();
    }
    let slot = upstream.live();
    let now_ms = grid_gateway::clock::wall_ms();
    if observation.has_room_signal() {
        slot.record_room(now_ms, band, &observation);
    }
    // Only an answer that says something about room or serving wakes a refresh; a plain
    // answer is counted at the next one.
    let full = status == StatusCode::TOO_MANY_REQUESTS;
    if status.is_server_error() || full || observation.has_room_signal() {
        evidence.live_refresh.notify_one();
    }
    if full {
        // The site says it is full: read so for its Retry-After (bounded), as a full band.
        let now = grid_gateway::clock::system_time();
        let mut hold_ms = None;
        headers.each(&mut |name, value| {
            if name == "retry-after" {
                hold_ms = hold_ms.or_else(|| retry_after_ms(value, now));
            }
        });
        slot.record_full(now_ms, hold_ms);
        upstream.tally().refused();
        evidence
            .metrics
            .full_answers
            .get_or_create(&SiteLabels {
                site: upstream.site.to_string(),
            })
            .inc();
    } else if status.is_server_error() {
        slot.record_failure();
        // A 503 is the site's refusal before any work (it is sent elsewhere); any other
        // 5xx a failure of work it took.
        if status == StatusCode::SERVICE_UNAVAILABLE {
            upstream.tally().refused();
        } else {
            upstream.tally().failed();
        }
        evidence
            .metrics
            .error_answers
            .get_or_create(&SiteLabels {
                site: upstream.site.to_string(),
            })
            .inc();
    } else {
        slot.record_answer();
    }
    if let Some(h) = slot.restated_headroom(now_ms, band, &observation) {
        headers.set(
            HeaderName::from_static(live::HEADROOM_HEADER),
            HeaderValue::from(h),
        );
    }
    if let Some(v) = site_header {
        headers.set(SITE_HEADER, v);
    }
    observation
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn a_retry_after_is_read_as_seconds_or_a_date_and_anything_else_is_none() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(retry_after_ms(b"5", now), Some(5_000));
        assert_eq!(retry_after_ms(b" 0 ", now), Some(0));
        assert_eq!(
            retry_after_ms(b"99999999999999999999999", now),
            Some(u64::MAX)
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(7));
        assert_eq!(retry_after_ms(later.as_bytes(), now), Some(7_000));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(7));
        assert_eq!(retry_after_ms(earlier.as_bytes(), now), Some(0));
        for bad in [&b""[..], b"-5", b"5s", b"soon", b"\xff"] {
            assert_eq!(retry_after_ms(bad, now), None, "{bad:?}");
        }
    }
}
