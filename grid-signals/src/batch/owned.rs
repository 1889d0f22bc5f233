//! A decoded batch: its metadata and the rows that followed it.

use super::view::{BatchView, MetaRef, Rows};
use super::{BatchMeta, Row};
use crate::signature::write_message;

/// One provider's publication as it arrived: the metadata line and the rows collected
/// under it.
///
/// A batch is *complete* when exactly `meta.samples()` rows followed and none of its lines
/// was refused on the way; anything else is a rejected payload, whose ordering metadata
/// still counts (see `docs/wire.md`).
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// The validated metadata line.
    pub meta: BatchMeta,
    /// The rows that followed it, in wire order.
    pub rows: Vec<Row>,
    /// Lines that belonged to this batch but were refused before it was assembled (for
    /// example lines that failed to parse); already counted by whoever refused them.
    pub lines_refused: usize,
}

impl Batch {
    /// A batch of `rows` under `meta` with nothing refused on the way.
    pub fn new(meta: BatchMeta, rows: Vec<Row>) -> Self {
        Self {
            meta,
            rows,
            lines_refused: 0,
        }
    }

    /// Whether the payload is whole: the announced number of rows, none refused.
    pub fn is_complete(&self) -> bool {
        self.lines_refused == 0 && self.rows.len() as u64 == self.meta.samples()
    }

    /// The lines this batch occupied on the wire that reached it (metadata plus rows), for
    /// counting it as one drop.
    pub fn lines(&self) -> u64 {
        1 + self.rows.len() as u64
    }

    /// The owned batch a view describes (for callers that keep batches).
    pub(crate) fn from_view(view: &BatchView<'_, '_>) -> Self {
        let rows = view
            .rows
            .iter()
            .map(|r| Row::from_checked(r.name, r.labels, r.value, r.stamp_ms))
            .collect();
        Self {
            meta: view
                .meta
                .to_owned_meta(view.meta.samples, view.meta.stamp_ms),
            rows,
            lines_refused: view.lines_refused,
        }
    }

    /// The bytes its signature covers (see [`crate::signature::write_message`]).
    pub fn signed_message(&self) -> Vec<u8> {
        let mut out = Vec::new();
        write_message(
            &mut out,
            &self.meta,
            self.rows.iter().map(|row| {
                (
                    row.name(),
                    row.labels().iter().map(|(n, v)| (n.as_str(), v.as_str())),
                    row.value(),
                    row.stamp_ms(),
                )
            }),
        );
        out
    }

    /// A digest of everything the batch says, as received, with its stamps taken
    /// relative to the metadata stamp: a copy re-dated by a relay (every stamp moved by
    /// one shift) is the same publication.
    ///
    /// Two batches with the same digest are treated as the same publication (an exact
    /// repeat). 64 bits of `SipHash` with fixed keys: deterministic, and a collision between
    /// two publications at the same fence is not a practical concern. The store computes
    /// the same digest over batches it reads straight from a body, without building them.
    pub fn digest(&self) -> u64 {
        let meta = MetaRef::of(&self.meta);
        let rows = Rows::of(&self.rows);
        BatchView {
            meta: &meta,
            rows: &rows,
            lines_refused: self.lines_refused,
            raw: None,
            signature: None,
        }
        .digest()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Fence;

    fn batch(samples: u64, values: &[f64]) -> Batch {
        let meta = BatchMeta::new("s", "p", "u", Fence::new(1, 1), samples, 7, 10).unwrap();
        let rows = values
            .iter()
            .map(|&v| Row::new("m", vec![], v, 10).unwrap())
            .collect();
        Batch::new(meta, rows)
    }

    #[test]
    fn complete_only_with_exactly_the_announced_rows() {
        assert!(batch(2, &[1.0, 2.0]).is_complete());
        assert!(!batch(2, &[1.0]).is_complete());
        assert!(!batch(2, &[1.0, 2.0, 3.0]).is_complete());
        assert!(batch(0, &[]).is_complete());
        let mut refused = batch(2, &[1.0, 2.0]);
        refused.lines_refused = 1;
        assert!(!refused.is_complete());
    }

    #[test]
    fn digest_ignores_one_shift_of_every_stamp_but_not_a_row_stamp_moved_alone() {
        let shifted = |meta_stamp: u64, row_stamp: u64| {
            let meta = BatchMeta::new("s", "p", "u", Fence::new(1, 1), 1, 7, meta_stamp).unwrap();
            Batch::new(meta, vec![Row::new("m", vec![], 1.0, row_stamp).unwrap()]).digest()
        };
        assert_eq!(shifted(10, 8), shifted(410, 408));
        assert_ne!(shifted(10, 8), shifted(10, 9));
        assert_ne!(shifted(10, 8), shifted(11, 8));
    }

    #[test]
    fn digest_tells_a_changed_duplicate_from_an_exact_repeat() {
        assert_eq!(
            batch(2, &[1.0, 2.0]).digest(),
            batch(2, &[1.0, 2.0]).digest()
        );
        assert_ne!(
            batch(2, &[1.0, 2.0]).digest(),
            batch(2, &[1.0, 2.5]).digest()
        );
        assert_ne!(
            batch(2, &[1.0, 2.0]).digest(),
            batch(2, &[2.0, 1.0]).digest()
        );
    }
}
