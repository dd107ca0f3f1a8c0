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

/// Called once with the findings of a stream that was cut (to report them).
pub type OnBlock = Box<dyn FnOnce(Vec<Finding>) + Send>;

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
        let u = c as u32;
        let dense = (0x2E80..=0x9FFF).contains(&u)
            || (0xAC00..=0xD7AF).contains(&u)
            || (0x0E00..=0x0EFF).contains(&u)
            || (0xF900..=0xFAFF).contains(&u)
            || (0x20000..=0x3FFFF).contains(&u);
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

pin_project! {
    /// See the module documentation.
    pub struct GuardBody<B> {
        #[pin]
        inner: B,
        decoder: ResponseDecoder,
        output: Output,
        // Frames not yet released, each with the answer-text length once it
        // was decoded.
        held: VecDeque<(Frame<Bytes>, usize)>,
        // Answer text covered by the last clean scan.
        scanned: usize,
        scan: ScanFn,
        in_flight: Option<(JoinHandle<Result<Vec<Finding>, ()>>, usize, bool)>,
        guard: Guard,
        upstream_done: bool,
        // The final scan passed, or checking was given up (fail open): every
        // held frame may go.
        finished: bool,
        blocked_event: Option<Bytes>,
        on_block: Option<OnBlock>,
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
        on_block: OnBlock,
        on_fail: OnFail,
    ) -> Self {
        let error = error_event(
            endpoint.family(),
            format,
            "cross_tenant_leak",
            "this answer was stopped because it carried another tenant's data",
        );
        GuardBody {
            inner,
            decoder: ResponseDecoder::new(endpoint, format, guard.max_text),
            output: Output::default(),
            held: VecDeque::new(),
            scanned: 0,
            scan,
            in_flight: None,
            guard,
            upstream_done: false,
            finished: false,
            blocked_event: Some(error),
            on_block: Some(on_block),
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
                    *this.done = true;
                    if let Some(f) = this.on_fail.take() {
                        f(true);
                    }
                    this.blocked_event.take()
                } else {
                    *this.finished = true;
                    if let Some(f) = this.on_fail.take() {
                        f(false);
                    }
                    None
                }
            }};
        }
        loop {
            if *this.done {
                return Poll::Ready(None);
            }
            // 1. Release a frame once enough clean, scanned text follows it.
            if let Some((_, end)) = this.held.front() {
                let end = *end;
                let safe = *this.finished
                    || (end + this.guard.hold_back <= *this.scanned
                        && this.output.text.get(end..*this.scanned).is_some_and(|t| {
                            token_weight(t) >= this.guard.hold_back_tokens as f64
                        }));
                if safe {
                    if let Some((frame, _)) = this.held.pop_front() {
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
                    Ok(findings) if !findings.is_empty() => {
                        this.held.clear();
                        *this.done = true;
                        if let Some(on_block) = this.on_block.take() {
                            on_block(findings);
                        }
                        let event = this.blocked_event.take().unwrap_or_default();
                        return Poll::Ready(Some(Ok(Frame::data(event))));
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
/// on an upstream error, `Ready(None)` after a frame or the end.
fn read_one<B>(
    inner: Pin<&mut B>,
    cx: &mut Context<'_>,
    decoder: &mut ResponseDecoder,
    output: &mut Output,
    held: &mut VecDeque<(Frame<Bytes>, usize)>,
    upstream_done: &mut bool,
) -> Poll<Option<BoxError>>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    match inner.poll_frame(cx) {
        Poll::Pending => Poll::Pending,
        Poll::Ready(None) => {
            decoder.finish(output);
            *upstream_done = true;
            Poll::Ready(None)
        }
        Poll::Ready(Some(Err(e))) => Poll::Ready(Some(e.into())),
        Poll::Ready(Some(Ok(frame))) => {
            if let Some(data) = frame.data_ref() {
                decoder.push(data, output);
            }
            held.push_back((frame, output.text.len()));
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
