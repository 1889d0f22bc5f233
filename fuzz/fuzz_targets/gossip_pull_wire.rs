//! Arbitrary bytes as a gossip pull's query and as a member's digest.
//!
//! Asserts: no panic on any input; an accepted query names 1 to `MAX_REGISTERS_PER_PULL`
//! registers, and the query written for them reads back as the same registers; an
//! accepted digest holds at most `MAX_VERSIONS` versions and, written again, reads back
//! the same.
#![no_main]

use grid_membership::Version;
use grid_membership::overlay::MAX_VERSIONS;
use grid_membership::pull_wire::{batch_query, parse_batch_query, parse_digest, write_digest};
use grid_membership::pulls::MAX_REGISTERS_PER_PULL;
use grid_signals::batch::Fence;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    if let Ok(query) = std::str::from_utf8(input)
        && let Some(registers) = parse_batch_query(query)
    {
        assert!(!registers.is_empty() && registers.len() <= MAX_REGISTERS_PER_PULL);
        let versions: Vec<Version> = registers
            .iter()
            .map(|(site, provider)| Version {
                site: (*site).to_owned(),
                provider: (*provider).to_owned(),
                epoch: 1,
                sequence: 1,
            })
            .collect();
        let written = batch_query(&versions);
        assert_eq!(parse_batch_query(&written), Some(registers));
    }
    if let Some(versions) = parse_digest(input) {
        assert!(versions.len() <= MAX_VERSIONS);
        let written = write_digest(versions.iter().map(|v| {
            (
                v.site.as_str(),
                v.provider.as_str(),
                Fence::new(v.epoch, v.sequence),
            )
        }));
        assert_eq!(parse_digest(&written), Some(versions));
    }
});
