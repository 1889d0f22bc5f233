//! The crate's one error type and the closed set of reasons a reading is refused.

use std::sync::Arc;

grid_signals::label_values! {
    label "reason";
    /// Why a reading or candidate was refused; the label of the refusal counter.
    ///
    /// Closed on purpose: each reason is one metric label, so the label set stays bounded.
    pub enum RejectReason {
        /// A value was NaN or infinite; arithmetic on it would poison capacity and rho.
        NonFinite,
        /// A count or fraction was below zero, which no EPP series can be.
        Negative,
        /// More serving units reported waiting work than units exist.
        WaitingExceedsUnits,
        /// The scorer already tracks [`crate::MAX_CANDIDATES`] site/provider pairs.
        CandidateCap,
    }
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why `grid-score` refused an input. A refusal never changes learned state.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// One field of a reading was unusable; the whole reading is dropped so a half-valid
    /// instant never mixes with the previous one.
    #[error("reading for {site}/{provider} refused: field {field}: {reason}")]
    Reading {
        /// Site the reading was for.
        site: Arc<str>,
        /// Provider the reading was for.
        provider: Arc<str>,
        /// The [`crate::Reading`] field that was refused.
        field: &'static str,
        /// Why.
        reason: RejectReason,
    },
    /// A new site/provider pair arrived while [`crate::MAX_CANDIDATES`] were tracked.
    #[error("candidate cap of {limit} reached; {site}/{provider} not tracked")]
    CandidateCap {
        /// The cap that was reached.
        limit: usize,
        /// Site of the refused candidate.
        site: Arc<str>,
        /// Provider of the refused candidate.
        provider: Arc<str>,
    },
    /// A request body has no routable `model` (a 400 answer).
    #[error("{0}")]
    ModelField(#[from] crate::model_field::BodyRefusal),
}

impl Error {
    /// The reading-refusal counter's label, for a refused reading or candidate; `None`
    /// for a refused request body (counted by the gateway's answers instead).
    pub const fn reason(&self) -> Option<RejectReason> {
        match self {
            Self::Reading { reason, .. } => Some(*reason),
            Self::CandidateCap { .. } => Some(RejectReason::CandidateCap),
            Self::ModelField(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_labels_are_distinct_snake_case() {
        let labels: std::collections::HashSet<_> =
            RejectReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels.len(), RejectReason::ALL.len());
        for label in labels {
            assert!(label.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
        }
    }

    #[test]
    fn error_names_the_field_and_reason() {
        let e = Error::Reading {
            site: "a".into(),
            provider: "p".into(),
            field: "kv_mean",
            reason: RejectReason::NonFinite,
        };
        assert_eq!(e.reason(), Some(RejectReason::NonFinite));
        assert_eq!(
            e.to_string(),
            "reading for a/p refused: field kv_mean: non_finite"
        );
    }
}
