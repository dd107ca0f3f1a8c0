//! Anthropic's Messages API (`/v1/messages`).

use serde_json::{json, Map, Value};

use super::json::{
    arr_at, count, index_of, obj_at, push_str, push_tool_descriptions, set_count, set_reason,
    str_at, Segments,
};
use super::{Output, Prompt};

// === impl request ===

/// Collects `system` (string or text blocks), each message's `content`
/// (string or blocks: `text`, `thinking`, `tool_use` input as JSON,
/// `tool_result` content as string or blocks), then tool descriptions.
pub(crate) fn prompt(obj: &Map<String, Value>, p: &mut Prompt) {
    blocks(p, obj.get("system"));
    for msg in arr_at(obj, "messages").into_iter().flatten() {
        if let Some(msg) = msg.as_object() {
            blocks(p, msg.get("content"));
        }
    }
    push_tool_descriptions(p, obj);
}

/// A string, or an array of content blocks.
fn blocks(p: &mut Prompt, v: Option<&Value>) {
    match v {
        Some(Value::String(s)) => p.parts.push(s.clone()),
        Some(Value::Array(items)) => {
            for block in items.iter().filter_map(Value::as_object) {
                match str_at(block, "type") {
                    Some("tool_use") => match block.get("input") {
                        None | Some(Value::Null) => {}
                        Some(input) => p.parts.push(input.to_string()),
                    },
                    Some("tool_result") => match block.get("content") {
                        Some(Value::String(s)) => p.parts.push(s.clone()),
                        Some(Value::Array(inner)) => {
                            for b in inner.iter().filter_map(Value::as_object) {
                                push_str(p, b.get("text"));
                            }
                        }
                        _ => {}
                    },
                    Some("thinking") => push_str(p, block.get("thinking")),
                    _ => push_str(p, block.get("text")),
                }
            }
        }
        _ => {}
    }
}

// === impl response ===

/// Prompt-side counts seen so far in a stream: `message_start` and
/// `message_delta` may each carry some of them.
#[derive(Debug, Default)]
pub(crate) struct State {
    input: Option<u64>,
    cache_read: Option<u64>,
    cache_creation: Option<u64>,
}

/// Applies a whole `message` body or one stream event (by its `type`).
/// Text of distinct content blocks is separated by `\n`.
pub(crate) fn apply(st: &mut State, seg: &mut Segments, v: &Value, out: &mut Output) {
    let Some(obj) = v.as_object() else { return };
    match str_at(obj, "type") {
        Some("message") => message(st, seg, obj, out),
        Some("message_start") => {
            if let Some(m) = obj_at(obj, "message") {
                message(st, seg, m, out);
            }
        }
        Some("content_block_start") => {
            let idx = index_of(obj, "index", 0);
            if let Some(b) = obj_at(obj, "content_block") {
                block(seg, idx, b, out);
            }
        }
        Some("content_block_delta") => {
            let idx = index_of(obj, "index", 0);
            let Some(d) = obj_at(obj, "delta") else {
                return;
            };
            let text = match str_at(d, "type") {
                Some("text_delta") => d.get("text"),
                Some("thinking_delta") => d.get("thinking"),
                Some("input_json_delta") => d.get("partial_json"),
                _ => None,
            };
            seg.write_value(&mut out.text, (idx, 0), text);
        }
        Some("message_delta") => {
            if let Some(d) = obj_at(obj, "delta") {
                set_reason(&mut out.usage.finish_reason, d.get("stop_reason"));
            }
            usage(st, obj.get("usage"), out);
        }
        _ => {}
    }
}

/// A message object: its content blocks, usage and stop reason.
fn message(st: &mut State, seg: &mut Segments, m: &Map<String, Value>, out: &mut Output) {
    for (i, b) in arr_at(m, "content").into_iter().flatten().enumerate() {
        if let Some(b) = b.as_object() {
            block(seg, i as u64, b, out);
        }
    }
    usage(st, m.get("usage"), out);
    set_reason(&mut out.usage.finish_reason, m.get("stop_reason"));
}

/// One content block: `text`, `thinking`, or a `tool_use` input (as JSON,
/// unless empty, as it is at the start of a streamed block).
fn block(seg: &mut Segments, idx: u64, b: &Map<String, Value>, out: &mut Output) {
    match str_at(b, "type") {
        Some("text") => seg.write_value(&mut out.text, (idx, 0), b.get("text")),
        Some("thinking") => seg.write_value(&mut out.text, (idx, 0), b.get("thinking")),
        Some("tool_use") => match b.get("input") {
            Some(Value::Object(o)) if o.is_empty() => {}
            None | Some(Value::Null) => {}
            Some(input) => seg.write(&mut out.text, (idx, 0), &input.to_string()),
        },
        _ => {}
    }
}

/// A `usage` object: prompt tokens are input + cache-read + cache-creation
/// (whichever were ever reported), cached tokens the cache reads.
fn usage(st: &mut State, u: Option<&Value>, out: &mut Output) {
    let Some(u) = u.and_then(Value::as_object) else {
        return;
    };
    set_count(&mut st.input, u.get("input_tokens"));
    set_count(&mut st.cache_read, u.get("cache_read_input_tokens"));
    set_count(&mut st.cache_creation, u.get("cache_creation_input_tokens"));
    let parts = [st.input, st.cache_read, st.cache_creation];
    if parts.iter().any(Option::is_some) {
        let sum = parts
            .iter()
            .flatten()
            .fold(0u64, |a, b| a.saturating_add(*b));
        out.usage.prompt_tokens = Some(sum);
    }
    if st.cache_read.is_some() {
        out.usage.cached_tokens = st.cache_read;
    }
    if let Some(n) = count(u.get("output_tokens")) {
        out.usage.completion_tokens = Some(n);
    }
}

// === impl error body ===

/// `{"type": "error", "error": {"type", "message", "source"}}`.
pub(crate) fn error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {
        "type": kind,
        "message": message,
        "source": "residue",
    }})
}
