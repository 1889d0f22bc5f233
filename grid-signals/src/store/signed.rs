//! Signatures held with publications: this site's own signed as they are published, and
//! every signed one written whole into a gossip pull's answer.

use super::Store;
use crate::batch::Fence;
use crate::exposition::MAX_EXPOSITION_BYTES;
use crate::signature::{BatchSigner, SigningChain, write_chain_line, write_signature_line};

/// The chain lines one body has written so far, by index.
#[derive(Default)]
struct Chains<'s>(Vec<&'s SigningChain>);

impl<'s> Chains<'s> {
    /// The index of `chain` in this body, and the chain line to write first when it is
    /// new.
    fn index(&mut self, chain: &'s SigningChain, out: &mut Vec<u8>) -> usize {
        if let Some(i) = self.0.iter().position(|c| c.same(chain) || *c == chain) {
            return i;
        }
        self.0.push(chain);
        write_chain_line(out, self.0.len() - 1, chain);
        self.0.len() - 1
    }
}

impl Store {
    /// Signs the publication held for (`site`, `provider`) with `signer`: the signature
    /// covers exactly the rows held, so what the relay writes is what was signed. Returns
    /// whether it is now signed. The chain is shared with another publication of the
    /// same site already holding an equal one, so a site's chain is held once.
    pub fn sign_held(&mut self, site: &str, provider: &str, signer: &dyn BatchSigner) -> bool {
        let mut message = Vec::new();
        let Some(publication) = self
            .entry(site, provider)
            .and_then(|e| e.publication.as_ref())
        else {
            return false;
        };
        publication.write_message(&mut message);
        let Some(mut signature) = signer.sign(&message) else {
            return false;
        };
        let shared = self.sites.get(site).and_then(|providers| {
            providers
                .values()
                .filter_map(|e| e.publication.as_ref()?.signature())
                .find(|s| s.chain() == signature.chain())
                .map(|s| s.chain().clone())
        });
        if let Some(chain) = shared {
            signature = signature.with_chain(chain);
        }
        let Some(publication) = self
            .sites
            .get_mut(site)
            .and_then(|p| p.get_mut(provider))
            .and_then(|e| e.publication.as_mut())
        else {
            return false;
        };
        publication.set_signature(Some(signature));
        true
    }

    /// Writes the held batch of each register asked for (a gossip pull's answer), whole,
    /// ages relative to `reference_ms`, each preceded by its signature line and, the first
    /// time its chain appears in the body, that chain's line; returns the fence of each
    /// one written. A batch outlived (older than the TTL) or not held is left out, and
    /// so is one that would take the body past [`MAX_EXPOSITION_BYTES`], which the
    /// receiver would refuse whole. An unsigned publication is written unsigned: the
    /// receiver then refuses it as `signature`.
    pub fn encode_pulled(
        &self,
        registers: &[(&str, &str)],
        now_ms: u64,
        reference_ms: u64,
        out: &mut Vec<u8>,
    ) -> Vec<Fence> {
        let shift = (i128::from(reference_ms) - i128::from(now_ms))
            .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        let start = out.len();
        let mut chains = Chains::default();
        let mut written = Vec::new();
        let mut scratch = Vec::new();
        for (site, provider) in registers {
            let Some(publication) = self
                .entry(site, provider)
                .and_then(|e| e.held_publication(now_ms))
            else {
                continue;
            };
            scratch.clear();
            let before = chains.0.len();
            if let Some(signature) = publication.signature() {
                let index = chains.index(signature.chain(), &mut scratch);
                write_signature_line(&mut scratch, index, signature);
            }
            publication.write_shifted(&mut scratch, shift);
            if out.len() - start + scratch.len() > MAX_EXPOSITION_BYTES {
                // Not written, so neither is a chain line it introduced.
                chains.0.truncate(before);
                continue;
            }
            out.extend_from_slice(&scratch);
            written.push(publication.meta().fence());
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::fixture::{T0, admit, batch, store};
    use super::super::{DropReason, IngestReport, Sender};
    use super::*;
    use crate::batch::{Batch, MAX_EPOCH_LEAD_MS, Row};
    use crate::signature::fake::{Check, Signer, chain};

    const CHECK: Check = Check { valid: 1 };

    /// A store holding `batch` as site `signer`'s certificate signed it.
    fn holding(batch: Batch, signer: &str) -> Store {
        let (site, provider) = (
            batch.meta.site().to_owned(),
            batch.meta.provider().to_owned(),
        );
        let mut s = store();
        admit(&mut s, batch, T0);
        assert!(s.sign_held(&site, &provider, &Signer(chain(signer, 0))));
        s
    }

    fn pulled_body(s: &Store, site: &str, provider: &str, now: u64, reference: u64) -> Vec<u8> {
        let mut out = Vec::new();
        assert_eq!(
            s.encode_pulled(&[(site, provider)], now, reference, &mut out)
                .len(),
            1
        );
        out
    }

    fn pull(into: &mut Store, body: &[u8], reference: u64, now: u64) -> IngestReport {
        into.ingest(
            body,
            Sender::Pulled {
                registers: &[("b", "m")],
                check: &CHECK,
            },
            reference,
            now,
        )
    }

    fn b_batch(seq: u64) -> Batch {
        batch("b", "m", Fence::new(T0, seq), &[("q", 4.0), ("r", 0.5)], T0)
    }

    #[test]
    fn a_genuine_batch_of_b_relayed_by_c_is_admitted_and_passed_on_with_its_signature() {
        let origin = holding(b_batch(1), "b");
        let mut c = store();
        let r = pull(
            &mut c,
            &pulled_body(&origin, "b", "m", T0, T0),
            T0,
            T0 + 300,
        );
        assert_eq!((r.batches_stored, r.dropped.total()), (1, 0));
        // c re-dates it for its own answer, 1.4 s later, under another whole-second Date.
        let mut a = store();
        let body = pulled_body(&c, "b", "m", T0 + 1_700, T0 + 1_000);
        let r = pull(&mut a, &body, T0 + 1_000, T0 + 2_000);
        assert_eq!((r.batches_stored, r.dropped.total()), (1, 0));
        assert_eq!(a.entry("b", "m").unwrap().fence(), Some(Fence::new(T0, 1)));
        let text = String::from_utf8(body).unwrap();
        assert!(text.starts_with("# grid_signing_chain 0 "), "{text}");
        assert_eq!(text.lines().filter(|l| l.starts_with('#')).count(), 2);
    }

    #[test]
    fn a_forged_batch_for_b_served_by_trusted_member_c_is_refused_and_counted() {
        // c holds a batch claiming to be b's and signs it with its own certificate.
        let forger = holding(b_batch(1), "c");
        let mut a = store();
        let r = pull(&mut a, &pulled_body(&forger, "b", "m", T0, T0), T0, T0);
        assert_eq!(r.dropped.get(DropReason::Signature), 3);
        assert_eq!(r.dropped.total(), 3);
        assert!(a.entry("b", "m").is_none());
    }

    #[test]
    fn an_unsigned_pulled_batch_and_an_owned_one_are_refused_as_signature() {
        let mut unsigned = store();
        admit(&mut unsigned, b_batch(1), T0);
        let mut a = store();
        let r = pull(&mut a, &pulled_body(&unsigned, "b", "m", T0, T0), T0, T0);
        assert_eq!(r.dropped.get(DropReason::Signature), 3);
        let mut report = IngestReport::default();
        a.ingest_batch(
            b_batch(1),
            Sender::Pulled {
                registers: &[("b", "m")],
                check: &CHECK,
            },
            T0,
            T0,
            &mut report,
        );
        assert_eq!(report.dropped.get(DropReason::Signature), 3);
        assert!(a.is_empty());
    }

    #[test]
    fn an_epoch_ahead_forgery_moves_no_fence_and_the_real_batches_still_pass() {
        let mut a = store();
        let genuine = holding(b_batch(5), "b");
        pull(&mut a, &pulled_body(&genuine, "b", "m", T0, T0), T0, T0);
        let ahead = batch(
            "b",
            "m",
            Fence::new(T0 + MAX_EPOCH_LEAD_MS - 1, 0),
            &[("q", 0.0)],
            T0,
        );
        let forger = holding(ahead, "c");
        let r = pull(&mut a, &pulled_body(&forger, "b", "m", T0, T0), T0, T0);
        assert_eq!(r.dropped.get(DropReason::Signature), 2);
        assert_eq!(a.entry("b", "m").unwrap().fence(), Some(Fence::new(T0, 5)));
        let next = holding(b_batch(6), "b");
        let r = pull(&mut a, &pulled_body(&next, "b", "m", T0, T0), T0, T0);
        assert_eq!((r.batches_stored, r.dropped.total()), (1, 0));
    }

    #[test]
    fn a_tampered_row_fails_its_signature() {
        let genuine = holding(b_batch(1), "b");
        let text = String::from_utf8(pulled_body(&genuine, "b", "m", T0, T0)).unwrap();
        let tampered = text.replacen("} 4 ", "} 0 ", 1);
        assert_ne!(text, tampered);
        let mut a = store();
        let r = pull(&mut a, tampered.as_bytes(), T0, T0);
        assert_eq!(r.dropped.get(DropReason::Signature), 3);
        assert!(a.entry("b", "m").is_none());
        // A moved stamp (one row re-dated alone) fails too.
        let moved = text.replacen(&format!("}} 4 {T0}"), &format!("}} 4 {}", T0 - 1), 1);
        assert_ne!(text, moved);
        let r = pull(&mut a, moved.as_bytes(), T0, T0);
        assert_eq!(r.dropped.get(DropReason::Signature), 3);
    }

    #[test]
    fn a_signature_by_the_wrong_sites_key_fails() {
        // Signed genuinely by c's key, and served as b's batch.
        let wrong = holding(b_batch(1), "c");
        let mut a = store();
        let r = pull(&mut a, &pulled_body(&wrong, "b", "m", T0, T0), T0, T0);
        assert_eq!(r.dropped.get(DropReason::Signature), 3);
        // The very same body is believed for c, whose key made it.
        let c_batch = batch("c", "m", Fence::new(T0, 1), &[("q", 4.0)], T0);
        let c = holding(c_batch, "c");
        let r = a.ingest(
            &pulled_body(&c, "c", "m", T0, T0),
            Sender::Pulled {
                registers: &[("c", "m")],
                check: &CHECK,
            },
            T0,
            T0,
        );
        assert_eq!((r.batches_stored, r.dropped.total()), (1, 0));
    }

    #[test]
    fn a_batch_signed_with_the_previous_certificate_passes_while_that_certificate_is_trusted() {
        let mut s = store();
        admit(&mut s, b_batch(1), T0);
        s.sign_held("b", "m", &Signer(chain("b", 0)));
        let body = pulled_body(&s, "b", "m", T0, T0);
        let mut a = store();
        let both = Check { valid: 2 };
        let r = a.ingest(
            &body,
            Sender::Pulled {
                registers: &[("b", "m")],
                check: &both,
            },
            T0,
            T0,
        );
        assert_eq!(r.batches_stored, 1);
    }

    #[test]
    fn a_relay_that_kept_only_part_of_a_batch_passes_it_on_unsigned_and_it_is_refused() {
        use super::super::MAX_METRICS_PER_PROVIDER;
        let named = |prefix: &str, seq| {
            let names: Vec<String> = (0..MAX_METRICS_PER_PROVIDER)
                .map(|i| format!("{prefix}{i}"))
                .collect();
            let rows: Vec<(&str, f64)> = names.iter().map(|n| (n.as_str(), 1.0)).collect();
            batch("b", "m", Fence::new(T0, seq), &rows, T0)
        };
        let mut c = store();
        pull(
            &mut c,
            &pulled_body(&holding(named("a", 1), "b"), "b", "m", T0, T0),
            T0,
            T0,
        );
        // c's windows still hold every metric the first batch named, so the second
        // one's new names are over c's cap: c keeps its metadata and none of its rows.
        let r = pull(
            &mut c,
            &pulled_body(&holding(named("x", 2), "b"), "b", "m", T0, T0),
            T0,
            T0,
        );
        assert_eq!(
            r.dropped.get(DropReason::Cap),
            MAX_METRICS_PER_PROVIDER as u64
        );
        let text = String::from_utf8(pulled_body(&c, "b", "m", T0, T0)).unwrap();
        assert!(!text.contains("grid_batch_signature"), "{text}");
        let mut a = store();
        let r = pull(&mut a, text.as_bytes(), T0, T0);
        assert_eq!(r.dropped.get(DropReason::Signature), 1);
        assert!(a.entry("b", "m").is_none());
    }

    #[test]
    fn the_gateway_reading_its_relay_as_local_ignores_signature_lines() {
        let genuine = holding(b_batch(1), "b");
        let mut gateway = store();
        let r = gateway.ingest(
            &pulled_body(&genuine, "b", "m", T0, T0),
            Sender::Local,
            T0,
            T0,
        );
        assert_eq!((r.batches_stored, r.dropped.total()), (1, 0));
    }

    #[test]
    fn a_site_chain_is_written_once_per_body_and_stray_signature_lines_are_counted() {
        let mut s = store();
        for p in ["m", "n"] {
            admit(
                &mut s,
                batch("b", p, Fence::new(T0, 1), &[("q", 1.0)], T0),
                T0,
            );
            s.sign_held("b", p, &Signer(chain("b", 0)));
        }
        let mut out = Vec::new();
        assert_eq!(
            s.encode_pulled(&[("b", "m"), ("b", "n")], T0, T0, &mut out)
                .len(),
            2
        );
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches("# grid_signing_chain").count(), 1, "{text}");
        assert_eq!(
            text.matches("# grid_batch_signature 0 ").count(),
            2,
            "{text}"
        );
        let mut a = store();
        let both = [("b", "m"), ("b", "n")];
        let sender = Sender::Pulled {
            registers: &both,
            check: &CHECK,
        };
        let r = a.ingest(text.as_bytes(), sender, T0, T0);
        assert_eq!((r.batches_stored, r.dropped.total()), (2, 0));
        // A signature line before a second one, one at the end, a chain index defined
        // twice and a malformed line: one `signature` drop each.
        let sig = text.lines().nth(1).unwrap();
        let chain_line = text.lines().next().unwrap();
        let stray = format!("{chain_line}\n{sig}\n{text}# grid_batch_signature x\n{sig}\n");
        let r = store().ingest(stray.as_bytes(), sender, T0, T0);
        assert_eq!(r.dropped.get(DropReason::Signature), 4, "{r:?}");
        assert_eq!(r.batches_stored, 2);
    }

    #[test]
    fn a_pull_answer_leaves_out_whole_batches_past_the_body_cap() {
        // Batches of 256 rows of four long label values: about 280 KiB each.
        let long = "v".repeat(crate::batch::MAX_LABEL_VALUE_BYTES);
        let rows = || -> Vec<Row> {
            (0..256)
                .map(|i| {
                    let value = format!("{i}{long}")[..long.len()].to_owned();
                    let labels = ["k1", "k2", "k3", "k4"]
                        .iter()
                        .map(|k| ((*k).to_owned(), value.clone()))
                        .collect();
                    Row::new("e", labels, 1.0, T0).unwrap()
                })
                .collect()
        };
        let mut s = store();
        let names: Vec<String> = (0..12).map(|i| format!("p{i}")).collect();
        for p in &names {
            let meta = super::super::fixture::meta("b", p, "u", Fence::new(T0, 1), 256, T0);
            admit(&mut s, Batch::new(meta, rows()), T0);
            s.sign_held("b", p, &Signer(chain("b", 0)));
        }
        let registers: Vec<(&str, &str)> = names.iter().map(|p| ("b", p.as_str())).collect();
        let mut out = Vec::new();
        let written = s.encode_pulled(&registers, T0, T0, &mut out);
        assert!(out.len() <= MAX_EXPOSITION_BYTES);
        assert!(
            written.len() < registers.len() && !written.is_empty(),
            "{}",
            written.len()
        );
        let mut a = store();
        let r = a.ingest(
            &out,
            Sender::Pulled {
                registers: &registers,
                check: &CHECK,
            },
            T0,
            T0,
        );
        assert_eq!(
            (r.batches_stored as usize, r.dropped.total()),
            (written.len(), 0)
        );
    }

    fn rows_strategy() -> impl Strategy<Value = Vec<(u8, f64, i64)>> {
        proptest::collection::vec((0u8..8, -1e6f64..1e6, -60_000i64..=0), 0..6)
    }

    proptest! {
        #[test]
        fn a_signature_survives_any_re_dating_by_the_relays(
            rows in rows_strategy(),
            shifts in proptest::collection::vec(-100_000_000_000i64..100_000_000_000, 1..4),
            receiver_offset in -100_000_000_000i64..100_000_000_000,
        ) {
            let rows: Vec<Row> = rows
                .iter()
                .enumerate()
                .map(|(i, &(label, value, age))| {
                    let labels = vec![("k".to_owned(), format!("{label}"))];
                    Row::new(format!("m{i}"), labels, value, T0.saturating_add_signed(age)).unwrap()
                })
                .collect();
            let meta = super::super::fixture::meta("b", "m", "u", Fence::new(T0, 1), rows.len() as u64, T0);
            let mut holder = holding(Batch::new(meta, rows), "b");
            // Each hop holds the batch in its own clock and writes it under its own Date.
            let mut clock = T0;
            for shift in shifts {
                let reference = T0.saturating_add_signed(shift);
                let body = pulled_body(&holder, "b", "m", clock, reference);
                let mut next = store();
                // The receiver's clock is anywhere not behind the epoch, which it
                // would refuse as `skew` whatever the signature.
                let now = reference.saturating_add_signed(receiver_offset).max(T0);
                let r = pull(&mut next, &body, reference, now);
                prop_assert_eq!((r.batches_stored, r.dropped.total()), (1, 0));
                holder = next;
                clock = now;
            }
        }
    }
}
