//! The simulated world's one source of randomness: a small seeded generator, so a
//! simulated site, a load generator and the routing simulator replay exactly from a seed.
//!
//! xoshiro256** seeded through splitmix64 (the published reference algorithms): fast,
//! good enough for queueing draws, and free of any dependency whose stream could change
//! between versions and silently change the simulator's figures.

/// A deterministic pseudo-random generator.
#[derive(Clone, Debug)]
pub struct SimRng {
    state: [u64; 4],
}

/// One splitmix64 step: spreads a seed so that nearby seeds give unrelated streams.
fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl SimRng {
    /// A generator whose whole stream is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let state = [
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
        ];
        Self { state }
    }

    /// An independent generator derived from this one's seed and a stream number, so
    /// adding a consumer of randomness does not shift every other consumer's draws.
    pub fn fork(seed: u64, stream: u64) -> Self {
        let mut x = seed ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03);
        Self::new(splitmix64(&mut x))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let [s0, s1, s2, s3] = &mut self.state;
        let result = s1.wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = *s1 << 17;
        *s2 ^= *s0;
        *s3 ^= *s1;
        *s1 ^= *s2;
        *s0 ^= *s3;
        *s2 ^= t;
        *s3 = s3.rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)`, with 53 bits of precision.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `(0, 1]`: safe to take the logarithm of.
    fn unit_open_low(&mut self) -> f64 {
        1.0 - self.unit()
    }

    /// Uniform integer in `0..n` (`n` > 0); the modulo bias is below 2^-40 for the small
    /// `n` the simulator uses.
    ///
    /// # Panics
    ///
    /// When `n` is 0: there is no integer to draw.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        self.next_u64() % n
    }

    /// Exponentially distributed with the given mean: Poisson inter-arrival gaps.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * self.unit_open_low().ln()
    }

    /// A standard normal draw (Box-Muller; the second value is dropped to keep the stream
    /// stateless between calls).
    pub fn standard_normal(&mut self) -> f64 {
        let r = (-2.0 * self.unit_open_low().ln()).sqrt();
        let theta = std::f64::consts::TAU * self.unit();
        r * theta.cos()
    }

    /// Log-normally distributed with the given median and log-space standard deviation
    /// `sigma`: the usual shape of LLM request durations (most short, a long right tail).
    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.standard_normal()).exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_replays_the_same_stream() {
        let mut a = SimRng::new(42);
        let mut b = SimRng::new(42);
        let mut c = SimRng::new(43);
        let xs: Vec<u64> = (0..16).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..16).map(|_| b.next_u64()).collect();
        let zs: Vec<u64> = (0..16).map(|_| c.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
    }

    #[test]
    fn forked_streams_differ_from_each_other() {
        let a: Vec<u64> = {
            let mut r = SimRng::fork(7, 0);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = SimRng::fork(7, 1);
            (0..8).map(|_| r.next_u64()).collect()
        };
        assert_ne!(a, b);
    }

    #[test]
    fn unit_draws_stay_in_range_and_average_one_half() {
        let mut r = SimRng::new(1);
        let n = 100_000;
        let mut sum = 0.0;
        for _ in 0..n {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
            sum += u;
        }
        let mean = sum / f64::from(n);
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    }

    #[test]
    fn exponential_draws_have_the_asked_mean() {
        let mut r = SimRng::new(2);
        let n = 100_000;
        let mean = (0..n).map(|_| r.exponential(250.0)).sum::<f64>() / f64::from(n);
        assert!((mean - 250.0).abs() < 5.0, "mean {mean}");
    }

    #[test]
    fn lognormal_draws_have_the_asked_median() {
        let mut r = SimRng::new(3);
        let mut xs: Vec<f64> = (0..20_001).map(|_| r.lognormal(1_000.0, 0.6)).collect();
        xs.sort_by(f64::total_cmp);
        let median = xs[xs.len() / 2];
        assert!((median - 1_000.0).abs() < 30.0, "median {median}");
        assert!(xs.iter().all(|x| *x > 0.0));
    }

    #[test]
    fn below_never_reaches_its_bound() {
        let mut r = SimRng::new(4);
        let mut seen = [false; 3];
        for _ in 0..1_000 {
            let x = r.below(3);
            seen[x as usize] = true;
        }
        assert_eq!(seen, [true; 3]);
    }
}
