//! The crate's one error type.

/// Why `grid-signals` refused an input.
///
/// Every variant carries enough context (line, column, field) to find the offending
/// input without a debugger.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The body reached [`crate::exposition::MAX_EXPOSITION_BYTES`]; kept apart from parse
    /// errors because a capped body means "the endpoint answered, readiness unknown".
    #[error("exposition body reached the {limit}-byte cap")]
    BodyCap {
        /// The cap that was reached, in bytes.
        limit: usize,
    },
}
