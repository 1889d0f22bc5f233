//! The three custom resources of the `grid.llm-d.io/v1alpha1` API group, as Rust types:
//! the CRD YAML under `docs/crds/` is generated from them (`grid-operatord crds`), never
//! written by hand, so the schema a cluster validates against and the types the
//! controller reads are one definition.
//!
//! Field names follow the file mode's TOML keys (camelCase) wherever the meaning is the
//! same, so `docs/operator.md` and `docs/crds.md` describe one vocabulary. Every field
//! is documented in `docs/crds.md`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of every grid resource.
pub const GROUP: &str = "grid.llm-d.io";
/// The one served (and stored) version.
pub const VERSION: &str = "v1alpha1";
/// The most fingerprints a `GridSite` pins: the current certificate and, during a
/// rotation, the next one.
pub const MAX_SITE_FINGERPRINTS: usize = 2;
/// Shortest interval or timeout the schema admits, in seconds
/// ([`crate::config::MIN_PERIOD_MS`]).
pub const MIN_PERIOD_SECONDS: f64 = 0.1;
/// Longest interval or timeout the schema admits, in seconds
/// ([`crate::config::MAX_PERIOD_MS`]).
pub const MAX_PERIOD_SECONDS: f64 = 3600.0;

/// The grid one operator serves: how signals cross sites and how peers are trusted.
/// One per namespace: an operator refuses to start when its namespace holds more.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "grid.llm-d.io",
    version = "v1alpha1",
    kind = "GridNetwork",
    namespaced,
    status = "GridNetworkStatus",
    shortname = "gnet",
    derive = "PartialEq",
    doc = "A grid network: signal transport, peer trust and intervals (docs/crds.md)."
)]
#[serde(rename_all = "camelCase")]
pub struct GridNetworkSpec {
    /// How signals cross sites; absent means `gossip`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal_transport: Option<SignalTransport>,
    /// How peer operators and the local gateway are authenticated.
    pub peer_trust: PeerTrust,
    /// Scrape and peer-poll intervals; absent fields take the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intervals: Option<Intervals>,
}

/// `spec.signalTransport`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SignalTransport {
    /// `gossip` (the default) or `poll`. Read once at operator start: a different
    /// declaration makes the operator exit so Kubernetes restarts it into that mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<TransportModeName>,
}

/// The declared signal transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TransportModeName {
    /// Samples ride the SWIM and CRDT overlay (not implemented by this operator).
    Gossip,
    /// Serve `/v1/site/signals` over mutual TLS and poll peers.
    Poll,
}

impl TransportModeName {
    /// The spelling in the resource and in the file mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gossip => "gossip",
            Self::Poll => "poll",
        }
    }
}

/// `spec.peerTrust`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PeerTrust {
    /// `pin` (each `GridSite` lists its certificate fingerprints) or `spiffe`
    /// (certificates chain to the CA and name `spiffe://<trustDomain>/site/<name>`).
    pub mode: TrustModeName,
    /// The SPIFFE trust domain; required in `spiffe` mode, refused in `pin` mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_domain: Option<String>,
}

/// The declared peer trust mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TrustModeName {
    /// Peers known by SHA-256 fingerprints of their leaf certificates.
    Pin,
    /// Peers known by SPIFFE URI SANs under one CA.
    Spiffe,
}

/// `spec.intervals`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Intervals {
    /// EPP scrape interval in seconds (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.1, max = 3600.0))]
    pub scrape_seconds: Option<f64>,
    /// Peer poll interval in seconds (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.1, max = 3600.0))]
    pub peer_poll_seconds: Option<f64>,
}

/// `GridNetwork` status, written by the operator only.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GridNetworkStatus {
    /// `GatewayAgesRejected` (metav1.Condition shape).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` the conditions were written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The gateway-feedback evidence the condition was derived from, persisted in the same
    /// write (grid-feedback's receiver state: one record per gateway process). Opaque to
    /// users; the operator restores it at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "opaque_object")]
    pub gateway_feedback: Option<serde_json::Value>,
}

/// What the API server checks `GridSite.spec.signalsEndpoint` against, so a malformed
/// URL is refused when it is applied instead of only in the operator's log: `https`, a
/// host, no whitespace. The operator still parses it whole (docs/crds.md).
pub const SIGNALS_ENDPOINT_PATTERN: &str = r"^https://[^/?#\s]+(/\S*)?$";
/// `GridSite.spec.fingerprints[*]`: 64 hex digits in either case, colons anywhere, as
/// the fingerprint parser reads them.
pub const FINGERPRINT_PATTERN: &str = r"^:*([0-9A-Fa-f]:*){64}$";
/// `InferenceProvider.spec.metricsConfig.endpoint`: an `http` or `https` base URL with a
/// host and no path (the path goes in `path`).
pub const EPP_ENDPOINT_PATTERN: &str = r"^https?://[^/?#\s]+/?$";
/// `InferenceProvider.spec.metricsConfig.path`: absolute, no whitespace.
pub const METRICS_PATH_PATTERN: &str = r"^/\S*$";
/// `InferenceProvider.spec.serving.baseUrl`: an `http` or `https` base URL with a host,
/// an optional path prefix, no query.
pub const SERVING_URL_PATTERN: &str = r"^https?://[^/?#\s]+(/[^?#\s]*)?$";
/// `GridSite.spec.serving.baseUrl`: the same, `https` only (other sites are reached over
/// TLS with the gateway's certificate).
pub const SITE_SERVING_URL_PATTERN: &str = r"^https://[^/?#\s]+(/[^?#\s]*)?$";
/// Longest `model` name a gateway routes (its `models[].name` bound).
pub const MAX_MODEL_NAME_BYTES: u32 = 256;

/// A site of the grid: this operator's own (named by `--site`) or a peer it polls. The
/// object's name is the site's name.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "grid.llm-d.io",
    version = "v1alpha1",
    kind = "GridSite",
    namespaced,
    shortname = "gsite",
    derive = "PartialEq",
    doc = "A grid site: its signals endpoint and trust material (docs/crds.md)."
)]
#[serde(rename_all = "camelCase")]
pub struct GridSiteSpec {
    /// The site's `GET /v1/site/signals` URL (https).
    #[schemars(regex(pattern = SIGNALS_ENDPOINT_PATTERN))]
    pub signals_endpoint: String,
    /// Pin mode: the canonical SHA-256 fingerprints of the site's leaf certificate, one,
    /// or two during a rotation. Refused in `spiffe` mode.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 2), inner(regex(pattern = FINGERPRINT_PATTERN)))]
    pub fingerprints: Vec<String>,
    /// Timeout of one poll attempt in seconds (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.1, max = 3600.0))]
    pub timeout_seconds: Option<f64>,
    /// What the site serves to other sites' gateways: their model-to-candidates table
    /// follows it. Ignored on this site's own `GridSite` (its `InferenceProvider`s say it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<SiteServing>,
}

/// `GridSite.spec.serving`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SiteServing {
    /// Where other sites' gateways send this site's requests (`https`, mutual TLS with
    /// the gateway's certificate; a path prefix is kept before `/v1/...`).
    #[schemars(regex(pattern = SITE_SERVING_URL_PATTERN))]
    pub base_url: String,
    /// Its providers, and the models each serves.
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub providers: Vec<ServedProvider>,
}

/// One provider of `GridSite.spec.serving.providers`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServedProvider {
    /// The provider's name at that site (its `grid_provider`).
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// The `model` values clients send that it serves.
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = MAX_MODEL_NAME_BYTES)))]
    pub models: Vec<String>,
}

/// A provider of this site whose EPP the operator scrapes. The object's name is the
/// provider's name (`grid_provider`); its `metadata.generation` is the published config
/// generation and its `metadata.uid` the `provider_uid`.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "grid.llm-d.io",
    version = "v1alpha1",
    kind = "InferenceProvider",
    namespaced,
    status = "InferenceProviderStatus",
    shortname = "iprov",
    derive = "PartialEq",
    doc = "An inference provider whose EPP the operator scrapes (docs/crds.md)."
)]
#[serde(rename_all = "camelCase")]
pub struct InferenceProviderSpec {
    /// Where and how the EPP's metrics are scraped.
    pub metrics_config: MetricsConfig,
    /// The EPP pool (`name` label) this provider is; absent reads every pool combined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub pool: Option<String>,
    /// Takes the provider out of routing by hand: still scraped, but not ready with
    /// reason `Unavailable` whatever the EPP says.
    #[serde(default)]
    pub unavailable: bool,
    /// Where this site's gateway sends the provider's requests, and the models it
    /// serves: the gateway's model-to-candidates table follows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<ProviderServing>,
}

/// `InferenceProvider.spec.serving`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderServing {
    /// The provider's OpenAI-compatible base URL inside the cluster (`http` or `https`;
    /// a path prefix is kept before `/v1/...`).
    #[schemars(regex(pattern = SERVING_URL_PATTERN))]
    pub base_url: String,
    /// The `model` values clients send that it serves.
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = MAX_MODEL_NAME_BYTES)))]
    pub models: Vec<String>,
}

/// `spec.metricsConfig`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricsConfig {
    /// The EPP Service's base URL (`http` or `https`, no path).
    #[schemars(regex(pattern = EPP_ENDPOINT_PATTERN))]
    pub endpoint: String,
    /// Path of the metrics (default `/metrics`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = METRICS_PATH_PATTERN))]
    pub path: Option<String>,
    /// Per-scrape timeout in seconds (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.1, max = 3600.0))]
    pub timeout_seconds: Option<f64>,
    /// No successful scrape within this long means not ready (default half the signal
    /// TTL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.1, max = 3600.0))]
    pub stale_metrics_seconds: Option<f64>,
    /// TLS of an `https` endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<MetricsTls>,
}

/// `spec.metricsConfig.tls`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricsTls {
    /// PEM CA bundle mounted in the operator's pod; absent uses the site's CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
}

/// `InferenceProvider` status, written by the operator only.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferenceProviderStatus {
    /// `Ready` (metav1.Condition shape); its reason is one of grid-signals' `ReadyReason`
    /// set, a failed scrape's class included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` the conditions were written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The schema of an object the operator alone reads back: any fields, kept as written.
fn opaque_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt as _;

    use super::*;

    fn schema_text<T: kube::CustomResourceExt>() -> String {
        serde_json::to_string(&T::crd()).unwrap()
    }

    #[test]
    fn the_schema_period_bounds_are_the_file_modes_bounds() {
        let ms = |s: f64| (s * 1000.0).round() as u64;
        assert_eq!(ms(MIN_PERIOD_SECONDS), crate::config::MIN_PERIOD_MS);
        assert_eq!(ms(MAX_PERIOD_SECONDS), crate::config::MAX_PERIOD_MS);
        let text = schema_text::<GridNetwork>();
        assert!(text.contains("\"minimum\":0.1") && text.contains("\"maximum\":3600.0"));
    }

    #[test]
    fn a_site_schema_admits_at_most_max_site_fingerprints() {
        assert!(
            schema_text::<GridSite>().contains(&format!("\"maxItems\":{MAX_SITE_FINGERPRINTS}"))
        );
    }

    #[test]
    fn every_crd_is_in_the_project_group_and_version_with_a_status_subresource_where_written() {
        for (crd, status) in [
            (GridNetwork::crd(), true),
            (GridSite::crd(), false),
            (InferenceProvider::crd(), true),
        ] {
            assert_eq!(crd.spec.group, GROUP);
            let version = &crd.spec.versions[0];
            assert_eq!(version.name, VERSION);
            let has_status = version
                .subresources
                .as_ref()
                .is_some_and(|s| s.status.is_some());
            assert_eq!(has_status, status, "{}", crd.spec.names.kind);
        }
    }

    #[test]
    fn an_absent_transport_and_unavailable_read_as_their_defaults() {
        let spec: GridNetworkSpec =
            serde_json::from_str(r#"{"peerTrust":{"mode":"pin"}}"#).unwrap();
        assert_eq!(spec.signal_transport, None);
        let provider: InferenceProviderSpec =
            serde_json::from_str(r#"{"metricsConfig":{"endpoint":"http://e"}}"#).unwrap();
        assert!(!provider.unavailable);
        assert!(
            serde_json::from_str::<GridNetworkSpec>(
                r#"{"peerTrust":{"mode":"pin"},"signalTransport":{"mode":"swim"}}"#
            )
            .is_err()
        );
    }
}

#[cfg(test)]
mod pattern_tests {
    //! Each schema pattern against the parser the translation runs: what the operator
    //! accepts, the API server accepts too, and the common mistakes are refused at apply.

    use grid_daemon::tls::Fingerprint;
    use regex::Regex;

    use super::{
        EPP_ENDPOINT_PATTERN, FINGERPRINT_PATTERN, METRICS_PATH_PATTERN, SIGNALS_ENDPOINT_PATTERN,
    };
    use crate::config::{metrics_url, parse_url};

    fn matches(pattern: &str, text: &str) -> bool {
        Regex::new(pattern).unwrap().is_match(text)
    }

    #[test]
    fn a_fingerprint_matches_the_pattern_exactly_when_the_parser_reads_it() {
        let hex = "ab".repeat(32);
        let colons = "AB:".repeat(31) + "AB";
        let samples = [
            hex.clone(),
            colons.clone(),
            format!(":{colons}:"),
            hex[1..].to_owned(),
            format!("{hex}a"),
            format!("{}g", &hex[1..]),
            format!("{} ", &hex[1..]),
            String::new(),
            ":".repeat(64),
        ];
        for s in samples {
            assert_eq!(
                matches(FINGERPRINT_PATTERN, &s),
                Fingerprint::parse(&s).is_ok(),
                "{s:?}"
            );
        }
    }

    #[test]
    fn a_signals_endpoint_the_operator_accepts_matches_and_a_plain_or_hostless_one_does_not() {
        for (url, accepted) in [
            ("https://b.example:8443/v1/site/signals", true),
            ("https://10.0.0.2/v1/site/signals", true),
            ("https://b", true),
            ("http://b.example/v1/site/signals", false),
            ("https:///v1/site/signals", false),
            ("https://b example/", false),
            ("b.example/v1/site/signals", false),
        ] {
            let parsed = parse_url("f", url, &["https"]).is_ok();
            assert_eq!(parsed, accepted, "parser on {url}");
            assert_eq!(
                matches(SIGNALS_ENDPOINT_PATTERN, url),
                accepted,
                "pattern on {url}"
            );
        }
    }

    #[test]
    fn an_epp_base_url_and_path_match_exactly_when_the_operator_joins_them() {
        for (base, path, accepted) in [
            ("http://epp:9090", "/metrics", true),
            ("https://epp.ns.svc:9090/", "/epp/metrics", true),
            ("http://epp:9090/metrics", "/metrics", false),
            ("http://epp:9090?x=1", "/metrics", false),
            ("ftp://epp:9090", "/metrics", false),
            ("http://", "/metrics", false),
            ("http://epp:9090", "metrics", false),
        ] {
            let joined = metrics_url(("base", base), ("path", path)).is_ok();
            assert_eq!(joined, accepted, "parser on {base} {path}");
            let schema = matches(EPP_ENDPOINT_PATTERN, base) && matches(METRICS_PATH_PATTERN, path);
            assert_eq!(schema, accepted, "patterns on {base} {path}");
        }
    }
}
