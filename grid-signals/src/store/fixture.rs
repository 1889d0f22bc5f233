//! Builders shared by the store's unit tests.

use super::{IngestReport, Sender, Store, StoreConfig};
use crate::batch::{Batch, BatchMeta, Fence, Row};

/// A wall-clock instant to start tests from (November 2023, in milliseconds).
pub(crate) const T0: u64 = 1_700_000_000_000;

/// Metadata for `samples` rows of provider `provider` at `site`, revision (`uid`, 1,
/// `epoch`), stamped `stamp`.
pub(crate) fn meta(
    site: &str,
    provider: &str,
    uid: &str,
    fence: Fence,
    samples: u64,
    stamp: u64,
) -> BatchMeta {
    BatchMeta::new(site, provider, uid, fence, samples, 1, stamp).expect("valid test metadata")
}

/// A complete batch of unlabeled rows `(metric, value)`, all stamped `stamp`.
pub(crate) fn batch(
    site: &str,
    provider: &str,
    fence: Fence,
    rows: &[(&str, f64)],
    stamp: u64,
) -> Batch {
    let rows: Vec<Row> = rows
        .iter()
        .map(|&(name, value)| Row::new(name, vec![], value, stamp).expect("valid test row"))
        .collect();
    Batch::new(
        meta(site, provider, "u1", fence, rows.len() as u64, stamp),
        rows,
    )
}

/// The exposition text of `batches`.
pub(crate) fn body(batches: &[Batch]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in batches {
        b.write(&mut out);
    }
    out
}

/// A store with the default config.
pub(crate) fn store() -> Store {
    Store::new(StoreConfig::default())
}

/// Admits `batch` from the local operator, dated and received at `now`.
pub(crate) fn admit(store: &mut Store, batch: Batch, now: u64) -> IngestReport {
    let mut report = IngestReport::default();
    store.ingest_batch(batch, Sender::Local, now, now, &mut report);
    report
}
