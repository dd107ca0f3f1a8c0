//! The embedding window: every tenant's recent chunk embeddings, and an
//! exact batched search over them for the semantic detectors.
//!
//! It is the fingerprint store's twin for vectors: the same window (rows
//! older than `ttl` are dropped), the same keyed tenants ([`TenantKey`]) and
//! the same opaque record ids, so that a semantic hit names the prompt or
//! answer it came from just as a run hit does.
//!
//! - **Storage.** A ring buffer of at most `capacity` rows: the oldest row
//!   goes when a new one needs its place, and rows older than `ttl` are
//!   dropped from the front (the ring is in insertion order, so they are
//!   always a prefix). Columns are flat vectors, allocated as rows arrive,
//!   never past `capacity` rows.
//! - **Precision.** [`Precision::I8`] (the default) keeps each unit vector
//!   as `i8` with one `f32` scale per row (symmetric quantisation:
//!   `scale = max|x| / 127`), a quarter of [`Precision::F32`]'s bytes;
//!   scores differ from the `f32` ones by a few thousandths.
//! - **Unit length.** Vectors are L2-normalised on the way in (a no-op for
//!   the embedder's output, which is normalised already), so a score is
//!   always a cosine similarity.
//! - **Search.** Exact, no approximate index: every live row is scored
//!   against every query. Rows are taken in blocks that stay in cache and
//!   each block is scored against the queries (in tiles that stay in L1),
//!   a blocked matrix product. For `I8` the queries are quantised too and
//!   the dot products accumulate in `i32`. The inner loops are plain Rust,
//!   written so that LLVM vectorises them, and compiled once more for
//!   AVX2 (x86-64-v3) through [`pulp`]'s runtime dispatch (the default build
//!   targets baseline x86-64, SSE2 only).
//! - **Results.** Per query: the best row of each *foreign* tenant scoring
//!   at least the threshold, best first, at most `max_hits` of them; how
//!   many foreign tenants scored at least the threshold (a topic many
//!   tenants share is not a leak); and the requester's own best score.
//! - **Concurrency.** All methods take `&self`: searches share a read lock,
//!   inserts take the write lock for a copy of the already prepared rows.
//!   A search holds the read lock for its whole scan, so keep the window to
//!   a size whose search is quick (see `benches/window.rs`).
//! - **Hostile input.** A vector of the wrong dimension, one holding a NaN
//!   or an infinity, an all-zero vector and a non-finite threshold are
//!   errors ([`WindowError`]) and change nothing; a zero dimension or
//!   capacity is refused by [`VectorWindow::new`]; searching an empty
//!   window gives empty results.

use std::collections::HashMap;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use pulp::{Arch, Simd, WithSimd};

use crate::store::{ContentKind, TenantKey};

#[cfg(test)]
mod tests;

/// How rows are stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// 4 bytes a value: exact scores.
    F32,
    /// 1 byte a value and a 4-byte scale a row: scores within a few
    /// thousandths of the `F32` ones.
    #[default]
    I8,
}

/// The largest dimension accepted: it keeps every `i32` lane of the `I8`
/// dot product (at most `dim / 32` products of at most 127²) from
/// overflowing, with a wide margin.
pub const MAX_DIM: usize = 1 << 16;

/// One foreign tenant's best row for a query.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hit {
    pub tenant: TenantKey,
    /// The record the row came from (the id given to `insert`).
    pub record: u64,
    pub kind: ContentKind,
    /// Cosine similarity to the query.
    pub score: f32,
}

/// The answer for one query.
#[derive(Clone, Debug, PartialEq)]
pub struct QueryHits {
    /// The best row of each foreign tenant scoring at least the threshold,
    /// best first (ties: lower tenant key first), at most `max_hits`.
    pub hits: Vec<Hit>,
    /// The best score among the requester's own rows, whatever the
    /// threshold; `f32::NEG_INFINITY` when the window holds none.
    pub own_best: f32,
    /// Distinct foreign tenants with a row scoring at least the threshold,
    /// `max_hits` notwithstanding.
    pub foreign_tenants_above: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowStats {
    /// Rows inside the window.
    pub entries: u64,
    /// Heap bytes the window holds: vectors, scales and per-row metadata,
    /// as allocated (a ring never gives memory back; it grows to
    /// `capacity` rows at most).
    pub bytes: u64,
    /// Rows dropped since start, for age or to make room.
    pub evictions: u64,
}

/// Why a window cannot be built, or a call was refused. A refused call
/// changes nothing.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum WindowError {
    #[error("embedding window: dimension must be 1 to {MAX_DIM}, not {0}")]
    BadDimension(usize),
    #[error("embedding window: capacity must be at least 1")]
    ZeroCapacity,
    #[error("embedding window: vector {index} has {got} values, the window holds {expected}")]
    WrongDimension {
        index: usize,
        got: usize,
        expected: usize,
    },
    #[error("embedding window: vector {index} holds a NaN or an infinity")]
    NonFinite { index: usize },
    #[error("embedding window: vector {index} is all zeros and has no direction")]
    ZeroVector { index: usize },
    #[error("embedding window: the threshold must be a finite number, not {0}")]
    BadThreshold(f32),
}

/// Values per pass of the dot products' inner loops, as many independent
/// sums. Rows are padded with zeros to a multiple of it, so the loops have
/// no remainder. Measured on AVX2 (`benches/window.rs`, and by hand): 16
/// for `f32` (more lanes made LLVM keep them in memory), 32 for `i8` (1.8×
/// faster than 16; 64 made LLVM fall back to `pmulld`).
const F32_LANES: usize = 16;
const I8_LANES: usize = 32;

/// Bytes of rows scored as one block: they stay in L2 while every query
/// tile passes over them.
const BLOCK_BYTES: usize = 64 << 10;

/// Bytes of queries in one tile: they stay in L1 while a block's rows pass.
const TILE_BYTES: usize = 16 << 10;

/// An exact, thread-safe window of recent unit vectors by tenant.
pub struct VectorWindow {
    dim: usize,
    /// `dim` rounded up to a multiple of the precision's lanes.
    stride: usize,
    capacity: usize,
    ttl: Duration,
    precision: Precision,
    /// Times are kept as nanoseconds since this instant.
    epoch: Instant,
    arch: Arch,
    state: RwLock<State>,
}

enum Rows {
    F32(Vec<f32>),
    I8 { values: Vec<i8>, scales: Vec<f32> },
}

/// The ring. Slot `s` holds row `s` of every column; `tenants.len()` slots
/// exist (they are added as rows arrive, up to `capacity`). The live rows,
/// oldest first, are slots `head, head + 1, …` (mod `capacity`), `len` of
/// them.
struct State {
    rows: Rows,
    tenants: Vec<TenantKey>,
    records: Vec<u64>,
    kinds: Vec<ContentKind>,
    /// Insertion times, nanoseconds since `epoch`; never decreasing along
    /// the ring.
    at: Vec<u64>,
    head: usize,
    len: usize,
    /// The newest insertion time, which later rows never go below.
    newest: u64,
    evictions: u64,
}

/// Rows (or queries) validated, normalised and laid out as stored:
/// `stride` values each, zero-padded.
enum Prepared {
    F32(Vec<f32>),
    I8 { values: Vec<i8>, scales: Vec<f32> },
}

impl VectorWindow {
    /// A window of at most `capacity` rows of `dim` values, each kept for
    /// `ttl`. Nothing is allocated until rows arrive.
    pub fn new(
        dim: usize,
        capacity: usize,
        ttl: Duration,
        precision: Precision,
    ) -> Result<Self, WindowError> {
        if dim == 0 || dim > MAX_DIM {
            return Err(WindowError::BadDimension(dim));
        }
        if capacity == 0 {
            return Err(WindowError::ZeroCapacity);
        }
        let lanes = match precision {
            Precision::F32 => F32_LANES,
            Precision::I8 => I8_LANES,
        };
        let rows = match precision {
            Precision::F32 => Rows::F32(Vec::new()),
            Precision::I8 => Rows::I8 {
                values: Vec::new(),
                scales: Vec::new(),
            },
        };
        Ok(VectorWindow {
            dim,
            stride: dim.div_ceil(lanes) * lanes,
            capacity,
            ttl,
            precision,
            epoch: Instant::now(),
            arch: Arch::new(),
            state: RwLock::new(State {
                rows,
                tenants: Vec::new(),
                records: Vec::new(),
                kinds: Vec::new(),
                at: Vec::new(),
                head: 0,
                len: 0,
                newest: 0,
                evictions: 0,
            }),
        })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Adds one row per vector, all of `tenant`'s record `record` (the
    /// chunks of one prompt or answer), now. `vectors` is anything that
    /// lends `&[f32]`s (`&[Vec<f32>]` as the embedder returns them,
    /// `&[&[f32]]`, …), each `dim` long; they are normalised here. Either
    /// every vector is added or, on an error, none.
    pub fn insert<V: AsRef<[f32]>>(
        &self,
        tenant: TenantKey,
        record: u64,
        kind: ContentKind,
        vectors: &[V],
    ) -> Result<(), WindowError> {
        self.insert_at(Instant::now(), tenant, record, kind, vectors)
    }

    /// [`insert`](Self::insert) at a given time (tests and simulations). A
    /// time earlier than the newest row's is taken as the newest row's, so
    /// that the ring stays in time order.
    pub fn insert_at<V: AsRef<[f32]>>(
        &self,
        now: Instant,
        tenant: TenantKey,
        record: u64,
        kind: ContentKind,
        vectors: &[V],
    ) -> Result<(), WindowError> {
        // Validation, normalisation and quantisation happen before the lock.
        let prepared = self.prepare(vectors)?;
        if vectors.is_empty() {
            return Ok(());
        }
        let now = self.nanos(now);
        let mut state = self.write();
        self.expire(&mut state, now);
        let at = now.max(state.newest);
        state.newest = at;
        let stride = self.stride;
        for i in 0..vectors.len() {
            if state.len == self.capacity {
                state.head = (state.head + 1) % self.capacity;
                state.len -= 1;
                state.evictions += 1;
            }
            let slot = (state.head + state.len) % self.capacity;
            let row = i * stride..(i + 1) * stride;
            if slot == state.tenants.len() {
                // A new slot (the ring is still growing).
                self.reserve(&mut state);
                match (&mut state.rows, &prepared) {
                    (Rows::F32(v), Prepared::F32(p)) => v.extend_from_slice(&p[row]),
                    (
                        Rows::I8 { values, scales },
                        Prepared::I8 {
                            values: pv,
                            scales: ps,
                        },
                    ) => {
                        values.extend_from_slice(&pv[row]);
                        scales.push(ps[i]);
                    }
                    _ => unreachable!("rows and prepared rows share the window's precision"),
                }
                state.tenants.push(tenant);
                state.records.push(record);
                state.kinds.push(kind);
                state.at.push(at);
            } else {
                let dst = slot * stride..(slot + 1) * stride;
                match (&mut state.rows, &prepared) {
                    (Rows::F32(v), Prepared::F32(p)) => v[dst].copy_from_slice(&p[row]),
                    (
                        Rows::I8 { values, scales },
                        Prepared::I8 {
                            values: pv,
                            scales: ps,
                        },
                    ) => {
                        values[dst].copy_from_slice(&pv[row]);
                        scales[slot] = ps[i];
                    }
                    _ => unreachable!("rows and prepared rows share the window's precision"),
                }
                state.tenants[slot] = tenant;
                state.records[slot] = record;
                state.kinds[slot] = kind;
                state.at[slot] = at;
            }
            state.len += 1;
        }
        Ok(())
    }

    /// Scores every query against every row inside the window, now: one
    /// [`QueryHits`] per query, in order. `requester` is the tenant whose
    /// answer the queries come from: its rows are never hits, only
    /// `own_best`. A row is a hit when its score is at least `threshold`.
    /// Queries are normalised here; an empty slice gives an empty result.
    pub fn search<V: AsRef<[f32]>>(
        &self,
        queries: &[V],
        requester: TenantKey,
        threshold: f32,
        max_hits: usize,
    ) -> Result<Vec<QueryHits>, WindowError> {
        self.search_at(Instant::now(), queries, requester, threshold, max_hits)
    }

    /// [`search`](Self::search) at a given time: rows older than `ttl` at
    /// `now` are left out (tests and simulations).
    pub fn search_at<V: AsRef<[f32]>>(
        &self,
        now: Instant,
        queries: &[V],
        requester: TenantKey,
        threshold: f32,
        max_hits: usize,
    ) -> Result<Vec<QueryHits>, WindowError> {
        if !threshold.is_finite() {
            return Err(WindowError::BadThreshold(threshold));
        }
        let prepared = self.prepare(queries)?;
        let nq = queries.len();
        if nq == 0 {
            return Ok(Vec::new());
        }
        let mut own_best = vec![f32::NEG_INFINITY; nq];
        // Per query: foreign tenant → (best score, its slot).
        let mut best: Vec<HashMap<TenantKey, (f32, usize)>> = vec![HashMap::new(); nq];

        let state = self.read();
        let (first, second) = self.live_slots(&state, self.nanos(now));
        let row_bytes = self.stride * self.value_bytes();
        let block_rows = (BLOCK_BYTES / row_bytes).max(1);
        let tile = (TILE_BYTES / row_bytes).max(1);
        let mut scores = vec![0f32; block_rows.min(first.len() + second.len()) * nq];
        for segment in [first, second] {
            let mut start = segment.start;
            while start < segment.end {
                let end = (start + block_rows).min(segment.end);
                let n = end - start;
                let out = &mut scores[..n * nq];
                self.score_block(&state.rows, start..end, &prepared, nq, tile, out);
                for (r, row_scores) in out.chunks_exact(nq).enumerate() {
                    let slot = start + r;
                    let tenant = state.tenants[slot];
                    if tenant == requester {
                        for (own, s) in own_best.iter_mut().zip(row_scores) {
                            if *s > *own {
                                *own = *s;
                            }
                        }
                        continue;
                    }
                    for (q, s) in row_scores.iter().enumerate() {
                        if *s >= threshold {
                            let e = best[q].entry(tenant).or_insert((*s, slot));
                            if *s > e.0 {
                                *e = (*s, slot);
                            }
                        }
                    }
                }
                start = end;
            }
        }

        let results = best
            .into_iter()
            .zip(own_best)
            .map(|(by_tenant, own_best)| {
                let foreign_tenants_above = u32::try_from(by_tenant.len()).unwrap_or(u32::MAX);
                let mut hits: Vec<Hit> = by_tenant
                    .into_iter()
                    .map(|(tenant, (score, slot))| Hit {
                        tenant,
                        record: state.records[slot],
                        kind: state.kinds[slot],
                        score,
                    })
                    .collect();
                hits.sort_unstable_by(|a, b| {
                    b.score.total_cmp(&a.score).then(a.tenant.cmp(&b.tenant))
                });
                hits.truncate(max_hits);
                QueryHits {
                    hits,
                    own_best,
                    foreign_tenants_above,
                }
            })
            .collect();
        Ok(results)
    }

    /// Rows, bytes and evictions. Rows older than `ttl` count as evicted
    /// already (the next insert drops them). Takes the read lock only, so a
    /// metrics scrape does not wait for searches.
    pub fn stats(&self) -> WindowStats {
        self.stats_at(Instant::now())
    }

    /// [`stats`](Self::stats) at a given time.
    pub fn stats_at(&self, now: Instant) -> WindowStats {
        let state = self.read();
        let expired = self.expired(&state, self.nanos(now));
        let rows = match &state.rows {
            Rows::F32(v) => v.capacity() * 4,
            Rows::I8 { values, scales } => values.capacity() + scales.capacity() * 4,
        };
        let bytes = rows
            + state.tenants.capacity() * std::mem::size_of::<TenantKey>()
            + state.records.capacity() * 8
            + state.kinds.capacity() * std::mem::size_of::<ContentKind>()
            + state.at.capacity() * 8;
        WindowStats {
            entries: (state.len - expired) as u64,
            bytes: bytes as u64,
            evictions: state.evictions + expired as u64,
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        // Every update leaves the ring consistent before anything that
        // could panic, so a poisoned lock is still usable.
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    fn nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    fn value_bytes(&self) -> usize {
        match self.precision {
            Precision::F32 => 4,
            Precision::I8 => 1,
        }
    }

    /// How many of the oldest live rows are older than `ttl` at `now` (a
    /// binary search: times never decrease along the ring).
    fn expired(&self, state: &State, now: u64) -> usize {
        let ttl = u64::try_from(self.ttl.as_nanos()).unwrap_or(u64::MAX);
        let Some(cutoff) = now.checked_sub(ttl) else {
            return 0;
        };
        let at = |i: usize| state.at[(state.head + i) % self.capacity];
        // The first live row not older than the cutoff.
        let (mut lo, mut hi) = (0, state.len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if at(mid) < cutoff {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Drops the rows older than `ttl` at `now`.
    fn expire(&self, state: &mut State, now: u64) {
        let n = self.expired(state, now);
        if n > 0 {
            state.head = (state.head + n) % self.capacity;
            state.len -= n;
            state.evictions += n as u64;
        }
    }

    /// The slots of the rows inside the window at `now`, as at most two
    /// ranges (the ring may wrap).
    fn live_slots(
        &self,
        state: &State,
        now: u64,
    ) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let skip = self.expired(state, now);
        let n = state.len - skip;
        if n == 0 {
            return (0..0, 0..0);
        }
        let start = (state.head + skip) % self.capacity;
        let first_end = (start + n).min(state.tenants.len());
        (start..first_end, 0..n - (first_end - start))
    }

    /// Makes room for one more slot in every column, growing them together
    /// by doubling but never past `capacity` rows.
    fn reserve(&self, state: &mut State) {
        let slots = state.tenants.len();
        if slots < state.tenants.capacity() {
            return;
        }
        let more = slots.max(64).min(self.capacity - slots);
        let stride = self.stride;
        match &mut state.rows {
            Rows::F32(v) => v.reserve_exact(more * stride),
            Rows::I8 { values, scales } => {
                values.reserve_exact(more * stride);
                scales.reserve_exact(more);
            }
        }
        state.tenants.reserve_exact(more);
        state.records.reserve_exact(more);
        state.kinds.reserve_exact(more);
        state.at.reserve_exact(more);
    }

    /// Checks, normalises and lays out vectors as rows of `stride` values;
    /// for `I8`, quantises them with one scale each.
    fn prepare<V: AsRef<[f32]>>(&self, vectors: &[V]) -> Result<Prepared, WindowError> {
        let (dim, stride) = (self.dim, self.stride);
        let mut unit = vec![0f32; vectors.len() * stride];
        for (index, (v, out)) in vectors
            .iter()
            .zip(unit.chunks_exact_mut(stride))
            .enumerate()
        {
            let v = v.as_ref();
            if v.len() != dim {
                return Err(WindowError::WrongDimension {
                    index,
                    got: v.len(),
                    expected: dim,
                });
            }
            if v.iter().any(|x| !x.is_finite()) {
                return Err(WindowError::NonFinite { index });
            }
            // Divide by the largest magnitude first, so that squaring huge
            // (finite) values cannot overflow.
            let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            if max == 0.0 {
                return Err(WindowError::ZeroVector { index });
            }
            let norm = v.iter().map(|x| (x / max) * (x / max)).sum::<f32>().sqrt();
            let k = 1.0 / (max * norm);
            for (o, x) in out.iter_mut().zip(v) {
                *o = x * k;
            }
        }
        Ok(match self.precision {
            Precision::F32 => Prepared::F32(unit),
            Precision::I8 => {
                let mut values = vec![0i8; unit.len()];
                let mut scales = Vec::with_capacity(vectors.len());
                for (u, q) in unit
                    .chunks_exact(stride)
                    .zip(values.chunks_exact_mut(stride))
                {
                    let max = u.iter().fold(0f32, |m, x| m.max(x.abs()));
                    // `max > 0`: the vector is a unit vector.
                    let scale = max / 127.0;
                    for (q, x) in q.iter_mut().zip(u) {
                        // `as` saturates; |x / scale| ≤ 127 anyway.
                        *q = (x / scale).round() as i8;
                    }
                    scales.push(scale);
                }
                Prepared::I8 { values, scales }
            }
        })
    }

    /// Scores slots `slots` against every query: `out[r * nq + q]`.
    fn score_block(
        &self,
        rows: &Rows,
        slots: std::ops::Range<usize>,
        queries: &Prepared,
        nq: usize,
        tile: usize,
        out: &mut [f32],
    ) {
        let stride = self.stride;
        let values = slots.start * stride..slots.end * stride;
        match (rows, queries) {
            (Rows::F32(v), Prepared::F32(q)) => self.arch.dispatch(BlockF32 {
                rows: &v[values],
                queries: q,
                stride,
                nq,
                tile,
                out,
            }),
            (
                Rows::I8 { values: v, scales },
                Prepared::I8 {
                    values: q,
                    scales: q_scales,
                },
            ) => self.arch.dispatch(BlockI8 {
                rows: &v[values],
                row_scales: &scales[slots],
                queries: q,
                query_scales: q_scales,
                stride,
                tile,
                out,
            }),
            _ => unreachable!("rows and prepared queries share the window's precision"),
        }
    }
}

/// One block of `f32` rows against every query, compiled for the best SIMD
/// level the CPU has (`pulp` inlines `with_simd` into a function built with
/// those target features, and the loops below are inlined into it).
struct BlockF32<'a> {
    rows: &'a [f32],
    queries: &'a [f32],
    stride: usize,
    nq: usize,
    tile: usize,
    out: &'a mut [f32],
}

impl WithSimd for BlockF32<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, _simd: S) {
        let BlockF32 {
            rows,
            queries,
            stride,
            nq,
            tile,
            out,
        } = self;
        for (t, tile_queries) in queries.chunks(tile * stride).enumerate() {
            let q0 = t * tile;
            for (row, out) in rows.chunks_exact(stride).zip(out.chunks_exact_mut(nq)) {
                for (q, o) in tile_queries.chunks_exact(stride).zip(out[q0..].iter_mut()) {
                    *o = dot_f32(row, q);
                }
            }
        }
    }
}

/// One block of `i8` rows against every (quantised) query.
struct BlockI8<'a> {
    rows: &'a [i8],
    row_scales: &'a [f32],
    queries: &'a [i8],
    query_scales: &'a [f32],
    stride: usize,
    tile: usize,
    out: &'a mut [f32],
}

impl WithSimd for BlockI8<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, _simd: S) {
        let BlockI8 {
            rows,
            row_scales,
            queries,
            query_scales,
            stride,
            tile,
            out,
        } = self;
        let nq = query_scales.len();
        for (t, tile_queries) in queries.chunks(tile * stride).enumerate() {
            let q0 = t * tile;
            let tile_scales = &query_scales[q0..];
            for ((row, rs), out) in rows
                .chunks_exact(stride)
                .zip(row_scales)
                .zip(out.chunks_exact_mut(nq))
            {
                for ((q, qs), o) in tile_queries
                    .chunks_exact(stride)
                    .zip(tile_scales)
                    .zip(out[q0..].iter_mut())
                {
                    *o = dot_i8(row, q) as f32 * (rs * qs);
                }
            }
        }
    }
}

/// `F32_LANES` independent sums, added up at the end: the order of the
/// `f32` additions is written out, so LLVM may keep the lanes in vector
/// registers (it would not reorder one running sum). Two AVX2 registers.
#[inline(always)]
fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; F32_LANES];
    for (x, y) in a.chunks_exact(F32_LANES).zip(b.chunks_exact(F32_LANES)) {
        for l in 0..F32_LANES {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum()
}

/// The same in `i32`: products of two `i8` fit `i16`, so LLVM pairs them
/// with `pmaddwd`; 32 lanes make two independent chains of them.
#[inline(always)]
fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    let mut acc = [0i32; I8_LANES];
    for (x, y) in a.chunks_exact(I8_LANES).zip(b.chunks_exact(I8_LANES)) {
        for l in 0..I8_LANES {
            acc[l] += i32::from(x[l]) * i32::from(y[l]);
        }
    }
    acc.iter().sum()
}
