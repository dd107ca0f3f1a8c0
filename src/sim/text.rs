//! The simulated model's "tokens" and its answers.
//!
//! A token is a whitespace-separated word, except that each CJK character
//! (and kana, Hangul) is a token of its own: crude, but it makes "20 words of
//! another tenant's text" mean the same thing here, in the ground truth and
//! in the scorecard. Healthy answers are extractive: built only from the
//! requester's own prompt and fixed templates, so that any foreign text in
//! an answer is there because a fault put it there.

use std::ops::Range;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

/// Byte ranges of the tokens of `text`, in order.
pub fn tokens(text: &str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() || is_cjk(c) {
            if let Some(s) = start.take() {
                out.push(s..i);
            }
            if is_cjk(c) {
                out.push(i..i + c.len_utf8());
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        out.push(s..text.len());
    }
    out
}

/// What a subword (BPE) tokenizer would count for `text`, which is what an
/// engine reports as `prompt_tokens`: a CJK character or a punctuation mark
/// is one token, a run of letters and digits one token per started six
/// characters ("the" 1, "because" 2, "information" 2), whitespace none.
/// English prose comes out near a real tokenizer's count, about one token
/// per 4–5 characters; the KV pages keep counting whole words.
pub fn subword_count(text: &str) -> u64 {
    let mut count = 0u64;
    let mut run = 0u64;
    for c in text.chars() {
        if c.is_alphanumeric() && !is_cjk(c) {
            run += 1;
            continue;
        }
        count += run.div_ceil(6);
        run = 0;
        if !c.is_whitespace() {
            count += 1;
        }
    }
    count + run.div_ceil(6)
}

/// The longest run of consecutive tokens of `a` that also occur
/// consecutively in `b`, in tokens; punctuation attached to a word is
/// ignored.
pub fn longest_common_run(a: &str, b: &str) -> usize {
    let words = |t: &str| -> Vec<String> {
        tokens(t)
            .into_iter()
            .map(|r| {
                t[r].trim_matches(|c: char| !c.is_alphanumeric())
                    .to_lowercase()
            })
            .filter(|w| !w.is_empty())
            .collect()
    };
    // The first few thousand words of each bound the work whatever the
    // prompt's size; a quote from further into a longer message is not
    // counted (the scorecard then asks less of residue, never more).
    const MAX_WORDS: usize = 4096;
    let (mut a, mut b) = (words(a), words(b));
    a.truncate(MAX_WORDS);
    b.truncate(MAX_WORDS);
    // Dynamic programming over suffix matches, one row at a time.
    let mut best = 0;
    let mut prev = vec![0usize; b.len() + 1];
    for x in &a {
        let mut row = vec![0usize; b.len() + 1];
        for (j, y) in b.iter().enumerate() {
            if x == y {
                row[j + 1] = prev[j] + 1;
                best = best.max(row[j + 1]);
            }
        }
        prev = row;
    }
    best
}

/// Number of tokens in `text` (see [`tokens`]).
pub fn count(text: &str) -> usize {
    tokens(text).len()
}

/// Ideographs, kana and Hangul: one token per character.
pub fn is_cjk(c: char) -> bool {
    matches!(
        c as u32,
        0x3040..=0x30FF        // Hiragana, Katakana
        | 0x3400..=0x4DBF      // CJK extension A
        | 0x4E00..=0x9FFF      // CJK unified ideographs
        | 0xAC00..=0xD7AF      // Hangul syllables
        | 0xF900..=0xFAFF      // CJK compatibility ideographs
        | 0x20000..=0x3FFFF // Supplementary ideographic planes
    )
}

/// Pieces to stream `text` in: one token each, with the whitespace before
/// it. Concatenated they give `text` back exactly.
pub fn pieces(text: &str) -> Vec<&str> {
    let toks = tokens(text);
    if toks.is_empty() {
        return if text.is_empty() { vec![] } else { vec![text] };
    }
    let mut out = Vec::with_capacity(toks.len());
    let mut from = 0;
    for (i, t) in toks.iter().enumerate() {
        let end = if i + 1 == toks.len() {
            text.len()
        } else {
            t.end
        };
        out.push(&text[from..end]);
        from = end;
    }
    out
}

const OPENINGS: [&str; 3] = ["You asked about", "Your question concerns", "About"];
const CLOSINGS: [&str; 4] = [
    "I hope this helps.",
    "Let me know if you need more detail.",
    "That should cover it.",
    "Feel free to ask a follow-up question.",
];

/// At most this many tokens of the prompt are quoted per sentence.
const MAX_QUOTE: usize = 40;
/// The topic is the first few tokens of the requester's last message.
const TOPIC: usize = 8;

/// A healthy answer to `parts` (the prompt's segments, last one the latest
/// message): a templated opening naming the topic, one or two sentences
/// taken from the latest message, a templated closing.
pub fn healthy(parts: &[String], rng: &mut StdRng) -> String {
    let opening = *OPENINGS.choose(rng).expect("non-empty. This is a bug.");
    let closing = *CLOSINGS.choose(rng).expect("non-empty. This is a bug.");
    let last = parts
        .iter()
        .rev()
        .find(|p| !p.trim().is_empty())
        .map(String::as_str)
        .unwrap_or("");
    let topic = head(last, TOPIC);
    if topic.is_empty() {
        return format!("I could not read a question in your message. {closing}");
    }
    // Quoted from the latest message: an answer addresses the user's
    // question, not the system prompt every tenant shares.
    let mut sentences: Vec<&str> = sentences(last);
    if sentences.is_empty() {
        sentences = parts.iter().flat_map(|p| self::sentences(p)).collect();
    }
    let mut answer = format!("{opening} \"{topic}\".");
    let n = rng.gen_range(1..=2).min(sentences.len());
    for s in sentences.choose_multiple(rng, n) {
        answer.push_str(" As you wrote: ");
        answer.push_str(head(s, MAX_QUOTE));
        answer.push('.');
    }
    answer.push(' ');
    answer.push_str(closing);
    answer
}

/// The first `n` tokens of `text`, verbatim, trailing punctuation kept.
fn head(text: &str, n: usize) -> &str {
    let toks = tokens(text);
    match toks.get(..n.min(toks.len())).and_then(<[_]>::last) {
        Some(last) => &text[toks[0].start..last.end],
        None => "",
    }
}

/// Sentences of `text`, trimmed, empty ones dropped. A sentence ends at a
/// line break, a CJK full stop, or `.`, `!`, `?` followed by whitespace (so
/// `jane@mail.com` and `3.5` stay whole).
fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut from = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next_blank = chars.peek().is_none_or(|(_, n)| n.is_whitespace());
        let end =
            matches!(c, '\n' | '。' | '！' | '？') || (matches!(c, '.' | '!' | '?') && next_blank);
        if end {
            out.push(&text[from..i]);
            from = i + c.len_utf8();
        }
    }
    out.push(&text[from..]);
    out.into_iter()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

const TEMPLATE_TOKENS: [&str; 6] = [
    "<|im_start|>",
    "assistant",
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "\n",
];

/// A broken answer: chat-template tokens, or gibberish syllables.
pub fn garbage(rng: &mut StdRng) -> String {
    let n = rng.gen_range(8..=40);
    let mut out = String::new();
    if rng.gen_bool(0.5) {
        for _ in 0..n {
            out.push_str(
                TEMPLATE_TOKENS
                    .choose(rng)
                    .expect("non-empty. This is a bug."),
            );
        }
    } else {
        const SYLLABLES: [&str; 10] = [
            "zor", "ka", "vlim", "tuq", "ex", "pra", "ny", "oth", "gu", "ril",
        ];
        for i in 0..n {
            if i > 0 {
                out.push(' ');
            }
            for _ in 0..rng.gen_range(1..=3) {
                out.push_str(SYLLABLES.choose(rng).expect("non-empty. This is a bug."));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn longest_common_runs() {
        assert_eq!(longest_common_run("", "a b"), 0);
        assert_eq!(longest_common_run("x a b c y", "a b c"), 3);
        assert_eq!(
            longest_common_run(
                "About \"Acme note: the plan\". As you wrote: Acme note.",
                "Acme note: the plan is late."
            ),
            4
        );
    }

    #[test]
    fn subword_counts_look_like_a_tokenizer() {
        assert_eq!(subword_count(""), 0);
        assert_eq!(subword_count("the cat"), 2);
        assert_eq!(subword_count("because information"), 4);
        assert_eq!(subword_count("a.b@c.de"), 7);
        assert_eq!(subword_count("你好，世界"), 5);
        // English prose: near a quarter of its characters.
        let prose = "The quarterly report covers revenue, churn and the hiring plan for the next two quarters.";
        let n = subword_count(prose) as f64;
        let quarter = prose.chars().count() as f64 / 4.0;
        assert!((0.75..=1.25).contains(&(n / quarter)), "{n} vs {quarter}");
    }

    #[test]
    fn tokens_are_words_and_cjk_characters() {
        let text = "Hello,  world\n东京タワー is 高い.";
        let toks: Vec<&str> = tokens(text).into_iter().map(|r| &text[r]).collect();
        assert_eq!(
            toks,
            ["Hello,", "world", "东", "京", "タ", "ワ", "ー", "is", "高", "い", "."]
        );
        assert_eq!(count(""), 0);
        assert_eq!(count("   "), 0);
    }

    #[test]
    fn pieces_concatenate_to_the_text() {
        for text in ["", " ", "a", " lead and trail ", "东京 x\ny  ", "one"] {
            assert_eq!(pieces(text).concat(), text, "{text:?}");
        }
    }

    #[test]
    fn healthy_answers_quote_only_the_prompt() {
        let mut rng = StdRng::seed_from_u64(1);
        let parts = vec![
            "You are helpful.".to_string(),
            "How do I repot a fern? It has outgrown its pot.".to_string(),
        ];
        for _ in 0..20 {
            let a = healthy(&parts, &mut rng);
            assert!(a.contains("How do I repot a fern?"), "{a}");
        }
        assert_eq!(
            sentences("Mail jane@mail.com. Pi is 3.14! Ok?\n東京。"),
            ["Mail jane@mail.com", "Pi is 3.14", "Ok", "東京"]
        );
        assert!(healthy(&[], &mut rng).starts_with("I could not read"));
    }
}
