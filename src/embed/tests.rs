//! The embedder on a tiny randomly initialised BERT written at test time,
//! and on the real all-MiniLM-L6-v2 when `models/fetch` has installed it.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::bert::{BertModel, Config as BertConfig};
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::bert::BertProcessing;
use tokenizers::{
    PaddingParams, PaddingStrategy, Tokenizer, TruncationDirection, TruncationParams,
    TruncationStrategy,
};

use super::{EmbedError, Embedder, Pooling, StaticEmbedder};

/// A fresh directory under the system temp dir (no tempfile crate).
fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "residue-embed-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

const VOCAB: &[&str] = &[
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "man", "is", "eating", "food", "piece", "of", "bread",
    "the", "stock", "market", "fell", "sharply", "today", ".", ",", "cat", "sat", "on", "mat",
    "##s", "##ing",
];

/// The tiny model's positions: texts are truncated to this many tokens unless
/// `sentence_bert_config.json` says less.
const MAX_POSITIONS: usize = 64;
const HIDDEN: usize = 32;

/// A WordPiece tokenizer over `VOCAB` with BERT's normaliser, pre-tokenizer
/// and `[CLS] … [SEP]` post-processor. It is saved with truncation to 4
/// tokens and `Fixed(16)` padding, as real `tokenizer.json` files often are,
/// to prove that loading overrides both.
fn write_tokenizer(dir: &Path) {
    // A `vocab.txt` (one token a line, the id is the line number), as real
    // BERT folders ship next to `tokenizer.json`.
    let vocab_path = dir.join("vocab.txt");
    std::fs::write(&vocab_path, VOCAB.join("\n")).expect("vocab.txt");
    let model = WordPiece::from_file(vocab_path.to_str().expect("utf-8 temp path"))
        .unk_token("[UNK]".into())
        .build()
        .expect("wordpiece");
    let mut tokenizer = Tokenizer::new(model);
    tokenizer
        .with_normalizer(Some(BertNormalizer::default()))
        .with_pre_tokenizer(Some(BertPreTokenizer))
        .with_post_processor(Some(BertProcessing::new(
            ("[SEP]".into(), 3),
            ("[CLS]".into(), 2),
        )))
        .with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::Fixed(16),
            ..PaddingParams::default()
        }));
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length: 4,
            strategy: TruncationStrategy::LongestFirst,
            stride: 0,
            direction: TruncationDirection::Right,
        }))
        .expect("truncation");
    tokenizer
        .save(dir.join("tokenizer.json"), false)
        .expect("save tokenizer");
}

fn write_pooling(dir: &Path, pooling: Pooling) {
    std::fs::create_dir_all(dir.join("1_Pooling")).expect("pooling dir");
    let config = serde_json::json!({
        "word_embedding_dimension": HIDDEN,
        "pooling_mode_cls_token": pooling == Pooling::Cls,
        "pooling_mode_mean_tokens": pooling == Pooling::Mean,
        "pooling_mode_max_tokens": false,
        "pooling_mode_mean_sqrt_len_tokens": false
    });
    std::fs::write(dir.join("1_Pooling/config.json"), config.to_string()).expect("pooling");
}

/// A complete tiny sentence-transformers folder with random weights:
/// hidden 32, 2 layers, 2 heads, intermediate 64.
pub(crate) fn tiny_model(tag: &str, pooling: Pooling) -> PathBuf {
    let dir = temp_dir(tag);
    write_tokenizer(&dir);
    let config = serde_json::json!({
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": VOCAB.len(),
        "hidden_size": HIDDEN,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": MAX_POSITIONS,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0
    });
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
    let config: BertConfig = serde_json::from_value(config).expect("bert config");
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    BertModel::load(vb, &config).expect("random bert");
    varmap
        .save(dir.join("model.safetensors"))
        .expect("save weights");
    write_pooling(&dir, pooling);
    dir
}

pub(crate) fn load(dir: &Path) -> Embedder {
    Embedder::load_on(dir, Device::Cpu).expect("load tiny model")
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

const TEXTS: &[&str] = &[
    "A man is eating food.",
    "cat",
    "The stock market fell sharply today, the man sat on a mat.",
    "",
    "a piece of bread",
    "unknown words become unk tokens",
];

#[test]
fn vectors_have_the_model_dimension_and_unit_norm() {
    let embedder = load(&tiny_model("norm", Pooling::Mean));
    assert_eq!(embedder.dimension(), HIDDEN);
    assert_eq!(embedder.device_name(), "cpu");
    assert_eq!(embedder.pooling(), Pooling::Mean);
    let vectors = embedder.embed(TEXTS).expect("embed");
    assert_eq!(vectors.len(), TEXTS.len());
    for (text, v) in TEXTS.iter().zip(&vectors) {
        assert_eq!(v.len(), HIDDEN, "{text:?}");
        assert!(v.iter().all(|x| x.is_finite()), "{text:?}: {v:?}");
        let norm = dot(v, v).sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{text:?}: norm {norm}");
    }
}

#[test]
fn an_empty_batch_gives_no_vectors() {
    let embedder = load(&tiny_model("empty", Pooling::Mean));
    assert!(embedder.embed(&[]).expect("embed").is_empty());
}

/// Padding is masked out of attention and pooling: a text gets the same
/// vector alone as in a batch padded to a much longer text.
#[test]
fn a_batch_gives_the_same_vectors_as_one_text_at_a_time() {
    for pooling in [Pooling::Mean, Pooling::Cls] {
        let embedder = load(&tiny_model("batch", pooling));
        assert_batch_matches_one_at_a_time(&embedder, TEXTS, pooling);
    }
}

/// Every text of `texts` embedded in one call gets, in its place, the
/// vector it gets alone.
fn assert_batch_matches_one_at_a_time(embedder: &Embedder, texts: &[&str], pooling: Pooling) {
    let batched = embedder.embed(texts).expect("embed batch");
    assert_eq!(batched.len(), texts.len());
    for (text, b) in texts.iter().zip(&batched) {
        let alone = embedder.embed(&[text]).expect("embed one");
        let diff = max_abs_diff(&alone[0], b);
        assert!(diff < 1e-4, "{pooling:?} {text:?}: differs by {diff}");
    }
}

/// On the CPU a call is cut into micro-batches of about one length, each
/// padded only to its own longest text: 40 texts of 3 to 64 tokens make
/// several of them on any number of threads, and every text still gets the
/// vector it gets alone, in its place.
#[test]
fn a_mixed_batch_cut_into_micro_batches_gives_each_text_its_own_vector() {
    let words = VOCAB[4..].join(" ");
    let words: Vec<&str> = words.split(' ').collect();
    let texts: Vec<String> = (0..40)
        .map(|i| {
            let n = (i * 7) % 70; // 0 to 69 words: 2 to 64 tokens
            (0..n)
                .map(|k| words[(i + k) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    for pooling in [Pooling::Mean, Pooling::Cls] {
        let embedder = load(&tiny_model("micro", pooling));
        assert_batch_matches_one_at_a_time(&embedder, &refs, pooling);
    }
}

/// Micro-batches hold every text once, longest first, within the token
/// budget (or one text alone), and at most a `threads`-th of the texts.
#[test]
fn micro_batches_cover_every_text_once_within_the_budget() {
    use super::model::{micro_batches, CPU_MICRO_BATCH_TOKENS};
    let lens: Vec<usize> = (0..101).map(|i| 2 + (i * 37) % 255).collect();
    for threads in [1, 2, 3, 8, 200] {
        let groups = micro_batches(&lens, threads);
        let mut seen: Vec<usize> = groups.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..lens.len()).collect::<Vec<_>>(),
            "{threads} threads"
        );
        let most = lens.len().div_ceil(threads);
        let mut previous = usize::MAX;
        for g in &groups {
            assert!(!g.is_empty() && g.len() <= most, "{threads} threads: {g:?}");
            let longest = lens[g[0]];
            assert!(g.iter().all(|&i| lens[i] <= longest));
            assert!(longest <= previous, "longest first");
            previous = g.iter().map(|&i| lens[i]).min().unwrap_or(0);
            assert!(
                g.len() == 1 || g.len() * longest <= CPU_MICRO_BATCH_TOKENS,
                "{threads} threads: {} texts of up to {longest} tokens",
                g.len()
            );
        }
    }
    assert!(micro_batches(&[], 2).is_empty());
    assert_eq!(micro_batches(&[0, 0, 0], 1), vec![vec![0, 1, 2]]);
}

#[test]
fn identical_texts_have_cosine_one() {
    let embedder = load(&tiny_model("same", Pooling::Mean));
    let text = "a man is eating a piece of bread";
    let v = embedder
        .embed(&[text, "cat", text, "the stock market fell sharply today"])
        .expect("embed");
    assert!((dot(&v[0], &v[2]) - 1.0).abs() < 1e-5);
    let again = embedder.embed(&[text]).expect("embed");
    assert!((dot(&v[0], &again[0]) - 1.0).abs() < 1e-5);
    // Different texts are not the same vector.
    assert!(dot(&v[0], &v[1]) < 0.9999);
}

#[test]
fn cls_and_mean_pooling_differ_on_the_same_weights() {
    let dir = tiny_model("pooling", Pooling::Mean);
    let mean = load(&dir).embed(TEXTS).expect("mean");
    write_pooling(&dir, Pooling::Cls);
    let cls_embedder = load(&dir);
    assert_eq!(cls_embedder.pooling(), Pooling::Cls);
    let cls = cls_embedder.embed(TEXTS).expect("cls");
    for ((text, m), c) in TEXTS.iter().zip(&mean).zip(&cls) {
        assert!(max_abs_diff(m, c) > 1e-3, "{text:?}: CLS equals mean");
    }
}

/// The file's truncation to 4 tokens is replaced by the model's length:
/// texts that differ only after their second word embed differently.
#[test]
fn the_tokenizer_files_truncation_is_overridden() {
    let embedder = load(&tiny_model("trunc-file", Pooling::Mean));
    assert_eq!(embedder.max_seq_len(), MAX_POSITIONS);
    let v = embedder
        .embed(&["a man is eating food", "a man is eating bread"])
        .expect("embed");
    assert!(max_abs_diff(&v[0], &v[1]) > 1e-3);
}

/// Texts longer than the position embeddings are truncated, not an error.
#[test]
fn long_texts_are_truncated_to_the_positions() {
    let embedder = load(&tiny_model("long", Pooling::Mean));
    let long = "the cat sat on a mat . ".repeat(50); // 350 words
    let v = embedder.embed(&[&long, "cat"]).expect("embed long");
    assert_eq!(v[0].len(), HIDDEN);
    assert!((dot(&v[0], &v[0]).sqrt() - 1.0).abs() < 1e-5);
}

/// `count_tokens` is the length `embed` gives a text: special tokens
/// included, truncated to `max_seq_len()`.
#[test]
fn count_tokens_counts_special_tokens_and_truncates() {
    let embedder = load(&tiny_model("count", Pooling::Mean));
    assert_eq!(embedder.count_tokens("cat"), 3);
    assert_eq!(embedder.count_tokens(""), 2);
    assert_eq!(embedder.count_tokens("a man is eating food"), 7);
    let long = "the cat sat on a mat . ".repeat(50);
    assert_eq!(embedder.count_tokens(&long), MAX_POSITIONS);
}

/// `sentence_bert_config.json`'s `max_seq_length` wins over the positions:
/// only the first 8 tokens ([CLS], 6 words, [SEP]) count.
#[test]
fn max_seq_length_from_sentence_bert_config_truncates() {
    let dir = tiny_model("sbert", Pooling::Mean);
    std::fs::write(
        dir.join("sentence_bert_config.json"),
        r#"{"max_seq_length": 8, "do_lower_case": false}"#,
    )
    .expect("sbert config");
    let embedder = load(&dir);
    assert_eq!(embedder.max_seq_len(), 8);
    let v = embedder
        .embed(&[
            "a man is eating a piece of bread",
            "a man is eating a piece the stock market fell",
            "a man is eating food",
        ])
        .expect("embed");
    assert!(max_abs_diff(&v[0], &v[1]) < 1e-5);
    assert!(max_abs_diff(&v[0], &v[2]) > 1e-3);

    // And it never exceeds the positions.
    std::fs::write(
        dir.join("sentence_bert_config.json"),
        r#"{"max_seq_length": 4096}"#,
    )
    .expect("sbert config");
    assert_eq!(load(&dir).max_seq_len(), MAX_POSITIONS);
}

fn load_err(dir: &Path) -> EmbedError {
    Embedder::load_on(dir, Device::Cpu).expect_err("the folder is broken")
}

#[test]
fn a_missing_folder_or_file_is_named() {
    let nowhere = temp_dir("missing").join("nope");
    let err = load_err(&nowhere);
    assert!(
        matches!(
            err,
            EmbedError::MissingFile {
                file: "config.json",
                ..
            }
        ),
        "{err}"
    );

    for file in [
        "config.json",
        "tokenizer.json",
        "model.safetensors",
        "1_Pooling/config.json",
    ] {
        let dir = tiny_model("missing-file", Pooling::Mean);
        std::fs::remove_file(dir.join(file)).expect("remove");
        let err = load_err(&dir);
        match &err {
            EmbedError::MissingFile { file: f, .. } => assert_eq!(*f, file),
            other => panic!("{file}: wrong error {other}"),
        }
        assert!(err.to_string().contains(file), "{err}");
    }
}

#[test]
fn broken_files_give_errors_not_panics() {
    // Not JSON.
    let dir = tiny_model("bad-json", Pooling::Mean);
    std::fs::write(dir.join("config.json"), "{ not json").expect("write");
    let err = load_err(&dir);
    assert!(matches!(err, EmbedError::BadConfig { .. }), "{err}");
    assert!(err.to_string().contains("config.json"), "{err}");

    // JSON without the BERT fields.
    std::fs::write(dir.join("config.json"), r#"{"hidden_size": 32}"#).expect("write");
    let err = load_err(&dir);
    assert!(matches!(err, EmbedError::BadConfig { .. }), "{err}");

    // Heads that do not divide the hidden size.
    let dir = tiny_model("bad-heads", Pooling::Mean);
    edit_config(&dir, |c| c["num_attention_heads"] = 3.into());
    let err = load_err(&dir);
    assert!(matches!(err, EmbedError::BadConfig { .. }), "{err}");
    assert!(err.to_string().contains("num_attention_heads"), "{err}");

    // A config whose shapes do not match the weights.
    let dir = tiny_model("bad-shape", Pooling::Mean);
    edit_config(&dir, |c| c["intermediate_size"] = 128.into());
    let err = load_err(&dir);
    assert!(matches!(err, EmbedError::Weights { .. }), "{err}");

    // A tokenizer larger than the model's vocabulary.
    let dir = tiny_model("bad-vocab", Pooling::Mean);
    edit_config(&dir, |c| c["vocab_size"] = 10.into());
    let err = load_err(&dir);
    assert!(matches!(err, EmbedError::BadConfig { .. }), "{err}");
    assert!(err.to_string().contains("vocab_size"), "{err}");

    // Weights that are not safetensors.
    let dir = tiny_model("bad-weights", Pooling::Mean);
    std::fs::write(dir.join("model.safetensors"), b"not safetensors").expect("write");
    let err = load_err(&dir);
    assert!(matches!(err, EmbedError::Weights { .. }), "{err}");

    // A tokenizer that is not a tokenizer.
    let dir = tiny_model("bad-tokenizer", Pooling::Mean);
    std::fs::write(dir.join("tokenizer.json"), "[]").expect("write");
    let err = load_err(&dir);
    assert!(matches!(err, EmbedError::Tokenizer { .. }), "{err}");
}

#[test]
fn unsupported_pooling_is_refused() {
    let dir = tiny_model("bad-pooling", Pooling::Mean);
    let cases = [
        (
            r#"{"word_embedding_dimension": 32, "pooling_mode_max_tokens": true}"#,
            "max_tokens",
        ),
        (
            r#"{"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true}"#,
            "cls_token",
        ),
        (r#"{"word_embedding_dimension": 32}"#, "no pooling mode"),
    ];
    for (config, needle) in cases {
        std::fs::write(dir.join("1_Pooling/config.json"), config).expect("write");
        let err = load_err(&dir);
        assert!(
            matches!(err, EmbedError::UnsupportedPooling { .. }),
            "{config}: {err}"
        );
        assert!(err.to_string().contains(needle), "{config}: {err}");
    }
    // A pooling dimension that is not the model's.
    std::fs::write(
        dir.join("1_Pooling/config.json"),
        r#"{"word_embedding_dimension": 384, "pooling_mode_mean_tokens": true}"#,
    )
    .expect("write");
    let err = load_err(&dir);
    assert!(matches!(err, EmbedError::BadConfig { .. }), "{err}");
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
    edit(&mut config);
    std::fs::write(&path, config.to_string()).expect("write");
}

// === the real model ===

/// `models/all-MiniLM-L6-v2`, or `None` after a loud skip (a failure when
/// `RESIDUE_REQUIRE_ALL=1`).
pub(crate) fn real_model() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/all-MiniLM-L6-v2");
    if dir.join("model.safetensors").is_file() {
        return Some(dir);
    }
    if std::env::var("RESIDUE_REQUIRE_ALL").as_deref() == Ok("1") {
        panic!(
            "all-MiniLM-L6-v2 is required (RESIDUE_REQUIRE_ALL=1) but missing; run models/fetch"
        );
    }
    eprintln!(
        "\n!!!!! SKIPPED: all-MiniLM-L6-v2 is not installed; run models/fetch or this test proves nothing !!!!!\n"
    );
    None
}

#[test]
fn minilm_scores_paraphrases_high_and_unrelated_texts_low() {
    let Some(dir) = real_model() else { return };
    let embedder = Embedder::load_on(&dir, Device::Cpu).expect("load MiniLM");
    assert_eq!(embedder.dimension(), 384);
    assert_eq!(embedder.max_seq_len(), 256);
    assert_eq!(embedder.pooling(), Pooling::Mean);
    let texts = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The stock market fell sharply today.",
    ];
    let v = embedder.embed(&texts).expect("embed");
    let paraphrase = dot(&v[0], &v[1]);
    let unrelated = dot(&v[0], &v[2]);
    eprintln!("MiniLM cosine: paraphrase {paraphrase:.4}, unrelated {unrelated:.4}");
    assert!(paraphrase > 0.6, "paraphrase {paraphrase}");
    assert!(unrelated < 0.3, "unrelated {unrelated}");
    for (text, x) in texts.iter().zip(&v) {
        let alone = embedder.embed(&[text]).expect("embed one");
        let diff = max_abs_diff(&alone[0], x);
        assert!(diff < 1e-4, "{text:?}: batched differs by {diff}");
    }
}

/// Throughput on this machine's CPU. Run in release:
/// `cargo test --release --lib embed::tests::minilm_throughput -- --ignored --nocapture`.
#[test]
#[ignore = "measurement; prints a table"]
fn minilm_throughput() {
    let Some(dir) = real_model() else { return };
    let embedder = Embedder::load_on(&dir, Device::Cpu).expect("load MiniLM");
    // About 40 tokens, a typical chunk of an answer.
    let text = "The customer's order number 48213 shipped on Tuesday from the Denver \
                warehouse and should arrive before the end of the week, according to \
                the tracking page the support agent shared.";
    println!("threads {}", candle_core::utils::get_num_threads());
    println!("batch  ms/batch  ms/text");
    for batch in [1usize, 8, 32, 64] {
        let texts = vec![text; batch];
        embedder.embed(&texts).expect("warm up");
        let rounds = 5;
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            embedder.embed(&texts).expect("embed");
        }
        let ms = start.elapsed().as_secs_f64() * 1000.0 / rounds as f64;
        println!("{batch:5}  {ms:8.1}  {:7.2}", ms / batch as f64);
    }
}

// === the static table ===

#[test]
fn a_distilled_table_embeds_texts_to_unit_vectors() {
    let dir = tiny_model("static", Pooling::Mean);
    let embedder = load(&dir);
    let table = StaticEmbedder::distill(&embedder).expect("distill");
    assert_eq!(table.dimension(), embedder.dimension());
    let v = table
        .embed(&["the quick brown fox", "quick fox", ""])
        .expect("embed");
    for x in &v[..2] {
        let norm: f32 = x.iter().map(|a| a * a).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
    }
    // Nothing to average: the zero vector, similar to nothing.
    assert!(v[2].iter().all(|&x| x == 0.0));
    // Word order does not matter to a bag of tokens.
    let a = table.embed(&["quick fox", "fox quick"]).expect("embed");
    assert!(max_abs_diff(&a[0], &a[1]) < 1e-5);
    // Out-of-vocabulary ids are skipped, not a panic.
    let w = table.embed_ids(&[u32::MAX, 5]);
    assert_eq!(w.len(), table.dimension());
}

#[test]
fn the_static_table_is_cached_and_reused_until_the_model_changes() {
    let dir = tiny_model("static-cache", Pooling::Mean);
    let embedder = load(&dir);
    let first = StaticEmbedder::load_or_distill(&dir, &embedder).expect("distill");
    let cache = dir.join(super::static_table::CACHE_FILE);
    assert!(cache.is_file(), "the table is cached next to the model");
    let modified = std::fs::metadata(&cache).unwrap().modified().unwrap();
    let again = StaticEmbedder::load_or_distill(&dir, &embedder).expect("load");
    assert_eq!(
        std::fs::metadata(&cache).unwrap().modified().unwrap(),
        modified,
        "a current cache is read, not rewritten"
    );
    let text = ["quick brown fox"];
    // Stored as f16.
    let d = max_abs_diff(
        &first.embed(&text).unwrap()[0],
        &again.embed(&text).unwrap()[0],
    );
    assert!(d < 1e-2, "cached table differs by {d}");
    // A corrupt cache is redone, not an error.
    std::fs::write(&cache, b"not safetensors").unwrap();
    StaticEmbedder::load_or_distill(&dir, &embedder).expect("redistill");
    assert!(std::fs::read(&cache).unwrap().len() > 100);
}

#[test]
fn minilm_static_table_ranks_paraphrases_above_unrelated_texts() {
    let Some(dir) = real_model() else { return };
    let embedder = Embedder::load_on(&dir, Device::Cpu).expect("load MiniLM");
    let started = std::time::Instant::now();
    let table = StaticEmbedder::load_or_distill(&dir, &embedder).expect("static table");
    eprintln!("static table ready in {:?}", started.elapsed());
    let v = table
        .embed(&[
            "How do I reset the password of my router?",
            "What are the steps to change my router's password?",
            "The stock market fell sharply today.",
        ])
        .expect("embed");
    let paraphrase = dot(&v[0], &v[1]);
    let unrelated = dot(&v[0], &v[2]);
    eprintln!("static cosine: paraphrase {paraphrase:.4}, unrelated {unrelated:.4}");
    assert!(
        paraphrase > unrelated + 0.3,
        "paraphrase {paraphrase}, unrelated {unrelated}"
    );
}
