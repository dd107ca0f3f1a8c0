//! Reading rule files: parse, check every field, compile, then run every
//! rule's examples through the compiled set. All problems are collected and
//! reported together, each naming the file, the rule and the field, so one
//! edit-reload cycle fixes them all; a set with any problem is refused as a
//! whole, so a reload never swaps a working set for a half-broken one.

use std::path::Path;
use std::sync::Arc;

use aho_corasick::{AhoCorasickBuilder, AhoCorasickKind, MatchKind};
use regex::bytes::{RegexBuilder, RegexSetBuilder};

use super::validate::Validator;
use super::{Matcher, PiiKind, Rule, RuleExample, RuleSet, RulesError};

/// Compiled-program limits: generous for one rule, but bounded so a rule
/// like `\w{1000}{1000}` is an error rather than a gigabyte.
const REGEX_SIZE_LIMIT: usize = 16 << 20;
const DFA_CACHE_LIMIT: usize = 8 << 20;

/// Fewest examples of each polarity a rule must carry.
const MIN_EXAMPLES: usize = 2;

const FIELDS: &[&str] = &[
    "id",
    "kind",
    "description",
    "pattern",
    "keywords",
    "case_insensitive",
    "validator",
    "prefilter",
    "priority",
    "positive",
    "negative",
];

pub(crate) fn load_dir(dir: &Path) -> Result<RuleSet, RulesError> {
    let shown = dir.display();
    let entries = std::fs::read_dir(dir).map_err(|e| RulesError {
        errors: vec![format!("{shown}: cannot read the rules folder: {e}")],
    })?;
    let mut errors = Vec::new();
    let mut paths = Vec::new();
    for entry in entries {
        match entry {
            Ok(e) => {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "toml") && p.is_file() {
                    paths.push(p);
                }
            }
            Err(e) => errors.push(format!("{shown}: cannot list the rules folder: {e}")),
        }
    }
    paths.sort();
    let mut sources = Vec::new();
    for p in paths {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| p.display().to_string());
        match std::fs::read_to_string(&p) {
            Ok(text) => sources.push((name, text)),
            Err(e) => errors.push(format!("{name}: cannot read: {e}")),
        }
    }
    if sources.is_empty() && errors.is_empty() {
        errors.push(format!("{shown}: no *.toml rule files"));
    }
    if !errors.is_empty() {
        return Err(RulesError { errors });
    }
    from_sources(&sources)
}

/// One rule as read, before compilation into the set.
struct Spec {
    file: String,
    id: String,
    kind: PiiKind,
    /// The pattern as compiled (with `(?i:…)` applied).
    pattern: Option<String>,
    keywords: Vec<String>,
    case_insensitive: bool,
    validator: Validator,
    prefilter: Vec<String>,
    priority: i32,
    positive: Vec<String>,
    negative: Vec<String>,
    matcher: Matcher,
}

pub(crate) fn from_sources(sources: &[(String, String)]) -> Result<RuleSet, RulesError> {
    let mut errors = Vec::new();
    let mut specs: Vec<Spec> = Vec::new();
    for (file, text) in sources {
        let table: toml::Table = match text.parse() {
            Ok(t) => t,
            Err(e) => {
                errors.push(format!("{file}: {}", one_line(&e.to_string())));
                continue;
            }
        };
        for key in table.keys().filter(|k| *k != "rule") {
            errors.push(format!(
                "{file}: {key}: unknown top-level key (rules are [[rule]] tables)"
            ));
        }
        match table.get("rule") {
            None => errors.push(format!("{file}: rule: no [[rule]] tables")),
            Some(toml::Value::Array(rules)) => {
                for (i, v) in rules.iter().enumerate() {
                    match v {
                        toml::Value::Table(t) => {
                            if let Some(s) = parse_rule(file, i, t, &mut errors) {
                                specs.push(s);
                            }
                        }
                        _ => errors.push(format!("{file}: rule[#{}]: not a table", i + 1)),
                    }
                }
            }
            Some(_) => errors.push(format!("{file}: rule: must be an array of [[rule]] tables")),
        }
    }
    for (i, s) in specs.iter().enumerate() {
        if let Some(first) = specs[..i].iter().find(|o| o.id == s.id) {
            errors.push(format!(
                "{}: rule[{}]: id: duplicate, first defined in {}",
                s.file, s.id, first.file
            ));
        }
    }
    if !errors.is_empty() {
        return Err(RulesError { errors });
    }
    let set = match build(specs) {
        Ok(set) => set,
        Err(e) => return Err(RulesError { errors: e }),
    };
    check_examples(&set)?;
    Ok(set)
}

fn parse_rule(file: &str, index: usize, t: &toml::Table, errors: &mut Vec<String>) -> Option<Spec> {
    let before = errors.len();
    let id_value = t.get("id").and_then(|v| v.as_str()).unwrap_or("");
    let label = if id_value.is_empty() {
        format!("{file}: rule[#{}]", index + 1)
    } else {
        format!("{file}: rule[{id_value}]")
    };
    let mut err = |field: &str, msg: String| errors.push(format!("{label}: {field}: {msg}"));

    for key in t.keys() {
        if !FIELDS.contains(&key.as_str()) {
            err(
                key,
                format!("unknown field (expected one of: {})", FIELDS.join(", ")),
            );
        }
    }

    let id = match t.get("id") {
        None => {
            err("id", "missing".into());
            String::new()
        }
        Some(toml::Value::String(s)) => {
            let ok = !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
            if !ok {
                err(
                    "id",
                    format!("{s:?} must be non-empty lower-case letters, digits, '.', '_' or '-'"),
                );
            }
            s.clone()
        }
        Some(v) => {
            err("id", format!("expected a string, found {}", v.type_str()));
            String::new()
        }
    };

    let kind = match get_str(t, "kind", &mut err) {
        None => {
            if t.get("kind").is_none() {
                err("kind", "missing".into());
            }
            None
        }
        Some(k) => {
            let kind = PiiKind::parse(k);
            if kind.is_none() {
                let all: Vec<&str> = PiiKind::ALL.iter().map(|k| k.as_str()).collect();
                err(
                    "kind",
                    format!("unknown kind {k:?} (expected one of: {})", all.join(", ")),
                );
            }
            kind
        }
    };

    let _description = get_str(t, "description", &mut err);
    let case_insensitive = match t.get("case_insensitive") {
        None => false,
        Some(toml::Value::Boolean(b)) => *b,
        Some(v) => {
            err(
                "case_insensitive",
                format!("expected true or false, found {}", v.type_str()),
            );
            false
        }
    };
    let priority = match t.get("priority") {
        None => 0,
        Some(toml::Value::Integer(n)) => match i32::try_from(*n) {
            Ok(n) => n,
            Err(_) => {
                err("priority", format!("{n} is out of range"));
                0
            }
        },
        Some(v) => {
            err(
                "priority",
                format!("expected an integer, found {}", v.type_str()),
            );
            0
        }
    };
    let validator = match get_str(t, "validator", &mut err) {
        None => Validator::None,
        Some(name) => Validator::parse(name).unwrap_or_else(|| {
            err(
                "validator",
                format!(
                    "unknown validator {name:?} (expected one of: {})",
                    Validator::NAMES.join(", ")
                ),
            );
            Validator::None
        }),
    };
    let prefilter = get_list(t, "prefilter", &mut err).unwrap_or_default();
    if prefilter.iter().any(|p| p.is_empty()) {
        err("prefilter", "empty string".into());
    }
    if t.contains_key("prefilter") && prefilter.is_empty() {
        err(
            "prefilter",
            "empty list (leave the field out instead)".into(),
        );
    }
    let positive = get_list(t, "positive", &mut err).unwrap_or_default();
    let negative = get_list(t, "negative", &mut err).unwrap_or_default();
    for (field, list) in [("positive", &positive), ("negative", &negative)] {
        if list.len() < MIN_EXAMPLES {
            err(
                field,
                format!(
                    "at least {MIN_EXAMPLES} examples required, found {}",
                    list.len()
                ),
            );
        }
    }

    let pattern = get_str(t, "pattern", &mut err).map(str::to_string);
    let keywords = get_list(t, "keywords", &mut err);
    let mut compiled_pattern = None;
    let matcher = match (&pattern, &keywords) {
        (Some(_), Some(_)) => {
            err(
                "keywords",
                "a rule has either `pattern` or `keywords`, not both".into(),
            );
            None
        }
        (None, None) => {
            if !t.contains_key("pattern") && !t.contains_key("keywords") {
                err("pattern", "missing (or give `keywords`)".into());
            }
            None
        }
        (Some(p), None) => {
            let p = if case_insensitive {
                format!("(?i:{p})")
            } else {
                p.clone()
            };
            match RegexBuilder::new(&p)
                .unicode(false)
                .size_limit(REGEX_SIZE_LIMIT)
                .dfa_size_limit(DFA_CACHE_LIMIT)
                .build()
            {
                Err(e) => {
                    err("pattern", one_line(&e.to_string()));
                    None
                }
                Ok(regex) => {
                    if regex.is_match(b"") {
                        err("pattern", "matches the empty string".into());
                    }
                    let value_group = regex.capture_names().position(|n| n == Some("value"));
                    compiled_pattern = Some(p);
                    Some(Matcher::Regex { regex, value_group })
                }
            }
        }
        (None, Some(k)) => {
            if k.is_empty() {
                err("keywords", "empty list".into());
            }
            if k.iter().any(|k| k.is_empty()) {
                err("keywords", "empty string".into());
            }
            if validator != Validator::None {
                err("validator", "keyword rules take no validator".into());
            }
            if !prefilter.is_empty() {
                err(
                    "prefilter",
                    "keyword rules are literal already; prefilter is for patterns".into(),
                );
            }
            Some(Matcher::Keywords {
                keywords: k.clone(),
            })
        }
    };

    if errors.len() != before {
        return None;
    }
    Some(Spec {
        file: file.to_string(),
        id,
        kind: kind?,
        pattern: compiled_pattern,
        keywords: keywords.unwrap_or_default(),
        case_insensitive,
        validator,
        prefilter,
        priority,
        positive,
        negative,
        matcher: matcher?,
    })
}

fn get_str<'t>(
    t: &'t toml::Table,
    field: &str,
    err: &mut impl FnMut(&str, String),
) -> Option<&'t str> {
    match t.get(field)? {
        toml::Value::String(s) => Some(s),
        v => {
            err(field, format!("expected a string, found {}", v.type_str()));
            None
        }
    }
}

fn get_list(
    t: &toml::Table,
    field: &str,
    err: &mut impl FnMut(&str, String),
) -> Option<Vec<String>> {
    match t.get(field)? {
        toml::Value::Array(a) => {
            let mut out = Vec::with_capacity(a.len());
            for (i, v) in a.iter().enumerate() {
                match v {
                    toml::Value::String(s) => out.push(s.clone()),
                    v => err(
                        &format!("{field}[{i}]"),
                        format!("expected a string, found {}", v.type_str()),
                    ),
                }
            }
            Some(out)
        }
        v => {
            err(
                field,
                format!("expected an array of strings, found {}", v.type_str()),
            );
            None
        }
    }
}

/// Keywords of one case mode, and (rule index, keyword index) for each.
type KeywordList = (Vec<String>, Vec<(usize, usize)>);

fn build(specs: Vec<Spec>) -> Result<RuleSet, Vec<String>> {
    let mut errors = Vec::new();
    let mut rules = Vec::with_capacity(specs.len());
    let mut examples = Vec::new();
    let mut files = Vec::new();
    let mut set_patterns = Vec::new();
    let mut set_rules = Vec::new();
    let mut pre_literals = Vec::new();
    let mut prefilter_rules = Vec::new();
    // (case-insensitive?) → (keywords, (rule, keyword index))
    let mut kw: [KeywordList; 2] = Default::default();

    for (ri, s) in specs.into_iter().enumerate() {
        let id: Arc<str> = Arc::from(s.id.as_str());
        if let Some(p) = s.pattern {
            if s.prefilter.is_empty() {
                set_patterns.push(p);
                set_rules.push(ri);
            } else {
                for lit in &s.prefilter {
                    pre_literals.push(lit.clone());
                    prefilter_rules.push(ri);
                }
            }
        }
        for (ki, k) in s.keywords.iter().enumerate() {
            let slot = &mut kw[usize::from(s.case_insensitive)];
            slot.0.push(k.clone());
            slot.1.push((ri, ki));
        }
        for (positive, list) in [(true, s.positive), (false, s.negative)] {
            for text in list {
                examples.push(RuleExample {
                    rule: id.clone(),
                    text,
                    positive,
                });
            }
        }
        files.push(s.file);
        rules.push(Rule {
            id,
            kind: s.kind,
            matcher: s.matcher,
            validator: s.validator,
            priority: s.priority,
        });
    }

    let set = if set_patterns.is_empty() {
        None
    } else {
        match RegexSetBuilder::new(&set_patterns)
            .unicode(false)
            .size_limit(REGEX_SIZE_LIMIT * 4)
            .dfa_size_limit(DFA_CACHE_LIMIT * 2)
            .build()
        {
            Ok(s) => Some(s),
            Err(e) => {
                errors.push(format!("rules: regex set: {}", one_line(&e.to_string())));
                None
            }
        }
    };
    let prefilter = if pre_literals.is_empty() {
        None
    } else {
        // Hints are case-insensitive: a superset is safe, the rule's own
        // regex decides.
        // A full DFA: the literal list is small, and this pass runs over
        // every byte of every answer.
        match AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .kind(Some(AhoCorasickKind::DFA))
            .prefilter(false)
            .build(&pre_literals)
        {
            Ok(ac) => Some(ac),
            Err(e) => {
                errors.push(format!("rules: prefilter: {e}"));
                None
            }
        }
    };
    let mut keywords = Vec::new();
    for (ci, (words, ids)) in kw.into_iter().enumerate() {
        if words.is_empty() {
            continue;
        }
        match AhoCorasickBuilder::new()
            .ascii_case_insensitive(ci == 1)
            .match_kind(MatchKind::LeftmostLongest)
            .build(&words)
        {
            Ok(ac) => keywords.push((ac, ids)),
            Err(e) => errors.push(format!("rules: keywords: {e}")),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let set = RuleSet {
        rules,
        set,
        set_rules,
        prefilter,
        prefilter_rules,
        keywords,
        examples,
        files,
    };
    Ok(set)
}

/// Runs every example through the whole set, as `find` would see it in an
/// answer: positives must yield a match of their rule, negatives must not.
fn check_examples(set: &RuleSet) -> Result<(), RulesError> {
    let mut errors = Vec::new();
    let mut found = Vec::new();
    let mut counters: std::collections::HashMap<(&str, bool), usize> = Default::default();
    for ex in &set.examples {
        let n = counters.entry((&ex.rule, ex.positive)).or_default();
        let index = *n;
        *n += 1;
        found.clear();
        set.find(&ex.text, &mut found);
        let hit = found.iter().find(|m| m.rule == ex.rule);
        let file = set
            .rules
            .iter()
            .position(|r| r.id == ex.rule)
            .and_then(|i| set.files.get(i))
            .map_or("?", String::as_str);
        let field = if ex.positive { "positive" } else { "negative" };
        let label = format!("{file}: rule[{}]: {field}[{index}]", ex.rule);
        match (ex.positive, hit) {
            (true, None) => {
                let others: Vec<&str> = found.iter().map(|m| &*m.rule).collect();
                errors.push(format!(
                    "{label}: {} is not matched (matches: {})",
                    excerpt(&ex.text),
                    if others.is_empty() {
                        "none".to_string()
                    } else {
                        others.join(", ")
                    }
                ));
            }
            (false, Some(m)) => errors.push(format!(
                "{label}: {} is matched at {}..{}",
                excerpt(&ex.text),
                m.start,
                m.end
            )),
            _ => {}
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(RulesError { errors })
    }
}

fn excerpt(s: &str) -> String {
    const MAX: usize = 80;
    if s.chars().count() <= MAX {
        return format!("{s:?}");
    }
    let cut: String = s.chars().take(MAX).collect();
    format!("{cut:?}…")
}

/// Regex and TOML errors span several lines (pattern, caret, message);
/// the error list is one line per problem.
fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}
