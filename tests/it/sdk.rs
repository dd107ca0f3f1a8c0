//! The official `openai` and `anthropic` Python SDKs work through residue
//! unchanged, streaming and not. Skipped (loudly) when Python or the SDKs are
//! missing, unless RESIDUE_REQUIRE_ALL=1.

use std::time::Duration;

use bytes::Bytes;

use crate::support::{self, require_tool, FakeUpstream, Reply};

fn sse(events: &[(&str, serde_json::Value)]) -> Vec<Bytes> {
    events
        .iter()
        .map(|(name, data)| {
            let head = if name.is_empty() {
                String::new()
            } else {
                format!("event: {name}\n")
            };
            Bytes::from(format!("{head}data: {data}\n\n"))
        })
        .collect()
}

fn upstream_reply(path: &str, body: &[u8]) -> Reply {
    let req: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let stream = req["stream"].as_bool().unwrap_or(false);
    let words = ["Hello", " from", " upstream"];
    match (path, stream) {
        ("/v1/chat/completions", false) => Reply::json(
            serde_json::json!({
                "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello from upstream"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
            })
            .to_string(),
        ),
        ("/v1/chat/completions", true) => {
            let mut events: Vec<(&str, serde_json::Value)> = words
                .iter()
                .map(|w| ("", serde_json::json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": null}]})))
                .collect();
            events.push(("", serde_json::json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})));
            let mut chunks = sse(&events);
            chunks.push(Bytes::from("data: [DONE]\n\n"));
            Reply::stream("text/event-stream", chunks)
        }
        ("/v1/messages", false) => Reply::json(
            serde_json::json!({
                "id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
                "content": [{"type": "text", "text": "Hello from upstream"}],
                "stop_reason": "end_turn", "stop_sequence": null,
                "usage": {"input_tokens": 3, "output_tokens": 3}
            })
            .to_string(),
        ),
        ("/v1/messages", true) => {
            let mut events = vec![
                ("message_start", serde_json::json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 3, "output_tokens": 1}}})),
                ("content_block_start", serde_json::json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
            ];
            for w in words {
                events.push(("content_block_delta", serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}})));
            }
            events.push(("content_block_stop", serde_json::json!({"type": "content_block_stop", "index": 0})));
            events.push(("message_delta", serde_json::json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 3}})));
            events.push(("message_stop", serde_json::json!({"type": "message_stop"})));
            Reply::stream("text/event-stream", sse(&events))
        }
        _ => {
            let mut r = Reply::json(r#"{"error":"not found"}"#);
            r.status = http::StatusCode::NOT_FOUND;
            r
        }
    }
}

#[tokio::test]
async fn openai_and_anthropic_python_sdks_work_through_residue() {
    if !require_tool(
        "python3 with the openai and anthropic packages",
        "python3",
        &["-c", "import openai, anthropic"],
    ) {
        return;
    }
    let upstream = FakeUpstream::start(|r| upstream_reply(r.uri.path(), &r.body)).await;
    let (residue, recorder) = support::start(support::config(&upstream.url())).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/check_sdks.py");
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("python3")
            .arg(script)
            .arg(format!("http://{}", residue.addr))
            .output(),
    )
    .await
    .expect("the SDK checks finish within 60 s")
    .expect("python3 runs");
    assert!(
        out.status.success(),
        "SDK checks failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // residue scanned all four exchanges and read the same text the SDKs did.
    let seen = recorder.wait_for(4).await;
    for s in &seen {
        assert_eq!(s.output, "Hello from upstream", "{s:?}");
        assert_eq!(s.prompt, "Say hello");
    }
    residue.shutdown().await.unwrap();
}
