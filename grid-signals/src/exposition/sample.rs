//! What one exposition line means once parsed: a sample, metadata, a comment or `# EOF`.

use super::labels::Labels;

/// One sample line, borrowed from the body it was parsed from.
///
/// Histogram and summary parts (`_bucket` with `le`, `_sum`, `_count`, `quantile`) are
/// ordinary samples; grouping them is the caller's business.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample<'a> {
    /// The metric name, e.g. `llm_d_epp_ready_endpoints`.
    pub name: &'a str,
    /// The label set, validated and split on demand.
    pub labels: Labels<'a>,
    /// The value; `NaN` and the infinities are kept.
    pub value: f64,
    /// The exporter's own timestamp, in milliseconds since the Unix epoch, when written.
    pub timestamp_ms: Option<i64>,
}

/// A sample that outlives its body, e.g. to keep in a store or feed a writer.
#[derive(Clone, Debug, PartialEq)]
pub struct OwnedSample {
    /// The metric name.
    pub name: String,
    /// `(name, value)` pairs, values unescaped, in written order.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
    /// Milliseconds since the Unix epoch, when the exposition carried a timestamp.
    pub timestamp_ms: Option<i64>,
}

impl Sample<'_> {
    /// Copies the sample out of its body, unescaping label values and keeping their order.
    pub fn to_owned_sample(&self) -> OwnedSample {
        OwnedSample {
            name: self.name.to_owned(),
            labels: self
                .labels
                .iter()
                .map(|(n, v)| (n.to_owned(), v.unescaped().into_owned()))
                .collect(),
            value: self.value,
            timestamp_ms: self.timestamp_ms,
        }
    }
}

/// One non-blank line of an exposition, as the lenient iterator reports it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Line<'a> {
    /// A sample line.
    Sample(Sample<'a>),
    /// `# HELP name text`; the text keeps its `\\` and `\n` escapes.
    Help {
        /// The metric family the help is for.
        name: &'a str,
        /// The help text as written.
        text: &'a str,
    },
    /// `# TYPE name kind`.
    Type {
        /// The metric family.
        name: &'a str,
        /// Its declared type.
        kind: MetricType,
    },
    /// `# UNIT name unit` (`OpenMetrics`). Text 0.0.4 gives `# UNIT` no meaning, so any
    /// other line starting `# UNIT` is a [`Line::Comment`].
    Unit {
        /// The metric family.
        name: &'a str,
        /// The unit as written.
        unit: &'a str,
    },
    /// Any other `#` line; the text after `#` and its leading blanks.
    Comment(&'a str),
    /// `# EOF`, the `OpenMetrics` end marker.
    Eof,
}

/// A metric family's declared type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MetricType {
    /// `counter`.
    Counter,
    /// `gauge`.
    Gauge,
    /// `histogram`.
    Histogram,
    /// `summary`.
    Summary,
    /// `untyped`.
    Untyped,
    /// `unknown` (`OpenMetrics`' name for untyped).
    Unknown,
    /// `gaugehistogram` (`OpenMetrics`).
    GaugeHistogram,
    /// `stateset` (`OpenMetrics`).
    StateSet,
    /// `info` (`OpenMetrics`).
    Info,
}

impl MetricType {
    /// The type as written in a `# TYPE` line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
            Self::Summary => "summary",
            Self::Untyped => "untyped",
            Self::Unknown => "unknown",
            Self::GaugeHistogram => "gaugehistogram",
            Self::StateSet => "stateset",
            Self::Info => "info",
        }
    }

    /// Every type, in declaration order.
    pub const ALL: [MetricType; 9] = [
        Self::Counter,
        Self::Gauge,
        Self::Histogram,
        Self::Summary,
        Self::Untyped,
        Self::Unknown,
        Self::GaugeHistogram,
        Self::StateSet,
        Self::Info,
    ];

    /// The type a `# TYPE` line names, if it is one.
    pub fn from_text(text: &str) -> Option<Self> {
        Some(match text {
            "counter" => Self::Counter,
            "gauge" => Self::Gauge,
            "histogram" => Self::Histogram,
            "summary" => Self::Summary,
            "untyped" => Self::Untyped,
            "unknown" => Self::Unknown,
            "gaugehistogram" => Self::GaugeHistogram,
            "stateset" => Self::StateSet,
            "info" => Self::Info,
            _ => return None,
        })
    }
}

#[cfg(test)]
#[allow(
    clippy::float_cmp,
    reason = "parsed values must be exactly the written ones"
)]
mod tests {
    use super::*;

    #[test]
    fn metric_types_round_trip_through_their_text() {
        for kind in MetricType::ALL {
            assert_eq!(MetricType::from_text(kind.as_str()), Some(kind));
        }
        assert_eq!(MetricType::from_text("Counter"), None);
    }

    #[test]
    fn owned_sample_unescapes_and_keeps_order() {
        let s = Sample {
            name: "m",
            labels: Labels::from_validated(r#"z="a\"b",a="c""#, 2),
            value: 1.5,
            timestamp_ms: Some(7),
        };
        let owned = s.to_owned_sample();
        assert_eq!(
            owned.labels,
            vec![("z".into(), "a\"b".into()), ("a".into(), "c".into())]
        );
        assert_eq!(owned.timestamp_ms, Some(7));
    }
}
