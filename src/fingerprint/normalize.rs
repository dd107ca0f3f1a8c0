//! Token normalisation and keyed token hashing.
//!
//! A token is hashed from its *normalised* form, so that text which reads the
//! same hashes the same: `"HELLO"`, `"hello"`, `"ｈｅｌｌｏ"` (fullwidth) and
//! `"héllo"` composed or decomposed are one token each way. Normalisation runs
//! per token, never on the whole text, so token offsets always point into the
//! original bytes.
//!
//! The normalised form is Unicode's *compatibility caseless* form (Unicode
//! §3.13, D146): `NFKD(fold(NFKD(fold(NFD(x)))))`. It identifies exactly the
//! strings that NFKC + full case folding identify; we hash the decomposed form
//! because it needs no recomposition pass. Inside a token only letters, digits
//! and combining marks are hashed: apostrophes, dots, underscores and format
//! characters (soft hyphen, zero-width joiner) that UAX#29 keeps inside a word
//! are dropped, so `don't` = `don’t` and `co\u{AD}operate` = `cooperate`.
//! Combining marks are kept: `café` ≠ `cafe`.

use std::hash::Hasher as _;

use caseless::Caseless;
use siphasher::sip::SipHasher13;
use unicode_normalization::char::is_combining_mark;
use unicode_normalization::UnicodeNormalization;

/// Bytes buffered before they are handed to SipHash: writing one byte at a
/// time through `Hasher::write` costs several times more than one write of a
/// short slice, and almost every word fits.
const BUF: usize = 64;

/// Keyed token hashing: SipHash-1-3 under a key derived from residue's
/// [`HashKey`](crate::hash::HashKey) bytes. `Copy`, so a
/// [`StreamTokenizer`](super::StreamTokenizer) carries its own.
#[derive(Clone, Copy)]
pub(crate) struct TokenHasher {
    /// Keyed, with its initial state computed once: `SipHasher13::hash`
    /// starts from it, so per-token hashing does no key setup.
    sip: SipHasher13,
}

impl TokenHasher {
    pub(crate) fn new(k0: u64, k1: u64) -> Self {
        TokenHasher {
            sip: SipHasher13::new_with_keys(k0, k1),
        }
    }

    /// Hash of an ASCII word: lowercase its letters and digits, drop the rest.
    /// `None` when nothing hashable is left (cannot happen for UAX#29 words,
    /// which contain at least one alphanumeric character, but the caller does
    /// not have to know that).
    #[inline]
    pub(crate) fn hash_ascii(&self, word: &[u8]) -> Option<u64> {
        if word.len() <= BUF {
            // Nearly every word: lowercase into a stack buffer, branch-free
            // (always write, advance only past letters and digits), one-shot
            // hash.
            let mut buf = [0u8; BUF];
            let mut n = 0;
            for &b in word {
                buf[n] = b.to_ascii_lowercase();
                n += usize::from(b.is_ascii_alphanumeric());
            }
            return (n > 0).then(|| self.sip.hash(&buf[..n]));
        }
        let mut w = BufWriter::new(self);
        for &b in word {
            if b.is_ascii_alphanumeric() {
                w.byte(b.to_ascii_lowercase());
            }
        }
        w.finish()
    }

    /// Hash of any token: the full compatibility-caseless normalisation, then
    /// letters, digits and marks. Gives the same value as [`hash_ascii`] on
    /// ASCII input (tested), so the fast path is an optimisation only.
    ///
    /// [`hash_ascii`]: TokenHasher::hash_ascii
    pub(crate) fn hash_unicode(&self, token: &str) -> Option<u64> {
        let mut w = BufWriter::new(self);
        let normalised = token
            .chars()
            .nfd()
            .default_case_fold()
            .nfkd()
            .default_case_fold()
            .nfkd();
        for c in normalised {
            if c.is_alphanumeric() || is_combining_mark(c) {
                w.char(c);
            }
        }
        w.finish()
    }

    /// Hash of text already in normal form (a CJK unified ideograph): the
    /// same bytes [`hash_unicode`] would hash, without the normalisation.
    ///
    /// [`hash_unicode`]: TokenHasher::hash_unicode
    #[inline]
    pub(crate) fn hash_plain(&self, s: &str) -> u64 {
        self.sip.hash(s.as_bytes())
    }

    /// Dispatches to the ASCII fast path when it can.
    #[inline]
    pub(crate) fn hash_token(&self, token: &str) -> Option<u64> {
        if token.is_ascii() {
            self.hash_ascii(token.as_bytes())
        } else {
            self.hash_unicode(token)
        }
    }
}

/// A small stack buffer in front of SipHash's streaming `write`. SipHash's
/// `write` is a true streaming interface (the result depends only on the
/// concatenated bytes), so where the buffer flushes does not matter.
struct BufWriter {
    h: SipHasher13,
    buf: [u8; BUF],
    n: usize,
    any: bool,
}

impl BufWriter {
    #[inline]
    fn new(k: &TokenHasher) -> Self {
        BufWriter {
            h: k.sip,
            buf: [0; BUF],
            n: 0,
            any: false,
        }
    }

    #[inline]
    fn byte(&mut self, b: u8) {
        if self.n == BUF {
            self.h.write(&self.buf);
            self.n = 0;
        }
        self.buf[self.n] = b;
        self.n += 1;
        self.any = true;
    }

    #[inline]
    fn char(&mut self, c: char) {
        if self.n + 4 > BUF {
            self.h.write(&self.buf[..self.n]);
            self.n = 0;
        }
        let len = c.encode_utf8(&mut self.buf[self.n..]).len();
        self.n += len;
        self.any = true;
    }

    #[inline]
    fn finish(mut self) -> Option<u64> {
        if !self.any {
            return None;
        }
        self.h.write(&self.buf[..self.n]);
        Some(self.h.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_fast_path_equals_unicode_path() {
        let h = TokenHasher::new(1, 2);
        let long = "AbC123xyz".repeat(40); // crosses the buffer several times
        let edge = "aB'".repeat(22); // 66 bytes, 44 hashed: the streaming path
        let edge64 = "x".repeat(64);
        for w in [
            "a", "Hello", "can't", "foo_bar", "3.14", "e.g", &long, &edge, &edge64,
        ] {
            assert_eq!(h.hash_ascii(w.as_bytes()), h.hash_unicode(w), "{w}");
        }
        assert_eq!(h.hash_ascii(b"'_."), None);
        assert_eq!(h.hash_unicode("'_."), None);
    }
}
