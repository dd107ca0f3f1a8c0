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

/// Scans the answer text so far on a blocking thread; `Some(findings)` when
/// done. `last` marks the final scan (the clean answer may be recorded).
pub type ScanFn = Arc<dyn Fn(String, bool) -> Vec<Finding> + Send + Sync>;

/// Called once with the findings of a stream that was cut (to report them).
pub type OnBlock = Box<dyn FnOnce(Vec<Finding>) + Send>;

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
        in_flight: Option<(JoinHandle<Vec<Finding>>, usize, bool)>,
        hold_back: usize,
        step: usize,
        upstream_done: bool,
        finished: bool,
        blocked_event: Option<Bytes>,
        on_block: Option<OnBlock>,
        done: bool,
    }
}

impl<B> GuardBody<B> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        inner: B,
        endpoint: Endpoint,
        format: BodyFormat,
        max_bytes: usize,
        hold_back: usize,
        scan: ScanFn,
        on_block: OnBlock,
    ) -> Self {
        let error = error_event(
            endpoint.family(),
            format,
            "cross_tenant_leak",
            "this answer was stopped because it carried another tenant's data",
        );
        GuardBody {
            inner,
            decoder: ResponseDecoder::new(endpoint, format, max_bytes),
            output: Output::default(),
            held: VecDeque::new(),
            scanned: 0,
            scan,
            in_flight: None,
            hold_back,
            step: (hold_back / 4).max(16),
            upstream_done: false,
            finished: false,
            blocked_event: Some(error),
            on_block: Some(on_block),
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
        loop {
            if *this.done {
                return Poll::Ready(None);
            }
            // 1. Release a frame that has enough clean, scanned text after it.
            if let Some((_, end)) = this.held.front() {
                let safe = *this.finished || *end + *this.hold_back <= *this.scanned;
                if safe {
                    if let Some((frame, _)) = this.held.pop_front() {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                }
            } else if *this.finished {
                *this.done = true;
                return Poll::Ready(None);
            }

            // 2. A scan in flight: wait for it.
            if let Some((handle, upto, last)) = this.in_flight.as_mut() {
                let findings = match Pin::new(handle).poll(cx) {
                    Poll::Pending => {
                        // Meanwhile keep reading the upstream (bounded by the
                        // decoder cap), so it is not stalled by our scan.
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
                    // A scanner that panicked counts as "no findings": monitor
                    // semantics rather than cutting a healthy answer.
                    Poll::Ready(r) => r.unwrap_or_default(),
                };
                let (upto, last) = (*upto, *last);
                *this.in_flight = None;
                if !findings.is_empty() {
                    this.held.clear();
                    *this.done = true;
                    if let Some(on_block) = this.on_block.take() {
                        on_block(findings);
                    }
                    let event = this.blocked_event.take().unwrap_or_default();
                    return Poll::Ready(Some(Ok(Frame::data(event))));
                }
                *this.scanned = upto;
                if last {
                    *this.finished = true;
                }
                continue;
            }

            // 3. Start a scan when enough new text arrived, or at the end.
            let len = this.output.text.len();
            let due = len >= *this.scanned + *this.step || (*this.upstream_done && !*this.finished);
            if due {
                let last = *this.upstream_done;
                let text = this.output.text.clone();
                let scan = this.scan.clone();
                let handle = tokio::task::spawn_blocking(move || scan(text, last));
                *this.in_flight = Some((handle, len, last));
                continue;
            }

            // 4. Read more from the upstream.
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
