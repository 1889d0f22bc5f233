//! Turning an exposition body into batches: parse, then group lines under their
//! metadata line.

use super::{DropCounts, DropReason};
use crate::Error;
use crate::batch::{
    Batch, BatchMeta, BatchRule, EPOCH_LABEL, Fence, METADATA_NAME, PROVIDER_LABEL, Row,
    SAMPLES_LABEL, SEQUENCE_LABEL, SITE_LABEL, UID_LABEL, generation_from_value, parse_decimal_u64,
};
use crate::exposition::{Line, Sample, lines};

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
pub fn decode_batches(body: &[u8], drops: &mut DropCounts, mut on_batch: impl FnMut(Batch)) {
    let mut open: Option<Batch> = None;
    for line in lines(body) {
        match line {
            Err(_) => {
                drops.add(DropReason::Parse, 1);
                if let Some(batch) = open.as_mut() {
                    batch.lines_refused += 1;
                    close_if_full(&mut open, &mut on_batch);
                }
            }
            Ok(Line::Sample(sample)) if sample.name == METADATA_NAME => {
                if let Some(batch) = open.take() {
                    on_batch(batch);
                }
                match meta_from_sample(&sample) {
                    Ok(meta) => {
                        // Bounded by MAX_BATCH_SAMPLES, so reserving up front is safe.
                        let rows = Vec::with_capacity(meta.samples() as usize);
                        open = Some(Batch::new(meta, rows));
                        close_if_full(&mut open, &mut on_batch);
                    }
                    Err(rule) => drops.add(
                        if rule.is_bound() {
                            DropReason::Cap
                        } else {
                            DropReason::Metadata
                        },
                        1,
                    ),
                }
            }
            Ok(Line::Sample(sample)) => {
                let belongs = open.as_ref().is_some_and(|b| {
                    label_is(&sample, SITE_LABEL, b.meta.site())
                        && label_is(&sample, PROVIDER_LABEL, b.meta.provider())
                });
                if !belongs {
                    if let Some(batch) = open.take() {
                        on_batch(batch);
                    }
                    drops.add(DropReason::Unbatched, 1);
                    continue;
                }
                if let Some(batch) = open.as_mut() {
                    match row_from_sample(&sample) {
                        Ok(row) => batch.rows.push(row),
                        Err(rule) => {
                            batch.lines_refused += 1;
                            drops.add(
                                if rule.is_bound() {
                                    DropReason::Cap
                                } else {
                                    DropReason::Malformed
                                },
                                1,
                            );
                        }
                    }
                }
                close_if_full(&mut open, &mut on_batch);
            }
            Ok(_) => {}
        }
    }
    if let Some(batch) = open {
        on_batch(batch);
    }
}

/// Hands the open batch on once every announced row has been seen.
fn close_if_full(open: &mut Option<Batch>, on_batch: &mut impl FnMut(Batch)) {
    let full = open
        .as_ref()
        .is_some_and(|b| (b.rows.len() + b.lines_refused) as u64 >= b.meta.samples());
    if full {
        if let Some(batch) = open.take() {
            on_batch(batch);
        }
    }
}

fn label_is(sample: &Sample<'_>, name: &str, expected: &str) -> bool {
    sample.labels.get(name).is_some_and(|v| v.eq_str(expected))
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
fn meta_from_sample(sample: &Sample<'_>) -> Result<BatchMeta, BatchRule> {
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
    BatchMeta::new(
        site.into_owned(),
        provider.into_owned(),
        uid.into_owned(),
        fence,
        samples,
        generation,
        stamp_ms,
    )
    .map_err(|e| rule_of(&e))
}

/// Reads a row: its labels besides `grid_site`/`grid_provider`, value and timestamp.
fn row_from_sample(sample: &Sample<'_>) -> Result<Row, BatchRule> {
    let labels = sample
        .labels
        .iter()
        .filter(|(n, _)| *n != SITE_LABEL && *n != PROVIDER_LABEL)
        .map(|(n, v)| (n.to_owned(), v.unescaped().into_owned()))
        .collect();
    Row::new(sample.name, labels, sample.value, stamp(sample)?).map_err(|e| rule_of(&e))
}

fn stamp(sample: &Sample<'_>) -> Result<u64, BatchRule> {
    let ts = sample.timestamp_ms.ok_or(BatchRule::MissingTimestamp)?;
    u64::try_from(ts).map_err(|_| BatchRule::NegativeTimestamp)
}
