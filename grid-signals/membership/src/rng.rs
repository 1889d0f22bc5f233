//! Randomness as an input: the caller's generator, adapted to the trait foca draws from.

use core::convert::Infallible;

/// A source of uniformly distributed 64-bit words; the operator passes a seeded fast
/// generator, tests and the simulation a fixed seed, so a run replays exactly.
pub trait Rng {
    /// The next uniformly distributed 64-bit word.
    fn next_u64(&mut self) -> u64;
}

/// `SplitMix64`: one word of state, no bad seeds; for tests and the simulation. Not
/// cryptographic: nothing secret is drawn from it (session keys come from TLS).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose sequence is fixed by `seed`.
    pub const fn new(seed: u64) -> Self {
        Self(seed)
    }
}

impl Rng for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Hands an [`Rng`] to foca, which wants rand 0.10's core trait.
#[derive(Debug)]
pub(crate) struct FocaRng<R>(pub(crate) R);

impl<R: Rng> rand_core::TryRng for FocaRng<R> {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok((self.0.next_u64() >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.0.next_u64())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            let word = self.0.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        Ok(())
    }
}
