//! Detectors: pure functions from one scanned exchange to findings. They do
//! no I/O; the observer turns findings into incidents and metrics.

pub mod accounting;
pub mod canary;
pub mod cross_tenant;
pub mod semantic;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::observe::Exchange;
use crate::protocol::Output;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Low,
    Medium,
    High,
    Critical,
}

impl Severity {
    pub fn as_str(&self) -> &'static str {
        match self {
            Severity::Low => "low",
            Severity::Medium => "medium",
            Severity::High => "high",
            Severity::Critical => "critical",
        }
    }
}

/// One thing a detector found. `evidence` never holds raw prompt or answer
/// text: counts, offsets, rule ids and hashes only.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub detector: &'static str,
    pub severity: Severity,
    /// 0 (barely) to 1 (certainly).
    pub score: f64,
    pub evidence: serde_json::Value,
    /// Byte ranges of the answer text the finding is about (for redaction);
    /// empty when it is about the whole exchange.
    pub spans: Vec<(usize, usize)>,
}

/// Everything a detector may look at for one exchange.
pub struct ScanInput<'a> {
    pub exchange: &'a Exchange,
    /// The decoded answer text and usage.
    pub output: &'a Output,
    /// residue's own count of the prompt's tokens.
    pub prompt_tokens: u64,
    /// How `prompt_tokens` was counted (`estimate` or `tokenizer`).
    pub counter: &'static str,
}

pub trait Detector: Send + Sync {
    fn name(&self) -> &'static str;
    fn inspect(&self, input: &ScanInput<'_>) -> Vec<Finding>;
}

impl<T: Detector> Detector for std::sync::Arc<T> {
    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn inspect(&self, input: &ScanInput<'_>) -> Vec<Finding> {
        (**self).inspect(input)
    }
}

/// How detectors know tenants and name them in incidents: by the keyed hash
/// [`cross_tenant::tenant_key`], whose hex form equals the incident's
/// `tenant` field; by raw id only when incidents show raw tenants.
pub struct TenantNames {
    key: crate::hash::HashKey,
    raw: bool,
    names: Mutex<HashMap<crate::store::TenantKey, Arc<str>>>,
}

impl TenantNames {
    pub fn new(key: crate::hash::HashKey, raw: bool) -> TenantNames {
        TenantNames {
            key,
            raw,
            names: Mutex::new(HashMap::new()),
        }
    }

    /// The tenant's key, remembering its id when incidents show raw ids.
    pub fn key_of(&self, tenant: &crate::tenant::Tenant) -> crate::store::TenantKey {
        let k = cross_tenant::tenant_key(&self.key, &tenant.id);
        if self.raw {
            let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
            if names.len() > 100_000 {
                names.clear();
            }
            names.entry(k).or_insert_with(|| tenant.id.clone());
        }
        k
    }

    /// The key of a tenant id (a canary's owner, say).
    pub fn key_of_id(&self, id: &str) -> crate::store::TenantKey {
        cross_tenant::tenant_key(&self.key, id)
    }

    /// How an incident names the tenant: its raw id when configured and
    /// known, else the key in hex.
    pub fn show(&self, k: crate::store::TenantKey) -> String {
        if self.raw {
            if let Some(name) = self.names.lock().unwrap_or_else(|p| p.into_inner()).get(&k) {
                return name.to_string();
            }
        }
        format!("{k:016x}")
    }
}
