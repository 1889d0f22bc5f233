//! Admitting batches into the store.

use super::decode::{BatchSink, group};
use super::entry::RowRefusal;
use super::learning::Lifetime;
use super::publication::Publication;
use super::{
    DropCounts, DropReason, MAX_FUTURE_STAMP_MS, MAX_SAMPLE_AGE_MS, ReadinessMark, Reading, Store,
    StoreEvent,
};
use crate::batch::{Admission, Batch, BatchView, Fence, MetaRef, OrderGate, Rows, epoch_too_far};
use crate::exposition::MAX_EXPOSITION_BYTES;
use crate::signature::{
    BatchSignature, SignatureCheck, SignatureLine, SignatureRef, SigningChain, decode_base64,
};

/// Who sent a body, as verified by the transport (mTLS identity), not as claimed by it.
#[derive(Clone, Copy, Debug)]
pub enum Sender<'a> {
    /// A peer operator of site `site`: only batches for its own site are accepted.
    Peer {
        /// The site of the peer's verified identity.
        site: &'a str,
    },
    /// A gossip member answering a pull: only batches of the `(site, provider)`
    /// registers asked for are accepted, whichever site's they are, since a member serves
    /// every batch it holds and announced; and each only when it is whole and its
    /// signature verifies, through `check`, against a certificate the trust binds to the
    /// batch's own site. The member's TLS identity names the relay, not the publisher,
    /// so it vouches for nothing the batch says.
    Pulled {
        /// The registers asked for.
        registers: &'a [(&'a str, &'a str)],
        /// The trust's signature check.
        check: &'a dyn SignatureCheck,
    },
    /// The local operator (its relay to its gateway): every site is accepted, since it
    /// relays what it polled.
    Local,
    /// This site machine's own publications, minted with this process's epoch and
    /// stamped by the clock that judges them. The future-epoch bound protects receivers
    /// from a publisher whose clock is broken; applied here it would have an operator
    /// whose host clock stepped back by more than the bound refuse its own batches and
    /// silence its site (its relay frozen on the last batch before the step) until the
    /// clock caught up. Receivers with right clocks still judge the epoch.
    Own,
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

/// What an ingest needs to know besides the batch: who sent it and when.
#[derive(Clone, Copy, Debug)]
struct Arrival<'s> {
    sender: Sender<'s>,
    reference_ms: u64,
    now_ms: u64,
}

impl Arrival<'_> {
    /// The refusals judged on the metadata alone, before any fence or entry is touched:
    /// a peer's batch for another site, an implausible metadata stamp, an epoch too far
    /// ahead of the receiver's clock.
    fn refusal(&self, meta: &MetaRef<'_>) -> Option<DropReason> {
        match self.sender {
            Sender::Peer { site } if *meta.site != *site => {
                return Some(DropReason::SiteMismatch);
            }
            Sender::Pulled { registers, .. }
                if !registers
                    .iter()
                    .any(|(s, p)| *s == &*meta.site && *p == &*meta.provider) =>
            {
                return Some(DropReason::SiteMismatch);
            }
            _ => {}
        }
        (!plausible(meta.stamp_ms, self.reference_ms)
            || (!matches!(self.sender, Sender::Own)
                && epoch_too_far(meta.fence.epoch, self.now_ms)))
        .then_some(DropReason::Skew)
    }

    /// The gate's verdict on `incoming`: the epoch bound included, except for
    /// [`Sender::Own`].
    fn judge(&self, gate: &OrderGate, incoming: Fence, digest: u64) -> Admission {
        match self.sender {
            Sender::Own => gate.judge_order(incoming, digest),
            _ => gate.judge(incoming, digest, self.now_ms),
        }
    }
}

/// Admits the batches of one body as they are grouped.
struct Admit<'s, 'r> {
    store: &'s mut Store,
    arrival: Arrival<'r>,
    report: &'s mut IngestReport,
    signatures: Verified,
}

impl<'a> BatchSink<'a> for Admit<'_, '_> {
    fn opened(&mut self, meta: &MetaRef<'a>, rest: &'a [u8]) -> Option<usize> {
        self.store
            .judge_repeat(meta, rest, self.arrival, self.report)
    }

    fn closed(&mut self, batch: &BatchView<'_, 'a>) {
        let signature = match self.arrival.sender {
            Sender::Pulled { check, .. } if self.arrival.refusal(batch.meta).is_none() => {
                let verified = self.signatures.verify(batch, check, self.arrival.now_ms);
                if verified.is_none() {
                    // Refused before any fence is judged: a batch no one vouches for
                    // moves nothing.
                    self.report
                        .dropped
                        .add(DropReason::Signature, batch.lines());
                    return;
                }
                verified
            }
            _ => None,
        };
        self.store
            .admit(batch, self.arrival, self.report, signature);
    }
}

/// A chain line as decoded.
#[derive(Clone)]
enum Decoded {
    Chain(SigningChain),
    /// Not a chain within the bounds, or no chain line defined that index.
    Unusable,
}

/// What one body's signatures have been found to be: its chains decoded, and which
/// site each was checked for, so a chain several batches share is decoded and judged
/// once per body.
#[derive(Default)]
struct Verified {
    /// By chain index: `None` until first needed.
    chains: Vec<Option<Decoded>>,
    /// (chain index, site, whether the trust binds the chain to the site).
    vouched: Vec<(usize, String, bool)>,
    message: Vec<u8>,
}

impl Verified {
    /// The batch's signature, when it is whole and its signature verifies against a
    /// chain `check` binds to its site.
    fn verify(
        &mut self,
        batch: &BatchView<'_, '_>,
        check: &dyn SignatureCheck,
        now_ms: u64,
    ) -> Option<BatchSignature> {
        let signed = batch.signature?;
        if !batch.is_complete() {
            return None;
        }
        let chain = self.chain(&signed)?;
        let site = &*batch.meta.site;
        let known = self
            .vouched
            .iter()
            .find(|(i, s, _)| *i == signed.chain_index && s == site);
        let vouched = if let Some(&(_, _, vouched)) = known {
            vouched
        } else {
            let vouched = check.vouches(site, &chain, now_ms);
            self.vouched
                .push((signed.chain_index, site.to_owned(), vouched));
            vouched
        };
        if !vouched {
            return None;
        }
        let signature = decode_base64(signed.signature.as_bytes())?;
        self.message.clear();
        batch.write_message(&mut self.message);
        if !check.verifies(&chain, signed.scheme, &self.message, &signature) {
            return None;
        }
        BatchSignature::new(signed.scheme, signature, chain)
    }

    fn chain(&mut self, signed: &SignatureRef<'_>) -> Option<SigningChain> {
        let index = signed.chain_index;
        if self.chains.len() <= index {
            self.chains.resize(index + 1, None);
        }
        let decoded = self.chains[index].get_or_insert_with(|| {
            signed
                .chain
                .and_then(SignatureLine::decode_chain)
                .map_or(Decoded::Unusable, Decoded::Chain)
        });
        match decoded {
            Decoded::Chain(chain) => Some(chain.clone()),
            Decoded::Unusable => None,
        }
    }
}

impl Store {
    /// Ingests one body from `sender` (its verified identity), dated `reference_ms` (the
    /// body's HTTP `Date`), at receiver wall-clock `now_ms` (both milliseconds since the
    /// Unix epoch).
    ///
    /// Expires old readings first, then parses the body leniently, groups it into batches
    /// (by the rules of [`super::decode_batches`]) and admits each as
    /// [`Store::ingest_batch`] would. Never fails as a whole: a body over
    /// [`MAX_EXPOSITION_BYTES`] is one `body_cap` drop, and every other refusal is counted
    /// per line in the report.
    ///
    /// Batches are judged on views into the body, so a delayed batch costs a parse and no
    /// copy; an exact repeat of the bytes of a provider's held publication (the relay of
    /// an unchanged provider, every second) is recognized by comparing bytes, without
    /// parsing its rows; and storing a reading into a series already held allocates
    /// nothing.
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
        let arrival = Arrival {
            sender,
            reference_ms,
            now_ms,
        };
        group(
            body,
            &mut drops,
            &mut Admit {
                store: self,
                arrival,
                report: &mut report,
                signatures: Verified::default(),
            },
        );
        report.dropped.merge(&drops);
        report
    }

    /// Admits one decoded batch from `sender`, whose body was dated `reference_ms`,
    /// at receiver wall-clock `now_ms`; counts into `report`.
    ///
    /// In order: a peer's batch for another site is `site_mismatch`; a pulled batch
    /// (which as an owned batch carries no signature) is `signature`; an implausible
    /// metadata stamp or an epoch more than [`crate::batch::MAX_EPOCH_LEAD_MS`] ahead is
    /// `skew` (no fence retained); a new provider over the caps is `cap`; then the fence
    /// decides (`delayed`, an idempotent repeat, or advance). An advancing batch moves the
    /// fence even when its payload is refused (`incomplete`); a complete one stores its
    /// rows, each still subject to `skew` and the series caps.
    ///
    /// Does not expire anything: callers feeding batches one by one call
    /// [`Store::expire`] on their own tick.
    #[allow(
        clippy::needless_pass_by_value,
        reason = "the public signature hands the batch over; it is read as a view"
    )]
    pub fn ingest_batch(
        &mut self,
        batch: Batch,
        sender: Sender<'_>,
        reference_ms: u64,
        now_ms: u64,
        report: &mut IngestReport,
    ) {
        let meta = MetaRef::of(&batch.meta);
        let rows = Rows::of(&batch.rows);
        let view = BatchView {
            meta: &meta,
            rows: &rows,
            lines_refused: batch.lines_refused,
            raw: None,
            signature: None,
        };
        let arrival = Arrival {
            sender,
            reference_ms,
            now_ms,
        };
        if matches!(sender, Sender::Pulled { .. }) && arrival.refusal(&meta).is_none() {
            report.dropped.add(DropReason::Signature, view.lines());
            return;
        }
        self.admit(&view, arrival, report, None);
    }

    /// Judges a batch whose metadata was just read, from its bytes alone, when they
    /// begin with the exact bytes of the complete publication its provider holds at its
    /// fence: then the batch decodes to that publication, every one of its `samples` rows
    /// valid, and is judged as [`Self::admit`] would judge it (a repeat, or refused before
    /// the fence). Returns how many bytes of `rest` it occupies, or `None` to have it
    /// decoded.
    fn judge_repeat(
        &self,
        meta: &MetaRef<'_>,
        rest: &[u8],
        arrival: Arrival<'_>,
        report: &mut IngestReport,
    ) -> Option<usize> {
        let entry = self.sites.get(&*meta.site)?.get(&*meta.provider)?;
        let held = entry.held_bytes(rest)?;
        let lines = 1 + meta.samples;
        if let Some(reason) = arrival.refusal(meta) {
            report.dropped.add(reason, lines);
            return Some(held.len);
        }
        // Holds only while the gate still holds that publication at that fence.
        if arrival.judge(&entry.gate, held.fence, held.digest) != Admission::Repeat {
            return None;
        }
        report.batches_repeated += 1;
        Some(held.len)
    }

    /// Judges one batch and applies the verdict (see [`Self::ingest_batch`]); a
    /// complete batch stored whole keeps `signature` (already verified) for the relay.
    fn admit(
        &mut self,
        batch: &BatchView<'_, '_>,
        arrival: Arrival<'_>,
        report: &mut IngestReport,
        signature: Option<BatchSignature>,
    ) {
        let Arrival {
            reference_ms,
            now_ms,
            ..
        } = arrival;
        let lines = batch.lines();
        let meta = batch.meta;
        if let Some(reason) = arrival.refusal(meta) {
            report.dropped.add(reason, lines);
            return;
        }
        let digest = batch.digest();
        let Some(entry) = self.entry_mut_or_create(&meta.site, &meta.provider, now_ms) else {
            report.dropped.add(DropReason::Cap, lines);
            return;
        };
        match arrival.judge(&entry.gate, meta.fence, digest) {
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
        entry.gate.advance(meta.fence);
        entry.touched_ms = now_ms;
        let meta_stamp = rebase(meta.stamp_ms, reference_ms, now_ms);
        entry.meta_stamp_ms = Some(meta_stamp);
        let same_revision = entry
            .revision
            .as_ref()
            .is_some_and(|r| meta.same_revision(r));
        if !same_revision {
            entry.revision = Some(meta.revision());
        }
        if !batch.is_complete() {
            report.dropped.add(DropReason::Incomplete, lines);
            // A new revision announced without a whole payload ends the lifetime: what
            // was learned no longer applies, and nothing of the new one is held yet.
            if !same_revision {
                entry.lifetime = Lifetime::None;
            }
            return;
        }

        entry.gate.hold(digest);
        entry.hold_bytes(batch.raw, meta.fence, digest);
        report.batches_stored += 1;
        let mut reset = None;
        if batch.rows.is_empty() {
            entry.lifetime = Lifetime::Invalidated;
        } else if !entry.lifetime.is_live_for(meta) {
            let revision = meta.revision();
            reset = Some(StoreEvent::Reset {
                site: meta.site.clone().into_owned(),
                provider: meta.provider.clone().into_owned(),
                revision: revision.clone(),
            });
            entry.lifetime = Lifetime::Live {
                revision,
                since_ms: now_ms,
            };
        }

        let (mut held, mark) = keep_rows(entry, batch, (reference_ms, now_ms), meta_stamp, report);
        let readiness_moved = entry.readiness.replace(mark) != Some(mark);
        held.set_meta(meta, meta_stamp);
        // The signature covers every row: with one left out, it no longer holds.
        held.set_signature(signature.filter(|_| held.lines() - 1 == meta.samples));
        report.rows_stored += held.lines() - 1;
        entry.publication = Some(held);
        if readiness_moved {
            self.readiness_generation = self.readiness_generation.wrapping_add(1);
        }
        if let Some(event) = reset {
            self.events.push(event);
        }
    }
}

/// Stores the plausible rows of a complete batch in `entry` (its windows) and returns them
/// as the held publication, rewritten in place, with what they say of readiness; refused
/// rows are counted in `report`.
fn keep_rows(
    entry: &mut super::entry::Entry,
    batch: &BatchView<'_, '_>,
    (reference_ms, now_ms): (u64, u64),
    meta_stamp: u64,
    report: &mut IngestReport,
) -> (Publication, ReadinessMark) {
    let mut held = entry.publication.take().unwrap_or_else(|| {
        Publication::with_capacity(batch.meta.to_owned_meta(0, meta_stamp), batch.rows)
    });
    held.clear();
    let mut mark = ReadinessMark::default();
    for row in batch.rows.iter() {
        if !plausible(row.stamp_ms, reference_ms) {
            report.dropped.add(DropReason::Skew, 1);
            continue;
        }
        let stamp_ms = rebase(row.stamp_ms, reference_ms, now_ms);
        let reading = Reading {
            value: row.value,
            stamp_ms,
        };
        if let Err(RowRefusal::Metrics | RowRefusal::Series) =
            entry.store_row(row.name, row.labels, reading)
        {
            report.dropped.add(DropReason::Cap, 1);
            continue;
        }
        held.push(row.name, row.labels, row.value, stamp_ms);
        mark.row(
            row.name,
            row.labels.iter().map(|(n, v)| (*n, v.as_ref())),
            row.value,
        );
    }
    (held, mark)
}

#[cfg(test)]
// Stored values are copies of the ones sent, so exact comparison is the point.
#[allow(clippy::float_cmp)]
mod tests {
    use super::super::fixture::{T0, admit, batch, body, meta, store};
    use super::super::{DropReason, Learning, PauseReason, StoreEvent};
    use super::*;
    use crate::batch::{Fence, MAX_EPOCH_LEAD_MS, Row};

    fn f(seq: u64) -> Fence {
        Fence::new(T0, seq)
    }

    fn drain(store: &mut Store) -> Vec<StoreEvent> {
        std::iter::from_fn(|| store.poll_event()).collect()
    }

    fn latest(store: &Store, metric: &str) -> Option<f64> {
        store.entry("b", "m")?.latest(metric, &[]).map(|r| r.value)
    }

    #[test]
    fn a_pulled_body_admits_the_registers_asked_for_of_any_site_and_nothing_else() {
        use crate::signature::fake::{Check, Signer, chain};
        let mut member = store();
        for (site, provider, q) in [("b", "m", 1.0), ("c", "m", 2.0), ("c", "n", 3.0)] {
            admit(
                &mut member,
                batch(site, provider, f(1), &[("q", q)], T0),
                T0,
            );
            member.sign_held(site, provider, &Signer(chain(site, 0)));
        }
        let mut text = Vec::new();
        let all = [("b", "m"), ("c", "m"), ("c", "n")];
        member.encode_pulled(&all, T0, T0, &mut text);
        let mut s = store();
        let asked = [("b", "m"), ("c", "m")];
        let sender = Sender::Pulled {
            registers: &asked,
            check: &Check { valid: 1 },
        };
        let r = s.ingest(&text, sender, T0, T0);
        assert_eq!(r.batches_stored, 2);
        assert_eq!(r.dropped.get(DropReason::SiteMismatch), 2);
        assert!(s.entry("c", "m").is_some());
        assert!(s.entry("c", "n").is_none());
    }

    #[test]
    fn peer_batch_for_another_site_is_site_mismatch() {
        let mut s = store();
        let text = body(&[batch("c", "m", f(1), &[("q", 1.0)], T0)]);
        let r = s.ingest(&text, Sender::Peer { site: "b" }, T0, T0);
        assert_eq!(r.dropped.get(DropReason::SiteMismatch), 2);
        assert!(s.is_empty());
    }

    #[test]
    fn peer_batch_for_its_own_site_is_stored() {
        let mut s = store();
        let text = body(&[batch("b", "m", f(1), &[("q", 1.0)], T0)]);
        let r = s.ingest(&text, Sender::Peer { site: "b" }, T0, T0);
        assert_eq!(
            (r.batches_stored, r.rows_stored, r.dropped.total()),
            (1, 1, 0)
        );
        assert_eq!(latest(&s, "q"), Some(1.0));
    }

    #[test]
    fn local_relay_accepts_every_site() {
        let mut s = store();
        let text = body(&[
            batch("b", "m", f(1), &[("q", 1.0)], T0),
            batch("c", "m", f(1), &[("q", 2.0)], T0),
        ]);
        let r = s.ingest(&text, Sender::Local, T0, T0);
        assert_eq!(r.batches_stored, 2);
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn row_stamped_max_future_after_date_is_kept_and_one_more_is_skew() {
        let mut s = store();
        let ok = batch("b", "m", f(1), &[("q", 1.0)], T0 + MAX_FUTURE_STAMP_MS);
        assert_eq!(s.ingest(&body(&[ok]), Sender::Local, T0, T0).rows_stored, 1);
        let mut late = batch("b", "m", f(2), &[("q", 1.0)], T0);
        late.rows[0] = Row::new("q", vec![], 1.0, T0 + MAX_FUTURE_STAMP_MS + 1).unwrap();
        let r = s.ingest(&body(&[late]), Sender::Local, T0, T0);
        assert_eq!(r.dropped.get(DropReason::Skew), 1);
        assert_eq!(r.rows_stored, 0);
    }

    #[test]
    fn row_exactly_max_sample_age_old_is_kept_and_one_more_is_skew() {
        let mut s = Store::new(super::super::StoreConfig {
            ttl_ms: 2 * MAX_SAMPLE_AGE_MS,
        });
        let mut b = batch("b", "m", f(1), &[("q", 1.0), ("r", 2.0)], T0);
        b.rows[0] = Row::new("q", vec![], 1.0, T0 - MAX_SAMPLE_AGE_MS).unwrap();
        b.rows[1] = Row::new("r", vec![], 2.0, T0 - MAX_SAMPLE_AGE_MS - 1).unwrap();
        let r = s.ingest(&body(&[b]), Sender::Local, T0, T0);
        assert_eq!(r.rows_stored, 1);
        assert_eq!(r.dropped.get(DropReason::Skew), 1);
        assert_eq!(latest(&s, "q"), Some(1.0));
        assert_eq!(latest(&s, "r"), None);
    }

    #[test]
    fn implausible_metadata_stamp_refuses_the_batch_without_a_fence() {
        let mut s = store();
        let b = batch("b", "m", f(1), &[("q", 1.0)], T0 + MAX_FUTURE_STAMP_MS + 1);
        let r = s.ingest(&body(&[b]), Sender::Local, T0, T0);
        assert_eq!(r.dropped.get(DropReason::Skew), 2);
        assert!(s.entry("b", "m").is_none());
    }

    #[test]
    fn stamps_are_moved_into_the_receivers_clock_keeping_their_age() {
        let mut s = store();
        // The sender's clock is 5 s behind: its Date says T0 - 5000 when ours says T0.
        let b = batch("b", "m", f(1), &[("q", 1.0)], T0 - 5_000 - 300);
        s.ingest(&body(&[b]), Sender::Local, T0 - 5_000, T0);
        let reading = s.entry("b", "m").unwrap().latest("q", &[]).unwrap();
        assert_eq!(reading.stamp_ms, T0 - 300);
    }

    #[test]
    fn epoch_too_far_ahead_is_skew_and_retains_no_fence() {
        let mut s = store();
        let far = Fence::new(T0 + MAX_EPOCH_LEAD_MS + 1, 0);
        let r = s.ingest(
            &body(&[batch("b", "m", far, &[("q", 1.0)], T0)]),
            Sender::Local,
            T0,
            T0,
        );
        assert_eq!(r.dropped.get(DropReason::Skew), 2);
        assert!(s.entry("b", "m").is_none());
        let edge = Fence::new(T0 + MAX_EPOCH_LEAD_MS, 0);
        let r = s.ingest(
            &body(&[batch("b", "m", edge, &[("q", 1.0)], T0)]),
            Sender::Local,
            T0,
            T0,
        );
        assert_eq!(r.batches_stored, 1);
    }

    #[test]
    fn delayed_batch_is_counted_and_not_stored() {
        let mut s = store();
        admit(&mut s, batch("b", "m", f(5), &[("q", 5.0)], T0), T0);
        let r = admit(&mut s, batch("b", "m", f(4), &[("q", 4.0)], T0), T0);
        assert_eq!(r.dropped.get(DropReason::Delayed), 2);
        assert_eq!(latest(&s, "q"), Some(5.0));
        // An older epoch with a higher sequence is delayed too.
        let r = admit(
            &mut s,
            batch("b", "m", Fence::new(T0 - 1, 99), &[("q", 9.0)], T0),
            T0,
        );
        assert_eq!(r.dropped.get(DropReason::Delayed), 2);
    }

    #[test]
    fn exact_repeat_is_idempotent_and_keeps_age_and_lifetime() {
        let mut s = store();
        let b = batch("b", "m", f(1), &[("q", 1.0)], T0);
        admit(&mut s, b.clone(), T0);
        let before = s.entry("b", "m").unwrap().clone();
        let mut r = IngestReport::default();
        // Received again 2 s later, with the same Date (so the same bytes).
        s.ingest_batch(b, Sender::Local, T0, T0 + 2_000, &mut r);
        assert_eq!((r.batches_repeated, r.dropped.total()), (1, 0));
        let after = s.entry("b", "m").unwrap();
        assert_eq!(after.latest("q", &[]), before.latest("q", &[]));
        assert_eq!(after.series("q").next().unwrap().readings().count(), 1);
        assert_eq!(after.learning(T0 + 2_000), before.learning(T0 + 2_000));
        assert_eq!(after.metadata_stamp_ms(), before.metadata_stamp_ms());
    }

    #[test]
    fn changed_duplicate_is_delayed() {
        let mut s = store();
        admit(&mut s, batch("b", "m", f(1), &[("q", 1.0)], T0), T0);
        let r = admit(&mut s, batch("b", "m", f(1), &[("q", 2.0)], T0), T0);
        assert_eq!(r.dropped.get(DropReason::Delayed), 2);
        assert_eq!(latest(&s, "q"), Some(1.0));
    }

    #[test]
    fn rejected_payload_still_advances_the_fence() {
        let mut s = store();
        admit(&mut s, batch("b", "m", f(1), &[("q", 1.0)], T0), T0);
        let mut short = batch("b", "m", f(3), &[("q", 3.0)], T0);
        short.rows.clear();
        let r = admit(&mut s, short, T0);
        assert_eq!(r.dropped.get(DropReason::Incomplete), 1);
        assert_eq!(s.entry("b", "m").unwrap().fence(), Some(f(3)));
        // The delayed batch 2 cannot slip in behind it.
        let r = admit(&mut s, batch("b", "m", f(2), &[("q", 2.0)], T0), T0);
        assert_eq!(r.dropped.get(DropReason::Delayed), 2);
        assert_eq!(latest(&s, "q"), Some(1.0));
    }

    #[test]
    fn first_complete_batch_and_each_revision_change_emit_exactly_one_reset() {
        let mut s = store();
        admit(&mut s, batch("b", "m", f(1), &[("q", 1.0)], T0), T0);
        assert!(matches!(
            drain(&mut s).as_slice(),
            [StoreEvent::Reset { .. }]
        ));
        admit(&mut s, batch("b", "m", f(2), &[("q", 1.0)], T0), T0);
        assert!(drain(&mut s).is_empty());
        // A new publisher epoch is a new revision.
        admit(
            &mut s,
            batch("b", "m", Fence::new(T0 + 1, 0), &[("q", 1.0)], T0),
            T0,
        );
        let events = drain(&mut s);
        let [StoreEvent::Reset { revision, .. }] = events.as_slice() else {
            panic!("{events:?}")
        };
        assert_eq!(revision.epoch, T0 + 1);
        // A new uid too.
        let rows = vec![Row::new("q", vec![], 1.0, T0).unwrap()];
        let recreated = Batch::new(meta("b", "m", "u2", Fence::new(T0 + 1, 1), 1, T0), rows);
        admit(&mut s, recreated, T0);
        assert_eq!(drain(&mut s).len(), 1);
    }

    #[test]
    fn zero_sample_batch_pauses_learning_and_the_next_complete_one_resets() {
        let mut s = store();
        admit(&mut s, batch("b", "m", f(1), &[("q", 1.0)], T0), T0);
        drain(&mut s);
        admit(&mut s, batch("b", "m", f(2), &[], T0), T0);
        let e = s.entry("b", "m").unwrap();
        assert_eq!(e.learning(T0), Learning::Paused(PauseReason::ZeroSamples));
        // Fresh pressure readings stay readable.
        assert_eq!(latest(&s, "q"), Some(1.0));
        assert!(drain(&mut s).is_empty());
        admit(
            &mut s,
            batch("b", "m", f(3), &[("q", 2.0)], T0 + 10),
            T0 + 10,
        );
        assert_eq!(drain(&mut s).len(), 1);
        let Learning::Allowed { since_ms, .. } = s.entry("b", "m").unwrap().learning(T0 + 10)
        else {
            panic!("learning should resume")
        };
        assert_eq!(since_ms, T0 + 10);
    }

    #[test]
    fn stale_metadata_pauses_learning_but_keeps_the_readings() {
        let mut s = store();
        admit(&mut s, batch("b", "m", f(1), &[("q", 1.0)], T0), T0);
        let ttl = s.config().ttl_ms;
        let e = s.entry("b", "m").unwrap();
        assert!(matches!(e.learning(T0 + ttl), Learning::Allowed { .. }));
        assert_eq!(
            e.learning(T0 + ttl + 1),
            Learning::Paused(PauseReason::MetadataStale)
        );
        assert_eq!(e.latest("q", &[]).map(|r| r.value), Some(1.0));
    }

    #[test]
    fn new_revision_with_rejected_payload_pauses_learning_until_complete() {
        let mut s = store();
        admit(&mut s, batch("b", "m", f(1), &[("q", 1.0)], T0), T0);
        drain(&mut s);
        let mut short = batch("b", "m", Fence::new(T0 + 1, 0), &[("q", 1.0)], T0);
        short.rows.clear();
        admit(&mut s, short, T0);
        let e = s.entry("b", "m").unwrap();
        assert_eq!(
            e.learning(T0),
            Learning::Paused(PauseReason::MetadataMissing)
        );
        assert_eq!(e.revision().unwrap().epoch, T0 + 1);
        assert!(drain(&mut s).is_empty());
        admit(
            &mut s,
            batch("b", "m", Fence::new(T0 + 1, 1), &[("q", 1.0)], T0),
            T0,
        );
        assert_eq!(drain(&mut s).len(), 1);
    }

    #[test]
    fn rejected_payload_of_the_same_revision_keeps_learning() {
        let mut s = store();
        admit(&mut s, batch("b", "m", f(1), &[("q", 1.0)], T0), T0);
        drain(&mut s);
        let mut short = batch("b", "m", f(2), &[("q", 1.0)], T0);
        short.rows.clear();
        admit(&mut s, short, T0);
        assert!(matches!(
            s.entry("b", "m").unwrap().learning(T0),
            Learning::Allowed { .. }
        ));
        admit(&mut s, batch("b", "m", f(3), &[("q", 1.0)], T0), T0);
        assert!(drain(&mut s).is_empty());
    }

    #[test]
    fn parse_error_inside_a_batch_refuses_its_payload_but_not_its_fence() {
        let mut s = store();
        let good = body(&[batch("b", "m", f(1), &[("q", 1.0), ("r", 2.0)], T0)]);
        let text = String::from_utf8(good).unwrap();
        let broken = text.replacen("q{", "q {{", 1);
        let r = s.ingest(broken.as_bytes(), Sender::Local, T0, T0);
        assert_eq!(r.dropped.get(DropReason::Parse), 1);
        assert_eq!(r.dropped.get(DropReason::Incomplete), 2);
        assert_eq!(r.rows_stored, 0);
        assert_eq!(s.entry("b", "m").unwrap().fence(), Some(f(1)));
    }

    #[test]
    fn one_bad_batch_does_not_fail_the_rest_of_the_body() {
        let mut s = store();
        let mut text = body(&[batch("b", "m", f(1), &[("q", 1.0)], T0)]);
        text.extend_from_slice(b"not a line at all {\n");
        text.extend_from_slice(&body(&[batch("b", "n", f(1), &[("q", 2.0)], T0)]));
        let r = s.ingest(&text, Sender::Local, T0, T0);
        assert_eq!(r.batches_stored, 2);
        assert_eq!(r.dropped.get(DropReason::Parse), 1);
    }

    #[test]
    fn sample_lines_outside_a_batch_are_unbatched() {
        let mut s = store();
        let r = s.ingest(
            b"q{grid_site=\"b\",grid_provider=\"m\"} 1 1\n",
            Sender::Local,
            T0,
            T0,
        );
        assert_eq!(r.dropped.get(DropReason::Unbatched), 1);
        assert!(s.is_empty());
    }

    #[test]
    fn row_for_another_provider_closes_the_batch_as_incomplete() {
        let mut s = store();
        let mut text = Vec::new();
        let b = batch("b", "m", f(1), &[("q", 1.0), ("r", 2.0)], T0);
        b.write(&mut text);
        // Cut the last row and put another provider's row in its place.
        let cut = String::from_utf8(text).unwrap();
        let mut lines: Vec<&str> = cut.lines().collect();
        lines.pop();
        let mut text = lines.join("\n");
        text = format!("{text}\nr{{grid_site=\"b\",grid_provider=\"x\"}} 2 {T0}\n");
        let r = s.ingest(text.as_bytes(), Sender::Local, T0, T0);
        assert_eq!(r.dropped.get(DropReason::Incomplete), 2);
        assert_eq!(r.dropped.get(DropReason::Unbatched), 1);
    }

    #[test]
    fn bad_metadata_is_counted_and_its_rows_are_unbatched() {
        let mut s = store();
        let text = format!(
            "grid_provider_config_generation{{grid_site=\"b\",grid_provider=\"m\",provider_uid=\"u\",publisher_epoch=\"01\",batch_sequence=\"1\",batch_samples=\"1\"}} 1 {T0}\n\
             q{{grid_site=\"b\",grid_provider=\"m\"}} 1 {T0}\n"
        );
        let r = s.ingest(text.as_bytes(), Sender::Local, T0, T0);
        assert_eq!(r.dropped.get(DropReason::Metadata), 1);
        assert_eq!(r.dropped.get(DropReason::Unbatched), 1);
    }

    #[test]
    fn metadata_without_timestamp_or_with_extra_label_is_refused() {
        let mut s = store();
        let head = "grid_provider_config_generation{grid_site=\"b\",grid_provider=\"m\",provider_uid=\"u\",publisher_epoch=\"1\",batch_sequence=\"1\",batch_samples=\"0\"";
        let text = format!("{head}}} 1\n{head},x=\"y\"}} 1 {T0}\n");
        let r = s.ingest(text.as_bytes(), Sender::Local, T0, T0);
        assert_eq!(r.dropped.get(DropReason::Metadata), 2);
    }

    #[test]
    fn row_without_timestamp_is_malformed_and_refuses_the_payload() {
        let mut s = store();
        let text = format!(
            "grid_provider_config_generation{{grid_site=\"b\",grid_provider=\"m\",provider_uid=\"u\",publisher_epoch=\"1\",batch_sequence=\"1\",batch_samples=\"2\"}} 1 {T0}\n\
             q{{grid_site=\"b\",grid_provider=\"m\"}} 1\n\
             r{{grid_site=\"b\",grid_provider=\"m\"}} 1 {T0}\n"
        );
        let r = s.ingest(text.as_bytes(), Sender::Local, T0, T0);
        assert_eq!(r.dropped.get(DropReason::Malformed), 1);
        assert_eq!(r.dropped.get(DropReason::Incomplete), 2);
        assert_eq!(r.rows_stored, 0);
    }

    #[test]
    fn help_type_and_comment_lines_are_ignored_inside_a_batch() {
        let mut s = store();
        let text = format!(
            "grid_provider_config_generation{{grid_site=\"b\",grid_provider=\"m\",provider_uid=\"u\",publisher_epoch=\"1\",batch_sequence=\"1\",batch_samples=\"1\"}} 1 {T0}\n\
             # TYPE q gauge\n# a comment\n\
             q{{grid_site=\"b\",grid_provider=\"m\"}} 4 {T0}\n# EOF\n"
        );
        let r = s.ingest(text.as_bytes(), Sender::Local, T0, T0);
        assert_eq!((r.rows_stored, r.dropped.total()), (1, 0));
    }

    #[test]
    fn body_exactly_at_the_cap_is_read_and_one_byte_more_is_body_cap() {
        let mut s = store();
        let mut text = body(&[batch("b", "m", f(1), &[("q", 1.0)], T0)]);
        text.resize(MAX_EXPOSITION_BYTES, b'\n');
        assert_eq!(s.ingest(&text, Sender::Local, T0, T0).rows_stored, 1);
        text.push(b'\n');
        let r = s.ingest(&text, Sender::Local, T0, T0);
        assert_eq!(r.dropped.get(DropReason::BodyCap), 1);
        assert_eq!(r.dropped.total(), 1);
    }

    #[test]
    fn per_endpoint_series_are_read_by_label_and_worst_across_endpoints() {
        let mut s = store();
        let ep = |e: &str, v: f64| {
            Row::new(
                "llm_d_epp_per_endpoint_queue_size",
                vec![("model_server_endpoint".into(), e.into())],
                v,
                T0,
            )
            .unwrap()
        };
        let rows = vec![ep("a:1", 3.0), ep("b:1", 7.0)];
        admit(
            &mut s,
            Batch::new(meta("b", "m", "u", f(1), 2, T0), rows),
            T0,
        );
        let e = s.entry("b", "m").unwrap();
        let m = "llm_d_epp_per_endpoint_queue_size";
        assert_eq!(
            e.latest(m, &[("model_server_endpoint", "a:1")])
                .unwrap()
                .value,
            3.0
        );
        assert_eq!(e.latest(m, &[]), None);
        assert_eq!(e.series(m).count(), 2);
        assert_eq!(
            e.series(m).next().unwrap().label("model_server_endpoint"),
            Some("a:1")
        );
        assert_eq!(e.window_worst(m, T0, 1_000), Some(7.0));
        assert_eq!(e.metric_newest_at(m), Some(T0));
        assert_eq!(e.newest_at(), Some(T0));
    }

    #[test]
    fn window_worst_keeps_a_drained_burst_until_it_leaves_the_window() {
        let mut s = store();
        admit(&mut s, batch("b", "m", f(1), &[("q", 9.0)], T0), T0);
        admit(
            &mut s,
            batch("b", "m", f(2), &[("q", 0.0)], T0 + 1_000),
            T0 + 1_000,
        );
        let e = s.entry("b", "m").unwrap();
        assert_eq!(e.window_worst("q", T0 + 1_000, 1_000), Some(9.0));
        assert_eq!(e.window_worst("q", T0 + 1_001, 1_000), Some(0.0));
        // A window longer than the TTL is clamped to it.
        let ttl = s.config().ttl_ms;
        assert_eq!(e.window_worst("q", T0 + ttl + 1, u64::MAX), Some(0.0));
        assert_eq!(e.window_worst("missing", T0, 1_000), None);
    }
}
