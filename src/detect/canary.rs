//! Canaries and honeytokens: strings planted on purpose (in a canary
//! tenant's prompts, in a tenant's documents) that must never appear in an
//! answer to anyone else. Matched with aho-corasick in every response.

use aho_corasick::{AhoCorasick, MatchKind};
use serde::Deserialize;

/// One configured canary.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CanaryConfig {
    /// The planted string. At least 8 characters, so it cannot occur by
    /// chance.
    pub value: String,
    /// The tenant (as residue resolves it: a header value, `jwt:…`, or
    /// `key:…`) that owns it and may see it. Without one, the canary belongs
    /// to nobody: it is an incident in any answer.
    pub tenant: Option<String>,
}

/// A canary found in a response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanaryHit {
    /// Index into the configured list (stable: incidents name it, never the
    /// value).
    pub index: usize,
    pub start: usize,
    pub end: usize,
}

pub struct Canaries {
    matcher: Option<AhoCorasick>,
    owners: Vec<Option<String>>,
}

impl Canaries {
    /// Validates and compiles the list; every problem is reported.
    pub fn new(list: &[CanaryConfig]) -> Result<Self, Vec<String>> {
        let mut errors = Vec::new();
        for (i, c) in list.iter().enumerate() {
            if c.value.chars().count() < 8 {
                errors.push(format!(
                    "canary[{i}].value: shorter than 8 characters; it could occur by chance"
                ));
            }
            if let Some(t) = &c.tenant {
                if t.is_empty() {
                    errors.push(format!("canary[{i}].tenant: empty"));
                }
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let matcher = if list.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(list.iter().map(|c| c.value.as_str()))
                    .map_err(|e| vec![format!("canary: {e}")])?,
            )
        };
        Ok(Canaries {
            matcher,
            owners: list.iter().map(|c| c.tenant.clone()).collect(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.matcher.is_none()
    }

    /// Canaries in `text` that `requester` does not own.
    pub fn foreign_in(&self, text: &str, requester: &str) -> Vec<CanaryHit> {
        let Some(m) = &self.matcher else {
            return Vec::new();
        };
        m.find_iter(text)
            .filter(|hit| self.owners[hit.pattern().as_usize()].as_deref() != Some(requester))
            .map(|hit| CanaryHit {
                index: hit.pattern().as_usize(),
                start: hit.start(),
                end: hit.end(),
            })
            .collect()
    }

    /// The owner of canary `index`, if any.
    pub fn owner(&self, index: usize) -> Option<&str> {
        self.owners.get(index).and_then(|o| o.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(value: &str, tenant: Option<&str>) -> CanaryConfig {
        CanaryConfig {
            value: value.into(),
            tenant: tenant.map(str::to_string),
        }
    }

    #[test]
    fn owners_may_see_their_own_canaries_nobody_elses() {
        let list = [
            c("HONEY-acme-7731", Some("acme")),
            c("RESIDUE-CANARY-0001", None),
        ];
        let canaries = Canaries::new(&list).unwrap();
        let text = "x HONEY-acme-7731 y RESIDUE-CANARY-0001 z";
        let for_acme = canaries.foreign_in(text, "acme");
        assert_eq!(for_acme.len(), 1);
        assert_eq!(for_acme[0].index, 1);
        assert_eq!(
            &text[for_acme[0].start..for_acme[0].end],
            "RESIDUE-CANARY-0001"
        );
        let for_other = canaries.foreign_in(text, "globex");
        assert_eq!(
            for_other.iter().map(|h| h.index).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert!(canaries.foreign_in("nothing here", "globex").is_empty());
    }

    #[test]
    fn short_or_unowned_empty_canaries_are_rejected() {
        let errs = Canaries::new(&[c("short", None), c("long enough value", Some(""))])
            .err()
            .unwrap();
        assert_eq!(errs.len(), 2);
        assert!(errs[0].starts_with("canary[0].value"));
        assert!(errs[1].starts_with("canary[1].tenant"));
    }

    #[test]
    fn no_canaries_match_nothing() {
        let canaries = Canaries::new(&[]).unwrap();
        assert!(canaries.is_empty());
        assert!(canaries.foreign_in("anything", "t").is_empty());
    }
}
