//! Prompts for the traffic generator: a built-in generated corpus, or
//! ShareGPT / fortunes files, handed out per tenant; and each tenant's own
//! PII values.
//!
//! The built-in corpus is written here, not taken from anywhere, and is a
//! function of the seed alone. Its one hard property: two tenants' prompts
//! never share a run of 12 words, because residue would rightly flag shared
//! text as a leak. Every tenant owns a set of coined code names (its
//! projects, systems and products) whose first three syllables spell the
//! tenant's index, so no two tenants ever own the same name; every sentence
//! template puts such a name (or a value derived from one) at least every
//! six words, so any 12-word window of a tenant's prompt holds a word no
//! other tenant writes. Everything between is generic (a shared word list,
//! fake people's names, a few per-industry terms). Only the short system
//! prompt is shared by all tenants, as boilerplate is in real traffic.

use std::collections::HashSet;
use std::path::Path;

use fake::faker::creditcard::en::CreditCardNumber;
use fake::faker::name::en::{FirstName, LastName};
use fake::Fake;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Where prompts come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Corpus {
    /// Generated sentences (see the module docs); no external data.
    Builtin,
    /// A ShareGPT JSON file (a top-level array, possibly truncated): the
    /// human turns, each conversation owned by one tenant.
    ShareGpt(std::path::PathBuf),
    /// A directory of `fortune` files: `%`-separated entries.
    Fortunes(std::path::PathBuf),
}

/// The system prompt every tenant sends with chat requests: shared
/// boilerplate, as in real traffic.
pub const SYSTEM_PROMPT: &str = "You are a careful assistant for a business team. \
Answer briefly and plainly, and ask when something is unclear.";

/// Most tenants the built-in corpus can keep apart (three code syllables).
pub const MAX_TENANTS: usize = SYLLABLES.len() * SYLLABLES.len() * SYLLABLES.len();

/// One PII value a tenant owns, as residue's rules find it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PiiValue {
    /// `email`, `phone` or `card_number` (residue's rule kinds).
    pub kind: &'static str,
    pub value: String,
}

/// One ShareGPT conversation: its base id and its human and model turns.
#[derive(Clone, Debug)]
pub struct Conversation {
    /// ShareGPT splits long conversations into parts (`abc_0`, `abc_11`):
    /// one user's, so one tenant's.
    pub base_id: String,
    pub prompts: Vec<String>,
    pub answers: Vec<String>,
}

/// One tenant's generated material.
#[derive(Clone, Debug)]
pub struct TenantText {
    /// Coined names only this tenant writes.
    pub codenames: Vec<String>,
    /// Fake people the tenant mentions, with their contact details.
    pub contacts: Vec<Contact>,
    /// Card numbers only this tenant writes.
    pub cards: Vec<String>,
    /// The tenant's industry terms (shared with tenants of the same
    /// industry: generic).
    pub industry: usize,
    /// Prompts from an external corpus owned by this tenant (empty for the
    /// built-in corpus).
    pub pool: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct Contact {
    pub name: String,
    pub email: String,
    pub phone: String,
}

impl TenantText {
    /// Every PII value the tenant owns.
    pub fn pii(&self) -> Vec<PiiValue> {
        let mut out = Vec::new();
        for c in &self.contacts {
            out.push(PiiValue {
                kind: "email",
                value: c.email.clone(),
            });
            out.push(PiiValue {
                kind: "phone",
                value: c.phone.clone(),
            });
        }
        for card in &self.cards {
            out.push(PiiValue {
                kind: "card_number",
                value: card.clone(),
            });
        }
        out
    }
}

/// All tenants' prompt material: deterministic from the seed (and the
/// corpus files).
pub struct Prompts {
    seed: u64,
    tenants: Vec<TenantText>,
}

/// Consonant-vowel syllables; three of them spell a tenant index.
const SYLLABLES: [&str; 20] = [
    "ba", "ke", "di", "fo", "gu", "la", "me", "ni", "po", "ru", "sa", "te", "vi", "zo", "ha", "ju",
    "mo", "ne", "ri", "tu",
];
/// Tails that make a code name look like one.
const TAILS: [&str; 24] = [
    "rin", "vex", "lon", "dar", "mesh", "tor", "nix", "ral", "quin", "bel", "ston", "ford", "wick",
    "gate", "port", "line", "sys", "core", "loop", "nova", "crest", "hub", "mark", "lyn",
];
const TLDS: [&str; 5] = ["com", "net", "io", "co.uk", "org"];

/// The tenant, of `tenants`, that a key (a ShareGPT conversation's base id)
/// belongs to: a stable hash, so every part of one conversation lands with
/// one tenant, in the generator and in the benchmarks alike.
pub fn tenant_of(key: &str, tenants: usize) -> usize {
    let h = blake3::hash(key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&h.as_bytes()[..8]);
    (u64::from_le_bytes(first) % tenants.max(1) as u64) as usize
}

impl Prompts {
    /// Builds every tenant's material. External corpora are read here;
    /// entries are dealt to tenants round-robin (ShareGPT: whole
    /// conversations, every part of one by one user to one tenant).
    pub fn new(corpus: &Corpus, tenants: usize, seed: u64) -> anyhow::Result<Prompts> {
        anyhow::ensure!(tenants >= 1, "at least one tenant");
        anyhow::ensure!(
            tenants <= MAX_TENANTS,
            "at most {MAX_TENANTS} tenants (the built-in corpus keeps them apart by name)"
        );
        let mut seen_cards = HashSet::new();
        let mut out: Vec<TenantText> = (0..tenants)
            .map(|t| tenant_text(seed, t, &mut seen_cards))
            .collect();
        match corpus {
            Corpus::Builtin => {}
            Corpus::ShareGpt(path) => {
                let bytes = std::fs::read(path)
                    .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
                let conversations = read_sharegpt(&bytes, usize::MAX);
                anyhow::ensure!(
                    !conversations.is_empty(),
                    "{}: no ShareGPT conversations",
                    path.display()
                );
                // A conversation's parts (`abc_0`, `abc_11`) are one user's:
                // one tenant's, by a stable hash of the base id.
                for c in conversations {
                    out[tenant_of(&c.base_id, tenants)].pool.extend(c.prompts);
                }
            }
            Corpus::Fortunes(dir) => {
                let entries = read_fortunes(dir);
                anyhow::ensure!(!entries.is_empty(), "{}: no fortune entries", dir.display());
                for (i, e) in entries.into_iter().enumerate() {
                    out[i % tenants].pool.push(e);
                }
            }
        }
        Ok(Prompts { seed, tenants: out })
    }

    pub fn tenants(&self) -> &[TenantText] {
        &self.tenants
    }

    /// The prompt of the tenant's `n`th request, of at least `min_words`
    /// words: the same for the same seed, tenant and `n`, whatever order
    /// requests are made in.
    pub fn prompt(&self, tenant: usize, n: u64, min_words: usize) -> String {
        let t = &self.tenants[tenant];
        let mut rng = StdRng::seed_from_u64(mix(self.seed, tenant as u64, n ^ 0x5EED));
        let mut text = String::new();
        let mut words = 0;
        let opener = fill(OPENERS.choose(&mut rng).unwrap(), t, &mut rng, None);
        push_sentence(&mut text, &mut words, &opener);
        if !t.pool.is_empty() {
            // External corpus: one of the tenant's entries, then a sentence
            // naming one of its contacts, so its PII travels too.
            let entry = &t.pool[(n as usize) % t.pool.len()];
            words += entry.split_whitespace().count();
            text.push('\n');
            text.push_str(entry);
            text.push_str("\n\n");
            let s = contact_sentence(t, &mut rng);
            words += s.split_whitespace().count();
            text.push_str(&s);
        } else {
            let sentences = rng.gen_range(3..7);
            let contact_at = rng.gen_range(0..sentences);
            for i in 0..sentences {
                let s = if i == contact_at {
                    contact_sentence(t, &mut rng)
                } else {
                    sentence(t, &mut rng)
                };
                push_sentence(&mut text, &mut words, &s);
            }
        }
        // Padding: more of the tenant's own sentences (an over-capacity
        // prompt is long; the text stays the tenant's alone).
        while words < min_words {
            let s = sentence(t, &mut rng);
            push_sentence(&mut text, &mut words, &s);
        }
        text
    }
}

fn push_sentence(text: &mut String, words: &mut usize, s: &str) {
    if !text.is_empty() {
        text.push(' ');
    }
    *words += s.split_whitespace().count();
    text.push_str(s);
}

/// A stable 64-bit mix of the seed and indices (SplitMix64 steps).
pub(crate) fn mix(seed: u64, a: u64, b: u64) -> u64 {
    let mut z = seed;
    for v in [a, b] {
        z = z.wrapping_add(v).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
    }
    z
}

fn code(seed: u64, tenant: usize) -> String {
    let n = SYLLABLES.len();
    // A bijection of 0..MAX_TENANTS (7919 is prime, so coprime with 8000),
    // so low tenant numbers do not all spell "…baba" and the names change
    // with the seed, while two tenants still never share a code.
    let tenant = (tenant * 7919 + (seed % MAX_TENANTS as u64) as usize) % MAX_TENANTS;
    format!(
        "{}{}{}",
        SYLLABLES[tenant % n],
        SYLLABLES[(tenant / n) % n],
        SYLLABLES[(tenant / n / n) % n]
    )
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

fn ascii_letters(s: &str) -> String {
    s.chars()
        .filter(char::is_ascii_alphabetic)
        .collect::<String>()
        .to_ascii_lowercase()
}

fn tenant_text(seed: u64, tenant: usize, seen_cards: &mut HashSet<String>) -> TenantText {
    let mut rng = StdRng::seed_from_u64(mix(seed, tenant as u64, 0xC0DE));
    let code = code(seed, tenant);
    // Every tail once, in a tenant-specific order: code names distinct
    // within the tenant, and (by the code) from every other tenant's.
    let mut tails = TAILS.to_vec();
    tails.shuffle(&mut rng);
    let codenames: Vec<String> = tails
        .iter()
        .take(16)
        .map(|tail| capitalize(&format!("{code}{tail}")))
        .collect();
    let domain = format!(
        "{}.{}",
        codenames[0].to_lowercase(),
        TLDS.choose(&mut rng).unwrap()
    );
    let contacts = (0..3)
        .map(|k| {
            let first: String = FirstName().fake_with_rng(&mut rng);
            let last: String = LastName().fake_with_rng(&mut rng);
            let email = format!(
                "{}.{}{}@{domain}",
                ascii_letters(&first),
                ascii_letters(&last),
                rng.gen_range(1..100)
            );
            // The line number spells tenant and contact, so phones are
            // distinct across tenants (for 3,333 of them; past that,
            // still almost surely).
            let line = (tenant * 3 + k) % 10_000;
            let area = rng.gen_range(201..990);
            let exchange = rng.gen_range(201..990);
            let phone = if k % 2 == 0 {
                format!("+1 {area} {exchange} {line:04}")
            } else {
                format!("({area}) {exchange}-{line:04}")
            };
            Contact {
                name: format!("{first} {last}"),
                email,
                phone,
            }
        })
        .collect();
    let mut cards = Vec::new();
    while cards.len() < 2 {
        let card: String = CreditCardNumber().fake_with_rng(&mut rng);
        // The faker also makes 13-digit Visas, which no network issues any
        // more and residue's rules rightly ignore, and 15-digit Amex
        // numbers whose check digit it computes as for 16 (so they fail
        // Luhn): keep the 16-digit, Luhn-valid ones.
        if card.len() == 16
            && crate::rules::validate::luhn(&card)
            && seen_cards.insert(card.clone())
        {
            cards.push(card);
        }
    }
    TenantText {
        codenames,
        contacts,
        cards,
        industry: rng.gen_range(0..INDUSTRIES.len()),
        pool: Vec::new(),
    }
}

// === sentences ===
//
// Slots: {C} a code name of the tenant (tenant-only), {N} a generic noun,
// {V} a verb, {A} an adjective, {I} an industry term, {D} a day, {Q} a
// number. Contact templates add {P} a person, {E} their email, {H} their
// phone, {K} one of the tenant's cards; {E} and {K} are tenant-only too.
// Rule for templates (a unit test checks it): at most 3 generic words
// before the first tenant-only slot, 7 after the last, 9 between two; so
// sentences in a row never hold 12 generic words in a row. Every prompt
// starts with an opener whose first word is a code name, so not even a run
// across the shared system prompt and the prompt is shared.

const OPENERS: &[&str] = &[
    "{C} question.",
    "{C} request:",
    "{C} follow-up.",
    "{C} note:",
    "{C} team here.",
];

const TEMPLATES: &[&str] = &[
    "{C}: please {V} the {A} {N} by {D}.",
    "{C} still needs a {A} {N} and {C} keeps asking why.",
    "What changed in {C} since the {I} review?",
    "The {N} in {C} looks {A}; what would you {V} first?",
    "Write {C} a short note about the {A} {N}.",
    "We moved {C} onto {C} last {D} and the {N} got {A}.",
    "List three ways {C} could {V} the {I} {N}.",
    "Why does {C} report {Q} {N} errors when {C} reports none?",
    "Explain the {C} {I} {N} to a new hire.",
    "The {C} {N} is due {D}; help {C} {V} it.",
    "Compare {C} with {C} on {N} and {I} cost.",
    "Make a {C} checklist for after the {A} {N}.",
    "{C} owners want {Q} more {N} slots in {C}.",
    "Rewrite this {C} update for the {I} lead.",
    "Can we {V} {C} while {C} is {A}?",
    "Turn the {C} {N} notes into a plan.",
    "Estimate how long {C} needs to {V} {Q} {N} items.",
    "Which {N} should {C} {V} before {C} ships?",
    "Name the {C} memo about the {A} {N}.",
    "The {C} dashboard shows {Q} {A} {N} alerts.",
];

const CONTACT_TEMPLATES: &[&str] = &[
    "For {C}, contact {P} at {E} or {H}.",
    "{C} is owned by {P}: {E}, phone {H}.",
    "Bill the {C} order to card {K} and email {E}.",
    "The {C} refund goes to card {K}; {P} confirms at {E}.",
    "Loop {C} in with {P} ({E}, {H}).",
    "Update the {C} record: {P}, {E}, card {K}.",
];

const NOUNS: &[&str] = &[
    "schedule",
    "budget",
    "report",
    "rollout",
    "backlog",
    "invoice",
    "forecast",
    "migration",
    "contract",
    "handover",
    "outage",
    "survey",
    "roadmap",
    "audit",
    "campaign",
    "release",
    "dataset",
    "workflow",
    "proposal",
    "summary",
    "meeting",
    "ticket",
    "template",
    "estimate",
    "checklist",
    "deadline",
    "review",
    "metric",
    "shipment",
    "inventory",
    "policy",
    "vendor",
    "pipeline",
    "queue",
    "quota",
    "dashboard",
    "export",
    "import",
    "renewal",
    "onboarding",
    "training",
    "benchmark",
    "prototype",
    "feedback",
    "timeline",
    "agenda",
    "draft",
    "brief",
    "spreadsheet",
    "archive",
];
const VERBS: &[&str] = &[
    "review",
    "simplify",
    "reorganise",
    "prioritise",
    "shorten",
    "validate",
    "document",
    "schedule",
    "explain",
    "audit",
    "restructure",
    "tidy",
    "test",
    "automate",
    "estimate",
    "rewrite",
    "split",
    "merge",
    "summarise",
    "approve",
    "track",
    "reconcile",
    "archive",
    "benchmark",
    "translate",
];
const ADJECTIVES: &[&str] = &[
    "quarterly",
    "overdue",
    "revised",
    "confusing",
    "urgent",
    "outdated",
    "shared",
    "internal",
    "monthly",
    "fragile",
    "expensive",
    "delayed",
    "missing",
    "duplicated",
    "new",
    "legacy",
    "noisy",
    "slow",
    "partial",
    "seasonal",
];
const DAYS: &[&str] = &[
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Sunday",
    "tomorrow",
    "tonight",
];
const INDUSTRIES: &[&[&str]] = &[
    &["freight", "customs", "warehouse", "routing"],
    &["claims", "billing", "patient", "formulary"],
    &["checkout", "catalogue", "returns", "loyalty"],
    &["ledger", "payments", "compliance", "treasury"],
    &["curriculum", "enrolment", "grading", "tutoring"],
    &["booking", "itinerary", "fleet", "catering"],
    &["firmware", "telemetry", "support", "licensing"],
    &["tenancy", "maintenance", "leasing", "utilities"],
];

fn fill(template: &str, t: &TenantText, rng: &mut StdRng, contact: Option<&Contact>) -> String {
    let mut out = String::with_capacity(template.len() + 64);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = open + rest[open..].find('}').expect("template slots are closed");
        let slot = &rest[open + 1..close];
        let word: String = match slot {
            "C" => t.codenames.choose(rng).unwrap().clone(),
            "N" => NOUNS.choose(rng).unwrap().to_string(),
            "V" => VERBS.choose(rng).unwrap().to_string(),
            "A" => ADJECTIVES.choose(rng).unwrap().to_string(),
            "I" => INDUSTRIES[t.industry].choose(rng).unwrap().to_string(),
            "D" => DAYS.choose(rng).unwrap().to_string(),
            "Q" => rng.gen_range(2..400).to_string(),
            "P" => contact.map(|c| c.name.clone()).unwrap_or_default(),
            "E" => contact.map(|c| c.email.clone()).unwrap_or_default(),
            "H" => contact.map(|c| c.phone.clone()).unwrap_or_default(),
            "K" => t.cards.choose(rng).unwrap().clone(),
            other => panic!("unknown template slot {other}"),
        };
        out.push_str(&word);
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

fn sentence(t: &TenantText, rng: &mut StdRng) -> String {
    let template = TEMPLATES.choose(rng).unwrap();
    fill(template, t, rng, None)
}

fn contact_sentence(t: &TenantText, rng: &mut StdRng) -> String {
    let template = CONTACT_TEMPLATES.choose(rng).unwrap();
    let contact = t.contacts.choose(rng).unwrap().clone();
    fill(template, t, rng, Some(&contact))
}

// === external corpora ===

/// Reads a (truncated) top-level ShareGPT JSON array element by element:
/// finds each element's end by tracking strings and nesting, parses it
/// alone, and stops at the cut. Conversations whose first prompt or answer
/// was already seen are skipped (the same opening from many users is
/// shared content, not anyone's own).
pub fn read_sharegpt(bytes: &[u8], limit: usize) -> Vec<Conversation> {
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

/// Debian `fortunes` and `fortunes-zh`: every `%`-separated entry of every
/// file, colour escapes removed, exact duplicates (after collapsing case and
/// whitespace) kept once, in a fixed shuffled order.
pub fn read_fortunes(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    files.sort();
    let ansi = regex::Regex::new(r"\x1b\[[0-9;]*m").expect("a valid regex");
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for f in files {
        let Ok(bytes) = std::fs::read(&f) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        let text = ansi.replace_all(&text, "");
        for entry in text.split("\n%\n") {
            let entry = entry.trim();
            let norm: String = entry
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .to_lowercase();
            if norm.len() < 20 || !seen.insert(norm) {
                continue;
            }
            out.push(entry.to_string());
        }
    }
    // A fixed shuffle, so that each tenant's pool mixes every file.
    out.sort_by_key(|e| *blake3::hash(e.as_bytes()).as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use unicode_segmentation::UnicodeSegmentation;

    fn words(text: &str) -> Vec<String> {
        text.unicode_words().map(|w| w.to_lowercase()).collect()
    }

    #[test]
    fn builtin_is_deterministic_from_the_seed() {
        let a = Prompts::new(&Corpus::Builtin, 5, 7).unwrap();
        let b = Prompts::new(&Corpus::Builtin, 5, 7).unwrap();
        let c = Prompts::new(&Corpus::Builtin, 5, 8).unwrap();
        for t in 0..5 {
            for n in 0..10 {
                assert_eq!(a.prompt(t, n, 0), b.prompt(t, n, 0));
            }
            assert_eq!(a.tenants()[t].pii(), b.tenants()[t].pii());
        }
        assert_ne!(a.prompt(0, 0, 0), c.prompt(0, 0, 0));
        assert_ne!(a.prompt(0, 0, 0), a.prompt(0, 1, 0));
    }

    #[test]
    fn no_12_word_run_is_shared_between_tenants() {
        let (tenants, per) = (20, 50);
        let p = Prompts::new(&Corpus::Builtin, tenants, 42).unwrap();
        let mut owner: HashMap<Vec<String>, usize> = HashMap::new();
        for t in 0..tenants {
            for n in 0..per {
                // Every fifth prompt long, as over-capacity ones are.
                let min = if n % 5 == 0 { 400 } else { 0 };
                let w = words(&p.prompt(t, n as u64, min));
                assert!(w.len() >= 12, "{w:?}");
                for run in w.windows(12) {
                    let prev = *owner.entry(run.to_vec()).or_insert(t);
                    assert_eq!(prev, t, "tenants {prev} and {t} share {run:?}");
                }
            }
        }
    }

    #[test]
    fn templates_keep_tenant_words_close() {
        for template in OPENERS.iter().chain(TEMPLATES).chain(CONTACT_TEMPLATES) {
            // Generic words since the last tenant-only word; None before
            // the first.
            let (mut gap, mut leading, mut max) = (0, None, 0);
            let mut rest = *template;
            loop {
                let open = rest.find('{').unwrap_or(rest.len());
                gap += rest[..open].unicode_words().count();
                if open == rest.len() {
                    break;
                }
                let close = open + rest[open..].find('}').unwrap();
                match &rest[open + 1..close] {
                    "C" | "E" | "K" => {
                        if leading.is_none() {
                            leading = Some(gap);
                        } else {
                            max = max.max(gap);
                        }
                        gap = 0;
                    }
                    // A person's name, a phone number.
                    "P" => gap += 3,
                    "H" => gap += 4,
                    _ => gap += 1,
                }
                rest = &rest[close + 1..];
            }
            let leading = leading.expect("a tenant-only slot");
            assert!(leading <= 3, "{template}: {leading} words before");
            assert!(gap <= 7, "{template}: {gap} words after");
            assert!(max <= 9, "{template}: {max} words between");
        }
        for o in OPENERS {
            assert!(o.starts_with("{C}"), "{o}");
        }
    }

    #[test]
    fn pii_is_found_by_residues_rules_and_distinct_per_tenant() {
        let rules = crate::rules::RuleSet::builtin();
        let p = Prompts::new(&Corpus::Builtin, 20, 3).unwrap();
        let mut owner: HashMap<String, usize> = HashMap::new();
        for (t, tenant) in p.tenants().iter().enumerate() {
            for v in tenant.pii() {
                let text = format!("Note: {} is on file.", v.value);
                let mut found = Vec::new();
                rules.find(&text, &mut found);
                assert!(
                    found
                        .iter()
                        .any(|m| m.kind.as_str() == v.kind && text[m.start..m.end] == v.value),
                    "{} ({}) not found: {found:?}",
                    v.value,
                    v.kind
                );
                let canonical = found[0].canonical.clone();
                let prev = *owner.entry(canonical.clone()).or_insert(t);
                assert_eq!(prev, t, "{canonical} owned by tenants {prev} and {t}");
            }
            // And inside a generated prompt, they are found in place.
            let mut found = Vec::new();
            let mut text = String::new();
            for n in 0..30 {
                text.push_str(&p.prompt(t, n, 0));
                text.push('\n');
            }
            rules.find(&text, &mut found);
            assert!(found.len() >= 30, "tenant {t}: {found:?}");
        }
    }

    #[test]
    fn padding_reaches_the_requested_length() {
        let p = Prompts::new(&Corpus::Builtin, 2, 1).unwrap();
        let text = p.prompt(1, 3, 2_000);
        assert!(text.split_whitespace().count() >= 2_000);
    }

    #[test]
    fn sharegpt_reader_survives_a_truncated_array() {
        let full = r#"[{"id":"a_0","conversations":[{"from":"human","value":"hello there"},{"from":"gpt","value":"hi"}]},
            {"id":"b_1","conversations":[{"from":"human","value":"second {\"x\"}"},{"from":"gpt","value":"ok"}]},
            {"id":"c_0","conversations":[{"from":"human","value":"cut off"#;
        let c = read_sharegpt(full.as_bytes(), 10);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].base_id, "a");
        assert_eq!(c[1].prompts, vec!["second {\"x\"}".to_string()]);
    }
}
