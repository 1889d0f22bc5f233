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

/// `{site}`: the site a request was sent to on its second attempt, after the first site
/// refused the connection.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RetryLabels {
    /// The site tried second.
    pub site: String,
}

/// `{site, reason}` of an upstream failure before any byte of the answer.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct UpstreamFailureLabels {
    /// The site that failed.
    pub site: String,
    /// `connect` (nothing was sent) or `request` (the exchange broke after sending).
    pub reason: &'static str,
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

/// The request path's metric handles.
#[derive(Clone, Debug, Default)]
pub(crate) struct RequestMetrics {
    /// `grid_gateway_requests_total{outcome}`.
    pub requests: Family<OutcomeLabels, Counter>,
    /// `grid_gateway_retries_total{site}`. First attempts are counted by grid-score's
    /// `grid_gateway_score_decisions_total{site,path,outcome}`.
    pub retries: Family<RetryLabels, Counter>,
    /// `grid_gateway_upstream_failures_total{site,reason}`.
    pub upstream_failures: Family<UpstreamFailureLabels, Counter>,
    /// `grid_gateway_flow_headers_refused_total{header,reason}`.
    pub flow_refused: Family<FlowRefusalLabels, Counter>,
    /// `grid_gateway_upstream_error_answers_total{site}`: 5xx answers, fed to routing as
    /// serving failures.
    pub error_answers: Family<SiteLabels, Counter>,
}

impl RequestMetrics {
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
            "Requests sent to a second site after the first refused the connection",
            m.retries.clone(),
        );
        registry.register(
            "grid_gateway_upstream_failures",
            "Upstream exchanges that failed before any byte of the answer",
            m.upstream_failures.clone(),
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

    /// Counts one answered request.
    pub(crate) fn outcome(&self, outcome: &'static str) {
        self.requests
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }
}
