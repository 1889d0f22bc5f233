//! A fast hasher for the scorer's maps.
//!
//! The keys are short site, provider and model names from the serving config and from
//! authenticated operators, capped at [`crate::MAX_CANDIDATES`]; `SipHash`'s flooding
//! resistance buys nothing there and costs most of a refresh over 10,000 candidates and a
//! noticeable share of a pick's model lookup. Eight bytes per step (a rotate, an xor and a
//! multiply, as rustc's own `FxHasher`): a 32-byte model name such as
//! `meta-llama/Llama-3.1-8B-Instruct` takes four steps where byte-wise FNV-1a took 33.

use std::hash::{BuildHasherDefault, Hasher};

/// The multiplier of rustc's `FxHasher` (64-bit): odd, with well-spread bits.
const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// Word-at-a-time multiplicative hash.
#[derive(Clone, Copy, Debug, Default)]
pub struct WordHash(u64);

impl WordHash {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for WordHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            // Fixed-size reads, overlapping where the tail is short, so no variable-length
            // copy (a call to memcpy cost more than the whole hash); the length in the top
            // byte keeps "a" and "a\0" apart.
            let n = rest.len();
            let word = if n >= 4 {
                u64::from(read_u32(&rest[..4])) | (u64::from(read_u32(&rest[n - 4..])) << 24)
            } else {
                u64::from(rest[0]) | (u64::from(rest[n / 2]) << 8) | (u64::from(rest[n - 1]) << 16)
            };
            self.add(word ^ ((n as u64) << 56));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
}

fn read_u32(four: &[u8]) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(four);
    u32::from_le_bytes(word)
}

/// Builds [`WordHash`] hashers for `HashMap`: for maps keyed by configured names (models,
/// sites), looked up on the request path, where `SipHash` cost more than the lookup.
pub type FastBuild = BuildHasherDefault<WordHash>;

/// A `HashMap` hashed with [`WordHash`].
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, FastBuild>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::Hash;

    fn hash(v: impl Hash) -> u64 {
        let mut h = WordHash::default();
        v.hash(&mut h);
        h.finish()
    }

    #[test]
    fn names_that_differ_in_length_or_one_byte_hash_apart() {
        let names = [
            "",
            "a",
            "a\0",
            "ab",
            "ba",
            "model",
            "model2",
            "llama-8b",
            "llama-8c",
            "meta-llama/Llama-3.1-8B-Instruct",
            "meta-llama/Llama-3.1-8B-Instrucu",
        ];
        let hashes: std::collections::HashSet<u64> = names.iter().map(hash).collect();
        assert_eq!(hashes.len(), names.len());
    }

    #[test]
    fn a_map_keyed_by_arc_str_is_found_by_str() {
        let mut m: FastMap<std::sync::Arc<str>, u32> = FastMap::default();
        m.insert("meta-llama/Llama-3.1-8B-Instruct".into(), 7);
        assert_eq!(m.get("meta-llama/Llama-3.1-8B-Instruct"), Some(&7));
        assert_eq!(m.get("meta-llama/Llama-3.1-8B-Instruc"), None);
    }
}
