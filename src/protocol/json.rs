//! Small, panic-free helpers over `serde_json::Value` shared by the family
//! adapters: lenient field readers, prompt-text collectors, usage setters and
//! the segment writer that joins output text.
//!
//! Every reader accepts *any* `Value` and quietly yields nothing when the
//! shape is not the expected one: wrong types are best effort, never errors.

use serde_json::{Map, Value};

use super::{Output, Prompt};

/// The UTF-8 byte order mark some servers put in front of a body.
pub(crate) const BOM: &[u8] = b"\xEF\xBB\xBF";

// === impl field readers ===

/// `obj[key]` when it is a string.
pub(crate) fn str_at<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    obj.get(key).and_then(Value::as_str)
}

/// `obj[key]` when it is an object.
pub(crate) fn obj_at<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Map<String, Value>> {
    obj.get(key).and_then(Value::as_object)
}

/// `obj[key]` when it is an array.
pub(crate) fn arr_at<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Vec<Value>> {
    obj.get(key).and_then(Value::as_array)
}

/// A token count: a non-negative integer, or a non-negative finite float
/// (truncated; some servers serialise counts as `12.0`). Anything else: `None`.
pub(crate) fn count(v: Option<&Value>) -> Option<u64> {
    let v = v?;
    if let Some(n) = v.as_u64() {
        return Some(n);
    }
    let f = v.as_f64()?;
    (f.is_finite() && f >= 0.0 && f <= u64::MAX as f64).then_some(f as u64)
}

/// The `index` of a choice / block / sequence, or `fallback`.
pub(crate) fn index_of(obj: &Map<String, Value>, key: &str, fallback: u64) -> u64 {
    count(obj.get(key)).unwrap_or(fallback)
}

// === impl usage setters ===

/// Overwrites `dst` only with a count actually present in `v`.
pub(crate) fn set_count(dst: &mut Option<u64>, v: Option<&Value>) {
    if let Some(n) = count(v) {
        *dst = Some(n);
    }
}

/// Overwrites `dst` only with a string actually present in `v` (null and
/// non-strings leave it alone, so the last non-null reason wins).
pub(crate) fn set_reason(dst: &mut Option<String>, v: Option<&Value>) {
    if let Some(s) = v.and_then(Value::as_str) {
        *dst = Some(s.to_owned());
    }
}

/// Reads an OpenAI-style `usage` object — chat/completions names
/// (`prompt_tokens`, `completion_tokens`, `prompt_tokens_details.cached_tokens`)
/// or responses-API names (`input_tokens`, `output_tokens`,
/// `input_tokens_details.cached_tokens`). Non-objects are ignored.
pub(crate) fn openai_usage(u: &Value, out: &mut Output) {
    let Some(u) = u.as_object() else { return };
    let usage = &mut out.usage;
    set_count(&mut usage.prompt_tokens, u.get("prompt_tokens"));
    set_count(&mut usage.prompt_tokens, u.get("input_tokens"));
    set_count(&mut usage.completion_tokens, u.get("completion_tokens"));
    set_count(&mut usage.completion_tokens, u.get("output_tokens"));
    for details in ["prompt_tokens_details", "input_tokens_details"] {
        if let Some(d) = obj_at(u, details) {
            set_count(&mut usage.cached_tokens, d.get("cached_tokens"));
        }
    }
}

/// Whether a top-level value is an error: an object with a non-null `error`
/// member, `"type": "error"` (Anthropic, OpenAI responses) or
/// `"object": "error"` (vLLM / SGLang OpenAI-compatible servers).
pub(crate) fn is_error(v: &Value) -> bool {
    let Some(obj) = v.as_object() else {
        return false;
    };
    obj.get("error").is_some_and(|e| !e.is_null())
        || str_at(obj, "type") == Some("error")
        || str_at(obj, "object") == Some("error")
}

// === impl prompt collectors ===

/// Pushes `v` when it is a string.
pub(crate) fn push_str(p: &mut Prompt, v: Option<&Value>) {
    if let Some(s) = v.and_then(Value::as_str) {
        p.parts.push(s.to_owned());
    }
}

/// Pushes message content: a string, or an array of parts where a part is a
/// string or an object with a string `text` (`text`, `input_text`,
/// `output_text` parts all carry it). Other parts (images, audio) are skipped.
pub(crate) fn push_content(p: &mut Prompt, v: Option<&Value>) {
    match v {
        Some(Value::String(s)) => p.parts.push(s.clone()),
        Some(Value::Array(parts)) => {
            for part in parts {
                match part {
                    Value::String(s) => p.parts.push(s.clone()),
                    Value::Object(o) => push_str(p, o.get("text")),
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

/// Tool-call arguments as text: strings as they are, any other non-null value
/// serialised as JSON (Ollama sends an object).
pub(crate) fn args_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// Pushes the arguments of each `tool_calls[].function` of a message, and a
/// legacy `function_call.arguments`.
pub(crate) fn push_tool_calls(p: &mut Prompt, msg: &Map<String, Value>) {
    for call in arr_at(msg, "tool_calls").into_iter().flatten() {
        if let Some(f) = call.as_object().and_then(|c| obj_at(c, "function")) {
            p.parts.extend(args_text(f.get("arguments")));
        }
    }
    if let Some(f) = obj_at(msg, "function_call") {
        p.parts.extend(args_text(f.get("arguments")));
    }
}

/// Pushes each tool's description: `tools[].function.description` (OpenAI
/// chat, Ollama) or `tools[].description` (responses API, Anthropic); also the
/// legacy `functions[].description`.
pub(crate) fn push_tool_descriptions(p: &mut Prompt, obj: &Map<String, Value>) {
    for key in ["tools", "functions"] {
        for tool in arr_at(obj, key).into_iter().flatten() {
            let Some(tool) = tool.as_object() else {
                continue;
            };
            match obj_at(tool, "function") {
                Some(f) => push_str(p, f.get("description")),
                None => push_str(p, tool.get("description")),
            }
        }
    }
}

/// Counts token ids: an integer counts 1, an array counts its integers, an
/// array of arrays the integers of each (two levels, no recursion).
pub(crate) fn count_token_ids(v: Option<&Value>) -> u64 {
    fn ints(items: &[Value]) -> u64 {
        items.iter().filter(|x| x.is_number()).count() as u64
    }
    match v {
        Some(Value::Number(_)) => 1,
        Some(Value::Array(items)) => {
            let nested: u64 = items
                .iter()
                .filter_map(Value::as_array)
                .map(|inner| ints(inner))
                .sum();
            ints(items) + nested
        }
        _ => 0,
    }
}

// === impl segment writer ===

/// Joins output text. Text is keyed by where it belongs (choice and kind,
/// content block, batch sequence…); consecutive pieces with the same key are
/// concatenated, and a `\n` goes between pieces of different keys. So a
/// stream of deltas and the equivalent non-streamed body give the same text,
/// and two choices or blocks never run into one word.
///
/// It also keeps each key's text apart: when keys interleave (an `n > 1`
/// stream alternating choices token by token), the joined text is a shuffle
/// of words that no detector can read, and scanners use the per-key texts.
#[derive(Debug, Default)]
pub(crate) struct Segments {
    current: Option<(u64, u64)>,
    pub(crate) by_key: Vec<((u64, u64), String)>,
    /// A key came back after another key was written.
    pub(crate) interleaved: bool,
}

impl Segments {
    /// Appends `text` (ignored when empty) under `key`.
    pub(crate) fn write(&mut self, out: &mut String, key: (u64, u64), text: &str) {
        if text.is_empty() {
            return;
        }
        if self.current.is_some_and(|k| k != key) {
            out.push('\n');
        }
        out.push_str(text);
        match self.by_key.iter_mut().find(|(k, _)| *k == key) {
            Some((_, t)) => {
                if self.current != Some(key) {
                    self.interleaved = true;
                }
                t.push_str(text);
            }
            None => self.by_key.push((key, text.to_string())),
        }
        self.current = Some(key);
    }

    /// Appends `v` under `key` when it is a string.
    pub(crate) fn write_value(&mut self, out: &mut String, key: (u64, u64), v: Option<&Value>) {
        if let Some(s) = v.and_then(Value::as_str) {
            self.write(out, key, s);
        }
    }
}
