//! Tests of the public protocol API: request parsing, response decoding of
//! every family across arbitrary chunk boundaries, error bodies, and hostile
//! input. Framer- and routing-level tables live next to their code.

use super::*;
use serde_json::{json, Value};

const MAX: usize = 1 << 20;

// === helpers ===

fn parse(path: &str, body: &str) -> ParsedRequest {
    let route = match_route(path).unwrap_or_else(|| panic!("no route for {path}"));
    parse_request(route, body.as_bytes()).unwrap_or_else(|e| panic!("{path} {body}: {e}"))
}

fn decode_chunks(ep: Endpoint, fmt: BodyFormat, chunks: &[&[u8]], max: usize) -> Output {
    let mut d = ResponseDecoder::new(ep, fmt, max);
    let mut out = Output::default();
    for c in chunks {
        d.push(c, &mut out);
    }
    d.finish(&mut out);
    out
}

fn decode(ep: Endpoint, fmt: BodyFormat, body: &[u8]) -> Output {
    decode_chunks(ep, fmt, &[body], MAX)
}

/// Decodes `body` in one push, split in two at every byte, and one byte per
/// push; all must agree. Returns the single-push output.
fn decode_every_split(ep: Endpoint, fmt: BodyFormat, body: &[u8]) -> Output {
    let whole = decode(ep, fmt, body);
    for i in 0..=body.len() {
        let (a, b) = body.split_at(i);
        let got = decode_chunks(ep, fmt, &[a, b], MAX);
        assert_eq!(got, whole, "{ep:?} {fmt:?} split at {i}");
    }
    let bytes: Vec<&[u8]> = body.chunks(1).collect();
    assert_eq!(
        decode_chunks(ep, fmt, &bytes, MAX),
        whole,
        "{ep:?} byte by byte"
    );
    whole
}

fn usage(p: Option<u64>, cached: Option<u64>, c: Option<u64>, finish: Option<&str>) -> Usage {
    Usage {
        prompt_tokens: p,
        cached_tokens: cached,
        completion_tokens: c,
        finish_reason: finish.map(str::to_owned),
    }
}

/// SSE body: one `data:` event per JSON value, then `[DONE]`.
fn sse(events: &[Value]) -> String {
    let mut s: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    s.push_str("data: [DONE]\n\n");
    s
}

// === request parsing ===

#[test]
fn prompt_extraction_per_family() {
    struct Case {
        path: &'static str,
        body: Value,
        endpoint: Endpoint,
        parts: &'static [&'static str],
        pretokenized: u64,
        stream: bool,
    }
    let cases = [
        Case {
            path: "/v1/chat/completions",
            body: json!({"model": "m", "stream": true, "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:x"}},
                    {"type": "input_text", "text": "here"}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c", "type": "function",
                     "function": {"name": "f", "arguments": "{\"q\":1}"}}]},
                {"role": "tool", "tool_call_id": "c", "content": "result"}],
                "tools": [{"type": "function", "function": {"name": "f", "description": "finds"}}]}),
            endpoint: Endpoint::OpenAiChat,
            parts: &["sys", "look", "here", "{\"q\":1}", "result", "finds"],
            pretokenized: 0,
            stream: true,
        },
        Case {
            path: "/chat/completions",
            body: json!({"messages": [{"role": "user", "content": "hi"}], "stream": false}),
            endpoint: Endpoint::OpenAiChat,
            parts: &["hi"],
            pretokenized: 0,
            stream: false,
        },
        Case {
            path: "/v1/completions",
            body: json!({"prompt": "once upon", "suffix": "the end"}),
            endpoint: Endpoint::OpenAiCompletions,
            parts: &["once upon", "the end"],
            pretokenized: 0,
            stream: false,
        },
        Case {
            path: "/v1/completions",
            body: json!({"prompt": ["a", "b", "c"], "stream": true}),
            endpoint: Endpoint::OpenAiCompletions,
            parts: &["a", "b", "c"],
            pretokenized: 0,
            stream: true,
        },
        Case {
            path: "/v1/completions",
            body: json!({"prompt": [1, 2, 3, 4]}),
            endpoint: Endpoint::OpenAiCompletions,
            parts: &[],
            pretokenized: 4,
            stream: false,
        },
        Case {
            path: "/completions",
            body: json!({"prompt": [[1, 2], [3, 4, 5]]}),
            endpoint: Endpoint::OpenAiCompletions,
            parts: &[],
            pretokenized: 5,
            stream: false,
        },
        Case {
            path: "/v1/responses",
            body: json!({"instructions": "be brief", "input": [
                {"role": "user", "content": "q1"},
                {"role": "user", "content": [{"type": "input_text", "text": "q2"},
                                              {"type": "input_image", "image_url": "x"}]},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "out"}],
                "tools": [{"type": "function", "name": "f", "description": "desc"}]}),
            endpoint: Endpoint::OpenAiResponses,
            parts: &["be brief", "q1", "q2", "{}", "out", "desc"],
            pretokenized: 0,
            stream: false,
        },
        Case {
            path: "/v1/responses",
            body: json!({"input": "just text", "stream": true}),
            endpoint: Endpoint::OpenAiResponses,
            parts: &["just text"],
            pretokenized: 0,
            stream: true,
        },
        Case {
            path: "/v1/messages",
            body: json!({"model": "claude", "system": [
                    {"type": "text", "text": "sys1"},
                    {"type": "text", "text": "sys2", "cache_control": {"type": "ephemeral"}}],
                "messages": [
                    {"role": "user", "content": "u1"},
                    {"role": "assistant", "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "s"},
                        {"type": "text", "text": "a1"},
                        {"type": "tool_use", "id": "t", "name": "f", "input": {"k": "v"}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "t", "content": "r-string"},
                        {"type": "tool_result", "tool_use_id": "t", "content": [
                            {"type": "text", "text": "r-block"},
                            {"type": "image", "source": {}}]},
                        {"type": "image", "source": {}},
                        {"type": "text", "text": "u2"}]}],
                "tools": [{"name": "f", "description": "tool desc", "input_schema": {}}]}),
            endpoint: Endpoint::AnthropicMessages,
            parts: &[
                "sys1",
                "sys2",
                "u1",
                "hmm",
                "a1",
                "{\"k\":\"v\"}",
                "r-string",
                "r-block",
                "u2",
                "tool desc",
            ],
            pretokenized: 0,
            stream: false,
        },
        Case {
            path: "/v1/messages",
            body: json!({"system": "s", "messages": [{"role": "user", "content": "x"}], "stream": true}),
            endpoint: Endpoint::AnthropicMessages,
            parts: &["s", "x"],
            pretokenized: 0,
            stream: true,
        },
        Case {
            path: "/generate",
            body: json!({"text": "sg", "sampling_params": {}}),
            endpoint: Endpoint::SglangGenerate,
            parts: &["sg"],
            pretokenized: 0,
            stream: false,
        },
        Case {
            path: "/generate",
            body: json!({"text": ["b1", "b2"], "stream": true}),
            endpoint: Endpoint::SglangGenerate,
            parts: &["b1", "b2"],
            pretokenized: 0,
            stream: true,
        },
        Case {
            path: "/generate",
            body: json!({"input_ids": [[1, 2, 3], [4]]}),
            endpoint: Endpoint::SglangGenerate,
            parts: &[],
            pretokenized: 4,
            stream: false,
        },
        Case {
            path: "/generate",
            body: json!({"input_ids": [7, 8]}),
            endpoint: Endpoint::SglangGenerate,
            parts: &[],
            pretokenized: 2,
            stream: false,
        },
        Case {
            path: "/generate",
            body: json!({}),
            endpoint: Endpoint::SglangGenerate,
            parts: &[],
            pretokenized: 0,
            stream: false,
        },
        Case {
            path: "/generate",
            body: json!({"inputs": "tgi prompt", "parameters": {"max_new_tokens": 5}}),
            endpoint: Endpoint::TgiGenerate,
            parts: &["tgi prompt"],
            pretokenized: 0,
            stream: false,
        },
        Case {
            path: "/generate_stream",
            body: json!({"inputs": "p"}),
            endpoint: Endpoint::TgiGenerateStream,
            parts: &["p"],
            pretokenized: 0,
            stream: true,
        },
        Case {
            path: "/generate_stream",
            body: json!({"inputs": "p", "stream": false}),
            endpoint: Endpoint::TgiGenerateStream,
            parts: &["p"],
            pretokenized: 0,
            stream: true,
        },
        Case {
            path: "/api/chat",
            body: json!({"model": "llama3", "system": "top", "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "hello", "images": ["b64"]},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "f", "arguments": {"city": "Oslo"}}}]}]}),
            endpoint: Endpoint::OllamaChat,
            parts: &["top", "sys", "hello", "", "{\"city\":\"Oslo\"}"],
            pretokenized: 0,
            stream: true,
        },
        Case {
            path: "/api/chat",
            body: json!({"messages": [], "stream": false}),
            endpoint: Endpoint::OllamaChat,
            parts: &[],
            pretokenized: 0,
            stream: false,
        },
        Case {
            path: "/api/generate",
            body: json!({"model": "m", "system": "s", "prompt": "p", "stream": "nope"}),
            endpoint: Endpoint::OllamaGenerate,
            parts: &["s", "p"],
            pretokenized: 0,
            stream: true,
        },
        Case {
            path: "/client/v4/accounts/acc/ai/run/@cf/meta/llama-3-8b-instruct",
            body: json!({"prompt": "cf prompt"}),
            endpoint: Endpoint::CloudflareRun,
            parts: &["cf prompt"],
            pretokenized: 0,
            stream: false,
        },
        Case {
            path: "/ai/run/@cf/meta/llama-3-8b-instruct",
            body: json!({"messages": [{"role": "system", "content": "s"},
                                      {"role": "user", "content": "u"}], "stream": true}),
            endpoint: Endpoint::CloudflareRun,
            parts: &["s", "u"],
            pretokenized: 0,
            stream: true,
        },
    ];
    for c in cases {
        let got = parse(c.path, &c.body.to_string());
        let want = ParsedRequest {
            endpoint: c.endpoint,
            prompt: Prompt {
                parts: c.parts.iter().map(|s| s.to_string()).collect(),
                pretokenized: c.pretokenized,
            },
            stream: c.stream,
            logprobs: false,
            model: c
                .body
                .get("model")
                .and_then(Value::as_str)
                .map(str::to_owned),
        };
        assert_eq!(got, want, "{} {}", c.path, c.body);
    }
}

#[test]
fn prompt_text_and_emptiness() {
    let p = parse("/v1/completions", r#"{"prompt": ["a", "b"]}"#).prompt;
    assert_eq!(p.text(), "a\nb");
    assert!(!p.is_empty());
    assert!(parse("/v1/chat/completions", r#"{"messages": []}"#)
        .prompt
        .is_empty());
    assert!(!parse("/generate", r#"{"input_ids": [1]}"#)
        .prompt
        .is_empty());
}

#[test]
fn model_only_when_string() {
    assert_eq!(parse("/v1/messages", r#"{"model": 5}"#).model, None);
    assert_eq!(
        parse("/v1/messages", r#"{"model": "x"}"#).model.as_deref(),
        Some("x")
    );
}

#[test]
fn request_bom_and_invalid_utf8_are_tolerated() {
    let mut body = b"\xEF\xBB\xBF".to_vec();
    body.extend_from_slice(b"{\"prompt\": \"a\xFFb\"}");
    let r = parse_request(Route::Known(Endpoint::OpenAiCompletions), &body).unwrap();
    assert_eq!(r.prompt.parts, vec!["a\u{FFFD}b"]);
}

#[test]
fn request_errors() {
    let route = Route::Known(Endpoint::OpenAiChat);
    for body in ["", "not json", "{\"messages\": [", "{} {}", "\u{0}"] {
        assert!(
            matches!(
                parse_request(route, body.as_bytes()),
                Err(RequestError::Json(_))
            ),
            "{body:?}"
        );
    }
    for body in ["5", "\"str\"", "null", "[]", "[{\"messages\": []}]", "true"] {
        assert!(
            matches!(
                parse_request(route, body.as_bytes()),
                Err(RequestError::Shape(_))
            ),
            "{body:?}"
        );
    }
}

#[test]
fn deeply_nested_request_is_an_error_not_an_overflow() {
    let deep = "[".repeat(10_000) + &"]".repeat(10_000);
    let body = format!("{{\"messages\": {deep}}}");
    for route in [Route::Generate, Route::Known(Endpoint::AnthropicMessages)] {
        assert!(matches!(
            parse_request(route, body.as_bytes()),
            Err(RequestError::Json(_))
        ));
        assert!(parse_request(route, deep.as_bytes()).is_err());
    }
}

#[test]
fn wrong_types_everywhere_are_best_effort() {
    let bodies = [
        r#"{"messages": 5}"#,
        r#"{"messages": "str"}"#,
        r#"{"messages": [5, null, "x", [], {"content": {"x": 1}}]}"#,
        r#"{"messages": [{"content": [5, null, {"text": 7}, {"type": "text"}, "bare"]}]}"#,
        r#"{"messages": [{"content": "ok", "tool_calls": 5}]}"#,
        r#"{"messages": [{"tool_calls": [5, {"function": 5}, {"function": {"arguments": null}}]}]}"#,
        r#"{"tools": 5, "functions": [5, {"function": 5}]}"#,
        r#"{"prompt": {"x": 1}, "suffix": 5}"#,
        r#"{"prompt": [null, true, {"a": 1}, [["x"]], "s"]}"#,
        r#"{"input": 5, "instructions": []}"#,
        r#"{"input": [5, null, {"content": 5}, {"type": "function_call", "arguments": {"a": 1}}]}"#,
        r#"{"system": {"x": 1}, "messages": [{"content": [{"type": "tool_result", "content": 5}]}]}"#,
        r#"{"system": [5, {"text": null}], "messages": [{"content": [{"type": "tool_use"}]}]}"#,
        r#"{"text": 5, "input_ids": "abc"}"#,
        r#"{"text": [1, "x"], "input_ids": [[1, "a"], 2, null]}"#,
        r#"{"inputs": 5}"#,
        r#"{"inputs": {"x": 1}}"#,
        r#"{"stream": "yes", "model": ["m"]}"#,
    ];
    for path in [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/generate",
        "/generate_stream",
        "/api/chat",
        "/api/generate",
        "/ai/run/@cf/x",
    ] {
        for body in bodies {
            let r = parse(path, body);
            assert_eq!(r.model, None);
        }
    }
    // Best effort still finds what is there.
    let r = parse("/v1/chat/completions", bodies[3]);
    assert_eq!(r.prompt.parts, vec!["bare"]);
    let r = parse("/v1/completions", bodies[8]);
    assert_eq!(
        (r.prompt.parts, r.prompt.pretokenized),
        (vec!["s".to_owned()], 0)
    );
}

// === response decoding, per family ===

#[test]
fn openai_chat_stream_every_split() {
    let body = concat!(
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello, 世界\"},\"finish_reason\":null}]}\n\n",
        ": keep-alive\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" 👋🏽 ok\"},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5,\"total_tokens\":17,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n",
        "data: [DONE]\n\n",
    );
    let want = Output {
        text: "Hello, 世界 👋🏽 ok".into(),
        usage: usage(Some(12), Some(8), Some(5), Some("stop")),
        events: 5,
        ..Output::default()
    };
    for variant in [
        body.to_owned(),
        body.replace('\n', "\r\n"),
        body.replace('\n', "\r"),
    ] {
        let out = decode_every_split(Endpoint::OpenAiChat, BodyFormat::Sse, variant.as_bytes());
        assert_eq!(out, want);
    }
}

#[test]
fn openai_chat_stream_reasoning_and_multiline_data() {
    let body = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"think \"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"more\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\n",
        "data: \"delta\":{\"content\":\"answer\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\"\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
    );
    let out = decode_every_split(Endpoint::OpenAiChat, BodyFormat::Sse, body.as_bytes());
    assert_eq!(out.text, "think more\nanswer\n{\"a\":1}");
    assert_eq!(out.usage.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(out.events, 5);
}

#[test]
fn openai_chat_json() {
    let body = json!({"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "reasoning_content": "why", "content": "first"}, "finish_reason": "stop"},
        {"index": 1, "message": {"role": "assistant", "content": "second"}, "finish_reason": "length"},
        {"index": 2, "message": {"role": "assistant", "content": null}, "finish_reason": null}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "prompt_tokens_details": null}});
    let out = decode(
        Endpoint::OpenAiChat,
        BodyFormat::Json,
        body.to_string().as_bytes(),
    );
    assert_eq!(
        out,
        Output {
            text: "why\nfirst\nsecond".into(),
            usage: usage(Some(3), None, Some(4), Some("length")),
            events: 1,
            ..Output::default()
        }
    );
}

#[test]
fn openai_completions_stream_and_json() {
    let body = sse(&[
        json!({"choices": [{"index": 0, "text": "Once", "finish_reason": null}]}),
        json!({"choices": [{"index": 0, "text": " upon", "finish_reason": "length"}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 2}}),
    ]);
    let out = decode_every_split(
        Endpoint::OpenAiCompletions,
        BodyFormat::Sse,
        body.as_bytes(),
    );
    assert_eq!(out.text, "Once upon");
    assert_eq!(out.usage, usage(Some(2), None, Some(2), Some("length")));

    let body = json!({"choices": [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}],
                      "usage": {"prompt_tokens": 1, "completion_tokens": 2}});
    let out = decode(
        Endpoint::OpenAiCompletions,
        BodyFormat::Json,
        body.to_string().as_bytes(),
    );
    assert_eq!(out.text, "a\nb");
    assert_eq!(out.usage, usage(Some(1), None, Some(2), None));
}

#[test]
fn openai_responses_stream_every_split() {
    let body = concat!(
        "event: response.created\n",
        "data: {\"type\":\"response.created\",\"response\":{\"id\":\"r1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n",
        "event: response.output_text.delta\n",
        "data: {\"type\":\"response.output_text.delta\",\"item_id\":\"m1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Héllo\"}\n\n",
        "event: response.output_text.delta\n",
        "data: {\"type\":\"response.output_text.delta\",\"item_id\":\"m1\",\"output_index\":0,\"content_index\":0,\"delta\":\" 🌍\"}\n\n",
        "event: response.output_text.done\n",
        "data: {\"type\":\"response.output_text.done\",\"output_index\":0,\"content_index\":0,\"text\":\"Héllo 🌍\"}\n\n",
        "event: response.completed\n",
        "data: {\"type\":\"response.completed\",\"response\":{\"id\":\"r1\",\"object\":\"response\",\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"Héllo 🌍\"}]}],\"usage\":{\"input_tokens\":9,\"output_tokens\":3,\"input_tokens_details\":{\"cached_tokens\":4}}}}\n\n",
    );
    let out = decode_every_split(Endpoint::OpenAiResponses, BodyFormat::Sse, body.as_bytes());
    assert_eq!(
        out,
        Output {
            text: "Héllo 🌍".into(),
            usage: usage(Some(9), Some(4), Some(3), Some("completed")),
            events: 5,
            ..Output::default()
        }
    );
}

#[test]
fn openai_responses_json_and_incomplete() {
    let body = json!({"id": "r", "object": "response", "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"}, "error": null,
        "output": [
            {"type": "reasoning", "summary": []},
            {"type": "message", "content": [
                {"type": "output_text", "text": "one"},
                {"type": "refusal", "refusal": "no"},
                {"type": "output_text", "text": "two"}]}],
        "usage": {"input_tokens": 5, "output_tokens": 6}});
    let out = decode(
        Endpoint::OpenAiResponses,
        BodyFormat::Json,
        body.to_string().as_bytes(),
    );
    assert_eq!(out.text, "one\ntwo");
    assert_eq!(
        out.usage,
        usage(Some(5), None, Some(6), Some("max_output_tokens"))
    );
    assert!(!out.upstream_error, "`error: null` is not an error");

    let failed = sse(&[
        json!({"type": "response.failed", "response": {"status": "failed",
        "error": {"code": "server_error", "message": "boom"}}}),
    ]);
    let out = decode(
        Endpoint::OpenAiResponses,
        BodyFormat::Sse,
        failed.as_bytes(),
    );
    assert!(out.upstream_error);
    assert_eq!(out.usage.finish_reason.as_deref(), Some("failed"));
}

#[test]
fn anthropic_stream_every_split() {
    let body = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude\",\"stop_reason\":null,\"usage\":{\"input_tokens\":10,\"cache_creation_input_tokens\":20,\"cache_read_input_tokens\":30,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Let me think…\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"sig\"}}\n\n",
        "event: content_block_stop\n",
        "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: ping\n",
        "data: {\"type\": \"ping\"}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Bonjour \"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"日本語 🎉\"}}\n\n",
        "event: content_block_stop\n",
        "data: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n",
        "event: message_stop\n",
        "data: {\"type\":\"message_stop\"}\n\n",
    );
    let want = Output {
        text: "Let me think…\nBonjour 日本語 🎉".into(),
        usage: usage(Some(60), Some(30), Some(15), Some("end_turn")),
        events: 12,
        ..Output::default()
    };
    for variant in [body.to_owned(), body.replace('\n', "\r\n")] {
        let out = decode_every_split(
            Endpoint::AnthropicMessages,
            BodyFormat::Sse,
            variant.as_bytes(),
        );
        assert_eq!(out, want);
    }
}

#[test]
fn anthropic_json_and_usage_sums() {
    let body = json!({"id": "m", "type": "message", "role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "text", "text": "answer"},
            {"type": "tool_use", "id": "t", "name": "f", "input": {"q": 1}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 7, "cache_read_input_tokens": 100, "output_tokens": 9}});
    let out = decode(
        Endpoint::AnthropicMessages,
        BodyFormat::Json,
        body.to_string().as_bytes(),
    );
    assert_eq!(out.text, "hmm\nanswer\n{\"q\":1}");
    assert_eq!(
        out.usage,
        usage(Some(107), Some(100), Some(9), Some("tool_use"))
    );

    // message_delta may restate (some of) the prompt counts; the sum keeps
    // every count ever reported.
    let body = sse(&[
        json!({"type": "message_start", "message": {"type": "message", "content": [],
            "usage": {"input_tokens": 5, "cache_creation_input_tokens": 6, "output_tokens": 1}}}),
        json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
            "usage": {"input_tokens": 8, "output_tokens": 20}}),
    ]);
    let out = decode(
        Endpoint::AnthropicMessages,
        BodyFormat::Sse,
        body.as_bytes(),
    );
    assert_eq!(
        out.usage,
        usage(Some(14), None, Some(20), Some("max_tokens"))
    );

    let body = "event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\n\n";
    let out = decode(
        Endpoint::AnthropicMessages,
        BodyFormat::Sse,
        body.as_bytes(),
    );
    assert!(out.upstream_error);
    assert_eq!(out.malformed, 0);
}

#[test]
fn sglang_cumulative_stream_every_split() {
    let body = sse(&[
        json!({"text": "床前", "meta_info": {"prompt_tokens": 7, "completion_tokens": 1, "cached_tokens": 0, "finish_reason": null}}),
        json!({"text": "床前明月光", "meta_info": {"prompt_tokens": 7, "completion_tokens": 2, "cached_tokens": 0, "finish_reason": null}}),
        json!({"text": "床前明月光 🌙", "meta_info": {"prompt_tokens": 7, "completion_tokens": 3, "cached_tokens": 2, "finish_reason": {"type": "length", "length": 3}}}),
    ]);
    let out = decode_every_split(Endpoint::SglangGenerate, BodyFormat::Sse, body.as_bytes());
    assert_eq!(
        out,
        Output {
            text: "床前明月光 🌙".into(),
            usage: usage(Some(7), Some(2), Some(3), Some("length")),
            events: 3,
            ..Output::default()
        }
    );
}

#[test]
fn sglang_delta_mode_batches_and_json() {
    // Delta mode (stream_output): pieces do not repeat what came before.
    let body = sse(&[
        json!({"text": "ab"}),
        json!({"text": "cd"}),
        json!({"text": "abcdef"}),
    ]);
    let out = decode(Endpoint::SglangGenerate, BodyFormat::Sse, body.as_bytes());
    assert_eq!(out.text, "abcdef");

    // A streamed batch: cumulative per index, counts summed over indexes.
    let m = |c: u64| json!({"prompt_tokens": 2, "completion_tokens": c, "finish_reason": null});
    let body = sse(&[
        json!({"index": 0, "text": "x", "meta_info": m(1)}),
        json!({"index": 0, "text": "xy", "meta_info": m(2)}),
        json!({"index": 1, "text": "p", "meta_info": m(1)}),
        json!({"index": 1, "text": "pq", "meta_info": m(2)}),
        json!({"index": 0, "text": "xyz", "meta_info": {"completion_tokens": 3, "finish_reason": {"type": "stop"}}}),
    ]);
    let out = decode(Endpoint::SglangGenerate, BodyFormat::Sse, body.as_bytes());
    assert_eq!(out.text, "xy\npq\nz");
    assert_eq!(out.usage, usage(Some(4), None, Some(5), Some("stop")));

    let one = json!({"text": "solo", "meta_info": {"prompt_tokens": 3, "completion_tokens": 2,
        "cached_tokens": 1, "finish_reason": {"type": "stop", "matched": 2}}});
    let out = decode(
        Endpoint::SglangGenerate,
        BodyFormat::Json,
        one.to_string().as_bytes(),
    );
    assert_eq!(out.text, "solo");
    assert_eq!(out.usage, usage(Some(3), Some(1), Some(2), Some("stop")));

    let batch = json!([
        {"text": "a", "meta_info": {"prompt_tokens": 3, "completion_tokens": 2, "cached_tokens": 0, "finish_reason": {"type": "stop"}}},
        {"text": "b", "meta_info": {"prompt_tokens": 4, "completion_tokens": 5, "cached_tokens": 1, "finish_reason": {"type": "abort"}}}]);
    let out = decode(
        Endpoint::SglangGenerate,
        BodyFormat::Json,
        batch.to_string().as_bytes(),
    );
    assert_eq!(out.text, "a\nb");
    assert_eq!(out.usage, usage(Some(7), Some(1), Some(7), Some("abort")));
}

#[test]
fn tgi_stream_every_split_skips_special_tokens() {
    let body = concat!(
        "data:{\"index\":1,\"token\":{\"id\":1,\"text\":\"Hi\",\"logprob\":-0.1,\"special\":false},\"generated_text\":null,\"details\":null}\n\n",
        "data:{\"index\":2,\"token\":{\"id\":2,\"text\":\" ça va\",\"logprob\":-0.2,\"special\":false},\"generated_text\":null,\"details\":null}\n\n",
        "data:{\"index\":3,\"token\":{\"id\":3,\"text\":\"</s>\",\"logprob\":-0.3,\"special\":true},\"generated_text\":\"Hi ça va\",\"details\":{\"finish_reason\":\"eos_token\",\"generated_tokens\":3,\"seed\":null}}\n\n",
    );
    let out = decode_every_split(
        Endpoint::TgiGenerateStream,
        BodyFormat::Sse,
        body.as_bytes(),
    );
    assert_eq!(
        out,
        Output {
            text: "Hi ça va".into(),
            usage: usage(None, None, Some(3), Some("eos_token")),
            events: 3,
            ..Output::default()
        }
    );
    let err = "data:{\"error\":\"Input validation error\",\"error_type\":\"validation\"}\n\n";
    let out = decode(Endpoint::TgiGenerateStream, BodyFormat::Sse, err.as_bytes());
    assert!(out.upstream_error);
}

#[test]
fn tgi_json_and_headers() {
    let body = json!({"generated_text": "out", "details": {"finish_reason": "length",
        "generated_tokens": 4, "prefill": [{"id": 1}, {"id": 2}], "tokens": []}});
    let mut out = decode(
        Endpoint::TgiGenerate,
        BodyFormat::Json,
        body.to_string().as_bytes(),
    );
    assert_eq!(out.text, "out");
    assert_eq!(out.usage, usage(Some(2), None, Some(4), Some("length")));

    let mut headers = http::HeaderMap::new();
    headers.insert("x-prompt-tokens", "11".parse().unwrap());
    headers.insert("x-generated-tokens", "99".parse().unwrap());
    usage_from_headers(Endpoint::TgiGenerate, &headers, &mut out.usage);
    assert_eq!(
        out.usage,
        usage(Some(2), None, Some(4), Some("length")),
        "never overwrites"
    );

    let body = json!([{"generated_text": "a", "details": {"generated_tokens": 1, "prefill": []}},
                      {"generated_text": "b", "details": {"generated_tokens": 2, "finish_reason": "stop"}}]);
    let mut out = decode(
        Endpoint::TgiGenerate,
        BodyFormat::Json,
        body.to_string().as_bytes(),
    );
    assert_eq!(out.text, "a\nb");
    assert_eq!(out.usage, usage(None, None, Some(3), Some("stop")));
    usage_from_headers(Endpoint::TgiGenerate, &headers, &mut out.usage);
    assert_eq!(out.usage, usage(Some(11), None, Some(3), Some("stop")));

    let mut u = Usage::default();
    let mut bad = http::HeaderMap::new();
    bad.insert("x-prompt-tokens", "lots".parse().unwrap());
    bad.insert("x-generated-tokens", " 5 ".parse().unwrap());
    usage_from_headers(Endpoint::TgiGenerateStream, &bad, &mut u);
    assert_eq!(u, usage(None, None, Some(5), None));
    let mut u = Usage::default();
    usage_from_headers(Endpoint::OpenAiChat, &headers, &mut u);
    assert_eq!(u, Usage::default(), "only TGI reports usage in headers");
}

#[test]
fn ollama_ndjson_every_split() {
    let body = concat!(
        "{\"model\":\"llama3\",\"created_at\":\"t\",\"message\":{\"role\":\"assistant\",\"content\":\"Γειά\"},\"done\":false}\n",
        "{\"model\":\"llama3\",\"created_at\":\"t\",\"message\":{\"role\":\"assistant\",\"content\":\" σου 🙂\"},\"done\":false}\n",
        "\n",
        "{\"model\":\"llama3\",\"created_at\":\"t\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\",\"total_duration\":1,\"prompt_eval_count\":26,\"eval_count\":4}",
    );
    let want = Output {
        text: "Γειά σου 🙂".into(),
        usage: usage(Some(26), None, Some(4), Some("stop")),
        events: 3,
        ..Output::default()
    };
    for variant in [body.to_owned(), body.replace('\n', "\r\n")] {
        assert_eq!(
            decode_every_split(Endpoint::OllamaChat, BodyFormat::Ndjson, variant.as_bytes()),
            want
        );
    }
}

#[test]
fn ollama_generate_thinking_json_and_errors() {
    let body = concat!(
        "{\"thinking\":\"hm\",\"response\":\"\",\"done\":false}\n",
        "{\"response\":\"yes\",\"done\":false}\n",
        "{\"response\":\"\",\"done\":true,\"done_reason\":\"length\",\"prompt_eval_count\":3,\"eval_count\":2}\n",
    );
    let out = decode(
        Endpoint::OllamaGenerate,
        BodyFormat::Ndjson,
        body.as_bytes(),
    );
    assert_eq!(out.text, "hm\nyes");
    assert_eq!(out.usage, usage(Some(3), None, Some(2), Some("length")));

    let one = json!({"message": {"role": "assistant", "content": "whole", "thinking": "t"},
        "done": true, "prompt_eval_count": 1, "eval_count": 2, "done_reason": "stop"});
    let out = decode(
        Endpoint::OllamaChat,
        BodyFormat::Json,
        one.to_string().as_bytes(),
    );
    assert_eq!(out.text, "t\nwhole");
    assert_eq!(out.usage, usage(Some(1), None, Some(2), Some("stop")));

    let out = decode(
        Endpoint::OllamaChat,
        BodyFormat::Ndjson,
        b"{\"error\":\"model not found\"}\n",
    );
    assert!(out.upstream_error);
}

#[test]
fn cloudflare_stream_every_split_and_json() {
    let body = concat!(
        "data: {\"response\":\"Hola\",\"p\":\"abc\"}\n\n",
        "data: {\"response\":\" 😀 señor\",\"p\":\"ab\"}\n\n",
        "data: {\"response\":\"\",\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n",
        "data: [DONE]\n\n",
    );
    let out = decode_every_split(Endpoint::CloudflareRun, BodyFormat::Sse, body.as_bytes());
    assert_eq!(
        out,
        Output {
            text: "Hola 😀 señor".into(),
            usage: usage(Some(5), None, Some(2), None),
            events: 3,
            ..Output::default()
        }
    );

    let body = json!({"result": {"response": "full", "usage": {"prompt_tokens": 1, "completion_tokens": 2}},
        "success": true, "errors": [], "messages": []});
    let out = decode(
        Endpoint::CloudflareRun,
        BodyFormat::Json,
        body.to_string().as_bytes(),
    );
    assert_eq!(out.text, "full");
    assert_eq!(out.usage, usage(Some(1), None, Some(2), None));
    assert!(!out.upstream_error);

    for bad in [
        json!({"result": null, "success": false, "errors": [{"code": 5006, "message": "bad"}]}),
        json!({"result": {}, "errors": [{"code": 1}]}),
    ] {
        let out = decode(
            Endpoint::CloudflareRun,
            BodyFormat::Json,
            bad.to_string().as_bytes(),
        );
        assert!(out.upstream_error, "{bad}");
    }
}

#[test]
fn top_level_errors_for_every_family() {
    let bodies = [
        json!({"error": {"message": "x", "type": "invalid_request_error"}}),
        json!({"error": "plain string"}),
        json!({"object": "error", "message": "vllm", "code": 400}),
        json!({"type": "error", "error": {"type": "api_error"}}),
    ];
    for ep in all_endpoints() {
        for b in &bodies {
            let out = decode(ep, BodyFormat::Json, b.to_string().as_bytes());
            assert!(out.upstream_error, "{ep:?} {b}");
            assert_eq!((out.events, out.malformed), (1, 0));
            let out = decode(ep, BodyFormat::Sse, sse(std::slice::from_ref(b)).as_bytes());
            assert!(out.upstream_error, "{ep:?} {b} as SSE");
        }
        let fine = decode(ep, BodyFormat::Json, b"{\"error\": null}");
        assert!(!fine.upstream_error);
    }
}

// === lenient framing ===

#[test]
fn final_event_without_blank_line_is_dispatched() {
    let body = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}";
    let out = decode_every_split(Endpoint::OpenAiChat, BodyFormat::Sse, body.as_bytes());
    assert_eq!((out.text.as_str(), out.events), ("ab", 2));
}

#[test]
fn mislabelled_bodies_are_still_read() {
    // SSE sent as application/json.
    let body = sse(&[
        json!({"choices": [{"delta": {"content": "a"}}]}),
        json!({"choices": [{"delta": {"content": "b"}}]}),
    ]);
    let out = decode(Endpoint::OpenAiChat, BodyFormat::Json, body.as_bytes());
    assert_eq!((out.text.as_str(), out.events, out.malformed), ("ab", 2, 0));

    // NDJSON sent as application/json to a non-streaming Ollama request.
    let body = "{\"response\":\"a\"}\n{\"response\":\"b\",\"done\":true,\"eval_count\":2}\n";
    let out = decode(Endpoint::OllamaGenerate, BodyFormat::Json, body.as_bytes());
    assert_eq!((out.text.as_str(), out.events, out.malformed), ("ab", 2, 0));
    assert_eq!(out.usage.completion_tokens, Some(2));

    // A JSON error answered to a streaming request.
    let body = "{\"error\": {\"message\": \"rate limited\"}}\n";
    for fmt in [BodyFormat::Sse, BodyFormat::Ndjson] {
        let out = decode_every_split(Endpoint::OllamaChat, fmt, body.as_bytes());
        assert!(out.upstream_error, "{fmt:?}");
        assert_eq!((out.events, out.malformed), (1, 0), "{fmt:?}");
    }
    // A plain JSON body answered to a streaming chat request.
    let body = json!({"choices": [{"message": {"content": "whole"}}]}).to_string();
    let out = decode(Endpoint::OpenAiChat, BodyFormat::Sse, body.as_bytes());
    assert_eq!((out.text.as_str(), out.events), ("whole", 1));
    // Pretty-printed, it cannot be read line by line, but is not silent.
    let body = "{\n  \"error\": {\n    \"message\": \"rate limited\"\n  }\n}\n";
    for fmt in [BodyFormat::Sse, BodyFormat::Ndjson] {
        let out = decode_every_split(Endpoint::OllamaChat, fmt, body.as_bytes());
        assert!(out.malformed >= 1, "{fmt:?}");
    }
}

#[test]
fn done_mid_stream_and_keepalives_are_skipped() {
    let body = concat!(
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
        "data: [DONE]\n\n",
        "data:\n\n",
        ":\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
    );
    let out = decode(Endpoint::OpenAiChat, BodyFormat::Sse, body.as_bytes());
    assert_eq!((out.text.as_str(), out.events, out.malformed), ("ab", 2, 0));
}

#[test]
fn empty_bodies() {
    for ep in all_endpoints() {
        for fmt in [BodyFormat::Json, BodyFormat::Sse, BodyFormat::Ndjson] {
            let out = decode(ep, fmt, b"");
            assert_eq!(out, Output::default(), "{ep:?} {fmt:?}");
            let out = decode(ep, fmt, b" \n\r\n ");
            assert_eq!(out, Output::default(), "{ep:?} {fmt:?} whitespace");
        }
    }
}

#[test]
fn finish_twice_adds_nothing() {
    let mut d = ResponseDecoder::new(Endpoint::OllamaChat, BodyFormat::Json, MAX);
    let mut out = Output::default();
    d.push(b"{\"message\":{\"content\":\"x\"}}", &mut out);
    d.finish(&mut out);
    let once = out.clone();
    d.finish(&mut out);
    assert_eq!(out, once);
}

// === hostile input ===

#[test]
fn garbage_and_invalid_utf8() {
    let body = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\xFF\xFEb\"}}]}\n\ndata: \xC3\n\ndata: {nope\n\n";
    let out = decode_every_split(Endpoint::OpenAiChat, BodyFormat::Sse, body);
    assert_eq!(out.text, "a\u{FFFD}\u{FFFD}b");
    assert_eq!((out.events, out.malformed), (3, 2));

    let out = decode(
        Endpoint::OllamaChat,
        BodyFormat::Ndjson,
        b"\xFF\xFF\n{\"message\":{\"content\":\"ok\"}}\n\x00\x01",
    );
    assert_eq!((out.text.as_str(), out.events, out.malformed), ("ok", 3, 2));

    let out = decode(
        Endpoint::AnthropicMessages,
        BodyFormat::Json,
        b"\xFF\xFE\x00garbage",
    );
    assert_eq!((out.events, out.malformed), (1, 1));
}

#[test]
fn truncated_json_body_is_malformed() {
    let body = br#"{"choices": [{"message": {"content": "cut of"#;
    for ep in all_endpoints() {
        let out = decode(ep, BodyFormat::Json, body);
        assert_eq!(
            (out.events, out.malformed, out.text.as_str()),
            (1, 1, ""),
            "{ep:?}"
        );
    }
}

#[test]
fn json_values_that_are_not_objects() {
    for ep in all_endpoints() {
        for body in [
            "5",
            "\"str\"",
            "null",
            "true",
            "[]",
            "[1, \"x\", null]",
            "[[[]]]",
        ] {
            let out = decode(ep, BodyFormat::Json, body.as_bytes());
            assert_eq!((out.events, out.malformed), (1, 0), "{ep:?} {body}");
            assert_eq!(out.text, "");
        }
    }
}

#[test]
fn wrong_types_in_response_fields() {
    let values = [
        json!({"choices": 5, "usage": "x"}),
        json!({"choices": [5, null, {"delta": 5, "message": [], "text": 7, "finish_reason": 9}]}),
        json!({"choices": [{"delta": {"content": {"x": 1}, "tool_calls": [5, {"function": 5}]}}]}),
        json!({"usage": {"prompt_tokens": "12", "completion_tokens": -1, "prompt_tokens_details": 5}}),
        json!({"type": "response.output_text.delta", "delta": 5, "output_index": "x"}),
        json!({"type": "response.completed", "response": 5}),
        json!({"object": "response", "output": [5, {"type": "message", "content": 5}]}),
        json!({"type": "message", "content": "str", "usage": 5}),
        json!({"type": "content_block_delta", "delta": {"type": "text_delta", "text": 5}}),
        json!({"type": "message_delta", "delta": 5, "usage": {"output_tokens": 1.5}}),
        json!({"text": {"x": 1}, "meta_info": {"finish_reason": 5, "prompt_tokens": null}}),
        json!({"index": "x", "text": 5, "meta_info": 5}),
        json!([5, {"text": 5, "meta_info": 5}, {"generated_text": 5, "details": 5}]),
        json!({"token": 5, "details": {"prefill": 5, "generated_tokens": "x"}}),
        json!({"token": {"text": 5, "special": "yes"}}),
        json!({"message": 5, "response": 5, "eval_count": "x", "done_reason": 5}),
        json!({"message": {"content": 5, "tool_calls": 5}}),
        json!({"result": 5, "success": "no", "errors": 5}),
        json!({"result": {"response": {"x": 1}, "usage": 5}}),
    ];
    for ep in all_endpoints() {
        for v in &values {
            for fmt in [BodyFormat::Json, BodyFormat::Sse, BodyFormat::Ndjson] {
                let body = match fmt {
                    BodyFormat::Sse => sse(std::slice::from_ref(v)),
                    _ => v.to_string(),
                };
                let out = decode(ep, fmt, body.as_bytes());
                assert_eq!(out.malformed, 0, "{ep:?} {v}");
            }
        }
    }
    // Float counts are truncated; negative or string counts are ignored.
    let body = sse(&[json!({"type": "message_delta", "usage": {"output_tokens": 1.5}})]);
    let out = decode(
        Endpoint::AnthropicMessages,
        BodyFormat::Sse,
        body.as_bytes(),
    );
    assert_eq!(out.usage.completion_tokens, Some(1));
    let out = decode(
        Endpoint::OpenAiChat,
        BodyFormat::Json,
        values[3].to_string().as_bytes(),
    );
    assert_eq!(out.usage, Usage::default());
}

#[test]
fn endless_line_stays_within_the_cap() {
    const CAP: usize = 64 * 1024;
    let chunk = vec![b'x'; 4096];
    for fmt in [BodyFormat::Sse, BodyFormat::Ndjson, BodyFormat::Json] {
        for prefix in [&b"data: "[..], b"", b": comment "] {
            let mut d = ResponseDecoder::new(Endpoint::OpenAiChat, fmt, CAP);
            let mut out = Output::default();
            d.push(prefix, &mut out);
            for _ in 0..256 {
                d.push(&chunk, &mut out);
                assert!(d.buffered() <= CAP, "{fmt:?}: {} bytes held", d.buffered());
            }
            assert!(out.truncated, "{fmt:?}");
            // The stream recovers at the next line end.
            let tail: &[u8] = match fmt {
                BodyFormat::Sse => {
                    b"\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\n"
                }
                _ => b"\n{\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n",
            };
            d.push(tail, &mut out);
            d.finish(&mut out);
            assert!(out.truncated);
            if fmt != BodyFormat::Json {
                assert_eq!(out.text, "ok", "{fmt:?} {prefix:?}");
            }
        }
    }
}

#[test]
fn oversized_json_body_is_truncated_not_parsed() {
    let body = json!({"choices": [{"message": {"content": "x".repeat(100)}}]}).to_string();
    let out = decode_chunks(
        Endpoint::OpenAiChat,
        BodyFormat::Json,
        &[body.as_bytes()],
        50,
    );
    assert!(out.truncated);
    assert_eq!((out.events, out.malformed, out.text.as_str()), (1, 1, ""));
    let out = decode_chunks(
        Endpoint::OpenAiChat,
        BodyFormat::Json,
        &[body.as_bytes()],
        body.len(),
    );
    assert!(!out.truncated);
    assert_eq!(out.text.len(), 100);
}

#[test]
fn deeply_nested_response_does_not_overflow() {
    let deep = "[".repeat(10_000) + &"]".repeat(10_000);
    for ep in all_endpoints() {
        let out = decode(ep, BodyFormat::Json, deep.as_bytes());
        assert_eq!(out.malformed, 1);
        let out = decode(ep, BodyFormat::Sse, format!("data: {deep}\n\n").as_bytes());
        assert_eq!(out.malformed, 1);
        let out = decode(ep, BodyFormat::Ndjson, deep.as_bytes());
        assert_eq!(out.malformed, 1);
    }
}

/// A tiny xorshift64* generator, so the property tests need no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Random bodies built from fragments that matter to the framers and
/// parsers, plus raw random bytes.
fn random_body(rng: &mut Rng) -> Vec<u8> {
    const FRAGMENTS: &[&[u8]] = &[
        b"data: ", b"data:", b"event: error", b": c", b"\n", b"\r", b"\r\n", b"\n\n",
        b"[DONE]", b"{", b"}", b"[", b"]", b"\"", b":", b",", b"\"text\"", b"\"content\"",
        b"\"choices\":[{\"delta\":{\"content\":\"x\"}}]", b"{\"text\":\"ab\",\"index\":1}",
        b"{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"t\"}}",
        b"{\"token\":{\"text\":\"k\"}}", b"{\"message\":{\"content\":\"m\"}}", b"{\"error\":1}",
        "世".as_bytes(), "🎉".as_bytes(), b"\xF0\x9F", b"\xFF", b"\xEF\xBB\xBF", b"0", b"-1e999",
    ];
    let mut body = Vec::new();
    for _ in 0..rng.below(64) {
        if rng.below(4) == 0 {
            body.push(rng.next() as u8);
        } else {
            body.extend_from_slice(FRAGMENTS[rng.below(FRAGMENTS.len())]);
        }
    }
    body
}

#[test]
fn random_input_never_panics_and_ignores_chunking() {
    for seed in [1u64, 42, 0xDEAD_BEEF, 0x1234_5678_9ABC_DEF0] {
        let mut rng = Rng(seed);
        for _ in 0..150 {
            let body = random_body(&mut rng);
            let max = [16, 64, 4096][rng.below(3)];
            // Random split points.
            let mut cuts: Vec<usize> = (0..rng.below(6))
                .map(|_| rng.below(body.len() + 1))
                .collect();
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut last = 0;
            for c in cuts {
                chunks.push(&body[last..c]);
                last = c;
            }
            chunks.push(&body[last..]);
            for ep in all_endpoints() {
                for fmt in [BodyFormat::Json, BodyFormat::Sse, BodyFormat::Ndjson] {
                    let whole = decode_chunks(ep, fmt, &[&body], max);
                    let split = decode_chunks(ep, fmt, &chunks, max);
                    assert_eq!(split, whole, "seed {seed} {ep:?} {fmt:?} body {body:?}");
                    assert!(whole.malformed <= whole.events);
                }
            }
            // Requests too.
            for path in [
                "/v1/chat/completions",
                "/v1/messages",
                "/generate",
                "/api/chat",
            ] {
                let _ = parse_request(match_route(path).unwrap(), &body);
            }
        }
    }
}

// === error bodies ===

fn all_endpoints() -> [Endpoint; 10] {
    [
        Endpoint::OpenAiChat,
        Endpoint::OpenAiCompletions,
        Endpoint::OpenAiResponses,
        Endpoint::AnthropicMessages,
        Endpoint::SglangGenerate,
        Endpoint::TgiGenerate,
        Endpoint::TgiGenerateStream,
        Endpoint::OllamaChat,
        Endpoint::OllamaGenerate,
        Endpoint::CloudflareRun,
    ]
}

#[test]
fn error_body_shapes() {
    let s = http::StatusCode::BAD_GATEWAY;
    let m = "residue: upstream down";
    let cases = [
        (
            None,
            json!({"error": {"message": m, "type": "upstream_down", "code": 502, "param": null, "source": "residue"}}),
        ),
        (
            Some(Family::OpenAi),
            json!({"error": {"message": m, "type": "upstream_down", "code": 502, "param": null, "source": "residue"}}),
        ),
        (
            Some(Family::Anthropic),
            json!({"type": "error", "error": {"type": "upstream_down", "message": m, "source": "residue"}}),
        ),
        (
            Some(Family::Sglang),
            json!({"object": "error", "message": m, "type": "upstream_down", "code": 502, "source": "residue"}),
        ),
        (
            Some(Family::Tgi),
            json!({"error": m, "error_type": "upstream_down", "source": "residue"}),
        ),
        (
            Some(Family::Ollama),
            json!({"error": m, "source": "residue"}),
        ),
        (
            Some(Family::Cloudflare),
            json!({"success": false, "result": null, "messages": [],
                   "errors": [{"code": 502, "message": m}], "source": "residue"}),
        ),
    ];
    for (family, want) in cases {
        let body = error_body(family, s, "upstream_down", "upstream down");
        let got: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(got, want, "{family:?}");
    }
}

#[test]
fn error_bodies_are_valid_json_and_read_back_as_errors() {
    let nasty = "quote \" backslash \\ newline \n nul \u{0} emoji 🎉 </script> \u{2028}";
    for family in Family::ALL.into_iter().map(Some).chain([None]) {
        let body = error_body(
            family,
            http::StatusCode::TOO_MANY_REQUESTS,
            "rate\"limit",
            nasty,
        );
        let v: Value = serde_json::from_slice(&body).expect("valid JSON");
        let text = v.to_string();
        assert!(text.contains("residue"), "{text}");
        assert!(v
            .to_string()
            .contains(&serde_json::to_string(&format!("residue: {nasty}")).unwrap()));
        // residue's own error bodies are recognised by its own decoders.
        for ep in all_endpoints()
            .into_iter()
            .filter(|e| Some(e.family()) == family)
        {
            let out = decode(ep, BodyFormat::Json, &body);
            assert!(out.upstream_error, "{ep:?}");
        }
    }
}

#[test]
fn interleaved_choices_are_kept_apart_for_scanning() {
    let mut stream = String::new();
    for (i, w) in ["a1 ", "b1 ", "a2 ", "b2 "].iter().enumerate() {
        let v = serde_json::json!({"choices": [{"index": i % 2, "delta": {"content": w}}]});
        stream.push_str(&format!("data: {v}\n\n"));
    }
    let mut out = Output::default();
    let mut d = ResponseDecoder::new(Endpoint::OpenAiChat, BodyFormat::Sse, 1 << 20);
    d.push(stream.as_bytes(), &mut out);
    d.finish(&mut out);
    assert!(out.interleaved);
    assert_eq!(out.by_key, vec!["a1 a2 ".to_string(), "b1 b2 ".to_string()]);
    assert_eq!(out.scan_text(), "a1 a2 \nb1 b2 ");

    // Two choices in one body, each whole: not interleaved.
    let body = r#"{"choices":[{"index":0,"message":{"content":"x y"}},{"index":1,"message":{"content":"z"}}]}"#;
    let mut out = Output::default();
    let mut d = ResponseDecoder::new(Endpoint::OpenAiChat, BodyFormat::Json, 1 << 20);
    d.push(body.as_bytes(), &mut out);
    d.finish(&mut out);
    assert!(!out.interleaved);
    assert_eq!(out.scan_text(), out.text);
}

#[test]
fn requests_asking_for_log_probabilities() {
    for (path, body, want) in [
        (
            "/v1/chat/completions",
            r#"{"messages": [], "logprobs": true}"#,
            true,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [], "top_logprobs": 2}"#,
            true,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [], "logprobs": false}"#,
            false,
        ),
        ("/v1/completions", r#"{"prompt": "x", "logprobs": 3}"#, true),
        (
            "/v1/responses",
            r#"{"input": "x", "include": ["message.output_text.logprobs"]}"#,
            true,
        ),
        (
            "/generate_stream",
            r#"{"inputs": "x", "parameters": {"top_n_tokens": 5}}"#,
            true,
        ),
        (
            "/api/generate",
            r#"{"prompt": "x", "logprobs": true}"#,
            true,
        ),
        ("/v1/chat/completions", r#"{"messages": []}"#, false),
    ] {
        assert_eq!(parse(path, body).logprobs, want, "{path} {body}");
    }
}
