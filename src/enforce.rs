//! Verdicts and enforcement: what to do with an answer that has findings.
//!
//! The verdict is a pure function of findings and policy. Enforcement has
//! two shapes:
//! - a non-streaming answer is held whole until scanned, then passed,
//!   replaced by an error in the family's shape, or redacted;
//! - a streamed answer flows through [`GuardBody`], which holds back the
//!   newest `hold-back-chars` of answer text: frames are released only once
//!   that much scanned, clean text follows them, so a leak found inside the
//!   window is never sent. On a finding the held frames are dropped and the
//!   stream ends with an error event in the family's own framing.
//!
//! In redact mode a stream is held as whole events instead of raw frames
//! (see [`Redactor`]), each knowing the range of answer text it added, so a
//! leak found while still held is masked inside its events and the stream
//! carries on. A leak that began in text already sent, or that cannot be
//! found in its event as written, cuts the stream as block mode does.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::task::JoinHandle;

use crate::body::BoxError;
use crate::config::Action;
use crate::detect::Finding;
use crate::protocol::{BodyFormat, Endpoint, Family, Output, ResponseDecoder};

/// What to do with one answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Block,
    /// Mask these byte ranges of the answer text.
    Redact(Vec<(usize, usize)>),
}

/// The verdict for `findings` under `action`. Redaction needs a span for
/// every finding; one about the whole exchange (prompt accounting: the whole
/// answer may be someone else's) blocks instead.
pub fn verdict(action: Action, findings: &[Finding]) -> Verdict {
    if findings.is_empty() || action == Action::Monitor {
        return Verdict::Pass;
    }
    match action {
        Action::Monitor => Verdict::Pass,
        Action::Block => Verdict::Block,
        Action::Redact => {
            if findings.iter().any(|f| f.spans.is_empty()) {
                return Verdict::Block;
            }
            let mut spans: Vec<(usize, usize)> = findings
                .iter()
                .flat_map(|f| f.spans.iter().copied())
                .collect();
            spans.sort_unstable();
            let mut merged: Vec<(usize, usize)> = Vec::new();
            for (s, e) in spans {
                match merged.last_mut() {
                    Some(last) if s <= last.1 => last.1 = last.1.max(e),
                    _ => merged.push((s, e)),
                }
            }
            Verdict::Redact(merged)
        }
    }
}

/// The mask for a span: one `*` per character, so lengths stay plausible
/// and nothing of the value survives.
fn mask_of(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_whitespace() { c } else { '*' })
        .collect()
}

/// Masks the spans of `text` wherever they appear in a JSON `body` (as JSON
/// string content). `None` when a span cannot be found in the body as
/// written (escaped differently, say): the caller blocks instead.
pub fn redact_json(body: &[u8], text: &str, spans: &[(usize, usize)]) -> Option<Vec<u8>> {
    let mut out = body.to_vec();
    for (s, e) in spans {
        let m = text.get(*s..*e)?;
        if m.is_empty() {
            continue;
        }
        let quoted = serde_json::to_string(m).ok()?;
        let escaped = quoted.get(1..quoted.len() - 1)?.as_bytes();
        let replacement = mask_of(m);
        let replacement = serde_json::to_string(&replacement).ok()?;
        let replacement = replacement
            .get(1..replacement.len() - 1)?
            .as_bytes()
            .to_vec();
        let mut found = false;
        let mut i = 0;
        let mut next = Vec::with_capacity(out.len());
        while i < out.len() {
            if out[i..].starts_with(escaped) {
                next.extend_from_slice(&replacement);
                i += escaped.len();
                found = true;
            } else {
                next.push(out[i]);
                i += 1;
            }
        }
        if !found {
            return None;
        }
        out = next;
    }
    Some(out)
}

/// The event that ends a blocked stream, in the family's own framing, so
/// that SDKs raise an error rather than treat the cut answer as complete.
pub fn error_event(family: Family, format: BodyFormat, kind: &str, message: &str) -> Bytes {
    let message = format!("residue: {message}");
    let bytes = match (family, format) {
        (Family::Anthropic, _) => {
            let data = serde_json::json!({"type": "error", "error": {"type": kind, "message": message, "source": "residue"}});
            format!("event: error\ndata: {data}\n\n")
        }
        (_, BodyFormat::Ndjson) => format!(
            "{}\n",
            serde_json::json!({"error": message, "source": "residue"})
        ),
        (Family::OpenAi, _) => {
            let data = serde_json::json!({"error": {"message": message, "type": kind, "code": null, "param": null, "source": "residue"}});
            format!("data: {data}\n\n")
        }
        _ => format!(
            "data: {}\n\n",
            serde_json::json!({"error": message, "error_type": kind, "source": "residue"})
        ),
    };
    Bytes::from(bytes)
}

/// Scans the answer text so far (on a blocking thread); `last` marks the
/// final scan (the clean answer may be recorded). `Err` when the answer could
/// not be checked (the fingerprint store failed).
pub type ScanFn = Arc<dyn Fn(String, bool) -> Result<Vec<Finding>, ()> + Send + Sync>;

/// Called with findings to report and what was done about them: `"block"`
/// once, when the stream is cut (nothing is reported after that), or
/// `"redact"` each time newly found spans were masked.
pub type OnFindings = Box<dyn FnMut(Vec<Finding>, &'static str) + Send>;

/// Called when a stream could not be checked: `true` when it was cut (fail
/// closed), `false` when it was passed unchecked (fail open).
pub type OnFail = Box<dyn FnOnce(bool) + Send>;

/// How much a stream holds back, and what it does when it cannot check.
#[derive(Clone, Copy, Debug)]
pub struct Guard {
    /// Bytes of answer text that must follow a frame, scanned and clean,
    /// before it is released.
    pub hold_back: usize,
    /// Tokens (words; CJK characters count 0.6) that must follow it too: a
    /// leak is only certain to be found once that many of its tokens were
    /// seen, whatever their length in bytes.
    pub hold_back_tokens: usize,
    /// Answer text past which the stream is not checked (fail open/closed).
    pub max_text: usize,
    pub fail_closed: bool,
    /// What a finding does: [`Action::Redact`] masks leaked spans while they
    /// are held; anything else cuts the stream.
    pub action: Action,
    /// The request asked for log probabilities: the answer's tokens come
    /// again beside its text, so a leak cuts the stream even in redact mode.
    pub logprobs: bool,
}

/// Word-equivalents in `text`: each whitespace-separated chunk is one; each
/// CJK, Thai or Hangul character 0.6 (the detectors need ≈20 of them where
/// they need 12 words).
pub fn token_weight(text: &str) -> f64 {
    // Whitespace-separated chunks holding a letter or digit: never more than
    // the detectors' words ("ledger_entry_0001" is one word to them; "foo,bar"
    // one here and two there; "—" none here or there). Undercounting only
    // holds back more.
    let mut words = 0usize;
    let mut cjk = 0usize;
    let mut chunk_has_word = false;
    for c in text.chars() {
        // The detectors' own per-character scripts: CJK punctuation ("。")
        // is not one of their tokens, so it must not count here either.
        let dense = crate::fingerprint::is_cjk_class(c);
        if dense {
            cjk += 1;
        }
        if dense || c.is_whitespace() {
            words += usize::from(chunk_has_word);
            chunk_has_word = false;
        } else if c.is_alphanumeric() {
            chunk_has_word = true;
        }
    }
    words += usize::from(chunk_has_word);
    words as f64 + cjk as f64 * 0.6
}

/// One frame not yet released, with the range of answer text decoded from
/// it (`start..end`; in block mode only `end` is used).
struct Held {
    frame: Frame<Bytes>,
    start: usize,
    end: usize,
}

/// Redact mode's state. Frames are re-cut into whole events (SSE: up to the
/// blank line; NDJSON: one line), fed to the decoder line by line so that
/// the text each event adds is known, and held as such. A span is masked
/// in the JSON string of each held event it touches.
#[derive(Default)]
struct Redactor {
    on: bool,
    /// Bytes of the event being read (not yet complete).
    pending: Vec<u8>,
    /// Answer text length when `pending` began.
    unit_start: usize,
    /// Answer text masked so far: sorted, disjoint ranges.
    masked: Vec<(usize, usize)>,
    /// End of the answer text already released.
    released: usize,
    /// What was reported so far: (detector, source, span), so that a span
    /// that grows between scans is reported once, but another detector or
    /// source about the same text is reported too.
    reported: Vec<(&'static str, String, (usize, usize))>,
}

/// Shorter masked texts are not replaced in every released frame (they could
/// match values that are not answer text, such as a role or a reason); in
/// events that repeat the answer ([`echo_kind`]) they are masked by position
/// or the stream is cut.
const MIN_ECHO: usize = 8;

/// Who a finding is about, beyond its detector: its source tenant(s), rule
/// or canary, as far as its evidence says.
fn source_of(f: &Finding) -> String {
    ["source_tenant", "source_tenants", "rule", "canary", "owner"]
        .iter()
        .filter_map(|k| f.evidence.get(*k).map(|v| format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(";")
}

/// How an event repeats answer text the decoder does not count again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Echo {
    /// Part of it (one output item's text).
    Part,
    /// All of it: every masked text must be found in it.
    Full,
}

/// The event's JSON (SSE `data:` lines joined, or an NDJSON line).
fn event_json(event: &[u8]) -> Option<serde_json::Value> {
    let text = std::str::from_utf8(event).ok()?;
    let mut data: Vec<&str> = Vec::new();
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(d) = line.strip_prefix("data:") {
            data.push(d.strip_prefix(' ').unwrap_or(d));
        } else if line.starts_with('{') {
            data.push(line);
        }
    }
    serde_json::from_str(&data.join("\n")).ok()
}

/// Whether `v` is an event repeating answer text: TGI's last event
/// (`generated_text`), the responses API's `*.done` events and its final
/// `response.completed`.
fn echo_kind(v: &serde_json::Value) -> Option<Echo> {
    if v.get("token").is_some() && v.get("generated_text").is_some_and(|g| g.is_string()) {
        return Some(Echo::Full);
    }
    match v.get("type").and_then(|t| t.as_str())? {
        "response.completed" | "response.incomplete" => Some(Echo::Full),
        "response.output_text.done"
        | "response.content_part.done"
        | "response.output_item.done"
        | "response.function_call_arguments.done"
        | "response.failed" => Some(Echo::Part),
        _ => None,
    }
}

/// Whether `v` carries the answer as tokens too: non-empty `logprobs`,
/// `top_logprobs` or `top_tokens`, or Ollama's `context` token ids. Masking
/// the text alone would leave those in clear.
fn carries_tokens(v: &serde_json::Value) -> bool {
    use serde_json::Value;
    let full = |v: &Value| match v {
        Value::Null => false,
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::Bool(b) => *b,
        _ => true,
    };
    match v {
        Value::Object(o) => o.iter().any(|(k, v)| {
            (matches!(
                k.as_str(),
                "logprobs" | "top_logprobs" | "top_tokens" | "context"
            ) && full(v))
                || carries_tokens(v)
        }),
        Value::Array(a) => a.iter().any(carries_tokens),
        _ => false,
    }
}

/// Whether `v` is an event whose text must not be masked with `*`: tool-call
/// arguments (the JSON they build would break) and Anthropic thinking (it
/// is signed).
fn unmaskable(v: &serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::Object(o) => o.iter().any(|(k, v)| {
            matches!(
                k.as_str(),
                "tool_calls" | "function_call" | "partial_json" | "arguments"
            ) || (k == "type"
                && v.as_str().is_some_and(|t| {
                    t == "thinking_delta" || t.starts_with("response.function_call_arguments")
                }))
                || unmaskable(v)
        }),
        Value::Array(a) => a.iter().any(unmaskable),
        _ => false,
    }
}

/// What a scan with findings leads to in redact mode.
enum Redaction {
    /// Nothing new: every span was masked before.
    Nothing,
    /// Spans were masked; report these findings (those not reported
    /// before) as redacted.
    Masked(Vec<Finding>),
    /// The leak cannot be masked: cut the stream, reporting these (those
    /// not reported before).
    Cut(Vec<Finding>),
}

impl Redactor {
    /// Moves the event being read, if any, to the held queue.
    fn flush(&mut self, held: &mut VecDeque<Held>, text_len: usize) {
        if !self.pending.is_empty() {
            let bytes = Bytes::from(std::mem::take(&mut self.pending));
            held.push_back(Held {
                frame: Frame::data(bytes),
                start: self.unit_start,
                end: text_len,
            });
        }
        self.unit_start = text_len;
    }

    /// Decodes `data` a line at a time, holding each completed event alone.
    fn push(
        &mut self,
        data: &[u8],
        decoder: &mut ResponseDecoder,
        output: &mut Output,
        held: &mut VecDeque<Held>,
    ) {
        let mut rest = data;
        while !rest.is_empty() {
            let cut = rest
                .iter()
                .position(|&b| b == b'\n' || b == b'\r')
                .map_or(rest.len(), |i| i + 1);
            let (line, tail) = rest.split_at(cut);
            let before = (output.events, output.text.len());
            decoder.push(line, output);
            self.pending.extend_from_slice(line);
            if (output.events, output.text.len()) != before {
                self.flush(held, output.text.len());
            }
            rest = tail;
        }
    }

    /// The frame's bytes as they may go out: every masked text that recurs
    /// in one of its JSON string values masked there too. `None` when that
    /// cannot be done for sure: the stream must be cut.
    ///
    /// The texts are those of the masked ranges as they are now (a span that
    /// grew between scans is one text), cut at `\n` (it separates output
    /// items, which are echoed one per string), replaced longest first. In
    /// an event repeating the answer ([`echo_kind`]) a string found once in
    /// the answer is masked by position, so short spans are too; any masked
    /// text left in it, or missing from an echo of the whole answer, cuts.
    fn release(&mut self, held: Held, text: &str) -> Option<Frame<Bytes>> {
        self.released = self.released.max(held.end);
        let frame = held.frame;
        if self.masked.is_empty() {
            return Some(frame);
        }
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(other) => return Some(other),
        };
        let json = event_json(&data);
        let echo = json.as_ref().and_then(echo_kind);
        if json.as_ref().is_some_and(|v| {
            v.get("context")
                .is_some_and(|c| c.as_array().is_some_and(|a| !a.is_empty()))
                || (echo.is_some() && carries_tokens(v))
        }) {
            return None;
        }
        let mut pieces: Vec<&str> = Vec::new();
        for &(s, e) in &self.masked {
            let m = text.get(s..e)?;
            for p in m.split('\n') {
                if !p.trim().is_empty() && !pieces.contains(&p) {
                    pieces.push(p);
                }
            }
        }
        pieces.sort_by_key(|p| std::cmp::Reverse(p.len()));
        let mut out = Vec::new();
        let mut copied = 0;
        let mut found = vec![false; pieces.len()];
        for (s, e) in string_values(&data) {
            let Ok(value) = serde_json::from_slice::<String>(&data[s..e]) else {
                continue;
            };
            for (f, p) in found.iter_mut().zip(&pieces) {
                *f |= value.contains(p);
            }
            let mut now = value.clone();
            if echo.is_some() && !now.is_empty() {
                let mut at = text.match_indices(value.as_str()).map(|(i, _)| i);
                if let (Some(p), None) = (at.next(), at.next()) {
                    now = masked_text(&value, p, &self.masked);
                }
            }
            for p in &pieces {
                if p.len() >= MIN_ECHO {
                    now = now.replace(p, &mask_of(p));
                }
            }
            if pieces
                .iter()
                .any(|p| (echo.is_some() || p.len() >= MIN_ECHO) && now.contains(p))
            {
                return None;
            }
            if now != value {
                out.extend_from_slice(&data[copied..s]);
                out.extend_from_slice(serde_json::to_string(&now).ok()?.as_bytes());
                copied = e;
            }
        }
        if echo == Some(Echo::Full) && found.contains(&false) {
            return None;
        }
        if copied == 0 {
            return Some(Frame::data(data));
        }
        out.extend_from_slice(&data[copied..]);
        Some(Frame::data(Bytes::from(out)))
    }

    /// Those of `findings` not reported before (a span that only grew is
    /// not new; another detector or source about the same text is), noted
    /// as reported now.
    fn unreported(&mut self, findings: &[Finding]) -> Vec<Finding> {
        let mut out = Vec::new();
        for f in findings {
            let source = source_of(f);
            let spans = if f.spans.is_empty() {
                vec![(usize::MAX, usize::MAX)]
            } else {
                f.spans.clone()
            };
            let seen = |&(s, e): &(usize, usize)| {
                self.reported.iter().any(|(d, src, (rs, re))| {
                    *d == f.detector
                        && *src == source
                        && ((s, e) == (*rs, *re) || (s < *re && *rs < e))
                })
            };
            if !spans.iter().all(seen) {
                out.push(f.clone());
            }
            for sp in spans {
                self.reported.push((f.detector, source.clone(), sp));
            }
        }
        out
    }

    /// Masks in the held events the spans of `findings` not masked before.
    /// Changes nothing unless every new span can be masked.
    fn apply(
        &mut self,
        findings: Vec<Finding>,
        text: &str,
        held: &mut VecDeque<Held>,
    ) -> Redaction {
        let spans = match verdict(Action::Redact, &findings) {
            Verdict::Pass => return Redaction::Nothing,
            Verdict::Block => return Redaction::Cut(self.unreported(&findings)),
            Verdict::Redact(spans) => spans,
        };
        let pieces: Vec<(usize, usize)> = spans
            .iter()
            .flat_map(|&s| subtract(s, &self.masked))
            .collect();
        let report = self.unreported(&findings);
        if pieces.is_empty() {
            // Masked already, perhaps found again by another detector.
            return if report.is_empty() {
                Redaction::Nothing
            } else {
                Redaction::Masked(report)
            };
        }
        // Already sent, or not answer text at all: it cannot be masked.
        if pieces.iter().any(|&(s, e)| {
            s < self.released
                || e > text.len()
                || !text.is_char_boundary(s)
                || !text.is_char_boundary(e)
        }) {
            return Redaction::Cut(report);
        }
        let mut masked = self.masked.clone();
        masked.extend_from_slice(&pieces);
        let masked = merge(masked);
        let mut rendered = Vec::new();
        for (i, h) in held.iter().enumerate() {
            // Events adding no text (an item's `done` echo between two
            // items' texts) are masked when released.
            if h.start == h.end || !pieces.iter().any(|&(s, e)| s < h.end && h.start < e) {
                continue;
            }
            let Some(data) = h.frame.data_ref() else {
                return Redaction::Cut(report);
            };
            // Tokens, tool-call arguments or signed thinking: masking the
            // text would leave it in clear or break the event.
            if event_json(data).is_some_and(|v| carries_tokens(&v) || unmaskable(&v)) {
                return Redaction::Cut(report);
            }
            match render(data, text, (h.start, h.end), &self.masked, &masked) {
                Some(bytes) => rendered.push((i, bytes)),
                None => return Redaction::Cut(report),
            }
        }
        for (i, bytes) in rendered {
            if let Some(h) = held.get_mut(i) {
                h.frame = Frame::data(Bytes::from(bytes));
            }
        }
        self.masked = masked;
        Redaction::Masked(report)
    }
}

/// Sorted, disjoint ranges covering the same as `ranges` (empty ones
/// dropped).
fn merge(mut ranges: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    ranges.retain(|&(s, e)| s < e);
    ranges.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (s, e) in ranges {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// The parts of `span` outside the sorted, disjoint `ranges`.
fn subtract(span: (usize, usize), ranges: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let (mut s, e) = span;
    let mut out = Vec::new();
    for &(rs, re) in ranges {
        if re <= s || rs >= e {
            continue;
        }
        if rs > s {
            out.push((s, rs));
        }
        s = s.max(re);
        if s >= e {
            break;
        }
    }
    if s < e {
        out.push((s, e));
    }
    out
}

/// `t` (answer text from byte `off` on) with each non-whitespace character
/// inside `ranges` replaced by `*`, as [`mask_of`] does.
fn masked_text(t: &str, off: usize, ranges: &[(usize, usize)]) -> String {
    t.char_indices()
        .map(|(i, c)| {
            let p = off + i;
            if !c.is_whitespace() && ranges.iter().any(|&(s, e)| s <= p && p < e) {
                '*'
            } else {
                c
            }
        })
        .collect()
}

/// One event's bytes with its text re-masked from `old` to `new` ranges.
/// The event's text is the one JSON string value in it that reads as the
/// text (as masked so far); `None` when there is not exactly one.
fn render(
    event: &[u8],
    text: &str,
    (start, end): (usize, usize),
    old: &[(usize, usize)],
    new: &[(usize, usize)],
) -> Option<Vec<u8>> {
    let unit = text.get(start..end)?;
    let mut targets = vec![(unit, start)];
    // The decoder puts a `\n` between the texts of different choices or
    // blocks; it is not in the event.
    if let Some(rest) = unit.strip_prefix('\n') {
        targets.push((rest, start + 1));
    }
    let literals = string_values(event);
    for (t, off) in targets {
        if t.is_empty() {
            continue;
        }
        let was = masked_text(t, off, old);
        let hits: Vec<(usize, usize)> = literals
            .iter()
            .copied()
            .filter(|&(s, e)| {
                serde_json::from_slice::<String>(&event[s..e]).is_ok_and(|v| v == was)
            })
            .collect();
        match hits.as_slice() {
            [] => continue,
            [(s, e)] => {
                let now = serde_json::to_string(&masked_text(t, off, new)).ok()?;
                let mut out = Vec::with_capacity(event.len());
                out.extend_from_slice(&event[..*s]);
                out.extend_from_slice(now.as_bytes());
                out.extend_from_slice(&event[*e..]);
                return Some(out);
            }
            _ => return None,
        }
    }
    None
}

/// The byte ranges (quotes included) of the JSON string literals in an SSE
/// event or NDJSON line that are values, not object keys. Comment lines
/// (`:` first) are skipped; a literal never spans lines.
fn string_values(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    let mut line_start = true;
    let mut comment = false;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'\n' || b == b'\r' {
            line_start = true;
            comment = false;
            i += 1;
            continue;
        }
        if line_start {
            line_start = false;
            comment = b == b':';
        }
        if comment || b != b'"' {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        let mut closed = None;
        while j < bytes.len() {
            match bytes[j] {
                b'\\' => j += 2,
                b'"' => {
                    closed = Some(j);
                    break;
                }
                b'\n' | b'\r' => break,
                _ => j += 1,
            }
        }
        let Some(j) = closed else {
            i = j.min(bytes.len());
            continue;
        };
        let next = bytes[j + 1..]
            .iter()
            .copied()
            .find(|c| !matches!(c, b' ' | b'\t'));
        if next != Some(b':') {
            out.push((i, j + 1));
        }
        i = j + 1;
    }
    out
}

pin_project! {
    /// See the module documentation.
    pub struct GuardBody<B> {
        #[pin]
        inner: B,
        decoder: ResponseDecoder,
        output: Output,
        // Frames not yet released, each with the answer text decoded from it.
        held: VecDeque<Held>,
        // Answer text covered by the last clean scan.
        scanned: usize,
        scan: ScanFn,
        in_flight: Option<(JoinHandle<Result<Vec<Finding>, ()>>, usize, bool)>,
        guard: Guard,
        redactor: Redactor,
        upstream_done: bool,
        // The final scan passed, or checking was given up (fail open): every
        // held frame may go.
        finished: bool,
        blocked_event: Option<Bytes>,
        on_findings: Option<OnFindings>,
        on_fail: Option<OnFail>,
        done: bool,
    }
}

impl<B> GuardBody<B> {
    pub fn new(
        inner: B,
        endpoint: Endpoint,
        format: BodyFormat,
        guard: Guard,
        scan: ScanFn,
        on_findings: OnFindings,
        on_fail: OnFail,
    ) -> Self {
        let error = error_event(
            endpoint.family(),
            format,
            "cross_tenant_leak",
            "this answer was stopped because it carried another tenant's data",
        );
        // SGLang streams resend the whole text so far in every event: a span
        // masked in one would be sent whole in the next. Those are cut, and
        // so are answers whose tokens come again as log probabilities.
        let redact = guard.action == Action::Redact
            && endpoint.family() != Family::Sglang
            && !guard.logprobs;
        GuardBody {
            inner,
            decoder: ResponseDecoder::new(endpoint, format, guard.max_text),
            output: Output::default(),
            held: VecDeque::new(),
            scanned: 0,
            scan,
            in_flight: None,
            guard,
            redactor: Redactor {
                on: redact,
                ..Redactor::default()
            },
            upstream_done: false,
            finished: false,
            blocked_event: Some(error),
            on_findings: Some(on_findings),
            on_fail: Some(on_fail),
            done: false,
        }
    }
}

impl<B> Body for GuardBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        // The answer cannot be checked: cut it (fail closed: the error event
        // to send) or stop guarding and let every frame go (fail open).
        macro_rules! give_up {
            () => {{
                if this.guard.fail_closed {
                    this.held.clear();
                    this.redactor.pending.clear();
                    *this.done = true;
                    if let Some(f) = this.on_fail.take() {
                        f(true);
                    }
                    this.blocked_event.take()
                } else {
                    *this.finished = true;
                    this.redactor.flush(this.held, this.output.text.len());
                    if let Some(f) = this.on_fail.take() {
                        f(false);
                    }
                    None
                }
            }};
        }
        // Drop what is held and end with the error event, reporting `findings`.
        macro_rules! cut {
            ($findings:expr) => {{
                this.held.clear();
                this.redactor.pending.clear();
                *this.done = true;
                if let Some(mut report) = this.on_findings.take() {
                    report($findings, "block");
                }
                let event = this.blocked_event.take().unwrap_or_default();
                return Poll::Ready(Some(Ok(Frame::data(event))));
            }};
        }
        loop {
            if *this.done {
                return Poll::Ready(None);
            }
            // 1. Release a frame once enough clean, scanned text follows it.
            if let Some(front) = this.held.front() {
                let end = front.end;
                let safe = *this.finished
                    || (end + this.guard.hold_back <= *this.scanned
                        && this.output.text.get(end..*this.scanned).is_some_and(|t| {
                            token_weight(t) >= this.guard.hold_back_tokens as f64
                        }));
                if safe {
                    if let Some(h) = this.held.pop_front() {
                        let frame = if this.redactor.on {
                            match this.redactor.release(h, &this.output.text) {
                                Some(frame) => frame,
                                None => cut!(Vec::new()),
                            }
                        } else {
                            h.frame
                        };
                        return Poll::Ready(Some(Ok(frame)));
                    }
                }
            } else if *this.finished && *this.upstream_done {
                *this.done = true;
                return Poll::Ready(None);
            }

            // 2. A scan in flight: wait for it, reading on meanwhile.
            if let Some((handle, upto, last)) = this.in_flight.as_mut() {
                let outcome = match Pin::new(handle).poll(cx) {
                    Poll::Pending => {
                        if !*this.upstream_done {
                            if let Poll::Ready(r) = read_one(
                                this.inner.as_mut(),
                                cx,
                                this.decoder,
                                this.output,
                                this.held,
                                this.redactor,
                                *this.finished,
                                this.upstream_done,
                            ) {
                                if let Some(e) = r {
                                    return Poll::Ready(Some(Err(e)));
                                }
                                continue;
                            }
                        }
                        return Poll::Pending;
                    }
                    // A scanner that panicked could not check the answer.
                    Poll::Ready(r) => r.unwrap_or(Err(())),
                };
                let (upto, last) = (*upto, *last);
                *this.in_flight = None;
                match outcome {
                    Ok(findings) if !findings.is_empty() && !this.redactor.on => cut!(findings),
                    Ok(findings) if !findings.is_empty() => {
                        match this.redactor.apply(findings, &this.output.text, this.held) {
                            Redaction::Cut(findings) => cut!(findings),
                            Redaction::Masked(report) if report.is_empty() => {}
                            Redaction::Masked(report) => {
                                if let Some(f) = this.on_findings.as_mut() {
                                    f(report, "redact");
                                }
                            }
                            Redaction::Nothing => {}
                        }
                        *this.scanned = upto;
                        if last {
                            *this.finished = true;
                        }
                    }
                    Ok(_) => {
                        *this.scanned = upto;
                        if last {
                            *this.finished = true;
                        }
                    }
                    Err(()) => {
                        if let Some(e) = give_up!() {
                            return Poll::Ready(Some(Ok(Frame::data(e))));
                        }
                    }
                }
                continue;
            }

            // 3. Start a scan when enough new text arrived, or at the end.
            if !*this.finished {
                let len = this.output.text.len();
                if len > this.guard.max_text
                    || this.output.truncated
                    || this.output.malformed > 0
                    || this.output.interleaved
                {
                    // Text the guard cannot see in full — or choices whose
                    // tokens arrive shuffled together — cannot be vouched for.
                    if let Some(e) = give_up!() {
                        return Poll::Ready(Some(Ok(Frame::data(e))));
                    }
                    continue;
                }
                // Rescans grow geometrically: O(n log n) over a long answer.
                let step = (this.guard.hold_back / 4).max(len / 8).max(16);
                if len >= *this.scanned + step || *this.upstream_done {
                    let last = *this.upstream_done;
                    let text = this.output.text.clone();
                    let scan = this.scan.clone();
                    let handle = tokio::task::spawn_blocking(move || scan(text, last));
                    *this.in_flight = Some((handle, len, last));
                    continue;
                }
            } else if *this.upstream_done && this.held.is_empty() {
                *this.done = true;
                return Poll::Ready(None);
            }

            // 4. Read more from the upstream.
            if *this.upstream_done {
                // Everything is read; frames wait for the scan above.
                continue;
            }
            match read_one(
                this.inner.as_mut(),
                cx,
                this.decoder,
                this.output,
                this.held,
                this.redactor,
                *this.finished,
                this.upstream_done,
            ) {
                Poll::Ready(Some(e)) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => continue,
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        false
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Reads one frame from the upstream into the held queue. `Ready(Some(e))`
/// on an upstream error, `Ready(None)` after a frame or the end. In redact
/// mode, until checking is over (`finished`), data is held as whole events.
#[allow(clippy::too_many_arguments)]
fn read_one<B>(
    inner: Pin<&mut B>,
    cx: &mut Context<'_>,
    decoder: &mut ResponseDecoder,
    output: &mut Output,
    held: &mut VecDeque<Held>,
    redactor: &mut Redactor,
    finished: bool,
    upstream_done: &mut bool,
) -> Poll<Option<BoxError>>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let by_event = redactor.on && !finished;
    match inner.poll_frame(cx) {
        Poll::Pending => Poll::Pending,
        Poll::Ready(None) => {
            decoder.finish(output);
            if redactor.on {
                redactor.flush(held, output.text.len());
            }
            *upstream_done = true;
            Poll::Ready(None)
        }
        Poll::Ready(Some(Err(e))) => Poll::Ready(Some(e.into())),
        Poll::Ready(Some(Ok(frame))) => {
            let start = output.text.len();
            if by_event {
                if let Some(data) = frame.data_ref() {
                    redactor.push(data, decoder, output, held);
                    return Poll::Ready(None);
                }
                // Trailers: after whatever event bytes came before them.
                redactor.flush(held, output.text.len());
            } else if let Some(data) = frame.data_ref() {
                decoder.push(data, output);
            }
            held.push_back(Held {
                frame,
                start,
                end: output.text.len(),
            });
            Poll::Ready(None)
        }
    }
}

pin_project! {
    /// Frames already read, then the rest of the body: how an answer too
    /// large to hold goes out when failing open.
    pub struct Prefixed<B> {
        prefix: VecDeque<Bytes>,
        #[pin]
        rest: B,
    }
}

impl<B> Prefixed<B> {
    pub fn new(prefix: Vec<Bytes>, rest: B) -> Self {
        Prefixed {
            prefix: prefix.into(),
            rest,
        }
    }
}

impl<B> Body for Prefixed<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if let Some(b) = this.prefix.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        this.rest
            .poll_frame(cx)
            .map(|f| f.map(|r| r.map_err(Into::into)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::Severity;

    fn finding(spans: Vec<(usize, usize)>) -> Finding {
        Finding {
            detector: "x",
            severity: Severity::High,
            score: 1.0,
            evidence: serde_json::json!({}),
            spans,
        }
    }

    #[test]
    fn token_weight_never_counts_more_words_than_the_detectors() {
        for (text, want) in [
            ("", 0.0),
            ("one two  three", 3.0),
            ("ledger_entry_0001 next", 2.0),
            ("a — b — c", 3.0),
            ("foo,bar", 1.0),
            ("你好世界", 2.4),
            ("hi你好", 2.2),
            // Punctuation between CJK characters is no token of theirs.
            ("你好。世界！", 2.4),
        ] {
            assert!(
                (token_weight(text) - want).abs() < 1e-9,
                "{text:?}: {}",
                token_weight(text)
            );
        }
    }

    #[test]
    fn verdicts() {
        assert_eq!(verdict(Action::Block, &[]), Verdict::Pass);
        assert_eq!(
            verdict(Action::Monitor, &[finding(vec![(1, 2)])]),
            Verdict::Pass
        );
        assert_eq!(
            verdict(Action::Block, &[finding(vec![(1, 2)])]),
            Verdict::Block
        );
        assert_eq!(
            verdict(
                Action::Redact,
                &[finding(vec![(5, 9)]), finding(vec![(1, 3), (2, 6)])]
            ),
            Verdict::Redact(vec![(1, 9)])
        );
        assert_eq!(
            verdict(Action::Redact, &[finding(vec![(1, 2)]), finding(vec![])]),
            Verdict::Block
        );
    }

    #[test]
    fn redaction_masks_exactly_the_span_in_json() {
        let text = "Call \"Jane\" at jane@x.example now";
        let body =
            serde_json::to_vec(&serde_json::json!({"choices": [{"message": {"content": text}}]}))
                .unwrap();
        let start = text.find("jane@").unwrap();
        let out = redact_json(&body, text, &[(start, start + "jane@x.example".len())]).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v["choices"][0]["message"]["content"],
            "Call \"Jane\" at ************** now"
        );
        // A span with an escaped quote inside.
        let out = redact_json(&body, text, &[(5, 11)]).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v["choices"][0]["message"]["content"],
            "Call ****** at jane@x.example now"
        );
        // Not in the body as written: None.
        assert!(redact_json(b"{}", text, &[(0, 4)]).is_none());
        assert!(redact_json(&body, text, &[(0, 999)]).is_none());
    }

    // === redact mode on streams ===

    /// A body yielding the given frames, each after `gap` (if any).
    struct Frames {
        frames: VecDeque<Bytes>,
        gap: Option<std::time::Duration>,
        sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    }

    impl Frames {
        fn new(frames: Vec<Bytes>) -> Self {
            Frames {
                frames: frames.into(),
                gap: None,
                sleep: None,
            }
        }
    }

    impl Body for Frames {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if let Some(gap) = self.gap {
                let sleep = self
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(gap)));
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            Poll::Ready(self.frames.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }

    /// `body` cut into frames of `size` bytes (mid-character too).
    fn split(body: &[u8], size: usize) -> Vec<Bytes> {
        body.chunks(size).map(Bytes::copy_from_slice).collect()
    }

    fn openai_event(content: &str) -> String {
        let v = serde_json::json!({"choices": [{"index": 0, "delta": {"content": content}}]});
        format!("data: {v}\n\n")
    }

    /// The reports a guard made: (action, number of findings).
    type Reports = Arc<std::sync::Mutex<Vec<(&'static str, usize)>>>;

    /// Runs `frames` through a redacting guard whose scanner finds every
    /// occurrence of each needle; returns what the client gets and the
    /// reports.
    async fn guarded(
        endpoint: Endpoint,
        format: BodyFormat,
        frames: Vec<Bytes>,
        needles: &[&str],
        hold_back: usize,
        fail_closed: bool,
    ) -> (Vec<u8>, Vec<(&'static str, usize)>) {
        use http_body_util::BodyExt;
        let needles: Vec<String> = needles.iter().map(|n| n.to_string()).collect();
        let scan: ScanFn = Arc::new(move |text: String, _last: bool| {
            Ok(needles
                .iter()
                .flat_map(|n| {
                    text.match_indices(n.as_str())
                        .map(|(i, m)| (i, i + m.len()))
                })
                .map(|span| finding(vec![span]))
                .collect())
        });
        let reports: Reports = Arc::default();
        let r = reports.clone();
        let on_findings: OnFindings = Box::new(move |f, action| {
            r.lock().unwrap().push((action, f.len()));
        });
        let guard = Guard {
            hold_back,
            hold_back_tokens: 1,
            max_text: 1 << 20,
            fail_closed,
            action: Action::Redact,
            logprobs: false,
        };
        let body = GuardBody::new(
            Frames::new(frames),
            endpoint,
            format,
            guard,
            scan,
            on_findings,
            Box::new(|_| {}),
        );
        let out = body.collect().await.unwrap().to_bytes().to_vec();
        let reports = reports.lock().unwrap().clone();
        (out, reports)
    }

    /// The answer text a client reassembles from OpenAI chat SSE events.
    fn openai_text(sse: &[u8]) -> String {
        String::from_utf8_lossy(sse)
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
            .filter_map(|v| {
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    }

    fn tail() -> String {
        (0..40)
            .map(|i| openai_event(&format!(" word{i}")))
            .collect()
    }

    #[tokio::test]
    async fn redact_masks_a_span_straddling_two_sse_events() {
        let body = format!(
            "{}{}{}{}{}data: [DONE]\n\n",
            openai_event("Write to "),
            openai_event("jane@"),
            openai_event("x.example"),
            openai_event(" now."),
            tail()
        );
        for size in [1, 7, 64, body.len()] {
            let (out, reports) = guarded(
                Endpoint::OpenAiChat,
                BodyFormat::Sse,
                split(body.as_bytes(), size),
                &["jane@x.example"],
                16,
                false,
            )
            .await;
            // Byte-identical but for the masked strings.
            let want = body
                .replace("\"jane@\"", "\"*****\"")
                .replace("\"x.example\"", "\"*********\"");
            assert_eq!(String::from_utf8_lossy(&out), want, "frames of {size}");
            assert!(openai_text(&out).starts_with("Write to ************** now. word0"));
            // Found again by every later scan, reported once.
            assert_eq!(reports, vec![("redact", 1)], "frames of {size}");
        }
    }

    #[tokio::test]
    async fn redact_masks_a_span_split_mid_character_across_frames() {
        let secret = "josé.ñúñez@exámple.org";
        let body = format!(
            "{}{}{}{}data: [DONE]\n\n",
            openai_event("Contact: "),
            openai_event(&format!("{secret}, ")),
            openai_event("or ask me."),
            tail()
        );
        let bytes = body.as_bytes();
        // Cut inside the two-byte "é".
        let at = body.find('é').unwrap() + 1;
        assert!(!body.is_char_boundary(at));
        let frames = vec![
            Bytes::copy_from_slice(&bytes[..at]),
            Bytes::copy_from_slice(&bytes[at..]),
        ];
        for frames in [frames, split(bytes, 3)] {
            let (out, reports) = guarded(
                Endpoint::OpenAiChat,
                BodyFormat::Sse,
                frames,
                &[secret],
                16,
                false,
            )
            .await;
            let mask = "*".repeat(secret.chars().count());
            assert!(
                openai_text(&out).starts_with(&format!("Contact: {mask}, or ask me.")),
                "{}",
                openai_text(&out)
            );
            assert!(!String::from_utf8_lossy(&out).contains("exámple"));
            assert!(out.ends_with(b"data: [DONE]\n\n"));
            assert_eq!(reports, vec![("redact", 1)]);
        }
    }

    #[tokio::test]
    async fn redact_masks_an_ndjson_stream() {
        let line = |content: &str| {
            let v = serde_json::json!({"model": "m", "message": {"role": "assistant", "content": content}, "done": false});
            format!("{v}\n")
        };
        let mut body = line("Mail ") + &line("jane.doe@x.") + &line("example please");
        for i in 0..40 {
            body += &line(&format!(" w{i}"));
        }
        body += "{\"model\":\"m\",\"done\":true,\"eval_count\":44}\n";
        let (out, reports) = guarded(
            Endpoint::OllamaChat,
            BodyFormat::Ndjson,
            split(body.as_bytes(), 5),
            &["jane.doe@x.example"],
            16,
            false,
        )
        .await;
        let want = body
            .replace("\"jane.doe@x.\"", "\"***********\"")
            .replace("\"example please\"", "\"******* please\"");
        assert_eq!(String::from_utf8_lossy(&out), want);
        assert_eq!(reports, vec![("redact", 1)]);
    }

    #[tokio::test]
    async fn a_span_beginning_in_released_text_cuts_the_stream() {
        // The scanner only recognises the leak once "TRIGGER" arrives, long
        // after the leak's first word was released.
        let body = format!(
            "{}{}{}{}data: [DONE]\n\n",
            openai_event("secretstart "),
            tail(),
            openai_event(" TRIGGER"),
            tail()
        );
        let scan_needles = ["secretstart"];
        use http_body_util::BodyExt;
        let scan: ScanFn = Arc::new(move |text: String, _| {
            if !text.contains("TRIGGER") {
                return Ok(Vec::new());
            }
            let s = text.find(scan_needles[0]).unwrap();
            let e = text.find("TRIGGER").unwrap() + "TRIGGER".len();
            Ok(vec![finding(vec![(s, e)])])
        });
        let reports: Reports = Arc::default();
        let r = reports.clone();
        let guard = Guard {
            hold_back: 16,
            hold_back_tokens: 1,
            max_text: 1 << 20,
            fail_closed: false,
            action: Action::Redact,
            logprobs: false,
        };
        let mut frames = Frames::new(split(body.as_bytes(), 40));
        // Slow enough for each scan to end before the next frame.
        frames.gap = Some(std::time::Duration::from_millis(3));
        let out = GuardBody::new(
            frames,
            Endpoint::OpenAiChat,
            BodyFormat::Sse,
            guard,
            scan,
            Box::new(move |f, action| r.lock().unwrap().push((action, f.len()))),
            Box::new(|_| {}),
        )
        .collect()
        .await
        .unwrap()
        .to_bytes();
        let got = String::from_utf8_lossy(&out);
        assert!(got.starts_with(&openai_event("secretstart ")), "{got}");
        assert!(!got.contains("TRIGGER"), "{got}");
        assert!(!got.contains("[DONE]"), "{got}");
        assert!(got.ends_with(&*String::from_utf8_lossy(&error_event(
            Family::OpenAi,
            BodyFormat::Sse,
            "cross_tenant_leak",
            "this answer was stopped because it carried another tenant's data"
        ))));
        assert_eq!(*reports.lock().unwrap(), vec![("block", 1)]);
    }

    #[tokio::test]
    async fn a_span_that_cannot_be_placed_in_its_event_cuts_the_stream() {
        // The leaked text is two string values of one event: which one is
        // the answer's cannot be told, so nothing is guessed.
        let v = serde_json::json!({"choices": [{"index": 0, "delta": {"content": "jane@x.example"}}], "echo": "jane@x.example"});
        let body = format!(
            "{}data: {v}\n\n{}data: [DONE]\n\n",
            openai_event("Hi "),
            tail()
        );
        let (out, reports) = guarded(
            Endpoint::OpenAiChat,
            BodyFormat::Sse,
            split(body.as_bytes(), 16),
            &["jane@x.example"],
            16,
            false,
        )
        .await;
        let got = String::from_utf8_lossy(&out);
        assert!(!got.contains("jane@"), "{got}");
        assert!(got.contains("cross_tenant_leak"), "{got}");
        assert_eq!(reports, vec![("block", 1)]);
    }

    #[tokio::test]
    async fn a_masked_span_repeated_in_a_summary_event_is_masked_there_too() {
        // TGI's last event repeats the whole text in `generated_text`.
        let ev = |text: &str, full: Option<&str>| {
            let v = serde_json::json!({"token": {"id": 1, "text": text, "special": false}, "generated_text": full});
            format!("data:{v}\n\n")
        };
        let mut body = ev("Write ", None) + &ev("jane@x.example", None);
        let mut full = "Write jane@x.example".to_string();
        for i in 0..40 {
            body += &ev(&format!(" w{i}"), None);
            full += &format!(" w{i}");
        }
        body += &ev(".", Some(&format!("{full}.")));
        let (out, reports) = guarded(
            Endpoint::TgiGenerateStream,
            BodyFormat::Sse,
            split(body.as_bytes(), 9),
            &["jane@x.example"],
            16,
            false,
        )
        .await;
        let got = String::from_utf8_lossy(&out);
        assert!(!got.contains("jane@"), "{got}");
        assert_eq!(got, body.replace("jane@x.example", "**************"));
        assert_eq!(reports, vec![("redact", 1)]);
        // The same, with the summary escaped otherwise ("@" as \u0040).
        let (head, last) = body.split_at(body.rfind("data:").unwrap());
        let escaped = format!("{head}{}", last.replace('@', "\\u0040"));
        let (out, _) = guarded(
            Endpoint::TgiGenerateStream,
            BodyFormat::Sse,
            split(escaped.as_bytes(), 9),
            &["jane@x.example"],
            16,
            false,
        )
        .await;
        let got = String::from_utf8_lossy(&out);
        assert!(!got.contains("jane"), "{got}");
        assert!(
            got.contains("\"generated_text\":\"Write ************** w0"),
            "{got}"
        );
    }

    #[tokio::test]
    async fn garbage_in_redact_mode_fails_open_or_closed_without_panicking() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut bytes = Vec::new();
        for _ in 0..4096 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            bytes.push(match seed % 7 {
                0 => b'\n',
                1 => b'"',
                2 => b'\\',
                3 => b'\r',
                _ => (seed >> 8) as u8,
            });
        }
        let malformed = format!(
            "{}data: {{\"choices\": [{{\"delta\": {{\"content\": \"jane@x\n\ndata: \"\\\n\n{}",
            openai_event("jane@x.example"),
            tail()
        );
        for body in [bytes.clone(), malformed.into_bytes()] {
            for endpoint in [
                Endpoint::OpenAiChat,
                Endpoint::AnthropicMessages,
                Endpoint::OllamaChat,
            ] {
                for format in [BodyFormat::Sse, BodyFormat::Ndjson] {
                    let needles = ["jane@", "\""];
                    let frames = split(&body, 13);
                    let (open, reports) =
                        guarded(endpoint, format, frames.clone(), &needles, 16, false).await;
                    if reports.is_empty() {
                        assert_eq!(open, body, "{endpoint:?} {format:?}");
                    }
                    let (closed, _) = guarded(endpoint, format, frames, &needles, 16, true).await;
                    let cut = error_event(
                        endpoint.family(),
                        format,
                        "cross_tenant_leak",
                        "this answer was stopped because it carried another tenant's data",
                    );
                    assert!(
                        closed == body || closed.ends_with(&cut),
                        "{endpoint:?} {format:?}: {}",
                        String::from_utf8_lossy(&closed)
                    );
                }
            }
        }
        // The helpers themselves, on arbitrary bytes.
        for w in bytes.chunks(97) {
            let _ = string_values(w);
            let _ = render(w, "jane@x.example", (0, 14), &[], &[(0, 5)]);
        }
    }

    /// Runs `frames` through a redacting guard with the given scanner.
    async fn guarded_by(
        endpoint: Endpoint,
        format: BodyFormat,
        frames: Vec<Bytes>,
        scan: ScanFn,
        hold_back: usize,
        logprobs: bool,
    ) -> (Vec<u8>, Vec<(&'static str, usize)>) {
        use http_body_util::BodyExt;
        let reports: Reports = Arc::default();
        let r = reports.clone();
        let guard = Guard {
            hold_back,
            hold_back_tokens: 1,
            max_text: 1 << 20,
            fail_closed: false,
            action: Action::Redact,
            logprobs,
        };
        let out = GuardBody::new(
            Frames::new(frames),
            endpoint,
            format,
            guard,
            scan,
            Box::new(move |f, action| r.lock().unwrap().push((action, f.len()))),
            Box::new(|_| {}),
        )
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
        let reports = reports.lock().unwrap().clone();
        (out, reports)
    }

    fn found(detector: &'static str, spans: Vec<(usize, usize)>) -> Finding {
        Finding {
            detector,
            ..finding(spans)
        }
    }

    fn cut_event(endpoint: Endpoint, format: BodyFormat) -> String {
        String::from_utf8_lossy(&error_event(
            endpoint.family(),
            format,
            "cross_tenant_leak",
            "this answer was stopped because it carried another tenant's data",
        ))
        .into_owned()
    }

    fn tgi_event(text: &str, full: Option<&str>) -> String {
        let v = serde_json::json!({"token": {"id": 1, "text": text, "special": false}, "generated_text": full});
        format!("data:{v}\n\n")
    }

    /// A TGI stream of `pieces`, 40 words, "." and the summary event.
    fn tgi_body(pieces: &[&str], summary_prefix: &str) -> String {
        let mut body = String::new();
        let mut full = String::new();
        for p in pieces {
            body += &tgi_event(p, None);
            full += p;
        }
        for i in 0..40 {
            body += &tgi_event(&format!(" w{i}"), None);
            full += &format!(" w{i}");
        }
        body + &tgi_event(".", Some(&format!("{summary_prefix}{full}.")))
    }

    #[tokio::test]
    async fn a_span_that_grows_between_scans_is_masked_whole_in_the_summary() {
        // The first scan finds "secretalpha", later ones the whole run
        // "secretalpha secretbeta": both masks must reach `generated_text`.
        let body = tgi_body(&["Write ", "secretalpha", " secretbeta"], "");
        let grown = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let scan: ScanFn = Arc::new(move |text: String, _| {
            let Some(s) = text.find("secretalpha") else {
                return Ok(Vec::new());
            };
            let long = text.contains("secretalpha secretbeta")
                && grown.swap(true, std::sync::atomic::Ordering::SeqCst);
            let e = s + if long { 22 } else { 11 };
            grown.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(vec![finding(vec![(s, e)])])
        });
        let (out, reports) = guarded_by(
            Endpoint::TgiGenerateStream,
            BodyFormat::Sse,
            split(body.as_bytes(), 9),
            scan,
            200,
            false,
        )
        .await;
        let got = String::from_utf8_lossy(&out);
        assert!(!got.contains("secret"), "{got}");
        let want = body
            .replace("secretalpha", "***********")
            .replace("secretbeta", "**********");
        assert_eq!(got, want);
        assert_eq!(reports, vec![("redact", 1)]);
    }

    #[tokio::test]
    async fn a_span_across_two_output_items_is_masked_in_their_echoes() {
        // Responses API: the leak ends item 0 and begins item 1; the decoder
        // joins them with "\n", which no echo event holds.
        let ev =
            |v: serde_json::Value| format!("event: {}\ndata: {v}\n\n", v["type"].as_str().unwrap());
        let delta = |item: u64, d: &str| {
            ev(
                serde_json::json!({"type": "response.output_text.delta", "output_index": item, "content_index": 0, "delta": d}),
            )
        };
        let done = |item: u64, t: &str| {
            ev(
                serde_json::json!({"type": "response.output_text.done", "output_index": item, "content_index": 0, "text": t, "logprobs": []}),
            )
        };
        let item0 = "Intro secretalpha".to_string();
        let mut item1 = "secretbeta".to_string();
        let mut body = delta(0, "Intro ") + &delta(0, "secretalpha") + &done(0, &item0);
        body += &delta(1, "secretbeta");
        for i in 0..40 {
            body += &delta(1, &format!(" w{i}"));
            item1 += &format!(" w{i}");
        }
        body += &done(1, &item1);
        let msg = |t: &str| serde_json::json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": t}]});
        body += &ev(
            serde_json::json!({"type": "response.completed", "response": {"status": "completed", "output": [msg(&item0), msg(&item1)]}}),
        );
        let (out, reports) = guarded(
            Endpoint::OpenAiResponses,
            BodyFormat::Sse,
            split(body.as_bytes(), 11),
            &["secretalpha\nsecretbeta"],
            400,
            false,
        )
        .await;
        let got = String::from_utf8_lossy(&out);
        assert!(!got.contains("secret"), "{got}");
        let want = body
            .replace("secretalpha", "***********")
            .replace("secretbeta", "**********");
        assert_eq!(got, want);
        assert_eq!(reports, vec![("redact", 1)]);
    }

    #[tokio::test]
    async fn a_short_masked_span_never_reaches_the_summary() {
        // "1.2.3.4" is shorter than MIN_ECHO: the summary is the whole
        // answer, so it is masked there by position.
        let body = tgi_body(&["Ping ", "1.2.3.4", " now"], "");
        let (out, reports) = guarded(
            Endpoint::TgiGenerateStream,
            BodyFormat::Sse,
            split(body.as_bytes(), 9),
            &["1.2.3.4"],
            16,
            false,
        )
        .await;
        let got = String::from_utf8_lossy(&out);
        assert_eq!(got, body.replace("1.2.3.4", "*******"));
        assert_eq!(reports, vec![("redact", 1)]);
        // A summary that is not the answer as decoded (the prompt before it):
        // it cannot be placed, so the stream is cut before it.
        let body = tgi_body(&["Ping ", "1.2.3.4", " now"], "Prompt? ");
        let (out, _) = guarded(
            Endpoint::TgiGenerateStream,
            BodyFormat::Sse,
            split(body.as_bytes(), 9),
            &["1.2.3.4"],
            16,
            false,
        )
        .await;
        let got = String::from_utf8_lossy(&out);
        assert!(!got.contains("1.2.3.4"), "{got}");
        assert!(
            got.ends_with(&cut_event(Endpoint::TgiGenerateStream, BodyFormat::Sse)),
            "{got}"
        );
    }

    #[tokio::test]
    async fn answers_carried_as_tokens_too_are_cut_not_masked() {
        let cut = cut_event(Endpoint::OpenAiChat, BodyFormat::Sse);
        // Log probabilities in the event to be masked.
        let lp = serde_json::json!({"choices": [{"index": 0, "delta": {"content": "jane@x.example"},
            "logprobs": {"content": [{"token": "jane@x.example", "logprob": -0.1,
            "bytes": [106, 97, 110, 101], "top_logprobs": []}]}}]});
        let body = format!(
            "{}data: {lp}\n\n{}data: [DONE]\n\n",
            openai_event("Hi "),
            tail()
        );
        let (out, reports) = guarded(
            Endpoint::OpenAiChat,
            BodyFormat::Sse,
            split(body.as_bytes(), 16),
            &["jane@x.example"],
            16,
            false,
        )
        .await;
        let got = String::from_utf8_lossy(&out);
        assert!(!got.contains("jane@"), "{got}");
        assert!(!got.contains("106, 97") && !got.contains("106,97"), "{got}");
        assert!(got.ends_with(&cut), "{got}");
        assert_eq!(reports, vec![("block", 1)]);
        // Log probabilities asked for: the guard does not redact at all.
        let body = format!(
            "{}{}{}data: [DONE]\n\n",
            openai_event("Hi "),
            openai_event("jane@x.example"),
            tail()
        );
        let scan: ScanFn = Arc::new(|text: String, _| {
            Ok(text
                .find("jane@x.example")
                .map(|s| finding(vec![(s, s + 14)]))
                .into_iter()
                .collect())
        });
        let (out, reports) = guarded_by(
            Endpoint::OpenAiChat,
            BodyFormat::Sse,
            split(body.as_bytes(), 16),
            scan,
            16,
            true,
        )
        .await;
        let got = String::from_utf8_lossy(&out);
        assert!(!got.contains("jane@") && !got.contains("****"), "{got}");
        assert!(got.ends_with(&cut), "{got}");
        assert_eq!(reports, vec![("block", 1)]);
        // Ollama's last line carries the answer's token ids as `context`.
        let line = |r: &str| {
            format!(
                "{}\n",
                serde_json::json!({"model": "m", "response": r, "done": false})
            )
        };
        let mut body = line("Mail ") + &line("jane@x.example");
        for i in 0..40 {
            body += &line(&format!(" w{i}"));
        }
        body += "{\"model\":\"m\",\"done\":true,\"context\":[1,2,3]}\n";
        let (out, reports) = guarded(
            Endpoint::OllamaGenerate,
            BodyFormat::Ndjson,
            split(body.as_bytes(), 7),
            &["jane@x.example"],
            16,
            false,
        )
        .await;
        let got = String::from_utf8_lossy(&out);
        assert!(!got.contains("jane@") && !got.contains("context"), "{got}");
        assert!(
            got.ends_with(&cut_event(Endpoint::OllamaGenerate, BodyFormat::Ndjson)),
            "{got}"
        );
        assert_eq!(reports, vec![("redact", 1), ("block", 0)]);
    }

    #[tokio::test]
    async fn tool_call_arguments_and_thinking_are_cut_not_masked() {
        let args = serde_json::json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
            "function": {"arguments": "jane@x.example"}}]}}]});
        let body = format!(
            "{}data: {args}\n\n{}data: [DONE]\n\n",
            openai_event("Hi "),
            tail()
        );
        let (out, reports) = guarded(
            Endpoint::OpenAiChat,
            BodyFormat::Sse,
            split(body.as_bytes(), 16),
            &["jane@x.example"],
            16,
            false,
        )
        .await;
        let got = String::from_utf8_lossy(&out);
        assert!(!got.contains("jane@") && !got.contains("****"), "{got}");
        assert!(
            got.ends_with(&cut_event(Endpoint::OpenAiChat, BodyFormat::Sse)),
            "{got}"
        );
        assert_eq!(reports, vec![("block", 1)]);
        // Anthropic thinking is signed: masking it would break the signature.
        let ev =
            |v: serde_json::Value| format!("event: {}\ndata: {v}\n\n", v["type"].as_str().unwrap());
        let delta = |kind: &str, key: &str, t: &str| {
            ev(
                serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": kind, key: t}}),
            )
        };
        let mut body = ev(
            serde_json::json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        );
        body += &delta("thinking_delta", "thinking", "Mail ");
        body += &delta("thinking_delta", "thinking", "jane@x.example");
        for i in 0..40 {
            body += &delta("thinking_delta", "thinking", &format!(" w{i}"));
        }
        body += &ev(serde_json::json!({"type": "message_stop"}));
        let (out, reports) = guarded(
            Endpoint::AnthropicMessages,
            BodyFormat::Sse,
            split(body.as_bytes(), 16),
            &["jane@x.example"],
            16,
            false,
        )
        .await;
        let got = String::from_utf8_lossy(&out);
        assert!(!got.contains("jane@") && !got.contains("****"), "{got}");
        assert!(
            got.ends_with(&cut_event(Endpoint::AnthropicMessages, BodyFormat::Sse)),
            "{got}"
        );
        assert_eq!(reports, vec![("block", 1)]);
    }

    #[tokio::test]
    async fn each_detector_and_source_is_reported_once_whatever_overlaps() {
        let body = format!(
            "{}{}{}data: [DONE]\n\n",
            openai_event("Write to "),
            openai_event("jane@x.example now"),
            tail()
        );
        // Another detector, later, about text partly masked already: its
        // own incident. The growing span of the first is not a new one.
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let c = calls.clone();
        let scan: ScanFn = Arc::new(move |text: String, _| {
            let Some(s) = text.find("jane@") else {
                return Ok(Vec::new());
            };
            let n = c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut out = vec![found("pii", vec![(s, s + 5 + n.min(1) * 9)])];
            if n > 0 {
                out.push(found("canary", vec![(s + 6, s + 18)]));
            }
            Ok(out)
        });
        let (out, reports) = guarded_by(
            Endpoint::OpenAiChat,
            BodyFormat::Sse,
            split(body.as_bytes(), 200),
            scan,
            200,
            false,
        )
        .await;
        assert!(calls.load(std::sync::atomic::Ordering::SeqCst) > 1);
        assert!(openai_text(&out).starts_with("Write to ************** *** word0"));
        assert_eq!(reports, vec![("redact", 1), ("redact", 1)]);
        // A cut after a redaction reports only what was not reported yet.
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let c = calls.clone();
        let scan: ScanFn = Arc::new(move |text: String, _| {
            let Some(s) = text.find("jane@") else {
                return Ok(Vec::new());
            };
            let mut out = vec![found("pii", vec![(s, s + 14)])];
            if c.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
                // About the whole answer: it cannot be masked.
                out.push(found("accounting", vec![]));
            }
            Ok(out)
        });
        let (out, reports) = guarded_by(
            Endpoint::OpenAiChat,
            BodyFormat::Sse,
            split(body.as_bytes(), 200),
            scan,
            200,
            false,
        )
        .await;
        let got = String::from_utf8_lossy(&out);
        assert!(
            got.ends_with(&cut_event(Endpoint::OpenAiChat, BodyFormat::Sse)),
            "{got}"
        );
        assert_eq!(reports, vec![("redact", 1), ("block", 1)]);
    }

    #[test]
    fn span_arithmetic() {
        assert_eq!(merge(vec![(5, 9), (1, 3), (2, 6), (10, 10)]), vec![(1, 9)]);
        assert_eq!(
            subtract((0, 10), &[(2, 4), (6, 8)]),
            vec![(0, 2), (4, 6), (8, 10)]
        );
        assert_eq!(subtract((3, 7), &[(0, 10)]), vec![]);
        assert_eq!(subtract((3, 7), &[(0, 5)]), vec![(5, 7)]);
        assert_eq!(masked_text("a b\ncd", 10, &[(10, 14)]), "* *\ncd");
        assert_eq!(
            string_values(b"data: {\"a\": \"x\", \"b\" :\"y\\\"z\"}\n: \"c\"\n"),
            vec![(12, 15), (22, 28)]
        );
    }

    #[test]
    fn error_events_parse_in_their_framing() {
        for family in Family::ALL {
            for format in [BodyFormat::Sse, BodyFormat::Ndjson] {
                let ev = error_event(family, format, "k", "m");
                let text = std::str::from_utf8(&ev).unwrap();
                let json = text
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix("data: ")
                            .or(if l.starts_with('{') { Some(l) } else { None })
                    })
                    .unwrap();
                let v: serde_json::Value = serde_json::from_str(json).unwrap();
                assert!(
                    v.to_string().contains("residue: m"),
                    "{family:?} {format:?}: {text}"
                );
            }
        }
    }
}
