//! The window on random unit vectors, with planted near-copies whose cosine
//! to the query is known.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

const DIM: usize = 384;
const HOUR: Duration = Duration::from_secs(3600);
const BOTH: [Precision; 2] = [Precision::F32, Precision::I8];

fn normalise(mut v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter_mut().for_each(|x| *x /= n);
    v
}

fn unit(rng: &mut StdRng, dim: usize) -> Vec<f32> {
    normalise((0..dim).map(|_| rng.gen_range(-1.0f32..1.0)).collect())
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// A unit vector at cosine `cos` to the unit vector `q`.
fn near(rng: &mut StdRng, q: &[f32], cos: f32) -> Vec<f32> {
    let r = unit(rng, q.len());
    let d = dot(&r, q);
    let ortho = normalise(r.iter().zip(q).map(|(r, q)| r - d * q).collect());
    let s = (1.0 - cos * cos).sqrt();
    q.iter().zip(&ortho).map(|(q, o)| cos * q + s * o).collect()
}

fn window(precision: Precision, capacity: usize) -> VectorWindow {
    VectorWindow::new(DIM, capacity, HOUR, precision).expect("window")
}

/// `n` rows of random noise over tenants 100.., one record each.
fn fill(w: &VectorWindow, rng: &mut StdRng, n: usize) {
    for i in 0..n as u64 {
        let v = unit(rng, DIM);
        w.insert(100 + i % 50, 1_000 + i, ContentKind::Answer, &[v])
            .expect("insert");
    }
}

#[test]
fn nearest_foreign_row_is_found_with_its_record_and_score() {
    for p in BOTH {
        let mut rng = StdRng::seed_from_u64(1);
        let w = window(p, 10_000);
        fill(&w, &mut rng, 2_000);
        let q = unit(&mut rng, DIM);
        let planted = near(&mut rng, &q, 0.85);
        w.insert(7, 77, ContentKind::Prompt, &[unit(&mut rng, DIM), planted])
            .expect("insert");
        fill(&w, &mut rng, 2_000);
        let r = w.search(&[q], 9, 0.5, 10).expect("search");
        assert_eq!(r.len(), 1);
        let hits = &r[0].hits;
        assert_eq!(hits.len(), 1, "{p:?}: {hits:?}");
        assert_eq!(
            (hits[0].tenant, hits[0].record, hits[0].kind),
            (7, 77, ContentKind::Prompt)
        );
        assert!(
            (hits[0].score - 0.85).abs() < 0.01,
            "{p:?}: {}",
            hits[0].score
        );
        assert_eq!(r[0].foreign_tenants_above, 1);
        assert_eq!(r[0].own_best, f32::NEG_INFINITY, "tenant 9 holds no rows");
    }
}

#[test]
fn own_rows_are_never_hits_but_give_own_best() {
    for p in BOTH {
        let mut rng = StdRng::seed_from_u64(2);
        let w = window(p, 1_000);
        fill(&w, &mut rng, 200);
        let q = unit(&mut rng, DIM);
        // The requester's own exact copy, and a weaker foreign one.
        w.insert(5, 1, ContentKind::Answer, &[q.as_slice()])
            .expect("insert");
        w.insert(6, 2, ContentKind::Answer, &[near(&mut rng, &q, 0.7)])
            .expect("insert");
        let r = w.search(&[q.as_slice()], 5, 0.5, 10).expect("search");
        assert!(
            (r[0].own_best - 1.0).abs() < 0.01,
            "{p:?}: {}",
            r[0].own_best
        );
        assert_eq!(r[0].hits.len(), 1);
        assert_eq!(r[0].hits[0].tenant, 6);
        // Asked by tenant 6, the copy is tenant 5's and the best hit.
        let r = w.search(&[q], 6, 0.5, 10).expect("search");
        let tenants: Vec<TenantKey> = r[0].hits.iter().map(|h| h.tenant).collect();
        assert_eq!(tenants, vec![5]);
        assert!(
            (r[0].own_best - 0.7).abs() < 0.01,
            "{p:?}: {}",
            r[0].own_best
        );
    }
}

#[test]
fn each_foreign_tenant_appears_once_with_its_best_row() {
    for p in BOTH {
        let mut rng = StdRng::seed_from_u64(3);
        let w = window(p, 1_000);
        let q = unit(&mut rng, DIM);
        // Tenant 1: three records near the query, the middle one best.
        for (record, cos) in [(10, 0.7), (11, 0.9), (12, 0.8)] {
            w.insert(1, record, ContentKind::Answer, &[near(&mut rng, &q, cos)])
                .expect("insert");
        }
        // Tenant 2: two chunks of one record.
        let chunks = [near(&mut rng, &q, 0.75), near(&mut rng, &q, 0.6)];
        w.insert(2, 20, ContentKind::Prompt, &chunks)
            .expect("insert");
        fill(&w, &mut rng, 300);
        let r = w.search(&[q], 3, 0.5, 10).expect("search");
        let got: Vec<(TenantKey, u64)> = r[0].hits.iter().map(|h| (h.tenant, h.record)).collect();
        assert_eq!(got, vec![(1, 11), (2, 20)], "{p:?}");
        assert_eq!(r[0].foreign_tenants_above, 2);
        assert!((r[0].hits[0].score - 0.9).abs() < 0.01);
        assert!((r[0].hits[1].score - 0.75).abs() < 0.01);
    }
}

#[test]
fn threshold_and_max_hits() {
    for p in BOTH {
        let mut rng = StdRng::seed_from_u64(4);
        let w = window(p, 1_000);
        let q = unit(&mut rng, DIM);
        // Tenants 1..=6 at cosines 0.95, 0.9, …, 0.7.
        for t in 1..=6u64 {
            let cos = 1.0 - 0.05 * t as f32;
            w.insert(t, t, ContentKind::Answer, &[near(&mut rng, &q, cos)])
                .expect("insert");
        }
        fill(&w, &mut rng, 300);
        let tenants = |r: &QueryHits| r.hits.iter().map(|h| h.tenant).collect::<Vec<_>>();
        // 0.82 keeps 0.95, 0.9, 0.85.
        let r = w.search(&[q.as_slice()], 99, 0.82, 10).expect("search");
        assert_eq!(tenants(&r[0]), vec![1, 2, 3], "{p:?}");
        assert_eq!(r[0].foreign_tenants_above, 3);
        // max_hits cuts the list, not the count.
        let r = w.search(&[q.as_slice()], 99, 0.6, 2).expect("search");
        assert_eq!(tenants(&r[0]), vec![1, 2]);
        assert_eq!(r[0].foreign_tenants_above, 6);
        assert!(r[0].hits[0].score > r[0].hits[1].score);
        let r = w.search(&[q.as_slice()], 99, 0.6, 0).expect("search");
        assert!(r[0].hits.is_empty());
        assert_eq!(r[0].foreign_tenants_above, 6);
        // Nothing scores 0.99.
        let r = w.search(&[q], 99, 0.99, 10).expect("search");
        assert!(r[0].hits.is_empty());
        assert_eq!(r[0].foreign_tenants_above, 0);
    }
}

#[test]
fn queries_of_a_batch_are_answered_in_order() {
    for p in BOTH {
        let mut rng = StdRng::seed_from_u64(5);
        let w = window(p, 10_000);
        fill(&w, &mut rng, 1_000);
        // 37 queries: more than one query tile for F32 (10 a tile at 384).
        let queries: Vec<Vec<f32>> = (0..37).map(|_| unit(&mut rng, DIM)).collect();
        for (i, q) in queries.iter().enumerate() {
            if i % 3 == 0 {
                let t = 500 + i as u64;
                w.insert(t, i as u64, ContentKind::Answer, &[near(&mut rng, q, 0.9)])
                    .expect("insert");
            }
        }
        fill(&w, &mut rng, 1_000);
        let r = w.search(&queries, 1, 0.5, 5).expect("search");
        assert_eq!(r.len(), 37);
        for (i, qh) in r.iter().enumerate() {
            if i % 3 == 0 {
                assert_eq!(qh.hits.len(), 1, "{p:?} query {i}");
                assert_eq!(qh.hits[0].record, i as u64);
            } else {
                assert!(qh.hits.is_empty(), "{p:?} query {i}: {:?}", qh.hits);
            }
        }
    }
}

#[test]
fn a_full_ring_evicts_the_oldest() {
    for p in BOTH {
        let mut rng = StdRng::seed_from_u64(6);
        let w = window(p, 3);
        let rows: Vec<Vec<f32>> = (0..5).map(|_| unit(&mut rng, DIM)).collect();
        for (i, v) in rows.iter().enumerate() {
            w.insert(
                i as u64,
                i as u64,
                ContentKind::Answer,
                std::slice::from_ref(v),
            )
            .expect("insert");
        }
        let st = w.stats();
        assert_eq!((st.entries, st.evictions), (3, 2), "{p:?}");
        let r = w.search(&rows, 99, 0.9, 10).expect("search");
        let found: Vec<bool> = r.iter().map(|q| !q.hits.is_empty()).collect();
        assert_eq!(found, vec![false, false, true, true, true]);
        assert_eq!(r[4].hits[0].tenant, 4);
        // One batch larger than the ring keeps its last rows.
        w.insert(9, 9, ContentKind::Prompt, &rows).expect("insert");
        let r = w.search(&rows, 99, 0.9, 10).expect("search");
        let found: Vec<bool> = r.iter().map(|q| !q.hits.is_empty()).collect();
        assert_eq!(found, vec![false, false, true, true, true]);
        assert!(r[2..].iter().all(|q| q.hits[0].tenant == 9));
        assert_eq!(w.stats().evictions, 7);
    }
}

#[test]
fn memory_grows_with_rows_and_stops_at_capacity() {
    let mut rng = StdRng::seed_from_u64(7);
    for (p, value_bytes) in [(Precision::F32, 4 * DIM), (Precision::I8, DIM + 4)] {
        let w = window(p, 1_000);
        assert_eq!(w.stats().bytes, 0, "nothing allocated before rows arrive");
        fill(&w, &mut rng, 1_000);
        let full = w.stats();
        let per_row = full.bytes / full.entries;
        // Values (and the scale) plus 25 bytes of metadata a row.
        assert_eq!(per_row, value_bytes as u64 + 25, "{p:?}");
        fill(&w, &mut rng, 500);
        assert_eq!(w.stats().bytes, full.bytes, "a full ring reuses its slots");
    }
}

#[test]
fn rows_older_than_the_ttl_drop_out() {
    for p in BOTH {
        let mut rng = StdRng::seed_from_u64(8);
        let w = VectorWindow::new(DIM, 100, Duration::from_secs(60), p).expect("window");
        let t0 = Instant::now();
        let (old, new) = (unit(&mut rng, DIM), unit(&mut rng, DIM));
        w.insert_at(t0, 1, 1, ContentKind::Answer, &[old.as_slice()])
            .expect("insert");
        w.insert_at(
            t0 + Duration::from_secs(30),
            2,
            2,
            ContentKind::Answer,
            &[new.as_slice()],
        )
        .expect("insert");
        let queries = [old, new];
        let found = |now: Instant| -> Vec<bool> {
            w.search_at(now, &queries, 99, 0.9, 10)
                .expect("search")
                .iter()
                .map(|q| !q.hits.is_empty())
                .collect()
        };
        assert_eq!(found(t0 + Duration::from_secs(60)), vec![true, true]);
        assert_eq!(found(t0 + Duration::from_secs(61)), vec![false, true]);
        assert_eq!(found(t0 + Duration::from_secs(91)), vec![false, false]);
        // A search drops nothing: asked earlier again, both rows are there.
        assert_eq!(found(t0 + Duration::from_secs(60)), vec![true, true]);
        // Stats count expired rows as evicted before an insert drops them.
        assert_eq!(w.stats_at(t0 + Duration::from_secs(61)).entries, 1);
        let st = w.stats_at(t0 + Duration::from_secs(91));
        assert_eq!((st.entries, st.evictions), (0, 2));
        // An insert after everything expired starts over.
        let later = unit(&mut rng, DIM);
        w.insert_at(
            t0 + Duration::from_secs(200),
            3,
            3,
            ContentKind::Answer,
            &[later.as_slice()],
        )
        .expect("insert");
        let r = w
            .search_at(t0 + Duration::from_secs(200), &[later], 99, 0.9, 10)
            .expect("search");
        assert_eq!(r[0].hits[0].tenant, 3);
        assert_eq!(r[0].hits.len(), 1);
        let st = w.stats_at(t0 + Duration::from_secs(200));
        assert_eq!((st.entries, st.evictions), (1, 2));
    }
}

#[test]
fn an_insert_dated_in_the_past_keeps_the_ring_in_time_order() {
    let mut rng = StdRng::seed_from_u64(9);
    let w = VectorWindow::new(DIM, 100, Duration::from_secs(60), Precision::I8).expect("window");
    let t0 = Instant::now();
    let (a, b) = (unit(&mut rng, DIM), unit(&mut rng, DIM));
    w.insert_at(
        t0 + Duration::from_secs(50),
        1,
        1,
        ContentKind::Answer,
        &[a],
    )
    .expect("insert");
    // Dated before the first row: taken as the first row's time.
    w.insert_at(t0, 2, 2, ContentKind::Answer, &[b.as_slice()])
        .expect("insert");
    let r = w
        .search_at(t0 + Duration::from_secs(100), &[b], 99, 0.9, 10)
        .expect("search");
    assert_eq!(r[0].hits.len(), 1, "alive until t0 + 50 s + 60 s");
}

#[test]
fn i8_scores_agree_with_f32_scores() {
    let mut rng = StdRng::seed_from_u64(10);
    let f = window(Precision::F32, 1_000);
    let q8 = window(Precision::I8, 1_000);
    let queries: Vec<Vec<f32>> = (0..20).map(|_| unit(&mut rng, DIM)).collect();
    // Every row its own tenant, so every row is reported (threshold -1).
    for t in 0..500u64 {
        let v = if t % 5 == 0 {
            near(&mut rng, &queries[(t / 5) as usize % 20], 0.8)
        } else {
            unit(&mut rng, DIM)
        };
        f.insert(t, t, ContentKind::Answer, &[v.as_slice()])
            .expect("insert");
        q8.insert(t, t, ContentKind::Answer, &[v]).expect("insert");
    }
    let rf = f.search(&queries, 9_999, -1.0, 1_000).expect("search");
    let ri = q8.search(&queries, 9_999, -1.0, 1_000).expect("search");
    let mut worst = 0f32;
    for (a, b) in rf.iter().zip(&ri) {
        assert_eq!(a.hits.len(), 500);
        assert_eq!(b.hits.len(), 500);
        let mut by_tenant = vec![f32::NAN; 500];
        for h in &a.hits {
            by_tenant[h.tenant as usize] = h.score;
        }
        for h in &b.hits {
            worst = worst.max((h.score - by_tenant[h.tenant as usize]).abs());
        }
    }
    assert!(worst < 0.02, "largest i8/f32 difference {worst}");
    assert!(worst > 0.0, "i8 scores are quantised, not copies");
}

#[test]
fn scores_are_exact_cosines_for_any_dimension() {
    let mut rng = StdRng::seed_from_u64(11);
    for dim in [1, 3, 15, 16, 17, 100, 384, 1_000] {
        for p in BOTH {
            let w = VectorWindow::new(dim, 100, HOUR, p).expect("window");
            let rows: Vec<Vec<f32>> = (0..40).map(|_| unit(&mut rng, dim)).collect();
            for (t, v) in rows.iter().enumerate() {
                w.insert(t as u64, 0, ContentKind::Answer, std::slice::from_ref(v))
                    .expect("insert");
            }
            // Not normalised: the window normalises it.
            let q: Vec<f32> = unit(&mut rng, dim).iter().map(|x| x * 3.0).collect();
            let qn = normalise(q.clone());
            let r = w.search(&[q], 999, -1.0, 100).expect("search");
            assert_eq!(r[0].hits.len(), 40);
            let tol = if p == Precision::F32 { 1e-5 } else { 0.02 };
            for h in &r[0].hits {
                let want = dot(&rows[h.tenant as usize], &qn);
                assert!(
                    (h.score - want).abs() < tol,
                    "dim {dim} {p:?}: {} vs {want}",
                    h.score
                );
            }
            assert!(r[0].hits.windows(2).all(|w| w[0].score >= w[1].score));
        }
    }
}

#[test]
fn searches_run_while_rows_arrive() {
    let w = Arc::new(VectorWindow::new(DIM, 5_000, HOUR, Precision::I8).expect("window"));
    let mut rng = StdRng::seed_from_u64(12);
    let q = unit(&mut rng, DIM);
    // The planted row is inserted last of the first 100, so a capacity of
    // 5 000 keeps it for the 4 000 rows the writer adds.
    fill(&w, &mut rng, 99);
    w.insert(1, 42, ContentKind::Prompt, &[near(&mut rng, &q, 0.9)])
        .expect("insert");
    let writer = {
        let w = Arc::clone(&w);
        std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(13);
            for i in 0..400u64 {
                let rows: Vec<Vec<f32>> = (0..10).map(|_| unit(&mut rng, DIM)).collect();
                w.insert(100 + i % 50, i, ContentKind::Answer, &rows)
                    .expect("insert");
            }
        })
    };
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let w = Arc::clone(&w);
            let q = q.clone();
            std::thread::spawn(move || {
                let mut searches = 0;
                for _ in 0..50 {
                    let r = w.search(&[q.as_slice()], 2, 0.5, 5).expect("search");
                    assert_eq!(r[0].hits.len(), 1);
                    assert_eq!((r[0].hits[0].tenant, r[0].hits[0].record), (1, 42));
                    searches += 1;
                }
                searches
            })
        })
        .collect();
    writer.join().expect("writer");
    let searches: usize = readers.into_iter().map(|r| r.join().expect("reader")).sum();
    assert_eq!(searches, 200);
    let st = w.stats();
    assert_eq!((st.entries, st.evictions), (4_100, 0));
}

#[test]
fn hostile_input_is_an_error_and_changes_nothing() {
    assert_eq!(
        VectorWindow::new(DIM, 0, HOUR, Precision::I8).err(),
        Some(WindowError::ZeroCapacity)
    );
    assert_eq!(
        VectorWindow::new(0, 10, HOUR, Precision::I8).err(),
        Some(WindowError::BadDimension(0))
    );
    assert_eq!(
        VectorWindow::new(MAX_DIM + 1, 10, HOUR, Precision::F32).err(),
        Some(WindowError::BadDimension(MAX_DIM + 1))
    );
    for p in BOTH {
        let mut rng = StdRng::seed_from_u64(14);
        let w = window(p, 10);
        let good = unit(&mut rng, DIM);

        // An empty window answers with nothing.
        let r = w.search(&[good.as_slice()], 1, 0.0, 10).expect("search");
        assert_eq!(
            r,
            vec![QueryHits {
                hits: vec![],
                own_best: f32::NEG_INFINITY,
                foreign_tenants_above: 0
            }]
        );
        assert!(w
            .search(&[] as &[Vec<f32>], 1, 0.5, 10)
            .expect("search")
            .is_empty());

        let short = vec![0.1f32; DIM - 1];
        let mut nan = good.clone();
        nan[7] = f32::NAN;
        let mut inf = good.clone();
        inf[0] = f32::INFINITY;
        let zero = vec![0f32; DIM];
        let cases: [(&Vec<f32>, WindowError); 4] = [
            (
                &short,
                WindowError::WrongDimension {
                    index: 1,
                    got: DIM - 1,
                    expected: DIM,
                },
            ),
            (&nan, WindowError::NonFinite { index: 1 }),
            (&inf, WindowError::NonFinite { index: 1 }),
            (&zero, WindowError::ZeroVector { index: 1 }),
        ];
        for (bad, err) in cases {
            let batch = [good.clone(), bad.clone()];
            assert_eq!(
                w.insert(1, 1, ContentKind::Answer, &batch).err(),
                Some(err.clone())
            );
            assert_eq!(w.search(&batch, 2, 0.5, 10).err(), Some(err));
        }
        assert_eq!(w.stats().entries, 0, "a refused batch adds nothing");

        w.insert(1, 1, ContentKind::Answer, &[good.as_slice()])
            .expect("insert");
        assert!(matches!(
            w.search(&[good.as_slice()], 2, f32::NAN, 10),
            Err(WindowError::BadThreshold(t)) if t.is_nan()
        ));
        assert_eq!(
            w.search(&[good.as_slice()], 2, f32::INFINITY, 10).err(),
            Some(WindowError::BadThreshold(f32::INFINITY))
        );
        // Huge but finite values are normalised without overflowing.
        let huge: Vec<f32> = good.iter().map(|x| x * 1e37).collect();
        let r = w.search(&[huge], 2, 0.9, 10).expect("search");
        assert!((r[0].hits[0].score - 1.0).abs() < 0.01, "{p:?}");
        let tiny: Vec<f32> = good.iter().map(|x| x * 1e-30).collect();
        let r = w.search(&[tiny], 2, 0.9, 10).expect("search");
        assert!((r[0].hits[0].score - 1.0).abs() < 0.01, "{p:?}");
        assert_eq!(w.stats().entries, 1);
    }
}
