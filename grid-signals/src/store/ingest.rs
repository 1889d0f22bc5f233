//! Admitting batches into the store.

use super::decode::decode_batches;
use super::entry::RowRefusal;
use super::learning::Lifetime;
use super::{DropCounts, DropReason, MAX_FUTURE_STAMP_MS, MAX_SAMPLE_AGE_MS, Store, StoreEvent};
use crate::batch::{Admission, Batch, epoch_too_far};
use crate::exposition::MAX_EXPOSITION_BYTES;

/// Who sent a body, as verified by the transport (mTLS identity), not as claimed by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sender<'a> {
    /// A peer operator of site `site`: only batches for its own site are accepted.
    Peer {
        /// The site of the peer's verified identity.
        site: &'a str,
    },
    /// The local operator (its own publications, or its relay to its gateway): every site
    /// is accepted, since it relays what it polled.
    Local,
}

/// What one ingest did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IngestReport {
    /// Batches admitted above their fence and stored (complete ones).
    pub batches_stored: u64,
    /// Exact repeats of a held publication, left untouched (not drops).
    pub batches_repeated: u64,
    /// Rows stored into windows.
    pub rows_stored: u64,
    /// Lines refused, by reason.
    pub dropped: DropCounts,
}

impl IngestReport {
    /// The report for a body refused whole because it was over the exposition byte cap
    /// (for a daemon whose body accumulator stopped reading at the cap).
    pub fn body_cap() -> Self {
        let mut report = Self::default();
        report.dropped.add(DropReason::BodyCap, 1);
        report
    }

    /// Adds everything `other` counted.
    pub fn merge(&mut self, other: &Self) {
        self.batches_stored += other.batches_stored;
        self.batches_repeated += other.batches_repeated;
        self.rows_stored += other.rows_stored;
        self.dropped.merge(&other.dropped);
    }
}

/// Whether a wire stamp is plausible against the body's reference time: at most
/// [`MAX_FUTURE_STAMP_MS`] after it and at most [`MAX_SAMPLE_AGE_MS`] before it.
fn plausible(stamp_ms: u64, reference_ms: u64) -> bool {
    stamp_ms <= reference_ms.saturating_add(MAX_FUTURE_STAMP_MS)
        && stamp_ms.saturating_add(MAX_SAMPLE_AGE_MS) >= reference_ms
}

/// Moves a stamp from the sender's clock (where the body is dated `reference_ms`) into
/// the receiver's (where it is `now_ms`), keeping its age relative to the body.
fn rebase(stamp_ms: u64, reference_ms: u64, now_ms: u64) -> u64 {
    let moved = i128::from(stamp_ms) + i128::from(now_ms) - i128::from(reference_ms);
    moved.clamp(0, i128::from(u64::MAX)) as u64
}

impl Store {
    /// Ingests one body from `sender` (its verified identity), dated `reference_ms` (the
    /// body's HTTP `Date`), at receiver wall-clock `now_ms` (both milliseconds since the
    /// Unix epoch).
    ///
    /// Expires old readings first, then parses the body leniently, groups it into batches
    /// ([`super::decode_batches`]) and admits each with [`Store::ingest_batch`]. Never
    /// fails as a whole: a body over [`MAX_EXPOSITION_BYTES`] is one `body_cap` drop, and
    /// every other refusal is counted per line in the report.
    pub fn ingest(
        &mut self,
        body: &[u8],
        sender: Sender<'_>,
        reference_ms: u64,
        now_ms: u64,
    ) -> IngestReport {
        if body.len() > MAX_EXPOSITION_BYTES {
            return IngestReport::body_cap();
        }
        self.expire(now_ms);
        let mut report = IngestReport::default();
        let mut drops = DropCounts::default();
        decode_batches(body, &mut drops, |batch| {
            self.ingest_batch(batch, sender, reference_ms, now_ms, &mut report);
        });
        report.dropped.merge(&drops);
        report
    }

    /// Admits one decoded batch from `sender`, whose body was dated `reference_ms`,
    /// at receiver wall-clock `now_ms`; counts into `report`.
    ///
    /// In order: a peer's batch for another site is `site_mismatch`; an implausible
    /// metadata stamp or an epoch more than [`crate::batch::MAX_EPOCH_LEAD_MS`] ahead is
    /// `skew` (no fence retained); a new provider over the caps is `cap`; then the fence
    /// decides (`delayed`, an idempotent repeat, or advance). An advancing batch moves the
    /// fence even when its payload is refused (`incomplete`); a complete one stores its
    /// rows, each still subject to `skew` and the series caps.
    ///
    /// Does not expire anything: callers feeding batches one by one call
    /// [`Store::expire`] on their own tick.
    pub fn ingest_batch(
        &mut self,
        batch: Batch,
        sender: Sender<'_>,
        reference_ms: u64,
        now_ms: u64,
        report: &mut IngestReport,
    ) {
        let lines = batch.lines();
        let meta = &batch.meta;
        if let Sender::Peer { site } = sender {
            if meta.site() != site {
                report.dropped.add(DropReason::SiteMismatch, lines);
                return;
            }
        }
        if !plausible(meta.stamp_ms(), reference_ms) || epoch_too_far(meta.fence().epoch, now_ms)
        {
            report.dropped.add(DropReason::Skew, lines);
            return;
        }
        let digest = batch.digest();
        let Some(entry) = self.entry_mut_or_create(meta.site(), meta.provider(), now_ms) else {
            report.dropped.add(DropReason::Cap, lines);
            return;
        };
        match entry.gate.judge(meta.fence(), digest, now_ms) {
            Admission::Skew => {
                report.dropped.add(DropReason::Skew, lines);
                return;
            }
            Admission::Delayed => {
                report.dropped.add(DropReason::Delayed, lines);
                return;
            }
            Admission::Repeat => {
                report.batches_repeated += 1;
                return;
            }
            Admission::Advance => {}
        }

        // Valid ordering metadata counts whether or not the payload is whole.
        let complete = batch.is_complete();
        let Batch { meta, rows, .. } = batch;
        let revision = meta.revision();
        entry.gate.advance(meta.fence());
        entry.touched_ms = now_ms;
        entry.meta_stamp_ms = Some(rebase(meta.stamp_ms(), reference_ms, now_ms));
        if !complete {
            report.dropped.add(DropReason::Incomplete, lines);
            // A new revision announced without a whole payload ends the lifetime: what
            // was learned no longer applies, and nothing of the new one is held yet.
            if entry.revision.as_ref() != Some(&revision) {
                entry.lifetime = Lifetime::None;
            }
            entry.revision = Some(revision);
            return;
        }

        entry.gate.hold(digest);
        report.batches_stored += 1;
        let mut reset = None;
        if rows.is_empty() {
            entry.lifetime = Lifetime::Invalidated;
        } else if !entry.lifetime.is_live_for(&revision) {
            entry.lifetime = Lifetime::Live {
                revision: revision.clone(),
                since_ms: now_ms,
            };
            reset = Some(StoreEvent::Reset {
                site: meta.site().to_owned(),
                provider: meta.provider().to_owned(),
                revision: revision.clone(),
            });
        }
        entry.revision = Some(revision);

        let mut kept = Vec::with_capacity(rows.len());
        for row in rows {
            if !plausible(row.stamp_ms(), reference_ms) {
                report.dropped.add(DropReason::Skew, 1);
                continue;
            }
            let stamp_ms = rebase(row.stamp_ms(), reference_ms, now_ms);
            let row = row.with_stamp(stamp_ms);
            match entry.store_row(&row) {
                Ok(()) => kept.push(row),
                Err(RowRefusal::Metrics | RowRefusal::Series) => {
                    report.dropped.add(DropReason::Cap, 1);
                }
            }
        }
        report.rows_stored += kept.len() as u64;
        let stamp = rebase(meta.stamp_ms(), reference_ms, now_ms);
        let held = meta.with_stamp(stamp).with_samples(kept.len() as u64);
        entry.publication = Some(Batch::new(held, kept));
        if let Some(event) = reset {
            self.events.push(event);
        }
    }
}
