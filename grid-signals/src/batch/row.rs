//! One sample row of a batch, owned and validated.

use std::borrow::Cow;

use super::BatchRule;
use super::bounds::{MAX_EXTRA_LABELS, MAX_KEY_BYTES, MAX_LABEL_VALUE_BYTES};
use super::meta::{METADATA_NAME, PROVIDER_LABEL, SITE_LABEL, check_bounded};
use crate::Error;
use crate::exposition::{is_label_name, is_metric_name};

/// One reading of a batch: a series (metric name and extra labels) with its value and the
/// time it was observed.
///
/// `grid_site` and `grid_provider` are not stored here: they belong to the batch. Extra
/// labels are kept sorted by name, so one series has one spelling and rows compare by
/// plain equality.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
    stamp_ms: u64,
}

impl Row {
    /// Validates a row: a Prometheus metric name other than the metadata name, at most
    /// [`MAX_EXTRA_LABELS`] extra labels with Prometheus label names (not the framing
    /// labels, none twice) and values of at most [`MAX_LABEL_VALUE_BYTES`], a value that
    /// is not NaN, and a stamp in milliseconds since the Unix epoch.
    pub fn new(
        name: impl Into<String>,
        mut labels: Vec<(String, String)>,
        value: f64,
        stamp_ms: u64,
    ) -> Result<Self, Error> {
        let name = name.into();
        check_row(&name, &mut labels, value)?;
        Ok(Self {
            name,
            labels,
            value,
            stamp_ms,
        })
    }

    /// The row an operator's publication sample travels as: the framing labels
    /// (`grid_site`, `grid_provider`) live on the batch's metadata line, so only the
    /// sample's extra labels stay on the row. One conversion, shared by the operator and
    /// the routing simulator, so both frame publications identically.
    pub fn from_published(sample: &crate::epp::PublishedSample) -> Result<Self, Error> {
        let extra = sample
            .labels
            .iter()
            .filter(|(k, _)| *k != SITE_LABEL && *k != PROVIDER_LABEL)
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        Self::new(sample.name, extra, sample.value, sample.stamp_ms)
    }

    /// A row from parts [`check_row`] already accepted (labels sorted by it).
    pub(crate) fn from_checked(
        name: &str,
        labels: &[(&str, Cow<'_, str>)],
        value: f64,
        stamp_ms: u64,
    ) -> Self {
        Self {
            name: name.to_owned(),
            labels: labels
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.as_ref().to_owned()))
                .collect(),
            value,
            stamp_ms,
        }
    }

    /// The metric name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The extra labels, sorted by name.
    pub fn labels(&self) -> &[(String, String)] {
        &self.labels
    }

    /// The observed value.
    pub fn value(&self) -> f64 {
        self.value
    }

    /// When the value was observed (milliseconds since the Unix epoch).
    pub fn stamp_ms(&self) -> u64 {
        self.stamp_ms
    }

    /// Whether this row's extra labels are exactly `labels` (any order).
    pub fn labels_are(&self, labels: &[(&str, &str)]) -> bool {
        labels_equal(&self.labels, labels)
    }
}

/// The row rules of `docs/wire.md`, checked in a fixed order so every refusal names the
/// same rule whichever way the row arrived; sorts `labels` by name on success.
///
/// Shared by [`Row::new`] and the store's decoding of wire rows, which checks borrowed
/// text without building a `Row`.
pub(crate) fn check_row<N: AsRef<str>, V: AsRef<str>>(
    name: &str,
    labels: &mut [(N, V)],
    value: f64,
) -> Result<(), Error> {
    check_bounded("name", name, MAX_KEY_BYTES)?;
    if !is_metric_name(name) {
        return Err(batch_err("name", BatchRule::Name));
    }
    if name == METADATA_NAME {
        return Err(batch_err("name", BatchRule::Reserved));
    }
    if labels.len() > MAX_EXTRA_LABELS {
        return Err(batch_err("labels", BatchRule::TooManyLabels));
    }
    for (label, text) in labels.iter() {
        let label = label.as_ref();
        check_bounded("label_name", label, MAX_KEY_BYTES)?;
        if !is_label_name(label) {
            return Err(batch_err("label_name", BatchRule::Name));
        }
        if label == SITE_LABEL || label == PROVIDER_LABEL {
            return Err(batch_err("label_name", BatchRule::Reserved));
        }
        if text.as_ref().len() > MAX_LABEL_VALUE_BYTES {
            return Err(batch_err("label_value", BatchRule::TooLong));
        }
    }
    labels.sort_unstable_by(|a, b| a.0.as_ref().cmp(b.0.as_ref()));
    if labels
        .windows(2)
        .any(|w| w[0].0.as_ref() == w[1].0.as_ref())
    {
        return Err(batch_err("label_name", BatchRule::UnexpectedLabel));
    }
    if value.is_nan() {
        return Err(batch_err("value", BatchRule::NotANumber));
    }
    Ok(())
}

/// Whether a sorted owned label set equals a borrowed one given in any order.
pub(crate) fn labels_equal(sorted: &[(String, String)], labels: &[(&str, &str)]) -> bool {
    sorted.len() == labels.len()
        && labels
            .iter()
            .all(|(n, v)| sorted.iter().any(|(sn, sv)| sn == n && sv == v))
}

fn batch_err(field: &'static str, rule: BatchRule) -> Error {
    Error::Batch { field, rule }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(n: usize) -> Vec<(String, String)> {
        (0..n).map(|i| (format!("l{i}"), "v".to_owned())).collect()
    }

    #[test]
    fn a_published_sample_keeps_only_its_extra_labels_on_the_row() {
        let sample = crate::epp::PublishedSample {
            name: "llm_d_epp_per_endpoint_queue_size",
            labels: vec![
                (SITE_LABEL, "a".to_owned()),
                (PROVIDER_LABEL, "p".to_owned()),
                ("model_server_endpoint", "10.0.0.1:8000".to_owned()),
            ],
            value: 3.0,
            stamp_ms: 1_700_000_000_000,
        };
        let row = Row::from_published(&sample).expect("valid");
        assert_eq!(row.name(), "llm_d_epp_per_endpoint_queue_size");
        assert_eq!(
            row.labels(),
            &[(
                "model_server_endpoint".to_owned(),
                "10.0.0.1:8000".to_owned()
            )]
        );
        assert!((row.value() - 3.0).abs() < f64::EPSILON);
    }

    fn rule(r: Result<Row, Error>) -> BatchRule {
        match r {
            Err(Error::Batch { rule, .. }) => rule,
            other => panic!("expected a batch error, got {other:?}"),
        }
    }

    #[test]
    fn labels_are_sorted_so_one_series_has_one_spelling() {
        let row = Row::new(
            "m",
            vec![("b".into(), "2".into()), ("a".into(), "1".into())],
            1.0,
            5,
        )
        .unwrap();
        assert_eq!(row.labels()[0].0, "a");
        assert!(row.labels_are(&[("b", "2"), ("a", "1")]));
        assert!(!row.labels_are(&[("a", "1")]));
    }

    #[test]
    fn extra_labels_at_the_bound_are_accepted_and_one_more_refused() {
        assert!(Row::new("m", labels(MAX_EXTRA_LABELS), 1.0, 5).is_ok());
        assert_eq!(
            rule(Row::new("m", labels(MAX_EXTRA_LABELS + 1), 1.0, 5)),
            BatchRule::TooManyLabels
        );
    }

    #[test]
    fn metric_name_of_max_key_bytes_is_accepted_and_one_more_refused() {
        assert!(Row::new("m".repeat(MAX_KEY_BYTES), vec![], 1.0, 5).is_ok());
        assert_eq!(
            rule(Row::new("m".repeat(MAX_KEY_BYTES + 1), vec![], 1.0, 5)),
            BatchRule::TooLong
        );
    }

    #[test]
    fn label_name_of_max_key_bytes_is_accepted_and_one_more_refused() {
        let ok = vec![("l".repeat(MAX_KEY_BYTES), "v".to_owned())];
        assert!(Row::new("m", ok, 1.0, 5).is_ok());
        let long = vec![("l".repeat(MAX_KEY_BYTES + 1), "v".to_owned())];
        assert_eq!(rule(Row::new("m", long, 1.0, 5)), BatchRule::TooLong);
    }

    #[test]
    fn label_value_of_max_bytes_is_accepted_and_one_more_refused() {
        let ok = vec![("l".to_owned(), "v".repeat(MAX_LABEL_VALUE_BYTES))];
        assert!(Row::new("m", ok, 1.0, 5).is_ok());
        let long = vec![("l".to_owned(), "v".repeat(MAX_LABEL_VALUE_BYTES + 1))];
        assert_eq!(rule(Row::new("m", long, 1.0, 5)), BatchRule::TooLong);
    }

    #[test]
    fn framing_names_and_labels_are_reserved() {
        assert_eq!(
            rule(Row::new(METADATA_NAME, vec![], 1.0, 5)),
            BatchRule::Reserved
        );
        let site = vec![(SITE_LABEL.to_owned(), "b".to_owned())];
        assert_eq!(rule(Row::new("m", site, 1.0, 5)), BatchRule::Reserved);
    }

    #[test]
    fn malformed_rows_are_refused() {
        assert_eq!(rule(Row::new("1m", vec![], 1.0, 5)), BatchRule::Name);
        assert_eq!(
            rule(Row::new("m", vec![], f64::NAN, 5)),
            BatchRule::NotANumber
        );
        let twice = vec![
            ("a".to_owned(), "1".to_owned()),
            ("a".to_owned(), "2".to_owned()),
        ];
        assert_eq!(
            rule(Row::new("m", twice, 1.0, 5)),
            BatchRule::UnexpectedLabel
        );
        let bad_label = vec![("a:b".to_owned(), "1".to_owned())];
        assert_eq!(rule(Row::new("m", bad_label, 1.0, 5)), BatchRule::Name);
    }

    #[test]
    fn infinities_are_kept_because_they_order() {
        assert!(Row::new("m", vec![], f64::INFINITY, 5).is_ok());
    }
}
