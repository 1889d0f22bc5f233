//! The crate's one error type.

/// Why `grid-membership` refused an input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A member identity broke a rule of [`crate::Member::check`].
    #[error("member identity field `{field}` is not valid: {value:?}")]
    Identity {
        /// `site`, `host` or `port`.
        field: &'static str,
        /// The offending value, cut at 64 characters.
        value: String,
    },
    /// The SWIM protocol refused an operation (foca's own error, as text).
    #[error("membership protocol: {0}")]
    Protocol(String),
}
