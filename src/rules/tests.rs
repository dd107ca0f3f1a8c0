//! Tests for the rule engine: every rule file's examples (from the folder and
//! from the compiled-in copy), validator tables, load errors, overlap
//! resolution, offsets, false-positive traps, hostile input, throughput.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::validate::*;
use super::*;

fn rules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("rules")
}

fn find(set: &RuleSet, text: &str) -> Vec<PiiMatch> {
    let mut out = Vec::new();
    set.find(text, &mut out);
    out
}

fn src(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect()
}

/// Runs every example of `set` and returns the failures.
fn example_failures(set: &RuleSet) -> Vec<String> {
    let mut failures = Vec::new();
    for ex in set.examples() {
        let found = find(set, &ex.text);
        let hit = found.iter().any(|m| m.rule == ex.rule);
        if hit != ex.positive {
            failures.push(format!(
                "{} {} {:?}: found {:?}",
                ex.rule,
                if ex.positive { "positive" } else { "negative" },
                ex.text,
                found
                    .iter()
                    .map(|m| (&*m.rule, m.canonical.as_str()))
                    .collect::<Vec<_>>()
            ));
        }
    }
    failures
}

/// Checks the invariants every `find` result must hold.
fn check_invariants(text: &str, found: &[PiiMatch]) {
    for m in found {
        assert!(m.start < m.end, "empty span {m:?}");
        assert!(m.end <= text.len());
        assert!(text.is_char_boundary(m.start) && text.is_char_boundary(m.end));
        assert!(!m.canonical.is_empty(), "{m:?}");
    }
    for w in found.windows(2) {
        assert!(w[0].end <= w[1].start, "overlap or unsorted: {w:?}");
    }
}

#[test]
fn builtin_examples_all_pass() {
    let set = RuleSet::builtin();
    assert!(set.len() >= 25, "only {} rules", set.len());
    let failures = example_failures(&set);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn rules_dir_examples_all_pass_and_match_builtin() {
    let set = match RuleSet::load_dir(&rules_dir()) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    let failures = example_failures(&set);
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    let builtin = RuleSet::builtin();
    assert_eq!(set.len(), builtin.len());
    assert_eq!(
        set.rule_ids().collect::<Vec<_>>(),
        builtin.rule_ids().collect::<Vec<_>>()
    );
    assert_eq!(
        set.examples().collect::<Vec<_>>(),
        builtin.examples().collect::<Vec<_>>()
    );

    // The compiled-in list names every file in the folder.
    let mut on_disk: Vec<String> = std::fs::read_dir(rules_dir())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    on_disk.sort();
    let builtin_names: Vec<String> = BUILTIN_SOURCES.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(
        on_disk, builtin_names,
        "update BUILTIN_SOURCES in rules/mod.rs"
    );
}

#[test]
fn every_rule_has_two_examples_each_way() {
    let set = RuleSet::builtin();
    for id in set.rule_ids() {
        let pos = set
            .examples()
            .filter(|e| &e.rule == id && e.positive)
            .count();
        let neg = set
            .examples()
            .filter(|e| &e.rule == id && !e.positive)
            .count();
        assert!(pos >= 2 && neg >= 2, "{id}: {pos} positive, {neg} negative");
    }
}

#[test]
fn rule_counts_per_file() {
    let mut counts = Vec::new();
    for (name, text) in BUILTIN_SOURCES {
        let set = match RuleSet::from_sources(&src(&[(name, text)])) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        counts.push(format!("{name}: {}", set.len()));
    }
    println!("rules per file: {}", counts.join(", "));
}

// ---------------------------------------------------------------- validators

#[test]
fn luhn_table() {
    for (s, ok) in [
        ("4111111111111111", true),
        ("4111111111111112", false),
        ("4012888888881881", true),
        ("5555555555554444", true),
        ("378282246310005", true),
        ("6011111111111117", true),
        ("79927398713", true),
        ("79927398710", false),
        ("0", false),
        ("", false),
        ("4111-1111-1111-1111", false),
        ("41111111111111１1", false),
    ] {
        assert_eq!(luhn(s), ok, "{s}");
    }
    assert!(card_number("4111 1111 1111 1111"));
    assert!(card_number("4111-1111-1111-1111"));
    assert!(!card_number("0000 0000 0000 0000"), "repeated digit");
    assert!(!card_number("4111.1111.1111.1111"));
    assert!(!card_number("41111111111"), "too short");
}

#[test]
fn iban_table() {
    for s in [
        "DE89 3704 0044 0532 0130 00",
        "GB82 WEST 1234 5698 7654 32",
        "FR14 2004 1010 0505 0001 3M02 606",
        "ES91 2100 0418 4502 0005 1332",
        "IT60 X054 2811 1010 0000 0123 456",
        "NL91 ABNA 0417 1643 00",
        "BE68 5390 0754 7034",
        "CH93 0076 2011 6238 5295 7",
        "AT61 1904 3002 3457 3201",
        "PL61 1090 1014 0000 0712 1981 2874",
        "GB82WEST12345698765432",
    ] {
        assert!(iban_mod97(s), "{s}");
    }
    for s in [
        "DE89 3704 0044 0532 0130 01", // check digits
        "DE89 3704 0044 0532 0130 0",  // length
        "gb82 west 1234 5698 7654 32", // lower case
        "XX89 3704 0044 0532 0130 00", // unknown country
        "DE00 3704 0044 0532 0130 00",
        "",
        "DE",
        "DE89 3704 0044 0532 0130 0ü",
    ] {
        assert!(!iban_mod97(s), "{s}");
    }
    for (c, n) in [
        ("DE", 22),
        ("GB", 22),
        ("FR", 27),
        ("ES", 24),
        ("IT", 27),
        ("NL", 18),
        ("BE", 16),
        ("CH", 21),
        ("AT", 20),
        ("PL", 28),
    ] {
        assert_eq!(iban_length(c), Some(n), "{c}");
    }
}

#[test]
fn cn_resident_id_table() {
    for s in [
        "11010519491231002X",
        "11010519491231002x",
        "440308199003074612",
        "310115200002291235", // 29 Feb 2000, a leap year
    ] {
        assert!(cn_resident_id(s), "{s}");
    }
    for s in [
        "110105194912310021", // checksum
        "440308199003074613",
        "440308190002294612", // 1900 is not a leap year
        "440308199013074612", // month 13
        "991234199003074612", // province 99
        "44030819900307461",  // 17 chars
        "4403081990030746120",
        "44030819900307461Y",
        "",
        "一二三",
    ] {
        assert!(!cn_resident_id(s), "{s}");
    }
}

#[test]
fn us_ssn_table() {
    for s in ["536-22-1234", "219-45-6780", "001-01-0001", "899-99-9999"] {
        assert!(us_ssn(s), "{s}");
    }
    for s in [
        "000-12-3456",
        "666-12-3456",
        "900-12-3456",
        "999-12-3456",
        "536-00-1234",
        "536-22-0000",
        "123-45-6789",
        "078-05-1120",
        "536-22-123",
        "536/22/1234",
    ] {
        assert!(!us_ssn(s), "{s}");
    }
}

#[test]
fn uk_nino_table() {
    assert!(uk_nino("AB 12 34 56 C"));
    assert!(uk_nino("JG103759A"));
    for s in [
        "BG123456A",
        "GB123456A",
        "ZZ123456A",
        "AB123456E",
        "AO123456A",
        "AB12345C",
    ] {
        assert!(!uk_nino(s), "{s}");
    }
}

#[test]
fn phone_table() {
    for s in [
        "+1 (555) 123-4567",
        "+15551234567",
        "+44 20 7946 0958",
        "+44 (0)20 7946 0958",
        "+86 138 0013 8000",
        "(555) 123-4567",
        "555-123-4567",
        "555.123.4567",
        "1-800-555-0199",
        "138-0013-8000",
        "13800138000",
    ] {
        assert!(phone(s), "{s}");
    }
    for s in [
        "+1 2024",           // too few digits
        "+1234567890123456", // 16 digits: over E.164
        "+0 123 456 7890",   // no country code starts 0
        "+1.23456789",       // a signed decimal
        "100-200-3000",      // NANP area code can't start 1
        "555.123-4567",      // mixed separators
        "12800138000",       // not a China mobile prefix
        "123456789",
        "555-123-4567x",
    ] {
        assert!(!phone(s), "{s}");
    }
    assert_eq!(
        canonical(PiiKind::Phone, "+1 (555) 123-4567"),
        "+15551234567"
    );
    assert_eq!(
        canonical(PiiKind::Phone, "+44 (0)20 7946 0958"),
        "+442079460958"
    );
    assert_eq!(
        canonical(PiiKind::Phone, "+44 20 7946 0958"),
        "+442079460958"
    );
    assert_eq!(canonical(PiiKind::Phone, "138-0013-8000"), "13800138000");
}

#[test]
fn ipv4_table() {
    for s in ["10.12.0.7", "203.0.113.45", "172.20.1.1", "1.2.3.40"] {
        assert!(ipv4(s), "{s}");
    }
    for s in [
        "1.2.3.4",
        "1.0.0.0",
        "0.0.0.0",
        "0.1.2.30",
        "127.0.0.1",
        "255.255.255.255",
        "255.255.255.0",
        "255.255.0.0",
        "256.1.2.3",
        "10.01.2.3",
        "10.1.2",
        "10.1.2.3.4",
        "",
    ] {
        assert!(!ipv4(s), "{s}");
    }
}

#[test]
fn ipv6_table() {
    let ok = [
        (
            "2001:db8:85a3::8a2e:370:7334",
            "2001:db8:85a3::8a2e:370:7334",
        ),
        (
            "2001:0DB8:0000:0000:0000:FF00:0042:8329",
            "2001:db8::ff00:42:8329",
        ),
        ("fe80::1ff:fe23:4567:890a", "fe80::1ff:fe23:4567:890a"),
    ];
    for (s, c) in ok {
        assert!(ipv6(s).is_some(), "{s}");
        assert_eq!(canonical(PiiKind::IpAddress, s), c);
    }
    for s in [
        "::",
        "::1",
        "fe80::1",
        "dead::beef",
        "a:b:c",
        "12:30:45",
        "00:1a:2b:ff:fe:3c:4d:5e",
        "cafe:babe:dead::beef",
        "1:2:3:4:5:6:7:8:9",
        "",
    ] {
        assert!(ipv6(s).is_none(), "{s}");
    }
}

#[test]
fn email_table() {
    for s in [
        "alice@northwind-mail.com",
        "Bob.Smith+tag@mail.example.co.uk",
        "a@b.io",
    ] {
        assert!(email(s), "{s}");
    }
    for s in [
        "logo@2x.png",
        "x@y.js",
        "a..b@northwind-mail.com",
        ".a@northwind-mail.com",
        "a@-example.com",
        "a@example",
        "a@example.c0m",
        "noatsign",
    ] {
        assert!(!email(s), "{s}");
    }
}

#[test]
fn secret_table() {
    for s in [
        "AKIAUJZDE8GXD6NCF10E",
        "ghp_fljoQoaF1LlqsajAIxNKu8iS2G8NPRVdD53X",
        "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",
    ] {
        assert!(secret(s), "{s}");
    }
    for s in [
        "e83c5163316f89bfbde7d9ab23ca2e25604af290", // git SHA
        "E83C5163316F89BFBDE7D9AB23CA2E25604AF290",
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", // SHA-256
        "AKIAIOSFODNN7EXAMPLE",
        "sk-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        "sk-this-is-not-a-real-key-just-words",
        "sk-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1",
        "sk-REDACTED0000000000000000",
    ] {
        assert!(!secret(s), "{s}");
    }
}

#[test]
fn jwt_and_pem_table() {
    assert!(jwt("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkFsaWNlIFpoYW5nIiwiaWF0IjoxNzMyMDEyMzQ1fQ.qG3omjMyXHCabM6JOF8EFd0Nhcy-1kGD2VD-eR1UYza"));
    assert!(!jwt(
        "eyJ0eXAiOiJKV1QifQ.eyJzdWIiOiIxIn0.fHOJMaidDn87XG3-q-xbMtEPO6UkzYuF0ie9Pu2njHk"
    ));
    assert!(!jwt("eyJ!!!.eyJ.x"));
    assert!(!jwt("a.b"));
    assert_eq!(
        base64url_decode("eyJhIjoxfQ").as_deref(),
        Some(&b"{\"a\":1}"[..])
    );

    let body = "MIIEeCtL31Ugq+DfcgaTMnTC0MrAU8urbFt5misIZHbhS4/FvafhdZxEuhnbzs0z";
    let lf = format!("-----BEGIN PRIVATE KEY-----\n{body}\n{body}\n-----END PRIVATE KEY-----");
    let (head, tail) = body.split_at(40);
    let crlf = format!(
        "-----BEGIN PRIVATE KEY-----\r\n{head}\r\n{tail}{body}\r\n-----END PRIVATE KEY-----"
    );
    let a = pem_private_key(&lf);
    assert!(a.is_some());
    assert_eq!(a, pem_private_key(&crlf), "re-wrapped key, same canonical");
    assert!(
        pem_private_key("-----BEGIN PRIVATE KEY-----\n...\n-----END PRIVATE KEY-----").is_none()
    );
    assert!(pem_private_key("-----BEGIN").is_none());
}

// ------------------------------------------------------------- canonical form

#[test]
fn canonical_forms_make_one_value_one_hash() {
    let set = RuleSet::builtin();
    let canon =
        |t: &str| -> Vec<String> { find(&set, t).into_iter().map(|m| m.canonical).collect() };
    assert_eq!(canon("4111-1111-1111-1111"), canon("4111 1111 1111 1111"));
    assert_eq!(canon("4111-1111-1111-1111"), vec!["4111111111111111"]);
    assert_eq!(
        canon("Alice@Northwind-Mail.com"),
        canon("alice@northwind-mail.com")
    );
    assert_eq!(canon("+1 (555) 123-4567"), canon("+15551234567"));
    assert_eq!(
        canon("GB82 WEST 1234 5698 7654 32"),
        canon("GB82WEST12345698765432")
    );
    assert_eq!(
        canon("id 11010519491231002x"),
        canon("id 11010519491231002X")
    );
    assert_eq!(
        canon("2001:0DB8:0000:0000:0000:FF00:0042:8329"),
        vec!["2001:db8::ff00:42:8329"]
    );
    let key = "ghp_fljoQoaF1LlqsajAIxNKu8iS2G8NPRVdD53X";
    assert_eq!(canon(key), vec![key], "secrets are hashed exactly");
}

// ---------------------------------------------------------------- load errors

const GOOD_RULE: &str = r#"
[[rule]]
id = "t.digits"
kind = "national_id"
pattern = '\b[0-9]{6}\b'
positive = ["a 123456 b", "654321"]
negative = ["12345", "1234567"]
"#;

#[test]
fn load_errors_are_all_reported_with_file_rule_and_field() {
    let bad = r#"
[[rule]]
id = "t.unknown_field"
kind = "email"
pattern = 'x@y'
colour = "red"
positive = ["x@y", "x@y"]
negative = ["a", "b"]

[[rule]]
id = "t.bad_regex"
kind = "email"
pattern = '(unclosed'
positive = ["a", "b"]
negative = ["a", "b"]

[[rule]]
id = "t.bad_kind"
kind = "postcode"
pattern = 'x'
validator = "crc32"
positive = ["x", "x"]
negative = ["a", "b"]

[[rule]]
id = "t.few_examples"
kind = "email"
pattern = 'x'
positive = ["x"]

[[rule]]
id = "t.both"
kind = "keyword"
pattern = 'x'
keywords = ["x"]
positive = ["x", "x"]
negative = ["a", "b"]

[[rule]]
kind = "email"
pattern = 'x'
positive = ["x", "x"]
negative = ["a", "b"]

[[rule]]
id = "t.digits"
kind = "national_id"
pattern = 'x'
positive = ["x", 7]
negative = ["a", "b"]
"#;
    let broken_toml = "[[rule]\nid = ";
    let err = match RuleSet::from_sources(&src(&[
        ("a.toml", GOOD_RULE),
        ("b.toml", bad),
        ("c.toml", broken_toml),
    ])) {
        Ok(_) => panic!("bad rules loaded"),
        Err(e) => e,
    };
    let all = err.errors.join("\n");
    let expect = [
        "b.toml: rule[t.unknown_field]: colour: unknown field",
        "b.toml: rule[t.bad_regex]: pattern: ",
        "b.toml: rule[t.bad_kind]: kind: unknown kind \"postcode\"",
        "b.toml: rule[t.bad_kind]: validator: unknown validator \"crc32\"",
        "b.toml: rule[t.few_examples]: positive: at least 2 examples required, found 1",
        "b.toml: rule[t.few_examples]: negative: at least 2 examples required, found 0",
        "b.toml: rule[t.both]: keywords: a rule has either",
        "b.toml: rule[#6]: id: missing",
        "b.toml: rule[t.digits]: positive[1]: expected a string, found integer",
        "c.toml: ",
    ];
    for e in expect {
        assert!(
            err.errors.iter().any(|l| l.starts_with(e)),
            "missing {e:?} in:\n{all}"
        );
    }
    assert!(!all.contains("a.toml"), "a.toml is fine:\n{all}");
    // Every error is one line and names a file.
    assert!(err
        .errors
        .iter()
        .all(|l| !l.contains('\n') && l.contains(".toml: ")));
    // Display lists them all.
    assert_eq!(err.to_string().lines().count(), err.errors.len() + 1);
}

#[test]
fn duplicate_ids_across_files_are_errors() {
    let err = RuleSet::from_sources(&src(&[("a.toml", GOOD_RULE), ("b.toml", GOOD_RULE)]))
        .err()
        .map(|e| e.errors)
        .unwrap_or_default();
    assert_eq!(
        err,
        vec!["b.toml: rule[t.digits]: id: duplicate, first defined in a.toml"]
    );
}

#[test]
fn failing_examples_refuse_the_set() {
    let rule = r#"
[[rule]]
id = "t.six"
kind = "national_id"
pattern = '\b[0-9]{6}\b'
positive = ["123456", "no digits here"]
negative = ["12345", "999999"]
"#;
    let err = RuleSet::from_sources(&src(&[("x.toml", rule)]))
        .err()
        .map(|e| e.errors)
        .unwrap_or_default();
    assert_eq!(err.len(), 2, "{err:?}");
    assert!(
        err[0].starts_with("x.toml: rule[t.six]: positive[1]: \"no digits here\" is not matched")
    );
    assert!(err[1].starts_with("x.toml: rule[t.six]: negative[1]: \"999999\" is matched at 0..6"));
}

#[test]
fn other_structural_errors() {
    let cases: &[(&str, &str)] = &[
        ("rules = 1\n", "x.toml: rules: unknown top-level key"),
        ("", "x.toml: rule: no [[rule]] tables"),
        ("rule = 3\n", "x.toml: rule: must be an array"),
        (
            "[[rule]]\nid = \"Bad Id\"\nkind = \"email\"\npattern = 'x'\npositive=['x','x']\nnegative=['a','b']\n",
            "x.toml: rule[Bad Id]: id: ",
        ),
        (
            "[[rule]]\nid = \"e\"\nkind = \"email\"\npattern = 'x*'\npositive=['x','x']\nnegative=['a','b']\n",
            "x.toml: rule[e]: pattern: matches the empty string",
        ),
        (
            "[[rule]]\nid = \"k\"\nkind = \"keyword\"\nkeywords = []\nvalidator = \"luhn\"\npositive=['x','x']\nnegative=['a','b']\n",
            "x.toml: rule[k]: keywords: empty list",
        ),
        (
            "[[rule]]\nid = \"p\"\nkind = \"email\"\npattern = 'x'\nprefilter = []\npriority = \"high\"\npositive=['x','x']\nnegative=['a','b']\n",
            "x.toml: rule[p]: priority: expected an integer",
        ),
        (
            "[[rule]]\nid = \"h\"\nkind = \"email\"\npattern = '[0-9]{1000}{1000}'\npositive=['x','x']\nnegative=['a','b']\n",
            "x.toml: rule[h]: pattern: ",
        ),
    ];
    for (text, want) in cases {
        let errs = RuleSet::from_sources(&src(&[("x.toml", text)]))
            .err()
            .map(|e| e.errors)
            .unwrap_or_default();
        assert!(
            errs.iter().any(|e| e.starts_with(want)),
            "{want:?} not in {errs:?}"
        );
    }
}

#[test]
fn load_dir_errors() {
    let missing = Path::new("/nonexistent/residue-rules");
    let err = RuleSet::load_dir(missing)
        .err()
        .map(|e| e.errors)
        .unwrap_or_default();
    assert_eq!(err.len(), 1);
    assert!(
        err[0].starts_with("/nonexistent/residue-rules: "),
        "{err:?}"
    );

    let dir = std::env::temp_dir().join(format!("residue-rules-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let err = RuleSet::load_dir(&dir)
        .err()
        .map(|e| e.errors)
        .unwrap_or_default();
    assert!(err[0].ends_with("no *.toml rule files"), "{err:?}");
    // Only *.toml is read, in name order; the error names the file.
    let other = GOOD_RULE
        .replace("t.digits", "t.b")
        .replace("{6}", "{7}")
        .replace("123456", "1234567")
        .replace("654321", "7654321")
        .replace("1234567\"]", "12345678\"]");
    std::fs::write(dir.join("b.toml"), other).unwrap();
    std::fs::write(dir.join("a.toml"), GOOD_RULE).unwrap();
    std::fs::write(dir.join("notes.md"), "not a rule").unwrap();
    let set = RuleSet::load_dir(&dir).unwrap();
    assert_eq!(
        set.rule_ids().map(|s| &**s).collect::<Vec<_>>(),
        ["t.digits", "t.b"]
    );
    std::fs::write(dir.join("c.toml"), "[[rule]]\nid = \"c\"\n").unwrap();
    let err = RuleSet::load_dir(&dir)
        .err()
        .map(|e| e.errors)
        .unwrap_or_default();
    assert!(
        err.iter().all(|e| e.starts_with("c.toml: rule[c]: ")),
        "{err:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------------ overlaps and offsets

#[test]
fn overlaps_longest_then_priority_then_order() {
    let rules = r#"
[[rule]]
id = "t.short"
kind = "national_id"
pattern = '\b[0-9]{4}'
positive = ["1234 x", "9999 y"]
negative = ["abc", "12"]

[[rule]]
id = "t.long"
kind = "national_id"
pattern = '\b[0-9]{4}-[0-9]{4}\b'
positive = ["1234-5678", "x 1111-2222 y"]
negative = ["1234", "12-34"]

[[rule]]
id = "t.same_low"
kind = "keyword"
keywords = ["ALPHA BETA", "GAMMA"]
positive = ["GAMMA", "x GAMMA"]
negative = ["alpha beta", "ALPHABETA"]

[[rule]]
id = "t.same_high"
kind = "keyword"
keywords = ["alpha beta"]
case_insensitive = true
priority = 5
positive = ["alpha beta", "Alpha Beta"]
negative = ["alphabeta", "alpha  beta"]
"#;
    let set = RuleSet::from_sources(&src(&[("o.toml", rules)])).unwrap();
    let got = find(&set, "1234-5678 and ALPHA BETA and 4321");
    let ids: Vec<&str> = got.iter().map(|m| &*m.rule).collect();
    assert_eq!(ids, ["t.long", "t.same_high", "t.short"]);
    check_invariants("1234-5678 and ALPHA BETA and 4321", &got);

    // Built-in: an Anthropic key is also an OpenAI-shaped key; priority
    // makes it Anthropic's, once.
    let b = RuleSet::builtin();
    let key = "sk-ant-api03-k8cL6j5IXAAjlsHUqJoUD-_Ydua_5ZMs1SWOpQaPRYpzbLGViYXjU2JgJngKtFI3OyV2dZAkg05rK_gqv81RKMGHZEM9YAA";
    let got = find(&b, &format!("key {key} end"));
    assert_eq!(got.len(), 1);
    assert_eq!(&*got[0].rule, "anthropic.api_key");
    // A phone written +1 (555) 123-4567 is one intl match, not a NANP one
    // inside it.
    // An IPv4-mapped IPv6 address is reported by its IPv4 part.
    let text = "peer 2001:db8::ffff:192.0.2.10 up";
    let got: Vec<(&str, &str)> = find(&b, text)
        .iter()
        .map(|m| (&*m.rule, &text[m.start..m.end]))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|(r, v)| (if r == "ip.v4" { "ip.v4" } else { "other" }, v))
        .collect();
    assert_eq!(got, [("ip.v4", "192.0.2.10")]);
    let got = find(&b, "call +1 (555) 123-4567 now");
    assert_eq!(got.len(), 1);
    assert_eq!(&*got[0].rule, "phone.intl");
}

#[test]
fn offsets_point_at_the_value_in_the_original_text() {
    let set = RuleSet::builtin();
    let text = "é中文😀 alice@northwind-mail.com，卡号4111 1111 1111 1111；手机：13800138000 ssn: 536221234 ∎ 10.12.0.7";
    let got = find(&set, text);
    check_invariants(text, &got);
    let spans: Vec<(&str, &str)> = got
        .iter()
        .map(|m| (&*m.rule, &text[m.start..m.end]))
        .collect();
    assert_eq!(
        spans,
        [
            ("email", "alice@northwind-mail.com"),
            ("card.visa", "4111 1111 1111 1111"),
            ("phone.cn_mobile_labelled", "13800138000"),
            ("ssn.us_labelled", "536221234"),
            ("ip.v4", "10.12.0.7"),
        ]
    );
}

#[test]
fn find_appends_and_keeps_existing_matches() {
    let set = RuleSet::builtin();
    let mut out = Vec::new();
    set.find("a alice@northwind-mail.com", &mut out);
    set.find("b bob@northwind-mail.com", &mut out);
    assert_eq!(out.len(), 2);
    assert_eq!(out[1].canonical, "bob@northwind-mail.com");
}

// -------------------------------------------------- false-positive traps

#[test]
fn ordinary_text_traps_are_not_pii() {
    let set = RuleSet::builtin();
    let traps = [
        "Quarterly results: revenue up 12% in Q3 2024; see the 2024-11-29 filing.",
        "created_at: 1732012345, updated_at: 1732012399, ms: 1732012345678",
        "Fixed in e83c5163316f89bfbde7d9ab23ca2e25604af290 (merge 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08).",
        "request id 550e8400-e29b-41d4-a716-446655440000 and trace 4bf92f3577b34da6a3ce929d0e0e4736",
        "Upgrade to v1.2.3, then 2.0.0.1, then version 10.4.1.2 and Chrome 120.0.6099.109.",
        "Order #4000123412341235 and invoice 1000234567 were paid on 29/11/2024.",
        "In Rust use std::net::Ipv6Addr; C++ uses a::b::c; times 10:30:45.",
        "sklearn, sk-learn and task-force; AKIA is a prefix; ASIA and Asia.",
        "Price: $1,234,567.89 or +12.5%; call at 09:00; room 555; ISBN 978-3-16-148410-0.",
        "The account 12345678 and sort code 12-34-56 are on file.",
        "这是一个普通的句子，2024年11月29日，共计1732012345次访问。",
        "AKIAIOSFODNN7EXAMPLE / wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY are AWS's documentation keys.",
    ];
    for t in traps {
        let got = find(&set, t);
        assert!(got.is_empty(), "{t:?} → {got:?}");
    }
}

// ------------------------------------------------------- hostile input

/// Tiny xorshift64* PRNG so the test needs no dependency and is repeatable.
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn random_input_never_panics() {
    let set = RuleSet::builtin();
    let pieces = [
        "0",
        "1",
        "4",
        "9",
        "41",
        "555",
        "-",
        " ",
        ".",
        ":",
        "::",
        "@",
        "+",
        "(",
        ")",
        "_",
        "/",
        "a",
        "Z",
        "x",
        "X",
        "e",
        "eyJ",
        "sk-",
        "sk-ant-api03-",
        "AKIA",
        "ghp_",
        "xoxb-",
        "AIza",
        "-----BEGIN PRIVATE KEY-----",
        "-----END PRIVATE KEY-----",
        "\n",
        "\r\n",
        "é",
        "中",
        "😀",
        "\u{200b}",
        "\u{0}",
        "ssn",
        "手机",
        "DE89",
        "GB",
        "CONFIDENTIAL",
        "INTERNAL USE ONLY",
        "内部资料",
        "com",
        "=",
        "\"",
        "'",
        "fe80",
        "2001:db8",
        "10.12.0.7",
        "v",
    ];
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut out = Vec::new();
    let mut total = 0usize;
    for _ in 0..3000 {
        let n = rng.below(120);
        let mut s = String::new();
        for _ in 0..n {
            s.push_str(pieces[rng.below(pieces.len())]);
        }
        out.clear();
        set.find(&s, &mut out);
        check_invariants(&s, &out);
        total += out.len();
    }
    // Random bytes, made valid UTF-8 lossily.
    for _ in 0..300 {
        let n = rng.below(400);
        let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        let s = String::from_utf8_lossy(&bytes);
        out.clear();
        set.find(&s, &mut out);
        check_invariants(&s, &out);
    }
    println!("random: {total} matches");
}

#[test]
fn large_hostile_inputs() {
    let set = RuleSet::builtin();
    const MB: usize = 1 << 20;
    let inputs: Vec<(&str, String)> = vec![
        ("digits", "1".repeat(MB)),
        ("mixed digits", "4111 ".repeat(MB / 5)),
        ("at signs", "@".repeat(MB)),
        ("a@", "a@".repeat(MB / 2)),
        ("colons", ":".repeat(MB)),
        ("hex colons", "ab:".repeat(MB / 3)),
        ("dots", "1.".repeat(MB / 2)),
        ("plus", "+1 ".repeat(MB / 3)),
        ("cjk", "中文".repeat(MB / 6)),
        (
            "pem",
            format!("-----BEGIN PRIVATE KEY-----\n{}", "QUJD".repeat(MB / 4)),
        ),
        ("sk", "sk-".repeat(MB / 3)),
        ("emails", "a@b.co ".repeat(MB / 7)),
    ];
    let mut out = Vec::new();
    for (name, text) in &inputs {
        out.clear();
        let t = Instant::now();
        set.find(text, &mut out);
        let secs = t.elapsed().as_secs_f64();
        check_invariants(text, &out);
        println!(
            "{name}: {} matches, {:.1} MB/s",
            out.len(),
            text.len() as f64 / 1e6 / secs.max(1e-9)
        );
    }
}

// ------------------------------------------------------------- throughput

fn prose(bytes: usize) -> String {
    let words = [
        "the",
        "quarterly",
        "report",
        "shows",
        "that",
        "our",
        "team",
        "delivered",
        "results",
        "across",
        "Asia",
        "and",
        "Europe",
        "while",
        "customers",
        "asked",
        "about",
        "pricing",
        "secret",
        "of",
        "success",
        "is",
        "telling",
        "a",
        "clear",
        "story",
        "hotel",
        "mobile",
        "phone",
        "design",
        "with",
        "careful",
        "attention",
        "to",
        "detail",
        "in",
        "every",
        "release",
        "we",
        "ship",
        "version",
        "data",
        "model",
        "answers",
        "questions",
        "quickly",
        "because",
        "it",
        "learned",
        "from",
        "examples",
        "written",
        "by",
        "people",
        "who",
        "care",
    ];
    let mut rng = XorShift(42);
    let mut s = String::with_capacity(bytes + 64);
    let mut sentence = 0;
    while s.len() < bytes {
        let w = words[rng.below(words.len())];
        if sentence == 0 {
            let mut c = w.chars();
            if let Some(f) = c.next() {
                s.extend(f.to_uppercase());
                s.push_str(c.as_str());
            }
        } else {
            s.push_str(w);
        }
        sentence += 1;
        if sentence > 8 + rng.below(10) {
            s.push_str(if rng.below(5) == 0 {
                ", in 2024. "
            } else {
                ". "
            });
            sentence = 0;
        } else {
            s.push(' ');
        }
    }
    s
}

#[test]
fn throughput_on_prose() {
    let set = RuleSet::builtin();
    let text = prose(1 << 20);
    let mut out = Vec::new();
    set.find(&text, &mut out); // warm the lazy DFA caches
    assert!(
        out.is_empty(),
        "prose has no PII: {:?}",
        &out[..out.len().min(3)]
    );
    let runs = 5;
    let t = Instant::now();
    for _ in 0..runs {
        out.clear();
        set.find(&text, &mut out);
    }
    let secs = t.elapsed().as_secs_f64() / runs as f64;
    println!(
        "find on 1 MiB of prose: {:.1} MB/s ({} build)",
        text.len() as f64 / 1e6 / secs.max(1e-9),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
}

// ------------------------------------------------------------- misc API

#[test]
fn shared_across_threads() {
    fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<RuleSet>();
    let set = Arc::new(RuleSet::builtin());
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let set = Arc::clone(&set);
            std::thread::spawn(move || {
                let text = format!("user{i}@northwind-mail.com");
                find(&set, &text).len()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().ok(), Some(1));
    }
}

#[test]
fn kinds() {
    for k in PiiKind::ALL {
        assert_eq!(PiiKind::parse(k.as_str()), Some(k));
        assert_eq!(k.is_secret(), k == PiiKind::Secret);
        #[derive(serde::Deserialize)]
        struct W {
            k: PiiKind,
        }
        let w: W = toml::from_str(&format!("k = \"{}\"", k.as_str())).unwrap();
        assert_eq!(w.k, k);
    }
    let set = RuleSet::builtin();
    assert!(!set.is_empty());
    let kinds: std::collections::HashSet<PiiKind> = find(
        &set,
        "a@b.io +44 20 7946 0958 4111111111111111 DE89370400440532013000 536-22-1234 10.12.0.7 ghp_fljoQoaF1LlqsajAIxNKu8iS2G8NPRVdD53X INTERNAL USE ONLY",
    )
    .into_iter()
    .map(|m| m.kind)
    .collect();
    assert_eq!(kinds.len(), 8, "{kinds:?}");
}

#[test]
fn placeholder_addresses_are_not_pii() {
    let rules = RuleSet::builtin();
    for text in [
        "write to john.doe@example.com",
        "see ops@mail.example.org",
        "the router at 192.168.1.1",
        "VM two is 10.0.0.2",
    ] {
        let mut out = Vec::new();
        rules.find(text, &mut out);
        assert!(out.is_empty(), "{text}: {out:?}");
    }
}
