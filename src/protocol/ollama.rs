//! Ollama's native API: `/api/chat` and `/api/generate`.

use serde_json::{json, Map, Value};

use super::json::{
    args_text, arr_at, obj_at, push_str, push_tool_descriptions, set_count, set_reason, Segments,
};
use super::openai::chat_messages;
use super::{Endpoint, Output, Prompt};

// === impl request ===

/// Chat: top-level `system`, then `messages[].content` and tool-call
/// arguments, then tool descriptions. Generate: `system`, `prompt`, `suffix`.
pub(crate) fn prompt(endpoint: Endpoint, obj: &Map<String, Value>, p: &mut Prompt) {
    push_str(p, obj.get("system"));
    if endpoint == Endpoint::OllamaGenerate {
        push_str(p, obj.get("prompt"));
        push_str(p, obj.get("suffix"));
    } else {
        chat_messages(p, obj.get("messages"));
        push_tool_descriptions(p, obj);
    }
}

// === impl response ===

/// Applies one NDJSON line or a whole non-streamed body: chat
/// `message.thinking` / `message.content` / tool-call arguments, generate
/// `thinking` / `response`; the final `done` object's `prompt_eval_count`,
/// `eval_count` and `done_reason`.
pub(crate) fn apply(seg: &mut Segments, v: &Value, out: &mut Output) {
    let Some(obj) = v.as_object() else { return };
    if let Some(m) = obj_at(obj, "message") {
        write(seg, m, out);
        for (i, call) in arr_at(m, "tool_calls").into_iter().flatten().enumerate() {
            let f = call.as_object().and_then(|c| obj_at(c, "function"));
            if let Some(args) = f.and_then(|f| args_text(f.get("arguments"))) {
                seg.write(&mut out.text, (0, 2 + i as u64), &args);
            }
        }
    }
    write(seg, obj, out);
    let usage = &mut out.usage;
    set_count(&mut usage.prompt_tokens, obj.get("prompt_eval_count"));
    set_count(&mut usage.completion_tokens, obj.get("eval_count"));
    set_reason(&mut usage.finish_reason, obj.get("done_reason"));
}

/// `thinking`, then `content` (chat message) or `response` (generate).
fn write(seg: &mut Segments, o: &Map<String, Value>, out: &mut Output) {
    seg.write_value(&mut out.text, (0, 0), o.get("thinking"));
    seg.write_value(&mut out.text, (0, 1), o.get("content"));
    seg.write_value(&mut out.text, (0, 1), o.get("response"));
}

// === impl error body ===

/// `{"error": message, "source"}`.
pub(crate) fn error_body(message: &str) -> Value {
    json!({"error": message, "source": "residue"})
}
