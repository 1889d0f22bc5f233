//! The metadata line that opens a batch, and the label rules it follows.

use super::bounds::{MAX_BATCH_SAMPLES, MAX_GENERATION, MAX_KEY_BYTES, MAX_UID_BYTES};
use super::{BatchRule, Fence, Revision};
use crate::Error;

/// Metric name of the metadata line that opens every batch.
pub const METADATA_NAME: &str = "grid_provider_config_generation";
/// Label naming the site whose provider the batch describes (on every batch line).
pub const SITE_LABEL: &str = "grid_site";
/// Label naming the provider the batch describes (on every batch line).
pub const PROVIDER_LABEL: &str = "grid_provider";
/// Metadata label: the provider object's UID.
pub const UID_LABEL: &str = "provider_uid";
/// Metadata label: the publisher epoch, a decimal `u64`.
pub const EPOCH_LABEL: &str = "publisher_epoch";
/// Metadata label: the batch sequence within the epoch, a decimal `u64`.
pub const SEQUENCE_LABEL: &str = "batch_sequence";
/// Metadata label: how many sample rows follow, a decimal `u64`.
pub const SAMPLES_LABEL: &str = "batch_samples";

/// A validated metadata line: who the batch is about, where it stands in the
/// publication order, and how many rows make it whole.
///
/// Only constructible through [`BatchMeta::new`], so every value in hand is within the
/// bounds of `docs/wire.md`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BatchMeta {
    site: String,
    provider: String,
    uid: String,
    fence: Fence,
    samples: u64,
    generation: u64,
    stamp_ms: u64,
}

impl BatchMeta {
    /// Validates the parts of a metadata line.
    ///
    /// `stamp_ms` is when the batch was published, in milliseconds since the Unix epoch.
    pub fn new(
        site: impl Into<String>,
        provider: impl Into<String>,
        uid: impl Into<String>,
        fence: Fence,
        samples: u64,
        generation: u64,
        stamp_ms: u64,
    ) -> Result<Self, Error> {
        let (site, provider, uid) = (site.into(), provider.into(), uid.into());
        check_meta(&site, &provider, &uid, samples, generation)?;
        Ok(Self {
            site,
            provider,
            uid,
            fence,
            samples,
            generation,
            stamp_ms,
        })
    }

    /// Metadata from parts [`check_meta`] already accepted.
    pub(crate) fn from_checked(
        site: &str,
        provider: &str,
        uid: &str,
        fence: Fence,
        samples: u64,
        generation: u64,
        stamp_ms: u64,
    ) -> Self {
        Self {
            site: site.to_owned(),
            provider: provider.to_owned(),
            uid: uid.to_owned(),
            fence,
            samples,
            generation,
            stamp_ms,
        }
    }

    /// Turns this metadata into the given checked parts, reusing its strings' buffers
    /// (see [`super::Row`]'s in-place rewrite: the store's held publication is rewritten
    /// for every batch it admits).
    #[allow(clippy::too_many_arguments, reason = "one argument per metadata field")]
    pub(crate) fn overwrite(
        &mut self,
        site: &str,
        provider: &str,
        uid: &str,
        fence: Fence,
        samples: u64,
        generation: u64,
        stamp_ms: u64,
    ) {
        for (held, new) in [
            (&mut self.site, site),
            (&mut self.provider, provider),
            (&mut self.uid, uid),
        ] {
            if held != new {
                held.clear();
                held.push_str(new);
            }
        }
        self.fence = fence;
        self.samples = samples;
        self.generation = generation;
        self.stamp_ms = stamp_ms;
    }

    /// The `grid_site` the batch describes.
    pub fn site(&self) -> &str {
        &self.site
    }

    /// The `grid_provider` the batch describes.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The provider object's UID.
    pub fn uid(&self) -> &str {
        &self.uid
    }

    /// Where the batch stands in its provider's publication order.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// How many rows make the batch whole.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// The provider's config generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// When the batch was published (milliseconds since the Unix epoch).
    pub fn stamp_ms(&self) -> u64 {
        self.stamp_ms
    }

    /// The revision the batch belongs to.
    pub fn revision(&self) -> Revision {
        Revision {
            uid: self.uid.clone(),
            generation: self.generation,
            epoch: self.fence.epoch,
        }
    }

    /// Whether `other` carries the same revision, without allocating one.
    pub fn same_revision(&self, other: &Revision) -> bool {
        self.uid == other.uid
            && self.generation == other.generation
            && self.fence.epoch == other.epoch
    }
}

/// The metadata rules of `docs/wire.md` besides the decimal formats: names and uid
/// non-empty and within their byte bounds, `batch_samples` and the generation within
/// theirs. Shared by [`BatchMeta::new`] and the store's decoding of borrowed metadata.
pub(crate) fn check_meta(
    site: &str,
    provider: &str,
    uid: &str,
    samples: u64,
    generation: u64,
) -> Result<(), Error> {
    check_bounded(SITE_LABEL, site, MAX_KEY_BYTES)?;
    check_bounded(PROVIDER_LABEL, provider, MAX_KEY_BYTES)?;
    check_bounded(UID_LABEL, uid, MAX_UID_BYTES)?;
    if samples > MAX_BATCH_SAMPLES {
        return Err(Error::Batch {
            field: SAMPLES_LABEL,
            rule: BatchRule::TooManySamples,
        });
    }
    if generation > MAX_GENERATION {
        return Err(Error::Batch {
            field: "value",
            rule: BatchRule::Generation,
        });
    }
    Ok(())
}

/// Checks a non-empty string of at most `max` bytes.
pub(crate) fn check_bounded(field: &'static str, s: &str, max: usize) -> Result<(), Error> {
    if s.is_empty() {
        return Err(Error::Batch {
            field,
            rule: BatchRule::Empty,
        });
    }
    if s.len() > max {
        return Err(Error::Batch {
            field,
            rule: BatchRule::TooLong,
        });
    }
    Ok(())
}

/// Reads a canonical decimal `u64`: ASCII digits only, no sign, no leading zero (except
/// `0` itself), no overflow.
///
/// Canonical so that one number has one spelling and an exact repeat is byte-identical.
pub fn parse_decimal_u64(field: &'static str, s: &str) -> Result<u64, Error> {
    let err = || Error::Batch {
        field,
        rule: BatchRule::Decimal,
    };
    let bytes = s.as_bytes();
    if bytes.is_empty() || (bytes.len() > 1 && bytes[0] == b'0') {
        return Err(err());
    }
    bytes.iter().try_fold(0u64, |acc, &b| {
        if b.is_ascii_digit() {
            acc.checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(b - b'0')))
                .ok_or_else(err)
        } else {
            Err(err())
        }
    })
}

/// Reads the generation carried as the metadata line's value: a whole number in
/// `0..=MAX_GENERATION`.
pub fn generation_from_value(value: f64) -> Result<u64, Error> {
    if value.is_finite() && value >= 0.0 && value.fract() == 0.0 && value <= MAX_GENERATION as f64 {
        Ok(value as u64)
    } else {
        Err(Error::Batch {
            field: "value",
            rule: BatchRule::Generation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(site: &str, uid: &str, samples: u64, generation: u64) -> Result<BatchMeta, Error> {
        BatchMeta::new(site, "p", uid, Fence::new(1, 1), samples, generation, 5)
    }

    fn rule(r: Result<impl std::fmt::Debug, Error>) -> BatchRule {
        match r {
            Err(Error::Batch { rule, .. }) => rule,
            other => panic!("expected a batch error, got {other:?}"),
        }
    }

    #[test]
    fn decimal_accepts_canonical_u64_only() {
        assert_eq!(parse_decimal_u64("f", "0").unwrap(), 0);
        assert_eq!(parse_decimal_u64("f", "11").unwrap(), 11);
        assert_eq!(
            parse_decimal_u64("f", "18446744073709551615").unwrap(),
            u64::MAX
        );
        for bad in [
            "",
            "01",
            "+1",
            "-1",
            "1.0",
            "1e3",
            " 1",
            "18446744073709551616",
        ] {
            assert_eq!(
                rule(parse_decimal_u64("f", bad)),
                BatchRule::Decimal,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn generation_must_be_a_whole_number_within_f64_precision() {
        assert_eq!(generation_from_value(7.0).unwrap(), 7);
        assert_eq!(
            generation_from_value(MAX_GENERATION as f64).unwrap(),
            MAX_GENERATION
        );
        for bad in [
            -1.0,
            1.5,
            f64::NAN,
            f64::INFINITY,
            (MAX_GENERATION as f64) * 2.0,
        ] {
            assert_eq!(rule(generation_from_value(bad)), BatchRule::Generation);
        }
    }

    #[test]
    fn generation_exactly_at_the_bound_is_accepted_and_one_past_refused() {
        assert!(meta("s", "u", 0, MAX_GENERATION).is_ok());
        assert_eq!(
            rule(meta("s", "u", 0, MAX_GENERATION + 1)),
            BatchRule::Generation
        );
    }

    #[test]
    fn site_of_max_key_bytes_is_accepted_and_one_more_refused() {
        assert!(meta(&"s".repeat(MAX_KEY_BYTES), "u", 0, 1).is_ok());
        assert_eq!(
            rule(meta(&"s".repeat(MAX_KEY_BYTES + 1), "u", 0, 1)),
            BatchRule::TooLong
        );
    }

    #[test]
    fn uid_of_max_uid_bytes_is_accepted_and_one_more_refused() {
        assert!(meta("s", &"u".repeat(MAX_UID_BYTES), 0, 1).is_ok());
        assert_eq!(
            rule(meta("s", &"u".repeat(MAX_UID_BYTES + 1), 0, 1)),
            BatchRule::TooLong
        );
    }

    #[test]
    fn batch_samples_at_the_bound_is_accepted_and_one_past_refused() {
        assert!(meta("s", "u", MAX_BATCH_SAMPLES, 1).is_ok());
        assert_eq!(
            rule(meta("s", "u", MAX_BATCH_SAMPLES + 1, 1)),
            BatchRule::TooManySamples
        );
    }

    #[test]
    fn empty_names_are_refused() {
        assert_eq!(rule(meta("", "u", 0, 1)), BatchRule::Empty);
        assert_eq!(rule(meta("s", "", 0, 1)), BatchRule::Empty);
    }

    #[test]
    fn revision_is_uid_generation_and_epoch() {
        let m = BatchMeta::new("s", "p", "u1", Fence::new(9, 3), 2, 7, 5).unwrap();
        let r = m.revision();
        assert_eq!((r.uid.as_str(), r.generation, r.epoch), ("u1", 7, 9));
        assert!(m.same_revision(&r));
        let other = BatchMeta::new("s", "p", "u1", Fence::new(10, 0), 2, 7, 5).unwrap();
        assert!(!other.same_revision(&r));
    }
}
