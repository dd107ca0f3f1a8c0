//! OpenAI and OpenAI-compatible servers (vLLM, SGLang's and LiteLLM's
//! OpenAI front ends): chat completions, legacy completions, responses API.

use serde_json::{json, Map, Value};

use super::json::{
    args_text, arr_at, count_token_ids, index_of, obj_at, openai_usage, push_content, push_str,
    push_tool_calls, push_tool_descriptions, set_reason, str_at, Segments,
};
use super::{Endpoint, Output, Prompt};

/// Segment kinds within one choice (see [`Segments`]).
const REASONING: u64 = 0;
const CONTENT: u64 = 1;
/// Tool call `i` of a choice is kind `TOOL + i`.
const TOOL: u64 = 2;

// === impl request ===

/// Collects the prompt of a chat (`messages`, `tools`), completions
/// (`prompt`, `suffix`) or responses (`instructions`, `input`, `tools`) body.
pub(crate) fn prompt(endpoint: Endpoint, obj: &Map<String, Value>, p: &mut Prompt) {
    match endpoint {
        Endpoint::OpenAiCompletions => {
            match obj.get("prompt") {
                Some(Value::Array(items)) => {
                    for item in items {
                        match item {
                            Value::String(s) => p.parts.push(s.clone()),
                            other => p.pretokenized += count_token_ids(Some(other)),
                        }
                    }
                }
                other => push_str(p, other),
            }
            push_str(p, obj.get("suffix"));
        }
        Endpoint::OpenAiResponses => {
            push_str(p, obj.get("instructions"));
            match obj.get("input") {
                Some(Value::Array(items)) => items.iter().for_each(|it| response_item(p, it)),
                other => push_str(p, other),
            }
            push_tool_descriptions(p, obj);
        }
        _ => {
            chat_messages(p, obj.get("messages"));
            push_tool_descriptions(p, obj);
        }
    }
}

/// Chat-style `messages`: each message's `content` (string or parts), then
/// its tool-call arguments. Shared with Ollama and Cloudflare.
pub(crate) fn chat_messages(p: &mut Prompt, messages: Option<&Value>) {
    for msg in messages.and_then(Value::as_array).into_iter().flatten() {
        let Some(msg) = msg.as_object() else { continue };
        push_content(p, msg.get("content"));
        push_tool_calls(p, msg);
    }
}

/// One responses-API input item: a string, a message (`content` string or
/// parts), a `function_call` (`arguments`) or `function_call_output`
/// (`output`).
fn response_item(p: &mut Prompt, item: &Value) {
    match item {
        Value::String(s) => p.parts.push(s.clone()),
        Value::Object(o) => {
            push_content(p, o.get("content"));
            match str_at(o, "type") {
                Some("function_call") => p.parts.extend(args_text(o.get("arguments"))),
                Some("function_call_output") => push_content(p, o.get("output")),
                _ => {}
            }
        }
        _ => {}
    }
}

// === impl response ===

/// Applies one decoded value — a whole body or one stream event — of any
/// OpenAI endpoint. Shapes are told apart by content, not by endpoint:
/// responses-API events by their `type`, a response object by `output`,
/// chat/completions by `choices` (`message`, `delta` or `text`).
pub(crate) fn apply(seg: &mut Segments, v: &Value, out: &mut Output) {
    let Some(obj) = v.as_object() else { return };
    if let Some(t) = str_at(obj, "type").filter(|t| t.starts_with("response.")) {
        response_event(seg, t, obj, out);
        return;
    }
    if str_at(obj, "object") == Some("response") || arr_at(obj, "output").is_some() {
        response_body(seg, obj, out);
        return;
    }
    for (pos, choice) in arr_at(obj, "choices").into_iter().flatten().enumerate() {
        let Some(choice) = choice.as_object() else {
            continue;
        };
        let idx = index_of(choice, "index", pos as u64);
        for key in ["message", "delta"] {
            if let Some(m) = obj_at(choice, key) {
                message(seg, idx, m, out);
            }
        }
        seg.write_value(&mut out.text, (idx, CONTENT), choice.get("text"));
        set_reason(&mut out.usage.finish_reason, choice.get("finish_reason"));
    }
    if let Some(u) = obj.get("usage") {
        openai_usage(u, out);
    }
}

/// A chat `message` or `delta`: reasoning, content, tool-call arguments.
fn message(seg: &mut Segments, idx: u64, m: &Map<String, Value>, out: &mut Output) {
    let reasoning = m.get("reasoning_content").or_else(|| m.get("reasoning"));
    seg.write_value(&mut out.text, (idx, REASONING), reasoning);
    match m.get("content") {
        Some(Value::Array(parts)) => {
            for part in parts.iter().filter_map(Value::as_object) {
                seg.write_value(&mut out.text, (idx, CONTENT), part.get("text"));
            }
        }
        other => seg.write_value(&mut out.text, (idx, CONTENT), other),
    }
    for (pos, call) in arr_at(m, "tool_calls").into_iter().flatten().enumerate() {
        let Some(call) = call.as_object() else {
            continue;
        };
        let t = index_of(call, "index", pos as u64).saturating_add(TOOL);
        if let Some(args) = obj_at(call, "function").and_then(|f| args_text(f.get("arguments"))) {
            seg.write(&mut out.text, (idx, t), &args);
        }
    }
}

/// A non-streamed responses-API object: `output[]` messages' `output_text`
/// parts and function-call arguments; usage; status.
fn response_body(seg: &mut Segments, obj: &Map<String, Value>, out: &mut Output) {
    for (i, item) in arr_at(obj, "output").into_iter().flatten().enumerate() {
        let Some(item) = item.as_object() else {
            continue;
        };
        let i = i as u64;
        match str_at(item, "type") {
            Some("message") => {
                for (j, part) in arr_at(item, "content").into_iter().flatten().enumerate() {
                    let Some(part) = part.as_object() else {
                        continue;
                    };
                    if str_at(part, "type") == Some("output_text") {
                        seg.write_value(&mut out.text, (i, j as u64), part.get("text"));
                    }
                }
            }
            Some("function_call") => {
                if let Some(args) = args_text(item.get("arguments")) {
                    seg.write(&mut out.text, (i, u64::MAX), &args);
                }
            }
            _ => {}
        }
    }
    response_status(obj, out);
}

/// Usage and finish reason of a responses-API object (`status`, overridden by
/// `incomplete_details.reason`).
fn response_status(obj: &Map<String, Value>, out: &mut Output) {
    if let Some(u) = obj.get("usage") {
        openai_usage(u, out);
    }
    set_reason(&mut out.usage.finish_reason, obj.get("status"));
    if let Some(d) = obj_at(obj, "incomplete_details") {
        set_reason(&mut out.usage.finish_reason, d.get("reason"));
    }
}

/// A streamed responses-API event, by its `type`.
fn response_event(seg: &mut Segments, t: &str, obj: &Map<String, Value>, out: &mut Output) {
    let output_index = index_of(obj, "output_index", 0);
    match t {
        "response.output_text.delta" => {
            let key = (output_index, index_of(obj, "content_index", 0));
            seg.write_value(&mut out.text, key, obj.get("delta"));
        }
        "response.function_call_arguments.delta" => {
            seg.write_value(&mut out.text, (output_index, u64::MAX), obj.get("delta"));
        }
        "response.completed" | "response.incomplete" | "response.failed" => {
            if t == "response.failed" {
                out.upstream_error = true;
            }
            if let Some(r) = obj_at(obj, "response") {
                response_status(r, out);
            }
        }
        _ => {}
    }
}

// === impl error body ===

/// `{"error": {"message", "type", "code", "param": null, "source"}}`.
pub(crate) fn error_body(status: u16, kind: &str, message: &str) -> Value {
    json!({"error": {
        "message": message,
        "type": kind,
        "code": status,
        "param": null,
        "source": "residue",
    }})
}
