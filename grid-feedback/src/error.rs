//! The crate's one error type, and the closed set of reasons a report is refused.

/// An unknown header's name is cut to this many bytes in [`Error::UnknownHeader`], so an
/// attacker cannot grow the logs.
pub const MAX_REPORTED_NAME_BYTES: usize = 64;

/// Why `grid-feedback` refused a report or a persisted state.
///
/// Every refusal maps to one [`RefusalReason`] (a metric label and an HTTP status) through
/// [`Error::refusal`]; the variants keep the header or field that was at fault so a log
/// line finds the offender without a packet capture.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A version-1 header is absent.
    #[error("header {header} is missing")]
    MissingHeader {
        /// The lowercase header name.
        header: &'static str,
    },
    /// A header appears more than once; version 1 takes exactly one value of each.
    #[error("header {header} appears more than once")]
    RepeatedHeader {
        /// The lowercase header name.
        header: &'static str,
    },
    /// A header value is longer than its field can ever be.
    #[error("header {header} value is {len} bytes, over its {limit}-byte limit")]
    OversizedHeader {
        /// The lowercase header name.
        header: &'static str,
        /// The value's length in bytes.
        len: usize,
        /// The field's maximum length in bytes.
        limit: usize,
    },
    /// A header value does not have its field's exact syntax.
    #[error("header {header} is malformed: expected {expected}")]
    MalformedHeader {
        /// The lowercase header name.
        header: &'static str,
        /// What the field must look like.
        expected: &'static str,
    },
    /// A well-formed version other than the one this receiver speaks.
    #[error("ingest version {version} is not supported (this side speaks version 1)")]
    UnsupportedVersion {
        /// The version the caller asked for.
        version: u64,
    },
    /// An `x-grid-ingest-*` header that version 1 does not define.
    #[error("unknown ingest header {name:?}")]
    UnknownHeader {
        /// The header name as sent, lossily decoded and cut to
        /// [`MAX_REPORTED_NAME_BYTES`] bytes so an attacker cannot grow our logs.
        name: String,
    },
    /// A report claims clean at the maximum sequence or counter, which only terminal
    /// rejected evidence may use.
    #[error("{header} is at the maximum u64, reserved for rejected evidence, but clean is true")]
    TerminalClean {
        /// The header holding the maximum value.
        header: &'static str,
    },
    /// The request carried a body; reports are headers only.
    #[error("the body has at least {len} bytes; ingest reports carry an empty body")]
    NonemptyBody {
        /// How many body bytes the daemon handed in (it need read only one).
        len: usize,
    },
    /// The caller presented a peer site's certificate, not this site's own.
    #[error("only the site's own certificate may submit gateway feedback")]
    Unauthorized,
    /// The sequence is older than the one already accepted for this epoch.
    #[error("sequence {sequence} is older than the accepted {last}")]
    Replay {
        /// The sequence in the report.
        sequence: u64,
        /// The newest sequence accepted for the epoch.
        last: u64,
    },
    /// The sequence was accepted before with a different counter, flag or replica.
    #[error("sequence {sequence} was accepted before with different content")]
    ChangedDuplicate {
        /// The sequence in the report.
        sequence: u64,
    },
    /// A newer report carries a smaller cumulative counter than an accepted one.
    #[error("rejected count {rejected} is below the accepted {last}")]
    DecreasingCounter {
        /// The counter in the report.
        rejected: u64,
        /// The counter already accepted for the epoch.
        last: u64,
    },
    /// Every persisted reporter slot holds unresolved evidence, so a new identity has no
    /// room.
    #[error("all {capacity} persisted reporter slots hold unresolved evidence")]
    Overflow {
        /// [`crate::MAX_REPORTERS`].
        capacity: usize,
    },
    /// Too many requests already wait for the single writer.
    #[error("{capacity} requests already wait for the writer")]
    Busy {
        /// [`crate::MAX_QUEUED_REQUESTS`].
        capacity: usize,
    },
    /// The request's share of [`crate::INGEST_BUDGET`] ran out before it was persisted.
    #[error("the {budget_ms} ms ingest budget expired before the report was persisted")]
    Deadline {
        /// The whole budget in milliseconds.
        budget_ms: u64,
    },
    /// Every write attempt lost a resource-version race.
    #[error("the state write lost {attempts} resource-version races in a row")]
    ConflictExhausted {
        /// [`crate::MAX_WRITE_ATTEMPTS`].
        attempts: u8,
    },
    /// The state write failed or its result could not be verified.
    #[error("the state write failed or could not be verified")]
    WriteFailure,
    /// Persisted receiver state that this version cannot trust.
    #[error("persisted state is invalid at {field}: {problem}")]
    InvalidState {
        /// The field at fault.
        field: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
}

impl Error {
    /// The refusal this error answers a request with; `None` for errors that are not
    /// about a request (a persisted state that failed validation).
    pub fn refusal(&self) -> Option<RefusalReason> {
        Some(match self {
            Self::MissingHeader { .. } => RefusalReason::MissingHeader,
            Self::RepeatedHeader { .. } => RefusalReason::RepeatedHeader,
            Self::OversizedHeader { .. } => RefusalReason::OversizedHeader,
            Self::MalformedHeader { .. } => RefusalReason::MalformedHeader,
            Self::UnsupportedVersion { .. } => RefusalReason::UnsupportedVersion,
            Self::UnknownHeader { .. } => RefusalReason::UnknownHeader,
            Self::TerminalClean { .. } => RefusalReason::TerminalClean,
            Self::NonemptyBody { .. } => RefusalReason::NonemptyBody,
            Self::Unauthorized => RefusalReason::Unauthorized,
            Self::Replay { .. } => RefusalReason::Replay,
            Self::ChangedDuplicate { .. } => RefusalReason::ChangedDuplicate,
            Self::DecreasingCounter { .. } => RefusalReason::DecreasingCounter,
            Self::Overflow { .. } => RefusalReason::Overflow,
            Self::Busy { .. } => RefusalReason::Busy,
            Self::Deadline { .. } => RefusalReason::Deadline,
            Self::ConflictExhausted { .. } => RefusalReason::ConflictExhausted,
            Self::WriteFailure => RefusalReason::WriteFailure,
            Self::InvalidState { .. } => return None,
        })
    }
}

grid_signals::label_values! {
    label "reason";
    /// The closed set of reasons an ingest report is refused: the `reason` label of
    /// `grid_operator_feedback_refusals_total` and the `x-grid-ingest-refusal` response header.
    pub enum RefusalReason {
        /// A version-1 header is absent (400).
        MissingHeader,
        /// A header appears more than once (400).
        RepeatedHeader,
        /// A header value is over its field's length limit (400).
        OversizedHeader,
        /// A header value has the wrong syntax (400).
        MalformedHeader,
        /// The version header names another version (400).
        UnsupportedVersion,
        /// An `x-grid-ingest-*` header version 1 does not define (400).
        UnknownHeader,
        /// Clean claimed at the maximum sequence or counter (400).
        TerminalClean,
        /// The request had a body (413).
        NonemptyBody,
        /// A peer's certificate, not the site's own (403).
        Unauthorized,
        /// An older sequence than the accepted one (409).
        Replay,
        /// The accepted sequence with different content (409).
        ChangedDuplicate,
        /// A newer sequence with a smaller counter (409).
        DecreasingCounter,
        /// No persisted reporter slot is free (503).
        Overflow,
        /// The writer's queue is full (503).
        Busy,
        /// The ingest budget ran out (503).
        Deadline,
        /// Every write attempt lost a resource-version race (503).
        ConflictExhausted,
        /// The write failed or was not verified (503).
        WriteFailure,
    }
}

impl RefusalReason {
    /// The HTTP status the operator answers with. 4xx means "this request will never be
    /// accepted as sent"; 503 means "not stored now, keep the evidence and retry".
    pub fn status(self) -> u16 {
        match self {
            Self::MissingHeader
            | Self::RepeatedHeader
            | Self::OversizedHeader
            | Self::MalformedHeader
            | Self::UnsupportedVersion
            | Self::UnknownHeader
            | Self::TerminalClean => 400,
            Self::Unauthorized => 403,
            Self::Replay | Self::ChangedDuplicate | Self::DecreasingCounter => 409,
            Self::NonemptyBody => 413,
            Self::Overflow
            | Self::Busy
            | Self::Deadline
            | Self::ConflictExhausted
            | Self::WriteFailure => 503,
        }
    }
}

/// Cuts an arbitrary header name to a bounded, printable string for [`Error::UnknownHeader`].
pub(crate) fn reported_name(name: &[u8]) -> String {
    let cut = &name[..name.len().min(MAX_REPORTED_NAME_BYTES)];
    String::from_utf8_lossy(cut).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_reason_has_a_distinct_label() {
        let mut labels: Vec<_> = RefusalReason::ALL.iter().map(|r| r.as_str()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), RefusalReason::ALL.len());
    }

    #[test]
    fn every_refusal_status_is_a_documented_one() {
        for reason in RefusalReason::ALL {
            assert!(
                [400, 403, 409, 413, 503].contains(&reason.status()),
                "{reason:?}"
            );
        }
    }

    #[test]
    fn an_invalid_state_is_not_a_request_refusal() {
        let error = Error::InvalidState {
            field: "reporters",
            problem: "too many",
        };
        assert_eq!(error.refusal(), None);
        assert_eq!(
            Error::Unauthorized.refusal().map(RefusalReason::status),
            Some(403)
        );
    }

    #[test]
    fn a_reported_name_is_cut_exactly_at_its_limit() {
        let at = vec![b'x'; MAX_REPORTED_NAME_BYTES];
        let over = vec![b'x'; MAX_REPORTED_NAME_BYTES + 1];
        assert_eq!(reported_name(&at).len(), MAX_REPORTED_NAME_BYTES);
        assert_eq!(reported_name(&over).len(), MAX_REPORTED_NAME_BYTES);
    }
}
