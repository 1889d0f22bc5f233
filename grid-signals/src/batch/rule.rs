//! The closed set of wire rules a batch can break.

/// Which rule of `docs/wire.md` a metadata line or a batch row broke.
///
/// A closed set so every refusal maps to one drop reason and one test; `as_str` is the
/// stable spelling used in error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BatchRule {
    /// A required label is absent.
    MissingLabel,
    /// A label the metadata line does not define, or one given twice.
    UnexpectedLabel,
    /// A string that must not be empty is empty.
    Empty,
    /// A string is longer than its byte bound.
    TooLong,
    /// Not a canonical decimal `u64` (digits only, no sign, no leading zero, fits `u64`).
    Decimal,
    /// The generation value is not a whole number in `0..=MAX_GENERATION`.
    Generation,
    /// The line carries no timestamp, which every batch line needs.
    MissingTimestamp,
    /// The timestamp is before the Unix epoch.
    NegativeTimestamp,
    /// A metric or label name outside the Prometheus name alphabet.
    Name,
    /// A row uses a name or label reserved for the batch framing.
    Reserved,
    /// More extra labels than `MAX_EXTRA_LABELS`.
    TooManyLabels,
    /// `batch_samples` above `MAX_BATCH_SAMPLES`.
    TooManySamples,
    /// A row value is NaN, which orders against nothing.
    NotANumber,
}

impl BatchRule {
    /// The stable `snake_case` spelling of the rule.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MissingLabel => "missing_label",
            Self::UnexpectedLabel => "unexpected_label",
            Self::Empty => "empty",
            Self::TooLong => "too_long",
            Self::Decimal => "decimal",
            Self::Generation => "generation",
            Self::MissingTimestamp => "missing_timestamp",
            Self::NegativeTimestamp => "negative_timestamp",
            Self::Name => "name",
            Self::Reserved => "reserved",
            Self::TooManyLabels => "too_many_labels",
            Self::TooManySamples => "too_many_samples",
            Self::NotANumber => "not_a_number",
        }
    }

    /// Whether breaking this rule means "over a size bound" rather than "malformed":
    /// the store counts the first as `cap` and the second by where it happened.
    pub fn is_bound(self) -> bool {
        matches!(
            self,
            Self::TooLong | Self::TooManyLabels | Self::TooManySamples
        )
    }
}

#[cfg(test)]
mod tests {
    use super::BatchRule;

    #[test]
    fn only_size_rules_count_as_bounds() {
        assert!(BatchRule::TooLong.is_bound());
        assert!(BatchRule::TooManySamples.is_bound());
        assert!(BatchRule::TooManyLabels.is_bound());
        assert!(!BatchRule::Decimal.is_bound());
        assert!(!BatchRule::NotANumber.is_bound());
    }

    #[test]
    fn error_message_names_field_and_rule() {
        let e = crate::Error::Batch {
            field: "publisher_epoch",
            rule: BatchRule::Decimal,
        };
        assert_eq!(
            e.to_string(),
            "batch field `publisher_epoch` breaks the wire rule `decimal`"
        );
    }
}
