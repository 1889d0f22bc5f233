//! Encoding what the store holds back to exposition: the operator's relay to its gateway.

use super::Store;
use crate::exposition::MAX_EXPOSITION_BYTES;

/// Default line budget of a relay body. At roughly 100 bytes a line, the byte budget
/// ([`MAX_EXPOSITION_BYTES`]) is normally reached first; the line budget bounds the
/// receiver's per-line work when lines are short.
pub const DEFAULT_RELAY_MAX_LINES: usize = 16_384;

/// How much one relay body may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelayBudget {
    /// Most bytes; the default is the receiver's body cap, so a relay is never `body_cap`.
    pub max_bytes: usize,
    /// Most lines (metadata lines and rows).
    pub max_lines: usize,
}

impl Default for RelayBudget {
    fn default() -> Self {
        Self {
            max_bytes: MAX_EXPOSITION_BYTES,
            max_lines: DEFAULT_RELAY_MAX_LINES,
        }
    }
}

/// What one relay encoding did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Providers written (each as one whole batch).
    pub providers_written: u64,
    /// Providers left out because their batch did not fit the budget.
    pub providers_dropped: u64,
    /// Lines written.
    pub lines: u64,
    /// Bytes written.
    pub bytes: u64,
}

impl Store {
    /// Appends to `out` the last complete publication of every provider whose publication is
    /// at most one TTL old at `now_ms`, as whole batches with their original fences, in (site,
    /// provider) order.
    ///
    /// Stamps are moved by `reference_ms - now_ms`, so each reading's age relative to
    /// `reference_ms` (the `Date` the daemon sends the body with) equals its age now; pass
    /// the same clock reading for both unless re-dating. A publication is never split:
    /// one that does not fit what is left of `budget` is left out whole and counted, and
    /// smaller ones after it may still fit.
    ///
    /// Re-sending an unchanged publication yields the same bytes, so the receiver sees an
    /// exact repeat (idempotent, not a drop).
    pub fn encode_relay(
        &self,
        now_ms: u64,
        reference_ms: u64,
        budget: RelayBudget,
        out: &mut Vec<u8>,
    ) -> RelayReport {
        let shift = (i128::from(reference_ms) - i128::from(now_ms))
            .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        let mut report = RelayReport::default();
        let mut scratch = Vec::new();
        for entry in self.entries() {
            let Some(publication) = entry.held_publication(now_ms) else {
                continue;
            };
            scratch.clear();
            publication.write_shifted(&mut scratch, shift);
            let lines = publication.lines();
            let fits = report.bytes + scratch.len() as u64 <= budget.max_bytes as u64
                && report.lines + lines <= budget.max_lines as u64;
            if fits {
                out.extend_from_slice(&scratch);
                report.providers_written += 1;
                report.lines += lines;
                report.bytes += scratch.len() as u64;
            } else {
                report.providers_dropped += 1;
            }
        }
        report
    }

    /// The fence of the batch held for one provider, outlived or not (what a newer
    /// version is compared with before it is pulled).
    pub fn fence_of(&self, site: &str, provider: &str) -> Option<crate::batch::Fence> {
        Some(
            self.entry(site, provider)?
                .publication
                .as_ref()?
                .meta()
                .fence(),
        )
    }

    /// The fence of every batch held and not outlived, by site and provider: what a
    /// gossip digest lists.
    pub fn held_fences(
        &self,
        now_ms: u64,
    ) -> impl Iterator<Item = (&str, &str, crate::batch::Fence)> {
        let ttl = self.config.ttl_ms;
        self.entries().filter_map(move |entry| {
            let meta = entry.publication.as_ref()?.meta();
            (meta.stamp_ms().saturating_add(ttl) >= now_ms)
                .then(|| (meta.site(), meta.provider(), meta.fence()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixture::{T0, admit, batch, meta, store};
    use super::super::{Sender, StoreEvent};
    use super::*;
    use crate::batch::{Batch, Fence, Row};

    fn relay(s: &Store, now: u64, budget: RelayBudget) -> (Vec<u8>, RelayReport) {
        let mut out = Vec::new();
        let report = s.encode_relay(now, now, budget, &mut out);
        (out, report)
    }

    #[test]
    fn one_provider_is_encoded_whole_and_alone_and_an_outlived_one_not_at_all() {
        let mut s = store();
        admit(
            &mut s,
            batch("b", "m", Fence::new(T0, 3), &[("q", 4.0)], T0),
            T0,
        );
        admit(
            &mut s,
            batch("b", "n", Fence::new(T0, 5), &[("q", 1.0)], T0),
            T0,
        );
        let mut out = Vec::new();
        assert_eq!(
            s.encode_pulled(&[("b", "m"), ("b", "x")], T0, T0, &mut out),
            [Fence::new(T0, 3)]
        );
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(
            text.contains("grid_provider=\"m\"") && !text.contains("grid_provider=\"n\""),
            "{text}"
        );
        let mut fresh = store();
        let report = fresh.ingest(&out, Sender::Peer { site: "b" }, T0, T0);
        assert_eq!(report.dropped.total(), 0);
        assert_eq!(
            fresh
                .entry("b", "m")
                .and_then(|e| e.publication.as_ref())
                .map(|p| p.meta().fence()),
            Some(Fence::new(T0, 3))
        );
        assert_eq!(s.held_fences(T0).count(), 2);
        assert_eq!(s.fence_of("b", "n"), Some(Fence::new(T0, 5)));
        assert_eq!(s.fence_of("b", "o"), None);
        let late = T0 + s.config().ttl_ms + 1;
        assert!(
            s.encode_pulled(&[("b", "m")], late, late, &mut Vec::new())
                .is_empty()
        );
        assert_eq!(s.held_fences(late).count(), 0);
    }

    #[test]
    fn relay_round_trips_whole_batches_with_ages_and_fences() {
        let mut operator = store();
        admit(
            &mut operator,
            batch(
                "b",
                "m",
                Fence::new(T0, 3),
                &[("q", 4.0), ("r", 0.5)],
                T0 - 700,
            ),
            T0 - 700,
        );
        admit(
            &mut operator,
            batch("c", "n", Fence::new(T0, 9), &[("q", 1.0)], T0 - 200),
            T0 - 200,
        );
        let (text, report) = relay(&operator, T0, RelayBudget::default());
        assert_eq!((report.providers_written, report.lines), (2, 5));
        assert_eq!(report.bytes, text.len() as u64);

        // The gateway's clock is 10 s ahead; the relay body is dated with the
        // operator's T0.
        let mut gateway = store();
        let r = gateway.ingest(&text, Sender::Local, T0, T0 + 10_000);
        assert_eq!(
            (r.batches_stored, r.rows_stored, r.dropped.total()),
            (2, 3, 0)
        );
        let e = gateway.entry("b", "m").unwrap();
        assert_eq!(e.fence(), Some(Fence::new(T0, 3)));
        let q = e.latest("q", &[]).unwrap();
        assert_eq!((q.value, q.stamp_ms), (4.0, T0 + 10_000 - 700));

        // Relaying the unchanged store again gives the same bytes: an exact repeat.
        let (again, _) = relay(&operator, T0 + 1_000, RelayBudget::default());
        assert_eq!(again, text);
        let r = gateway.ingest(&again, Sender::Local, T0 + 1_000, T0 + 11_000);
        assert_eq!((r.batches_repeated, r.dropped.total()), (2, 0));
    }

    #[test]
    fn an_unchanged_publication_relayed_again_under_a_whole_second_date_is_a_repeat_not_a_drop() {
        // The operator dates a relay body with a whole-second `Date` and shifts stamps by
        // the sub-second remainder, so the same publication re-relayed 400 ms later has
        // other stamp bytes. It is still the publication held at that fence.
        let mut operator = store();
        admit(
            &mut operator,
            batch("b", "m", Fence::new(T0, 3), &[("q", 4.0)], T0 - 100),
            T0 - 100,
        );
        let mut first = Vec::new();
        operator.encode_relay(T0 + 300, T0, RelayBudget::default(), &mut first);
        let mut second = Vec::new();
        operator.encode_relay(T0 + 700, T0, RelayBudget::default(), &mut second);
        assert_ne!(first, second, "the stamps moved with the re-dating");
        let mut gateway = store();
        let r = gateway.ingest(&first, Sender::Local, T0, T0 + 300);
        assert_eq!((r.batches_stored, r.dropped.total()), (1, 0));
        let stored = gateway.entry("b", "m").unwrap().latest("q", &[]).unwrap();
        let r = gateway.ingest(&second, Sender::Local, T0, T0 + 700);
        assert_eq!(
            (
                r.batches_repeated,
                r.dropped.get(super::super::DropReason::Delayed)
            ),
            (1, 0)
        );
        // A repeat leaves the held reading (and its age) as it was.
        assert_eq!(
            gateway.entry("b", "m").unwrap().latest("q", &[]),
            Some(stored)
        );
    }

    #[test]
    fn relay_shifts_stamps_to_the_reference_time() {
        let mut s = store();
        admit(
            &mut s,
            batch("b", "m", Fence::new(T0, 1), &[("q", 1.0)], T0 - 300),
            T0 - 300,
        );
        let mut out = Vec::new();
        s.encode_relay(T0, T0 + 5_000, RelayBudget::default(), &mut out);
        let text = String::from_utf8(out).unwrap();
        let expected = format!(" {}\n", T0 + 5_000 - 300);
        assert!(
            text.lines().all(|l| format!("{l}\n").ends_with(&expected)),
            "{text}"
        );
    }

    #[test]
    fn stale_publications_are_not_relayed() {
        let mut s = store();
        admit(
            &mut s,
            batch("b", "m", Fence::new(T0, 1), &[("q", 1.0)], T0),
            T0,
        );
        let ttl = s.config().ttl_ms;
        assert_eq!(
            relay(&s, T0 + ttl, RelayBudget::default())
                .1
                .providers_written,
            1
        );
        assert_eq!(
            relay(&s, T0 + ttl + 1, RelayBudget::default())
                .1
                .providers_written,
            0
        );
    }

    #[test]
    fn zero_sample_publication_is_relayed_as_its_metadata_line() {
        let mut s = store();
        admit(&mut s, batch("b", "m", Fence::new(T0, 1), &[], T0), T0);
        let (text, report) = relay(&s, T0, RelayBudget::default());
        assert_eq!(report.lines, 1);
        let mut gw = store();
        gw.ingest(&text, Sender::Local, T0, T0);
        assert_eq!(
            gw.entry("b", "m").unwrap().learning(T0),
            super::super::Learning::Paused(super::super::PauseReason::ZeroSamples)
        );
        assert_eq!(gw.poll_event(), None::<StoreEvent>);
    }

    fn three_providers() -> Store {
        let mut s = store();
        for p in ["p1", "p2", "p3"] {
            admit(
                &mut s,
                batch("b", p, Fence::new(T0, 1), &[("q", 1.0)], T0),
                T0,
            );
        }
        s
    }

    #[test]
    fn byte_budget_exactly_met_fits_and_one_byte_less_drops_a_whole_provider() {
        let s = three_providers();
        let (full, _) = relay(&s, T0, RelayBudget::default());
        let exact = RelayBudget {
            max_bytes: full.len(),
            ..RelayBudget::default()
        };
        assert_eq!(relay(&s, T0, exact).1.providers_written, 3);
        let short = RelayBudget {
            max_bytes: full.len() - 1,
            ..RelayBudget::default()
        };
        let (text, report) = relay(&s, T0, short);
        assert_eq!((report.providers_written, report.providers_dropped), (2, 1));
        // What went out is still whole batches.
        let mut gw = store();
        let r = gw.ingest(&text, Sender::Local, T0, T0);
        assert_eq!((r.batches_stored, r.dropped.total()), (2, 0));
    }

    #[test]
    fn line_budget_exactly_met_fits_and_one_line_less_drops_a_whole_provider() {
        let s = three_providers();
        let exact = RelayBudget {
            max_bytes: usize::MAX,
            max_lines: 6,
        };
        assert_eq!(relay(&s, T0, exact).1.providers_written, 3);
        let short = RelayBudget {
            max_bytes: usize::MAX,
            max_lines: 5,
        };
        let report = relay(&s, T0, short).1;
        assert_eq!(
            (
                report.providers_written,
                report.providers_dropped,
                report.lines
            ),
            (2, 1, 4)
        );
    }

    #[test]
    fn default_line_budget_holds_exactly_default_relay_max_lines() {
        // 64 providers of 1 metadata line and 255 per-endpoint rows: 16 384 lines.
        let per = 256;
        let providers = DEFAULT_RELAY_MAX_LINES / per;
        assert_eq!(providers * per, DEFAULT_RELAY_MAX_LINES);
        let rows = || -> Vec<Row> {
            (0..per - 1)
                .map(|i| Row::new("e", vec![("ep".into(), format!("{i}"))], 1.0, T0).unwrap())
                .collect()
        };
        let mut s = store();
        for i in 0..providers {
            let meta = meta(
                &format!("s{i}"),
                "p",
                "u",
                Fence::new(T0, 1),
                per as u64 - 1,
                T0,
            );
            admit(&mut s, Batch::new(meta, rows()), T0);
        }
        let budget = RelayBudget {
            max_bytes: usize::MAX,
            ..RelayBudget::default()
        };
        let report = relay(&s, T0, budget).1;
        assert_eq!(report.lines, DEFAULT_RELAY_MAX_LINES as u64);
        assert_eq!(report.providers_dropped, 0);
        // One more line (a zero-sample provider sorting last) no longer fits.
        admit(&mut s, batch("zz", "p", Fence::new(T0, 1), &[], T0), T0);
        let report = relay(&s, T0, budget).1;
        assert_eq!(report.lines, DEFAULT_RELAY_MAX_LINES as u64);
        assert_eq!(report.providers_dropped, 1);
    }
}
