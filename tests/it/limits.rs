//! Back-pressure and limits: the forwarding path never waits on scanning,
//! scanner bugs do not stop scanning, memory is bounded, slow clients are
//! cut off, and route rules apply however a route is spelled.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{self, call, FakeUpstream, Recorder, Reply};
use residue::config::RouteConfig;
use residue::detect::{Detector, Finding, ScanInput};
use residue::Residue;

const CHAT: &str = r#"{"messages":[{"role":"user","content":"hello there"}]}"#;

/// A detector that blocks every scan until released.
#[derive(Clone)]
struct Blocker(Arc<(Mutex<bool>, std::sync::Condvar)>);

impl Blocker {
    fn new() -> Self {
        Blocker(Arc::new((Mutex::new(false), std::sync::Condvar::new())))
    }
    fn release(&self) {
        *self.0 .0.lock().unwrap() = true;
        self.0 .1.notify_all();
    }
}

impl Detector for Blocker {
    fn name(&self) -> &'static str {
        "blocker"
    }
    fn inspect(&self, _: &ScanInput<'_>) -> Vec<Finding> {
        let (lock, cv) = &*self.0;
        let mut released = lock.lock().unwrap();
        while !*released {
            released = cv.wait(released).unwrap();
        }
        Vec::new()
    }
}

#[tokio::test]
async fn a_stuck_scanner_never_blocks_forwarding_and_drops_are_counted() {
    let upstream = FakeUpstream::start(|_| Reply::json(r#"{"choices":[]}"#)).await;
    let mut config = support::config(&upstream.url());
    config.observe.queue = 1;
    config.observe.workers = 1;
    let blocker = Blocker::new();
    let residue = Residue::bind_with(config, vec![Box::new(blocker.clone())])
        .await
        .unwrap()
        .spawn();
    // If forwarding waited on the scanner, these would never finish.
    for _ in 0..10 {
        let (status, _, _) = tokio::time::timeout(
            Duration::from_secs(10),
            call(residue.addr, "/v1/chat/completions", &[], CHAT),
        )
        .await
        .expect("forwarding does not wait for the stuck scanner");
        assert_eq!(status, StatusCode::OK);
    }
    // One exchange is in the scanner, one in the queue, the rest dropped.
    let dropped = support::metric(
        residue.admin_addr,
        "residue_scan_dropped_total",
        &[("reason", "queue_full")],
    )
    .await;
    assert!(dropped >= 7.0, "dropped = {dropped}");
    assert_eq!(
        support::metric(residue.admin_addr, "residue_scan_queue_depth", &[]).await,
        1.0
    );
    blocker.release();
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_scan_queue_is_bounded_in_bytes_too() {
    let upstream = FakeUpstream::start(|_| Reply::json(r#"{"choices":[]}"#)).await;
    let mut config = support::config(&upstream.url());
    config.observe.queue = 1_000;
    config.observe.max_queue_bytes = 10_000;
    let blocker = Blocker::new();
    let residue = Residue::bind_with(config, vec![Box::new(blocker.clone())])
        .await
        .unwrap()
        .spawn();
    let big = serde_json::json!({"messages": [{"role": "user", "content": "x".repeat(4_000)}]})
        .to_string();
    for _ in 0..6 {
        call(residue.addr, "/v1/chat/completions", &[], &big).await;
    }
    // At most two 4 KB prompts fit in 10 KB: the rest are dropped, not queued.
    let dropped = support::metric(
        residue.admin_addr,
        "residue_scan_dropped_total",
        &[("reason", "queue_bytes")],
    )
    .await;
    assert!(dropped >= 4.0, "dropped = {dropped}");
    blocker.release();
    residue.shutdown().await.unwrap();
}

struct Panicker(Arc<AtomicBool>);

impl Detector for Panicker {
    fn name(&self) -> &'static str {
        "panicker"
    }
    fn inspect(&self, input: &ScanInput<'_>) -> Vec<Finding> {
        if input.exchange.prompt.text().contains("boom") && !self.0.swap(true, Ordering::SeqCst) {
            panic!("a detector bug");
        }
        Vec::new()
    }
}

#[tokio::test]
async fn a_panicking_detector_does_not_stop_scanning() {
    let upstream =
        FakeUpstream::start(|_| Reply::json(r#"{"choices":[{"message":{"content":"ok"}}]}"#)).await;
    let recorder = Recorder::default();
    let config = support::config(&upstream.url());
    let residue = Residue::bind_with(
        config,
        vec![
            Box::new(Panicker(Arc::default())),
            Box::new(recorder.clone()),
        ],
    )
    .await
    .unwrap()
    .spawn();
    let boom = r#"{"messages":[{"role":"user","content":"boom"}]}"#;
    let (status, _, _) = call(residue.addr, "/v1/chat/completions", &[], boom).await;
    assert_eq!(status, StatusCode::OK);
    call(residue.addr, "/v1/chat/completions", &[], CHAT).await;
    let seen = recorder.one().await;
    assert_eq!(
        seen.prompt, "hello there",
        "the exchange after the panic is scanned"
    );
    assert_eq!(
        support::metric(
            residue.admin_addr,
            "residue_scan_errors_total",
            &[("reason", "panic")]
        )
        .await,
        1.0
    );
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn route_rules_apply_to_every_spelling_of_a_route() {
    let upstream = FakeUpstream::start(|_| Reply::json("{}")).await;
    let mut config = support::config(&upstream.url());
    config.routes.push(RouteConfig {
        path: "/v1/chat/completions".into(),
        tokenizer: None,
        max_prompt_tokens: Some(100),
        ..Default::default()
    });
    let (residue, _) = support::start(config).await;
    let long = serde_json::json!({"messages": [{"role": "user", "content": "word ".repeat(400)}]})
        .to_string();
    for path in [
        "/v1/chat/completions",
        "/v1/chat/completions/",
        "/chat/completions",
    ] {
        let (status, _, _) = call(residue.addr, path, &[], &long).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{path}");
    }
    assert_eq!(upstream.count(), 0);
    residue.shutdown().await.unwrap();
}

/// Sends a request head promising `length` bytes and only `sent` of them.
async fn stalled_upload(
    addr: std::net::SocketAddr,
    length: usize,
    sent: usize,
) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&vec![b' '; sent]).await.unwrap();
    s
}

#[tokio::test]
async fn a_slow_upload_gets_408() {
    let upstream = FakeUpstream::start(|_| Reply::json("{}")).await;
    let mut config = support::config(&upstream.url());
    config.server.body_read_timeout = Duration::from_millis(200);
    let (residue, _) = support::start(config).await;
    let mut s = stalled_upload(residue.addr, 100, 10).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("server.body-read-timeout"), "{answer}");
    assert_eq!(upstream.count(), 0);
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn request_bodies_in_flight_are_bounded_in_bytes() {
    let upstream = FakeUpstream::start(|_| Reply::json("{}")).await;
    let mut config = support::config(&upstream.url());
    config.server.max_request_bytes = 4_096;
    config.server.max_buffered_bytes = 4_096;
    let (residue, _) = support::start(config).await;
    // One client holds 3 KiB of the 4 KiB budget and stalls.
    let _held = stalled_upload(residue.addr, 4_000, 3_072).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let body = serde_json::json!({"messages": [{"role": "user", "content": "y".repeat(2_000)}]})
        .to_string();
    let (status, headers, _) = call(residue.addr, "/v1/chat/completions", &[], &body).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers["x-residue-error"], "overloaded");
    // Small requests still fit.
    let (status, _, _) = call(residue.addr, "/v1/chat/completions", &[], CHAT).await;
    assert_eq!(status, StatusCode::OK);
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn streams_still_open_at_the_drain_deadline_are_closed() {
    let mut reply = Reply::stream(
        "text/event-stream",
        (0..1_000)
            .map(|i| bytes::Bytes::from(format!("data: {{\"n\":{i}}}\n\n")))
            .collect(),
    );
    reply.delay = Duration::from_millis(50);
    let upstream = FakeUpstream::start(move |_| reply.clone()).await;
    let mut config = support::config(&upstream.url());
    config.server.drain_timeout = Duration::from_millis(300);
    let (residue, _) = support::start(config).await;
    let req = http::Request::post(format!("http://{}/v1/chat/completions", residue.addr))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            r#"{"stream":true,"messages":[]}"#,
        )))
        .unwrap();
    let resp = support::client().request(req).await.unwrap();
    let reader = tokio::spawn(http_body_util::BodyExt::collect(resp.into_body()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    tokio::time::timeout(Duration::from_secs(10), residue.shutdown())
        .await
        .expect("shutdown finishes soon after the drain deadline")
        .unwrap();
    let result = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .unwrap()
        .unwrap();
    assert!(
        result.is_err(),
        "the unfinished stream is cut, not passed off as complete"
    );
}

#[tokio::test]
async fn the_upstreams_own_request_id_is_kept() {
    let upstream =
        FakeUpstream::start(|_| Reply::json("{}").header("x-request-id", "req_upstream_1")).await;
    let (residue, recorder) = support::start(support::config(&upstream.url())).await;
    let (_, headers, _) = call(
        residue.addr,
        "/v1/chat/completions",
        &[("x-request-id", "mine")],
        CHAT,
    )
    .await;
    assert_eq!(headers["x-request-id"], "req_upstream_1");
    assert_eq!(headers["x-residue-request-id"], "mine");
    assert_eq!(recorder.one().await.request_id, "mine");
    residue.shutdown().await.unwrap();
}
