//! Why a scrape produced no parsed exposition.

crate::label_values! {
    /// The class of a failed scrape, as the operator's driver classified it.
    ///
    /// Closed on purpose: each class is a metric label and part of a Ready-condition reason,
    /// so an unbounded set would grow both.
    #[derive(PartialOrd, Ord)]
    pub enum ScrapeFailure {
        /// The scrape's time budget ran out.
        Timeout,
        /// The EPP answered 401 or 403.
        Unauthorized,
        /// The TLS handshake or certificate check failed.
        Tls,
        /// The EPP's host name did not resolve.
        Dns,
        /// The TCP connection was refused or reset.
        Connect,
        /// The EPP answered with a non-2xx status other than 401/403.
        Http,
        /// The body reached [`crate::exposition::MAX_EXPOSITION_BYTES`]. Unlike every other
        /// class the endpoint answered, so this leaves readiness unknown instead of failing it.
        BodyCap,
        /// The body was not valid Prometheus text exposition.
        Parse,
    }
}

impl ScrapeFailure {
    /// The Ready-condition reason naming this class (Kubernetes reasons are CamelCase).
    pub fn condition_reason(self) -> &'static str {
        match self {
            Self::Timeout => "ScrapeTimeout",
            Self::Unauthorized => "ScrapeUnauthorized",
            Self::Tls => "ScrapeTls",
            Self::Dns => "ScrapeDns",
            Self::Connect => "ScrapeConnect",
            Self::Http => "ScrapeHttp",
            Self::BodyCap => "ScrapeBodyCap",
            Self::Parse => "ScrapeParse",
        }
    }

    /// Whether the endpoint answered despite the failure: such a scrape proves the
    /// provider is up, so it refreshes the staleness clock and never fails readiness.
    pub fn endpoint_answered(self) -> bool {
        matches!(self, Self::BodyCap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_has_a_distinct_label_and_reason() {
        let labels: std::collections::BTreeSet<_> =
            ScrapeFailure::ALL.iter().map(|f| f.as_str()).collect();
        let reasons: std::collections::BTreeSet<_> = ScrapeFailure::ALL
            .iter()
            .map(|f| f.condition_reason())
            .collect();
        assert_eq!(labels.len(), ScrapeFailure::ALL.len());
        assert_eq!(reasons.len(), ScrapeFailure::ALL.len());
        assert_eq!(
            labels.into_iter().collect::<Vec<_>>(),
            [
                "body_cap",
                "connect",
                "dns",
                "http",
                "parse",
                "timeout",
                "tls",
                "unauthorized"
            ]
        );
    }

    #[test]
    fn only_body_cap_counts_as_an_answer() {
        for failure in ScrapeFailure::ALL {
            assert_eq!(
                failure.endpoint_answered(),
                failure == ScrapeFailure::BodyCap,
                "{failure:?}"
            );
        }
    }
}
