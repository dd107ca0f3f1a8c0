//! Counting a prompt's tokens: with the model's own `tokenizer.json` when one
//! is configured, otherwise with a documented estimate.

use std::path::Path;
use std::sync::Arc;

use crate::protocol::Prompt;

#[derive(Debug, thiserror::Error)]
#[error("cannot load tokenizer {path}: {message}")]
pub struct TokenizerError {
    pub path: String,
    pub message: String,
}

#[derive(Clone)]
pub enum TokenCounter {
    Estimate,
    Tokenizer(Arc<tokenizers::Tokenizer>),
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl TokenCounter {
    /// Loads a Hugging Face `tokenizer.json`.
    ///
    /// Truncation and padding are switched off: a `tokenizer.json` saved with
    /// `max_length` would otherwise cap every count at that length (exactly
    /// the long prompts that matter), and padding would inflate short ones.
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let error = |message: String| TokenizerError {
            path: path.display().to_string(),
            message,
        };
        let mut t = tokenizers::Tokenizer::from_file(path).map_err(|e| error(e.to_string()))?;
        t.with_truncation(None).map_err(|e| error(e.to_string()))?;
        t.with_padding(None);
        Ok(TokenCounter::Tokenizer(Arc::new(t)))
    }

    pub fn name(&self) -> &'static str {
        match self {
            TokenCounter::Estimate => "estimate",
            TokenCounter::Tokenizer(_) => "tokenizer",
        }
    }

    /// The prompt's token count: every part plus pretokenized ids.
    ///
    /// Parts are encoded separately and without special tokens: the chat
    /// template's own tokens differ per model and are a rounding error next
    /// to the long prompts this count is for. A part the tokenizer fails on
    /// is estimated instead, so one odd segment does not void the count.
    pub fn count(&self, prompt: &Prompt) -> u64 {
        let text: u64 = match self {
            TokenCounter::Estimate => prompt.parts.iter().map(|p| estimate_tokens(p)).sum(),
            TokenCounter::Tokenizer(t) => prompt
                .parts
                .iter()
                .map(|part| {
                    if part.is_empty() {
                        return 0;
                    }
                    // `encode_fast` is `encode` without character offsets,
                    // which a count does not need: same ids, less work on
                    // prompts of hundreds of thousands of tokens.
                    match t.encode_fast(part.as_str(), false) {
                        Ok(encoding) => encoding.len() as u64,
                        Err(_) => estimate_tokens(part),
                    }
                })
                .sum(),
        };
        prompt.pretokenized.saturating_add(text)
    }
}

/// The estimate used without a tokenizer.
///
/// Each character is weighed by what BPE tokenizers typically spend on it,
/// in quarter tokens, and the sum is rounded up:
///
/// - CJK ideographs (the URO, extension A, compatibility ideographs and the
///   supplementary ideographic planes), Hiragana, Katakana, Hangul syllables
///   and Thai: **1 token each**. Their vocabularies hold few multi-character
///   merges for these scripts, so one or more tokens per character is the
///   norm; counting 1 keeps the estimate a floor rather than an overshoot.
/// - Every other character, whitespace included: **¼ token**. English in
///   cl100k or Llama-3 style tokenizers averages about 4.0–4.5 characters per
///   token, with the space folded into the following word's token; 4 is the
///   conservative end of that range.
///
/// Typical English lands within about a third of a real count; prose of
/// long words overshoots (6+ characters per token), and source code or
/// symbol-heavy text undershoots (often 2–3 characters per token).
///
/// The empty text is 0 tokens. The estimate runs on every request without a
/// tokenizer, some of them hundreds of thousands of tokens long, so it is a
/// single pass over the characters with no allocation.
pub fn estimate_tokens(text: &str) -> u64 {
    let mut quarters: u64 = 0;
    for c in text.chars() {
        quarters += if is_dense_script(c) { 4 } else { 1 };
    }
    quarters.div_ceil(4)
}

/// Characters a BPE tokenizer spends about a whole token on.
#[inline]
fn is_dense_script(c: char) -> bool {
    let c = c as u32;
    // Everything below Thai is Latin, Greek, Cyrillic, Hebrew, Arabic, …:
    // one comparison settles the common case.
    if c < 0x0E00 {
        return false;
    }
    matches!(
        c,
        0x0E00..=0x0E7F        // Thai
        | 0x3040..=0x309F      // Hiragana
        | 0x30A0..=0x30FF      // Katakana
        | 0x31F0..=0x31FF      // Katakana phonetic extensions
        | 0x3400..=0x4DBF      // CJK extension A
        | 0x4E00..=0x9FFF      // CJK unified ideographs
        | 0xAC00..=0xD7AF      // Hangul syllables
        | 0xF900..=0xFAFF      // CJK compatibility ideographs
        | 0xFF66..=0xFF9F      // Halfwidth Katakana
        | 0x20000..=0x3FFFF // CJK extensions B–H (planes 2 and 3)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fresh directory under the system temp dir (no tempfile crate).
    fn temp_dir(tag: &str) -> PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "residue-tokens-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    /// A hand-written WordLevel tokenizer that splits on whitespace and
    /// punctuation. It is saved with truncation to 2 tokens and padding to 8
    /// to prove that loading switches both off.
    const TOKENIZER_JSON: &str = r#"{
      "version": "1.0",
      "truncation": {"direction": "Right", "max_length": 2, "strategy": "LongestFirst", "stride": 0},
      "padding": {"strategy": {"Fixed": 8}, "direction": "Right", "pad_to_multiple_of": null,
                  "pad_id": 0, "pad_type_id": 0, "pad_token": "[UNK]"},
      "added_tokens": [],
      "normalizer": null,
      "pre_tokenizer": {"type": "Whitespace"},
      "post_processor": null,
      "decoder": null,
      "model": {
        "type": "WordLevel",
        "vocab": {"[UNK]": 0, "hello": 1, "world": 2, "!": 3},
        "unk_token": "[UNK]"
      }
    }"#;

    fn prompt(parts: &[&str], pretokenized: u64) -> Prompt {
        Prompt {
            parts: parts.iter().map(|p| p.to_string()).collect(),
            pretokenized,
        }
    }

    #[test]
    fn estimate_table() {
        let cases: &[(&str, u64)] = &[
            ("", 0),
            ("a", 1),
            ("abcd", 1),
            ("abcde", 2),
            ("    ", 1),
            ("你好世界", 4),
            ("日本語のテキスト", 8),
            ("안녕하세요", 5),
            ("สวัสดี", 6),
            ("𠀀𠀁", 2),
            // Mixed: 4 ideographs + 4 ASCII quarters.
            ("你好世界abcd", 5),
            ("héllo wörld", 3),
        ];
        for (text, want) in cases {
            assert_eq!(estimate_tokens(text), *want, "{text:?}");
        }
    }

    #[test]
    fn estimate_english_close_to_a_real_tokenizer() {
        // Hand-counted cl100k tokens: each word with its leading space is one
        // token, and so is each punctuation mark. The last row is prose of
        // long words, where 4 characters per token overshoots; it is kept to
        // pin down that known bias (over, never under) rather than hide it.
        let cases: &[(&str, u64, f64)] = &[
            ("The quick brown fox jumps over the lazy dog.", 10, 0.35),
            (
                "I would like to book a table for two people at seven tonight.",
                14,
                0.35,
            ),
            (
                "Can you tell me what time it is in Paris right now?",
                13,
                0.35,
            ),
            (
                "Please summarize the attached quarterly report in three bullet points.",
                11,
                0.65,
            ),
        ];
        for (text, hand, tolerance) in cases {
            let est = estimate_tokens(text) as f64;
            let hand = *hand as f64;
            assert!(
                (est - hand).abs() <= hand * tolerance,
                "{text:?}: estimate {est} vs hand count {hand}"
            );
        }
    }

    #[test]
    fn estimate_is_fast_on_huge_prompts() {
        // ~681k tokens of English: must be a quick single pass even unoptimized.
        let text = "lorem ipsum dolor sit amet, ".repeat(681_000 * 4 / 28);
        let start = std::time::Instant::now();
        let n = estimate_tokens(&text);
        assert!((600_000..=700_000).contains(&n), "{n}");
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
    }

    #[test]
    fn count_with_estimate() {
        let c = TokenCounter::Estimate;
        assert_eq!(c.name(), "estimate");
        let cases: &[(&[&str], u64, u64)] = &[
            (&[], 0, 0),
            (&[""], 0, 0),
            (&[], 42, 42),
            (&["abcd", "你好"], 0, 3),
            (&["abcd", "你好"], 100, 103),
        ];
        for (parts, pre, want) in cases {
            assert_eq!(c.count(&prompt(parts, *pre)), *want, "{parts:?} + {pre}");
        }
    }

    #[test]
    fn count_with_tokenizer() {
        let dir = temp_dir("ok");
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, TOKENIZER_JSON).expect("write");
        let c = TokenCounter::from_file(&path).expect("loads");
        assert_eq!(c.name(), "tokenizer");
        let cases: &[(&[&str], u64, u64)] = &[
            (&[], 0, 0),
            (&[""], 0, 0),
            (&["hello"], 0, 1),
            // Unknown words still count (as [UNK]); punctuation splits off.
            (&["hello world, unknown words!"], 0, 6),
            // More than the saved truncation length, and no padding.
            (&["hello hello hello hello hello"], 0, 5),
            (&["hello world", "world"], 7, 10),
        ];
        for (parts, pre, want) in cases {
            assert_eq!(c.count(&prompt(parts, *pre)), *want, "{parts:?} + {pre}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn load_errors_name_the_path() {
        let dir = temp_dir("bad");
        let garbage = dir.join("garbage.json");
        std::fs::write(&garbage, b"\x00\xffnot json at all").expect("write");
        let wrong_shape = dir.join("wrong-shape.json");
        std::fs::write(&wrong_shape, br#"{"model": 3}"#).expect("write");
        let missing = dir.join("missing.json");
        for path in [&garbage, &wrong_shape, &missing] {
            let err = TokenCounter::from_file(path).expect_err("must fail");
            assert_eq!(err.path, path.display().to_string());
            assert!(
                err.to_string().contains(&path.display().to_string()),
                "{err}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
