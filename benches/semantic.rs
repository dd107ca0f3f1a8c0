//! The semantic detectors on real traffic, per tier: recall on leaks that
//! answer another tenant's question, and false positives on clean answers.
//!
//! `tests/corpus/fetch && cargo bench --bench semantic` (env: PAIRS=400,
//! TENANTS=100, TIERS=static,cascade,transformer; LEAK, MARGIN, RELEVANCE,
//! CONFIRM, CONFIRM_LEAK override the thresholds, for calibration;
//! CPU_PRECISION=auto|int8|f32 is `semantic.cpu-precision`). Needs
//! `models/all-MiniLM-L6-v2` (`models/fetch`) and `.corpus/sharegpt.json`.
//!
//! Each ShareGPT conversation's first prompt and first answer is one pair,
//! given to one of TENANTS tenants. Every prompt is recorded. Then:
//! - clean: each answer is checked as its own tenant's: any finding is a
//!   false positive (ShareGPT has some answers that really ignore their
//!   prompt, so the relevance row is an upper bound);
//! - leak: answer i is delivered to tenant j (another conversation, another
//!   tenant) as its answer to prompt j — the placeholder incident: B asked
//!   one thing and got the answer to A's question. Recall is the share
//!   flagged `semantic_leak` with source A; `relevance` the share flagged
//!   irrelevant. The "paraphrased" column keeps the pairs whose answer
//!   shares no 8-word run with its prompt: no exact detector can see them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use residue::config::{CpuPrecisionChoice, SemanticConfig, TierChoice};
use residue::detect::semantic::{build, LEAK, RELEVANCE};
use residue::detect::TenantNames;
use residue::hash::HashKey;
use residue::load::corpus::{read_sharegpt, tenant_of};
use residue::metrics::Metrics;
use residue::protocol::Prompt;
use residue::tenant::{Tenant, TenantSource};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn env_f(name: &str) -> Option<f32> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn words(s: &str) -> Vec<String> {
    s.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase())
        .collect()
}

/// The longest run of words `a` and `b` share (the oracle: raw text).
fn longest_shared(a: &[String], b: &[String]) -> usize {
    let mut best = 0;
    let mut prev = vec![0usize; b.len() + 1];
    for x in a {
        let mut cur = vec![0usize; b.len() + 1];
        for (j, y) in b.iter().enumerate() {
            if x == y {
                cur[j + 1] = prev[j] + 1;
                best = best.max(cur[j + 1]);
            }
        }
        prev = cur;
    }
    best
}

fn pct(v: &mut [f32], p: f64) -> f32 {
    if v.is_empty() {
        return f32::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn tenant(i: usize) -> Tenant {
    Tenant {
        id: Arc::from(format!("tenant-{i}")),
        source: TenantSource::Header,
    }
}

fn main() {
    let model = std::path::Path::new("models/all-MiniLM-L6-v2");
    let corpus = std::path::Path::new(".corpus/sharegpt.json");
    if !model.join("model.safetensors").is_file() || !corpus.is_file() {
        eprintln!(
            "\n!!!!! semantic bench SKIPPED: needs models/all-MiniLM-L6-v2 (models/fetch) and .corpus/sharegpt.json (tests/corpus/fetch) !!!!!\n"
        );
        return;
    }
    let n = env("PAIRS", 400);
    let tenants = env("TENANTS", 100);
    let bytes = std::fs::read(corpus).expect("read corpus");
    let pairs: Vec<(usize, String, String)> = read_sharegpt(&bytes, n * 4)
        .into_iter()
        .filter_map(|c| {
            let p = c.prompts.first()?.clone();
            let a = c.answers.first()?.clone();
            (words(&p).len() >= 6 && words(&a).len() >= 30)
                .then(|| (tenant_of(&c.base_id, tenants), p, a))
        })
        .take(n)
        .collect();
    let n = pairs.len();
    let paraphrased: Vec<bool> = pairs
        .iter()
        .map(|(_, p, a)| longest_shared(&words(p), &words(a)) < 8)
        .collect();
    let tiers = std::env::var("TIERS").unwrap_or_else(|_| "static,cascade,transformer".into());
    println!(
        "semantic bench: {n} ShareGPT pairs over {tenants} tenants; {} of them share no 8-word run with their prompt",
        paraphrased.iter().filter(|p| **p).count()
    );
    println!(
        "{:<12} {:>10} {:>10} {:>10} {:>10} {:>12} {:>11} {:>9}",
        "tier",
        "leak FP",
        "relev FP",
        "leak recall",
        "paraphr.",
        "relev recall",
        "ms/answer",
        "record ms"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    for tier in tiers.split(',') {
        let choice = match tier {
            "static" => TierChoice::Static,
            "cascade" => TierChoice::Cascade,
            "transformer" => TierChoice::Transformer,
            other => panic!("unknown tier {other}"),
        };
        let config = SemanticConfig {
            enabled: true,
            model: model.to_path_buf(),
            tier: choice,
            leak_threshold: env_f("LEAK"),
            margin: env_f("MARGIN"),
            relevance_threshold: env_f("RELEVANCE"),
            confirm_leak: env_f("CONFIRM_LEAK"),
            confirm_relevance: env_f("CONFIRM"),
            cpu_precision: match std::env::var("CPU_PRECISION").as_deref() {
                Ok("f32") => CpuPrecisionChoice::F32,
                Ok("int8") => CpuPrecisionChoice::Int8,
                _ => CpuPrecisionChoice::Auto,
            },
            timeout: Duration::from_secs(60),
            ..SemanticConfig::default()
        };
        let metrics = Metrics::new();
        let sem = build(
            &config,
            Duration::from_secs(3600),
            TenantNames::new(HashKey::new([9; 32]), true),
            rt.handle().clone(),
            &metrics,
        )
        .expect("build");
        let started = Instant::now();
        for (t, p, _) in &pairs {
            sem.record_prompt(&tenant(*t), &prompt(p));
        }
        let record_ms = started.elapsed().as_secs_f64() * 1000.0 / n as f64;
        // The cascade's model embeds prompts as it has room: let it catch up
        // (traffic where answers follow prompts by seconds).
        let mut last = None;
        let mut still = 0;
        while let Some(now) = sem.model_window_chunks() {
            still = if last == Some(now) { still + 1 } else { 0 };
            if still >= 3 {
                break;
            }
            last = Some(now);
            std::thread::sleep(Duration::from_secs(3));
        }
        if let Some(c) = last {
            println!("    ({c} prompt chunks in the model's window)");
        }

        let started = Instant::now();
        let (mut leak_fp, mut rel_fp) = (0usize, 0usize);
        let mut clean_rel = Vec::new();
        let mut clean_margin = Vec::new();
        let mut reread = 0usize;
        for (t, p, a) in &pairs {
            let (f, s) = sem.check_scored(&tenant(*t), &prompt(p), a).expect("check");
            leak_fp += f.iter().any(|f| f.detector == LEAK) as usize;
            rel_fp += f.iter().any(|f| f.detector == RELEVANCE) as usize;
            clean_rel.extend(s.relevance);
            reread += s.transformer_relevance.is_some() as usize;
            clean_margin.extend(s.best_foreign.map(|b| b.1 - b.2));
        }
        let (mut caught, mut caught_para, mut rel_caught, mut leaks, mut para) =
            (0usize, 0usize, 0usize, 0usize, 0usize);
        let mut leak_rel = Vec::new();
        let mut leak_margin = Vec::new();
        for i in 0..n {
            let j = (i + n / 2 + 1) % n;
            let (ti, _, a) = &pairs[i];
            let (tj, pj, _) = &pairs[j];
            if ti == tj {
                continue;
            }
            leaks += 1;
            para += paraphrased[i] as usize;
            let (f, s) = sem
                .check_scored(&tenant(*tj), &prompt(pj), a)
                .expect("check");
            let source = format!("tenant-{ti}");
            let hit = f
                .iter()
                .any(|f| f.detector == LEAK && f.evidence["source_tenant"] == source.as_str());
            caught += hit as usize;
            caught_para += (hit && paraphrased[i]) as usize;
            rel_caught += f.iter().any(|f| f.detector == RELEVANCE) as usize;
            leak_rel.extend(s.relevance);
            reread += s.transformer_relevance.is_some() as usize;
            leak_margin.extend(s.best_foreign.map(|b| b.1 - b.2));
        }
        let ms = started.elapsed().as_secs_f64() * 1000.0 / (n + leaks) as f64;
        let per10k = |x: usize| x as f64 * 10_000.0 / n as f64;
        let share = |x: usize, of: usize| 100.0 * x as f64 / of.max(1) as f64;
        println!(
            "{:<12} {:>7.0}/1e4 {:>7.0}/1e4 {:>9.1}% {:>9.1}% {:>11.1}% {:>11.2} {:>9.2}",
            sem.tier().as_str(),
            per10k(leak_fp),
            per10k(rel_fp),
            share(caught, leaks),
            share(caught_para, para),
            share(rel_caught, leaks),
            ms,
            record_ms
        );
        if sem.tier().as_str() == "cascade" {
            println!(
                "    the model re-read {reread} of {} answers (static candidates)",
                n + leaks
            );
        }
        println!(
            "    relevance  clean p1/p5/p50 {:.3}/{:.3}/{:.3}   leaked p50/p95/p99 {:.3}/{:.3}/{:.3}",
            pct(&mut clean_rel, 0.01),
            pct(&mut clean_rel, 0.05),
            pct(&mut clean_rel, 0.5),
            pct(&mut leak_rel, 0.5),
            pct(&mut leak_rel, 0.95),
            pct(&mut leak_rel, 0.99),
        );
        println!(
            "    margin (best foreign - own, above the leak threshold)  clean n={} p50/p99/max {:.3}/{:.3}/{:.3}   leaked n={} p5/p50 {:.3}/{:.3}",
            clean_margin.len(),
            pct(&mut clean_margin, 0.5),
            pct(&mut clean_margin, 0.99),
            pct(&mut clean_margin, 1.0),
            leak_margin.len(),
            pct(&mut leak_margin, 0.05),
            pct(&mut leak_margin, 0.5),
        );
    }
}

fn prompt(text: &str) -> Prompt {
    Prompt {
        parts: vec![text.to_string()],
        pretokenized: 0,
    }
}
