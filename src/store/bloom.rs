//! A small Bloom filter over 64-bit keyed hashes (already uniformly
//! distributed, so double hashing from the key and its rotation is enough).

/// Bits per element: 8 bits and 5 probes give ≈2 % false positives. A run
/// is only extended through consecutive hits, so a spurious extension of
/// more than two shingles is rarer than 1 in 2,500; and it ends only on a
/// shingle the filter also holds alone, so that a spurious last shingle
/// takes two false positives at once (≈0.04 %).
const BITS_PER_ITEM: usize = 8;
const PROBES: u32 = 5;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bloom {
    bits: Box<[u64]>,
}

impl Bloom {
    pub fn new(items: &[u64]) -> Self {
        // Exactly BITS_PER_ITEM a item, rounded up to a word: a probe maps a
        // 64-bit value onto the bits with a multiply and a shift (Lemire's
        // fast range), so the size need not be a power of two and no
        // filter carries up to twice the bits it needs.
        let words = (items.len() * BITS_PER_ITEM).div_ceil(64).max(1);
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

/// Double hashing over the whole 64-bit key, each probe mapped onto
/// `0..n` by the high half of a 128-bit product.
fn probes(h: u64, n: u64) -> impl Iterator<Item = u64> {
    let h2 = h.rotate_left(32) | 1;
    (0..PROBES as u64).map(move |i| {
        let x = h.wrapping_add(i.wrapping_mul(h2));
        ((u128::from(x) * u128::from(n)) >> 64) as u64
    })
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
        // 8 bits an item, rounded up to a word: no power-of-two padding.
        assert_eq!(b.bytes(), 1_000);
        let b = Bloom::new(&items[..999]);
        assert_eq!(b.bytes(), 1_000);
    }

    #[test]
    fn empty_filter_is_valid() {
        let b = Bloom::new(&[]);
        assert!(!b.contains(12345));
    }
}
