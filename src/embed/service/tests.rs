//! The embedding service on the tiny random BERT of `embed::tests`.

use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use super::{BatchConfig, BatchInfo, EmbedService, Hook, Shed};
use crate::embed::tests::{load, tiny_model};
use crate::embed::{EmbedError, Pooling};
use crate::metrics::Metrics;

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn outcome(metrics: &Metrics, outcome: &str) -> u64 {
    metrics.embed_requests.with_label_values(&[outcome]).get()
}

fn batches(metrics: &Metrics) -> u64 {
    metrics.embed_batch_size.get_sample_count()
}

/// A hook that records every batch.
fn recorder() -> (Hook, Arc<Mutex<Vec<BatchInfo>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = log.clone();
    let hook: Hook = Box::new(move |info| sink.lock().expect("log").push(info));
    (hook, log)
}

/// Joins the thread, failing after 10 s rather than hanging the suite.
fn join_within(thread: std::thread::JoinHandle<()>, what: &str) {
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(thread.join().is_ok());
    });
    match finished.recv_timeout(Duration::from_secs(10)) {
        Ok(true) => {}
        Ok(false) => panic!("{what}: the model thread panicked"),
        Err(_) => panic!("{what}: the model thread did not end"),
    }
}

const WORDS: &[&str] = &[
    "a man is eating food",
    "cat",
    "the stock market fell sharply today",
    "a piece of bread",
    "the cat sat on a mat",
    "",
    "bread",
    "unknown words",
];

/// Request `i`: `1 + i % 3` texts.
fn request(i: usize) -> Vec<String> {
    (0..1 + i % 3)
        .map(|j| WORDS[(i + j) % WORDS.len()].to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_callers_get_what_the_embedder_gives() {
    let dir = tiny_model("service-equal", Pooling::Mean);
    let direct = load(&dir);
    let metrics = Metrics::new();
    let config = BatchConfig {
        max_wait: Duration::from_millis(20),
        ..BatchConfig::default()
    };
    let service = EmbedService::start(load(&dir), config, &metrics);
    assert_eq!(service.dimension(), direct.dimension());
    assert_eq!(service.device_name(), "cpu");
    assert_eq!(
        metrics
            .embed_device
            .with_label_values(&["cpu", direct.cpu_kernel()])
            .get(),
        1,
        "the device gauge"
    );

    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let service = service.clone();
            tokio::spawn(async move { (i, service.embed(request(i)).await) })
        })
        .collect();
    for task in tasks {
        let (i, got) = task.await.expect("task");
        let got = got.expect("embed");
        let texts = request(i);
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let want = direct.embed(&refs).expect("direct");
        assert_eq!(got.len(), want.len(), "request {i}");
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            let diff = max_abs_diff(g, w);
            assert!(diff < 1e-5, "request {i} text {k}: differs by {diff}");
        }
    }
    assert_eq!(outcome(&metrics, "ok"), 16);
    assert!(batches(&metrics) >= 1);

    // No texts, no model call, no queue.
    let before = batches(&metrics);
    assert!(service.embed(Vec::new()).await.expect("empty").is_empty());
    assert_eq!(batches(&metrics), before);
}

#[test]
fn concurrent_submitters_share_model_calls() {
    let dir = tiny_model("service-batching", Pooling::Mean);
    let metrics = Metrics::new();
    let config = BatchConfig {
        max_wait: Duration::from_millis(50),
        ..BatchConfig::default()
    };
    let service = EmbedService::start(load(&dir), config, &metrics);
    let start = Arc::new(Barrier::new(8));
    let submitters: Vec<_> = (0..8)
        .map(|i| {
            let service = service.clone();
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let rx = service.try_submit(request(i)).expect("queued");
                let vectors = rx.blocking_recv().expect("answered").expect("embed");
                assert_eq!(vectors.len(), request(i).len());
            })
        })
        .collect();
    for s in submitters {
        s.join().expect("submitter");
    }
    let calls = batches(&metrics);
    eprintln!("8 requests, {calls} model calls");
    assert!(calls < 8, "{calls} model calls for 8 requests");
    assert_eq!(outcome(&metrics, "ok"), 8);
}

#[test]
fn batches_hold_at_most_max_batch_requests() {
    let dir = tiny_model("service-requests", Pooling::Mean);
    let metrics = Metrics::new();
    let config = BatchConfig {
        max_batch_requests: 3,
        max_wait: Duration::from_millis(200),
        ..BatchConfig::default()
    };
    let (hook, log) = recorder();
    let (service, thread) = EmbedService::spawn(load(&dir), config, &metrics, Some(hook));
    let receivers: Vec<_> = (0..8)
        .map(|i| service.try_submit(request(i)).expect("queued"))
        .collect();
    for (i, rx) in receivers.into_iter().enumerate() {
        let vectors = rx.blocking_recv().expect("answered").expect("embed");
        assert_eq!(vectors.len(), request(i).len());
    }
    drop(service);
    join_within(thread, "max_batch_requests");
    let log = log.lock().expect("log");
    eprintln!("{log:?}");
    assert!(log.iter().all(|b| b.requests <= 3), "{log:?}");
    assert_eq!(log.iter().map(|b| b.requests).sum::<usize>(), 8);
    assert!(
        log.iter().any(|b| b.requests == 3),
        "no full batch: {log:?}"
    );
}

#[test]
fn batches_stay_within_max_batch_tokens() {
    let dir = tiny_model("service-tokens", Pooling::Mean);
    let embedder = load(&dir);
    // [CLS] cat [SEP]; [CLS] a man is eating food [SEP].
    assert_eq!(embedder.count_tokens("cat"), 3);
    assert_eq!(embedder.count_tokens("a man is eating food"), 7);
    let metrics = Metrics::new();
    let config = BatchConfig {
        max_batch_tokens: 10,
        max_wait: Duration::from_millis(200),
        ..BatchConfig::default()
    };
    let (hook, log) = recorder();
    let (service, thread) = EmbedService::spawn(embedder, config, &metrics, Some(hook));
    let mut receivers = Vec::new();
    for _ in 0..6 {
        receivers.push(service.try_submit(vec!["cat".into()]).expect("queued"));
    }
    // 3 × 7 = 21 tokens: over the budget alone, so it runs alone.
    let big = vec!["a man is eating food".to_string(); 3];
    receivers.push(service.try_submit(big).expect("queued"));
    // 7 + padding of "cat" to 7: 2 × 7 = 14 > 10, so not with the big one.
    receivers.push(service.try_submit(vec!["cat".into()]).expect("queued"));
    for rx in receivers {
        rx.blocking_recv().expect("answered").expect("embed");
    }
    drop(service);
    join_within(thread, "max_batch_tokens");
    let log = log.lock().expect("log");
    eprintln!("{log:?}");
    for b in log.iter() {
        assert!(b.tokens <= 10 || b.requests == 1, "{b:?} in {log:?}");
    }
    assert!(
        log.iter()
            .any(|b| b.requests == 1 && b.texts == 3 && b.tokens == 21),
        "the oversized request did not run alone: {log:?}"
    );
    assert!(
        log.iter().any(|b| b.requests == 3 && b.tokens == 9),
        "the budget did not fill: {log:?}"
    );
    assert_eq!(log.iter().map(|b| b.requests).sum::<usize>(), 8);
}

/// A hook that reports each batch and then waits for the gate to open
/// (the gate's sender dropped).
fn gated() -> (Hook, mpsc::Receiver<BatchInfo>, mpsc::Sender<()>) {
    let (entered_tx, entered) = mpsc::channel();
    let (gate, gate_rx) = mpsc::channel::<()>();
    let hook: Hook = Box::new(move |info| {
        let _ = entered_tx.send(info);
        let _ = gate_rx.recv();
    });
    (hook, entered, gate)
}

#[test]
fn a_full_queue_sheds_at_once_and_counts_it() {
    let dir = tiny_model("service-shed", Pooling::Mean);
    let metrics = Metrics::new();
    let config = BatchConfig {
        queue: 1,
        max_wait: Duration::ZERO,
        ..BatchConfig::default()
    };
    let (hook, entered, gate) = gated();
    let (service, thread) = EmbedService::spawn(load(&dir), config, &metrics, Some(hook));

    // The model thread takes the first request and stalls in its batch.
    let first = service.try_submit(request(0)).expect("queued");
    entered
        .recv_timeout(Duration::from_secs(10))
        .expect("the first batch started");
    // The second fills the queue.
    let second = service.try_submit(request(1)).expect("queued");
    // The third is shed without waiting.
    let t = Instant::now();
    assert_eq!(service.try_submit(request(2)).err(), Some(Shed::QueueFull));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let err = runtime
        .block_on(service.embed(request(3)))
        .expect_err("shed");
    assert!(matches!(err, EmbedError::Overloaded), "{err}");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(outcome(&metrics, "shed"), 2);
    assert_eq!(outcome(&metrics, "ok"), 0);

    drop(gate);
    first.blocking_recv().expect("answered").expect("embed");
    second.blocking_recv().expect("answered").expect("embed");
    assert_eq!(outcome(&metrics, "ok"), 2);
    assert_eq!(outcome(&metrics, "shed"), 2);
    drop(service);
    join_within(thread, "shed");
}

#[test]
fn a_request_whose_caller_left_is_skipped() {
    let dir = tiny_model("service-cancel", Pooling::Mean);
    let metrics = Metrics::new();
    let config = BatchConfig {
        max_wait: Duration::ZERO,
        ..BatchConfig::default()
    };
    let (hook, entered, gate) = gated();
    let (service, thread) = EmbedService::spawn(load(&dir), config, &metrics, Some(hook));
    let first = service.try_submit(request(0)).expect("queued");
    entered
        .recv_timeout(Duration::from_secs(10))
        .expect("the first batch started");
    drop(service.try_submit(request(1)).expect("queued"));
    let third = service.try_submit(request(2)).expect("queued");
    drop(gate);
    first.blocking_recv().expect("answered").expect("embed");
    third.blocking_recv().expect("answered").expect("embed");
    drop(service);
    join_within(thread, "cancel");
    assert_eq!(outcome(&metrics, "cancelled"), 1);
    assert_eq!(outcome(&metrics, "ok"), 2);
    // The cancelled request never reached the model.
    let texts: usize = entered.try_iter().map(|b| b.texts).sum();
    assert_eq!(texts, request(2).len());
}

#[test]
fn dropping_every_handle_ends_the_thread_after_answering_the_queue() {
    let dir = tiny_model("service-drop", Pooling::Mean);
    let metrics = Metrics::new();
    let config = BatchConfig {
        max_wait: Duration::ZERO,
        ..BatchConfig::default()
    };
    let (hook, entered, gate) = gated();
    let (service, thread) = EmbedService::spawn(load(&dir), config, &metrics, Some(hook));
    let clone = service.clone();
    let first = service.try_submit(request(0)).expect("queued");
    entered
        .recv_timeout(Duration::from_secs(10))
        .expect("the first batch started");
    let queued = clone.try_submit(request(1)).expect("queued");
    drop(service);
    drop(clone);
    drop(gate);
    // The batch in hand and the request queued behind it are answered.
    first.blocking_recv().expect("answered").expect("embed");
    queued.blocking_recv().expect("answered").expect("embed");
    join_within(thread, "drop");

    // And an idle service's thread ends too.
    let (service, thread) = EmbedService::spawn(load(&dir), config, &metrics, None);
    drop(service);
    join_within(thread, "idle drop");
}
