//! The in-memory fingerprint store (after mini-redis's `db.rs`): a
//! cheap-to-clone handle around `Mutex<State>`, records in arrival order for
//! eviction, and indexes from hash to the records that produced it.
//!
//! The lock is a `std::sync::Mutex`, not a Tokio one: nothing asynchronous
//! happens while it is held, and every critical section is one batch of
//! hash-map operations.
//!
//! Memory: fingerprints are indexed by 32 bits of their hash (a collision
//! only proposes a candidate, which the record's Bloom filter over the full
//! 64-bit hashes then rejects), postings are `(tenant index, record id)`
//! pairs of `u32`, and records keep their fingerprints (for eviction) and a
//! Bloom filter of every pair of adjacent shingles and of every shingle
//! alone (for verification). PII values are indexed
//! by their full 64-bit hash: they have no second check.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use super::bloom::Bloom;
use super::{
    ContentKind, FingerprintStore, Lookup, LookupResult, Owners, Record, RunHit, StoreError,
    StoreStats, TenantKey,
};

/// Approximate costs, for the memory cap: an index slot (key, posting,
/// hashbrown's control byte and slack), a fingerprint kept in its record,
/// a PII posting, and a record's fixed overhead.
const FP_SLOT_BYTES: usize = 16;
const FP_KEPT_BYTES: usize = 4;
const PII_BYTES: usize = 64;
const RECORD_BYTES: usize = 96;

/// Keys are keyed hashes already, uniformly spread: hashing them again with
/// SipHash (the std default) only costs time. This hasher mixes the key once.
#[derive(Default, Clone, Copy)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Map<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// A `(tenant index, record id)` posting.
type Posting = (u32, u32);

const PRESENCE_SLOTS: usize = 1 << 20;

fn presence_slot(fp: u32) -> usize {
    (fp.wrapping_mul(0x9e37_79b1) >> 12) as usize
}

/// Postings kept per fingerprint (the newest).
const MAX_POSTINGS: usize = 64;

/// Marks an index slot whose postings live in `State::multi`.
const MULTI: u32 = u32::MAX;

#[derive(Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    window: Duration,
    max_bytes: usize,
}

#[derive(Default)]
struct State {
    tenants: Map<TenantKey, u32>,
    tenant_keys: Vec<TenantKey>,
    /// Records held per tenant index; an index whose count drops to zero is
    /// freed for reuse, so tenants that come and go (rotating ids) do not
    /// grow the table without bound.
    tenant_records: Vec<u32>,
    free_tenants: Vec<u32>,
    /// Fingerprint (32 bits) → its only posting, or `(MULTI, _)`.
    fps: Map<u32, Posting>,
    /// A one-hash counting filter in front of `fps`: most of an answer's
    /// shingles are nobody's fingerprint, and a 1 MiB array answers that
    /// from cache where the map would miss it. Saturated counters stay put
    /// (never a false "absent").
    presence: Vec<u8>,
    /// Fingerprints with several postings.
    multi: Map<u32, Vec<Posting>>,
    pii: Map<u64, Vec<Posting>>,
    records: VecDeque<Held>,
    /// The id of `records[0]`.
    first_id: u32,
    bytes: usize,
    evictions: u64,
    lookups: u64,
}

struct Held {
    at: Instant,
    tenant: u32,
    kind: Option<ContentKind>,
    fps: Box<[u32]>,
    pii: Box<[u64]>,
    bloom: Bloom,
    bytes: usize,
}

impl State {
    /// The tenant's index, counting one more record for it.
    fn tenant_index(&mut self, key: TenantKey) -> u32 {
        if let Some(i) = self.tenants.get(&key) {
            self.tenant_records[*i as usize] += 1;
            return *i;
        }
        let i = match self.free_tenants.pop() {
            Some(i) => {
                self.tenant_keys[i as usize] = key;
                self.tenant_records[i as usize] = 1;
                i
            }
            None => {
                self.tenant_keys.push(key);
                self.tenant_records.push(1);
                (self.tenant_keys.len() - 1) as u32
            }
        };
        self.tenants.insert(key, i);
        i
    }

    /// One record of the tenant's is gone; frees its index with the last.
    /// (Its postings went with its records, so nothing refers to it.)
    fn release_tenant(&mut self, i: u32) {
        let Some(n) = self.tenant_records.get_mut(i as usize) else {
            return;
        };
        *n = n.saturating_sub(1);
        if *n == 0 {
            let key = self.tenant_keys[i as usize];
            self.tenants.remove(&key);
            self.free_tenants.push(i);
        }
    }

    fn postings(&self, fp: u32) -> &[Posting] {
        match self.fps.get(&fp) {
            Some((MULTI, _)) => self.multi.get(&fp).map(|v| v.as_slice()).unwrap_or(&[]),
            Some(p) => std::slice::from_ref(p),
            None => &[],
        }
    }

    fn record_at(&self, id: u32) -> Option<&Held> {
        self.records.get(id.wrapping_sub(self.first_id) as usize)
    }

    fn may_hold(&self, fp: u32) -> bool {
        self.presence.is_empty() || self.presence[presence_slot(fp)] != 0
    }

    fn add_fp(&mut self, fp: u32, posting: Posting) {
        if !self.presence.is_empty() {
            let c = &mut self.presence[presence_slot(fp)];
            *c = c.saturating_add(1);
        }
        match self.fps.get(&fp).copied() {
            None => {
                self.fps.insert(fp, posting);
            }
            Some((MULTI, _)) => {
                let v = self.multi.entry(fp).or_default();
                // A fingerprint this many records share is boilerplate many
                // times over: keep the newest postings only, so that lookups
                // and evictions stay cheap however hot it gets.
                if v.len() >= MAX_POSTINGS {
                    v.remove(0);
                }
                v.push(posting);
            }
            Some(one) => {
                self.fps.insert(fp, (MULTI, 0));
                self.multi.insert(fp, vec![one, posting]);
            }
        }
    }

    fn remove_fp(&mut self, fp: u32, posting: Posting) {
        if !self.presence.is_empty() {
            let c = &mut self.presence[presence_slot(fp)];
            if *c != u8::MAX {
                *c = c.saturating_sub(1);
            }
        }
        match self.fps.get(&fp).copied() {
            Some((MULTI, _)) => {
                let Some(v) = self.multi.get_mut(&fp) else {
                    return;
                };
                v.retain(|p| *p != posting);
                if v.len() == 1 {
                    let only = v[0];
                    self.multi.remove(&fp);
                    self.fps.insert(fp, only);
                } else if v.is_empty() {
                    self.multi.remove(&fp);
                    self.fps.remove(&fp);
                }
            }
            Some(p) if p == posting => {
                self.fps.remove(&fp);
            }
            _ => {}
        }
    }
}

/// Whether `postings` hold at least `n` distinct tenants (n ≤ 8 is checked
/// without allocating; the common-content cut-off is small).
fn at_least_tenants(postings: &[Posting], n: u32) -> bool {
    if n == 0 {
        return true;
    }
    if n > 8 {
        return distinct_tenants(postings) >= n;
    }
    let mut seen = [u32::MAX; 8];
    let mut count = 0usize;
    for p in postings {
        if !seen[..count].contains(&p.0) {
            seen[count] = p.0;
            count += 1;
            if count as u32 >= n {
                return true;
            }
        }
    }
    false
}

fn distinct_tenants(postings: &[Posting]) -> u32 {
    match postings {
        [] => 0,
        [_] => 1,
        [a, b] => 1 + u32::from(a.0 != b.0),
        _ => {
            let mut seen: Vec<u32> = postings.iter().map(|p| p.0).collect();
            seen.sort_unstable();
            seen.dedup();
            seen.len() as u32
        }
    }
}

impl MemoryStore {
    /// `window`: how long content is remembered; `max_bytes`: the memory cap,
    /// past which the oldest records go first.
    pub fn new(window: Duration, max_bytes: usize) -> Self {
        MemoryStore {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    presence: vec![0; PRESENCE_SLOTS],
                    bytes: PRESENCE_SLOTS,
                    ..State::default()
                }),
                window,
                max_bytes,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the maps consistent enough to
        // go on (every update is a sequence of whole-entry operations).
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a batch now. Synchronous twin of [`FingerprintStore::record`].
    pub fn record_now(&self, batch: Vec<Record>) {
        let now = Instant::now();
        let mut state = self.lock();
        for record in batch {
            if record.fingerprints.is_empty() && record.pii.is_empty() {
                continue;
            }
            let tenant = state.tenant_index(record.tenant);
            let id = state.first_id.wrapping_add(state.records.len() as u32);
            let mut fps: Vec<u32> = record.fingerprints.iter().map(|h| *h as u32).collect();
            fps.sort_unstable();
            fps.dedup();
            let mut pii = record.pii;
            pii.sort_unstable();
            pii.dedup();
            for fp in &fps {
                state.add_fp(*fp, (tenant, id));
            }
            for h in &pii {
                state.pii.entry(*h).or_default().push((tenant, id));
            }
            let bloom = Bloom::new(&bloom_items(&record.shingles));
            let bytes = RECORD_BYTES
                + fps.len() * (FP_SLOT_BYTES + FP_KEPT_BYTES)
                + pii.len() * PII_BYTES
                + bloom.bytes();
            state.bytes += bytes;
            state.records.push_back(Held {
                at: now,
                tenant,
                kind: record.kind,
                fps: fps.into_boxed_slice(),
                pii: pii.into_boxed_slice(),
                bloom,
                bytes,
            });
        }
        self.evict(&mut state, now);
    }

    /// Looks a batch up now. Synchronous twin of [`FingerprintStore::lookup`].
    pub fn lookup_now(&self, batch: &[Lookup]) -> Vec<LookupResult> {
        let now = Instant::now();
        let mut state = self.lock();
        self.evict(&mut state, now);
        let mut results = Vec::with_capacity(batch.len());
        for lookup in batch {
            state.lookups += (lookup.shingles.len() + lookup.pii.len()) as u64;
            let requester = state
                .tenants
                .get(&lookup.requester)
                .copied()
                .unwrap_or(MULTI);
            let mut result = LookupResult::default();
            // Runs found so far, per record, so that each run is walked once.
            let mut walked: Vec<(u32, usize, usize)> = Vec::new();
            for (i, h) in lookup.shingles.iter().enumerate() {
                if !state.may_hold(*h as u32) {
                    continue;
                }
                let postings = state.postings(*h as u32);
                if postings.is_empty() || postings.iter().any(|p| p.0 == requester) {
                    continue;
                }
                if lookup.common_tenants > 0 && at_least_tenants(postings, lookup.common_tenants) {
                    continue;
                }
                let tenants = distinct_tenants(postings);
                for &(tenant, id) in postings {
                    if walked
                        .iter()
                        .any(|(r, f, l)| *r == id && (*f..=*l).contains(&i))
                    {
                        continue;
                    }
                    let Some(held) = state.record_at(id) else {
                        continue;
                    };
                    // The record must hold the seed next to one of its
                    // neighbours in the answer: this rejects 32-bit index
                    // collisions and lone shared shingles.
                    let q = &lookup.shingles;
                    let linked = |j: usize| held.bloom.contains(pair(q[j], q[j + 1]));
                    if !((i > 0 && linked(i - 1)) || (i + 1 < q.len() && linked(i))) {
                        continue;
                    }
                    let held_alone = |j: usize| held.bloom.contains(single(q[j]));
                    if !held_alone(i) {
                        continue;
                    }
                    // Extend through shingles the record holds *next to each
                    // other* (a run stitched from scattered places of the
                    // record is not the record's text). A shingle the
                    // requester also holds, or boilerplate, is crossed but
                    // never begins or ends a run: a stock phrase inside the
                    // record's contiguous text ("... a short note about the
                    // ...") is part of what was copied, while the
                    // requester's own words or shared public text next to
                    // one foreign shingle are not the foreign tenant's.
                    let countable = |j: usize| {
                        let p = state.postings(q[j] as u32);
                        !(p.iter().any(|p| p.0 == requester)
                            || (lookup.common_tenants > 0
                                && at_least_tenants(p, lookup.common_tenants)))
                    };
                    //
                    // Every shingle of the run must also be in the record on
                    // its own: a pair's false positive (≈2 %) alone would
                    // stretch the run, and its byte offsets, by a shingle of
                    // the requester's own text (both at once: ≈0.04 %). A
                    // shingle the filter does not hold alone is certainly not
                    // the record's (a Bloom filter has no false negatives):
                    // the run stops there.
                    let (mut first, mut last) = (i, i);
                    let mut j = first;
                    while j > 0 && linked(j - 1) && held_alone(j - 1) {
                        j -= 1;
                        if countable(j) {
                            first = j;
                        }
                    }
                    let mut j = last;
                    while j + 1 < q.len() && linked(j) && held_alone(j + 1) {
                        j += 1;
                        if countable(j) {
                            last = j;
                        }
                    }
                    walked.push((id, first, last));
                    result.runs.push(RunHit {
                        tenant: state.tenant_keys[tenant as usize],
                        first,
                        last,
                        tenants,
                        kind: held.kind,
                        record: u64::from(id),
                    });
                }
            }
            for (i, h) in lookup.pii.iter().enumerate() {
                let Some(postings) = state.pii.get(h) else {
                    continue;
                };
                let own = postings.iter().any(|p| p.0 == requester);
                let mut foreign: Vec<TenantKey> = postings
                    .iter()
                    .filter(|p| p.0 != requester)
                    .map(|p| state.tenant_keys[p.0 as usize])
                    .collect();
                foreign.sort_unstable();
                foreign.dedup();
                result.pii.push((
                    i,
                    Owners {
                        foreign,
                        own,
                        tenants: distinct_tenants(postings),
                    },
                ));
            }
            results.push(result);
        }
        results
    }

    /// Drops records older than the window, then the oldest until under the
    /// memory cap.
    fn evict(&self, state: &mut State, now: Instant) {
        while let Some(oldest) = state.records.front() {
            let expired = now.duration_since(oldest.at) > self.shared.window;
            if !expired && state.bytes <= self.shared.max_bytes {
                break;
            }
            let Some(held) = state.records.pop_front() else {
                break;
            };
            let id = state.first_id;
            state.first_id = state.first_id.wrapping_add(1);
            for fp in held.fps.iter() {
                state.remove_fp(*fp, (held.tenant, id));
            }
            for h in held.pii.iter() {
                if let Some(v) = state.pii.get_mut(h) {
                    v.retain(|p| *p != (held.tenant, id));
                    if v.is_empty() {
                        state.pii.remove(h);
                    }
                }
            }
            state.bytes = state.bytes.saturating_sub(held.bytes);
            state.release_tenant(held.tenant);
            state.evictions += 1;
        }
    }

    pub fn stats_now(&self) -> StoreStats {
        let state = self.lock();
        StoreStats {
            entries: state.records.len() as u64,
            hashes: (state.fps.len() + state.pii.len()) as u64,
            bytes: state.bytes as u64,
            evictions: state.evictions,
            lookups: state.lookups,
        }
    }
}

/// The key of two shingles that follow each other: what a record's Bloom
/// filter holds, so that a run is only extended through text the record
/// has in the same order. (Shingle hashes are keyed and uniform; the
/// finaliser keeps the pair's halves independent for double hashing.)
fn pair(a: u64, b: u64) -> u64 {
    let mut z = a.rotate_left(23) ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key of one shingle on its own in a record's Bloom filter,
/// independent of every pair's key.
fn single(a: u64) -> u64 {
    pair(a, 0x5349_4e47_4c45_0001)
}

/// What a record's Bloom filter holds: every pair of adjacent shingles and
/// every shingle alone.
fn bloom_items(shingles: &[u64]) -> Vec<u64> {
    shingles
        .windows(2)
        .map(|w| pair(w[0], w[1]))
        .chain(shingles.iter().map(|&s| single(s)))
        .collect()
}

impl FingerprintStore for MemoryStore {
    fn record(&self, batch: Vec<Record>) -> BoxFuture<'_, Result<(), StoreError>> {
        self.record_now(batch);
        Box::pin(std::future::ready(Ok(())))
    }

    fn lookup<'a>(
        &'a self,
        batch: &'a [Lookup],
    ) -> BoxFuture<'a, Result<Vec<LookupResult>, StoreError>> {
        let results = self.lookup_now(batch);
        Box::pin(std::future::ready(Ok(results)))
    }

    fn stats(&self) -> StoreStats {
        self.stats_now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(x: u64) -> u64 {
        let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A "text" of shingles `from..to`, with every 4th as fingerprint.
    fn rec(tenant: TenantKey, from: u64, to: u64) -> Record {
        let shingles: Vec<u64> = (from..to).map(mix).collect();
        Record {
            tenant,
            kind: None,
            fingerprints: shingles.iter().copied().step_by(4).collect(),
            shingles,
            pii: vec![],
        }
    }

    fn query(requester: TenantKey, from: u64, to: u64) -> Lookup {
        Lookup {
            requester,
            shingles: (from..to).map(mix).collect(),
            pii: vec![],
            common_tenants: 0,
        }
    }

    #[test]
    fn runs_are_verified_and_extended_through_the_bloom_filter() {
        let s = MemoryStore::new(Duration::from_secs(60), usize::MAX);
        s.record_now(vec![rec(1, 0, 100)]);
        // The answer: 50 unrelated shingles, then 30 of tenant 1's, then more.
        let mut q = query(2, 10_000, 10_050);
        q.shingles.extend((40..70).map(mix));
        q.shingles.extend((20_000..20_020).map(mix));
        let r = s.lookup_now(&[q]);
        assert_eq!(r[0].runs.len(), 1, "{:?}", r[0].runs);
        let run = &r[0].runs[0];
        assert_eq!((run.tenant, run.first, run.last), (1, 50, 79));
    }

    #[test]
    fn a_pair_false_positive_does_not_stretch_a_run() {
        // Find a shingle x that tenant 1's record's filter wrongly links to
        // the last shingle of a run (a pair false positive) but does not
        // hold alone: the answer's shingle after the run.
        let record = rec(1, 0, 100);
        let bloom = Bloom::new(&bloom_items(&record.shingles));
        let x = (1_000_000..)
            .map(mix)
            .find(|&x| bloom.contains(pair(mix(69), x)) && !bloom.contains(single(x)))
            .expect("a false positive");
        let s = MemoryStore::new(Duration::from_secs(60), usize::MAX);
        s.record_now(vec![record]);
        // Tenant 2's answer: 10 own shingles, then `middle`, then 10 more.
        let runs = |middle: Vec<u64>| {
            let mut q = query(2, 10_000, 10_010);
            q.shingles.extend(middle);
            q.shingles.extend((20_000..20_010).map(mix));
            let r = s.lookup_now(&[q]);
            r[0].runs
                .iter()
                .map(|r| (r.first, r.last))
                .collect::<Vec<_>>()
        };
        let run: Vec<u64> = (40..70).map(mix).collect();
        let then_x = run.iter().copied().chain([x]).collect();
        assert_eq!(
            runs(then_x),
            vec![(10, 39)],
            "the run ends at the record's last shingle"
        );

        // And at its start: a shingle y wrongly linked to the run's first.
        let y = (2_000_000..)
            .map(mix)
            .find(|&y| bloom.contains(pair(y, mix(40))) && !bloom.contains(single(y)))
            .expect("a false positive");
        let y_then = [y].into_iter().chain(run.iter().copied()).collect();
        assert_eq!(
            runs(y_then),
            vec![(11, 40)],
            "the run starts at the record's first shingle"
        );
    }

    #[test]
    fn runs_are_not_stitched_from_scattered_shingles() {
        let s = MemoryStore::new(Duration::from_secs(60), usize::MAX);
        s.record_now(vec![rec(1, 0, 100)]);
        // Two pieces of tenant 1's text, 20 shingles each, from two places
        // of its record, put side by side: two runs, not one of 40.
        let mut q = query(2, 10_000, 10_010);
        q.shingles.extend((0..20).map(mix));
        q.shingles.extend((60..80).map(mix));
        let r = s.lookup_now(&[q]);
        let mut runs: Vec<(usize, usize)> = r[0].runs.iter().map(|r| (r.first, r.last)).collect();
        // Sorted, not deduplicated: each run is reported once.
        runs.sort_unstable();
        assert_eq!(runs, vec![(10, 29), (30, 49)]);
    }

    #[test]
    fn own_content_is_not_a_run() {
        let s = MemoryStore::new(Duration::from_secs(60), usize::MAX);
        s.record_now(vec![rec(1, 0, 100), rec(2, 0, 100)]);
        assert!(s.lookup_now(&[query(2, 0, 100)])[0].runs.is_empty());
        let r = s.lookup_now(&[query(3, 0, 100)]);
        assert!(r[0].runs.iter().all(|run| run.tenants == 2));
    }

    #[test]
    fn tenants_that_leave_free_their_slot() {
        let s = MemoryStore::new(Duration::from_millis(5), usize::MAX);
        for t in 0..50u64 {
            s.record_now(vec![rec(t, t * 100, t * 100 + 20)]);
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(10));
        s.record_now(vec![rec(999, 0, 20)]);
        let state = s.lock();
        assert!(state.tenants.len() <= 2, "{}", state.tenants.len());
        assert!(state.tenant_keys.len() <= 50);
        drop(state);
        // The reused slot answers for its new tenant only.
        let r = s.lookup_now(&[query(5, 0, 20)]);
        assert!(
            r[0].runs.iter().all(|run| run.tenant == 999),
            "{:?}",
            r[0].runs
        );
    }

    #[test]
    fn pii_owners() {
        let s = MemoryStore::new(Duration::from_secs(60), usize::MAX);
        let mut a = rec(1, 0, 10);
        a.pii = vec![77, 78];
        let mut b = rec(2, 100, 110);
        b.pii = vec![78];
        s.record_now(vec![a, b]);
        let r = s.lookup_now(&[Lookup {
            requester: 2,
            shingles: vec![],
            pii: vec![77, 78, 79],
            common_tenants: 0,
        }]);
        assert_eq!(r[0].pii.len(), 2);
        assert_eq!(
            r[0].pii[0],
            (
                0,
                Owners {
                    foreign: vec![1],
                    own: false,
                    tenants: 1
                }
            )
        );
        assert_eq!(
            r[0].pii[1],
            (
                1,
                Owners {
                    foreign: vec![1],
                    own: true,
                    tenants: 2
                }
            )
        );
    }

    #[test]
    fn eviction_by_cap_removes_oldest_and_their_postings() {
        let s = MemoryStore::new(Duration::from_secs(60), 1 << 20);
        let one = {
            let probe = MemoryStore::new(Duration::from_secs(60), usize::MAX);
            probe.record_now(vec![rec(0, 0, 400)]);
            probe.stats_now().bytes as usize - PRESENCE_SLOTS
        };
        let s2 = MemoryStore::new(Duration::from_secs(60), PRESENCE_SLOTS + one * 3);
        drop(s);
        for t in 0..10u64 {
            s2.record_now(vec![rec(t, t * 1_000, t * 1_000 + 400)]);
        }
        let st = s2.stats_now();
        assert_eq!((st.entries, st.evictions), (3, 7));
        assert_eq!(st.hashes, 300);
        assert!(
            s2.lookup_now(&[query(99, 0, 400)])[0].runs.is_empty(),
            "tenant 0 was evicted"
        );
        assert_eq!(s2.lookup_now(&[query(99, 9_000, 9_400)])[0].runs.len(), 1);
    }

    #[test]
    fn shared_fingerprints_survive_until_their_last_record_goes() {
        let s = MemoryStore::new(Duration::from_millis(30), usize::MAX);
        s.record_now(vec![rec(1, 0, 40)]);
        std::thread::sleep(Duration::from_millis(20));
        s.record_now(vec![rec(2, 0, 40)]);
        std::thread::sleep(Duration::from_millis(15));
        // The first record has expired; tenant 2's copy still answers.
        let r = s.lookup_now(&[query(3, 0, 40)]);
        assert_eq!(r[0].runs.len(), 1);
        assert_eq!(r[0].runs[0].tenant, 2);
        std::thread::sleep(Duration::from_millis(40));
        assert!(s.lookup_now(&[query(3, 0, 40)])[0].runs.is_empty());
        let st = s.stats_now();
        assert_eq!(
            (st.entries, st.hashes, st.bytes),
            (0, 0, PRESENCE_SLOTS as u64)
        );
    }
}
