//! What the request path counts: one counter increment per request, no allocation beyond
//! the first sight of a label set.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// `{outcome}`: `proxied` or the OpenAI-style error code the gateway answered with.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OutcomeLabels {
    /// The outcome.
    pub outcome: &'static str,
}

/// `{site, cause}`: the site a request was sent to on its second attempt, and why the
/// first refused it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RetryLabels {
    /// The site tried second.
    pub site: String,
    /// Why the first site refused it.
    pub cause: grid_score::retry::RetryCause,
}

grid_signals::label_values! {
    label "reason";
    /// Why a request a site refused before any work was not sent elsewhere (the `reason`
    /// of `grid_gateway_retries_skipped_total`).
    pub(crate) enum RetrySkipped {
        /// The retry budget was spent (`grid_score::retry::RETRY_BUDGET_RATIO`).
        Budget,
        /// The model has no routable site but the one that refused it.
        NoOtherSite,
    }
}

grid_signals::label_values! {
    /// Why an upstream attempt failed before any byte of its answer (the `reason` of
    /// `grid_gateway_upstream_failures_total`).
    pub(crate) enum UpstreamFailure {
        /// Connecting (TCP or TLS, refused or timed out) failed: nothing was sent.
        Connect,
        /// The exchange broke, or its head did not come in time, after sending.
        Request,
        /// Sent, but the site's TCP left it unacknowledged for the connect bound
        /// (`TCP_USER_TIMEOUT`): a pooled connection into a partition. The request never
        /// arrived whole, so it is retried elsewhere as a failed connect is.
        Unacknowledged,
        /// Every slot of the site was taken for longer than the connect bound
        /// (`maxConnectionsPerSite`): nothing was sent.
        SiteFull,
    }
}

grid_signals::label_values! {
    /// Which bounded wait on a site ran out (the `phase` of
    /// `grid_gateway_upstream_timeouts_total`).
    pub(crate) enum TimeoutPhase {
        /// TCP connect plus TLS handshake, `connectTimeoutSeconds`.
        Connect,
        /// Sending until the answer's head, `upstreamHeadersTimeoutSeconds`.
        Headers,
        /// Silence between two frames of the answer body, `upstreamIdleTimeoutSeconds`.
        Body,
    }
}

/// `{site, reason}` of an upstream failure before any byte of the answer.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct UpstreamFailureLabels {
    /// The site that failed.
    pub site: String,
    /// Why: `connect`, `unacknowledged` and `site_full` are retried elsewhere (the request
    /// never reached the site whole); `request` is not.
    pub reason: UpstreamFailure,
}

/// `{site, phase}` of a bounded wait on a site that ran out.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TimeoutLabels {
    /// The site waited for.
    pub site: String,
    /// The wait.
    pub phase: TimeoutPhase,
}

/// `{header, reason}` of a site's flow-control header value the gateway did not trust.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FlowRefusalLabels {
    /// `headroom`, `queue_duration` or `dropped_reason`.
    pub header: grid_score::live::FlowHeader,
    /// `malformed`, `negative`, `duplicated` or `absurd`.
    pub reason: grid_score::live::FlowHeaderReject,
}

/// `{site}` of an answer that is evidence of a serving failure.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SiteLabels {
    /// The site.
    pub site: String,
}

/// The outcome of a request answered by a site (the others are error codes).
pub(crate) const PROXIED: &str = "proxied";

/// The request path's metric handles.
#[derive(Clone, Debug)]
pub(crate) struct RequestMetrics {
    /// `grid_gateway_requests_total{outcome}`.
    pub requests: Family<OutcomeLabels, Counter>,
    /// `requests{outcome="proxied"}`, found once: nearly every request counts there, and a
    /// family lookup is a lock and a hash.
    proxied: Counter,
    /// `grid_gateway_retries_total{site}`. First attempts are counted by grid-score's
    /// `grid_gateway_score_decisions_total{site,path,outcome}`.
    pub retries: Family<RetryLabels, Counter>,
    /// `grid_gateway_upstream_failures_total{site,reason}`.
    pub upstream_failures: Family<UpstreamFailureLabels, Counter>,
    /// `grid_gateway_upstream_timeouts_total{site,phase}`: every bounded wait on a site
    /// that ran out, each also a serving failure in routing.
    pub upstream_timeouts: Family<TimeoutLabels, Counter>,
    /// `grid_gateway_flow_headers_refused_total{header,reason}`.
    pub flow_refused: Family<FlowRefusalLabels, Counter>,
    /// `grid_gateway_upstream_error_answers_total{site}`: 5xx answers, fed to routing as
    /// serving failures.
    pub error_answers: Family<SiteLabels, Counter>,
    /// `grid_gateway_upstream_full_answers_total{site}`: 429 answers, read as the site full
    /// for its Retry-After.
    pub full_answers: Family<SiteLabels, Counter>,
    /// `grid_gateway_retries_skipped_total{reason}`.
    skipped: Family<RetrySkipped, Counter>,
}

impl Default for RequestMetrics {
    fn default() -> Self {
        let requests = Family::<OutcomeLabels, Counter>::default();
        let proxied = requests
            .get_or_create(&OutcomeLabels { outcome: PROXIED })
            .clone();
        Self {
            requests,
            proxied,
            retries: Family::default(),
            upstream_failures: Family::default(),
            upstream_timeouts: Family::default(),
            flow_refused: Family::default(),
            error_answers: Family::default(),
            full_answers: Family::default(),
            skipped: grid_signals::labels::zeroed(),
        }
    }
}

impl RequestMetrics {
    /// Creates `site`'s series at 0 (its retries by cause, failures by reason, timeouts
    /// by phase, 429 and 5xx answers), so a dashboard and an alert see them before the
    /// first incident. Called for every configured site at start and at each reload.
    pub(crate) fn add_site(&self, site: &str) {
        let s = || site.to_owned();
        for cause in grid_score::retry::RetryCause::ALL {
            self.retries
                .get_or_create(&RetryLabels { site: s(), cause })
                .inc_by(0);
        }
        for reason in UpstreamFailure::ALL {
            self.upstream_failures
                .get_or_create(&UpstreamFailureLabels { site: s(), reason })
                .inc_by(0);
        }
        for phase in TimeoutPhase::ALL {
            self.upstream_timeouts
                .get_or_create(&TimeoutLabels { site: s(), phase })
                .inc_by(0);
        }
        self.error_answers
            .get_or_create(&SiteLabels { site: s() })
            .inc_by(0);
        self.full_answers
            .get_or_create(&SiteLabels { site: s() })
            .inc_by(0);
    }

    /// Registers the handles under `grid_gateway_*`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "grid_gateway_requests",
            "Requests answered, by outcome",
            m.requests.clone(),
        );
        registry.register(
            "grid_gateway_retries",
            "Requests sent to a second site after the first refused them before any work, by the site tried and why (connect, unavailable, full, reset)",
            m.retries.clone(),
        );
        registry.register(
            "grid_gateway_retries_skipped",
            "Requests a site refused before any work that were not sent elsewhere, by reason (budget, no_other_site)",
            m.skipped.clone(),
        );
        registry.register(
            "grid_gateway_upstream_full_answers",
            "Answers with a 429 status from a site, read as the site full for its Retry-After",
            m.full_answers.clone(),
        );
        registry.register(
            "grid_gateway_upstream_failures",
            "Upstream exchanges that failed before any byte of the answer",
            m.upstream_failures.clone(),
        );
        registry.register(
            "grid_gateway_upstream_timeouts",
            "Bounded waits on a site that ran out, by site and phase (connect, headers, body)",
            m.upstream_timeouts.clone(),
        );
        registry.register(
            "grid_gateway_flow_headers_refused",
            "Flow-control response header values not trusted, by header and reason",
            m.flow_refused.clone(),
        );
        registry.register(
            "grid_gateway_upstream_error_answers",
            "Answers with a 5xx status from a site, counted as serving failures in routing",
            m.error_answers.clone(),
        );
        m
    }

    /// Counts one wait on `site` that ran out.
    pub(crate) fn timed_out(&self, site: &str, phase: TimeoutPhase) {
        self.upstream_timeouts
            .get_or_create(&TimeoutLabels {
                site: site.to_owned(),
                phase,
            })
            .inc();
    }

    /// Counts one refused request not sent elsewhere.
    pub(crate) fn retry_skipped(&self, reason: RetrySkipped) {
        self.skipped.get_or_create(&reason).inc();
    }

    /// Requests answered from a site so far: what the retry budget is a share of.
    pub(crate) fn requests_total(&self) -> u64 {
        self.proxied.get()
    }

    /// Counts one answered request.
    pub(crate) fn outcome(&self, outcome: &'static str) {
        if outcome == PROXIED {
            self.proxied.inc();
            return;
        }
        self.requests
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxied_requests_count_on_the_registered_outcome_series_as_the_others_do() {
        let mut registry = Registry::default();
        let m = RequestMetrics::register(&mut registry);
        m.outcome(PROXIED);
        m.clone().outcome(PROXIED);
        m.outcome("unavailable");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("grid_gateway_requests_total{outcome=\"proxied\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("grid_gateway_requests_total{outcome=\"unavailable\"} 1"),
            "{text}"
        );
    }
}
