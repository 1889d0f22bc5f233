//! Batches as views: metadata and rows borrowed from a body (or from an owned [`Batch`]),
//! so the store can judge a batch and store its readings without first copying every
//! name and label into owned strings.
//!
//! A view is checked by the same rules as [`BatchMeta::new`] and [`Row::new`]
//! ([`check_meta`], [`check_row`]), and its digest is the one [`Batch::digest`] gives the
//! equal owned batch, so both ingest paths judge and remember publications alike.

use std::borrow::Cow;
use std::hash::{DefaultHasher, Hasher};
use std::ops::Range;

use super::meta::check_meta;
use super::row::check_row;
use super::{BatchMeta, Fence, Revision, Row};
use crate::Error;

/// A metadata line checked by [`check_meta`], its strings borrowed (unescaped only when
/// they hold escapes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MetaRef<'a> {
    pub(crate) site: Cow<'a, str>,
    pub(crate) provider: Cow<'a, str>,
    pub(crate) uid: Cow<'a, str>,
    pub(crate) fence: Fence,
    pub(crate) samples: u64,
    pub(crate) generation: u64,
    pub(crate) stamp_ms: u64,
}

impl<'a> MetaRef<'a> {
    /// Checks the parts of a metadata line.
    pub(crate) fn new(
        site: Cow<'a, str>,
        provider: Cow<'a, str>,
        uid: Cow<'a, str>,
        fence: Fence,
        samples: u64,
        generation: u64,
        stamp_ms: u64,
    ) -> Result<Self, Error> {
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

    /// A view of owned metadata (already checked).
    pub(crate) fn of(meta: &'a BatchMeta) -> Self {
        Self {
            site: Cow::Borrowed(meta.site()),
            provider: Cow::Borrowed(meta.provider()),
            uid: Cow::Borrowed(meta.uid()),
            fence: meta.fence(),
            samples: meta.samples(),
            generation: meta.generation(),
            stamp_ms: meta.stamp_ms(),
        }
    }

    /// The owned metadata, announcing `samples` rows and stamped `stamp_ms`.
    pub(crate) fn to_owned_meta(&self, samples: u64, stamp_ms: u64) -> BatchMeta {
        BatchMeta::from_checked(
            &self.site,
            &self.provider,
            &self.uid,
            self.fence,
            samples,
            self.generation,
            stamp_ms,
        )
    }

    /// Rewrites `held` into this metadata announcing `samples` rows and stamped
    /// `stamp_ms`, reusing its buffers.
    pub(crate) fn overwrite(&self, held: &mut BatchMeta, samples: u64, stamp_ms: u64) {
        held.overwrite(
            &self.site,
            &self.provider,
            &self.uid,
            self.fence,
            samples,
            self.generation,
            stamp_ms,
        );
    }

    /// The revision the batch belongs to.
    pub(crate) fn revision(&self) -> Revision {
        Revision {
            uid: self.uid.clone().into_owned(),
            generation: self.generation,
            epoch: self.fence.epoch,
        }
    }

    /// Whether `other` is this batch's revision, without building one.
    pub(crate) fn same_revision(&self, other: &Revision) -> bool {
        *self.uid == *other.uid
            && self.generation == other.generation
            && self.fence.epoch == other.epoch
    }
}

/// One label of a row: its name and unescaped value.
pub(crate) type LabelRef<'a> = (&'a str, Cow<'a, str>);

/// One row in a [`Rows`] set; its labels are a range of the set's label arena.
#[derive(Clone, Debug)]
struct RowSlot<'a> {
    name: &'a str,
    labels: Range<usize>,
    value: f64,
    stamp_ms: u64,
}

/// One checked row as a view: extra labels sorted by name.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowRef<'r, 'a> {
    pub(crate) name: &'a str,
    pub(crate) labels: &'r [LabelRef<'a>],
    pub(crate) value: f64,
    pub(crate) stamp_ms: u64,
}

/// The checked rows of one batch, their labels in one arena, so a row costs no
/// allocation of its own and the buffers are reused from batch to batch.
#[derive(Clone, Debug, Default)]
pub(crate) struct Rows<'a> {
    rows: Vec<RowSlot<'a>>,
    labels: Vec<LabelRef<'a>>,
}

impl<'a> Rows<'a> {
    /// Views of owned rows (already checked and sorted).
    pub(crate) fn of(rows: &'a [Row]) -> Self {
        let mut set = Self {
            rows: Vec::with_capacity(rows.len()),
            labels: Vec::with_capacity(rows.iter().map(|r| r.labels().len()).sum()),
        };
        for row in rows {
            let start = set.labels.len();
            set.labels.extend(
                row.labels()
                    .iter()
                    .map(|(n, v)| (n.as_str(), Cow::Borrowed(v.as_str()))),
            );
            set.rows.push(RowSlot {
                name: row.name(),
                labels: start..set.labels.len(),
                value: row.value(),
                stamp_ms: row.stamp_ms(),
            });
        }
        set
    }

    /// Forgets every row, keeping the buffers.
    pub(crate) fn clear(&mut self) {
        self.rows.clear();
        self.labels.clear();
    }

    /// How many rows are held.
    pub(crate) fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no row is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Where the next row's labels start: pushed with [`Self::push_label`], then kept
    /// by [`Self::finish_row`] or dropped by [`Self::abandon_row`] from this mark.
    pub(crate) fn mark(&self) -> usize {
        self.labels.len()
    }

    /// Adds one extra label to the row being built.
    pub(crate) fn push_label(&mut self, name: &'a str, value: Cow<'a, str>) {
        self.labels.push((name, value));
    }

    /// Drops the labels pushed since `mark`: the line is not a row after all.
    pub(crate) fn abandon_row(&mut self, mark: usize) {
        self.labels.truncate(mark);
    }

    /// Checks the row whose labels were pushed since `mark` ([`check_row`]) and keeps
    /// it, or drops its labels and says which rule it broke.
    pub(crate) fn finish_row(
        &mut self,
        mark: usize,
        name: &'a str,
        value: f64,
        stamp_ms: u64,
    ) -> Result<(), Error> {
        if let Err(e) = check_row(name, &mut self.labels[mark..], value) {
            self.labels.truncate(mark);
            return Err(e);
        }
        self.rows.push(RowSlot {
            name,
            labels: mark..self.labels.len(),
            value,
            stamp_ms,
        });
        Ok(())
    }

    /// Every row, in wire order.
    pub(crate) fn iter(&self) -> impl ExactSizeIterator<Item = RowRef<'_, 'a>> + '_ {
        self.rows.iter().map(|slot| RowRef {
            name: slot.name,
            labels: &self.labels[slot.labels.clone()],
            value: slot.value,
            stamp_ms: slot.stamp_ms,
        })
    }
}

/// One batch as a view: what the store judges and stores.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchView<'v, 'a> {
    /// The checked metadata line.
    pub(crate) meta: &'v MetaRef<'a>,
    /// The checked rows that followed it.
    pub(crate) rows: &'v Rows<'a>,
    /// Lines of the batch refused on the way (already counted).
    pub(crate) lines_refused: usize,
    /// The batch's bytes, from its metadata line's name to just past its last row's
    /// line, when it was read from a body and closed by its row count.
    pub(crate) raw: Option<&'a [u8]>,
    /// The signature line that preceded its metadata line, if any (not yet verified).
    pub(crate) signature: Option<crate::signature::SignatureRef<'a>>,
}

impl BatchView<'_, '_> {
    /// Whether the payload is whole (see [`Batch::is_complete`]).
    pub(crate) fn is_complete(&self) -> bool {
        self.lines_refused == 0 && self.rows.len() as u64 == self.meta.samples
    }

    /// The lines this batch occupied that reached it (see [`Batch::lines`]).
    pub(crate) fn lines(&self) -> u64 {
        1 + self.rows.len() as u64
    }

    /// The digest of everything the batch says (see [`Batch::digest`]).
    ///
    /// Stamps enter relative to the metadata stamp, and the metadata stamp not at all: a
    /// relay dated with a whole-second `Date` moves every stamp of a publication by the
    /// same sub-second shift, and that re-dated copy is still the publication held at its
    /// fence (a repeat, not a changed duplicate counted as `delayed`). Any other change
    /// to a stamp changes the digest.
    pub(crate) fn digest(&self) -> u64 {
        let meta = self.meta;
        let mut h = DefaultHasher::new();
        write_str(&mut h, &meta.site);
        write_str(&mut h, &meta.provider);
        write_str(&mut h, &meta.uid);
        for n in [
            meta.fence.epoch,
            meta.fence.sequence,
            meta.samples,
            meta.generation,
            self.rows.len() as u64,
        ] {
            h.write_u64(n);
        }
        for row in self.rows.iter() {
            write_str(&mut h, row.name);
            h.write_u64(row.labels.len() as u64);
            for (name, value) in row.labels {
                write_str(&mut h, name);
                write_str(&mut h, value);
            }
            h.write_u64(row.value.to_bits());
            h.write_u64(row.stamp_ms.wrapping_sub(meta.stamp_ms));
        }
        h.write_u64(self.lines_refused as u64);
        h.finish()
    }

    /// Appends the bytes its signature covers (`crate::signature::write_message`).
    pub(crate) fn write_message(&self, out: &mut Vec<u8>) {
        let meta = self.meta;
        crate::signature::write_message_parts(
            out,
            (&meta.site, &meta.provider, &meta.uid),
            [meta.fence.epoch, meta.fence.sequence, meta.generation],
            meta.stamp_ms,
            self.rows.iter().map(|r| {
                (
                    r.name,
                    r.labels.iter().map(|(n, v)| (*n, &**v)),
                    r.value,
                    r.stamp_ms,
                )
            }),
        );
    }
}

/// A string terminated by a byte no UTF-8 text holds, so adjacent strings cannot run
/// into each other.
fn write_str(h: &mut DefaultHasher, s: &str) {
    h.write(s.as_bytes());
    h.write_u8(0xff);
}
