//! SGLang's native `/generate`.
//!
//! A body is `{"text", "meta_info"}` or, for a batch, an array of those. A
//! stream sends such objects as SSE events, each carrying by default the
//! *cumulative* text so far (with `stream_output` the delta instead), and an
//! `index` when a batch is streamed.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::json::{count, count_token_ids, index_of, obj_at, str_at, Segments};
use super::{Output, Prompt};

// === impl request ===

/// Collects `text` (string or list of strings); counts `input_ids` (list, or
/// list of lists) as pre-tokenized.
pub(crate) fn prompt(obj: &Map<String, Value>, p: &mut Prompt) {
    match obj.get("text") {
        Some(Value::String(s)) => p.parts.push(s.clone()),
        Some(Value::Array(items)) => {
            p.parts
                .extend(items.iter().filter_map(Value::as_str).map(str::to_owned));
        }
        _ => {}
    }
    p.pretokenized += count_token_ids(obj.get("input_ids"));
}

// === impl response ===

/// What one sequence (one `index`) of a stream has sent so far.
#[derive(Debug, Default)]
struct Seq {
    /// The text appended for this sequence, to recognise cumulative updates.
    text: String,
    prompt: Option<u64>,
    completion: Option<u64>,
    cached: Option<u64>,
}

/// Per-sequence progress of a stream, and the running sums over sequences.
#[derive(Debug, Default)]
pub(crate) struct State {
    seqs: HashMap<u64, Seq>,
    prompt: Option<u64>,
    completion: Option<u64>,
    cached: Option<u64>,
}

/// Applies a whole body (object, or array for a batch: texts joined by `\n`,
/// counts summed) or one stream event (an object, tracked per `index`).
pub(crate) fn apply(st: &mut State, seg: &mut Segments, v: &Value, out: &mut Output) {
    match v {
        Value::Array(items) => {
            let (mut prompt, mut completion, mut cached) = (None, None, None);
            for (i, item) in items.iter().enumerate() {
                let Some(item) = item.as_object() else {
                    continue;
                };
                seg.write_value(&mut out.text, (i as u64, 0), item.get("text"));
                if let Some(m) = obj_at(item, "meta_info") {
                    add(&mut prompt, m.get("prompt_tokens"));
                    add(&mut completion, m.get("completion_tokens"));
                    add(&mut cached, m.get("cached_tokens"));
                    finish_reason(m, out);
                }
            }
            let usage = &mut out.usage;
            for (dst, sum) in [
                (&mut usage.prompt_tokens, prompt),
                (&mut usage.completion_tokens, completion),
                (&mut usage.cached_tokens, cached),
            ] {
                if sum.is_some() {
                    *dst = sum;
                }
            }
        }
        Value::Object(obj) => event(st, seg, obj, out),
        _ => {}
    }
}

/// Adds a present count to a running sum.
fn add(sum: &mut Option<u64>, v: Option<&Value>) {
    if let Some(n) = count(v) {
        *sum = Some(sum.unwrap_or(0).saturating_add(n));
    }
}

/// `meta_info.finish_reason`: `{"type": ...}` or, leniently, a string.
fn finish_reason(m: &Map<String, Value>, out: &mut Output) {
    let reason = match m.get("finish_reason") {
        Some(Value::Object(r)) => str_at(r, "type"),
        Some(Value::String(s)) => Some(s.as_str()),
        _ => None,
    };
    if let Some(r) = reason {
        out.usage.finish_reason = Some(r.to_owned());
    }
}

/// One object: appends only what is new for its sequence, and keeps usage as
/// the sum over sequences of each one's latest counts.
fn event(st: &mut State, seg: &mut Segments, obj: &Map<String, Value>, out: &mut Output) {
    let idx = index_of(obj, "index", 0);
    let s = st.seqs.entry(idx).or_default();
    if let Some(text) = str_at(obj, "text") {
        let new = match text.strip_prefix(s.text.as_str()) {
            Some(suffix) => {
                let new = suffix.to_owned();
                s.text.clear();
                s.text.push_str(text);
                new
            }
            None => {
                s.text.push_str(text);
                text.to_owned()
            }
        };
        seg.write(&mut out.text, (idx, 0), &new);
    }
    let Some(m) = obj_at(obj, "meta_info") else {
        return;
    };
    update(&mut s.prompt, &mut st.prompt, m.get("prompt_tokens"));
    update(
        &mut s.completion,
        &mut st.completion,
        m.get("completion_tokens"),
    );
    update(&mut s.cached, &mut st.cached, m.get("cached_tokens"));
    let usage = &mut out.usage;
    for (dst, sum) in [
        (&mut usage.prompt_tokens, st.prompt),
        (&mut usage.completion_tokens, st.completion),
        (&mut usage.cached_tokens, st.cached),
    ] {
        if sum.is_some() {
            *dst = sum;
        }
    }
    finish_reason(m, out);
}

/// Replaces a sequence's count with a present new one, adjusting the sum
/// (modular arithmetic keeps it exact without rescanning all sequences).
fn update(seq: &mut Option<u64>, sum: &mut Option<u64>, v: Option<&Value>) {
    if let Some(n) = count(v) {
        let old = seq.replace(n).unwrap_or(0);
        *sum = Some(sum.unwrap_or(0).wrapping_sub(old).wrapping_add(n));
    }
}

// === impl error body ===

/// `{"object": "error", "message", "type", "code", "source"}`.
pub(crate) fn error_body(status: u16, kind: &str, message: &str) -> Value {
    json!({
        "object": "error",
        "message": message,
        "type": kind,
        "code": status,
        "source": "residue",
    })
}
