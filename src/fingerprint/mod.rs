//! Keyed text fingerprints: find text that two tenants' exchanges share
//! without keeping either text.
//!
//! The pipeline is `text → tokens → shingles → winnow`:
//!
//! 1. **Tokens** ([`Fingerprinter::tokens`]): UAX#29 words for space-delimited
//!    scripts, one token per character for scripts written without spaces
//!    (Han, kana, Hangul, Thai, Lao, Khmer, Myanmar, …; see
//!    [`TokenClass::Cjk`]). Whitespace and punctuation only separate tokens.
//!    Each token is normalised (NFKC + full case folding) and hashed with
//!    SipHash-1-3 under a key derived from residue's hash key; its byte span
//!    in the original text is kept so findings can point at the response.
//! 2. **Shingles** ([`Fingerprinter::shingles`]): every k consecutive tokens
//!    of one class, hashed in order. The query side (a response being
//!    scanned) uses all of them.
//! 3. **Winnowing** ([`Fingerprinter::winnow`]): the store side keeps only
//!    the minimum of every window of w shingles — about 2/(w+1) of them —
//!    and still finds every shared run of at least w + k − 1 tokens.
//!
//! Nothing here keeps text: only 64-bit keyed hashes and offsets leave this
//! module. [`StreamTokenizer`] produces the same tokens from a stream of
//! deltas, emitting each token as soon as it is certainly complete.

mod normalize;
mod tokenize;
mod winnow;

#[cfg(test)]
mod tests;

pub(crate) use tokenize::is_cjk_class;
pub use tokenize::StreamTokenizer;

use normalize::TokenHasher;
use winnow::ShingleHasher;

// === params ===

/// Shingle length k and winnowing window w, separately for word tokens and
/// per-character (CJK-class) tokens. A run of `w + k − 1` shared tokens is
/// always found; the store keeps about `2/(w+1)` of all shingles.
///
/// `new` clamps k to 1..=64 and w to 1..=256 (see [`Fingerprinter::new`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FingerprintParams {
    /// Words per shingle.
    pub word_k: usize,
    /// Winnowing window for word shingles.
    pub word_w: usize,
    /// Characters per CJK-class shingle.
    pub cjk_k: usize,
    /// Winnowing window for CJK-class shingles.
    pub cjk_w: usize,
}

impl Default for FingerprintParams {
    /// Defaults chosen by measurement: words k = 4, w = 9; CJK k = 6, w = 15.
    ///
    /// Constraints: the n-gram detector flags at ≈ 12 shared words or ≈ 20
    /// shared CJK characters, so a shared run of that length must always be
    /// found: `w + k − 1 ≤ 12` (words), `≤ 20` (CJK). The store may spend at
    /// most 1 KB per KB of recorded text at ≈ 24 B per fingerprint (a u64
    /// hash plus posting and index overhead), i.e. ≤ ≈ 42 fingerprints per
    /// KB. Within
    /// those, a larger k is better: a k-gram that unrelated texts share by
    /// chance ("one of the", "可以通过") is noise the detector must discount.
    ///
    /// Measured on `src/fingerprint/testdata/` (7.5 KB English, 6.8 KB
    /// Chinese: eight unrelated documents each, prose in the style of LLM
    /// answers written for this purpose), averaged over 8 keys (which shingle
    /// wins a window depends on the key). fp/KB = stored fingerprints per KB
    /// of text; B/KB = × 24 B; shared/KB = shingles per KB that also occur in
    /// another document of the sample (chance matches, before winnowing);
    /// hits/KB = those that hit another document's store.
    ///
    /// | class | k | w | w+k−1 | fp/KB | B/KB | shared/KB | hits/KB |
    /// |-------|---|---|-------|-------|------|-----------|---------|
    /// | word  | 2 | 11 | 12 | 28.3 | 678  | 17.68 | 3.12 |
    /// | word  | 3 | 10 | 12 | 32.0 | 769  | 0.82  | 0.07 |
    /// | word  | **4** | **9** | 12 | **35.6** | **855** | 0.00 | 0.00 |
    /// | word  | 5 | 8  | 12 | 39.2 | 942  | 0.00  | 0.00 |
    /// | word  | 6 | 7  | 12 | 44.2 | 1060 | 0.00  | 0.00 |
    /// | word  | 7 | 6  | 12 | 50.0 | 1200 | 0.00  | 0.00 |
    /// | word  | 8 | 5  | 12 | 57.9 | 1389 | 0.00  | 0.00 |
    /// | cjk   | 2 | 19 | 20 | 27.9 | 669  | 38.22 | 4.43 |
    /// | cjk   | 3 | 18 | 20 | 31.3 | 750  | 5.48  | 0.78 |
    /// | cjk   | 4 | 17 | 20 | 33.4 | 801  | 1.52  | 0.13 |
    /// | cjk   | 5 | 16 | 20 | 35.3 | 846  | 0.00  | 0.00 |
    /// | cjk   | **6** | **15** | 20 | **37.8** | **906** | 0.00 | 0.00 |
    /// | cjk   | 7 | 14 | 20 | 39.6 | 951  | 0.00  | 0.00 |
    /// | cjk   | 8 | 13 | 20 | 42.4 | 1019 | 0.00  | 0.00 |
    /// | cjk   | 10 | 11 | 20 | 48.2 | 1158 | 0.00 | 0.00 |
    ///
    /// Chance matches vanish at k = 4 (words) and k = 5 (characters) on this
    /// sample; above that, every step of k costs density. Words: k = 5 fits
    /// (942 B/KB) with 8 % headroom, but text with shorter words than this
    /// sample (chat, lists, code comments) has more words per KB; k = 4 leaves
    /// 16 %. CJK: k = 6 costs little over k = 5 — one more character of
    /// context per shingle, fewer chance hits in a store of many tenants — and
    /// leaves 11 %; UTF-8 CJK text has a near-constant ≈ 300 characters per KB,
    /// so that margin holds across documents. A sample this size cannot show
    /// chance rates in a large store; the store's common-content discount is
    /// what handles recurring phrases. Reproduce: `cargo test --lib
    /// fingerprint::tests::density_table -- --ignored --nocapture`; the bound
    /// for the defaults is asserted (for each of the 8 keys) by
    /// `default_density_is_at_most_1kb_per_kb`.
    fn default() -> Self {
        FingerprintParams {
            word_k: 4,
            word_w: 9,
            cjk_k: 6,
            cjk_w: 15,
        }
    }
}

impl FingerprintParams {
    /// k for a token class.
    pub fn k(&self, class: TokenClass) -> usize {
        match class {
            TokenClass::Word => self.word_k,
            TokenClass::Cjk => self.cjk_k,
        }
    }

    /// w for a token class.
    pub fn w(&self, class: TokenClass) -> usize {
        match class {
            TokenClass::Word => self.word_w,
            TokenClass::Cjk => self.cjk_w,
        }
    }

    /// The shortest shared run of this class that is guaranteed to be found:
    /// `w + k − 1` tokens.
    pub fn guaranteed_run(&self, class: TokenClass) -> usize {
        self.w(class) + self.k(class) - 1
    }

    fn clamped(mut self) -> Self {
        self.word_k = self.word_k.clamp(1, 64);
        self.cjk_k = self.cjk_k.clamp(1, 64);
        self.word_w = self.word_w.clamp(1, 256);
        self.cjk_w = self.cjk_w.clamp(1, 256);
        self
    }
}

// === types ===

/// How a token was cut, which decides its shingle length and window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TokenClass {
    /// A UAX#29 word (letters, digits) of a space-delimited script.
    Word = 0,
    /// One character of a script written without spaces between words: Han,
    /// Hiragana, Katakana, Bopomofo, Hangul, Yi, Thai, Lao, Khmer, Myanmar,
    /// Tai scripts — with any marks that attach to it.
    Cjk = 1,
}

/// One token: its keyed hash and where it sits in the original text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token {
    /// SipHash-1-3 of the normalised token under the fingerprint key.
    pub hash: u64,
    /// Byte offset of the token's first byte in the original text.
    pub start: usize,
    /// Byte offset just past the token in the original text.
    pub end: usize,
    pub class: TokenClass,
}

/// k consecutive tokens of one class, hashed in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shingle {
    /// Keyed hash of the tokens, their order, class and count.
    pub hash: u64,
    /// Index of its first token in the token list it was made from.
    pub first: u32,
    /// Number of tokens it covers: k of its class, or fewer for a class run
    /// shorter than k (see [`Fingerprinter::shingles`]). It covers tokens
    /// `first .. first + len`.
    pub len: u8,
    pub class: TokenClass,
}

// === impl Fingerprinter ===

/// Tokenises, shingles and winnows text under one key. Cheap to clone; holds
/// only derived keys and parameters, so it can be shared by every scanner.
#[derive(Clone)]
pub struct Fingerprinter {
    params: FingerprintParams,
    tokens: TokenHasher,
    shingles: ShingleHasher,
}

impl Fingerprinter {
    /// `key` is residue's [`HashKey`](crate::hash::HashKey) bytes. The
    /// SipHash keys are derived from it with BLAKE3's key derivation under a
    /// context string of their own, so fingerprints are unrelated to the
    /// other keyed hashes residue makes with the same key, and two processes
    /// with the same key produce comparable fingerprints (needed once the
    /// store is shared). Parameters out of range are clamped: k to 1..=64,
    /// w to 1..=256.
    pub fn new(key: [u8; 32], params: FingerprintParams) -> Self {
        let d = blake3::derive_key(
            "residue 2026-11 fingerprint v1 token and shingle keys",
            &key,
        );
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&d[i * 8..i * 8 + 8]);
            u64::from_le_bytes(b)
        };
        // A second derivation for the polynomial base, so all four words of
        // `d` can key the two SipHash instances.
        let e = blake3::derive_key("residue 2026-11 fingerprint v1 rolling base", &key);
        let mut b = [0u8; 8];
        b.copy_from_slice(&e[..8]);
        // Odd, so multiplication by it is a bijection mod 2^64 and no token's
        // contribution can vanish; never 1, so order matters.
        let base = u64::from_le_bytes(b) | 1;
        let base = if base == 1 {
            0x9E37_79B9_7F4A_7C15
        } else {
            base
        };
        Fingerprinter {
            params: params.clamped(),
            tokens: TokenHasher::new(word(0), word(1)),
            shingles: ShingleHasher {
                base,
                k0: word(2),
                k1: word(3) | 1,
            },
        }
    }

    pub fn params(&self) -> &FingerprintParams {
        &self.params
    }

    pub(crate) fn token_hasher(&self) -> TokenHasher {
        self.tokens
    }

    /// Appends the tokens of `text` to `out`; offsets are byte offsets into
    /// `text`. Linear time; ASCII words skip normalisation.
    pub fn tokens(&self, text: &str, out: &mut Vec<Token>) {
        tokenize::tokenize(&self.tokens, text, 0, out);
    }

    /// Appends every shingle of `tokens` (the query side).
    ///
    /// The token list is cut into runs of one class; shingles never span a
    /// class change, because a word and a character are different units and
    /// k differs. Each run of n ≥ k tokens gives n − k + 1 shingles of k
    /// tokens. A run shorter than k gives a single shingle of the whole run
    /// if it has at least ⌈k/2⌉ tokens (and ≥ 2) — so Chinese text chopped up
    /// by numbers and English terms (`第3章介绍了Rust的所有权…`) is still
    /// fingerprinted — and nothing otherwise: a lone number or a two-character
    /// word is no evidence of anything. A short-run shingle matches only the
    /// same short run bounded by class changes on the other side too; its
    /// `len` says how many tokens it covers.
    ///
    /// For a growing (streamed) token list, the shingles of a prefix are final
    /// except those of its last class run, which may still grow.
    pub fn shingles(&self, tokens: &[Token], out: &mut Vec<Shingle>) {
        let mut i = 0;
        while let Some(t) = tokens.get(i) {
            let class = t.class;
            let mut j = i + 1;
            while tokens.get(j).is_some_and(|t| t.class == class) {
                j += 1;
            }
            winnow::shingle_run(
                &self.shingles,
                &tokens[i..j],
                i,
                class,
                self.params.k(class),
                out,
            );
            i = j;
        }
    }

    /// Appends the shingles the store keeps (robust winnowing, per class with
    /// its own window), in their original order. Any w consecutive shingles
    /// of one class in `shingles` include at least one that is kept.
    pub fn winnow(&self, shingles: &[Shingle], out: &mut Vec<Shingle>) {
        winnow::winnow(shingles, self.params.word_w, self.params.cjk_w, out);
    }

    /// Tokens → shingles → winnow: what the store records for `text`.
    pub fn fingerprints(&self, text: &str) -> Vec<Shingle> {
        let mut tokens = Vec::new();
        self.tokens(text, &mut tokens);
        let mut shingles = Vec::new();
        self.shingles(&tokens, &mut shingles);
        let mut out = Vec::new();
        self.winnow(&shingles, &mut out);
        out
    }
}

impl std::fmt::Debug for Fingerprinter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fingerprinter")
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}
