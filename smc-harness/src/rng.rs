//! The test programs' pseudo-random numbers: xorshift64 (Marsaglia), deterministic from a
//! seed, so that a run can be repeated with the seed it printed. Not for anything secret.

/// xorshift64 (shifts 13, 7, 17).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose state is `state` (a zero state would stay zero: bit 0 is set).
    pub fn with_state(state: u64) -> Rng {
        Rng(state | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform-ish in `0..n` (`0..1` when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform-ish in `lo..=hi` (`lo <= hi`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// A size in `1..=max`: half uniform, half log-uniform (small sizes are common too).
    pub fn size(&mut self, max: usize) -> usize {
        if self.next_u64() & 1 == 0 {
            self.below(max as u64) as usize + 1
        } else {
            let bits = 64 - (max as u64).leading_zeros() as u64;
            let b = self.below(bits) + 1;
            (self.below(1u64 << b) as usize + 1).min(max)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_of_a_state_is_xorshift64() {
        let mut r = Rng::with_state(1);
        // x ^= x << 13; x ^= x >> 7; x ^= x << 17, from 1.
        let mut x: u64 = 1;
        for _ in 0..4 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            assert_eq!(r.next_u64(), x);
        }
        assert_eq!(Rng::with_state(0).next_u64(), Rng::with_state(1).next_u64());
    }

    #[test]
    fn sizes_and_ranges_stay_in_bounds() {
        let mut r = Rng::with_state(42);
        for _ in 0..10_000 {
            let s = r.size(100);
            assert!((1..=100).contains(&s), "{s}");
            let v = r.range(5, 9);
            assert!((5..=9).contains(&v), "{v}");
            assert!(r.below(0) == 0);
        }
    }
}
