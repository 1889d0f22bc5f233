//! The store's caps and time bounds, each a named constant with a boundary test.

/// Most (site, provider) entries the store holds in total.
///
/// Past it a batch for a provider the store does not know yet is refused (`cap`): the
/// newcomer's data, never an entry already held.
pub const MAX_PROVIDERS: usize = 1024;

/// Most providers one site (the owner of a batch) may hold, so one site cannot use up the
/// room of the others.
pub const MAX_PROVIDERS_PER_SITE: usize = 64;

/// Most distinct metric names one provider may hold.
pub const MAX_METRICS_PER_PROVIDER: usize = 32;

/// Most series (metric name plus extra labels) one provider may hold; per-endpoint series
/// grow with the pool, so this also bounds endpoint churn within a TTL.
pub const MAX_SERIES_PER_PROVIDER: usize = 256;

/// Most readings one series' window keeps. A window is a ring: the newest reading pushes
/// out the oldest, because the newest is the one that matters.
pub const MAX_SAMPLES_PER_SERIES: usize = 64;

/// Longest publication, in bytes of its wire lines, whose exact bytes an entry keeps so
/// that a byte-identical repeat (the relay of an unchanged provider, every second) is
/// recognized by comparison, without parsing its rows.
///
/// A realistic batch (21 rows) is about 2.5 KiB and the largest valid one
/// ([`crate::batch::MAX_BATCH_SAMPLES`] per-endpoint rows) about 40 KiB. A longer one,
/// padded with comments, is still recognized as a repeat, by decoding it: this bounds
/// memory, not behaviour.
pub const MAX_HELD_BATCH_BYTES: usize = 64 * 1024;

/// How far a row may be stamped after the body's reference time (its HTTP `Date`, which
/// has one-second resolution), in milliseconds. Later than that is `skew`.
pub const MAX_FUTURE_STAMP_MS: u64 = 1_000;

/// How far a row may be stamped before the body's reference time, in milliseconds.
/// Older than that is implausible (a broken clock, not a slow network) and is `skew`.
pub const MAX_SAMPLE_AGE_MS: u64 = 600_000;

/// How long an entry whose readings have all expired keeps its fence, in milliseconds.
///
/// Longer than [`MAX_SAMPLE_AGE_MS`], so by the time a fence is forgotten any batch it
/// would have refused carries stamps too old to be accepted anyway.
pub const FENCE_RETENTION_MS: u64 = 2 * MAX_SAMPLE_AGE_MS;

/// Default signal TTL, in milliseconds: readings older than this expire, and metadata
/// older than this is stale (learning pauses).
pub const DEFAULT_TTL_MS: u64 = 30_000;

/// Most events waiting for [`super::Store::poll_event`]. Events coalesce per provider, so
/// this is reached only when the reader stops polling; the queue then collapses into one
/// [`super::StoreEvent::Resync`].
pub const MAX_PENDING_EVENTS: usize = 2 * MAX_PROVIDERS;

#[cfg(test)]
// Stored values are copies of the ones sent, so exact comparison is the point.
#[allow(clippy::float_cmp)]
mod tests {
    use super::super::fixture::{T0, admit, batch, meta};
    use super::super::{DropReason, Sender, Store, StoreConfig};
    use super::*;
    use crate::batch::{Batch, Fence, Row};

    fn one(site: &str, provider: &str) -> Batch {
        batch(site, provider, Fence::new(T0, 1), &[("q", 1.0)], T0)
    }

    #[test]
    fn a_site_holds_max_providers_per_site_and_the_next_is_cap_for_that_site_only() {
        let mut s = Store::new(StoreConfig::default());
        for p in 0..MAX_PROVIDERS_PER_SITE {
            assert_eq!(
                admit(&mut s, one("b", &format!("p{p}")), T0).batches_stored,
                1
            );
        }
        let r = admit(&mut s, one("b", "extra"), T0);
        assert_eq!(r.dropped.get(DropReason::Cap), 2);
        // Another owner is unaffected, and so are the site's existing providers.
        assert_eq!(admit(&mut s, one("c", "p0"), T0).batches_stored, 1);
        let next = batch("b", "p0", Fence::new(T0, 2), &[("q", 2.0)], T0);
        assert_eq!(admit(&mut s, next, T0).batches_stored, 1);
    }

    #[test]
    fn the_store_holds_max_providers_and_the_next_newcomer_is_cap() {
        let mut s = Store::new(StoreConfig::default());
        let sites = MAX_PROVIDERS / MAX_PROVIDERS_PER_SITE;
        for site in 0..sites {
            for p in 0..MAX_PROVIDERS_PER_SITE {
                admit(&mut s, one(&format!("s{site}"), &format!("p{p}")), T0);
            }
        }
        assert_eq!(s.len(), MAX_PROVIDERS);
        let r = admit(&mut s, one("newcomer", "p0"), T0);
        assert_eq!(r.dropped.get(DropReason::Cap), 2);
        assert_eq!(s.len(), MAX_PROVIDERS);
        // Held providers keep updating.
        let next = batch("s0", "p0", Fence::new(T0, 2), &[("q", 2.0)], T0);
        assert_eq!(admit(&mut s, next, T0).batches_stored, 1);
    }

    fn rows(names: impl Iterator<Item = (String, Vec<(String, String)>)>) -> Vec<Row> {
        names
            .map(|(n, l)| Row::new(n, l, 1.0, T0).unwrap())
            .collect()
    }

    #[test]
    fn a_provider_holds_max_metric_names_and_the_next_is_cap() {
        let mut s = Store::new(StoreConfig::default());
        let names = (0..=MAX_METRICS_PER_PROVIDER).map(|i| (format!("m{i}"), vec![]));
        let rows = rows(names);
        let b = Batch::new(
            meta("b", "p", "u", Fence::new(T0, 1), rows.len() as u64, T0),
            rows,
        );
        let r = admit(&mut s, b, T0);
        assert_eq!(r.rows_stored, MAX_METRICS_PER_PROVIDER as u64);
        assert_eq!(r.dropped.get(DropReason::Cap), 1);
        let e = s.entry("b", "p").unwrap();
        assert_eq!(e.metric_names().count(), MAX_METRICS_PER_PROVIDER);
        assert!(
            e.latest(&format!("m{MAX_METRICS_PER_PROVIDER}"), &[])
                .is_none()
        );
    }

    #[test]
    fn a_provider_holds_max_series_and_the_next_is_cap() {
        let mut s = Store::new(StoreConfig::default());
        let endpoint = |i: usize| ("e".to_owned(), vec![("ep".to_owned(), format!("{i}"))]);
        let first = rows((0..MAX_SERIES_PER_PROVIDER).map(endpoint));
        let b = Batch::new(
            meta("b", "p", "u", Fence::new(T0, 1), first.len() as u64, T0),
            first,
        );
        assert_eq!(
            admit(&mut s, b, T0).rows_stored,
            MAX_SERIES_PER_PROVIDER as u64
        );
        let more = rows([endpoint(0), endpoint(MAX_SERIES_PER_PROVIDER)].into_iter());
        let b = Batch::new(meta("b", "p", "u", Fence::new(T0, 2), 2, T0), more);
        let r = admit(&mut s, b, T0);
        assert_eq!((r.rows_stored, r.dropped.get(DropReason::Cap)), (1, 1));
        assert_eq!(
            s.entry("b", "p").unwrap().series_count(),
            MAX_SERIES_PER_PROVIDER
        );
    }

    #[test]
    fn a_series_keeps_max_samples_per_series_readings() {
        let mut s = Store::new(StoreConfig::default());
        for seq in 0..=MAX_SAMPLES_PER_SERIES as u64 {
            let b = batch(
                "b",
                "p",
                Fence::new(T0, seq),
                &[("q", seq as f64)],
                T0 + seq,
            );
            admit(&mut s, b, T0 + seq);
        }
        let e = s.entry("b", "p").unwrap();
        let held: Vec<f64> = e
            .series("q")
            .next()
            .unwrap()
            .readings()
            .map(|r| r.value)
            .collect();
        assert_eq!(held.len(), MAX_SAMPLES_PER_SERIES);
        assert_eq!(held[0], 1.0);
        assert_eq!(*held.last().unwrap(), MAX_SAMPLES_PER_SERIES as f64);
    }

    /// A one-row batch whose bytes (metadata line to last row) are exactly `len` long,
    /// padded by a comment line between the metadata line and the row.
    fn padded_body(len: usize) -> Vec<u8> {
        let mut plain = Vec::new();
        batch("b", "p", Fence::new(T0, 1), &[("q", 1.0)], T0).write(&mut plain);
        let split = plain.iter().position(|&b| b == b'\n').unwrap() + 1;
        let mut body = plain[..split].to_vec();
        body.push(b'#');
        body.resize(split + len - plain.len() - 1, b'x');
        body.push(b'\n');
        body.extend_from_slice(&plain[split..]);
        assert_eq!(body.len(), len);
        body
    }

    #[test]
    fn a_publication_of_max_held_batch_bytes_is_kept_as_bytes_and_one_more_is_not() {
        for (len, kept) in [
            (MAX_HELD_BATCH_BYTES, true),
            (MAX_HELD_BATCH_BYTES + 1, false),
        ] {
            let body = padded_body(len);
            let mut s = Store::new(StoreConfig::default());
            assert_eq!(s.ingest(&body, Sender::Local, T0, T0).batches_stored, 1);
            assert_eq!(s.entry("b", "p").unwrap().holds_bytes(), kept, "{len}");
            // Either way an exact repeat is a repeat: the bound is on memory only.
            let again = s.ingest(&body, Sender::Local, T0, T0 + 1);
            assert_eq!((again.batches_repeated, again.dropped.total()), (1, 0));
        }
    }

    #[test]
    fn fence_retention_outlasts_the_sample_age_bound() {
        const { assert!(FENCE_RETENTION_MS > MAX_SAMPLE_AGE_MS) };
        const { assert!(MAX_PROVIDERS_PER_SITE <= MAX_PROVIDERS) };
        const { assert!(MAX_PENDING_EVENTS >= MAX_PROVIDERS) };
    }
}
