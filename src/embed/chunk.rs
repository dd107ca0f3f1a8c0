//! Cutting texts into overlapping chunks of tokens, so that a leak of a few
//! sentences inside a long answer is compared at its own scale rather than
//! diluted into the whole answer's vector.
//!
//! Chunks are windows over the text's token ids (the static table's
//! tokenizer: no special tokens, nothing truncated), with the byte span each
//! covers, so the transformer can re-read the same text and a finding can
//! point at it.

use tokenizers::Tokenizer;

use super::EmbedError;

/// One chunk: a window of the text's tokens and the bytes they span.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Byte range in the text.
    pub start: usize,
    pub end: usize,
    pub ids: Vec<u32>,
}

/// How texts are cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkParams {
    /// Tokens per chunk.
    pub tokens: usize,
    /// Tokens between the starts of two chunks (`tokens - stride` overlap).
    pub stride: usize,
    /// The most chunks one text gives; the rest of the text is not read.
    pub max_chunks: usize,
}

impl Default for ChunkParams {
    fn default() -> Self {
        ChunkParams {
            tokens: 96,
            stride: 64,
            max_chunks: 32,
        }
    }
}

/// Which end of a long text to keep: answers are read from the start, prompts
/// from the end (the latest message is last; a shared system prompt first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    Head,
    Tail,
}

/// Bytes of text read per chunk kept, generously: tokenizing megabytes to
/// keep a few thousand tokens would waste the scanner's time.
const BYTES_PER_TOKEN_CAP: usize = 16;

/// Cuts `text` into chunks. A text of at most `tokens` tokens is one chunk;
/// an empty one (or one of no tokens) none.
pub fn chunks(
    tokenizer: &Tokenizer,
    text: &str,
    params: ChunkParams,
    keep: Keep,
) -> Result<Vec<Chunk>, EmbedError> {
    let tokens = params.tokens.max(1);
    let stride = params.stride.clamp(1, tokens);
    let max_chunks = params.max_chunks.max(1);
    let budget = (tokens + stride * (max_chunks - 1)) * BYTES_PER_TOKEN_CAP;
    let (base, text) = if text.len() <= budget {
        (0, text)
    } else {
        match keep {
            Keep::Head => (0, &text[..floor_char_boundary(text, budget)]),
            Keep::Tail => {
                let at = ceil_char_boundary(text, text.len() - budget);
                (at, &text[at..])
            }
        }
    };
    let enc = tokenizer
        .encode(text, false)
        .map_err(|e| EmbedError::Tokenize(e.to_string()))?;
    let ids = enc.get_ids();
    let offsets = enc.get_offsets();
    let n = ids.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut starts: Vec<usize> = if n <= tokens {
        vec![0]
    } else {
        let mut s: Vec<usize> = (0..)
            .map(|i| i * stride)
            .take_while(|&s| s + tokens < n)
            .collect();
        s.push(n - tokens);
        s.dedup();
        s
    };
    if starts.len() > max_chunks {
        match keep {
            Keep::Head => starts.truncate(max_chunks),
            Keep::Tail => {
                starts.drain(..starts.len() - max_chunks);
            }
        }
    }
    Ok(starts
        .into_iter()
        .map(|s| {
            let e = (s + tokens).min(n);
            Chunk {
                start: base + offsets[s].0,
                end: base + offsets[e - 1].1,
                ids: ids[s..e].to_vec(),
            }
        })
        .collect())
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char_boundary(s: &str, mut i: usize) -> usize {
    while i < s.len() && !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::WhitespaceSplit;

    /// Words w0..w99 and an unknown token.
    fn tokenizer() -> Tokenizer {
        let mut vocab: std::collections::HashMap<String, u32> =
            (0..100).map(|i| (format!("w{i}"), i)).collect();
        vocab.insert("[UNK]".into(), 100);
        let model = WordLevel::builder()
            .vocab(vocab.into_iter().collect())
            .unk_token("[UNK]".into())
            .build()
            .unwrap();
        let mut tok = Tokenizer::new(model);
        tok.with_pre_tokenizer(Some(WhitespaceSplit));
        tok
    }

    fn text(n: usize) -> String {
        (0..n)
            .map(|i| format!("w{}", i % 100))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn params(tokens: usize, stride: usize, max_chunks: usize) -> ChunkParams {
        ChunkParams {
            tokens,
            stride,
            max_chunks,
        }
    }

    #[test]
    fn a_short_text_is_one_chunk_and_an_empty_one_none() {
        let tok = tokenizer();
        let t = text(5);
        let c = chunks(&tok, &t, params(8, 4, 10), Keep::Head).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].start, c[0].end), (0, t.len()));
        assert_eq!(c[0].ids, vec![0, 1, 2, 3, 4]);
        assert!(chunks(&tok, "", params(8, 4, 10), Keep::Head)
            .unwrap()
            .is_empty());
        assert!(chunks(&tok, "   \n ", params(8, 4, 10), Keep::Head)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn chunks_overlap_and_the_last_one_ends_with_the_text() {
        let tok = tokenizer();
        let t = text(20);
        let c = chunks(&tok, &t, params(8, 4, 10), Keep::Head).unwrap();
        let firsts: Vec<u32> = c.iter().map(|c| c.ids[0]).collect();
        assert_eq!(firsts, vec![0, 4, 8, 12]);
        assert!(c.iter().all(|c| c.ids.len() == 8));
        assert_eq!(c.last().unwrap().end, t.len());
        for ch in &c {
            let words: Vec<&str> = t[ch.start..ch.end].split_whitespace().collect();
            assert_eq!(words.len(), 8, "span and ids agree");
            assert_eq!(words[0], format!("w{}", ch.ids[0]));
        }
    }

    #[test]
    fn long_texts_keep_the_head_or_the_tail() {
        let tok = tokenizer();
        let t = text(100);
        let head = chunks(&tok, &t, params(8, 4, 3), Keep::Head).unwrap();
        assert_eq!(head.len(), 3);
        assert_eq!(head[0].ids[0], 0);
        let tail = chunks(&tok, &t, params(8, 4, 3), Keep::Tail).unwrap();
        assert_eq!(tail.len(), 3);
        assert_eq!(tail.last().unwrap().end, t.len());
        assert_eq!(*tail.last().unwrap().ids.last().unwrap(), 99);
    }

    #[test]
    fn huge_and_multibyte_texts_are_cut_on_char_boundaries() {
        let tok = tokenizer();
        let t = "é w1 ".repeat(100_000);
        for keep in [Keep::Head, Keep::Tail] {
            let c = chunks(&tok, &t, params(8, 4, 2), keep).unwrap();
            assert_eq!(c.len(), 2);
            for ch in c {
                assert!(t.get(ch.start..ch.end).is_some());
            }
        }
        // Degenerate parameters are clamped, not a panic or a loop.
        let c = chunks(&tok, &text(10), params(0, 0, 0), Keep::Head).unwrap();
        assert_eq!(c.len(), 1);
        let c = chunks(&tok, &text(10), params(4, 100, 10), Keep::Head).unwrap();
        assert_eq!(c.len(), 3);
    }
}
