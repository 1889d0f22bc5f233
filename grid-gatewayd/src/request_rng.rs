//! Random draws for the request path, without a lock or a syscall per request.
//!
//! Each thread keeps its own generator state, seeded once from the standard library's
//! per-process random hash keys (the OS entropy source `RandomState` already reads).

use std::cell::Cell;
use std::hash::{BuildHasher as _, Hasher as _};

thread_local! {
    static STATE: Cell<u64> = Cell::new({
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x6772_6964); // "grid"
        h.finish()
    });
}

/// A uniformly distributed 64-bit word (SplitMix64 step on this thread's state).
pub fn next_u64() -> u64 {
    STATE.with(|s| {
        let x = s.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        s.set(x);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn successive_draws_differ() {
        let a = super::next_u64();
        let b = super::next_u64();
        assert_ne!(a, b);
    }
}
