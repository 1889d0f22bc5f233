//! A fast hasher for the scorer's maps.
//!
//! The keys are short site, provider and model names from the serving config and from
//! authenticated operators, capped at [`crate::MAX_CANDIDATES`]; `SipHash`'s flooding
//! resistance buys nothing there and costs most of a refresh over 10,000 candidates and a
//! noticeable share of a pick's model lookup. FNV-1a is a few instructions per byte.

use std::hash::{BuildHasherDefault, Hasher};

/// FNV-1a, 64-bit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Builds [`Fnv`] hashers for `HashMap`.
pub(crate) type FnvBuild = BuildHasherDefault<Fnv>;

/// A `HashMap` hashed with [`Fnv`].
pub(crate) type FnvMap<K, V> = std::collections::HashMap<K, V, FnvBuild>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_published_fnv1a_test_vector() {
        let mut h = Fnv::default();
        h.write(b"a");
        assert_eq!(h.finish(), 0xaf63_dc4c_8601_ec8c);
    }
}
