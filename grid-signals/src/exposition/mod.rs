//! Prometheus text exposition: the parser, its body cap and the writer (issue 3).

/// The most bytes of one exposition body anyone reads: past it the body is `BodyCap`.
pub const MAX_EXPOSITION_BYTES: usize = 1 << 20;
