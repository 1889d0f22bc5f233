//! The kit's one error type.

/// What the simulated world refuses: a configuration that cannot describe a site, a
/// control outside its range, or a loopback socket that could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A site configuration field is out of its range.
    #[error("site config: {field} {reason}")]
    InvalidConfig {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A degrade factor outside `MIN_DEGRADE_FACTOR..=MAX_DEGRADE_FACTOR` (or not finite).
    #[error("degrade factor {factor} outside {min}..={max}")]
    DegradeOutOfRange {
        /// The refused factor.
        factor: f64,
        /// The smallest accepted factor.
        min: f64,
        /// The largest accepted factor.
        max: f64,
    },
    /// An endpoint index past the site's endpoints.
    #[error("endpoint {index} does not exist (the site has {endpoints})")]
    NoSuchEndpoint {
        /// The refused index.
        index: usize,
        /// How many endpoints the site has.
        endpoints: usize,
    },
    /// A flow-control band could not be provisioned, changed or removed.
    #[error("flow-control band {priority}: {reason}")]
    BandRefused {
        /// The band's priority.
        priority: i32,
        /// Why.
        reason: &'static str,
    },
    /// A loopback socket could not be bound or served.
    #[error("simulated site socket: {0}")]
    Io(#[from] std::io::Error),
    /// A certificate of the local grid could not be minted.
    #[error("minting a local certificate: {0}")]
    Pki(#[from] rcgen::Error),
    /// A file of the local grid (certificate, key, configuration, plot) could not be
    /// written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A site operator refused its configuration or could not start.
    #[error("operator: {0}")]
    Operator(#[from] grid_operatord::Error),
    /// The gateway refused its configuration or could not start.
    #[error("gateway: {0}")]
    Gateway(#[from] grid_gatewayd::Error),
    /// The local grid did not reach the state it waits for in time.
    #[error("local grid: {what} not within {limit_ms} ms")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The bound, in milliseconds.
        limit_ms: u64,
    },
    /// A load generator's request failed before its answer was read whole.
    #[error("request: {0}")]
    Request(String),
    /// The demo's plot could not be drawn or written.
    #[error("plot: {0}")]
    Plot(String),
}
