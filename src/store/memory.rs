//! The in-memory fingerprint store (after mini-redis's `db.rs`): a
//! cheap-to-clone handle around `Mutex<State>`, records in arrival order for
//! eviction, and a posting map from hash to the tenants that produced it.
//!
//! The lock is a `std::sync::Mutex`, not a Tokio one: nothing asynchronous
//! happens while it is held, and every critical section is short (one batch
//! of hash-map operations).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use super::{
    FingerprintStore, Lookup, LookupResult, Owners, Record, StoreError, StoreStats, TenantKey,
};

/// Approximate costs, for the memory cap. A posting slot in the map: the key,
/// one owner and its count, and hashbrown's control byte and slack.
const POSTING_BYTES: usize = 8 + 16 + 8;
/// Each further owner of a shared hash.
const EXTRA_OWNER_BYTES: usize = 16;
/// A record: its hashes are kept for eviction, plus the deque slot.
const RECORD_BYTES: usize = 48;
const HASH_BYTES: usize = 8;

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
    postings: HashMap<u64, Posting>,
    records: VecDeque<Held>,
    bytes: usize,
    evictions: u64,
    lookups: u64,
}

struct Held {
    at: Instant,
    tenant: TenantKey,
    hashes: Box<[u64]>,
}

/// The tenants that produced one hash, each with how many held records
/// produced it (so eviction knows when a tenant no longer owns it).
enum Posting {
    One(TenantKey, u32),
    Many(Vec<(TenantKey, u32)>),
}

impl Posting {
    fn add(&mut self, tenant: TenantKey) -> usize {
        match self {
            Posting::One(t, n) if *t == tenant => {
                *n += 1;
                0
            }
            Posting::One(t, n) => {
                *self = Posting::Many(vec![(*t, *n), (tenant, 1)]);
                EXTRA_OWNER_BYTES
            }
            Posting::Many(v) => match v.iter_mut().find(|(t, _)| *t == tenant) {
                Some((_, n)) => {
                    *n += 1;
                    0
                }
                None => {
                    v.push((tenant, 1));
                    EXTRA_OWNER_BYTES
                }
            },
        }
    }

    /// Removes one count of `tenant`; returns (bytes freed, now empty).
    fn remove(&mut self, tenant: TenantKey) -> (usize, bool) {
        match self {
            Posting::One(t, n) if *t == tenant => {
                *n -= 1;
                (0, *n == 0)
            }
            Posting::One(..) => (0, false),
            Posting::Many(v) => {
                let mut freed = 0;
                if let Some(i) = v.iter().position(|(t, _)| *t == tenant) {
                    v[i].1 -= 1;
                    if v[i].1 == 0 {
                        v.swap_remove(i);
                        freed = EXTRA_OWNER_BYTES;
                    }
                }
                if v.len() == 1 {
                    let (t, n) = v[0];
                    *self = Posting::One(t, n);
                }
                (freed, v_is_empty(self))
            }
        }
    }

    fn owners(&self, requester: TenantKey) -> Owners {
        match self {
            Posting::One(t, _) if *t == requester => Owners {
                foreign: Vec::new(),
                own: true,
                tenants: 1,
            },
            Posting::One(t, _) => Owners {
                foreign: vec![*t],
                own: false,
                tenants: 1,
            },
            Posting::Many(v) => {
                let own = v.iter().any(|(t, _)| *t == requester);
                Owners {
                    foreign: v
                        .iter()
                        .map(|(t, _)| *t)
                        .filter(|t| *t != requester)
                        .collect(),
                    own,
                    tenants: v.len() as u32,
                }
            }
        }
    }
}

fn v_is_empty(p: &Posting) -> bool {
    matches!(p, Posting::Many(v) if v.is_empty())
}

impl MemoryStore {
    /// `window`: how long content is remembered; `max_bytes`: the memory cap,
    /// past which the oldest records go first.
    pub fn new(window: Duration, max_bytes: usize) -> Self {
        MemoryStore {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
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
            if record.hashes.is_empty() {
                continue;
            }
            let mut hashes = record.hashes;
            hashes.sort_unstable();
            hashes.dedup();
            let mut added = RECORD_BYTES + hashes.len() * HASH_BYTES;
            for h in &hashes {
                match state.postings.get_mut(h) {
                    Some(p) => added += p.add(record.tenant),
                    None => {
                        state.postings.insert(*h, Posting::One(record.tenant, 1));
                        added += POSTING_BYTES;
                    }
                }
            }
            state.bytes += added;
            state.records.push_back(Held {
                at: now,
                tenant: record.tenant,
                hashes: hashes.into_boxed_slice(),
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
            state.lookups += lookup.hashes.len() as u64;
            let hits = lookup
                .hashes
                .iter()
                .enumerate()
                .filter_map(|(i, h)| {
                    state
                        .postings
                        .get(h)
                        .map(|p| (i, p.owners(lookup.requester)))
                })
                .collect();
            results.push(LookupResult { hits });
        }
        results
    }

    /// Drops records older than the window, then the oldest until under the
    /// memory cap.
    fn evict(&self, state: &mut State, now: Instant) {
        loop {
            let Some(oldest) = state.records.front() else {
                break;
            };
            let expired = now.duration_since(oldest.at) > self.shared.window;
            if !expired && state.bytes <= self.shared.max_bytes {
                break;
            }
            let Some(held) = state.records.pop_front() else {
                break;
            };
            let mut freed = RECORD_BYTES + held.hashes.len() * HASH_BYTES;
            for h in held.hashes.iter() {
                let empty = match state.postings.get_mut(h) {
                    Some(p) => {
                        let (f, empty) = p.remove(held.tenant);
                        freed += f;
                        empty
                    }
                    None => false,
                };
                if empty {
                    state.postings.remove(h);
                    freed += POSTING_BYTES;
                }
            }
            state.bytes = state.bytes.saturating_sub(freed);
            state.evictions += 1;
        }
    }

    pub fn stats_now(&self) -> StoreStats {
        let state = self.lock();
        StoreStats {
            entries: state.records.len() as u64,
            hashes: state.postings.len() as u64,
            bytes: state.bytes as u64,
            evictions: state.evictions,
            lookups: state.lookups,
        }
    }
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
    use crate::store::ContentKind;

    fn rec(tenant: TenantKey, hashes: &[u64]) -> Record {
        Record {
            tenant,
            kind: ContentKind::Prompt,
            hashes: hashes.to_vec(),
        }
    }

    fn owners_of(store: &MemoryStore, requester: TenantKey, h: u64) -> Option<Owners> {
        let r = store.lookup_now(&[Lookup {
            requester,
            hashes: vec![h],
        }]);
        r[0].hits.first().map(|(_, o)| o.clone())
    }

    #[test]
    fn own_and_foreign_owners() {
        let s = MemoryStore::new(Duration::from_secs(60), 1 << 20);
        s.record_now(vec![rec(1, &[10, 11]), rec(2, &[11, 12])]);
        assert_eq!(owners_of(&s, 2, 10).unwrap().foreign, vec![1]);
        let o = owners_of(&s, 2, 11).unwrap();
        assert!(o.own);
        assert_eq!(o.foreign, vec![1]);
        assert_eq!(o.tenants, 2);
        assert!(owners_of(&s, 2, 99).is_none());
        let o = owners_of(&s, 2, 12).unwrap();
        assert!(o.own && o.foreign.is_empty());
    }

    #[test]
    fn eviction_by_cap_removes_oldest_and_their_postings() {
        let per_record = RECORD_BYTES + 100 * (HASH_BYTES + POSTING_BYTES);
        let s = MemoryStore::new(Duration::from_secs(60), per_record * 3);
        for t in 0..10u64 {
            let hashes: Vec<u64> = (0..100).map(|i| t * 1_000 + i).collect();
            s.record_now(vec![rec(t, &hashes)]);
        }
        let st = s.stats_now();
        assert_eq!(st.entries, 3);
        assert_eq!(st.hashes, 300);
        assert_eq!(st.evictions, 7);
        assert!(st.bytes as usize <= per_record * 3);
        assert!(owners_of(&s, 99, 5).is_none(), "tenant 0 was evicted");
        assert!(owners_of(&s, 99, 9_005).is_some());
    }

    #[test]
    fn shared_hashes_survive_until_their_last_owner_goes() {
        let s = MemoryStore::new(Duration::from_secs(60), usize::MAX);
        s.record_now(vec![rec(1, &[7]), rec(2, &[7]), rec(1, &[7])]);
        assert_eq!(owners_of(&s, 3, 7).unwrap().tenants, 2);
        let mut state = s.lock();
        // Evict the first record by hand: tenant 1 still owns 7 through the third.
        let far = Instant::now() + Duration::from_secs(1);
        let held = state.records.pop_front().unwrap();
        state.records.push_front(Held {
            at: far - Duration::from_secs(3_600),
            ..held
        });
        s.evict(&mut state, far);
        drop(state);
        let o = owners_of(&s, 3, 7).unwrap();
        assert_eq!(o.tenants, 2);
    }

    #[test]
    fn the_window_expires_records() {
        let s = MemoryStore::new(Duration::from_millis(1), usize::MAX);
        s.record_now(vec![rec(1, &[1, 2, 3])]);
        std::thread::sleep(Duration::from_millis(5));
        assert!(owners_of(&s, 2, 1).is_none());
        let st = s.stats_now();
        assert_eq!((st.entries, st.hashes, st.bytes), (0, 0, 0));
    }

    #[test]
    fn duplicate_hashes_in_one_record_count_once() {
        // Postings hold one count: a single eviction pass frees it entirely.
        let s = MemoryStore::new(Duration::from_millis(1), usize::MAX);
        s.record_now(vec![rec(1, &[5, 5, 5])]);
        std::thread::sleep(Duration::from_millis(5));
        assert!(owners_of(&s, 2, 5).is_none());
        assert_eq!(s.stats_now().hashes, 0);
    }
}
