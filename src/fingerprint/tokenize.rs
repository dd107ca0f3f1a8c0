//! Tokenisation: UAX#29 words, with scripts written without spaces cut into
//! one token per character.
//!
//! UAX#29 (via `unicode-segmentation`) already does most of the work: it
//! drops whitespace, punctuation and emoji, keeps `can't` and `3.14` whole,
//! and (in the crate version we use, 1.13) yields Han, Hiragana, Thai, Lao,
//! Khmer and Myanmar one character at a time — with combining marks attached,
//! which is what we want (`ง่` is one token, not a consonant and a floating
//! tone mark). It keeps *Katakana* runs (`カタカナ`) and *Hangul* runs
//! (`한국어`) together as words, so every segment that contains a character of
//! a no-space script is re-cut here: each such character starts a token, and
//! the marks, variation selectors, joiners, halfwidth sound marks and
//! conjoining jamo that follow it stay with it. That re-cut is also what keeps
//! us correct if a future crate version groups Thai again.

use unicode_normalization::char::is_combining_mark;
use unicode_segmentation::UnicodeSegmentation;

use super::normalize::TokenHasher;
use super::{Token, TokenClass};

// === script classes ===

/// Characters of scripts written without spaces between words, tokenised one
/// character each. A range table, because neither std nor our dependencies
/// expose the Script property; the ranges are whole Unicode blocks, so they
/// do not go stale when characters are added to those blocks.
pub(crate) fn is_cjk_class(c: char) -> bool {
    let c = c as u32;
    if c < 0x0E00 {
        return false; // everything up to Thai: fast exit for Latin, Cyrillic, Arabic, …
    }
    matches!(c,
        0x0E00..=0x0EFF        // Thai, Lao
        | 0x1000..=0x109F      // Myanmar
        | 0x1100..=0x11FF      // Hangul Jamo
        | 0x1780..=0x17FF      // Khmer
        | 0x1950..=0x19DF      // Tai Le, New Tai Lue
        | 0x19E0..=0x19FF      // Khmer Symbols
        | 0x1A20..=0x1AAF      // Tai Tham
        | 0x2E80..=0x2FDF      // CJK Radicals Supplement, Kangxi Radicals
        | 0x3005..=0x3007      // 々 〆 〇
        | 0x3021..=0x3029      // Hangzhou numerals
        | 0x3031..=0x3035      // kana repeat marks
        | 0x3038..=0x303C
        | 0x3041..=0x30FF      // Hiragana, Katakana
        | 0x3100..=0x312F      // Bopomofo
        | 0x3131..=0x318F      // Hangul Compatibility Jamo
        | 0x31A0..=0x31BF      // Bopomofo Extended
        | 0x31F0..=0x31FF      // Katakana Phonetic Extensions
        | 0x3400..=0x4DBF      // CJK Extension A
        | 0x4E00..=0x9FFF      // CJK Unified Ideographs
        | 0xA000..=0xA4CF      // Yi
        | 0xA960..=0xA97F      // Hangul Jamo Extended-A
        | 0xA9E0..=0xA9FF      // Myanmar Extended-B
        | 0xAA60..=0xAADF      // Myanmar Extended-A, Tai Viet
        | 0xAC00..=0xD7FF      // Hangul Syllables, Jamo Extended-B
        | 0xF900..=0xFAFF      // CJK Compatibility Ideographs
        | 0xFF66..=0xFF9F      // halfwidth Katakana
        | 0xFFA0..=0xFFDC      // halfwidth Hangul
        | 0x1B000..=0x1B16F    // Kana Supplement, Extended-A, Small Kana
        | 0x20000..=0x323AF // CJK Extensions B–H, Compatibility Supplement
    )
}

/// Characters that never start a per-character token but extend the one
/// before them: combining marks (Thai vowels and tones, Devanagari-style
/// signs in Myanmar and Khmer, the kana voicing marks U+3099/U+309A),
/// variation selectors, ZWJ/ZWNJ, the halfwidth voicing marks (ｶﾞ = ガ after
/// NFKC) and medial/final conjoining jamo (ᄒ+ᅡ+ᆫ = 한 after NFC).
fn attaches(c: char) -> bool {
    let u = c as u32;
    is_combining_mark(c)
        || matches!(u,
            0x200C | 0x200D | 0xFE00..=0xFE0F | 0xE0100..=0xE01EF
            | 0xFF9E | 0xFF9F
            | 0x1160..=0x11FF | 0xD7B0..=0xD7FF)
}

// === batch tokenisation ===

/// Tokenises `text`, appending to `out` with offsets shifted by `base`.
///
/// The result is exactly that of running UAX#29 over the whole text and
/// re-cutting its segments ([`tokenize_segments`], the reference the tests
/// compare against), but faster: the text is cut at *safe cuts* (see
/// [`StreamTokenizer`]) into pieces that segment independently, and
/// - pure-ASCII pieces go to `unicode-segmentation`'s ASCII fast path, which
///   it only takes when a whole string is ASCII — one `’` in a response
///   would otherwise slow the whole response ~10× (measured: 690 → 70 MB/s);
/// - a piece that is a single Han ideograph is one token by itself (safe cuts
///   on both sides are word boundaries), hashed without normalisation: CJK
///   unified ideographs have no decomposition and no case folding (tested
///   over the whole block). That is most of Chinese text;
/// - everything else goes through the full path.
pub(crate) fn tokenize(h: &TokenHasher, text: &str, base: usize, out: &mut Vec<Token>) {
    let bytes = text.as_bytes();
    let len = bytes.len();
    // Everything before `start` is done; `start` is 0 or a safe cut.
    let mut start = 0;
    while start < len {
        // 1. The ASCII run from `start`.
        let Some(j) = bytes[start..]
            .iter()
            .position(|b| !b.is_ascii())
            .map(|j| start + j)
        else {
            tokenize_segments(h, &text[start..], base + start, out);
            return;
        };
        // 2. Hand the ASCII run up to its last safe cut to the fast path.
        let first = text[j..].chars().next().unwrap_or(' ');
        let mut p = j;
        while p > start {
            let a = bytes[p - 1] as char;
            let c = if p == j { first } else { bytes[p] as char };
            if safe_cut(a, c) {
                break;
            }
            p -= 1;
        }
        if p > start {
            tokenize_segments(h, &text[start..p], base + start, out);
            start = p;
        }
        // 3. Non-ASCII text from `start`: cut at every safe cut, until the
        //    text turns ASCII again at one.
        let mut prev: Option<char> = None;
        let mut back_to_ascii = false;
        for (i, c) in text[j..].char_indices() {
            let q = j + i;
            if let Some(a) = prev {
                if safe_cut(a, c) {
                    piece(h, &text[start..q], base + start, out);
                    start = q;
                    if c.is_ascii() {
                        back_to_ascii = true;
                        break;
                    }
                }
            }
            prev = Some(c);
        }
        if !back_to_ascii {
            piece(h, &text[start..], base + start, out);
            return;
        }
    }
}

/// One piece between safe cuts (not necessarily ASCII).
#[inline]
fn piece(h: &TokenHasher, s: &str, base: usize, out: &mut Vec<Token>) {
    let mut cs = s.chars();
    if let (Some(c), None) = (cs.next(), cs.next()) {
        if is_plain_han(c) {
            // The two main blocks are fully assigned (tested), so skip the
            // property lookup for them.
            if matches!(c as u32, 0x4E00..=0x9FFF | 0x3400..=0x4DBF) || c.is_alphanumeric() {
                out.push(Token {
                    hash: h.hash_plain(s),
                    start: base,
                    end: base + s.len(),
                    class: TokenClass::Cjk,
                });
            }
            return;
        }
    }
    tokenize_segments(h, s, base, out);
}

/// CJK unified ideographs (the compatibility ideographs, which decompose,
/// excluded): normalisation and case folding leave them unchanged.
pub(crate) fn is_plain_han(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2EBEF | 0x30000..=0x323AF)
}

/// The reference tokenisation: UAX#29 over `text`, each word segment re-cut.
pub(crate) fn tokenize_segments(h: &TokenHasher, text: &str, base: usize, out: &mut Vec<Token>) {
    for (start, seg) in text.unicode_word_indices() {
        if seg.is_ascii() {
            // The hot path: plain English words and numbers.
            if let Some(hash) = h.hash_ascii(seg.as_bytes()) {
                out.push(Token {
                    hash,
                    start: base + start,
                    end: base + start + seg.len(),
                    class: TokenClass::Word,
                });
            }
        } else {
            split_segment(h, seg, base + start, out);
        }
    }
}

/// Re-cuts one non-ASCII UAX#29 word segment: runs of ordinary letters stay
/// one word; each no-space-script character (with what attaches to it) is a
/// token of its own.
fn split_segment(h: &TokenHasher, seg: &str, base: usize, out: &mut Vec<Token>) {
    // The token being built: its start in `seg` and its class.
    let mut cur: Option<(usize, TokenClass)> = None;
    for (i, c) in seg.char_indices() {
        let next = if is_cjk_class(c) && !(attaches(c) && cur.is_some()) {
            // A new per-character token (conjoining jamo and marks attach
            // instead when something precedes them).
            Some(TokenClass::Cjk)
        } else if matches!(cur, Some((_, TokenClass::Word)))
            || (matches!(cur, Some((_, TokenClass::Cjk))) && attaches(c))
        {
            None // extends the current word, or the current character's marks
        } else {
            Some(TokenClass::Word)
        };
        if let Some(class) = next {
            if let Some((s, cls)) = cur {
                emit(h, seg, s, i, cls, base, out);
            }
            cur = Some((i, class));
        }
    }
    if let Some((s, cls)) = cur {
        emit(h, seg, s, seg.len(), cls, base, out);
    }
}

#[inline]
fn emit(
    h: &TokenHasher,
    seg: &str,
    s: usize,
    e: usize,
    class: TokenClass,
    base: usize,
    out: &mut Vec<Token>,
) {
    // `s` and `e` come from `char_indices`, so they are char boundaries.
    let Some(piece) = seg.get(s..e) else { return };
    if let Some(hash) = h.hash_token(piece) {
        out.push(Token {
            hash,
            start: base + s,
            end: base + e,
            class,
        });
    }
}

// === streaming ===

/// Incremental tokeniser for streamed text. See the module docs of
/// [`fingerprint`](super) for the contract; here is how it is kept.
///
/// Text is appended to `pending`. After each delta we look, in the new text
/// only, for the last *safe cut*: a position between two characters where
/// UAX#29 breaks whatever follows, and where nothing before it can be changed
/// by what follows. Everything before the cut is tokenised exactly as
/// [`tokens`](super::Fingerprinter::tokens) would and dropped; the rest waits.
/// A cut is safe between `a` and `c` when `a` is whitespace, a Han or Hiragana
/// character, Thai consonant, or punctuation that UAX#29 classes as `Other`,
/// and `c` can never attach to `a` (it is ASCII, whitespace, Han, Hiragana,
/// a Thai consonant or such punctuation; never a mark, joiner or variation
/// selector), and not both are whitespace. UAX#29's look-ahead rules (`can|'|t` → `can't`, `3|.|1` →
/// `3.1`) need `a` to be a letter, digit or mid-word punctuation, so they
/// never reach across such a cut. The exhaustive split tests check this.
///
/// Cost is linear: each byte is examined once for cuts and tokenised once.
/// What waits is at most the text since the last cut, which for normal prose
/// is one word or one CJK character; a stream with no cut at all (one 1 MB
/// "word") is held until [`finish`](StreamTokenizer::finish) — the caller
/// bounds response size, and [`pending_len`](StreamTokenizer::pending_len)
/// shows it.
pub struct StreamTokenizer {
    hasher: TokenHasher,
    pending: String,
    base: usize,
}

impl StreamTokenizer {
    pub fn new(fp: &super::Fingerprinter) -> Self {
        StreamTokenizer {
            hasher: fp.token_hasher(),
            pending: String::new(),
            base: 0,
        }
    }

    /// Feeds the next delta; appends every token now certainly complete.
    pub fn push(&mut self, delta: &str, out: &mut Vec<Token>) {
        if delta.is_empty() {
            return;
        }
        let old = self.pending.len();
        self.pending.push_str(delta);
        // The last safe cut whose right-hand character is new text.
        let mut cut = None;
        let mut right: Option<(usize, char)> = None;
        for (i, c) in self.pending[old..].char_indices().rev() {
            if let Some((p, rc)) = right {
                if safe_cut(c, rc) {
                    cut = Some(p);
                    break;
                }
            }
            right = Some((old + i, c));
        }
        if cut.is_none() {
            // The pair straddling the old/new junction.
            if let (Some((p, rc)), Some(a)) = (right, self.pending[..old].chars().next_back()) {
                if safe_cut(a, rc) {
                    cut = Some(p);
                }
            }
        }
        if let Some(p) = cut {
            if let Some(done) = self.pending.get(..p) {
                tokenize(&self.hasher, done, self.base, out);
                self.pending.drain(..p);
                self.base += p;
            }
        }
    }

    /// End of stream: tokenises what was held back.
    pub fn finish(&mut self, out: &mut Vec<Token>) {
        tokenize(&self.hasher, &self.pending, self.base, out);
        self.base += self.pending.len();
        self.pending.clear();
    }

    /// Bytes received but not yet tokenised.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Bytes received so far (the offset the next delta starts at).
    pub fn offset(&self) -> usize {
        self.base + self.pending.len()
    }
}

impl std::fmt::Debug for StreamTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print held-back text: it is a tenant's content.
        f.debug_struct("StreamTokenizer")
            .field("offset", &self.offset())
            .field("pending_len", &self.pending.len())
            .finish_non_exhaustive()
    }
}

/// Punctuation whose UAX#29 Word_Break value is `Other`: it never joins
/// anything on either side. Deliberately excludes `' " . , : ; _` and their
/// fullwidth forms (MidLetter, MidNum, MidNumLet, Double_Quote,
/// ExtendNumLet), which do.
fn hard_punct(c: char) -> bool {
    matches!(
        c,
        '!' | '?'
            | '('
            | ')'
            | '['
            | ']'
            | '{'
            | '}'
            | '<'
            | '>'
            | '*'
            | '+'
            | '/'
            | '\\'
            | '|'
            | '~'
            | '^'
            | '='
            | '%'
            | '&'
            | '#'
            | '@'
            | '$'
            | '-'
            | '\u{3001}' // 、
            | '\u{3002}' // 。
            | '\u{3008}'
            ..='\u{3011}' // 〈〉《》「」『』【】
            | '\u{FF01}' // ！
            | '\u{FF08}' // （
            | '\u{FF09}' // ）
            | '\u{FF1F}' // ？
            | '\u{201C}' // “
            | '\u{201D}' // ”
    )
}

/// Characters that break on both sides under UAX#29 (Word_Break `Other` or
/// whitespace) and are never an Extend/Format/ZWJ: safe on either side of a
/// cut.
fn hard(c: char) -> bool {
    c.is_whitespace()
        || hard_punct(c)
        || matches!(c as u32,
            0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2FA1F // Han
            | 0x3041..=0x3096 // Hiragana letters (not the voicing marks)
            | 0x0E01..=0x0E30 | 0x0E32 | 0x0E33 | 0x0E40..=0x0E46) // Thai letters
}

/// Whether the position between `a` and `c` is a safe cut. Never between two
/// whitespace characters: UAX#29 keeps horizontal space runs together (WB3d)
/// and CR LF together (WB3), and a following mark attaches to the space run
/// (WB4), so `"␠␠\u{E31}"` is one segment — a word, since U+0E31 is
/// alphabetic — that starts at the *first* space (found by the differential
/// test).
fn safe_cut(a: char, c: char) -> bool {
    hard(a) && (c.is_ascii() || hard(c)) && !(a.is_whitespace() && c.is_whitespace())
}
