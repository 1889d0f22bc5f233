#![no_main]
//! Store ingest on arbitrary bytes. Asserts: no panic; no line is counted twice (drops,
//! stored rows and stored metadata lines together never exceed the body's lines); the
//! same body ingested again stores nothing new; and what the store holds relays as whole
//! batches that a fresh store ingests without a single drop.

use grid_signals::store::{RelayBudget, Sender, Store, StoreConfig};
use libfuzzer_sys::fuzz_target;

const NOW: u64 = 1_700_000_000_000;

fuzz_target!(|data: &[u8]| {
    let mut store = Store::new(StoreConfig::default());
    let report = store.ingest(data, Sender::Local, NOW, NOW);
    let lines = data.split(|&b| b == b'\n').count() as u64;
    let counted = report.dropped.total() + report.rows_stored + report.batches_stored;
    assert!(
        counted <= lines + 1,
        "{counted} counted in {lines} lines: {report:?}"
    );

    let again = store.ingest(data, Sender::Local, NOW, NOW);
    assert_eq!(again.batches_stored, 0, "{again:?}");

    let mut relay = Vec::new();
    let written = store.encode_relay(NOW, NOW, RelayBudget::default(), &mut relay);
    let mut gateway = Store::new(StoreConfig::default());
    let received = gateway.ingest(&relay, Sender::Local, NOW, NOW);
    assert_eq!(received.dropped.total(), 0, "{received:?}");
    assert_eq!(received.batches_stored, written.providers_written);
});
