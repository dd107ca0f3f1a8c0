//! Cloudflare Workers AI: `/client/v4/accounts/{id}/ai/run/{model}` and the
//! Workers binding's `/ai/run/{model}`.

use serde_json::{json, Map, Value};

use super::json::{arr_at, obj_at, openai_usage, push_str, push_tool_descriptions, Segments};
use super::openai::chat_messages;
use super::{Output, Prompt};

// === impl request ===

/// Collects `prompt`, or chat-style `messages`, then tool descriptions.
pub(crate) fn prompt(obj: &Map<String, Value>, p: &mut Prompt) {
    push_str(p, obj.get("prompt"));
    chat_messages(p, obj.get("messages"));
    push_tool_descriptions(p, obj);
}

// === impl response ===

/// Applies a whole body (`{"result": {"response", "usage"}, "success",
/// "errors"}`; `success: false` or non-empty `errors` is an upstream error)
/// or one stream event (`{"response", "usage"?}`).
pub(crate) fn apply(seg: &mut Segments, v: &Value, out: &mut Output) {
    let Some(obj) = v.as_object() else { return };
    let failed = obj.get("success").and_then(Value::as_bool) == Some(false)
        || arr_at(obj, "errors").is_some_and(|e| !e.is_empty());
    if failed {
        out.upstream_error = true;
    }
    let body = obj_at(obj, "result").unwrap_or(obj);
    seg.write_value(&mut out.text, (0, 0), body.get("response"));
    if let Some(u) = body.get("usage") {
        openai_usage(u, out);
    }
}

// === impl error body ===

/// `{"success": false, "result": null, "messages": [], "errors": [{"code",
/// "message"}], "source"}`.
pub(crate) fn error_body(status: u16, message: &str) -> Value {
    json!({
        "success": false,
        "result": null,
        "messages": [],
        "errors": [{"code": status, "message": message}],
        "source": "residue",
    })
}
