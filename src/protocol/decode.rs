//! The machinery behind [`ResponseDecoder`](super::ResponseDecoder): framing
//! state, per-decoder family state, and the routing of each decoded JSON
//! value to its family's adapter.

use serde_json::Value;

use super::json::{is_error, Segments};
use super::ndjson::LineFramer;
use super::sse::{Frame, SseFramer};
use super::{anthropic, cloudflare, ollama, openai, sglang, tgi};
use super::{BodyFormat, Endpoint, Family, Output};

// === impl framers ===

/// The framing of one response body.
#[derive(Debug)]
pub(crate) enum Framer {
    Json(JsonBody),
    Sse(SseFramer),
    Ndjson(LineFramer),
}

impl Framer {
    pub(crate) fn new(format: BodyFormat, max: usize) -> Self {
        match format {
            BodyFormat::Json => Framer::Json(JsonBody::default()),
            BodyFormat::Sse => Framer::Sse(SseFramer::new(max)),
            BodyFormat::Ndjson => Framer::Ndjson(LineFramer::new(max)),
        }
    }

    /// Bytes currently held (for tests of the memory cap).
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> usize {
        match self {
            Framer::Json(b) => b.buf.len(),
            Framer::Sse(s) => s.buffered(),
            Framer::Ndjson(n) => n.buffered(),
        }
    }
}

/// A whole JSON body, buffered up to the cap.
#[derive(Debug, Default)]
pub(crate) struct JsonBody {
    buf: Vec<u8>,
    /// The body exceeded the cap; the rest was dropped.
    overflow: bool,
}

impl JsonBody {
    /// Buffers `chunk` unless the body would exceed `max`; returns whether it
    /// has overflowed.
    pub(crate) fn push(&mut self, chunk: &[u8], max: usize) -> bool {
        if !self.overflow {
            if self.buf.len() + chunk.len() > max {
                self.overflow = true;
                self.buf = Vec::new();
            } else {
                self.buf.extend_from_slice(chunk);
            }
        }
        self.overflow
    }
}

// === impl decoding state ===

/// What one decoder has accumulated besides the output itself.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) seg: Segments,
    anthropic: anthropic::State,
    sglang: sglang::State,
}

impl State {
    /// Handles one framed SSE event or NDJSON line: keep-alives (empty data)
    /// and `[DONE]` are skipped uncounted; an event named `error` marks an
    /// upstream error; anything else must parse as JSON or counts malformed.
    pub(crate) fn frame(&mut self, endpoint: Endpoint, frame: Frame<'_>, out: &mut Output) {
        match frame {
            Frame::Overflow => {
                out.truncated = true;
                self.bad(out);
            }
            Frame::Event { name, data } => {
                if name == "error" {
                    out.upstream_error = true;
                }
                let data = data.trim();
                if data.is_empty() || data == "[DONE]" {
                    return;
                }
                match serde_json::from_str::<Value>(data) {
                    Ok(v) => self.value(endpoint, &v, out),
                    Err(_) => self.bad(out),
                }
            }
        }
    }

    /// Counts and applies one parsed value.
    fn value(&mut self, endpoint: Endpoint, v: &Value, out: &mut Output) {
        out.events += 1;
        apply(endpoint, self, v, out);
    }

    /// Counts one event or body that could not be parsed.
    fn bad(&mut self, out: &mut Output) {
        out.events += 1;
        out.malformed += 1;
    }

    /// Parses a buffered JSON body. If it is not one JSON value it may still
    /// be a mislabelled stream: text that looks like SSE is decoded as SSE,
    /// and two or more concatenated JSON values as NDJSON. Otherwise it
    /// counts as one malformed event. An empty body counts nothing.
    pub(crate) fn json_body(
        &mut self,
        endpoint: Endpoint,
        body: &mut JsonBody,
        max: usize,
        out: &mut Output,
    ) {
        let buf = std::mem::take(&mut body.buf);
        if std::mem::take(&mut body.overflow) {
            out.truncated = true;
            self.bad(out);
            return;
        }
        let text = String::from_utf8_lossy(&buf);
        let text = trim_body(&text);
        if text.is_empty() {
            return;
        }
        if let Ok(v) = serde_json::from_str::<Value>(text) {
            self.value(endpoint, &v, out);
            return;
        }
        if ["data:", "event:", ":", "id:", "retry:"]
            .iter()
            .any(|p| text.starts_with(p))
        {
            let mut sse = SseFramer::new(max);
            let mut f = |fr: Frame<'_>| self.frame(endpoint, fr, out);
            sse.push(text.as_bytes(), &mut f);
            sse.finish(&mut f);
            return;
        }
        let mut values = Vec::new();
        for v in serde_json::Deserializer::from_str(text).into_iter::<Value>() {
            match v {
                Ok(v) => values.push(v),
                Err(_) => {
                    values.clear();
                    break;
                }
            }
        }
        if values.len() >= 2 {
            values.iter().for_each(|v| self.value(endpoint, v, out));
        } else {
            self.bad(out);
        }
    }
}

/// A body without a leading byte order mark and surrounding whitespace.
fn trim_body(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text).trim()
}

/// Routes one parsed value (a whole body, an SSE event or an NDJSON line) to
/// its family's adapter. Any family: a top-level error object marks an
/// upstream error.
fn apply(endpoint: Endpoint, st: &mut State, v: &Value, out: &mut Output) {
    if is_error(v) {
        out.upstream_error = true;
    }
    let seg = &mut st.seg;
    match endpoint.family() {
        Family::OpenAi => openai::apply(seg, v, out),
        Family::Anthropic => anthropic::apply(&mut st.anthropic, seg, v, out),
        Family::Sglang => sglang::apply(&mut st.sglang, seg, v, out),
        Family::Tgi => tgi::apply(seg, v, out),
        Family::Ollama => ollama::apply(seg, v, out),
        Family::Cloudflare => cloudflare::apply(seg, v, out),
    }
}
