use std::collections::HashSet;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use super::*;

const ENGLISH: &str = include_str!("testdata/english.txt");
const CHINESE: &str = include_str!("testdata/chinese.txt");

fn fp() -> Fingerprinter {
    Fingerprinter::new([42; 32], FingerprintParams::default())
}

fn toks(f: &Fingerprinter, s: &str) -> Vec<Token> {
    let mut v = Vec::new();
    f.tokens(s, &mut v);
    v
}

fn hashes(f: &Fingerprinter, s: &str) -> Vec<u64> {
    toks(f, s).iter().map(|t| t.hash).collect()
}

fn pieces<'a>(s: &'a str, t: &[Token]) -> Vec<&'a str> {
    t.iter().map(|t| &s[t.start..t.end]).collect()
}

fn classes(t: &[Token]) -> Vec<TokenClass> {
    t.iter().map(|t| t.class).collect()
}

// === normalisation ===

#[test]
fn case_punctuation_and_whitespace_do_not_matter() {
    let f = fp();
    let a = hashes(&f, "Hello,   world!");
    assert_eq!(a.len(), 2);
    assert_eq!(a, hashes(&f, "hello world"));
    assert_eq!(a, hashes(&f, "HELLO\n\n\t-- WoRlD ..."));
    assert_eq!(a, hashes(&f, "« hello » — (world)"));
    assert_ne!(a, hashes(&f, "world hello"));
    // Punctuation inside a UAX#29 word is not part of the hash either.
    assert_eq!(hashes(&f, "don't"), hashes(&f, "don’t"));
    assert_eq!(hashes(&f, "co\u{AD}operate"), hashes(&f, "cooperate"));
}

#[test]
fn nfkc_and_full_case_folding() {
    let f = fp();
    assert_eq!(hashes(&f, "ＡＢＣ"), hashes(&f, "abc"));
    assert_eq!(
        hashes(&f, "ｈｅｌｌｏ ｗｏｒｌｄ"),
        hashes(&f, "hello world")
    );
    assert_eq!(hashes(&f, "１２３"), hashes(&f, "123"));
    // é composed (U+00E9) and decomposed (e + U+0301).
    assert_eq!(hashes(&f, "caf\u{E9}"), hashes(&f, "cafe\u{301}"));
    assert_eq!(hashes(&f, "CAFÉ"), hashes(&f, "café"));
    assert_ne!(hashes(&f, "café"), hashes(&f, "cafe"), "accents are kept");
    // Full case folding: ß = ss, ﬁ ligature = fi, Greek final sigma.
    assert_eq!(hashes(&f, "STRASSE"), hashes(&f, "straße"));
    assert_eq!(hashes(&f, "ﬁle"), hashes(&f, "file"));
    assert_eq!(hashes(&f, "ΟΔΟΣ"), hashes(&f, "οδος"));
    assert_eq!(hashes(&f, "οδος"), hashes(&f, "οδοσ"));
    // CJK compatibility forms.
    assert_eq!(hashes(&f, "ｶﾞｷﾞ"), hashes(&f, "ガギ"));
    assert_eq!(hashes(&f, "\u{F900}"), hashes(&f, "\u{8C48}"));
    // Hangul precomposed vs conjoining jamo.
    assert_eq!(
        hashes(&f, "한국"),
        hashes(&f, "\u{1112}\u{1161}\u{11AB}\u{1100}\u{116E}\u{11A8}")
    );
    assert_eq!(
        toks(&f, "\u{1112}\u{1161}\u{11AB}\u{1100}\u{116E}\u{11A8}").len(),
        2
    );
}

#[test]
fn different_keys_give_different_hashes() {
    let a = Fingerprinter::new([1; 32], FingerprintParams::default());
    let b = Fingerprinter::new([2; 32], FingerprintParams::default());
    let ha = hashes(&a, "the quick brown fox 我们");
    let hb = hashes(&b, "the quick brown fox 我们");
    assert_eq!(ha.len(), 6);
    assert!(ha.iter().zip(&hb).all(|(x, y)| x != y));
    let sa: Vec<u64> = a.fingerprints(ENGLISH).iter().map(|s| s.hash).collect();
    let sb: HashSet<u64> = b.fingerprints(ENGLISH).iter().map(|s| s.hash).collect();
    assert!(sa.iter().all(|h| !sb.contains(h)));
    // Same key, same result: fingerprints are comparable across processes.
    let a2 = Fingerprinter::new([1; 32], FingerprintParams::default());
    assert_eq!(ha, hashes(&a2, "the quick brown fox 我们"));
}

// === tokenisation ===

#[test]
fn offsets_point_into_the_original_text() {
    let f = fp();
    for text in [
        ENGLISH,
        CHINESE,
        "  «Ｈｅｌｌｏ», said Zoë — 我们 use Rust 语言 (ภาษาไทย)! ",
        "cafe\u{301} naïve résumé",
    ] {
        let t = toks(&f, text);
        assert!(!t.is_empty());
        let mut prev_end = 0;
        for tok in &t {
            assert!(tok.start < tok.end && tok.end <= text.len());
            assert!(tok.start >= prev_end, "tokens in order, not overlapping");
            prev_end = tok.end;
            let piece = &text[tok.start..tok.end];
            // The span alone tokenises to the same single token.
            let again = toks(&f, piece);
            assert_eq!(again.len(), 1, "{piece:?}");
            assert_eq!(again[0].hash, tok.hash, "{piece:?}");
            assert_eq!(again[0].class, tok.class);
        }
    }
    let text = "Hello,   world!";
    assert_eq!(pieces(text, &toks(&f, text)), ["Hello", "world"]);
}

#[test]
fn cjk_is_one_token_per_character() {
    use TokenClass::*;
    let f = fp();
    let s = "我们使用语言。";
    let t = toks(&f, s);
    assert_eq!(pieces(s, &t), ["我", "们", "使", "用", "语", "言"]);
    assert!(t.iter().all(|t| t.class == Cjk));
    // UAX#29 keeps Katakana and Hangul runs together; we do not.
    let s = "カタカナとひらがな";
    assert_eq!(
        pieces(s, &toks(&f, s)),
        ["カ", "タ", "カ", "ナ", "と", "ひ", "ら", "が", "な"]
    );
    let s = "한국어 텍스트";
    assert_eq!(
        pieces(s, &toks(&f, s)),
        ["한", "국", "어", "텍", "스", "트"]
    );
    // Combining voicing mark stays with its kana.
    let s = "か\u{3099}き";
    assert_eq!(pieces(s, &toks(&f, s)), ["か\u{3099}", "き"]);
    assert_eq!(hashes(&f, "か\u{3099}"), hashes(&f, "が"));
}

#[test]
fn thai_and_other_no_space_scripts_are_per_character_with_marks_attached() {
    let f = fp();
    let s = "ภาษาไทยง่ายมาก";
    let t = toks(&f, s);
    assert_eq!(
        pieces(s, &t),
        [
            "ภ",
            "า",
            "ษ",
            "า",
            "ไ",
            "ท",
            "ย",
            "ง\u{E48}",
            "า",
            "ย",
            "ม",
            "า",
            "ก"
        ]
    );
    assert!(t.iter().all(|t| t.class == TokenClass::Cjk));
    for s in ["ລາວ", "ខ្មែរ", "မြန်မာ"] {
        let t = toks(&f, s);
        assert!(t.len() >= 2, "{s}: {:?}", pieces(s, &t));
        assert!(t.iter().all(|t| t.class == TokenClass::Cjk));
        // No token is a lone mark.
        for p in pieces(s, &t) {
            let c = p.chars().next().unwrap();
            assert!(!unicode_normalization::char::is_combining_mark(c), "{p:?}");
        }
    }
}

#[test]
fn mixed_scripts() {
    use TokenClass::*;
    let f = fp();
    let s = "我们 use Rust 语言，2024年3月发布了v1.80版本";
    let t = toks(&f, s);
    assert_eq!(
        pieces(s, &t),
        [
            "我", "们", "use", "Rust", "语", "言", "2024", "年", "3", "月", "发", "布", "了",
            "v1.80", "版", "本"
        ]
    );
    assert_eq!(
        classes(&t),
        [Cjk, Cjk, Word, Word, Cjk, Cjk, Word, Cjk, Word, Cjk, Cjk, Cjk, Cjk, Word, Cjk, Cjk]
    );
    // Cyrillic, Greek, Arabic, Hebrew, Devanagari are space-delimited words.
    for s in [
        "привет мир",
        "γειά σου",
        "مرحبا بالعالم",
        "שלום עולם",
        "नमस्ते दुनिया",
    ] {
        let t = toks(&f, s);
        assert_eq!(t.len(), 2, "{s}: {:?}", pieces(s, &t));
        assert!(t.iter().all(|t| t.class == Word));
    }
}

// === shingles ===

#[test]
fn shingles_are_ordered_per_class_and_never_span_a_class_change() {
    let f = fp();
    let p = f.params().clone();
    let s = "one two three four five six seven";
    let t = toks(&f, s);
    let mut sh = Vec::new();
    f.shingles(&t, &mut sh);
    assert_eq!(sh.len(), t.len() - p.word_k + 1);
    assert!(sh
        .iter()
        .enumerate()
        .all(|(i, s)| s.first as usize == i && s.len as usize == p.word_k));
    // Order matters.
    let mut sh2 = Vec::new();
    f.shingles(&toks(&f, "two one three four five six seven"), &mut sh2);
    assert_ne!(sh[0].hash, sh2[0].hash);
    assert_eq!(sh[2].hash, sh2[2].hash);

    // Mixed: every shingle covers tokens of one class only.
    let s = "第3章介绍了Rust的所有权和借用规则，以及生命周期的基本概念和常见的错误写法 and then some English words follow here";
    let t = toks(&f, s);
    let mut sh = Vec::new();
    f.shingles(&t, &mut sh);
    for x in &sh {
        let span = &t[x.first as usize..x.first as usize + x.len as usize];
        assert!(span.iter().all(|t| t.class == x.class));
        assert!(x.len as usize <= p.k(x.class));
    }
    // "介绍了" (3 chars between "3" and "Rust") is a short run: one shingle
    // iff ⌈k/2⌉ ≤ 3; "的所有权…" is long.
    assert!(sh
        .iter()
        .any(|x| x.class == TokenClass::Cjk && x.len as usize == p.cjk_k));
    assert!(sh
        .iter()
        .any(|x| x.class == TokenClass::Word && x.len as usize == p.word_k));
}

#[test]
fn short_runs() {
    let f = Fingerprinter::new(
        [3; 32],
        FingerprintParams {
            word_k: 6,
            word_w: 4,
            cjk_k: 6,
            cjk_w: 4,
        },
    );
    let sh = |s: &str| {
        let mut v = Vec::new();
        f.shingles(&toks(&f, s), &mut v);
        v
    };
    assert!(sh("").is_empty());
    assert!(sh("one").is_empty());
    assert!(sh("one two").is_empty(), "below ⌈k/2⌉ = 3");
    let three = sh("one two three");
    assert_eq!(three.len(), 1);
    assert_eq!((three[0].first, three[0].len), (0, 3));
    assert_eq!(sh("one two three four five").len(), 1);
    assert_eq!(sh("one two three four five six").len(), 1);
    assert_eq!(sh("one two three four five six seven").len(), 2);
    // A short run differs from the first k tokens of a longer run.
    assert_ne!(sh("a b c d e")[0].hash, sh("a b c d e f")[0].hash);
    // Runs between CJK: 年 alone gives nothing, 我们的 (3) gives one.
    let v = sh("2024年我们的 x");
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].class, TokenClass::Cjk);
}

// === winnowing guarantee ===

/// Random vocabulary words (a small vocabulary, so chance repeats happen).
fn random_words(rng: &mut impl Rng, n: usize, vocab: &[&str]) -> Vec<String> {
    (0..n)
        .map(|_| vocab[rng.gen_range(0..vocab.len())].to_string())
        .collect()
}

/// Two texts share exactly a run of w+k−1 tokens at random places; the store
/// side (winnowed) of one and the query side (all shingles) of the other must
/// have a common hash on a shingle that lies inside the shared run on both
/// sides.
fn check_guarantee(f: &Fingerprinter, class: TokenClass, seed: u64, rounds: usize) {
    let words: Vec<&str> = ENGLISH
        .split_whitespace()
        .filter(|w| w.chars().all(|c| c.is_ascii_alphabetic()))
        .collect();
    let chars: Vec<String> = CHINESE
        .chars()
        .filter(|c| super::tokenize::is_cjk_class(*c))
        .map(String::from)
        .collect();
    let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
    let (vocab, sep) = match class {
        TokenClass::Word => (&words[..], " "),
        TokenClass::Cjk => (&chars[..], ""),
    };
    let run = f.params().guaranteed_run(class);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for round in 0..rounds {
        let shared = random_words(&mut rng, run, vocab);
        let mk = |rng: &mut rand::rngs::StdRng| {
            let n = rng.gen_range(0..40);
            let pre = random_words(rng, n, vocab);
            let n = rng.gen_range(0..40);
            let post = random_words(rng, n, vocab);
            // "|" separates without changing class, so the shared run is
            // exactly `run` tokens of shared content bounded by other tokens.
            let text = format!(
                "{}{sep}|{sep}{}{sep}|{sep}{}",
                pre.join(sep),
                shared.join(sep),
                post.join(sep)
            );
            (text, pre.len())
        };
        let (a, a_at) = mk(&mut rng);
        let (b, b_at) = mk(&mut rng);
        let (ta, tb) = (toks(f, &a), toks(f, &b));
        let mut sa = Vec::new();
        f.shingles(&ta, &mut sa);
        let mut stored = Vec::new();
        f.winnow(&sa, &mut stored);
        let mut query = Vec::new();
        f.shingles(&tb, &mut query);
        let inside = |s: &Shingle, at: usize| {
            s.first as usize >= at && s.first as usize + s.len as usize <= at + run
        };
        let found = stored.iter().filter(|s| inside(s, a_at)).any(|s| {
            query.iter().any(|q| {
                q.hash == s.hash
                    && inside(q, b_at)
                    && q.first - b_at as u32 == s.first - a_at as u32
            })
        });
        assert!(
            found,
            "round {round}: shared run of {run} {class:?} tokens not found\nA: {a}\nB: {b}"
        );
    }
}

#[test]
fn winnowing_finds_every_shared_run_of_w_plus_k_minus_1() {
    let f = fp();
    check_guarantee(&f, TokenClass::Word, 1, 300);
    check_guarantee(&f, TokenClass::Cjk, 2, 300);
    for (k, w) in [(1, 1), (2, 5), (4, 9), (7, 3), (3, 18)] {
        let f = Fingerprinter::new(
            [9; 32],
            FingerprintParams {
                word_k: k,
                word_w: w,
                cjk_k: k,
                cjk_w: w,
            },
        );
        check_guarantee(&f, TokenClass::Word, k as u64 * 100 + w as u64, 60);
        check_guarantee(&f, TokenClass::Cjk, k as u64 * 1000 + w as u64, 60);
    }
}

#[test]
fn winnowing_keeps_about_two_over_w_plus_one() {
    let f = fp();
    let t = toks(&f, ENGLISH);
    let mut sh = Vec::new();
    f.shingles(&t, &mut sh);
    let mut kept = Vec::new();
    f.winnow(&sh, &mut kept);
    let expected = 2.0 / (f.params().word_w as f64 + 1.0);
    let got = kept.len() as f64 / sh.len() as f64;
    assert!(
        (got - expected).abs() < 0.06,
        "density {got:.3} vs {expected:.3}"
    );
    // Kept shingles come out in order and are a subset.
    assert!(kept.windows(2).all(|p| p[0].first < p[1].first));
    let all: HashSet<(u32, u64)> = sh.iter().map(|s| (s.first, s.hash)).collect();
    assert!(kept.iter().all(|s| all.contains(&(s.first, s.hash))));
}

// === density: the measurement behind the defaults ===

/// Documents of a sample (separated by `---` lines).
fn docs(sample: &str) -> Vec<&str> {
    sample
        .split("\n---\n")
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect()
}

struct Density {
    /// Stored fingerprints per KB of text.
    per_kb: f64,
    /// Shingles per KB of text that also occur (anywhere, before winnowing)
    /// in another, unrelated document of the sample: the chance-match rate.
    shared_per_kb: f64,
    /// Of those, the ones that hit the other documents' *stores*.
    hits_per_kb: f64,
}

/// Averaged over 8 keys: which shingle is a window's minimum depends on the
/// key, and on a sample this small one key's luck shows in the third digit.
fn measure(sample: &str, p: FingerprintParams) -> Density {
    let runs: Vec<Density> = (1..=8u8)
        .map(|k| measure_key(sample, p.clone(), [k; 32]))
        .collect();
    let n = runs.len() as f64;
    Density {
        per_kb: runs.iter().map(|d| d.per_kb).sum::<f64>() / n,
        shared_per_kb: runs.iter().map(|d| d.shared_per_kb).sum::<f64>() / n,
        hits_per_kb: runs.iter().map(|d| d.hits_per_kb).sum::<f64>() / n,
    }
}

fn measure_key(sample: &str, p: FingerprintParams, key: [u8; 32]) -> Density {
    let f = Fingerprinter::new(key, p);
    let d = docs(sample);
    let all: Vec<Vec<Shingle>> = d
        .iter()
        .map(|t| {
            let mut q = Vec::new();
            f.shingles(&toks(&f, t), &mut q);
            q
        })
        .collect();
    let stores: Vec<HashSet<u64>> = all
        .iter()
        .map(|q| {
            let mut kept = Vec::new();
            f.winnow(q, &mut kept);
            kept.iter().map(|s| s.hash).collect()
        })
        .collect();
    let sets: Vec<HashSet<u64>> = all
        .iter()
        .map(|q| q.iter().map(|s| s.hash).collect())
        .collect();
    let stored: usize = stores.iter().map(HashSet::len).sum();
    let bytes: usize = d.iter().map(|t| t.len()).sum();
    let (mut shared, mut hits) = (0usize, 0usize);
    for (i, q) in all.iter().enumerate() {
        let other = |v: &[HashSet<u64>], h: u64| {
            v.iter().enumerate().any(|(j, s)| j != i && s.contains(&h))
        };
        shared += q.iter().filter(|s| other(&sets, s.hash)).count();
        hits += q.iter().filter(|s| other(&stores, s.hash)).count();
    }
    let kb = bytes as f64 / 1024.0;
    Density {
        per_kb: stored as f64 / kb,
        shared_per_kb: shared as f64 / kb,
        hits_per_kb: hits as f64 / kb,
    }
}

/// Bytes of store per KB of text, at 24 B per fingerprint.
const BYTES_PER_FP: f64 = 24.0;

#[test]
fn default_density_is_at_most_1kb_per_kb() {
    let p = FingerprintParams::default();
    assert!(p.guaranteed_run(TokenClass::Word) <= 12);
    assert!(p.guaranteed_run(TokenClass::Cjk) <= 20);
    for (name, sample) in [("english", ENGLISH), ("chinese", CHINESE)] {
        for key in 1..=8u8 {
            let d = measure_key(sample, p.clone(), [key; 32]);
            let b = d.per_kb * BYTES_PER_FP;
            assert!(
                b <= 1024.0,
                "{name}, key {key}: {b:.0} B of fingerprints per KB"
            );
        }
    }
}

/// Prints the table quoted in `FingerprintParams::default`:
/// `cargo test --lib fingerprint::tests::density_table -- --ignored --nocapture`.
#[test]
#[ignore = "measurement; prints a table"]
fn density_table() {
    println!(
        "sample: english {} B, chinese {} B",
        ENGLISH.len(),
        CHINESE.len()
    );
    println!("| class | k | w | w+k-1 | fp/KB | B/KB | shared k-grams/KB | store hits/KB |");
    println!("|---|---|---|---|---|---|---|---|");
    for (k, w) in [(2, 11), (3, 10), (4, 9), (5, 8), (6, 7), (7, 6), (8, 5)] {
        let d = measure(
            ENGLISH,
            FingerprintParams {
                word_k: k,
                word_w: w,
                ..Default::default()
            },
        );
        println!(
            "| word | {k} | {w} | {} | {:.1} | {:.0} | {:.2} | {:.2} |",
            w + k - 1,
            d.per_kb,
            d.per_kb * BYTES_PER_FP,
            d.shared_per_kb,
            d.hits_per_kb
        );
    }
    for (k, w) in [
        (2, 19),
        (3, 18),
        (4, 17),
        (5, 16),
        (6, 15),
        (7, 14),
        (8, 13),
        (10, 11),
    ] {
        let d = measure(
            CHINESE,
            FingerprintParams {
                cjk_k: k,
                cjk_w: w,
                ..Default::default()
            },
        );
        println!(
            "| cjk | {k} | {w} | {} | {:.1} | {:.0} | {:.2} | {:.2} |",
            w + k - 1,
            d.per_kb,
            d.per_kb * BYTES_PER_FP,
            d.shared_per_kb,
            d.hits_per_kb
        );
    }
}

// === streaming ===

fn stream(f: &Fingerprinter, parts: &[&str]) -> Vec<Token> {
    let mut st = StreamTokenizer::new(f);
    let mut out = Vec::new();
    for p in parts {
        st.push(p, &mut out);
    }
    st.finish(&mut out);
    out
}

const STREAM_TEXTS: &[&str] = &[
    "Hello,   world! can't won’t 3.14 e.g. foo_bar x",
    "我们 use Rust 语言，2024年3月发布了v1.80版本。「引号」（括号）！？",
    "カタカナとひらがなｶﾞ 한국어 텍스트 ภาษาไทยง่ายมาก ลาว",
    "a'b'c 1,2,3 1.2.3 a:b:c \"q\" שלום\"ע x--y (z) [w] {v} a/b @c #d $5 %",
    "cafe\u{301} e\u{301}\u{302}x 👨\u{200D}👩\u{200D}👧 🇺🇸🇫🇷 a\u{200B}b c\u{200D}d \u{FE0F}e",
    "line\r\nbreaks\n\nand\ttabs\u{3000}全角空格\u{A0}nbsp 漢\u{FE00}字",
];

fn char_splits(s: &str) -> Vec<usize> {
    s.char_indices().map(|(i, _)| i).chain([s.len()]).collect()
}

#[test]
fn stream_matches_batch_for_every_split_point() {
    let f = fp();
    for text in STREAM_TEXTS {
        let batch = toks(&f, text);
        // One split, everywhere.
        for &i in &char_splits(text) {
            assert_eq!(
                stream(&f, &[&text[..i], &text[i..]]),
                batch,
                "{text:?} split at {i}"
            );
        }
        // Two splits, everywhere.
        let cs = char_splits(text);
        for (x, &i) in cs.iter().enumerate() {
            for &j in &cs[x..] {
                assert_eq!(
                    stream(&f, &[&text[..i], &text[i..j], &text[j..]]),
                    batch,
                    "{text:?} split at {i},{j}"
                );
            }
        }
        // One character at a time.
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let parts: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(stream(&f, &parts), batch, "{text:?} char by char");
    }
}

#[test]
fn stream_matches_batch_on_random_splits_of_the_samples() {
    let f = fp();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for text in [ENGLISH, CHINESE] {
        let batch = toks(&f, text);
        let cs = char_splits(text);
        for _ in 0..20 {
            let mut cuts: Vec<usize> = (0..rng.gen_range(1..200))
                .map(|_| cs[rng.gen_range(0..cs.len())])
                .collect();
            cuts.sort_unstable();
            let mut parts = Vec::new();
            let mut prev = 0;
            for c in cuts.into_iter().chain([text.len()]) {
                parts.push(&text[prev..c]);
                prev = c;
            }
            assert_eq!(stream(&f, &parts), batch);
        }
    }
}

#[test]
fn stream_emits_early_and_holds_back_little() {
    let f = fp();
    let mut st = StreamTokenizer::new(&f);
    let mut out = Vec::new();
    st.push("Hello wor", &mut out);
    assert_eq!(out.len(), 1, "Hello is complete, wor is not");
    st.push("ld and", &mut out);
    assert_eq!(out.len(), 2);
    assert_eq!(st.pending_len(), 3);
    st.push("我们使用", &mut out);
    // "and" ends at a Han character: complete; 用 may still take a mark.
    assert_eq!(out.len(), 6);
    st.finish(&mut out);
    assert_eq!(out.len(), 7);
    assert_eq!(st.pending_len(), 0);
    assert_eq!(st.offset(), "Hello world and我们使用".len());
    assert!(!format!("{st:?}").contains("Hello"));
}

// === hostile input ===

fn timed<T>(what: &str, limit: Duration, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    let e = t.elapsed();
    assert!(e < limit, "{what}: {e:?}");
    r
}

#[test]
fn hostile_input_does_not_panic_and_stays_linear() {
    let f = fp();
    let mb = 1 << 20;
    // Generous limits: debug build on a shared machine. Quadratic behaviour
    // on 1 MB would take minutes, not seconds.
    let limit = Duration::from_secs(20);
    assert!(f.fingerprints("").is_empty());
    assert!(stream(&f, &["", ""]).is_empty());

    let word = "a".repeat(mb);
    let t = timed("1 MB word", limit, || toks(&f, &word));
    assert_eq!(t.len(), 1);
    assert_eq!((t[0].start, t[0].end), (0, mb));
    assert_eq!(f.fingerprints(&word).len(), 0, "one token is no shingle");
    let parts: Vec<&str> = word
        .as_bytes()
        .chunks(100)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    assert_eq!(timed("1 MB word streamed", limit, || stream(&f, &parts)), t);

    let nonascii = "é".repeat(mb / 2);
    assert_eq!(
        timed("1 MB non-ASCII word", limit, || toks(&f, &nonascii)).len(),
        1
    );

    for unit in [
        ".", "'", ":", ",.", "!?", "\u{200B}", "\u{200D}", "\u{301}", "🇺", "👍🏽", "\u{FEFF}",
    ] {
        let s = unit.repeat(mb / unit.len());
        timed(unit, limit, || {
            let fps = f.fingerprints(&s);
            assert!(fps.len() <= 1, "{unit:?}");
        });
    }
    // Repetitive text: robust winnowing keeps ~1 per window, not 1 per shingle.
    let ha = "ha ".repeat(mb / 3);
    let fps = timed("ha ha ha", limit, || f.fingerprints(&ha));
    assert!(
        fps.len() < mb / 3 / (f.params().word_w) + 2,
        "{}",
        fps.len()
    );
    // Mixed oddities, streamed in small pieces.
    let odd = "שלום עולם مرحبا \u{202E}reversed\u{202C} a\u{301}\u{302}\u{303} 🇺🇸 \u{FFFD}\u{FFFF}\u{E000}\u{10FFFF}\u{FEFF} z̷̢͎a̴l̶g̵o̸ ".repeat(2000);
    let batch = timed("odd batch", limit, || toks(&f, &odd));
    let chars: Vec<String> = odd
        .chars()
        .collect::<Vec<_>>()
        .chunks(7)
        .map(|c| c.iter().collect())
        .collect();
    let parts: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(timed("odd streamed", limit, || stream(&f, &parts)), batch);
    let mut sh = Vec::new();
    f.shingles(&batch, &mut sh);
    let mut kept = Vec::new();
    f.winnow(&sh, &mut kept);
    assert!(!kept.is_empty());
}

#[test]
fn params_are_clamped() {
    let f = Fingerprinter::new(
        [0; 32],
        FingerprintParams {
            word_k: 0,
            word_w: 0,
            cjk_k: 1000,
            cjk_w: 100_000,
        },
    );
    assert_eq!(
        *f.params(),
        FingerprintParams {
            word_k: 1,
            word_w: 1,
            cjk_k: 64,
            cjk_w: 256
        }
    );
    assert!(!f.fingerprints("a b 我").is_empty());
    assert!(!format!("{f:?}").contains("k0"));
}

// === the fast tokeniser equals the reference ===

fn reference(f: &Fingerprinter, s: &str) -> Vec<Token> {
    let mut v = Vec::new();
    super::tokenize::tokenize_segments(&f.token_hasher(), s, 0, &mut v);
    v
}

#[test]
fn fast_tokenizer_equals_plain_uax29_on_random_mixed_text() {
    let f = fp();
    for text in STREAM_TEXTS.iter().chain([&ENGLISH, &CHINESE]) {
        assert_eq!(toks(&f, text), reference(&f, text), "{text:?}");
    }
    // Random strings from a palette of every kind of character the rules
    // care about: letters, digits, mid-word punctuation, hard punctuation,
    // whitespace, Han, kana, Hangul, Thai and its marks, combining marks,
    // joiners, variation selectors, emoji, regional indicators, Hebrew.
    let palette: Vec<&str> = vec![
        "a", "Z", "7", "'", "’", ".", ",", ":", ";", "_", "\"", "-", "!", "(", " ", "\n", "\t",
        "\u{3000}", "我", "们", "。", "，", "「", "カ", "ｶ", "ﾞ", "が", "\u{3099}", "한", "ภ",
        "\u{E48}", "\u{E31}", "é", "\u{301}", "\u{200D}", "\u{200B}", "\u{FE0F}", "\u{FE00}", "👍",
        "🏽", "🇺", "א", "\u{AD}", "Ａ", "١", "\u{F900}", "𠀀", "\r", "\u{85}", "\u{2028}",
        "\u{A0}", "ー", "・", "ๆ",
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for _ in 0..3000 {
        let n = rng.gen_range(0..24);
        let s: String = (0..n)
            .map(|_| palette[rng.gen_range(0..palette.len())])
            .collect();
        assert_eq!(toks(&f, &s), reference(&f, &s), "{s:?}");
        // And streamed, in random pieces.
        let cs = char_splits(&s);
        let mut cuts: Vec<usize> = (0..rng.gen_range(0..6))
            .map(|_| cs[rng.gen_range(0..cs.len())])
            .collect();
        cuts.sort_unstable();
        let mut parts = Vec::new();
        let mut prev = 0;
        for c in cuts.into_iter().chain([s.len()]) {
            parts.push(&s[prev..c]);
            prev = c;
        }
        assert_eq!(stream(&f, &parts), reference(&f, &s), "{s:?} as {parts:?}");
    }
}

#[test]
fn han_fast_path_hashes_like_the_full_normalisation() {
    let h = fp().token_hasher();
    let ranges = [
        0x4E00..=0x9FFF,
        0x3400..=0x4DBF,
        0x20000..=0x2A6DF,
        0x2A700..=0x2EBEF,
        0x30000..=0x323AF,
    ];
    let mut n = 0;
    for r in ranges {
        for u in r {
            let Some(c) = char::from_u32(u) else { continue };
            assert!(super::tokenize::is_plain_han(c));
            if (0x4E00..=0x9FFF).contains(&u) || (0x3400..=0x4DBF).contains(&u) {
                assert!(c.is_alphanumeric(), "U+{u:X} assumed assigned");
            }
            if !c.is_alphanumeric() {
                continue; // unassigned: no token either way
            }
            let s = c.to_string();
            assert_eq!(Some(h.hash_plain(&s)), h.hash_unicode(&s), "U+{u:X}");
            n += 1;
        }
    }
    assert!(n > 90_000, "{n}");
}
