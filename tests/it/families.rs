//! Every API family, streaming and not: the client gets the upstream's bytes
//! and status unchanged, and the scanners see exactly the prompt and output.

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;

use crate::support::{self, call, FakeUpstream, Reply};

struct Case {
    name: &'static str,
    path: &'static str,
    request: &'static str,
    prompt_parts: &'static [&'static str],
    content_type: &'static str,
    response: String,
    output: &'static str,
    prompt_tokens: Option<u64>,
    endpoint: &'static str,
}

fn sse(events: &[&str]) -> String {
    events.iter().map(|e| format!("data: {e}\n\n")).collect()
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "openai chat json",
            path: "/v1/chat/completions",
            request: r#"{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":[{"type":"text","text":"Héllo 世界"}]}]}"#,
            prompt_parts: &["You are terse.", "Héllo 世界"],
            content_type: "application/json",
            response: r#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Bonjour 你好 🌍"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}"#.into(),
            output: "Bonjour 你好 🌍",
            prompt_tokens: Some(12),
            endpoint: "openai.chat",
        },
        Case {
            name: "openai chat sse",
            path: "/v1/chat/completions",
            request: r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"Héllo 世界"}]}"#,
            prompt_parts: &["Héllo 世界"],
            content_type: "text/event-stream",
            response: sse(&[
                r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"content":"Bon"}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"content":"jour 你"}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"content":"好 🌍"},"finish_reason":"stop"}]}"#,
                r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":5}}"#,
                "[DONE]",
            ]),
            output: "Bonjour 你好 🌍",
            prompt_tokens: Some(9),
            endpoint: "openai.chat",
        },
        Case {
            name: "openai completions sse",
            path: "/v1/completions",
            request: r#"{"model":"m","prompt":"Say hi","stream":true}"#,
            prompt_parts: &["Say hi"],
            content_type: "text/event-stream",
            response: sse(&[
                r#"{"choices":[{"index":0,"text":"hi"}]}"#,
                r#"{"choices":[{"index":0,"text":" there","finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":2}}"#,
                "[DONE]",
            ]),
            output: "hi there",
            prompt_tokens: Some(2),
            endpoint: "openai.completions",
        },
        Case {
            name: "openai responses json",
            path: "/v1/responses",
            request: r#"{"model":"m","instructions":"Be brief.","input":"What is 2+2?"}"#,
            prompt_parts: &["Be brief.", "What is 2+2?"],
            content_type: "application/json",
            response: r#"{"id":"r1","object":"response","status":"completed","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"4"}]}],"usage":{"input_tokens":10,"output_tokens":1}}"#.into(),
            output: "4",
            prompt_tokens: Some(10),
            endpoint: "openai.responses",
        },
        Case {
            name: "openai responses sse",
            path: "/v1/responses",
            request: r#"{"model":"m","stream":true,"input":[{"role":"user","content":"What is 2+2?"}]}"#,
            prompt_parts: &["What is 2+2?"],
            content_type: "text/event-stream",
            response: concat!(
                "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"status\":\"in_progress\"}}\n\n",
                "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Four\"}\n\n",
                "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\" (4)\"}\n\n",
                "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"usage\":{\"input_tokens\":11,\"output_tokens\":3}}}\n\n",
            ).into(),
            output: "Four (4)",
            prompt_tokens: Some(11),
            endpoint: "openai.responses",
        },
        Case {
            name: "anthropic json",
            path: "/v1/messages",
            request: r#"{"model":"c","max_tokens":10,"system":"Be kind.","messages":[{"role":"user","content":"Hi there"}]}"#,
            prompt_parts: &["Be kind.", "Hi there"],
            content_type: "application/json",
            response: r#"{"id":"m1","type":"message","role":"assistant","content":[{"type":"text","text":"Hello!"}],"stop_reason":"end_turn","usage":{"input_tokens":9,"cache_read_input_tokens":100,"output_tokens":2}}"#.into(),
            output: "Hello!",
            prompt_tokens: Some(109),
            endpoint: "anthropic.messages",
        },
        Case {
            name: "anthropic sse",
            path: "/v1/messages",
            request: r#"{"model":"c","max_tokens":10,"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"Hi 👋"}]}]}"#,
            prompt_parts: &["Hi 👋"],
            content_type: "text/event-stream",
            response: concat!(
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m1\",\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}\n\n",
                "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
                "event: ping\ndata: {\"type\":\"ping\"}\n\n",
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n",
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"lo 👋!\"}}\n\n",
                "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
                "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":4}}\n\n",
                "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
            ).into(),
            output: "Hello 👋!",
            prompt_tokens: Some(7),
            endpoint: "anthropic.messages",
        },
        Case {
            name: "sglang json",
            path: "/generate",
            request: r#"{"text":"The capital of France is","sampling_params":{"max_new_tokens":8}}"#,
            prompt_parts: &["The capital of France is"],
            content_type: "application/json",
            response: r#"{"text":" Paris.","meta_info":{"prompt_tokens":6,"completion_tokens":2,"finish_reason":{"type":"stop"}}}"#.into(),
            output: " Paris.",
            prompt_tokens: Some(6),
            endpoint: "sglang.generate",
        },
        Case {
            name: "sglang sse cumulative",
            path: "/generate",
            request: r#"{"text":"La capitale de la France est","stream":true}"#,
            prompt_parts: &["La capitale de la France est"],
            content_type: "text/event-stream",
            response: sse(&[
                r#"{"text":" Pa","meta_info":{"prompt_tokens":7,"completion_tokens":1}}"#,
                r#"{"text":" Paris, évidemment","meta_info":{"prompt_tokens":7,"completion_tokens":3}}"#,
                r#"{"text":" Paris, évidemment.","meta_info":{"prompt_tokens":7,"completion_tokens":4,"finish_reason":{"type":"stop"}}}"#,
                "[DONE]",
            ]),
            output: " Paris, évidemment.",
            prompt_tokens: Some(7),
            endpoint: "sglang.generate",
        },
        Case {
            name: "tgi json",
            path: "/generate",
            request: r#"{"inputs":"What is Deep Learning?","parameters":{"max_new_tokens":20}}"#,
            prompt_parts: &["What is Deep Learning?"],
            content_type: "application/json",
            response: r#"{"generated_text":"A branch of ML."}"#.into(),
            output: "A branch of ML.",
            prompt_tokens: None,
            endpoint: "tgi.generate",
        },
        Case {
            name: "tgi sse",
            path: "/generate_stream",
            request: r#"{"inputs":"What is Deep Learning?"}"#,
            prompt_parts: &["What is Deep Learning?"],
            content_type: "text/event-stream",
            response: sse(&[
                r#"{"token":{"id":1,"text":"A","logprob":-0.1,"special":false},"generated_text":null,"details":null}"#,
                r#"{"token":{"id":2,"text":" branch","logprob":-0.1,"special":false},"generated_text":null,"details":null}"#,
                r#"{"token":{"id":3,"text":"</s>","logprob":-0.1,"special":true},"generated_text":"A branch","details":{"finish_reason":"eos_token","generated_tokens":3}}"#,
            ]),
            output: "A branch",
            prompt_tokens: None,
            endpoint: "tgi.generate_stream",
        },
        Case {
            name: "ollama chat ndjson",
            path: "/api/chat",
            request: r#"{"model":"llama3","messages":[{"role":"user","content":"why is the sky blue?"}]}"#,
            prompt_parts: &["why is the sky blue?"],
            content_type: "application/x-ndjson",
            response: [
                r#"{"model":"llama3","message":{"role":"assistant","content":"Ray"},"done":false}"#,
                r#"{"model":"llama3","message":{"role":"assistant","content":"leigh 散射"},"done":false}"#,
                r#"{"model":"llama3","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":8,"eval_count":3}"#,
            ]
            .iter()
            .map(|l| format!("{l}\n"))
            .collect(),
            output: "Rayleigh 散射",
            prompt_tokens: Some(8),
            endpoint: "ollama.chat",
        },
        Case {
            name: "ollama generate json",
            path: "/api/generate",
            request: r#"{"model":"llama3","prompt":"Hi","system":"Be brief.","stream":false}"#,
            prompt_parts: &["Be brief.", "Hi"],
            content_type: "application/json",
            response: r#"{"model":"llama3","response":"Hello","done":true,"done_reason":"stop","prompt_eval_count":4,"eval_count":1}"#.into(),
            output: "Hello",
            prompt_tokens: Some(4),
            endpoint: "ollama.generate",
        },
        Case {
            name: "cloudflare json",
            path: "/client/v4/accounts/abc123/ai/run/@cf/meta/llama-3-8b-instruct",
            request: r#"{"messages":[{"role":"user","content":"Tell me a joke"}]}"#,
            prompt_parts: &["Tell me a joke"],
            content_type: "application/json",
            response: r#"{"result":{"response":"Why did the GPU cross the road?","usage":{"prompt_tokens":5,"completion_tokens":8}},"success":true,"errors":[],"messages":[]}"#.into(),
            output: "Why did the GPU cross the road?",
            prompt_tokens: Some(5),
            endpoint: "cloudflare.run",
        },
        Case {
            name: "cloudflare sse",
            path: "/ai/run/@cf/meta/llama-3-8b-instruct",
            request: r#"{"prompt":"Tell me a joke","stream":true}"#,
            prompt_parts: &["Tell me a joke"],
            content_type: "text/event-stream",
            response: sse(&[r#"{"response":"Why"}"#, r#"{"response":" not?"}"#, "[DONE]"]),
            output: "Why not?",
            prompt_tokens: None,
            endpoint: "cloudflare.run",
        },
    ]
}

/// Splits `s` into 7-byte chunks: events, lines and multi-byte characters
/// all end up cut across chunks.
fn awkward_chunks(s: &str) -> Vec<Bytes> {
    s.as_bytes().chunks(7).map(Bytes::copy_from_slice).collect()
}

#[tokio::test]
async fn every_family_passes_through_unchanged_and_is_extracted_exactly() {
    for case in cases() {
        let chunks = if case.content_type == "application/json" {
            vec![Bytes::from(case.response.clone())]
        } else {
            awkward_chunks(&case.response)
        };
        let reply = Reply {
            status: StatusCode::OK,
            headers: vec![("content-type", case.content_type.to_string())],
            chunks,
            delay: Duration::from_millis(1),
            gate: None,
            trailers: None,
        };
        let upstream = FakeUpstream::start(move |_| reply.clone()).await;
        let (residue, recorder) = support::start(support::config(&upstream.url())).await;

        let direct = call(upstream.addr, case.path, &[], case.request).await;
        let proxied = call(
            residue.addr,
            case.path,
            &[("authorization", "Bearer sk-test")],
            case.request,
        )
        .await;
        assert_eq!(proxied.0, direct.0, "{}: status", case.name);
        assert_eq!(proxied.2, direct.2, "{}: body bytes", case.name);
        assert_eq!(
            &proxied.2[..],
            case.response.as_bytes(),
            "{}: body bytes",
            case.name
        );
        assert_eq!(
            proxied.1.get("content-type"),
            direct.1.get("content-type"),
            "{}",
            case.name
        );
        // The upstream got the request body unchanged.
        assert_eq!(
            &upstream.last().body[..],
            case.request.as_bytes(),
            "{}: request body",
            case.name
        );

        let seen = recorder.one().await;
        assert_eq!(seen.endpoint, case.endpoint, "{}", case.name);
        assert_eq!(
            seen.prompt_parts, case.prompt_parts,
            "{}: prompt",
            case.name
        );
        assert_eq!(seen.output, case.output, "{}: output", case.name);
        assert_eq!(
            seen.usage.prompt_tokens, case.prompt_tokens,
            "{}: usage",
            case.name
        );
        assert_eq!(seen.status, 200);
        assert_eq!(seen.end, "complete", "{}", case.name);
        residue.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn tgi_usage_headers_are_read() {
    let upstream = FakeUpstream::start(|_| {
        Reply::json(r#"{"generated_text":"ok"}"#)
            .header("x-prompt-tokens", "5")
            .header("x-generated-tokens", "1")
    })
    .await;
    let (residue, recorder) = support::start(support::config(&upstream.url())).await;
    call(
        residue.addr,
        "/generate",
        &[],
        r#"{"inputs":"Hello there friend"}"#,
    )
    .await;
    let seen = recorder.one().await;
    assert_eq!(seen.usage.prompt_tokens, Some(5));
    assert_eq!(seen.usage.completion_tokens, Some(1));
    residue.shutdown().await.unwrap();
}
