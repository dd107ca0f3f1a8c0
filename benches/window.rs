//! The embedding window's exact search: latency by window size, precision
//! and query batch; memory per vector; recall of I8 against F32 on planted
//! near-duplicates; and the window size past which one exact search of a
//! batch of 8 queries misses a 10 ms p99 budget (where an ANN index would
//! start to pay).
//!
//! `cargo bench --bench window`. Environment:
//! - `SECONDS`: time per latency measurement (default 1; at least 5 samples
//!   are taken however long they take);
//! - `SIZES`: window sizes, comma-separated (default 10000,100000,1000000);
//! - `F32_MAX`: the largest size also measured in F32 (default 100000:
//!   1M F32 rows are 1.5 GB).
//!
//! Rows are random unit vectors (Gaussian components, normalised) of
//! dimension 384 (all-MiniLM-L6-v2), spread over 1,000 tenants. One search
//! runs on one thread, as each scanner thread does its own.

use std::hint::black_box;
use std::time::{Duration, Instant};

use residue::embed::window::{Precision, VectorWindow};
use residue::store::ContentKind;

const DIM: usize = 384;
const TENANTS: u64 = 1_000;
const BATCHES: [usize; 3] = [1, 8, 32];
const THRESHOLD: f32 = 0.5;
const BUDGET_MS: f64 = 10.0;
/// Not a tenant of the window: asks on behalf of nobody in it.
const OUTSIDER: u64 = u64::MAX;

/// splitmix64 and Box–Muller: fast, seeded, no dependency.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn unit(&mut self) -> Vec<f32> {
        let mut v = Vec::with_capacity(DIM);
        while v.len() < DIM {
            let (u1, u2) = (self.uniform(), self.uniform());
            let r = (-2.0 * u1.ln()).sqrt();
            let t = std::f64::consts::TAU * u2;
            v.push((r * t.cos()) as f32);
            v.push((r * t.sin()) as f32);
        }
        normalise(v)
    }

    /// A unit vector at cosine `cos` to the unit vector `q`.
    fn near(&mut self, q: &[f32], cos: f32) -> Vec<f32> {
        let r = self.unit();
        let d: f32 = r.iter().zip(q).map(|(a, b)| a * b).sum();
        let ortho = normalise(r.iter().zip(q).map(|(r, q)| r - d * q).collect());
        let s = (1.0 - cos * cos).sqrt();
        q.iter().zip(&ortho).map(|(q, o)| cos * q + s * o).collect()
    }
}

fn normalise(mut v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter_mut().for_each(|x| *x /= n);
    v
}

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// A window of `size` random rows (the same rows for the same seed).
fn filled(size: usize, precision: Precision, seed: u64) -> VectorWindow {
    let w = VectorWindow::new(DIM, size, Duration::from_secs(3600), precision).expect("window");
    let mut rng = Rng(seed);
    let mut i = 0u64;
    while (i as usize) < size {
        // One record of 8 chunks at a time, as a response arrives.
        let n = 8.min(size - i as usize);
        let rows: Vec<Vec<f32>> = (0..n).map(|_| rng.unit()).collect();
        let kind = if i.is_multiple_of(16) {
            ContentKind::Prompt
        } else {
            ContentKind::Answer
        };
        w.insert(i % TENANTS, i, kind, &rows).expect("insert");
        i += n as u64;
    }
    w
}

struct Latency {
    p50: f64,
    p99: f64,
    samples: usize,
}

/// p50 and p99 (nearest rank) of one search of `batch` random queries, in
/// ms, over about `secs` (at least 5 samples).
fn latency(w: &VectorWindow, batch: usize, secs: f64, rng: &mut Rng) -> Latency {
    let pool: Vec<Vec<f32>> = (0..batch * 16).map(|_| rng.unit()).collect();
    let mut times = Vec::new();
    let budget = Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut k = 0;
    // One warm-up search, then measure.
    black_box(w.search(&pool[..batch], 1, THRESHOLD, 10).expect("search"));
    while times.len() < 5 || (start.elapsed() < budget && times.len() < 2_000) {
        let queries = &pool[(k % 16) * batch..(k % 16 + 1) * batch];
        k += 1;
        // Asked by tenant 1, whose own rows are scanned too.
        let t = Instant::now();
        black_box(w.search(queries, 1, THRESHOLD, 10).expect("search"));
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let rank = |p: f64| times[((p * times.len() as f64).ceil() as usize).clamp(1, times.len()) - 1];
    Latency {
        p50: rank(0.50),
        p99: rank(0.99),
        samples: times.len(),
    }
}

struct Recall {
    queries: usize,
    top1_same: usize,
    top1_among_hits: usize,
    max_diff: f32,
    /// Of the top-1 disagreements, those where F32's best two scores were
    /// within 0.005 of each other (a near-tie quantisation may flip).
    near_ties: usize,
}

/// Plants 3 noisy copies of each of `n` queries, at cosines drawn from
/// 0.80–0.90, under 3 distinct tenants, into both windows (which hold the
/// same rows), then compares each query's top-1 foreign hit.
fn recall(f32w: &VectorWindow, i8w: &VectorWindow, n: usize, rng: &mut Rng) -> Recall {
    let queries: Vec<Vec<f32>> = (0..n).map(|_| rng.unit()).collect();
    for (i, q) in queries.iter().enumerate() {
        let first = rng.next_u64() % TENANTS;
        for c in 0..3u64 {
            let cos = 0.80 + 0.10 * rng.uniform() as f32;
            let v = rng.near(q, cos);
            let tenant = (first + c * 333) % TENANTS;
            let record = 10_000_000 + i as u64 * 3 + c;
            for w in [f32w, i8w] {
                w.insert(
                    tenant,
                    record,
                    ContentKind::Answer,
                    std::slice::from_ref(&v),
                )
                .expect("insert");
            }
        }
    }
    let mut r = Recall {
        queries: n,
        top1_same: 0,
        top1_among_hits: 0,
        max_diff: 0.0,
        near_ties: 0,
    };
    for batch in queries.chunks(8) {
        let a = f32w.search(batch, OUTSIDER, THRESHOLD, 10).expect("search");
        let b = i8w.search(batch, OUTSIDER, THRESHOLD, 10).expect("search");
        for (a, b) in a.iter().zip(&b) {
            let (Some(top), Some(top8)) = (a.hits.first(), b.hits.first()) else {
                continue;
            };
            if (top.tenant, top.record) == (top8.tenant, top8.record) {
                r.top1_same += 1;
            } else if a.hits.get(1).is_some_and(|h| top.score - h.score < 0.005) {
                r.near_ties += 1;
            }
            if let Some(h) = b.hits.iter().find(|h| h.record == top.record) {
                r.top1_among_hits += 1;
                r.max_diff = r.max_diff.max((h.score - top.score).abs());
            }
        }
    }
    r
}

fn main() {
    let secs: f64 = env("SECONDS").unwrap_or(1.0);
    let sizes: Vec<usize> = std::env::var("SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![10_000, 100_000, 1_000_000]);
    let f32_max: usize = env("F32_MAX").unwrap_or(100_000);
    let started = Instant::now();

    println!("embedding window: exact search, dim {DIM}, {TENANTS} tenants, one thread");
    println!("threshold {THRESHOLD}, max_hits 10, {secs} s a measurement (at least 5 samples)");
    println!();
    println!(
        "| rows | precision | bytes/vector | batch | p50 ms | p99 ms | samples | GMAC/s (p50) |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    // (precision, rows, p99 for batch 8)
    // (precision, rows, p50, p99) for batch 8
    let mut batch8: Vec<(Precision, usize, f64, f64)> = Vec::new();
    let mut recall_windows = None;
    let recall_size = sizes.iter().copied().filter(|s| *s <= f32_max).max();
    let mut rng = Rng(7);
    for &size in &sizes {
        for precision in [Precision::F32, Precision::I8] {
            if precision == Precision::F32 && size > f32_max {
                continue;
            }
            let w = filled(size, precision, 42);
            let st = w.stats();
            for batch in BATCHES {
                let l = latency(&w, batch, secs, &mut rng);
                let gmacs = (size * batch * DIM) as f64 / (l.p50 / 1e3) / 1e9;
                println!(
                    "| {size} | {precision:?} | {:.0} | {batch} | {:.3} | {:.3} | {} | {gmacs:.1} |",
                    st.bytes as f64 / st.entries as f64,
                    l.p50,
                    l.p99,
                    l.samples
                );
                if batch == 8 {
                    batch8.push((precision, size, l.p50, l.p99));
                }
            }
            if Some(size) == recall_size {
                recall_windows = Some(match (precision, recall_windows.take()) {
                    (Precision::F32, _) => (Some(w), None),
                    (Precision::I8, Some((f, _))) => (f, Some(w)),
                    (Precision::I8, None) => (None, Some(w)),
                });
            }
        }
    }

    if let (Some(size), Some((Some(f), Some(i)))) = (recall_size, recall_windows) {
        let r = recall(&f, &i, 1_000, &mut rng);
        println!();
        println!(
            "recall, I8 vs F32, {size}-row window, {} queries with 3 planted copies each at cosine 0.80-0.90 (distinct tenants):",
            r.queries
        );
        println!(
            "- I8 top-1 foreign hit = F32 top-1: {}/{} ({:.1}%)",
            r.top1_same,
            r.queries,
            100.0 * r.top1_same as f64 / r.queries as f64
        );
        println!(
            "- disagreements where F32's top two were within 0.005: {}/{}",
            r.near_ties,
            r.queries - r.top1_same
        );
        println!(
            "- F32 top-1 among I8's hits: {}/{} ({:.1}%); largest score difference {:.4}",
            r.top1_among_hits,
            r.queries,
            100.0 * r.top1_among_hits as f64 / r.queries as f64,
            r.max_diff
        );
    }

    // The same i8 dot products as a plain iterator sum, compiled for the
    // build's target only (baseline x86-64: SSE2), against the window's
    // dispatched kernel: shows what the vectorised, AVX2 inner loop gains.
    {
        let (n, batch) = (100_000usize, 8usize);
        let mut r = Rng(99);
        let rows: Vec<i8> = (0..n * DIM)
            .map(|_| (r.next_u64() % 255) as i8 - 127)
            .collect();
        let queries: Vec<i8> = (0..batch * DIM)
            .map(|_| (r.next_u64() % 255) as i8 - 127)
            .collect();
        let mut out = vec![0i32; batch];
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            for row in black_box(&rows).chunks_exact(DIM) {
                for (q, o) in queries.chunks_exact(DIM).zip(out.iter_mut()) {
                    *o = row
                        .iter()
                        .zip(q)
                        .map(|(a, b)| i32::from(*a) * i32::from(*b))
                        .sum();
                }
                black_box(&out);
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!();
        println!(
            "kernel check: plain i8 dot loop, no runtime dispatch, {n} rows x {batch} queries: {:.2} ms ({:.1} GMAC/s); compare the I8 rows above",
            best * 1e3,
            (n * batch * DIM) as f64 / best / 1e9
        );
    }

    println!();
    println!("ANN crossover: the window size at which one exact search of 8 queries passes {BUDGET_MS} ms");
    println!("(p99 is what the budget is about; p50 shows the scan rate without the scheduler's worst moments):");
    for precision in [Precision::F32, Precision::I8] {
        let rows = batch8.iter().filter(|r| r.0 == precision);
        let p99: Vec<(usize, f64)> = rows.clone().map(|r| (r.1, r.3)).collect();
        let p50: Vec<(usize, f64)> = rows.map(|r| (r.1, r.2)).collect();
        println!("- {precision:?} at p99: {}", crossover(&p99));
        println!("- {precision:?} at p50: {}", crossover(&p50));
    }
    println!();
    println!("total {:.0} s", started.elapsed().as_secs_f64());
}

/// Where the latency reaches the budget, linear between (or past) measured
/// sizes.
fn crossover(points: &[(usize, f64)]) -> String {
    if points.len() < 2 {
        return "needs two sizes".into();
    }
    if let Some(w) = points.windows(2).find(|w| w[1].1 >= BUDGET_MS) {
        let ((n1, t1), (n2, t2)) = (w[0], w[1]);
        if t1 >= BUDGET_MS {
            return format!("under {n1} rows ({t1:.2} ms p99 at {n1} already)");
        }
        let n = n1 as f64 + (BUDGET_MS - t1) * (n2 - n1) as f64 / (t2 - t1);
        return format!(
            "≈ {:.0} rows (interpolated linearly between {n1} rows at {t1:.2} ms and {n2} at {t2:.2} ms)",
            n
        );
    }
    let ((n1, t1), (n2, t2)) = (points[points.len() - 2], points[points.len() - 1]);
    let slope = (t2 - t1) / (n2 - n1) as f64;
    let n = n2 as f64 + (BUDGET_MS - t2) / slope;
    format!(
        "≈ {:.0} rows (extrapolated linearly from {n1} rows at {t1:.2} ms and {n2} at {t2:.2} ms)",
        n
    )
}
