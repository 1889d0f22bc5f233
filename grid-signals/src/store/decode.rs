//! Turning an exposition body into batches: parse, then group lines under their
//! metadata line.

use nom::Offset;

use super::{DropCounts, DropReason};
use crate::Error;
use crate::batch::{
    Batch, BatchRule, BatchView, EPOCH_LABEL, Fence, METADATA_NAME, MetaRef, PROVIDER_LABEL, Rows,
    SAMPLES_LABEL, SEQUENCE_LABEL, SITE_LABEL, UID_LABEL, generation_from_value, parse_decimal_u64,
};
use crate::exposition::{LabelValue, Line, Sample, lines};
use crate::signature::{SignatureLine, SignatureRef, parse_signature_line};

/// Parses `body` leniently and hands every batch it holds to `on_batch`, complete or not,
/// in body order; lines that belong to no batch or break the line rules are counted in
/// `drops` and never stop the rest of the body.
///
/// Grouping rules (see `docs/wire.md`): a metadata line opens a batch of
/// `batch_samples` rows; each following sample line labeled with the same `grid_site`
/// and `grid_provider` is one of its rows (a line that fails to parse also takes a row's
/// place); the batch closes when that many rows were seen, at the next metadata line, at
/// a row for another provider, or at the end of the body. `# HELP`, `# TYPE`, comments
/// and `# EOF` are ignored anywhere. A sample line outside a batch is `unbatched`.
pub fn decode_batches(body: &[u8], drops: &mut DropCounts, on_batch: impl FnMut(Batch)) {
    /// Builds each batch as it closes.
    struct Owned<F>(F);
    impl<F: FnMut(Batch)> BatchSink<'_> for Owned<F> {
        fn closed(&mut self, batch: &BatchView<'_, '_>) {
            (self.0)(Batch::from_view(batch));
        }
    }
    group(body, drops, &mut Owned(on_batch));
}

/// Where [`group`] hands the batches of a body.
pub(crate) trait BatchSink<'a> {
    /// A valid metadata line opened a batch; `rest` is the body from that line's metric
    /// name on. Returning `Some(len)` says the sink judged the whole batch from its bytes
    /// alone and that it is exactly the first `len` bytes of `rest`, ending just past a
    /// `\n`: grouping resumes after them without reading its rows.
    fn opened(&mut self, meta: &MetaRef<'a>, rest: &'a [u8]) -> Option<usize> {
        let _ = (meta, rest);
        None
    }

    /// A batch closed (complete or not).
    fn closed(&mut self, batch: &BatchView<'_, 'a>);
}

/// The batch being collected.
struct Open<'a> {
    meta: MetaRef<'a>,
    /// Offset of its metadata line's name in the body.
    start: usize,
    lines_refused: usize,
    signature: Option<SignatureRef<'a>>,
}

/// The signature lines read so far in one body: the chains defined (by index) and the
/// signature waiting for the next metadata line.
#[derive(Default)]
struct Signatures<'a> {
    chains: Vec<Option<&'a str>>,
    pending: Option<SignatureRef<'a>>,
}

impl<'a> Signatures<'a> {
    /// Reads a comment: a signature or chain line is kept (a malformed one, a chain index
    /// defined twice and a signature that another replaces before any metadata line are
    /// each one `signature` drop); any other comment is nothing.
    fn comment(&mut self, text: &'a str, drops: &mut DropCounts) {
        match parse_signature_line(text) {
            None => {}
            Some(Err(_)) => drops.add(DropReason::Signature, 1),
            Some(Ok(SignatureLine::Chain { index, certs })) => {
                if self.chains.len() <= index {
                    self.chains.resize(index + 1, None);
                }
                let slot = &mut self.chains[index];
                if slot.is_some() {
                    drops.add(DropReason::Signature, 1);
                } else {
                    *slot = Some(certs);
                }
            }
            Some(Ok(SignatureLine::Signature {
                chain,
                scheme,
                signature,
            })) => {
                let replaced = self.pending.replace(SignatureRef {
                    chain_index: chain,
                    chain: self.chains.get(chain).copied().flatten(),
                    scheme,
                    signature,
                });
                if replaced.is_some() {
                    drops.add(DropReason::Signature, 1);
                }
            }
        }
    }

    /// The signature of the batch whose metadata line was just read.
    fn take(&mut self) -> Option<SignatureRef<'a>> {
        self.pending.take()
    }

    /// The body ended: a signature no metadata line followed is one `signature` drop.
    fn end(&mut self, drops: &mut DropCounts) {
        if self.pending.take().is_some() {
            drops.add(DropReason::Signature, 1);
        }
    }
}

/// Groups the lines of `body` into batches by the rules of [`decode_batches`], handing
/// each to `sink` as a view into the body: rows are checked but never copied, and one
/// set of row buffers serves the whole body.
pub(crate) fn group<'a>(body: &'a [u8], drops: &mut DropCounts, sink: &mut impl BatchSink<'a>) {
    let mut rows = Rows::default();
    let mut open: Option<Open<'a>> = None;
    let mut signatures = Signatures::default();
    let mut iter = lines(body);
    while let Some(line) = iter.next() {
        match line {
            Ok(Line::Comment(text)) => {
                signatures.comment(text, drops);
                continue;
            }
            Err(_) => {
                drops.add(DropReason::Parse, 1);
                if let Some(batch) = open.as_mut() {
                    batch.lines_refused += 1;
                }
            }
            Ok(Line::Sample(sample)) if sample.name == METADATA_NAME => {
                close(open.take(), &rows, None, sink);
                let signature = signatures.take();
                match meta_from_sample(&sample) {
                    Ok(meta) => {
                        let start = body.offset(sample.name.as_bytes());
                        if let Some(len) = sink.opened(&meta, &body[start..]) {
                            iter.skip_to(start + len);
                            continue;
                        }
                        rows.clear();
                        open = Some(Open {
                            meta,
                            start,
                            lines_refused: 0,
                            signature,
                        });
                    }
                    Err(rule) => {
                        drops.add(reason_for(rule, DropReason::Metadata), 1);
                        if signature.is_some() {
                            drops.add(DropReason::Signature, 1);
                        }
                    }
                }
            }
            Ok(Line::Sample(sample)) => {
                // One pass over the labels: the framing pair decides membership, the
                // rest are the row's extra labels.
                let mark = rows.mark();
                let (mut site, mut provider) = (None, None);
                for (name, value) in sample.labels {
                    match name {
                        SITE_LABEL => {
                            site.get_or_insert(value);
                        }
                        PROVIDER_LABEL => {
                            provider.get_or_insert(value);
                        }
                        _ => rows.push_label(name, value.unescaped()),
                    }
                }
                let Some(batch) = open
                    .as_mut()
                    .filter(|b| is(site, &b.meta.site) && is(provider, &b.meta.provider))
                else {
                    rows.abandon_row(mark);
                    close(open.take(), &rows, None, sink);
                    drops.add(DropReason::Unbatched, 1);
                    continue;
                };
                let row = stamp(&sample).and_then(|stamp_ms| {
                    rows.finish_row(mark, sample.name, sample.value, stamp_ms)
                        .map_err(|e| rule_of(&e))
                });
                if let Err(rule) = row {
                    rows.abandon_row(mark);
                    batch.lines_refused += 1;
                    drops.add(reason_for(rule, DropReason::Malformed), 1);
                }
            }
            Ok(_) => continue,
        }
        // Closes the open batch once every announced row has been seen.
        let full = open
            .as_ref()
            .is_some_and(|b| (rows.len() + b.lines_refused) as u64 >= b.meta.samples);
        if full {
            let raw = open.as_ref().map(|b| &body[b.start..iter.offset()]);
            close(open.take(), &rows, raw, sink);
        }
    }
    close(open, &rows, None, sink);
    signatures.end(drops);
}

/// Hands a batch that closed to the sink.
fn close<'a>(
    open: Option<Open<'a>>,
    rows: &Rows<'a>,
    raw: Option<&'a [u8]>,
    sink: &mut impl BatchSink<'a>,
) {
    if let Some(batch) = open {
        sink.closed(&BatchView {
            meta: &batch.meta,
            rows,
            lines_refused: batch.lines_refused,
            raw,
            signature: batch.signature,
        });
    }
}

/// A size bound is `cap`; any other broken rule counts as `otherwise`.
fn reason_for(rule: BatchRule, otherwise: DropReason) -> DropReason {
    if rule.is_bound() {
        DropReason::Cap
    } else {
        otherwise
    }
}

/// Whether a framing label was present and equals `expected` once unescaped.
fn is(value: Option<LabelValue<'_>>, expected: &str) -> bool {
    value.is_some_and(|v| v.eq_str(expected))
}

fn rule_of(e: &Error) -> BatchRule {
    match e {
        Error::Batch { rule, .. } => *rule,
        // Batch constructors only return batch errors; treat anything else as malformed.
        _ => BatchRule::Name,
    }
}

/// Reads a metadata line: exactly the six framing labels, the generation as value and a
/// timestamp.
fn meta_from_sample<'a>(sample: &Sample<'a>) -> Result<MetaRef<'a>, BatchRule> {
    let mut site = None;
    let mut provider = None;
    let mut uid = None;
    let mut epoch = None;
    let mut sequence = None;
    let mut samples = None;
    for (name, value) in sample.labels {
        let slot = match name {
            SITE_LABEL => &mut site,
            PROVIDER_LABEL => &mut provider,
            UID_LABEL => &mut uid,
            EPOCH_LABEL => &mut epoch,
            SEQUENCE_LABEL => &mut sequence,
            SAMPLES_LABEL => &mut samples,
            _ => return Err(BatchRule::UnexpectedLabel),
        };
        if slot.replace(value.unescaped()).is_some() {
            return Err(BatchRule::UnexpectedLabel);
        }
    }
    let (Some(site), Some(provider), Some(uid), Some(epoch), Some(sequence), Some(samples)) =
        (site, provider, uid, epoch, sequence, samples)
    else {
        return Err(BatchRule::MissingLabel);
    };
    let decimal = |field, text: &str| parse_decimal_u64(field, text).map_err(|e| rule_of(&e));
    let fence = Fence::new(
        decimal(EPOCH_LABEL, &epoch)?,
        decimal(SEQUENCE_LABEL, &sequence)?,
    );
    let samples = decimal(SAMPLES_LABEL, &samples)?;
    let generation = generation_from_value(sample.value).map_err(|e| rule_of(&e))?;
    let stamp_ms = stamp(sample)?;
    MetaRef::new(site, provider, uid, fence, samples, generation, stamp_ms).map_err(|e| rule_of(&e))
}

fn stamp(sample: &Sample<'_>) -> Result<u64, BatchRule> {
    let ts = sample.timestamp_ms.ok_or(BatchRule::MissingTimestamp)?;
    u64::try_from(ts).map_err(|_| BatchRule::NegativeTimestamp)
}
