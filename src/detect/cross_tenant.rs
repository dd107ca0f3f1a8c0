//! The cross-tenant detectors: residue's reason to exist.
//!
//! Every tenant's prompt (at request time) and answer (after it was scanned
//! clean) are reduced to keyed hashes — winnowed word/character shingles and
//! the PII values found in them — and recorded in the fingerprint store.
//! Every answer is then looked up whole: a shingle or PII value that another
//! tenant produced, and the requester did not, is evidence of a leak.
//!
//! - `cross_tenant_ngram`: shingles of another tenant's content. Any shared
//!   run of at least `w + k − 1` tokens is found (the winnowing guarantee);
//!   shorter shared runs of at least `k` tokens may be. One finding per
//!   source tenant, with the matched shingles, the longest matched run and
//!   the share of the answer covered.
//! - `cross_tenant_pii`: a PII value or secret another tenant sent or
//!   received. The requester's own values are fine; values nobody recorded
//!   are counted (`residue_pii_seen_total{owner="nobody"}`), not incidents.
//! - `canary`: a configured canary or honeytoken the requester does not own.
//!
//! Content many tenants share (system prompts, templates, famous quotes) is
//! not evidence: a hash produced by `common-tenants` or more tenants inside
//! the window is discounted. Answers are recorded as their tenant's content
//! (so that stock phrases many tenants' answers share can become boilerplate)
//! except the runs and values found to be another tenant's: a leak never
//! becomes the recipient's own, and a retried leak is caught again.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use serde::Deserialize;
use serde_json::json;

use super::canary::Canaries;
use super::{Detector, Finding, ScanInput, Severity};
use crate::fingerprint::{Fingerprinter, Token, TokenClass};
use crate::hash::HashKey;
use crate::metrics::Metrics;
use crate::protocol::Prompt;
use crate::rules::{PiiMatch, RuleSet};
use crate::store::{ContentKind, FingerprintStore, Lookup, Record, StoreError, TenantKey};
use crate::tenant::Tenant;

pub const NGRAM: &str = "cross_tenant_ngram";
pub const PII: &str = "cross_tenant_pii";
pub const CANARY: &str = "canary";

/// How much of the matched text an incident may show.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Evidence {
    /// Offsets, lengths, rule ids and hashes only.
    #[default]
    Hashes,
    /// Also a snippet of each match with all but its first and last two
    /// characters masked.
    MaskedSnippet,
}

/// Settings the detectors need, already validated.
#[derive(Clone, Debug)]
pub struct Settings {
    pub ngram: bool,
    pub pii: bool,
    pub common_tenants: u32,
    pub record_answers: bool,
    pub evidence: Evidence,
    pub raw_tenant: bool,
}

pub struct CrossTenant {
    fp: Fingerprinter,
    rules: RwLock<Arc<RuleSet>>,
    canaries: Canaries,
    store: Arc<dyn FingerprintStore>,
    runtime: tokio::runtime::Handle,
    key: HashKey,
    settings: Settings,
    metrics: Metrics,
    names: super::TenantNames,
}

/// The keyed hash a tenant is known by in the store and in incidents: the
/// first 8 bytes of `HashKey::hash("tenant", id)`, so its hex form equals
/// the incident's `tenant` field.
pub fn tenant_key(key: &HashKey, id: &str) -> TenantKey {
    let h = key.hash("tenant", id.as_bytes());
    u64::from_be_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]])
}

/// Appends a run (`first, end, class, from_answer`) to runs sorted by start,
/// joining it with the last one when they overlap or touch in one token
/// class; a joined run counts as prompt content if any part of it does.
fn merge_run(
    merged: &mut Vec<(usize, usize, TokenClass, bool)>,
    r: (usize, usize, TokenClass, bool),
) {
    match merged.last_mut() {
        Some(last) if r.0 <= last.1 && r.2 == last.2 => {
            last.1 = last.1.max(r.1);
            last.3 &= r.3;
        }
        _ => merged.push(r),
    }
}

/// A run of the answer's tokens that one record of a foreign tenant holds.
struct Run {
    first: usize,
    end: usize,
    class: TokenClass,
    from_answer: bool,
    record: u64,
}

/// Whether a match's value can belong to one tenant. Keyword markers
/// ("INTERNAL USE ONLY") are the same text for everyone: counted, never
/// cross-tenant evidence on their own.
fn tenant_specific(m: &PiiMatch) -> bool {
    m.kind != crate::rules::PiiKind::Keyword
}

fn pii_hash(key: &HashKey, m: &PiiMatch) -> u64 {
    let h = key.hash(m.kind.as_str(), m.canonical.as_bytes());
    u64::from_be_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]])
}

impl CrossTenant {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        fp: Fingerprinter,
        rules: Arc<RuleSet>,
        canaries: Canaries,
        store: Arc<dyn FingerprintStore>,
        runtime: tokio::runtime::Handle,
        key: HashKey,
        settings: Settings,
        metrics: Metrics,
    ) -> Self {
        CrossTenant {
            names: super::TenantNames::new(key.clone(), settings.raw_tenant),
            fp,
            rules: RwLock::new(rules),
            canaries,
            store,
            runtime,
            key,
            settings,
            metrics,
        }
    }

    /// Swaps in reloaded rules; scans in progress finish with the old ones.
    pub fn set_rules(&self, rules: Arc<RuleSet>) {
        *self.rules.write().unwrap_or_else(|p| p.into_inner()) = rules;
    }

    pub fn rules_len(&self) -> usize {
        self.rules().len()
    }

    fn rules(&self) -> Arc<RuleSet> {
        self.rules.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn key_of(&self, tenant: &Tenant) -> TenantKey {
        self.names.key_of(tenant)
    }

    fn show_tenant(&self, k: TenantKey) -> String {
        self.names.show(k)
    }

    /// What one text is remembered by: winnowed fingerprints (indexed),
    /// every shingle in order (the store keeps a Bloom filter of each pair
    /// of adjacent ones and of each alone) and PII value hashes.
    pub fn content(&self, text: &str, into: &mut Record) {
        let mut tokens = Vec::new();
        let mut shingles = Vec::new();
        let mut kept = Vec::new();
        self.fp.tokens(text, &mut tokens);
        self.fp.shingles(&tokens, &mut shingles);
        self.fp.winnow(&shingles, &mut kept);
        into.fingerprints.extend(kept.iter().map(|s| s.hash));
        into.shingles.extend(shingles.iter().map(|s| s.hash));
        let mut pii = Vec::new();
        self.rules().find(text, &mut pii);
        into.pii.extend(
            pii.iter()
                .filter(|m| tenant_specific(m))
                .map(|m| pii_hash(&self.key, m)),
        );
    }

    /// Records a tenant's prompt. Called when the request arrives, so that a
    /// leak into an answer that ends before this request's is still caught.
    pub fn record_prompt(&self, tenant: &Tenant, prompt: &Prompt) {
        let mut record = Record {
            tenant: self.key_of(tenant),
            kind: Some(ContentKind::Prompt),
            ..Record::default()
        };
        for part in &prompt.parts {
            self.content(part, &mut record);
        }
        self.record(record);
    }

    fn publish_stats(&self) {
        let st = self.store.stats();
        let m = &self.metrics;
        m.store_entries.set(st.entries as i64);
        m.store_hashes.set(st.hashes as i64);
        m.store_bytes.set(st.bytes as i64);
        m.store_evictions.set(st.evictions as i64);
        m.store_lookups.set(st.lookups as i64);
    }

    fn record(&self, record: Record) {
        if record.fingerprints.is_empty() && record.pii.is_empty() {
            return;
        }
        let batch = vec![record];
        if let Err(e) = self.runtime.block_on(self.store.record(batch)) {
            self.metrics
                .store_errors
                .with_label_values(&["record"])
                .inc();
            tracing::warn!(error = %e, "Recording fingerprints failed.");
        }
        self.publish_stats();
    }

    /// Scans one answer (or the part of it streamed so far); with
    /// `record_if_clean`, records it as the tenant's content when nothing was
    /// found.
    pub fn scan(&self, tenant: &Tenant, text: &str, record_if_clean: bool) -> Vec<Finding> {
        // In monitor mode a failed lookup has been counted and logged; the
        // answer went out anyway.
        self.try_scan(tenant, text, record_if_clean)
            .unwrap_or_default()
    }

    /// [`CrossTenant::scan`], failing when the store could not be asked, so
    /// that block mode can fail open or closed as configured.
    pub fn try_scan(
        &self,
        tenant: &Tenant,
        text: &str,
        record_if_clean: bool,
    ) -> Result<Vec<Finding>, StoreError> {
        let requester = self.key_of(tenant);
        let mut findings = Vec::new();
        if !self.canaries.is_empty() {
            for hit in self.canaries.foreign_in(text, &tenant.id) {
                let owner = self
                    .canaries
                    .owner(hit.index)
                    .map(|o| self.show_tenant(tenant_key(&self.key, o)));
                findings.push(Finding {
                    detector: CANARY,
                    severity: Severity::Critical,
                    score: 1.0,
                    evidence: self.with_snippet(
                        json!({"canary": hit.index, "owner": owner, "offsets": [[hit.start, hit.end]]}),
                        text,
                        &[(hit.start, hit.end)],
                    ),
                    spans: vec![(hit.start, hit.end)],
                });
            }
        }

        let mut tokens = Vec::new();
        let mut shingles = Vec::new();
        if self.settings.ngram {
            self.fp.tokens(text, &mut tokens);
            self.fp.shingles(&tokens, &mut shingles);
        }
        let mut pii = Vec::new();
        if self.settings.pii {
            self.rules().find(text, &mut pii);
            for m in pii.iter().filter(|m| !tenant_specific(m)) {
                self.metrics
                    .pii_seen
                    .with_label_values(&[m.kind.as_str(), "nobody"])
                    .inc();
            }
            pii.retain(tenant_specific);
        }
        if shingles.is_empty() && pii.is_empty() {
            return Ok(findings);
        }
        let lookup = [Lookup {
            requester,
            shingles: shingles.iter().map(|s| s.hash).collect(),
            pii: pii.iter().map(|m| pii_hash(&self.key, m)).collect(),
            common_tenants: self.settings.common_tenants,
        }];
        let result = match self.runtime.block_on(self.store.lookup(&lookup)) {
            Ok(mut r) => r.pop().unwrap_or_default(),
            Err(e) => {
                self.metrics
                    .store_errors
                    .with_label_values(&["lookup"])
                    .inc();
                tracing::warn!(error = %e, "Fingerprint lookup failed; this answer was not checked for leaks.");
                return Err(e);
            }
        };

        // Shingle runs, in tokens, per foreign tenant; boilerplate skipped.
        let mut by_tenant: HashMap<TenantKey, Vec<Run>> = HashMap::new();
        for run in &result.runs {
            if run.tenants >= self.settings.common_tenants {
                continue;
            }
            let (a, b) = (&shingles[run.first], &shingles[run.last]);
            by_tenant.entry(run.tenant).or_default().push(Run {
                first: a.first as usize,
                end: (b.first as usize + b.len as usize).min(tokens.len()),
                class: a.class,
                from_answer: run.kind == Some(ContentKind::Answer),
                record: run.record,
            });
        }
        let mut sources: Vec<_> = by_tenant.into_iter().collect();
        sources.sort_by_key(|(t, _)| *t);
        let mut leaked = false;
        for (source, runs) in sources {
            if let Some(f) = self.ngram_finding(source, runs, &tokens, text) {
                findings.push(f);
                leaked = true;
            }
        }
        let mut pii_owner: Vec<Option<Vec<TenantKey>>> = vec![None; pii.len()];
        for (i, owners) in &result.pii {
            // A value many tenants hold (a support address, a default
            // router IP) is nobody's secret.
            if owners.tenants >= self.settings.common_tenants && !owners.own {
                continue;
            }
            if let Some(slot) = pii_owner.get_mut(*i) {
                *slot = Some(if owners.own {
                    Vec::new()
                } else {
                    owners.foreign.clone()
                });
            }
        }
        for (m, owners) in pii.iter().zip(pii_owner) {
            let owner = match &owners {
                None => "nobody",
                Some(o) if o.is_empty() => "requester",
                Some(_) => "other_tenant",
            };
            if record_if_clean {
                // Counted once per answer, at its final scan.
                self.metrics
                    .pii_seen
                    .with_label_values(&[m.kind.as_str(), owner])
                    .inc();
            }
            if let Some(foreign) = owners.filter(|o| !o.is_empty()) {
                let sources: Vec<String> = foreign.iter().map(|t| self.show_tenant(*t)).collect();
                findings.push(Finding {
                    detector: PII,
                    severity: Severity::Critical,
                    score: 1.0,
                    evidence: self.with_snippet(
                        json!({
                            "rule": &*m.rule,
                            "kind": m.kind.as_str(),
                            "source_tenants": sources,
                            "offsets": [[m.start, m.end]],
                            "length": m.end - m.start,
                        }),
                        text,
                        &[(m.start, m.end)],
                    ),
                    spans: vec![(m.start, m.end)],
                });
            }
        }

        // Answers are the tenant's content too, so that a phrase many
        // tenants' answers share can become boilerplate — but not an answer
        // found to carry another tenant's content: a leak never becomes the
        // recipient's own (a retried leak is caught again), and neither does
        // the rest of that answer, which comes from the same misplaced pages
        // (the owner's own later answer must not look like a leak from the
        // recipient).
        let flagged = leaked || findings.iter().any(|f| f.detector != NGRAM);
        if record_if_clean && self.settings.record_answers && !flagged {
            let mut kept = Vec::new();
            self.fp.winnow(&shingles, &mut kept);
            self.record(Record {
                tenant: requester,
                kind: Some(ContentKind::Answer),
                fingerprints: kept.iter().map(|s| s.hash).collect(),
                shingles: shingles.iter().map(|s| s.hash).collect(),
                pii: pii.iter().map(|m| pii_hash(&self.key, m)).collect(),
            });
        }
        Ok(findings)
    }

    /// Builds the finding for one source tenant from the token ranges of
    /// the runs it shares with the answer; `None` when they are too short to
    /// be evidence. Runs are joined only within one source record (a leak
    /// comes from one place; pieces of two records side by side are
    /// coincidence), and each record is judged alone:
    /// - a prompt: a run of one guaranteed length (≈12 words, 20 CJK
    ///   characters), or half the answer (at least 8 tokens);
    /// - an answer: a run of twice that, since models repeat their stock
    ///   phrases ("I hope this helps! Let me know if you have any other
    ///   questions") to everyone. Another tenant's whole answer handed over
    ///   is one such run: stock phrases and the requester's own words
    ///   inside it are crossed, not cut at (see the store).
    ///
    /// A run of numbers and punctuation ("0, 1, 0, 0, 1", "1 2 3 … 12") is
    /// not anyone's content: it must hold enough distinct words.
    fn ngram_finding(
        &self,
        source: TenantKey,
        mut runs: Vec<Run>,
        tokens: &[Token],
        text: &str,
    ) -> Option<Finding> {
        let params = self.fp.params();
        let informative = |first: usize, end: usize, class: TokenClass| {
            let mut words: Vec<&str> = tokens[first..end]
                .iter()
                .filter_map(|t| text.get(t.start..t.end))
                .filter(|w| w.chars().any(char::is_alphabetic))
                .collect();
            words.sort_unstable();
            words.dedup();
            words.len() * 2 >= params.guaranteed_run(class)
        };
        runs.sort_unstable_by_key(|r| (r.record, r.first, r.end));
        // Qualifying records' merged runs: (first, end, class, from_answer).
        let mut evidence: Vec<(usize, usize, TokenClass, bool)> = Vec::new();
        let mut i = 0;
        while i < runs.len() {
            let record = runs[i].record;
            let mut merged: Vec<(usize, usize, TokenClass, bool)> = Vec::new();
            while i < runs.len() && runs[i].record == record {
                let r = &runs[i];
                merge_run(&mut merged, (r.first, r.end, r.class, r.from_answer));
                i += 1;
            }
            let from_answer = merged.first().is_some_and(|r| r.3);
            let covered: usize = merged.iter().map(|r| r.1 - r.0).sum();
            let coverage = covered as f64 / tokens.len().max(1) as f64;
            let long_run = merged.iter().any(|r| {
                let min = params.guaranteed_run(r.2) * if from_answer { 2 } else { 1 };
                r.1 - r.0 >= min && informative(r.0, r.1, r.2)
            });
            let most = !from_answer
                && coverage >= 0.5
                && covered >= 8
                && merged.iter().any(|r| informative(r.0, r.1, r.2));
            if long_run || most {
                evidence.extend(merged);
            }
        }
        if evidence.is_empty() {
            return None;
        }
        // The source's share of the answer: its qualifying runs, united.
        evidence.sort_unstable_by_key(|r| (r.0, r.1));
        let mut merged: Vec<(usize, usize, TokenClass, bool)> = Vec::new();
        for r in evidence {
            merge_run(&mut merged, r);
        }
        let covered: usize = merged.iter().map(|r| r.1 - r.0).sum();
        let coverage = covered as f64 / tokens.len().max(1) as f64;
        let (longest, class) = merged
            .iter()
            .map(|r| (r.1 - r.0, r.2))
            .max_by_key(|r| r.0)
            .unwrap_or((0, TokenClass::Word));
        let min_run = params.guaranteed_run(class);
        let from_answers = merged.iter().all(|r| r.3);
        let spans: Vec<(usize, usize)> = merged
            .iter()
            .filter(|r| r.0 < r.1 && r.1 <= tokens.len())
            .map(|r| (tokens[r.0].start, tokens[r.1 - 1].end))
            .collect();
        let severity = if longest >= 2 * min_run || coverage >= 0.5 {
            Severity::Critical
        } else {
            Severity::High
        };
        Some(Finding {
            detector: NGRAM,
            severity,
            score: (longest as f64 / (2 * min_run) as f64).min(1.0).max(coverage),
            evidence: self.with_snippet(
                json!({
                    "source_tenant": self.show_tenant(source),
                    "runs": merged.len(),
                    "longest_run_tokens": longest,
                    "token_class": match class { TokenClass::Word => "word", TokenClass::Cjk => "cjk" },
                    "min_run_tokens": min_run,
                    "source_kind": if from_answers { "answer" } else { "prompt" },
                    "coverage": (coverage * 1000.0).round() / 1000.0,
                    "answer_tokens": tokens.len(),
                    "offsets": spans,
                }),
                text,
                &spans,
            ),
            spans,
        })
    }

    fn with_snippet(
        &self,
        mut evidence: serde_json::Value,
        text: &str,
        spans: &[(usize, usize)],
    ) -> serde_json::Value {
        if self.settings.evidence == Evidence::MaskedSnippet {
            let snippets: Vec<String> = spans
                .iter()
                .filter_map(|(s, e)| text.get(*s..*e))
                .map(mask)
                .collect();
            evidence["masked_snippets"] = json!(snippets);
        }
        evidence
    }
}

/// Keeps the first and last two characters of each word-ish run and masks
/// the rest; at most 64 characters.
pub fn mask(s: &str) -> String {
    let chars: Vec<char> = s.chars().take(64).collect();
    let n = chars.len();
    chars
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if c.is_whitespace() || i < 2 || i + 2 >= n {
                *c
            } else {
                '•'
            }
        })
        .collect()
}

impl Detector for CrossTenant {
    fn name(&self) -> &'static str {
        "cross_tenant"
    }

    fn inspect(&self, input: &ScanInput<'_>) -> Vec<Finding> {
        // A streamed answer guarded in block mode was scanned as it flowed.
        if !(200..300).contains(&input.exchange.status) || input.exchange.inline_scanned {
            return Vec::new();
        }
        // Choices that arrived interleaved are read one after the other.
        self.scan(&input.exchange.tenant, &input.output.scan_text(), true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::FingerprintParams;
    use crate::store::memory::MemoryStore;
    use crate::tenant::TenantSource;
    use std::time::Duration;

    fn detector(rt: &tokio::runtime::Runtime) -> CrossTenant {
        let key = HashKey::new([3; 32]);
        CrossTenant::new(
            Fingerprinter::new(key.derive_key("fingerprint"), FingerprintParams::default()),
            Arc::new(RuleSet::builtin()),
            Canaries::new(&[]).unwrap(),
            Arc::new(MemoryStore::new(Duration::from_secs(60), 1 << 30)),
            rt.handle().clone(),
            key,
            Settings {
                ngram: true,
                pii: true,
                common_tenants: 3,
                record_answers: true,
                evidence: Evidence::Hashes,
                raw_tenant: true,
            },
            Metrics::new(),
        )
    }

    fn tenant(id: &str) -> Tenant {
        Tenant {
            id: Arc::from(id),
            source: TenantSource::Header,
        }
    }

    #[test]
    fn a_fragment_of_a_recorded_prompt_is_found() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let d = detector(&rt);
        let prompt = Prompt {
            parts: vec!["Our merger with Halvorsen Maritime closes on the ninth of March and the purchase price stays at four hundred million kroner.".into()],
            pretokenized: 0,
        };
        d.record_prompt(&tenant("a"), &prompt);
        assert!(d.store.stats().hashes > 0, "{:?}", d.store.stats());
        let findings = d.scan(&tenant("b"), "Note: with Halvorsen Maritime closes on the ninth of March and the purchase price stays at. Bye.", true);
        assert_eq!(findings.len(), 1, "{findings:#?}");
        assert_eq!(findings[0].evidence["source_tenant"], "a");
    }

    fn prompt(text: &str) -> Prompt {
        Prompt {
            parts: vec![text.into()],
            pretokenized: 0,
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    #[test]
    fn pieces_of_two_records_side_by_side_are_not_one_run() {
        let rt = runtime();
        let d = detector(&rt);
        // Eight words of A's prompt, eight of A's earlier answer: each
        // under the 12-word run, and from two different places.
        d.record_prompt(
            &tenant("a"),
            &prompt("Quarterly freight ledgers for Ostrava depot reconcile against Brno invoices every Thursday morning."),
        );
        assert!(d
            .scan(&tenant("a"), "Harbour cranes idle near pier eleven because winch cables snapped overnight again.", true)
            .is_empty());
        let f = d.scan(
            &tenant("b"),
            "Note: for Ostrava depot reconcile against Brno invoices every Thursday near pier eleven because winch cables snapped overnight.",
            true,
        );
        assert!(f.is_empty(), "{f:#?}");
    }

    #[test]
    fn a_copied_passage_with_a_stock_phrase_inside_is_one_run() {
        let rt = runtime();
        let d = detector(&rt);
        let stock = "please let me know if you have any questions about this";
        for t in ["x", "y", "z"] {
            d.record_prompt(
                &tenant(t),
                &prompt(&format!("{t} says hello. {stock}. Bye {t}.")),
            );
        }
        // A's passage: five words of its own on each side of the stock
        // phrase; no run of 12 of A's own words without it.
        let passage =
            format!("Vilnius cold storage audit postponed, {stock}, Kaunas pallets return Friday");
        d.record_prompt(
            &tenant("a"),
            &prompt(&format!("Team note. {passage}. Thanks.")),
        );
        let f = d.scan(&tenant("b"), &format!("Sure. {passage}. Done."), true);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].evidence["source_tenant"], "a");
        assert!(
            f[0].evidence["longest_run_tokens"].as_u64().unwrap() >= 20,
            "{f:#?}"
        );
        // The stock phrase alone is still nobody's.
        assert!(d
            .scan(&tenant("c"), &format!("Well, {stock}. Cheers."), true)
            .is_empty());
    }

    #[test]
    fn a_leaked_answer_is_not_recorded_as_the_recipients() {
        let rt = runtime();
        let d = detector(&rt);
        let a_prompt = "Merger talks with Halvorsen Maritime resume on the ninth of March at the Bergen office.";
        let a_answer = "The Halvorsen board expects a revised offer near four hundred million kroner before Easter.";
        d.record_prompt(&tenant("a"), &prompt(a_prompt));
        // B's answer carries A's prompt and the answer A is still receiving.
        let leak = format!("{a_prompt} {a_answer}");
        assert_eq!(d.scan(&tenant("b"), &leak, true).len(), 1);
        // A's own answer, scanned when its stream ends, is A's: not a leak
        // from B.
        let f = d.scan(&tenant("a"), a_answer, true);
        assert!(f.is_empty(), "{f:#?}");
        // And B's retry is caught again.
        assert_eq!(d.scan(&tenant("b"), &leak, true).len(), 1);
    }

    #[test]
    fn another_tenants_whole_answer_handed_over_is_caught() {
        let rt = runtime();
        let d = detector(&rt);
        let stock = "I hope this helps, and let me know if anything is unclear";
        for t in ["x", "y", "z"] {
            assert!(d
                .scan(&tenant(t), &format!("{t}: done. {stock}."), true)
                .is_empty());
        }
        // A's answer: its own words around a stock phrase, 31 words.
        let answer = format!(
            "Rotate the Tromso backup keys weekly and archive the Narvik audit trail; {stock}; brief Inga before the Oslo review on Monday."
        );
        assert!(d.scan(&tenant("a"), &answer, true).is_empty());
        let f = d.scan(&tenant("b"), &answer, true);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].evidence["source_kind"], "answer");
        // Stock phrases run across, never counted alone: a short shared
        // answer is not enough.
        let short = format!("Rotate the Tromso keys; {stock}.");
        assert!(d.scan(&tenant("a"), &short, true).is_empty());
        assert!(d.scan(&tenant("c"), &short, true).is_empty());
    }
}
