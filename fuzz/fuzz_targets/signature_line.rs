#![no_main]
//! The batch signature and signing-chain comment lines on arbitrary text. Asserts: no
//! panic; a line read is within its bound, decodes, and is written back byte for byte
//! (one spelling per line); and a body of such lines ingested from a pull (every chain
//! trusted, every signature accepted) counts no line twice.

use grid_signals::signature::{
    BatchSignature, MAX_CHAIN_LINE_BYTES, MAX_SIGNATURE_LINE_BYTES, SignatureCheck, SignatureLine,
    SigningChain, parse_signature_line, write_chain_line, write_signature_line,
};
use grid_signals::store::{Sender, Store, StoreConfig};
use libfuzzer_sys::fuzz_target;

const NOW: u64 = 1_700_000_000_000;

/// Believes everything: what is fuzzed is the framing, not the cryptography.
#[derive(Debug)]
struct Credulous;

impl SignatureCheck for Credulous {
    fn vouches(&self, _: &str, _: &SigningChain, _: u64) -> bool {
        true
    }
    fn verifies(&self, _: &SigningChain, _: u16, _: &[u8], _: &[u8]) -> bool {
        true
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let mut out = Vec::new();
        match parse_signature_line(text) {
            Some(Ok(SignatureLine::Chain { index, certs })) => {
                let chain = SignatureLine::decode_chain(certs).expect("a chain read decodes");
                write_chain_line(&mut out, index, &chain);
                assert!(out.len() <= MAX_CHAIN_LINE_BYTES);
            }
            Some(Ok(SignatureLine::Signature {
                chain,
                scheme,
                signature,
            })) => {
                let bytes = SignatureLine::decode_signature(signature).expect("decodes");
                let leaf = SigningChain::new(vec![vec![0]]).expect("a chain");
                let sig = BatchSignature::new(scheme, bytes, leaf).expect("within its bound");
                write_signature_line(&mut out, chain, &sig);
                assert!(out.len() <= MAX_SIGNATURE_LINE_BYTES);
            }
            Some(Err(_)) | None => {}
        }
        if !out.is_empty() {
            assert_eq!(out, format!("# {text}\n").into_bytes());
        }
    }

    let mut store = Store::new(StoreConfig::default());
    let registers = [("b", "m"), ("c", "m")];
    let report = store.ingest(
        data,
        Sender::Pulled {
            registers: &registers,
            check: &Credulous,
        },
        NOW,
        NOW,
    );
    let lines = data.split(|&b| b == b'\n').count() as u64;
    let counted = report.dropped.total() + report.rows_stored + report.batches_stored;
    assert!(
        counted <= lines + 1,
        "{counted} counted in {lines} lines: {report:?}"
    );
});
