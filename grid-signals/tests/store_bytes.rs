//! Ingesting a body is exactly decoding it and admitting each batch: the store reads
//! batches as views into the body and recognizes a byte-identical repeat of a held
//! publication without parsing its rows, and neither shortcut may change a verdict.
//!
//! Two stores see the same deliveries (fresh publications, exact resends of earlier
//! bodies, resends with one byte changed, comments inside batches, peers, skewed dates);
//! one ingests each body, the other decodes it with `decode_batches` and admits every
//! batch with `ingest_batch`. They must agree on every report, event, entry and relay.

use std::fmt::Write as _;

use grid_signals::batch::{Batch, BatchMeta, Fence, Row};
use grid_signals::store::{
    DropCounts, IngestReport, RelayBudget, Sender, Store, StoreConfig, StoreEvent, decode_batches,
};
use proptest::prelude::*;

const T0: u64 = 1_700_000_000_000;
const SITES: [&str; 2] = ["a", "b"];
const PROVIDERS: [&str; 2] = ["m0", "m1"];

/// One delivery, and how it arrives.
#[derive(Clone, Debug)]
struct Delivery {
    op: Op,
    /// From a peer of this site instead of the local operator.
    peer: Option<usize>,
    /// The body's `Date` against the receiver's clock: mostly 0, sometimes far enough
    /// off that metadata stamps become implausible (`skew`).
    date_offset: i64,
}

/// What is delivered.
#[derive(Clone, Debug)]
enum Op {
    /// Fresh publications of some providers in one body.
    Publish {
        batches: Vec<(usize, usize, u64, u8)>,
        /// Insert a comment line after the first row of each batch.
        comment: bool,
    },
    /// An earlier body again, byte for byte.
    Resend { body: usize },
    /// An earlier body with one byte changed.
    Flip { body: usize, at: usize, byte: u8 },
    /// Time passes.
    Wait { ms: u64 },
}

fn delivery() -> impl Strategy<Value = Delivery> {
    (
        op(),
        prop_oneof![3 => Just(None), 1 => (0..SITES.len()).prop_map(Some)],
        prop_oneof![4 => Just(0i64), 1 => -5_000i64..5_000],
    )
        .prop_map(|(op, peer, date_offset)| Delivery {
            op,
            peer,
            date_offset,
        })
}

fn op() -> impl Strategy<Value = Op> {
    let batch = (0..SITES.len(), 0..PROVIDERS.len(), 0..6u64, 0..4u8);
    prop_oneof![
        4 => (prop::collection::vec(batch, 1..4), any::<bool>())
            .prop_map(|(batches, comment)| Op::Publish { batches, comment }),
        4 => any::<prop::sample::Index>().prop_map(|i| Op::Resend { body: i.index(usize::MAX) }),
        2 => (any::<prop::sample::Index>(), any::<prop::sample::Index>(), prop_oneof![
                Just(b'9'), Just(b'x'), Just(b'"'), Just(b'\n'), Just(b' '), Just(b'#'), any::<u8>()
            ])
            .prop_map(|(b, at, byte)| Op::Flip { body: b.index(usize::MAX), at: at.index(usize::MAX), byte }),
        1 => (0..40_000u64).prop_map(|ms| Op::Wait { ms }),
    ]
}

/// A provider's batch at `sequence`: `shape` picks the rows (per-endpoint rows with
/// escaped labels included) and whether the announced count is right.
fn batch(site: usize, provider: usize, sequence: u64, shape: u8, now: u64) -> Vec<u8> {
    let mut rows = vec![Row::new("q", vec![], sequence as f64, now - 10).unwrap()];
    if shape >= 1 {
        for e in 0..2 {
            rows.push(
                Row::new(
                    "e",
                    vec![("ep".to_owned(), format!("10.0.0.{e}:80 \"x\\y\""))],
                    f64::from(e),
                    now - 20,
                )
                .unwrap(),
            );
        }
    }
    let meta = BatchMeta::new(
        SITES[site],
        PROVIDERS[provider],
        "uid",
        Fence::new(T0, sequence),
        rows.len() as u64,
        1,
        now,
    )
    .unwrap();
    let mut out = Vec::new();
    Batch::new(meta, rows).write(&mut out);
    if shape == 3 {
        // Announce one row more than follows: a rejected payload.
        let text = String::from_utf8(out).unwrap();
        let n = text.matches('\n').count() - 1;
        out = text
            .replacen(
                &format!("batch_samples=\"{n}\""),
                &format!("batch_samples=\"{}\"", n + 1),
                1,
            )
            .into_bytes();
    }
    out
}

/// Everything a reader can see of a store.
fn view(store: &Store, now: u64) -> String {
    let mut out = String::new();
    for e in store.entries() {
        let _ = writeln!(
            out,
            "{}/{} fence={:?} rev={:?} learning={:?} meta={:?} newest={:?}",
            e.site(),
            e.provider(),
            e.fence(),
            e.revision(),
            e.learning(now),
            e.metadata_stamp_ms(),
            e.newest_at()
        );
        for metric in e.metric_names() {
            for s in e.series(metric) {
                let readings: Vec<_> = s.readings().collect();
                let _ = writeln!(out, "  {metric} {:?} {readings:?}", s.labels());
            }
        }
    }
    let mut relay = Vec::new();
    store.encode_relay(now, now, RelayBudget::default(), &mut relay);
    out.push_str(&String::from_utf8_lossy(&relay));
    out
}

fn events(store: &mut Store) -> Vec<StoreEvent> {
    std::iter::from_fn(|| store.poll_event()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    #[test]
    fn ingesting_a_body_equals_decoding_it_and_admitting_each_batch(
        deliveries in prop::collection::vec(delivery(), 1..40),
    ) {
        let mut bodies: Vec<Vec<u8>> = Vec::new();
        let mut fast = Store::new(StoreConfig::default());
        let mut reference = Store::new(StoreConfig::default());
        let mut now = T0 + 1_000;
        for Delivery { op, peer, date_offset } in &deliveries {
            let sender = match peer {
                Some(site) => Sender::Peer { site: SITES[*site] },
                None => Sender::Local,
            };
            let body = match op {
                Op::Publish { batches, comment } => {
                    let mut body = Vec::new();
                    for &(site, provider, sequence, shape) in batches {
                        let mut one = batch(site, provider, sequence, shape, now);
                        if *comment {
                            let first_row_end = one.iter().enumerate().filter(|(_, b)| **b == b'\n').nth(1).map(|(i, _)| i + 1);
                            if let Some(at) = first_row_end {
                                one.splice(at..at, b"# a comment\n".iter().copied());
                            }
                        }
                        body.extend_from_slice(&one);
                    }
                    body
                }
                Op::Resend { body } if !bodies.is_empty() => bodies[body % bodies.len()].clone(),
                Op::Flip { body, at, byte } if !bodies.is_empty() => {
                    let mut b = bodies[body % bodies.len()].clone();
                    if !b.is_empty() {
                        let at = at % b.len();
                        b[at] = *byte;
                    }
                    b
                }
                Op::Wait { ms } => {
                    now += ms;
                    continue;
                }
                Op::Resend { .. } | Op::Flip { .. } => continue,
            };
            bodies.push(body.clone());
            let reference_ms = now.saturating_add_signed(*date_offset);

            let got = fast.ingest(&body, sender, reference_ms, now);

            reference.expire(now);
            let mut want = IngestReport::default();
            let mut drops = DropCounts::default();
            let mut decoded = Vec::new();
            decode_batches(&body, &mut drops, |b| decoded.push(b));
            for b in decoded {
                reference.ingest_batch(b, sender, reference_ms, now, &mut want);
            }
            want.dropped.merge(&drops);

            prop_assert_eq!(got, want, "body {:?}", String::from_utf8_lossy(&body));
            prop_assert_eq!(events(&mut fast), events(&mut reference));
            prop_assert_eq!(view(&fast, now), view(&reference, now));
        }
    }
}

#[test]
fn a_resent_body_is_a_repeat_for_every_batch_and_changes_nothing() {
    let now = T0 + 1_000;
    let mut body = Vec::new();
    for (site, provider) in [(0, 0), (0, 1), (1, 0)] {
        body.extend_from_slice(&batch(site, provider, 1, 1, now));
    }
    let mut store = Store::new(StoreConfig::default());
    let first = store.ingest(&body, Sender::Local, now, now);
    assert_eq!((first.batches_stored, first.rows_stored), (3, 9));
    events(&mut store);
    let before = view(&store, now + 500);
    let again = store.ingest(&body, Sender::Local, now, now + 500);
    assert_eq!(
        again,
        IngestReport {
            batches_repeated: 3,
            ..IngestReport::default()
        }
    );
    assert_eq!(view(&store, now + 500), before);
    assert!(events(&mut store).is_empty());
    // From a peer of site "a", the batches of "b" are still refused, whole.
    let peer = store.ingest(&body, Sender::Peer { site: "a" }, now, now + 600);
    assert_eq!(peer.batches_repeated, 2);
    assert_eq!(peer.dropped.total(), 4);
}
