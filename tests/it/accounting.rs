//! Prompt accounting and the max-prompt-tokens guard.

use std::time::Duration;

use http::StatusCode;

use crate::support::{self, call, FakeUpstream, Reply};
use residue::config::RouteConfig;

/// About `tokens` tokens by residue's estimate (≈4 characters a token).
fn long_prompt(tokens: usize) -> String {
    let words = [
        "ledger",
        "quarterly",
        "basalt",
        "meridian",
        "orchard",
        "vector",
        "glacier",
    ];
    let mut s = String::new();
    let mut i = 0;
    while s.len() < tokens * 4 - 8 {
        s.push_str(words[i % words.len()]);
        s.push(' ');
        i += 1;
    }
    s
}

fn chat(prompt: &str) -> String {
    serde_json::json!({"model": "m", "messages": [{"role": "user", "content": prompt}]}).to_string()
}

fn answer(prompt_tokens: u64) -> String {
    format!(
        r#"{{"choices":[{{"index":0,"message":{{"role":"assistant","content":"Sure."}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":{prompt_tokens},"completion_tokens":2}}}}"#
    )
}

fn temp_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("residue-test-{}-{name}", std::process::id()))
}

#[tokio::test]
async fn placeholder_prompt_tokens_of_one_for_a_10k_token_prompt_is_an_incident() {
    let upstream = FakeUpstream::start(|_| Reply::json(answer(1))).await;
    let incidents_file = temp_path("placeholder.jsonl");
    let _ = std::fs::remove_file(&incidents_file);
    let mut config = support::config(&upstream.url());
    config.incidents.path = Some(incidents_file.clone());
    let (residue, recorder) = support::start(config).await;
    let mut live = residue.incidents.subscribe();

    let prompt = long_prompt(10_000);
    let (status, _, body) = call(
        residue.addr,
        "/v1/chat/completions",
        &[("authorization", "Bearer sk-tenant-b")],
        &chat(&prompt),
    )
    .await;
    // Monitor mode: the answer goes out untouched.
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&body[..], answer(1).as_bytes());

    let incident = tokio::time::timeout(Duration::from_secs(5), live.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(incident.detector, "prompt_accounting");
    assert_eq!(incident.severity.as_str(), "critical");
    assert_eq!(incident.evidence["reported_prompt_tokens"], 1);
    let counted = incident.evidence["counted_prompt_tokens"].as_u64().unwrap();
    assert!((9_000..=11_000).contains(&counted), "counted {counted}");
    assert_eq!(incident.family, "openai");
    assert_eq!(incident.action, "monitor");
    assert_eq!(recorder.one().await.counted, counted);

    residue.shutdown().await.unwrap();
    // The incident file has it, with a hashed tenant and no prompt text.
    let text = std::fs::read_to_string(&incidents_file).unwrap();
    let line: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    for field in [
        "time",
        "id",
        "request_id",
        "tenant",
        "family",
        "detector",
        "severity",
        "score",
        "evidence",
        "action",
    ] {
        assert!(line.get(field).is_some(), "incident lacks {field}: {line}");
    }
    assert_eq!(line["tenant"].as_str().unwrap().len(), 16);
    assert!(!text.contains("sk-tenant-b"));
    assert!(
        !text.contains("meridian"),
        "raw prompt text leaked into the incident file"
    );
    let _ = std::fs::remove_file(&incidents_file);
}

#[tokio::test]
async fn honest_usage_is_silent() {
    let prompt = long_prompt(10_000);
    // Real tokenizers land near the estimate, give or take a third.
    for reported in [10_000u64, 7_000, 13_500] {
        let upstream = FakeUpstream::start(move |_| Reply::json(answer(reported))).await;
        let (residue, recorder) = support::start(support::config(&upstream.url())).await;
        let mut live = residue.incidents.subscribe();
        call(residue.addr, "/v1/chat/completions", &[], &chat(&prompt)).await;
        // Short prompts are not judged, whatever they report.
        call(residue.addr, "/v1/chat/completions", &[], &chat("hi")).await;
        recorder.wait_for(2).await;
        assert!(
            live.try_recv().is_err(),
            "false positive at reported={reported}"
        );
        residue.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn streamed_placeholder_is_caught_too() {
    let events = [
        r#"data: {"choices":[{"index":0,"delta":{"content":"Regarding your invoice"}}]}"#,
        r#"data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":3}}"#,
        "data: [DONE]",
    ];
    let body: String = events.iter().map(|e| format!("{e}\n\n")).collect();
    let upstream =
        FakeUpstream::start(move |_| Reply::stream("text/event-stream", vec![body.clone().into()]))
            .await;
    let (residue, _) = support::start(support::config(&upstream.url())).await;
    let mut live = residue.incidents.subscribe();
    let req = serde_json::json!({"stream": true, "messages": [{"role": "user", "content": long_prompt(2_000)}]}).to_string();
    call(residue.addr, "/v1/chat/completions", &[], &req).await;
    let incident = tokio::time::timeout(Duration::from_secs(5), live.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(incident.detector, "prompt_accounting");
    assert_eq!(
        support::metric(
            residue.admin_addr,
            "residue_incidents_total",
            &[("detector", "prompt_accounting")]
        )
        .await,
        1.0
    );
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn cached_tokens_above_prompt_tokens_is_an_incident() {
    let upstream = FakeUpstream::start(|_| {
        Reply::json(r#"{"choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":500}}}"#)
    })
    .await;
    let (residue, _) = support::start(support::config(&upstream.url())).await;
    let mut live = residue.incidents.subscribe();
    call(
        residue.addr,
        "/v1/chat/completions",
        &[],
        &chat("short question"),
    )
    .await;
    let incident = tokio::time::timeout(Duration::from_secs(5), live.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(incident.evidence["reason"], "cached_exceeds_prompt");
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn max_prompt_tokens_guard_answers_413_in_the_family_shape() {
    let upstream = FakeUpstream::start(|_| Reply::json(answer(5))).await;
    let mut config = support::config(&upstream.url());
    config.routes.push(RouteConfig {
        path: "/v1/*".into(),
        tokenizer: None,
        max_prompt_tokens: Some(1_000),
        ..Default::default()
    });
    let (residue, _) = support::start(config).await;

    let (status, headers, body) = call(
        residue.addr,
        "/v1/chat/completions",
        &[],
        &chat(&long_prompt(5_000)),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(headers["x-residue-error-source"], "downstream");
    let err: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(err["error"]["source"], "residue");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("residue: the prompt has"),
        "{err}"
    );
    assert!(err["error"]["message"]
        .as_str()
        .unwrap()
        .contains("at most 1000"));

    let anthropic = serde_json::json!({"model":"c","max_tokens":5,"messages":[{"role":"user","content":long_prompt(5_000)}]}).to_string();
    let (status, _, body) = call(residue.addr, "/v1/messages", &[], &anthropic).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let err: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(err["type"], "error");
    assert_eq!(err["error"]["source"], "residue");
    assert_eq!(
        upstream.count(),
        0,
        "over-limit prompts must not be forwarded"
    );

    // Under the limit: forwarded.
    let (status, _, _) = call(
        residue.addr,
        "/v1/chat/completions",
        &[],
        &chat(&long_prompt(500)),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(upstream.count(), 1);
    assert_eq!(
        support::metric(
            residue.admin_addr,
            "residue_rejected_total",
            &[("reason", "prompt_too_long")]
        )
        .await,
        2.0
    );
    residue.shutdown().await.unwrap();
}

/// A WordLevel tokenizer (one token per whitespace-separated word or
/// punctuation mark), written at test time.
const TOKENIZER_JSON: &str = r#"{
  "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
  "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
  "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "tok": 1}, "unk_token": "[UNK]"}
}"#;

#[tokio::test]
async fn a_routes_tokenizer_gives_exact_counts() {
    let path = temp_path("tokenizer.json");
    std::fs::write(&path, TOKENIZER_JSON).unwrap();
    // 3,000 one-letter words: 3,000 tokens for this tokenizer, ~1,500 by the
    // estimate. The upstream reports 1,400: fine by the estimate, a leak
    // signature (< 0.5 × 3,000) by the real tokenizer.
    let upstream = FakeUpstream::start(|_| Reply::json(answer(1_400))).await;
    let mut config = support::config(&upstream.url());
    config.routes.push(RouteConfig {
        path: "/v1/chat/completions".into(),
        tokenizer: Some(path.clone()),
        max_prompt_tokens: None,
        ..Default::default()
    });
    let (residue, recorder) = support::start(config).await;
    let mut live = residue.incidents.subscribe();
    let prompt = "a ".repeat(3_000);
    call(residue.addr, "/v1/chat/completions", &[], &chat(&prompt)).await;
    assert_eq!(recorder.one().await.counted, 3_000);
    let incident = tokio::time::timeout(Duration::from_secs(5), live.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(incident.evidence["counter"], "tokenizer");
    assert_eq!(incident.evidence["counted_prompt_tokens"], 3_000);
    // Another route has no tokenizer: the estimate, and no incident.
    call(
        residue.addr,
        "/v1/completions",
        &[],
        &serde_json::json!({"prompt": prompt}).to_string(),
    )
    .await;
    let seen = recorder.wait_for(2).await;
    assert!(
        (1_400..=1_600).contains(&seen[1].counted),
        "{}",
        seen[1].counted
    );
    assert!(live.try_recv().is_err());
    residue.shutdown().await.unwrap();
    let _ = std::fs::remove_file(path);
}
