//! PII and secret rules: find email addresses, phone numbers, card numbers,
//! IBANs, national IDs, IP addresses, API keys and marker phrases in text.
//!
//! residue does not care whether an answer *contains* an email address; it
//! cares whether it contains *another tenant's*. This module only finds the
//! values and gives each a canonical form to hash (the same value written
//! two ways hashes the same); the detector compares those hashes with what
//! each tenant sent. Every finding therefore feeds a comparison, and every
//! false positive here costs a hash lookup and, if two tenants share the
//! value, a false incident: the rules lean towards precision (check digits,
//! ranges, context) over recall.
//!
//! The rules live in `rules/*.toml` (see `rules/README.md`), one file per
//! family, each rule carrying positive and negative examples that are run
//! when the set loads, so a rule file that no longer does what its examples
//! say is refused instead of replacing a working set.
//!
//! Matching is one pass of an Aho–Corasick automaton over the literal hints
//! (`prefilter`) of the rules that have them, one pass of a `RegexSet` over
//! the rules that don't, one pass of the keyword automata; then only the
//! rules that can match run their own regex for spans, and validators decide.

mod load;
pub mod validate;

#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::Arc;

use aho_corasick::AhoCorasick;
use regex::bytes::{Regex, RegexSet};

use validate::Validator;

/// What a matched value is. The detector uses it to class findings and to
/// decide severity; `Secret` values are never shown even masked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PiiKind {
    Email,
    Phone,
    CardNumber,
    Iban,
    NationalId,
    IpAddress,
    Secret,
    Keyword,
}

impl PiiKind {
    pub const ALL: [PiiKind; 8] = [
        PiiKind::Email,
        PiiKind::Phone,
        PiiKind::CardNumber,
        PiiKind::Iban,
        PiiKind::NationalId,
        PiiKind::IpAddress,
        PiiKind::Secret,
        PiiKind::Keyword,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            PiiKind::Email => "email",
            PiiKind::Phone => "phone",
            PiiKind::CardNumber => "card_number",
            PiiKind::Iban => "iban",
            PiiKind::NationalId => "national_id",
            PiiKind::IpAddress => "ip_address",
            PiiKind::Secret => "secret",
            PiiKind::Keyword => "keyword",
        }
    }

    /// The inverse of [`as_str`](Self::as_str), as written in rule files.
    pub fn parse(s: &str) -> Option<PiiKind> {
        PiiKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Credentials: a leak is critical even when nobody else's copy is
    /// known, and evidence never carries any part of the value.
    pub fn is_secret(&self) -> bool {
        matches!(self, PiiKind::Secret)
    }
}

/// One validated value found in a text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PiiMatch {
    /// The rule id, e.g. `card.visa`.
    pub rule: Arc<str>,
    pub kind: PiiKind,
    /// Byte offsets of the value in the text that was searched (context
    /// words a rule requires are not part of the span).
    pub start: usize,
    pub end: usize,
    /// The normalised value to hash: digits only for cards and national
    /// numbers (plus `X`/letters where the ID has them, upper-cased), `+`
    /// and digits for phones, lower case for emails, compressed form for
    /// IPv6, the base64 body for PEM keys, the exact text for other secrets.
    pub canonical: String,
}

/// One example text from a rule file, for the test suite.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleExample {
    pub rule: Arc<str>,
    pub text: String,
    /// `true`: the text must produce a match of `rule`; `false`: it must not.
    pub positive: bool,
}

/// Every problem found while loading rules, each line prefixed with
/// `file.toml: rule[id]: field: `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid rules:\n  {}", .errors.join("\n  "))]
pub struct RulesError {
    pub errors: Vec<String>,
}

/// How one rule finds candidates.
#[derive(Debug)]
pub(crate) enum Matcher {
    Regex {
        regex: Regex,
        /// Index of the `value` capture group, when the pattern has one:
        /// the span reported is that group's, the rest is context.
        value_group: Option<usize>,
    },
    Keywords {
        keywords: Vec<String>,
    },
}

#[derive(Debug)]
pub(crate) struct Rule {
    pub(crate) id: Arc<str>,
    pub(crate) kind: PiiKind,
    pub(crate) matcher: Matcher,
    pub(crate) validator: Validator,
    pub(crate) priority: i32,
}

/// A compiled, immutable set of rules. Cheap to share in an `Arc`; `find`
/// takes `&self` and may run on many threads at once.
#[derive(Debug)]
pub struct RuleSet {
    pub(crate) rules: Vec<Rule>,
    /// Rules (by index) whose regex has no literal hint: found by the set.
    pub(crate) set: Option<RegexSet>,
    pub(crate) set_rules: Vec<usize>,
    /// Literal hints of the other regex rules; pattern id → rule index.
    pub(crate) prefilter: Option<AhoCorasick>,
    pub(crate) prefilter_rules: Vec<usize>,
    /// Keyword automata (case-sensitive, case-insensitive); pattern id →
    /// (rule index, keyword index).
    pub(crate) keywords: Vec<(AhoCorasick, Vec<(usize, usize)>)>,
    pub(crate) examples: Vec<RuleExample>,
    /// The file each rule came from, by rule index (for error messages).
    pub(crate) files: Vec<String>,
}

/// The repository's rule files, compiled in so the binary works without the
/// folder. Keep in step with `rules/` (a test checks).
pub const BUILTIN_SOURCES: &[(&str, &str)] = &[
    ("contact.toml", include_str!("../../rules/contact.toml")),
    ("keywords.toml", include_str!("../../rules/keywords.toml")),
    (
        "national-id.toml",
        include_str!("../../rules/national-id.toml"),
    ),
    ("network.toml", include_str!("../../rules/network.toml")),
    ("payment.toml", include_str!("../../rules/payment.toml")),
    ("secrets.toml", include_str!("../../rules/secrets.toml")),
];

impl RuleSet {
    /// Loads every `*.toml` file in `dir`, in file-name order.
    pub fn load_dir(dir: &Path) -> Result<RuleSet, RulesError> {
        load::load_dir(dir)
    }

    /// Compiles rule files given as (file name, TOML text) pairs; errors
    /// name the file, the rule and the field, and all are reported at once.
    pub fn from_sources(sources: &[(String, String)]) -> Result<RuleSet, RulesError> {
        load::from_sources(sources)
    }

    /// The rules shipped in the repository's `rules/` folder.
    pub fn builtin() -> RuleSet {
        let sources: Vec<(String, String)> = BUILTIN_SOURCES
            .iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect();
        // Compile-time constants, checked by the test suite: an error here
        // is a bug in the repository, not bad input.
        match load::from_sources(&sources) {
            Ok(set) => set,
            Err(e) => panic!("built-in rules do not load: {e}"),
        }
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Rule ids in load order.
    pub fn rule_ids(&self) -> impl Iterator<Item = &Arc<str>> {
        self.rules.iter().map(|r| &r.id)
    }

    /// Every example text of every rule, for the test suite.
    pub fn examples(&self) -> impl Iterator<Item = &RuleExample> {
        self.examples.iter()
    }

    /// Appends every validated match in `text` to `out`, sorted by start.
    /// Overlapping matches of different rules are resolved: the longer span
    /// wins, then the higher `priority`, then the rule loaded first.
    pub fn find(&self, text: &str, out: &mut Vec<PiiMatch>) {
        let mut cands: Vec<Cand> = Vec::new();
        let bytes = text.as_bytes();
        let mut run = vec![false; self.rules.len()];
        if let Some(ac) = &self.prefilter {
            for m in ac.find_overlapping_iter(bytes) {
                if let Some(&r) = self.prefilter_rules.get(m.pattern().as_usize()) {
                    run[r] = true;
                }
            }
        }
        if let Some(set) = &self.set {
            for i in set.matches(bytes).iter() {
                if let Some(&r) = self.set_rules.get(i) {
                    run[r] = true;
                }
            }
        }
        for (ri, rule) in self.rules.iter().enumerate() {
            if run[ri] {
                self.run_regex(ri, rule, text, &mut cands);
            }
        }
        for (ac, ids) in &self.keywords {
            for m in ac.find_iter(bytes) {
                let Some(&(ri, ki)) = ids.get(m.pattern().as_usize()) else {
                    continue;
                };
                let (s, e) = (m.start(), m.end());
                if !keyword_boundaries(text, s, e) {
                    continue;
                }
                let Some(rule) = self.rules.get(ri) else {
                    continue;
                };
                let Matcher::Keywords { keywords } = &rule.matcher else {
                    continue;
                };
                let Some(kw) = keywords.get(ki) else {
                    continue;
                };
                cands.push(Cand {
                    rule: ri,
                    start: s,
                    end: e,
                    canonical: kw.clone(),
                });
            }
        }
        self.resolve(cands, out);
    }

    fn run_regex(&self, ri: usize, rule: &Rule, text: &str, cands: &mut Vec<Cand>) {
        let Matcher::Regex { regex, value_group } = &rule.matcher else {
            return;
        };
        let bytes = text.as_bytes();
        let mut push = |s: usize, e: usize| {
            // Patterns run on bytes: a span that splits a UTF-8 sequence
            // cannot be a value we report.
            if s >= e || !text.is_char_boundary(s) || !text.is_char_boundary(e) {
                return;
            }
            if let Some((end, canonical)) = rule.validator.check(rule.kind, text, s, e) {
                cands.push(Cand {
                    rule: ri,
                    start: s,
                    end,
                    canonical,
                });
            }
        };
        match value_group {
            None => {
                for m in regex.find_iter(bytes) {
                    push(m.start(), m.end());
                }
            }
            Some(g) => {
                for c in regex.captures_iter(bytes) {
                    if let Some(m) = c.get(*g) {
                        push(m.start(), m.end());
                    }
                }
            }
        }
    }

    /// Longest span first, then priority, then load order; a candidate is
    /// kept if it overlaps nothing kept before it.
    fn resolve(&self, mut cands: Vec<Cand>, out: &mut Vec<PiiMatch>) {
        if cands.is_empty() {
            return;
        }
        let prio = |c: &Cand| self.rules.get(c.rule).map_or(0, |r| r.priority);
        cands.sort_by(|a, b| {
            (b.end - b.start)
                .cmp(&(a.end - a.start))
                .then(prio(b).cmp(&prio(a)))
                .then(a.rule.cmp(&b.rule))
                .then(a.start.cmp(&b.start))
        });
        // Kept spans by start; with no overlaps among them, a new span
        // overlaps one iff it overlaps its predecessor or successor by start.
        let mut kept: std::collections::BTreeMap<usize, Cand> = Default::default();
        for c in cands {
            let overlaps_prev = kept
                .range(..=c.start)
                .next_back()
                .is_some_and(|(_, k)| k.end > c.start);
            let overlaps_next = kept
                .range(c.start..)
                .next()
                .is_some_and(|(&s, _)| s < c.end);
            if !overlaps_prev && !overlaps_next {
                kept.insert(c.start, c);
            }
        }
        let first = out.len();
        out.extend(kept.into_values().filter_map(|c| {
            let rule = self.rules.get(c.rule)?;
            Some(PiiMatch {
                rule: rule.id.clone(),
                kind: rule.kind,
                start: c.start,
                end: c.end,
                canonical: c.canonical,
            })
        }));
        debug_assert!(out[first..].windows(2).all(|w| w[0].end <= w[1].start));
    }
}

struct Cand {
    rule: usize,
    start: usize,
    end: usize,
    canonical: String,
}

/// A keyword that starts (ends) with a word character must not continue a
/// word on that side: "CONFIDENTIAL" is not found in "NONCONFIDENTIAL".
fn keyword_boundaries(text: &str, s: usize, e: usize) -> bool {
    let (Some(kw), Some(before), Some(after)) = (text.get(s..e), text.get(..s), text.get(e..))
    else {
        return false;
    };
    // ASCII only: CJK text has no spaces, so a Chinese marker is found
    // between Chinese characters.
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let starts_word = kw.starts_with(word);
    let ends_word = kw.ends_with(word);
    let glued_before = starts_word && before.ends_with(word);
    let glued_after = ends_word && after.starts_with(word);
    !glued_before && !glued_after
}
