//! A small Bloom filter over 64-bit keyed hashes (already uniformly
//! distributed, so double hashing from their two halves is enough).

/// Bits per element: 8 bits and 5 probes give ≈2 % false positives. A run
/// is only extended through consecutive hits, so a spurious extension of
/// more than two shingles is rarer than 1 in 2,500.
const BITS_PER_ITEM: usize = 8;
const PROBES: u32 = 5;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bloom {
    bits: Box<[u64]>,
}

impl Bloom {
    pub fn new(items: &[u64]) -> Self {
        // A power of two, so that a probe is a mask rather than a division.
        let words = (items.len() * BITS_PER_ITEM)
            .div_ceil(64)
            .max(1)
            .next_power_of_two();
        let mut bits = vec![0u64; words].into_boxed_slice();
        let n = (words * 64) as u64;
        for &h in items {
            for i in probes(h, n) {
                bits[(i / 64) as usize] |= 1 << (i % 64);
            }
        }
        Bloom { bits }
    }

    pub fn contains(&self, h: u64) -> bool {
        let n = (self.bits.len() * 64) as u64;
        probes(h, n).all(|i| self.bits[(i / 64) as usize] & (1 << (i % 64)) != 0)
    }

    pub fn bytes(&self) -> usize {
        self.bits.len() * 8
    }
}

fn probes(h: u64, n: u64) -> impl Iterator<Item = u64> {
    let h1 = h & 0xffff_ffff;
    let h2 = (h >> 32) | 1;
    let mask = n - 1;
    (0..PROBES as u64).map(move |i| h1.wrapping_add(i.wrapping_mul(h2)) & mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(x: u64) -> u64 {
        let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    #[test]
    fn no_false_negatives_and_few_false_positives() {
        let items: Vec<u64> = (0..1_000).map(mix).collect();
        let b = Bloom::new(&items);
        assert!(items.iter().all(|h| b.contains(*h)));
        let fp = (1_000_000..1_100_000)
            .map(mix)
            .filter(|h| b.contains(*h))
            .count();
        assert!(fp < 4_000, "false positive rate {} / 100000", fp);
        assert_eq!(b.bytes(), 1_024);
    }

    #[test]
    fn empty_filter_is_valid() {
        let b = Bloom::new(&[]);
        assert!(!b.contains(12345));
    }
}
