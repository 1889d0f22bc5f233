//! The simulator's one error type.

/// What the simulated world refuses: a configuration that cannot describe a site or a
/// control outside its range.
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
}
