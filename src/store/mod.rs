//! The fingerprint store: which tenant's content produced which keyed hash,
//! over a sliding window.
//!
//! The store never sees text or tenant ids: only keyed hashes of shingles
//! and PII values, and keyed 64-bit tenant keys. Each record keeps
//! - its winnowed shingle fingerprints, indexed: the candidates;
//! - a Bloom filter of every pair of adjacent shingles, and of every
//!   shingle alone: the verifier. A
//!   candidate match is extended left and right through the query's
//!   consecutive shingles while the record holds each of them right after
//!   the one before, so the store reports real shared runs — not single
//!   k-gram coincidences ("here's an example of"), nor runs stitched from
//!   shingles scattered over the record;
//! - its PII value hashes, indexed exactly.
//!
//! Its interface is batch-shaped and asynchronous so that a shared
//! implementation (Redis, one window for every replica) can answer a whole
//! response in one round trip; the in-memory implementation answers at once.

pub mod bloom;
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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    pub tenant: TenantKey,
    pub kind: Option<ContentKind>,
    /// Winnowed shingle hashes (indexed).
    pub fingerprints: Vec<u64>,
    /// Every shingle hash, in text order (kept only in the record's Bloom
    /// filter, as adjacent pairs and one by one).
    pub shingles: Vec<u64>,
    /// PII value hashes (indexed exactly).
    pub pii: Vec<u64>,
}

/// One answer to check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lookup {
    pub requester: TenantKey,
    /// Every shingle hash of the answer, in order.
    pub shingles: Vec<u64>,
    pub pii: Vec<u64>,
    /// Content this many distinct tenants hold is boilerplate: the store
    /// need not verify or report it (0: no cut-off).
    pub common_tenants: u32,
}

/// Who owns one queried PII value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owners {
    /// Tenants other than the requester whose content held it.
    pub foreign: Vec<TenantKey>,
    /// The requester's own content held it too: not evidence.
    pub own: bool,
    /// Distinct tenants (the requester included) inside the window.
    pub tenants: u32,
}

/// A run of the answer's consecutive shingles that one other tenant's
/// record holds too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunHit {
    pub tenant: TenantKey,
    /// Shingle indices into `Lookup::shingles`, inclusive.
    pub first: usize,
    pub last: usize,
    /// Distinct tenants whose content holds the run's seed fingerprint:
    /// boilerplate when many.
    pub tenants: u32,
    /// Whether the matching record was a prompt or an answer.
    pub kind: Option<ContentKind>,
    /// Which record matched (opaque, unique inside the store's window):
    /// runs of different records are never joined into one, since a leak
    /// comes from one place.
    pub record: u64,
}

/// The answer to one [`Lookup`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LookupResult {
    /// Foreign runs, none of whose seed fingerprints the requester owns.
    pub runs: Vec<RunHit>,
    /// `(index into Lookup::pii, owners)` for values someone owns.
    pub pii: Vec<(usize, Owners)>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Records held.
    pub entries: u64,
    /// Indexed hashes held (fingerprints and PII values).
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
