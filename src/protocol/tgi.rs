//! Hugging Face Text Generation Inference: `/generate` and
//! `/generate_stream`.

use serde_json::{json, Map, Value};

use super::json::{obj_at, set_count, set_reason, Segments};
use super::{Output, Prompt, Usage};

// === impl request ===

/// Collects `inputs` (a string; leniently, a list of strings).
pub(crate) fn prompt(obj: &Map<String, Value>, p: &mut Prompt) {
    match obj.get("inputs") {
        Some(Value::String(s)) => p.parts.push(s.clone()),
        Some(Value::Array(items)) => {
            p.parts
                .extend(items.iter().filter_map(Value::as_str).map(str::to_owned));
        }
        _ => {}
    }
}

// === impl response ===

/// Applies a whole `/generate` body (`{"generated_text", "details"}` or an
/// array of those: texts joined by `\n`, counts summed) or one
/// `/generate_stream` event (`{"token": {"text", "special"}, "details"}`:
/// special tokens are skipped; the final `generated_text` is not re-added).
pub(crate) fn apply(seg: &mut Segments, v: &Value, out: &mut Output) {
    match v {
        Value::Array(items) => {
            let mut sum = Usage::default();
            for (i, item) in items.iter().enumerate() {
                let Some(item) = item.as_object() else {
                    continue;
                };
                seg.write_value(&mut out.text, (i as u64, 0), item.get("generated_text"));
                let mut one = Usage::default();
                details(item, &mut one);
                for (s, n) in [
                    (&mut sum.prompt_tokens, one.prompt_tokens),
                    (&mut sum.completion_tokens, one.completion_tokens),
                ] {
                    if let Some(n) = n {
                        *s = Some(s.unwrap_or(0).saturating_add(n));
                    }
                }
                if one.finish_reason.is_some() {
                    sum.finish_reason = one.finish_reason;
                }
            }
            let usage = &mut out.usage;
            if sum.prompt_tokens.is_some() {
                usage.prompt_tokens = sum.prompt_tokens;
            }
            if sum.completion_tokens.is_some() {
                usage.completion_tokens = sum.completion_tokens;
            }
            if sum.finish_reason.is_some() {
                usage.finish_reason = sum.finish_reason;
            }
        }
        Value::Object(obj) => {
            match obj_at(obj, "token") {
                Some(token) => {
                    if token.get("special").and_then(Value::as_bool) != Some(true) {
                        seg.write_value(&mut out.text, (0, 0), token.get("text"));
                    }
                }
                None => seg.write_value(&mut out.text, (0, 0), obj.get("generated_text")),
            }
            details(obj, &mut out.usage);
        }
        _ => {}
    }
}

/// `details`: `finish_reason`, `generated_tokens`, and the prompt length as
/// the `prefill` list's length when that list is non-empty.
fn details(obj: &Map<String, Value>, usage: &mut Usage) {
    let Some(d) = obj_at(obj, "details") else {
        return;
    };
    set_reason(&mut usage.finish_reason, d.get("finish_reason"));
    set_count(&mut usage.completion_tokens, d.get("generated_tokens"));
    if let Some(prefill) = d.get("prefill").and_then(Value::as_array) {
        if !prefill.is_empty() {
            usage.prompt_tokens = Some(prefill.len() as u64);
        }
    }
}

/// TGI's `x-prompt-tokens` and `x-generated-tokens` headers, filling only
/// fields still `None`; unparsable values are ignored.
pub(crate) fn usage_from_headers(headers: &http::HeaderMap, usage: &mut Usage) {
    let header =
        |name: &str| -> Option<u64> { headers.get(name)?.to_str().ok()?.trim().parse().ok() };
    if usage.prompt_tokens.is_none() {
        usage.prompt_tokens = header("x-prompt-tokens");
    }
    if usage.completion_tokens.is_none() {
        usage.completion_tokens = header("x-generated-tokens");
    }
}

// === impl error body ===

/// `{"error": message, "error_type", "source"}`.
pub(crate) fn error_body(kind: &str, message: &str) -> Value {
    json!({"error": message, "error_type": kind, "source": "residue"})
}
