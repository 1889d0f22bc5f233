//! The kit's one error type.

/// What the loopback kit refuses: a site model the simulator refused, a loopback socket
/// that could not be opened, a daemon that did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The simulated site model refused a configuration or a control.
    #[error(transparent)]
    Sim(#[from] grid_sim::Error),
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
    Gateway(#[from] grid_gateway::Error),
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
