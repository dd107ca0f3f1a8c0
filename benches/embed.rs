//! Embedding throughput: residue's transformer tier
//! (`residue::embed::Embedder`: the int8 encoder or candle on the CPU,
//! candle's CUDA backend with `--features cuda` on a GPU) against
//! sentence-transformers (PyTorch) on the same model, the same texts, the
//! same batches and the same threads.
//!
//! ```text
//! bash models/fetch
//! RESIDUE_ST_PYTHON=/work/venv-st/bin/python cargo bench --bench embed
//! ```
//!
//! Env: `TEXTS` (512), `BATCH` (32), `ROUNDS` (3), `RESIDUE_EMBED_MODEL`
//! (`models/all-MiniLM-L6-v2`), `RESIDUE_ST_PYTHON` (a Python with
//! `sentence_transformers`; without it only residue is timed),
//! `RAYON_NUM_THREADS` (default: candle's count, the machine's CPUs),
//! `KEEP_TEXTS=1` (keep the generated text files), `ST_DEVICE` (the torch
//! device sentence-transformers runs on, `cpu` by default; `cuda` to set a
//! GPU build of residue against it), `ST_QUANTIZE=1` (run
//! sentence-transformers with its Linear layers as PyTorch dynamic int8,
//! `quantize_dynamic`: the int8 counterpart of residue's int8 encoder; the
//! agreement with it is then printed, not checked),
//! `ST_INNER_BATCH` (the
//! `batch_size` sentence-transformers' `encode` is given inside each call of
//! BATCH texts; default BATCH. Smaller, it sorts each call by length and cuts
//! it into smaller model batches, its counterpart of residue's CPU
//! micro-batches).
//!
//! The texts are generated here, deterministically and without any corpus
//! file: windows of the English test prose of the fingerprint benchmark and
//! of the traffic generator's built-in prompts, each cut to a target length
//! drawn uniformly from 16..=128 wordpiece tokens ([CLS] and [SEP]
//! included), the size of the semantic detectors' chunks. They are measured
//! in two orders:
//!
//! - `mixed`: as generated, so each batch mixes short and long texts and is
//!   padded to its longest;
//! - `sorted`: by token count, so each batch holds texts of about one
//!   length (what sentence-transformers does to a long list by itself).
//!
//! Fairness: both sides get the same batches, cut from the same file in the
//! same order (the Python side calls `encode` once per batch, so its own
//! length sort cannot regroup texts); both truncate at the model's 256
//! tokens, mean-pool and L2-normalise; both include tokenizing in the time.
//! Both use N threads: N is `RAYON_NUM_THREADS` when set, otherwise candle's
//! `get_num_threads()` (the CPU count), exported as `RAYON_NUM_THREADS` for
//! residue's gemm and tokenizer pool, and given to Python as
//! `torch.set_num_threads(N)` plus `OMP_NUM_THREADS`, `MKL_NUM_THREADS` and
//! `RAYON_NUM_THREADS` (its tokenizer's pool). Each round times residue and
//! then sentence-transformers (a fresh Python process, warmed up on its own),
//! and the table reports each side's median over the rounds, so machine noise
//! falls on both alike. The first round also checks that the two sides'
//! vectors agree (cosine of each text's pair).
//!
//! Texts per CPU-second (process CPU time over the timed pass, all threads)
//! is printed next to the wall-clock rate: on a shared machine it moves less
//! with other load than texts/s does. Both sides' thread pools may spin while
//! waiting, which counts as CPU time. The load average is printed before and
//! after.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use residue::embed::{CpuPrecision, Embedder};
use residue::load::corpus::{Corpus, Prompts};

const ENGLISH: &str = include_str!("../src/fingerprint/testdata/english.txt");

/// Shortest and longest text, in tokens with [CLS] and [SEP].
const MIN_TOKENS: usize = 16;
const MAX_TOKENS: usize = 128;
/// Batches each side runs before its timed pass.
const WARMUP_BATCHES: usize = 4;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> anyhow::Result<()> {
    // One thread count for everything, fixed before any pool starts: candle's
    // gemm reads RAYON_NUM_THREADS on every matmul, and rayon's global pool
    // (gemm's and the tokenizer's) sizes itself from it once.
    let threads = candle_core::utils::get_num_threads();
    std::env::set_var("RAYON_NUM_THREADS", threads.to_string());

    let n_texts = env("TEXTS", 512).max(1);
    let batch = env("BATCH", 32).max(1);
    let rounds = env("ROUNDS", 3).max(1);
    let st_inner = env("ST_INNER_BATCH", batch).clamp(1, batch);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let model_dir = std::env::var_os("RESIDUE_EMBED_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("models/all-MiniLM-L6-v2"));
    if !model_dir.join("model.safetensors").is_file() {
        eprintln!();
        eprintln!("!!! embed bench: no model at {}", model_dir.display());
        eprintln!(
            "!!! run `bash models/fetch` (or set RESIDUE_EMBED_MODEL); nothing was measured."
        );
        eprintln!();
        return Ok(());
    }
    // The default (int8 where the CPU has AVX-512 VNNI) and, beside it when
    // that is not already f32, candle's f32 model.
    let embedder = Embedder::load(&model_dir)?;
    let candle = (embedder.cpu_kernel() != "f32")
        .then(|| Embedder::load_with(&model_dir, candle_core::Device::Cpu, CpuPrecision::F32))
        .transpose()?;
    let mut sides: Vec<(String, &Embedder)> =
        vec![(format!("residue {}", embedder.cpu_kernel()), &embedder)];
    if let Some(candle) = &candle {
        sides.push(("residue f32 (candle)".into(), candle));
    }

    let mixed = texts(&embedder, n_texts);
    let mut lens: Vec<usize> = mixed.iter().map(|t| embedder.count_tokens(t)).collect();
    let mut sorted = mixed.clone();
    sorted.sort_by_cached_key(|t| embedder.count_tokens(t));
    let orders: [(&str, &[String]); 2] = [("mixed", &mixed), ("sorted", &sorted)];

    let dir = std::env::temp_dir().join(format!("residue-bench-embed-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let files: Vec<PathBuf> = orders
        .iter()
        .map(|(name, texts)| {
            let path = dir.join(format!("{name}.json"));
            std::fs::write(&path, serde_json::to_vec(texts)?)?;
            Ok(path)
        })
        .collect::<anyhow::Result<_>>()?;

    lens.sort_unstable();
    let q = |p: f64| lens[((lens.len() - 1) as f64 * p).round() as usize];
    println!(
        "embed throughput, {} ({}), {} ({} dims, max {} tokens), {threads} threads, batch {batch}, {rounds} rounds",
        embedder.device_name(),
        embedder.cpu_kernel(),
        model_dir.display(),
        embedder.dimension(),
        embedder.max_seq_len(),
    );
    println!(
        "{n_texts} texts (in {}), tokens per text incl. [CLS]/[SEP]: min {} p25 {} median {} p75 {} max {}, mean {:.1}",
        dir.display(),
        q(0.0),
        q(0.25),
        q(0.5),
        q(0.75),
        q(1.0),
        lens.iter().sum::<usize>() as f64 / lens.len() as f64,
    );
    for (name, texts) in &orders {
        println!(
            "  {name}: {:.0}% of the batches' padded tokens are real tokens",
            100.0 * fill(&embedder, texts, batch)
        );
    }

    let python = std::env::var_os("RESIDUE_ST_PYTHON").map(PathBuf::from);
    if python.is_none() {
        println!("RESIDUE_ST_PYTHON is not set: timing residue only.");
    }
    let dump = dir.join("st-mixed.f32");
    println!("load average before: {}", load_average());
    let mut residue_rates: Vec<Vec<Vec<Pass>>> = vec![vec![Vec::new(); orders.len()]; sides.len()];
    let mut st_rates: Vec<Vec<Pass>> = vec![Vec::new(); orders.len()];
    let mut st_versions = String::new();
    for round in 0..rounds {
        for (s, (_, side)) in sides.iter().enumerate() {
            for (i, (_, texts)) in orders.iter().enumerate() {
                let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                let pass = time_pass(&refs, batch, |chunk| {
                    black_box(side.embed(chunk).expect("embedding failed"));
                });
                residue_rates[s][i].push(pass);
            }
        }
        if let Some(python) = &python {
            let st = run_st(
                python,
                &model_dir,
                &files,
                (batch, st_inner),
                threads,
                (round == 0).then_some(dump.as_path()),
            )?;
            st_versions = st.versions;
            for (i, pass) in st.passes.into_iter().enumerate() {
                st_rates[i].push(pass);
            }
        }
        let line: Vec<String> = orders
            .iter()
            .enumerate()
            .map(|(i, (name, _))| match st_rates[i].last() {
                Some(st) => format!(
                    "{name} residue {:.1} / st {:.1} texts/s",
                    residue_rates[0][i][round].rate, st.rate
                ),
                None => format!(
                    "{name} residue {:.1} texts/s",
                    residue_rates[0][i][round].rate
                ),
            })
            .collect();
        eprintln!("round {}: {}", round + 1, line.join(", "));
    }

    if python.is_some() {
        for (name, side) in &sides {
            // int8 products move each vector a little (cosine about 0.997
            // to f32's, see `embed::int8`); f32 must match PyTorch.
            let st_quantized = std::env::var_os("ST_QUANTIZE").is_some_and(|v| v == "1");
            // Against torch's dynamic int8 the agreement is reported, not
            // checked: its own quantization moves its vectors further.
            let least = match (st_quantized, side.cpu_kernel()) {
                (true, _) => -1.0,
                (false, "f32") => 0.999,
                (false, _) => 0.98,
            };
            agreement(name, side, &mixed, batch, &dump, least)?;
        }
        println!("sentence-transformers side: {st_versions}");
    }
    println!("load average after: {}", load_average());
    println!();
    println!(
        "| texts, residue kernel | residue texts/s | sentence-transformers texts/s | residue / ST \
         | residue texts/CPU-s | ST texts/CPU-s | residue / ST |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (i, (order, _)) in orders.iter().enumerate() {
        for (s, (side, _)) in sides.iter().enumerate() {
            let name = format!("{order}, {side}");
            let (r, rc) = medians(&residue_rates[s][i]);
            if st_rates[i].is_empty() {
                println!("| {name} | {r:.1} | – | – | {} | – | – |", or_dash(rc));
            } else {
                let (s, sc) = medians(&st_rates[i]);
                println!(
                    "| {name} | {r:.1} | {s:.1} | {:.2}× | {} | {} | {} |",
                    r / s,
                    or_dash(rc),
                    or_dash(sc),
                    match (rc, sc) {
                        (Some(rc), Some(sc)) => format!("{:.2}×", rc / sc),
                        _ => "–".into(),
                    }
                );
            }
        }
    }

    // ---- Second residue tier: the static (Model2Vec-style) table ----------
    // Distilled from the same model (cached next to it after the first run);
    // no sentence-transformers counterpart, so only its own rate.
    let table = residue::embed::StaticEmbedder::load_or_distill(&model_dir, &embedder)?;
    for (name, texts) in &orders {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let pass = time_pass(&refs, batch, |chunk| {
            std::hint::black_box(table.embed(chunk).expect("static embed"));
        });
        println!(
            "| {name}, static tier | {:.1} | – | – | – | – | – |",
            pass.rate
        );
    }

    if std::env::var_os("KEEP_TEXTS").is_some() {
        println!("kept the text files in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// `n` texts, each a window of one word stream (even: English prose; odd:
/// built-in prompts) cut at a target length of MIN_TOKENS..=MAX_TOKENS.
/// Deterministic: fixed seeds, built-in sources only.
fn texts(embedder: &Embedder, n: usize) -> Vec<String> {
    let prose: Vec<&str> = ENGLISH.split_whitespace().filter(|w| *w != "---").collect();
    let prompts = Prompts::new(&Corpus::Builtin, 16, 7).expect("built-in corpus");
    let generated: Vec<String> = (0..256u64)
        .map(|k| prompts.prompt((k % 16) as usize, k / 16, 0))
        .collect();
    let generated: Vec<&str> = generated
        .iter()
        .flat_map(|p| p.split_whitespace())
        .collect();
    let streams = [prose, generated];

    let mut rng = StdRng::seed_from_u64(0x0E3B_ED5E);
    (0..n)
        .map(|i| {
            let words = &streams[i % 2];
            let target = rng.gen_range(MIN_TOKENS..=MAX_TOKENS);
            let mut at = rng.gen_range(0..words.len());
            let mut text = String::new();
            while embedder.count_tokens(&text) < target {
                if !text.is_empty() {
                    text.push(' ');
                }
                text.push_str(words[at % words.len()]);
                at += 1;
            }
            text
        })
        .collect()
}

/// Real tokens over padded tokens when `texts` are cut into batches of
/// `batch` in order and each batch is padded to its longest.
fn fill(embedder: &Embedder, texts: &[String], batch: usize) -> f64 {
    let (mut real, mut padded) = (0, 0);
    for chunk in texts.chunks(batch) {
        let lens: Vec<usize> = chunk.iter().map(|t| embedder.count_tokens(t)).collect();
        real += lens.iter().sum::<usize>();
        padded += lens.iter().max().unwrap_or(&0) * lens.len();
    }
    real as f64 / padded.max(1) as f64
}

/// One timed pass over the texts.
#[derive(Clone, Copy)]
struct Pass {
    /// Texts per second, wall clock.
    rate: f64,
    /// Texts per CPU-second of the whole process, where it is known.
    per_cpu: Option<f64>,
}

/// `f` run over `texts` in batches of `batch`, after WARMUP_BATCHES untimed
/// batches.
fn time_pass(texts: &[&str], batch: usize, mut f: impl FnMut(&[&str])) -> Pass {
    for chunk in texts.chunks(batch).take(WARMUP_BATCHES) {
        f(chunk);
    }
    let cpu = cpu_seconds();
    let start = Instant::now();
    for chunk in texts.chunks(batch) {
        f(chunk);
    }
    let wall = start.elapsed().as_secs_f64();
    let n = texts.len() as f64;
    Pass {
        rate: n / wall,
        per_cpu: cpu
            .zip(cpu_seconds())
            .map(|(before, after)| n / (after - before).max(1e-9)),
    }
}

/// This process's CPU time, user and system, all threads (Linux).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the `(comm)`: state is the 1st, utime the 12th, stime the
    // 13th, in clock ticks (100 a second on Linux).
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

struct StRun {
    /// One per file.
    passes: Vec<Pass>,
    versions: String,
}

/// Runs `benches/st_compare.py` over `files` with `threads` threads.
fn run_st(
    python: &Path,
    model_dir: &Path,
    files: &[PathBuf],
    (batch, inner): (usize, usize),
    threads: usize,
    dump: Option<&Path>,
) -> anyhow::Result<StRun> {
    // RESIDUE_ST_SCRIPT: where the binary runs away from its source tree
    // (benches/embed_gpu.sh).
    let script = std::env::var_os("RESIDUE_ST_SCRIPT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/st_compare.py"));
    let mut cmd = Command::new(python);
    cmd.arg(&script)
        .arg("--model")
        .arg(model_dir)
        .arg("--batch-size")
        .arg(batch.to_string())
        .arg("--inner-batch-size")
        .arg(inner.to_string())
        .arg("--threads")
        .arg(threads.to_string())
        .arg("--warmup-batches")
        .arg(WARMUP_BATCHES.to_string());
    for f in files {
        cmd.arg("--texts").arg(f);
    }
    if let Some(dump) = dump {
        cmd.arg("--dump").arg(dump);
    }
    if let Ok(device) = std::env::var("ST_DEVICE") {
        cmd.arg("--device").arg(device);
    }
    if std::env::var_os("ST_QUANTIZE").is_some_and(|v| v == "1") {
        cmd.arg("--quantize-dynamic");
    }
    for var in ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"] {
        cmd.env(var, threads.to_string());
    }
    cmd.env("HF_HUB_OFFLINE", "1");
    let out = cmd.output()?;
    anyhow::ensure!(
        out.status.success(),
        "{} {} failed ({}):\n{}",
        python.display(),
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(last)
        .map_err(|e| anyhow::anyhow!("st_compare.py printed {last:?}: {e}"))?;
    let st_threads = v["threads"].as_u64().unwrap_or(0) as usize;
    anyhow::ensure!(
        st_threads == threads,
        "torch runs {st_threads} threads, residue {threads}"
    );
    let st_max = v["max_seq_length"].as_u64().unwrap_or(0);
    let st_inner = v["inner_batch_size"].as_u64().unwrap_or(0);
    let passes = v["results"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .filter_map(|r| {
                    Some(Pass {
                        rate: r["texts_per_s"].as_f64()?,
                        per_cpu: r["cpu_seconds"]
                            .as_f64()
                            .zip(r["texts"].as_f64())
                            .map(|(cpu, n)| n / cpu.max(1e-9)),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(StRun {
        passes,
        versions: format!(
            "torch {}, sentence-transformers {}, {st_threads} threads, max_seq_length {st_max}, \
             calls of {batch} texts, encode(batch_size={st_inner}), on {}{}",
            v["torch"].as_str().unwrap_or("?"),
            v["sentence_transformers"].as_str().unwrap_or("?"),
            v["device"].as_str().unwrap_or("cpu"),
            if v["quantized"].as_bool().unwrap_or(false) {
                ", Linear layers as torch dynamic int8 (quantize_dynamic)"
            } else {
                ""
            },
        ),
    })
}

/// Prints the cosine of residue's and sentence-transformers' vector of each
/// text (both unit length): the smallest and the mean.
fn agreement(
    name: &str,
    embedder: &Embedder,
    texts: &[String],
    batch: usize,
    dump: &Path,
    least: f32,
) -> anyhow::Result<()> {
    let bytes = std::fs::read(dump)?;
    let st: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let dim = embedder.dimension();
    anyhow::ensure!(
        st.len() == texts.len() * dim,
        "sentence-transformers wrote {} floats, expected {} x {dim}",
        st.len(),
        texts.len()
    );
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let mut cosines = Vec::with_capacity(texts.len());
    for (c, chunk) in refs.chunks(batch).enumerate() {
        for (j, v) in embedder.embed(chunk)?.iter().enumerate() {
            let row = &st[(c * batch + j) * dim..][..dim];
            cosines.push(v.iter().zip(row).map(|(a, b)| a * b).sum::<f32>());
        }
    }
    let min = cosines.iter().copied().fold(f32::INFINITY, f32::min);
    let mean = cosines.iter().sum::<f32>() / cosines.len() as f32;
    println!(
        "{name}: agreement with sentence-transformers over {} texts: cosine min {min:.6}, mean {mean:.6}",
        cosines.len()
    );
    anyhow::ensure!(
        min > least,
        "{name}: the two sides' vectors disagree (cosine {min}, at least {least} expected)"
    );
    Ok(())
}

/// The median rate and the median texts per CPU-second.
fn medians(passes: &[Pass]) -> (f64, Option<f64>) {
    let rates: Vec<f64> = passes.iter().map(|p| p.rate).collect();
    let per_cpu: Option<Vec<f64>> = passes.iter().map(|p| p.per_cpu).collect();
    (median(&rates), per_cpu.map(|c| median(&c)))
}

fn or_dash(x: Option<f64>) -> String {
    x.map_or_else(|| "–".into(), |x| format!("{x:.1}"))
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
