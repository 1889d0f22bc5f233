//! What the parser expected when a line did not match the exposition grammar.

use std::fmt;

crate::label_values! {
    /// The closed set of reasons a line is refused, each naming what the parser expected
    /// at the reported column.
    ///
    /// Callers count refused lines by [`SyntaxError::as_str`], so the set is closed and each
    /// reason is a stable metric label.
    #[non_exhaustive]
    pub enum SyntaxError {
        /// Expected a metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
        MetricName,
        /// Expected `{` or a blank right after the metric name.
        NameEnd,
        /// Expected a label name (`[a-zA-Z_][a-zA-Z0-9_]*`).
        LabelName,
        /// Expected `=` after a label name.
        LabelEquals,
        /// Expected a double-quoted label value with only `\\`, `\"` and `\n` escapes,
        /// closed on the same line.
        LabelValue,
        /// Expected `,` or `}` after a label value.
        LabelSeparator,
        /// Expected a sample value (a float as Go prints it: `1`, `1.5e-07`, `NaN`, `+Inf`).
        Value,
        /// Expected an integer millisecond timestamp.
        Timestamp,
        /// Expected the end of the line.
        LineEnd,
        /// The line is not valid UTF-8.
        Utf8,
        /// Expected a metric type (`counter`, `gauge`, `histogram`, `summary`, `untyped`, or
        /// an `OpenMetrics` type) in a `# TYPE` line.
        MetricType,
        /// A label name the sample already has: given twice, or `__name__`, which the metric
        /// name sets. Prometheus refuses such a series, so reading it would keep a sample
        /// whose labels mean two things.
        DuplicateLabel,
    }
}

impl SyntaxError {
    fn expected(self) -> &'static str {
        match self {
            Self::MetricName => "a metric name",
            Self::NameEnd => "'{' or a blank after the metric name",
            Self::LabelName => "a label name",
            Self::LabelEquals => "'=' after the label name",
            Self::LabelValue => "a double-quoted label value (escapes: \\\\ \\\" \\n)",
            Self::LabelSeparator => "',' or '}' after the label value",
            Self::Value => "a sample value",
            Self::Timestamp => "an integer millisecond timestamp",
            Self::LineEnd => "the end of the line",
            Self::Utf8 => "valid UTF-8",
            Self::MetricType => "a metric type",
            Self::DuplicateLabel => "a label name the sample does not already have",
        }
    }
}

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "expected {}", self.expected())
    }
}

#[cfg(test)]
mod tests {
    use super::SyntaxError;

    #[test]
    fn every_reason_has_a_distinct_label() {
        let mut labels: Vec<&str> = SyntaxError::ALL.iter().map(|k| k.as_str()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), SyntaxError::ALL.len());
    }

    #[test]
    fn display_names_what_was_expected() {
        assert_eq!(
            SyntaxError::LabelEquals.to_string(),
            "expected '=' after the label name"
        );
    }
}
