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
    /// An exposition line did not match the grammar.
    #[error("exposition line {line}, column {column}: {kind}")]
    Parse {
        /// 1-based line number in the body.
        line: usize,
        /// 1-based byte column in that line where the parser expected something else.
        column: usize,
        /// What the parser expected there.
        kind: crate::exposition::SyntaxError,
    },
    /// Reading a body through [`crate::exposition::read_capped`] failed before its end.
    #[error("reading the exposition body failed ({kind:?}): {message}")]
    Read {
        /// The I/O error's kind, e.g. `ConnectionReset` or `TimedOut`.
        kind: std::io::ErrorKind,
        /// The I/O error's text.
        message: String,
    },
    /// A batch's metadata or one of its rows broke a wire rule of `docs/wire.md`; the
    /// store turns this into a counted drop instead of failing the body.
    #[error("batch field `{field}` breaks the wire rule `{}`", rule.as_str())]
    Batch {
        /// The label or part of the line at fault (`publisher_epoch`, `value`, ...).
        field: &'static str,
        /// Which rule it broke.
        rule: crate::batch::BatchRule,
    },
    /// A batch signature or signing-chain comment line breaks its rules
    /// (`crate::signature::parse_signature_line`).
    #[error("signature line field `{field}` breaks its rule")]
    Signature {
        /// The field at fault (`index`, `scheme`, `signature`, `cert`, `certs`, `fields`,
        /// `line`).
        field: &'static str,
    },
}
