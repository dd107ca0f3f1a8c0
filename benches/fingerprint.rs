//! Fingerprint throughput: MB/s of one core for tokens, tokens + shingles
//! (the query side, run on every response byte), tokens + shingles + winnow
//! (the store side), and the streaming tokenizer fed small deltas, on English
//! and Chinese prose.
//!
//! `cargo bench --bench fingerprint` (env: SECONDS per measurement, default 1).

use std::hint::black_box;
use std::time::{Duration, Instant};

use residue::fingerprint::{FingerprintParams, Fingerprinter, StreamTokenizer};

const ENGLISH: &str = include_str!("../src/fingerprint/testdata/english.txt");
const CHINESE: &str = include_str!("../src/fingerprint/testdata/chinese.txt");

/// Runs `f` over `text` repeatedly for about `secs` and returns MB/s.
fn rate(text: &str, secs: f64, mut f: impl FnMut(&str)) -> f64 {
    f(text); // warm up
    let budget = Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut bytes = 0usize;
    while start.elapsed() < budget {
        f(text);
        bytes += text.len();
    }
    bytes as f64 / start.elapsed().as_secs_f64() / 1e6
}

fn main() {
    let secs: f64 = std::env::var("SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    let fp = Fingerprinter::new([7; 32], FingerprintParams::default());
    // ~1 MB of each: large enough that per-call overhead does not count.
    let english = ENGLISH.repeat((1 << 20) / ENGLISH.len() + 1);
    let chinese = CHINESE.repeat((1 << 20) / CHINESE.len() + 1);
    // LLM answers are typographic: curly apostrophes and dashes make the text
    // non-ASCII, which must not cost the ASCII fast path.
    let typographic = english
        .replace('\'', "\u{2019}")
        .replace(", and", " \u{2014} and");
    println!("fingerprint throughput, one core, params {:?}", fp.params());
    println!("| text | tokens | tokens+shingles | tokens+shingles+winnow | stream (32 B deltas)+shingles |");
    println!("|---|---|---|---|---|");
    for (name, text) in [
        ("english (ASCII)", &english),
        ("english (’ and —)", &typographic),
        ("chinese", &chinese),
    ] {
        let mut tokens = Vec::new();
        let mut shingles = Vec::new();
        let mut kept = Vec::new();
        let t = rate(text, secs, |s| {
            tokens.clear();
            fp.tokens(s, &mut tokens);
            black_box(&tokens);
        });
        let ts = rate(text, secs, |s| {
            tokens.clear();
            shingles.clear();
            fp.tokens(s, &mut tokens);
            fp.shingles(&tokens, &mut shingles);
            black_box(&shingles);
        });
        let tsw = rate(text, secs, |s| {
            tokens.clear();
            shingles.clear();
            kept.clear();
            fp.tokens(s, &mut tokens);
            fp.shingles(&tokens, &mut shingles);
            fp.winnow(&shingles, &mut kept);
            black_box(&kept);
        });
        // Deltas of ~32 bytes, cut on char boundaries, as an SSE stream gives.
        let mut deltas = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let mut end = (at + 32).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            deltas.push(&text[at..end]);
            at = end;
        }
        let st = rate(text, secs, |_| {
            tokens.clear();
            shingles.clear();
            let mut tk = StreamTokenizer::new(&fp);
            for d in &deltas {
                tk.push(d, &mut tokens);
            }
            tk.finish(&mut tokens);
            fp.shingles(&tokens, &mut shingles);
            black_box(&shingles);
        });
        println!("| {name} | {t:.0} MB/s | {ts:.0} MB/s | {tsw:.0} MB/s | {st:.0} MB/s |");
    }
}
