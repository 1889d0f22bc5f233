//! Writing a batch as exposition text (publishing and relaying).

use super::meta::{
    EPOCH_LABEL, METADATA_NAME, PROVIDER_LABEL, SAMPLES_LABEL, SEQUENCE_LABEL, SITE_LABEL,
    UID_LABEL,
};
use super::{Batch, BatchMeta, MAX_EXTRA_LABELS};
use crate::exposition::write_sample;

impl Batch {
    /// Appends the batch as exposition text: the metadata line, then every row labeled
    /// with the batch's `grid_site` and `grid_provider`, each with its own timestamp.
    ///
    /// `batch_samples` is written as the number of rows actually written, so what goes
    /// out is always whole.
    pub fn write(&self, out: &mut Vec<u8>) {
        self.write_shifted(out, 0);
    }

    /// Like [`Self::write`], with every stamp moved by `shift_ms` (the relay keeps ages
    /// relative to a reference time). Stamps that would fall before the Unix epoch are
    /// written as 0.
    pub fn write_shifted(&self, out: &mut Vec<u8>, shift_ms: i64) {
        let rows = self.rows.iter().map(|row| {
            let labels = row.labels().iter().map(|(n, v)| (n.as_str(), v.as_str()));
            (row.name(), labels, row.value(), row.stamp_ms())
        });
        write_batch(out, &self.meta, rows, shift_ms);
    }
}

/// Writes a batch: the metadata line (announcing as many rows as `rows` yields), then
/// each row `(name, extra labels, value, stamp)` labeled with the batch's `grid_site` and
/// `grid_provider`; every stamp moved by `shift_ms` and clamped at 0.
///
/// Shared by [`Batch::write_shifted`] and the store's relay of the publications it holds,
/// so a relayed publication has the bytes its batch would have.
pub(crate) fn write_batch<'r, L>(
    out: &mut Vec<u8>,
    meta: &'r BatchMeta,
    rows: impl ExactSizeIterator<Item = (&'r str, L, f64, u64)>,
    shift_ms: i64,
) where
    L: Iterator<Item = (&'r str, &'r str)>,
{
    let shift = |stamp: u64| -> i64 {
        let moved = i128::from(stamp) + i128::from(shift_ms);
        moved.clamp(0, i128::from(i64::MAX)) as i64
    };
    let (mut epoch_buf, mut sequence_buf, mut samples_buf) = (itoa_buf(), itoa_buf(), itoa_buf());
    let epoch = format_u64(&mut epoch_buf, meta.fence().epoch);
    let sequence = format_u64(&mut sequence_buf, meta.fence().sequence);
    let samples = format_u64(&mut samples_buf, rows.len() as u64);
    // Sorted by name, so the writer does not have to sort.
    let head = [
        (SAMPLES_LABEL, samples),
        (SEQUENCE_LABEL, sequence),
        (PROVIDER_LABEL, meta.provider()),
        (SITE_LABEL, meta.site()),
        (UID_LABEL, meta.uid()),
        (EPOCH_LABEL, epoch),
    ];
    write_sample(
        out,
        METADATA_NAME,
        &head,
        meta.generation() as f64,
        Some(shift(meta.stamp_ms())),
    );
    let mut labels: Vec<(&str, &str)> = Vec::with_capacity(MAX_EXTRA_LABELS + 2);
    for (name, extra, value, stamp_ms) in rows {
        labels.clear();
        labels.push((PROVIDER_LABEL, meta.provider()));
        labels.push((SITE_LABEL, meta.site()));
        labels.extend(extra);
        labels.sort_unstable_by_key(|(n, _)| *n);
        write_sample(out, name, &labels, value, Some(shift(stamp_ms)));
    }
}

/// Room for the decimal digits of any `u64`.
fn itoa_buf() -> [u8; 20] {
    [0; 20]
}

/// Formats `n` in decimal into `buf`, returning the digits.
fn format_u64(buf: &mut [u8; 20], mut n: u64) -> &str {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&buf[at..]).unwrap_or("0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{BatchMeta, Fence, Row};

    #[test]
    fn writes_the_metadata_line_then_labeled_rows() {
        let meta = BatchMeta::new("b", "m", "u1", Fence::new(1, 11), 3, 7, 2000).unwrap();
        let rows = vec![
            Row::new("grid_provider_ready", vec![], 1.0, 1990).unwrap(),
            Row::new(
                "llm_d_epp_per_endpoint_queue_size",
                vec![("model_server_endpoint".into(), "10.0.0.1:8000".into())],
                4.0,
                1995,
            )
            .unwrap(),
            Row::new("grid_provider_tpot_seconds", vec![], 0.025, 1999).unwrap(),
        ];
        let mut out = Vec::new();
        Batch::new(meta, rows).write(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "grid_provider_config_generation{batch_samples=\"3\",batch_sequence=\"11\",grid_provider=\"m\",grid_site=\"b\",provider_uid=\"u1\",publisher_epoch=\"1\"} 7 2000\n\
             grid_provider_ready{grid_provider=\"m\",grid_site=\"b\"} 1 1990\n\
             llm_d_epp_per_endpoint_queue_size{grid_provider=\"m\",grid_site=\"b\",model_server_endpoint=\"10.0.0.1:8000\"} 4 1995\n\
             grid_provider_tpot_seconds{grid_provider=\"m\",grid_site=\"b\"} 0.025 1999\n"
        );
    }

    #[test]
    fn shifted_stamps_keep_ages_and_clamp_at_zero() {
        let meta = BatchMeta::new("b", "m", "u", Fence::new(0, 0), 1, 1, 100).unwrap();
        let rows = vec![Row::new("x", vec![], 1.0, 50).unwrap()];
        let mut out = Vec::new();
        Batch::new(meta, rows).write_shifted(&mut out, -60);
        let text = String::from_utf8(out).unwrap();
        assert!(text.lines().next().unwrap().ends_with(" 1 40"), "{text}");
        assert!(text.lines().nth(1).unwrap().ends_with(" 1 0"), "{text}");
    }

    #[test]
    fn formats_u64_extremes() {
        let mut buf = itoa_buf();
        assert_eq!(format_u64(&mut buf, 0), "0");
        let mut buf = itoa_buf();
        assert_eq!(format_u64(&mut buf, u64::MAX), "18446744073709551615");
    }
}
