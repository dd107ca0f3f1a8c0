//! Shingles and winnowing.
//!
//! A *shingle* is k consecutive tokens of one class; its hash is an
//! order-sensitive combination of the k keyed token hashes, then a keyed
//! SipHash of that, its class and its length. The combination is a
//! polynomial `Σ t_i·B^(k-1-i) mod 2^64` with an odd, key-derived `B`, so it
//! rolls in O(1) per position and swapping two tokens changes it.
//!
//! *Winnowing* (Schleimer, Wilkerson, Aiken, SIGMOD 2003) keeps, of every
//! window of w consecutive shingles, the one with the smallest hash. Since
//! every window keeps at least one, any run of w + k − 1 tokens that two texts
//! share — which contains w whole shingles, one full window — has a kept
//! shingle on the store side, and the query side, which keeps every shingle,
//! has the same hash. The *robust* variant breaks ties by keeping the
//! previous choice when it is still in the window (else the rightmost
//! minimum), so a run of equal hashes ("ha ha ha ha …") keeps one shingle
//! per w, not one per position.

use super::{Shingle, Token, TokenClass};

/// Keys for turning rolling sums into shingle hashes.
///
/// The secret lives in the token hashes (SipHash under the key); a shingle's
/// sum of them is already unpredictable without the key. The finaliser only
/// has to (a) separate classes and lengths, so a 3-token short run never
/// equals a full shingle nor a word shingle a CJK one — an odd-key multiple
/// of a distinct odd number per (class, len), distinct because multiplying
/// by an odd number is a bijection mod 2^64 — and (b) spread the bits, since
/// winnowing picks minima and a biased hash would bias the choice: MurmurHash3's
/// `fmix64`, a bijection with full avalanche. A second SipHash per shingle
/// would cost about as much as hashing the token again, for nothing the key
/// does not already give.
#[derive(Clone, Copy)]
pub(crate) struct ShingleHasher {
    pub(crate) base: u64,
    pub(crate) k0: u64,
    /// Odd.
    pub(crate) k1: u64,
}

impl ShingleHasher {
    #[inline]
    fn finish(&self, sum: u64, class: TokenClass, len: usize) -> u64 {
        let tag = ((class as u64) << 16) | (len as u64 & 0xFFFF);
        let salt = self.k1.wrapping_mul(tag.wrapping_mul(2).wrapping_add(1));
        fmix64(sum.wrapping_add(salt) ^ self.k0)
    }
}

/// MurmurHash3's 64-bit finaliser.
#[inline]
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// Shortest class run that still yields a (single, short) shingle when the
/// run is shorter than k: half of k, at least 2. See
/// [`Fingerprinter::shingles`](super::Fingerprinter::shingles).
pub(crate) fn min_short_run(k: usize) -> usize {
    k.div_ceil(2).max(2)
}

fn first_u32(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

/// Shingles one class run `tokens[first..first+run.len()]`.
pub(crate) fn shingle_run(
    sh: &ShingleHasher,
    run: &[Token],
    first: usize,
    class: TokenClass,
    k: usize,
    out: &mut Vec<Shingle>,
) {
    let n = run.len();
    if n < k {
        if n >= min_short_run(k) {
            let mut sum = 0u64;
            for t in run {
                sum = sum.wrapping_mul(sh.base).wrapping_add(t.hash);
            }
            out.push(Shingle {
                hash: sh.finish(sum, class, n),
                first: first_u32(first),
                len: n as u8,
                class,
            });
        }
        return;
    }
    // B^(k-1): the weight of the token leaving the window.
    let mut top = 1u64;
    for _ in 1..k {
        top = top.wrapping_mul(sh.base);
    }
    let mut sum = 0u64;
    for t in &run[..k] {
        sum = sum.wrapping_mul(sh.base).wrapping_add(t.hash);
    }
    out.reserve(n - k + 1);
    let len = k.min(u8::MAX as usize) as u8;
    out.push(Shingle {
        hash: sh.finish(sum, class, k),
        first: first_u32(first),
        len,
        class,
    });
    for i in k..n {
        sum = sum
            .wrapping_sub(run[i - k].hash.wrapping_mul(top))
            .wrapping_mul(sh.base)
            .wrapping_add(run[i].hash);
        out.push(Shingle {
            hash: sh.finish(sum, class, k),
            first: first_u32(first + i + 1 - k),
            len,
            class,
        });
    }
}

/// Robust winnowing of one hash sequence with window `w`, calling `keep(i)`
/// for every selected index, each once, in increasing order.
///
/// The paper's algorithm over a ring of the last w hashes: a new hash becomes
/// the selection only if *strictly* smaller than the current minimum (ties
/// keep the old one: the robust rule); when the minimum leaves the window the
/// window is rescanned right to left for the rightmost minimum. Worst case
/// O(n·w) (strictly increasing hashes), with w ≤ 256.
///
/// A sequence shorter than w is one (partial) window: its minimum is kept,
/// so every non-empty text stores at least one fingerprint per class.
pub(crate) fn winnow_indices(
    hashes: impl Iterator<Item = (usize, u64)>,
    w: usize,
    mut keep: impl FnMut(usize),
) {
    let w = w.max(1);
    // Ring of (index, hash) of the last w entries.
    let mut ring: Vec<(usize, u64)> = Vec::with_capacity(w);
    let mut head = 0usize; // next slot to overwrite once full
    let mut min: Option<(usize, u64)> = None; // current selection (ring slot's content)
    let mut recorded: Option<usize> = None; // index last passed to keep()
    let mut seen = 0usize;
    for (idx, h) in hashes {
        seen += 1;
        if ring.len() < w {
            ring.push((idx, h));
        } else {
            ring[head] = (idx, h);
            head = (head + 1) % w;
        }
        let oldest = if ring.len() < w {
            ring[0].0
        } else {
            ring[head].0
        };
        match min {
            Some((mi, _)) if mi < oldest => {
                // The minimum left the window: rightmost minimum of the window.
                let mut best: Option<(usize, u64)> = None;
                for &(i, v) in &ring {
                    match best {
                        Some((bi, bv)) if v > bv || (v == bv && i < bi) => {}
                        _ => best = Some((i, v)),
                    }
                }
                min = best;
            }
            Some((_, mv)) if h >= mv => {}
            _ => min = Some((idx, h)),
        }
        if seen >= w {
            if let Some((mi, _)) = min {
                if recorded != Some(mi) {
                    keep(mi);
                    recorded = Some(mi);
                }
            }
        }
    }
    if seen > 0 && seen < w {
        if let Some((mi, _)) = min {
            keep(mi);
        }
    }
}

/// Winnows a mixed-class shingle list, each class with its own window, and
/// appends the kept shingles to `out` in their original order.
pub(crate) fn winnow(shingles: &[Shingle], w_word: usize, w_cjk: usize, out: &mut Vec<Shingle>) {
    let mut kept = vec![false; shingles.len()];
    for (class, w) in [(TokenClass::Word, w_word), (TokenClass::Cjk, w_cjk)] {
        let seq = shingles
            .iter()
            .enumerate()
            .filter(|(_, s)| s.class == class)
            .map(|(i, s)| (i, s.hash));
        winnow_indices(seq, w, |i| {
            if let Some(k) = kept.get_mut(i) {
                *k = true;
            }
        });
    }
    out.extend(
        shingles
            .iter()
            .zip(&kept)
            .filter(|(_, &k)| k)
            .map(|(s, _)| *s),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(hashes: &[u64], w: usize) -> Vec<usize> {
        let mut v = Vec::new();
        winnow_indices(hashes.iter().copied().enumerate(), w, |i| v.push(i));
        v
    }

    /// Brute force: every window of w has a selected minimal element.
    fn check(hashes: &[u64], w: usize) {
        let s = sel(hashes, w);
        assert!(s.windows(2).all(|p| p[0] < p[1]), "increasing, unique");
        if hashes.len() >= w {
            for start in 0..=hashes.len() - w {
                let win = &hashes[start..start + w];
                let m = *win.iter().min().unwrap();
                assert!(
                    s.iter()
                        .any(|&i| i >= start && i < start + w && hashes[i] == m),
                    "window {start} of {hashes:?} w={w} sel={s:?}"
                );
            }
        } else if !hashes.is_empty() {
            assert_eq!(s.len(), 1);
        }
    }

    #[test]
    fn paper_example_and_windows() {
        // The example from the paper (w = 4).
        let h = [
            77, 74, 42, 17, 98, 50, 17, 98, 8, 88, 67, 39, 77, 74, 42, 17, 98,
        ];
        assert_eq!(
            sel(&h, 4).iter().map(|&i| h[i]).collect::<Vec<_>>(),
            vec![17, 17, 8, 39, 17]
        );
        check(&h, 4);
        for w in 1..8 {
            check(&h, w);
        }
    }

    #[test]
    fn robust_ties_keep_one_per_window() {
        let h = [5u64; 40];
        let s = sel(&h, 4);
        check(&h, 4);
        // One per w positions, not one per position.
        assert!(s.len() <= 40 / 4 + 1, "{s:?}");
    }

    #[test]
    fn random_sequences_keep_a_minimum_in_every_window() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for _ in 0..500 {
            let n = rng.gen_range(0..60);
            let w = rng.gen_range(1..12);
            let h: Vec<u64> = (0..n).map(|_| rng.gen_range(0..8)).collect();
            check(&h, w);
        }
    }
}
