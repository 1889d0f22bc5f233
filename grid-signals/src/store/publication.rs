//! The publication an entry holds for the relay: its last complete batch, as stored.

use std::ops::Range;

use crate::batch::{BatchMeta, LabelRef, MetaRef, Rows, write_batch};
use crate::signature::{BatchSignature, write_message};

/// A provider's last complete publication, with the rows the store kept of it (stamps
/// in store clock), as the relay writes it back.
///
/// The names and label text of every row live back to back in one buffer that each new
/// publication rewrites in place: holding the next publication of a provider allocates
/// nothing once the buffers have grown to its size, where a `Batch` of owned rows would
/// allocate a name and labels per row.
#[derive(Clone, Debug)]
pub(crate) struct Publication {
    meta: BatchMeta,
    text: String,
    rows: Vec<HeldRow>,
    /// (name, value) spans in `text`, rows' labels back to back.
    labels: Vec<(Range<usize>, Range<usize>)>,
    /// Its origin's signature over exactly these rows (verified when it was pulled, or
    /// made by this site), which the relay writes with it; `None` when unsigned or when
    /// the store kept fewer rows than were signed.
    signature: Option<BatchSignature>,
}

/// One row: spans of its name in the text and of its labels in the label list.
#[derive(Clone, Debug)]
struct HeldRow {
    name: Range<usize>,
    labels: Range<usize>,
    value: f64,
    stamp_ms: u64,
}

impl Publication {
    /// An empty publication of `meta`'s batch, rows to be added with [`Self::push`],
    /// with room for `rows` so that filling it does not grow its buffers step by step.
    pub(crate) fn with_capacity(meta: BatchMeta, rows: &Rows<'_>) -> Self {
        let (mut text, mut labels) = (0, 0);
        for row in rows.iter() {
            text += row.name.len();
            labels += row.labels.len();
            text += row
                .labels
                .iter()
                .map(|(n, v)| n.len() + v.len())
                .sum::<usize>();
        }
        Self {
            meta,
            text: String::with_capacity(text),
            rows: Vec::with_capacity(rows.len()),
            labels: Vec::with_capacity(labels),
            signature: None,
        }
    }

    /// Forgets every row, keeping the buffers, to hold the next publication.
    pub(crate) fn clear(&mut self) {
        self.text.clear();
        self.rows.clear();
        self.labels.clear();
        self.signature = None;
    }

    /// Keeps `signature` with it (see the field).
    pub(crate) fn set_signature(&mut self, signature: Option<BatchSignature>) {
        self.signature = signature;
    }

    /// The signature kept with it.
    pub(crate) fn signature(&self) -> Option<&BatchSignature> {
        self.signature.as_ref()
    }

    /// Appends the bytes a signature of it covers ([`write_message`]).
    pub(crate) fn write_message(&self, out: &mut Vec<u8>) {
        write_message(out, &self.meta, self.row_parts());
    }

    /// Every row as (name, extra labels, value, stamp in store clock).
    fn row_parts(
        &self,
    ) -> impl ExactSizeIterator<
        Item = (
            &str,
            impl ExactSizeIterator<Item = (&str, &str)> + '_,
            f64,
            u64,
        ),
    > + '_ {
        self.rows.iter().map(|row| {
            let labels = self.labels[row.labels.clone()]
                .iter()
                .map(|(n, v)| (&self.text[n.clone()], &self.text[v.clone()]));
            (
                &self.text[row.name.clone()],
                labels,
                row.value,
                row.stamp_ms,
            )
        })
    }

    /// Adds a row (extra labels sorted by name, stamp in store clock).
    pub(crate) fn push(&mut self, name: &str, labels: &[LabelRef<'_>], value: f64, stamp_ms: u64) {
        let name = self.append(name);
        let first = self.labels.len();
        for (label, text) in labels {
            let label = self.append(label);
            let text = self.append(text);
            self.labels.push((label, text));
        }
        self.rows.push(HeldRow {
            name,
            labels: first..self.labels.len(),
            value,
            stamp_ms,
        });
    }

    /// Sets the metadata: `meta`'s, stamped `stamp_ms` (store clock), announcing the rows
    /// held.
    pub(crate) fn set_meta(&mut self, meta: &MetaRef<'_>, stamp_ms: u64) {
        meta.overwrite(&mut self.meta, self.rows.len() as u64, stamp_ms);
    }

    /// The metadata (stamp in store clock).
    pub(crate) fn meta(&self) -> &BatchMeta {
        &self.meta
    }

    /// The lines it takes on the wire: the metadata line and its rows.
    pub(crate) fn lines(&self) -> u64 {
        1 + self.rows.len() as u64
    }

    /// Appends it as exposition, stamps moved by `shift_ms` (see
    /// [`crate::batch::Batch::write_shifted`]): the same bytes the equal batch writes.
    pub(crate) fn write_shifted(&self, out: &mut Vec<u8>, shift_ms: i64) {
        write_batch(out, &self.meta, self.row_parts(), shift_ms);
    }

    /// The row of series `metric` with exactly the extra labels `labels` (any order),
    /// value and stamp (store clock), if this publication carries it.
    pub(crate) fn find(&self, metric: &str, labels: &[(&str, &str)]) -> Option<(f64, u64)> {
        self.rows
            .iter()
            .find(|row| {
                let held = &self.labels[row.labels.clone()];
                self.text[row.name.clone()] == *metric
                    && held.len() == labels.len()
                    && held.iter().all(|(n, v)| {
                        labels.iter().any(|(ln, lv)| {
                            self.text[n.clone()] == **ln && self.text[v.clone()] == **lv
                        })
                    })
            })
            .map(|row| (row.value, row.stamp_ms))
    }

    fn append(&mut self, s: &str) -> Range<usize> {
        let start = self.text.len();
        self.text.push_str(s);
        start..self.text.len()
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;
    use crate::batch::{Batch, Fence, MetaRef, Row, Rows};

    #[test]
    fn a_publication_writes_the_bytes_of_the_equal_batch_and_is_rewritten_in_place() {
        let meta = BatchMeta::new("b", "m", "u", Fence::new(1, 2), 2, 3, 1_000).unwrap();
        let rows = vec![
            Row::new("q", vec![], 1.5, 990).unwrap(),
            Row::new(
                "e",
                vec![
                    ("z".into(), "x\"y".into()),
                    ("model_server_endpoint".into(), "10.0.0.1:80".into()),
                ],
                4.0,
                995,
            )
            .unwrap(),
        ];
        let batch = Batch::new(meta.clone(), rows);
        let mut held = Publication::with_capacity(meta.clone(), &Rows::default());
        for _ in 0..2 {
            held.clear();
            for row in &batch.rows {
                let labels: Vec<LabelRef<'_>> = row
                    .labels()
                    .iter()
                    .map(|(n, v)| (n.as_str(), Cow::Borrowed(v.as_str())))
                    .collect();
                held.push(row.name(), &labels, row.value(), row.stamp_ms());
            }
            held.set_meta(&MetaRef::of(&meta), meta.stamp_ms());
            let (mut want, mut got) = (Vec::new(), Vec::new());
            batch.write_shifted(&mut want, -100);
            held.write_shifted(&mut got, -100);
            assert_eq!(
                String::from_utf8(got).unwrap(),
                String::from_utf8(want).unwrap()
            );
            assert_eq!(held.lines(), 3);
        }
        // A shorter publication leaves nothing of the longer one behind.
        held.clear();
        held.set_meta(&MetaRef::of(&meta), 7);
        let mut got = Vec::new();
        held.write_shifted(&mut got, 0);
        assert_eq!(memchr::memchr_iter(b'\n', &got).count(), 1);
        assert_eq!(held.meta().samples(), 0);
        assert_eq!(held.meta().stamp_ms(), 7);
    }
}
