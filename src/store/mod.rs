//! The fingerprint store: which tenant's content produced which keyed hash,
//! over a sliding window.
//!
//! The store never sees text or tenant ids: only keyed 64-bit hashes of
//! shingles and PII values, and keyed 64-bit tenant keys. Its interface is
//! batch-shaped and asynchronous so that a shared implementation (Redis, one
//! window for every replica) can answer a whole response's lookups in one
//! round trip; the in-memory implementation answers at once.

pub mod memory;

use futures_util::future::BoxFuture;

/// A tenant as the store knows it: a keyed hash of its id.
pub type TenantKey = u64;

/// Where recorded content came from. Residual KV pages hold both prompts and
/// answers, so both are recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentKind {
    Prompt,
    Answer,
}

/// One piece of a tenant's content to remember.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub tenant: TenantKey,
    pub kind: ContentKind,
    /// Winnowed shingle hashes and PII value hashes (already domain-separated
    /// by the caller, so one namespace serves both).
    pub hashes: Vec<u64>,
}

/// Who owns the hashes of one response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lookup {
    pub requester: TenantKey,
    pub hashes: Vec<u64>,
}

/// What the store knows of one queried hash.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owners {
    /// Tenants other than the requester whose content produced this hash.
    pub foreign: Vec<TenantKey>,
    /// The requester's own content produced it too: not evidence.
    pub own: bool,
    /// Distinct tenants (the requester included) in the window: boilerplate
    /// when many.
    pub tenants: u32,
}

/// The answer to one [`Lookup`]: only the hashes someone owns, as
/// `(index into Lookup::hashes, owners)`, in index order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LookupResult {
    pub hits: Vec<(usize, Owners)>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Records held.
    pub entries: u64,
    /// Distinct hashes held.
    pub hashes: u64,
    /// Approximate bytes held.
    pub bytes: u64,
    /// Records evicted since start (window or memory cap).
    pub evictions: u64,
    /// Hashes looked up since start.
    pub lookups: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("fingerprint store unavailable: {0}")]
    Unavailable(String),
}

/// A fingerprint store. Calls are batch-shaped: one call per exchange (or
/// per several), never one per hash.
pub trait FingerprintStore: Send + Sync + 'static {
    fn record(&self, batch: Vec<Record>) -> BoxFuture<'_, Result<(), StoreError>>;
    fn lookup<'a>(
        &'a self,
        batch: &'a [Lookup],
    ) -> BoxFuture<'a, Result<Vec<LookupResult>, StoreError>>;
    fn stats(&self) -> StoreStats;
}
