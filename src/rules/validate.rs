//! Validators: pure functions that decide whether a regex candidate is really
//! the thing its rule names, and what its canonical (hashable) form is.
//!
//! Regexes only describe *shape*; most false positives that made users turn
//! other guardrails off ("quarterly" as a date, unix timestamps as phone
//! numbers, git SHAs as secrets) are shape-correct. The checks here are the
//! arithmetic and context that shapes cannot express: check digits, number
//! ranges, calendar dates, the characters around the match. Every function is
//! total: it never panics, whatever the input.

use std::net::Ipv6Addr;

use super::PiiKind;

/// The named validators a rule may select with `validator = "…"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Validator {
    None,
    Luhn,
    IbanMod97,
    CnResidentId,
    UsSsn,
    UkNino,
    Phone,
    Ipv4,
    Ipv6,
    Email,
    Secret,
    Jwt,
    PemPrivateKey,
}

impl Validator {
    pub(crate) const NAMES: &'static [&'static str] = &[
        "none",
        "luhn",
        "iban_mod97",
        "cn_resident_id",
        "us_ssn",
        "uk_nino",
        "phone",
        "ipv4",
        "ipv6",
        "email",
        "secret",
        "jwt",
        "pem_private_key",
    ];

    pub(crate) fn parse(name: &str) -> Option<Validator> {
        Some(match name {
            "none" => Validator::None,
            "luhn" => Validator::Luhn,
            "iban_mod97" => Validator::IbanMod97,
            "cn_resident_id" => Validator::CnResidentId,
            "us_ssn" => Validator::UsSsn,
            "uk_nino" => Validator::UkNino,
            "phone" => Validator::Phone,
            "ipv4" => Validator::Ipv4,
            "ipv6" => Validator::Ipv6,
            "email" => Validator::Email,
            "secret" => Validator::Secret,
            "jwt" => Validator::Jwt,
            "pem_private_key" => Validator::PemPrivateKey,
            _ => return None,
        })
    }

    /// Checks the candidate `text[start..end]` and returns the accepted span
    /// end (a validator may shorten a greedy match, e.g. an IBAN followed by
    /// an upper-case word) and the canonical value; `None` rejects it.
    pub(crate) fn check(
        self,
        kind: PiiKind,
        text: &str,
        start: usize,
        end: usize,
    ) -> Option<(usize, String)> {
        let value = text.get(start..end)?;
        if value.is_empty() {
            return None;
        }
        let before = &text[..start];
        let after = &text[end..];
        let ok = match self {
            Validator::None => true,
            Validator::Luhn => card_number(value),
            Validator::IbanMod97 => {
                let cut = iban_prefix(value)?;
                let end = start + cut;
                let value = text.get(start..end)?;
                return Some((end, canonical(kind, value)));
            }
            Validator::CnResidentId => cn_resident_id(value),
            Validator::UsSsn => us_ssn(value) && !numeric_continuation(before, after),
            Validator::UkNino => uk_nino(value),
            Validator::Phone => {
                if before.ends_with(|c: char| c.is_ascii_alphanumeric() || "+-./".contains(c)) {
                    return None;
                }
                // The grouping regex is greedy: "+44 20 7946 0958 4111…"
                // runs on into the next number. Try the whole candidate,
                // then each shorter prefix ending before a separator.
                let cuts = std::iter::once(value.len()).chain(
                    value
                        .char_indices()
                        .rev()
                        .filter(|&(i, c)| i > 0 && " .-".contains(c))
                        .map(|(i, _)| i),
                );
                for cut in cuts {
                    let (v, rest) = value.split_at(cut);
                    let after = if cut == value.len() { after } else { rest };
                    if phone(v)
                        && !after.starts_with(|c: char| c.is_ascii_digit())
                        && !numeric_continuation(before, after)
                    {
                        return Some((start + cut, canonical(kind, v)));
                    }
                }
                return None;
            }
            Validator::Ipv4 => ipv4(value) && ipv4_context(before, after),
            Validator::Ipv6 => ipv6(value).is_some() && ipv6_context(before, after),
            Validator::Email => email(value),
            Validator::Secret => secret(value) && token_boundaries(before, after),
            Validator::Jwt => jwt(value) && token_boundaries(before, after),
            Validator::PemPrivateKey => {
                return pem_private_key(value).map(|body| (end, body));
            }
        };
        ok.then(|| (end, canonical(kind, value)))
    }
}

/// The normalised form that is hashed, so that one value written two ways
/// is one value: `4111-1111-1111-1111` and `4111 1111 1111 1111`,
/// `Alice@Example.com` and `alice@example.com`, `+1 (555) 123-4567` and
/// `+15551234567`.
pub fn canonical(kind: PiiKind, value: &str) -> String {
    match kind {
        PiiKind::Email => value.to_ascii_lowercase(),
        PiiKind::Phone => {
            // "+44 (0)20 …": the bracketed trunk 0 is dialled only inside
            // the country, so it is not part of the international number.
            let v = value.replace("(0)", "");
            let mut out = String::with_capacity(v.len());
            if v.trim_start().starts_with('+') {
                out.push('+');
            }
            out.extend(v.chars().filter(char::is_ascii_digit));
            out
        }
        PiiKind::CardNumber => value.chars().filter(char::is_ascii_digit).collect(),
        PiiKind::Iban | PiiKind::NationalId => value
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .map(|c| c.to_ascii_uppercase())
            .collect(),
        PiiKind::IpAddress => {
            if let Some(a) = ipv6(value) {
                a.to_string()
            } else if let Some(o) = ipv4_octets(value) {
                format!("{}.{}.{}.{}", o[0], o[1], o[2], o[3])
            } else {
                value.to_string()
            }
        }
        PiiKind::Secret | PiiKind::Keyword => value.to_string(),
    }
}

/// Luhn (mod 10) over a string of ASCII digits; false for anything else or
/// for fewer than two digits.
pub fn luhn(digits: &str) -> bool {
    let b = digits.as_bytes();
    if b.len() < 2 || !b.iter().all(u8::is_ascii_digit) {
        return false;
    }
    let mut sum = 0u32;
    for (i, &c) in b.iter().rev().enumerate() {
        let mut d = u32::from(c - b'0');
        if i % 2 == 1 {
            d *= 2;
            if d > 9 {
                d -= 9;
            }
        }
        sum += d;
    }
    sum.is_multiple_of(10)
}

/// A card number as written (digits with optional space/dash separators):
/// 12–19 digits, Luhn-valid, and not one digit repeated (`0000 0000 …` is
/// Luhn-valid and a common placeholder).
pub fn card_number(value: &str) -> bool {
    let digits: String = value.chars().filter(char::is_ascii_digit).collect();
    if !(12..=19).contains(&digits.len()) {
        return false;
    }
    if value
        .chars()
        .any(|c| !c.is_ascii_digit() && c != ' ' && c != '-')
    {
        return false;
    }
    let first = digits.as_bytes()[0];
    if digits.bytes().all(|b| b == first) {
        return false;
    }
    luhn(&digits)
}

/// IBAN lengths per country (SWIFT IBAN registry). Only countries listed
/// here are accepted: an unknown two-letter prefix followed by digits is far
/// more often a product code than a bank account, and with the length check
/// gone mod-97 alone lets one random string in 97 through.
const IBAN_LENGTHS: &[(&str, usize)] = &[
    ("AD", 24),
    ("AE", 23),
    ("AL", 28),
    ("AT", 20),
    ("AZ", 28),
    ("BA", 20),
    ("BE", 16),
    ("BG", 22),
    ("BH", 22),
    ("BR", 29),
    ("CH", 21),
    ("CY", 28),
    ("CZ", 24),
    ("DE", 22),
    ("DK", 18),
    ("EE", 20),
    ("EG", 29),
    ("ES", 24),
    ("FI", 18),
    ("FO", 18),
    ("FR", 27),
    ("GB", 22),
    ("GE", 22),
    ("GI", 23),
    ("GL", 18),
    ("GR", 27),
    ("HR", 21),
    ("HU", 28),
    ("IE", 22),
    ("IL", 23),
    ("IS", 26),
    ("IT", 27),
    ("JO", 30),
    ("KW", 30),
    ("KZ", 20),
    ("LB", 28),
    ("LI", 21),
    ("LT", 20),
    ("LU", 20),
    ("LV", 21),
    ("MC", 27),
    ("MD", 24),
    ("ME", 22),
    ("MK", 19),
    ("MT", 31),
    ("MU", 30),
    ("NL", 18),
    ("NO", 15),
    ("PK", 24),
    ("PL", 28),
    ("PS", 29),
    ("PT", 25),
    ("QA", 29),
    ("RO", 24),
    ("RS", 22),
    ("SA", 24),
    ("SE", 24),
    ("SI", 19),
    ("SK", 24),
    ("SM", 27),
    ("TN", 24),
    ("TR", 26),
    ("UA", 29),
    ("VA", 22),
    ("XK", 20),
];

/// The registered IBAN length for a country code.
pub fn iban_length(country: &str) -> Option<usize> {
    IBAN_LENGTHS
        .iter()
        .find(|(c, _)| *c == country)
        .map(|&(_, n)| n)
}

/// ISO 13616 check: known country, its exact length, check digits 02–98,
/// and the mod-97 remainder 1. Spaces are ignored; lower case is rejected
/// (IBANs are printed in upper case, and requiring it avoids prose).
pub fn iban_mod97(value: &str) -> bool {
    let compact: String = value.chars().filter(|&c| c != ' ').collect();
    let b = compact.as_bytes();
    if b.len() < 5
        || !b[..2].iter().all(u8::is_ascii_uppercase)
        || !b[2..4].iter().all(u8::is_ascii_digit)
        || !b
            .iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
    {
        return false;
    }
    if iban_length(&compact[..2]) != Some(b.len()) {
        return false;
    }
    let check = &compact[2..4];
    if check == "00" || check == "01" || check == "99" {
        return false;
    }
    let mut rem: u32 = 0;
    for &c in b[4..].iter().chain(&b[..4]) {
        let v = if c.is_ascii_digit() {
            u32::from(c - b'0')
        } else {
            u32::from(c - b'A') + 10
        };
        rem = if v >= 10 {
            (rem * 100 + v) % 97
        } else {
            (rem * 10 + v) % 97
        };
    }
    rem == 1
}

/// The byte length of the IBAN at the start of a greedy candidate, which may
/// have swallowed a following upper-case word ("DE89 … 3000 THEN"): the
/// country's length decides where it ends, and the cut must fall where a
/// group ends.
fn iban_prefix(value: &str) -> Option<usize> {
    let want = iban_length(value.get(..2)?)?;
    let mut n = 0;
    for (i, c) in value.char_indices() {
        if c != ' ' {
            n += 1;
        }
        if n == want {
            let cut = i + c.len_utf8();
            let rest = &value[cut..];
            let at_group_end = rest.is_empty() || rest.starts_with(' ');
            return (at_group_end && iban_mod97(&value[..cut])).then_some(cut);
        }
    }
    None
}

/// Province-level prefixes of the administrative division code (GB/T 2260).
const CN_PROVINCES: &[u8] = &[
    11, 12, 13, 14, 15, 21, 22, 23, 31, 32, 33, 34, 35, 36, 37, 41, 42, 43, 44, 45, 46, 50, 51, 52,
    53, 54, 61, 62, 63, 64, 65, 71, 81, 82, 83, 91,
];

/// Chinese resident identity number (GB 11643-1999): 18 characters, a known
/// province prefix, a real calendar birth date between 1900 and 2099, and
/// the ISO 7064 MOD 11-2 check character (`X` for 10, either case).
pub fn cn_resident_id(value: &str) -> bool {
    const W: [u32; 17] = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2];
    const CHECK: &[u8; 11] = b"10X98765432";
    let b = value.as_bytes();
    if b.len() != 18 || !b[..17].iter().all(u8::is_ascii_digit) {
        return false;
    }
    let d = |i: usize| u32::from(b[i] - b'0');
    let province = (d(0) * 10 + d(1)) as u8;
    if !CN_PROVINCES.contains(&province) {
        return false;
    }
    let year = d(6) * 1000 + d(7) * 100 + d(8) * 10 + d(9);
    let month = d(10) * 10 + d(11);
    let day = d(12) * 10 + d(13);
    if !(1900..=2099).contains(&year) || !valid_date(year, month, day) {
        return false;
    }
    let sum: u32 = (0..17).map(|i| d(i) * W[i]).sum();
    let want = CHECK[(sum % 11) as usize];
    b[17].to_ascii_uppercase() == want
}

fn valid_date(year: u32, month: u32, day: u32) -> bool {
    let leap = (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day)
}

/// US Social Security number `AAA-GG-SSSS` (or nine digits): area not 000,
/// 666 or 900–999, group not 00, serial not 0000, and not one of the numbers
/// the SSA documents as never valid because they were printed in
/// advertisements (078-05-1120, 219-09-9999) or used as the standard
/// example (123-45-6789): those appear in many tenants' text and identify
/// nobody.
pub fn us_ssn(value: &str) -> bool {
    let digits: String = value.chars().filter(char::is_ascii_digit).collect();
    if digits.len() != 9
        || value
            .chars()
            .any(|c| !c.is_ascii_digit() && c != '-' && c != ' ')
    {
        return false;
    }
    let (area, rest) = digits.split_at(3);
    let (group, serial) = rest.split_at(2);
    if area == "000" || area == "666" || area.starts_with('9') {
        return false;
    }
    if group == "00" || serial == "0000" {
        return false;
    }
    !matches!(digits.as_str(), "078051120" | "219099999" | "123456789")
}

/// UK National Insurance number: two prefix letters (the regex restricts
/// the alphabet), six digits, suffix A–D; the prefixes HMRC never issues
/// (BG, GB, NK, KN, TN, NT, ZZ) are rejected.
pub fn uk_nino(value: &str) -> bool {
    let c: String = value
        .chars()
        .filter(|c| !c.is_whitespace())
        .map(|c| c.to_ascii_uppercase())
        .collect();
    let b = c.as_bytes();
    if b.len() != 9
        || !b[..2].iter().all(u8::is_ascii_uppercase)
        || !b[2..8].iter().all(u8::is_ascii_digit)
        || !(b'A'..=b'D').contains(&b[8])
    {
        return false;
    }
    !matches!(&c[..2], "BG" | "GB" | "NK" | "KN" | "TN" | "NT" | "ZZ")
        && !matches!(b[1], b'O')
        && !matches!(b[0], b'D' | b'F' | b'I' | b'Q' | b'U' | b'V')
}

/// A phone number in one of the shapes the rules accept. International
/// (`+`): country code not starting with 0 and 8–15 digits in all (E.164),
/// and not a signed decimal like `+1.23456789`. National: 10–11 digits
/// written with separators (a bare run of digits is a timestamp, an order
/// number or an amount far more often than a phone number; the rules only
/// pass bare runs when a word like "phone" or "手机" stands before them).
/// NANP area codes start 2–9, so `100-200-3000` is not one.
pub fn phone(value: &str) -> bool {
    let v = value.replace("(0)", "");
    let digits: String = v.chars().filter(char::is_ascii_digit).collect();
    if v.chars()
        .any(|c| !c.is_ascii_digit() && !" ()+-.".contains(c))
    {
        return false;
    }
    if let Some(rest) = v.strip_prefix('+') {
        if rest.starts_with('0') || !(8..=15).contains(&digits.len()) {
            return false;
        }
        // One dot and nothing else: a decimal number, not a phone.
        let dots = rest.matches('.').count();
        let others = rest.chars().filter(|c| " -()".contains(*c)).count();
        return !(dots == 1 && others == 0);
    }
    let nanp_trunk = v.len() > 2 && v.starts_with('1') && " -.".contains(&v[1..2]);
    let nanp = match digits.len() {
        10 => &digits[..],
        11 if nanp_trunk => &digits[1..],
        // Chinese mobile: 1[3-9]x xxxx xxxx.
        11 => return digits.starts_with('1') && matches!(digits.as_bytes()[1], b'3'..=b'9'),
        _ => return false,
    };
    // NANP: area code 2–9xx; separators, if several, are the same one.
    let body = if nanp_trunk { &v[2..] } else { &v[..] };
    let seps: Vec<char> = body.chars().filter(|c| "-.".contains(*c)).collect();
    if seps.windows(2).any(|w| w[0] != w[1]) {
        return false;
    }
    matches!(nanp.as_bytes()[0], b'2'..=b'9')
}

fn ipv4_octets(value: &str) -> Option<[u8; 4]> {
    let mut out = [0u8; 4];
    let mut parts = value.split('.');
    for o in &mut out {
        let p = parts.next()?;
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        if p.len() > 1 && p.starts_with('0') {
            return None;
        }
        *o = p.parse().ok()?;
    }
    parts.next().is_none().then_some(out)
}

/// Dotted-quad IPv4 that plausibly names a host: octets 0–255 without
/// leading zeros; not 0.0.0.0/8, loopback, broadcast or a netmask
/// (255.255.255.0) — the same for every tenant — and not four single-digit
/// octets: `1.2.3.4`, `1.0.0.0`, `2.0.0.1` are far more often version
/// numbers (.NET assembly versions are exactly this shape) than hosts, and
/// the few real hosts of that shape (1.1.1.1, 8.8.8.8, 9.9.9.9) are public
/// resolvers that identify nobody.
pub fn ipv4(value: &str) -> bool {
    let Some(o) = ipv4_octets(value) else {
        return false;
    };
    if o[0] == 0 || o[0] == 127 || o == [255; 4] {
        return false;
    }
    // Home-router and tutorial defaults (192.168.x.x, 10.0.0.x): in every
    // setup guide and nobody's in particular. Other private addresses
    // (10.12.0.7, 172.20.x.x) do describe someone's network.
    if (o[0] == 192 && o[1] == 168) || (o[0] == 10 && o[1] == 0 && o[2] == 0) {
        return false;
    }
    if o[0] == 255 {
        // netmask: ones then zeros
        let m = u32::from_be_bytes(o);
        if m.leading_ones() + m.trailing_zeros() == 32 {
            return false;
        }
    }
    !o.iter().all(|&x| x < 10)
}

/// Words that, right before a dotted quad, say it is a version or a section
/// number, not an address.
const VERSION_WORDS: &[&str] = &[
    "version", "ver", "v", "release", "build", "section", "sec", "§", "chapter",
];

fn ipv4_context(before: &str, after: &str) -> bool {
    // Part of a longer dotted run: 1.22.33.44.5 or 10.1.22.33.44.
    if before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '.' || c == '_')
        || after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
    {
        return false;
    }
    let mut a = after.chars();
    if a.next() == Some('.') && a.next().is_some_and(|c| c.is_ascii_digit()) {
        return false;
    }
    // "v 10.0.0.1", "version 10.2.3.4", "Section: 10.2.3.4" ("v10.0.0.1"
    // was refused above: a letter touches the number).
    let tail = before.trim_end_matches([' ', ':', '\t']);
    let word_start = tail
        .char_indices()
        .rev()
        .find(|(_, c)| !(c.is_alphanumeric() || *c == '§'))
        .map_or(0, |(i, c)| i + c.len_utf8());
    let word = &tail[word_start..];
    !VERSION_WORDS.iter().any(|w| word.eq_ignore_ascii_case(w))
}

/// Parses an IPv6 address and keeps only ones that look like a host someone
/// wrote down: not `::`, not `::1`, at least three non-empty groups (so
/// `fe80::1` and code like `a::b` or `dead::beef` pass by), at least one
/// decimal digit, and not eight two-digit groups (an EUI-64 or a byte dump
/// like `00:1a:2b:ff:fe:3c:4d:5e`).
pub fn ipv6(value: &str) -> Option<Ipv6Addr> {
    if !value.contains(':') {
        return None;
    }
    let addr: Ipv6Addr = value.parse().ok()?;
    if addr.is_unspecified() || addr.is_loopback() {
        return None;
    }
    let groups: Vec<&str> = value.split(':').collect();
    if groups.iter().filter(|g| !g.is_empty()).count() < 3 {
        return None;
    }
    if !value.bytes().any(|b| b.is_ascii_digit()) {
        return None;
    }
    if groups.len() == 8 && groups.iter().all(|g| g.len() == 2) {
        return None;
    }
    Some(addr)
}

/// Not glued to a longer token; and not cut before an embedded IPv4 tail
/// (`…:ffff:192.0.2.1`), which `ip.v4` reports instead.
fn ipv6_context(before: &str, after: &str) -> bool {
    let mut a = after.chars();
    let dotted = a.next() == Some('.') && a.next().is_some_and(|c| c.is_ascii_digit());
    !dotted
        && !before
            .ends_with(|c: char| c.is_ascii_alphanumeric() || c == ':' || c == '_' || c == '.')
        && !after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == ':' || c == '_')
}

/// Image names (`logo@2x.png`) and file extensions as a "TLD" look like
/// emails to a regex.
const FILE_TLDS: &[&str] = &[
    "png", "jpg", "jpeg", "gif", "svg", "webp", "ico", "css", "js", "ts", "json", "md", "txt",
];

/// An email address the regex found: no empty or dotted-edge local part, no
/// `..`, labels not starting or ending with `-`, an alphabetic TLD that is
/// not a file extension, and not `@2x`-style image names.
pub fn email(value: &str) -> bool {
    let Some((local, domain)) = value.rsplit_once('@') else {
        return false;
    };
    if local.is_empty()
        || local.starts_with('.')
        || local.ends_with('.')
        || local.contains("..")
        || domain.len() > 253
    {
        return false;
    }
    let labels: Vec<&str> = domain.split('.').collect();
    if labels.len() < 2
        || labels
            .iter()
            .any(|l| l.is_empty() || l.starts_with('-') || l.ends_with('-'))
    {
        return false;
    }
    // RFC 2606's documentation domains: placeholders in every tutorial and
    // answer, never anyone's address.
    let lower = domain.to_ascii_lowercase();
    if ["example.com", "example.org", "example.net"]
        .iter()
        .any(|d| lower == *d || lower.ends_with(&format!(".{d}")))
    {
        return false;
    }
    let tld = labels[labels.len() - 1];
    if !tld.bytes().all(|b| b.is_ascii_alphabetic())
        || FILE_TLDS.iter().any(|t| tld.eq_ignore_ascii_case(t))
    {
        return false;
    }
    let first = labels[0].as_bytes();
    let scale = first.len() >= 2
        && first[..first.len() - 1].iter().all(u8::is_ascii_digit)
        && first[first.len() - 1].eq_ignore_ascii_case(&b'x');
    !scale
}

/// Markers of documentation placeholders, not live credentials.
const PLACEHOLDERS: &[&str] = &[
    "example",
    "placeholder",
    "redacted",
    "xxxxxxxx",
    "********",
    "abcdefgh",
    "12345678",
    "...",
];

/// Shape checks shared by every token rule. A real key is random: it has
/// letters and digits and many distinct characters. Pure hex of 32+
/// characters is a hash (a git SHA is 40 hex digits, SHA-256 64), never one
/// of the formats the secret rules describe, so it is rejected outright.
/// Documentation placeholders (`AKIAIOSFODNN7EXAMPLE`, `sk-xxxxxxxx…`) are
/// rejected too: they appear in every tenant's text and leak nothing.
pub fn secret(value: &str) -> bool {
    let lower = value.to_ascii_lowercase();
    if PLACEHOLDERS.iter().any(|p| lower.contains(p)) {
        return false;
    }
    let alnum: Vec<u8> = value.bytes().filter(u8::is_ascii_alphanumeric).collect();
    if alnum.len() >= 32 && alnum.iter().all(u8::is_ascii_hexdigit) && alnum.len() == value.len() {
        return false;
    }
    if !alnum.iter().any(u8::is_ascii_digit) || !alnum.iter().any(u8::is_ascii_alphabetic) {
        return false;
    }
    let mut seen = [false; 128];
    let mut distinct = 0;
    for &b in &alnum {
        if !seen[usize::from(b)] {
            seen[usize::from(b)] = true;
            distinct += 1;
        }
    }
    distinct >= (alnum.len() / 3).min(10)
}

/// A token must not be the middle of a longer token: the characters either
/// side are not base64url/base64 token characters.
fn token_boundaries(before: &str, after: &str) -> bool {
    let tok = |c: char| c.is_ascii_alphanumeric() || "_-+/".contains(c);
    !before.ends_with(tok) && !after.starts_with(tok)
}

/// A JSON Web Token: three base64url segments whose header decodes to a
/// JSON object naming an `alg`, and a token-shaped whole.
pub fn jwt(value: &str) -> bool {
    let mut parts = value.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    if p.is_empty() || s.len() < 16 {
        return false;
    }
    let Some(header) = base64url_decode(h) else {
        return false;
    };
    let header = String::from_utf8_lossy(&header);
    let header = header.trim_start();
    header.starts_with('{') && header.contains("\"alg\"") && secret(s)
}

/// Decodes unpadded base64url; `None` on any character outside the alphabet.
pub(crate) fn base64url_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for b in s.bytes() {
        let v = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            b'=' => break,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// A PEM private-key block with a real body: at least 64 base64 characters
/// between the armour lines, none of them an elision. Returns the canonical
/// form: the body's base64 characters without whitespace or header lines, so
/// that the same key re-wrapped at another width, or with `\r\n`, is the
/// same value.
pub fn pem_private_key(value: &str) -> Option<String> {
    // The body starts after the dashes closing the BEGIN line.
    let body_start = value.get(5..)?.find("-----")? + 10;
    let body_end = value.rfind("-----END")?;
    let body = value.get(body_start..body_end)?;
    let mut out = String::new();
    for line in body.lines() {
        let line = line.trim();
        // "Proc-Type: 4,ENCRYPTED" and "DEK-Info: …" header lines.
        if line.contains(':') {
            continue;
        }
        out.extend(line.chars().filter(|c| !c.is_whitespace()));
    }
    let base64 = out
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=');
    (base64 && out.len() >= 64 && secret(&out)).then_some(out)
}

/// `12-34-5678` inside `99-12-34-5678-1`: the candidate continues a longer
/// dash- or dot-joined number on either side.
fn numeric_continuation(before: &str, after: &str) -> bool {
    let b = before.as_bytes();
    let glued_before =
        b.len() >= 2 && matches!(b[b.len() - 1], b'-' | b'.') && b[b.len() - 2].is_ascii_digit();
    let a = after.as_bytes();
    let glued_after = a.len() >= 2 && matches!(a[0], b'-' | b'.') && a[1].is_ascii_digit();
    glued_before || glued_after
}
