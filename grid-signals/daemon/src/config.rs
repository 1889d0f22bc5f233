//! The configuration vocabulary of both daemons: one name rule, durations as seconds
//! (fractional allowed) within named bounds, and one error that names the key as the
//! file spells it.
//!
//! Both files use camelCase keys and `...Seconds` durations, the dialect the Kubernetes
//! resources will use, so a value moves between a file and a resource unchanged.

use std::time::Duration;

/// The longest site, peer, provider or replica name: a DNS label.
pub const MAX_NAME_LEN: usize = 63;

/// The inclusive range a duration must fall in, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The shortest accepted.
    pub min_ms: u64,
    /// The longest accepted.
    pub max_ms: u64,
}

/// Checks a site, peer, provider or replica name: a DNS label (1 to [`MAX_NAME_LEN`] of
/// `a-z`, `0-9`, `-`, not starting or ending with `-`), because it ends up in a SPIFFE
/// ID, a certificate name and a Kubernetes object name.
pub fn name(field: &str, name: &str) -> Result<(), crate::Error> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(crate::Error::config_field(
            field,
            format!(
                "`{name}` is not a DNS label (1 to {MAX_NAME_LEN} of a-z, 0-9, `-`, not starting or ending with `-`)"
            ),
        ))
    }
}

/// Checks a SPIFFE trust domain: lowercase letters, digits, `-`, `.`, `_`, at most 255
/// bytes (the SPIFFE ID specification's character set).
pub fn trust_domain(field: &str, domain: &str) -> Result<(), crate::Error> {
    let ok = !domain.is_empty()
        && domain.len() <= 255
        && domain.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.' || b == b'_'
        });
    if ok {
        Ok(())
    } else {
        Err(crate::Error::config_field(
            field,
            format!(
                "`{domain}` is not a SPIFFE trust domain (lowercase letters, digits, `-`, `.`, `_`)"
            ),
        ))
    }
}

/// A duration given in seconds (fractional allowed), `default` when absent, refused
/// outside `bounds`.
pub fn seconds(
    field: &str,
    seconds: Option<f64>,
    default: Duration,
    bounds: Bounds,
) -> Result<Duration, crate::Error> {
    let Some(s) = seconds else {
        return Ok(default);
    };
    let ms = s * 1000.0;
    if !ms.is_finite() || ms < bounds.min_ms as f64 || ms > bounds.max_ms as f64 {
        return Err(crate::Error::config_field(
            field,
            format!(
                "{s} s is outside {} s to {} s",
                bounds.min_ms as f64 / 1000.0,
                bounds.max_ms as f64 / 1000.0
            ),
        ));
    }
    Ok(Duration::from_micros((s * 1e6).round() as u64))
}

/// A whole number refused outside `lo..=hi`.
pub fn range(field: &str, v: u64, lo: u64, hi: u64) -> Result<(), crate::Error> {
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(crate::Error::config_field(
            field,
            format!("is {v}, must be within {lo}..={hi}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(e: &crate::Error) -> &str {
        match e {
            crate::Error::ConfigField { field, .. } => field,
            other => panic!("not a field refusal: {other}"),
        }
    }

    const B: Bounds = Bounds {
        min_ms: 100,
        max_ms: 3_600_000,
    };

    #[test]
    fn a_name_is_a_dns_label_up_to_its_cap() {
        assert!(name("site", &"a".repeat(MAX_NAME_LEN)).is_ok());
        assert!(name("site", &"a".repeat(MAX_NAME_LEN + 1)).is_err());
        for bad in ["", "Site_A", "-a", "a-", "a.b", "A"] {
            assert_eq!(field_of(&name("site", bad).unwrap_err()), "site", "{bad:?}");
        }
        assert!(name("site", "site-a-0").is_ok());
    }

    #[test]
    fn seconds_are_fractional_and_bounded_at_both_ends() {
        let d = Duration::from_secs(1);
        assert_eq!(seconds("x", None, d, B).unwrap(), d);
        assert_eq!(
            seconds("x", Some(0.1), d, B).unwrap(),
            Duration::from_millis(100)
        );
        assert_eq!(
            seconds("x", Some(3600.0), d, B).unwrap(),
            Duration::from_secs(3600)
        );
        for bad in [0.099, 3600.001, f64::NAN, f64::INFINITY, -1.0] {
            let e = seconds("intervals.scrapeSeconds", Some(bad), d, B).unwrap_err();
            assert_eq!(field_of(&e), "intervals.scrapeSeconds");
            assert!(e.to_string().contains("0.1 s to 3600 s"), "{e}");
        }
    }

    #[test]
    fn a_range_is_inclusive_and_its_error_names_the_field() {
        assert!(range("n", 1, 1, 2).is_ok() && range("n", 2, 1, 2).is_ok());
        assert_eq!(
            range("n", 3, 1, 2).unwrap_err().to_string(),
            "`n` is 3, must be within 1..=2"
        );
    }
}
