//! `residue load` against a fake upstream: headers, the endpoint and stream
//! mix, and every body read to the end. Plus `residue replay --report` on
//! files, through the binary.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use residue::load::{LoadConfig, LoadProgress};
use residue::scenario::{REQUEST_ID_HEADER, TENANT_HEADER};

use crate::support::{FakeUpstream, Reply};

fn answer(path: &str, stream: bool) -> Reply {
    if !stream {
        let body = match path {
            "/generate" => {
                r#"{"text":"fine","meta_info":{"prompt_tokens":9,"completion_tokens":1}}"#
            }
            "/v1/completions" => {
                r#"{"choices":[{"index":0,"text":"fine"}],"usage":{"prompt_tokens":9,"completion_tokens":1}}"#
            }
            _ => {
                r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"fine"}}],"usage":{"prompt_tokens":9,"completion_tokens":1}}"#
            }
        };
        return Reply::json(body);
    }
    // Several chunks, a little apart: the generator must wait for them all.
    let chunks = (0..4)
        .map(|i| {
            Bytes::from(format!(
                "data: {{\"choices\":[{{\"index\":0,\"text\":\"w{i} \"}}]}}\n\n"
            ))
        })
        .chain(std::iter::once(Bytes::from_static(b"data: [DONE]\n\n")))
        .collect();
    Reply::stream("text/event-stream", chunks)
}

fn body_len(reply: &Reply) -> u64 {
    reply.chunks.iter().map(|c| c.len() as u64).sum()
}

#[tokio::test]
async fn load_sends_each_tenants_requests_and_reads_every_body() {
    let expected_bytes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let bytes = expected_bytes.clone();
    let upstream = FakeUpstream::start(move |r| {
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let reply = answer(r.uri.path(), v["stream"] == true);
        bytes.fetch_add(body_len(&reply), Ordering::SeqCst);
        reply
    })
    .await;
    let seen = Arc::new(Mutex::new(Vec::<LoadProgress>::new()));
    let s = seen.clone();
    let config = LoadConfig {
        target: upstream.url(),
        tenants: 4,
        seed: 9,
        requests: Some(30),
        concurrency: 4,
        stream_fraction: 0.5,
        over_capacity_fraction: 0.2,
        capacity_tokens: 300,
        ..LoadConfig::default()
    };
    let report = residue::load::run(config, move |p| s.lock().unwrap().push(p.clone()))
        .await
        .unwrap();

    assert_eq!((report.sent, report.ok, report.errors), (30, 30, 0));
    assert_eq!(report.status, BTreeMap::from([(200, 30)]));
    assert_eq!(report.latencies_ms.len(), 30);
    // Every body was read: the upstream saw each one taken to the end, and
    // the generator counted every byte sent.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while upstream.completed.load(Ordering::SeqCst) < 30 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(upstream.completed.load(Ordering::SeqCst), 30);
    assert!(!upstream.cancelled.load(Ordering::SeqCst));
    assert_eq!(report.bytes, expected_bytes.load(Ordering::SeqCst));
    let progress = seen.lock().unwrap();
    assert_eq!(progress.len(), 30);
    assert_eq!(progress.iter().map(|p| p.done).max(), Some(30));

    let received = upstream.received.lock().unwrap().clone();
    assert_eq!(received.len(), 30);
    let mut key_of: HashMap<String, String> = HashMap::new();
    let mut ids = HashSet::new();
    let mut paths: BTreeMap<String, usize> = BTreeMap::new();
    let (mut streamed, mut long) = (0, 0);
    for r in &received {
        let h = |name: &str| r.headers.get(name).unwrap().to_str().unwrap().to_string();
        let tenant = h(TENANT_HEADER);
        assert!(tenant.starts_with("tenant-0"), "{tenant}");
        let auth = h("authorization");
        assert!(auth.starts_with("Bearer sk-sim-"), "{auth}");
        // One key per tenant, and no two tenants with the same key.
        assert_eq!(key_of.entry(tenant.clone()).or_insert(auth.clone()), &auth);
        let id = h(REQUEST_ID_HEADER);
        assert!(id.starts_with("load-9-"), "{id}");
        assert!(ids.insert(id));
        assert_eq!(h("content-type"), "application/json");

        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let path = r.uri.path().to_string();
        let stream = v["stream"] == true;
        streamed += usize::from(stream);
        let prompt = match path.as_str() {
            "/v1/chat/completions" => {
                assert_eq!(v["messages"][0]["role"], "system");
                v["messages"][1]["content"].as_str().unwrap().to_string()
            }
            "/v1/completions" => v["prompt"].as_str().unwrap().to_string(),
            "/generate" => {
                assert!(v.get("stream_options").is_none());
                v["text"].as_str().unwrap().to_string()
            }
            other => panic!("unexpected path {other}"),
        };
        if stream && path.starts_with("/v1/") {
            assert_eq!(v["stream_options"]["include_usage"], true, "{v}");
        }
        if prompt.split_whitespace().count() > 300 {
            long += 1;
        }
        *paths.entry(path).or_default() += 1;
    }
    let keys: HashSet<_> = key_of.values().collect();
    assert_eq!(keys.len(), key_of.len());
    assert!(key_of.len() >= 3, "{key_of:?}");
    assert_eq!(paths.len(), 3, "{paths:?}");
    assert!((5..=25).contains(&streamed), "{streamed} streamed");
    assert_eq!(report.streamed, streamed as u64);
    assert_eq!(report.over_capacity, long);
    assert!(long >= 1, "no over-capacity prompt in 30");
}

#[tokio::test]
async fn open_loop_keeps_the_rate_and_counts_failures() {
    let upstream = FakeUpstream::start(|r| {
        let mut reply = answer(r.uri.path(), false);
        if r.uri.path() == "/generate" {
            reply.status = http::StatusCode::SERVICE_UNAVAILABLE;
        }
        reply
    })
    .await;
    let config = LoadConfig {
        target: upstream.url(),
        requests: Some(10),
        rate: Some(100.0),
        stream_fraction: 0.0,
        ..LoadConfig::default()
    };
    let report = residue::load::run(config, |_| {}).await.unwrap();
    assert_eq!(report.sent, 10);
    assert_eq!(report.status.values().sum::<u64>(), 10);
    let unavailable = report.status.get(&503).copied().unwrap_or(0);
    assert_eq!(report.ok + unavailable, 10);
    // 10 starts at 100/s take about 90 ms.
    assert!(
        report.elapsed >= Duration::from_millis(80),
        "{:?}",
        report.elapsed
    );

    // Nobody listening: errors, not a failed run.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let config = LoadConfig {
        target: url,
        requests: Some(3),
        ..LoadConfig::default()
    };
    let report = residue::load::run(config, |_| {}).await.unwrap();
    assert_eq!((report.sent, report.errors, report.ok), (3, 3, 0));
}

#[test]
fn replay_report_scores_saved_files() {
    let dir = std::env::temp_dir().join(format!("residue-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let truth = dir.join("truth.jsonl");
    let incidents = dir.join("incidents.jsonl");
    let json = dir.join("card.json");
    let line = |id: &str, fault: &str, leaked: bool| {
        format!(
            r#"{{"time":"2025-01-01T00:00:00.000Z","request_id":"{id}","tenant":"tenant-01","endpoint":"chat","stream":false,"fault":{fault},"leaked":{leaked},"source_request_id":null,"source_tenant":null,"span":null,"leaked_words":40,"leaked_pii":0,"prompt_tokens_reported":1,"prompt_tokens_real":900}}"#
        )
    };
    std::fs::write(
        &truth,
        [
            line("a", "null", false),
            line("b", "\"placeholder\"", true),
            "garbage".into(),
        ]
        .join("\n"),
    )
    .unwrap();
    std::fs::write(
        &incidents,
        "{\"time\":\"2025-01-01T00:00:00.200Z\",\"request_id\":\"b\",\"detector\":\"cross_tenant_ngram\"}\n{\"trunc",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_residue"))
        .args(["replay", "--report", "--strict", "--truth"])
        .arg(&truth)
        .arg("--incidents")
        .arg(&incidents)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{md}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(md.contains("PASS"), "{md}");
    assert!(
        md.contains("| placeholder | 1 | 1 | 0 | cross_tenant_ngram 1 |"),
        "{md}"
    );
    assert!(md.contains("200 ms"), "{md}");
    let card: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(card["bad_truth_lines"], 1);
    assert_eq!(card["bad_incident_lines"], 1);
    assert_eq!(card["clean"]["responses"], 1);
    std::fs::remove_dir_all(&dir).unwrap();
}
