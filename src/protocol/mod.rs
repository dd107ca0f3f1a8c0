//! Protocol adapters: one module per LLM API family.
//!
//! Each family knows the routes it owns, how to pull the prompt text out of a
//! request body, and how to pull the output text and usage out of a response
//! body — JSON, SSE or NDJSON — *incrementally*, across arbitrary chunk
//! boundaries. Nothing here does I/O; everything is a pure function of bytes,
//! so the parsers can be fuzzed and tested with hostile input.

use serde_json::Value;
use thiserror::Error;

mod anthropic;
mod cloudflare;
mod decode;
mod json;
mod ndjson;
mod ollama;
mod openai;
mod route;
mod sglang;
mod sse;
mod tgi;

#[cfg(test)]
mod tests;

/// An API family. vLLM's and SGLang's OpenAI-compatible servers are `OpenAi`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    OpenAi,
    Anthropic,
    Sglang,
    Tgi,
    Ollama,
    Cloudflare,
}

impl Family {
    pub const ALL: [Family; 6] = [
        Family::OpenAi,
        Family::Anthropic,
        Family::Sglang,
        Family::Tgi,
        Family::Ollama,
        Family::Cloudflare,
    ];

    /// A short, stable, low-cardinality name, used as a metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Family::OpenAi => "openai",
            Family::Anthropic => "anthropic",
            Family::Sglang => "sglang",
            Family::Tgi => "tgi",
            Family::Ollama => "ollama",
            Family::Cloudflare => "cloudflare",
        }
    }
}

/// One API endpoint residue understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    OpenAiChat,
    OpenAiCompletions,
    OpenAiResponses,
    AnthropicMessages,
    SglangGenerate,
    TgiGenerate,
    TgiGenerateStream,
    OllamaChat,
    OllamaGenerate,
    CloudflareRun,
}

impl Endpoint {
    pub fn family(&self) -> Family {
        match self {
            Endpoint::OpenAiChat | Endpoint::OpenAiCompletions | Endpoint::OpenAiResponses => {
                Family::OpenAi
            }
            Endpoint::AnthropicMessages => Family::Anthropic,
            Endpoint::SglangGenerate => Family::Sglang,
            Endpoint::TgiGenerate | Endpoint::TgiGenerateStream => Family::Tgi,
            Endpoint::OllamaChat | Endpoint::OllamaGenerate => Family::Ollama,
            Endpoint::CloudflareRun => Family::Cloudflare,
        }
    }

    /// A short, stable name such as `openai.chat`, used as a metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Endpoint::OpenAiChat => "openai.chat",
            Endpoint::OpenAiCompletions => "openai.completions",
            Endpoint::OpenAiResponses => "openai.responses",
            Endpoint::AnthropicMessages => "anthropic.messages",
            Endpoint::SglangGenerate => "sglang.generate",
            Endpoint::TgiGenerate => "tgi.generate",
            Endpoint::TgiGenerateStream => "tgi.generate_stream",
            Endpoint::OllamaChat => "ollama.chat",
            Endpoint::OllamaGenerate => "ollama.generate",
            Endpoint::CloudflareRun => "cloudflare.run",
        }
    }

    /// The path this endpoint is documented under, for matching `[[route]]`
    /// rules whatever spelling a client used (`/chat/completions`, a
    /// trailing `/`). Cloudflare's path holds the model: none.
    pub fn canonical_path(&self) -> Option<&'static str> {
        match self {
            Endpoint::OpenAiChat => Some("/v1/chat/completions"),
            Endpoint::OpenAiCompletions => Some("/v1/completions"),
            Endpoint::OpenAiResponses => Some("/v1/responses"),
            Endpoint::AnthropicMessages => Some("/v1/messages"),
            Endpoint::SglangGenerate | Endpoint::TgiGenerate => Some("/generate"),
            Endpoint::TgiGenerateStream => Some("/generate_stream"),
            Endpoint::OllamaChat => Some("/api/chat"),
            Endpoint::OllamaGenerate => Some("/api/generate"),
            Endpoint::CloudflareRun => None,
        }
    }
}

/// What a path alone says. `/generate` is both SGLang's and TGI's; the body
/// decides (`text`/`input_ids` → SGLang, `inputs` → TGI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Known(Endpoint),
    Generate,
}

impl Route {
    /// The family to use for an error answered before the body was read.
    pub fn family_hint(&self) -> Family {
        match self {
            Route::Known(e) => e.family(),
            Route::Generate => Family::Sglang,
        }
    }
}

/// Matches a request path (without the query string) to a route.
///
/// One trailing `/` is tolerated; OpenAI paths are also accepted without the
/// `/v1` prefix (as vLLM and LiteLLM do); a Cloudflare model may contain `/`
/// and `@`. Anything else, `/v1/models` included, is `None`.
pub fn match_route(path: &str) -> Option<Route> {
    route::match_route(path)
}

/// The prompt of one request: every text segment a model will read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prompt {
    /// Text segments in request order: system prompt, each message, each
    /// content part, tool text, each prompt of a batch.
    pub parts: Vec<String>,
    /// Tokens given as ids rather than text (`input_ids`, token-array prompts).
    pub pretokenized: u64,
}

impl Prompt {
    /// The parts joined by newlines.
    pub fn text(&self) -> String {
        self.parts.join("\n")
    }

    pub fn is_empty(&self) -> bool {
        self.pretokenized == 0 && self.parts.iter().all(|p| p.is_empty())
    }
}

/// A request body understood by an adapter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedRequest {
    pub endpoint: Endpoint,
    pub prompt: Prompt,
    /// Whether the client asked for a streamed answer (Ollama streams unless
    /// told not to).
    pub stream: bool,
    pub model: Option<String>,
    /// Whether the client asked for log probabilities (or TGI's top
    /// tokens): the answer's tokens then come again beside its text.
    pub logprobs: bool,
}

#[derive(Debug, Error)]
pub enum RequestError {
    #[error("request body is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("request body has an unexpected shape: {0}")]
    Shape(&'static str),
}

/// Parses a request body for a route.
///
/// The body must be one JSON object (invalid UTF-8 is replaced, a leading
/// byte order mark skipped); nesting deeper than serde_json's limit of 128 is
/// a [`RequestError::Json`], a non-object a [`RequestError::Shape`]. Fields
/// of the wrong type are skipped: the prompt is best effort, never an error.
/// For [`Route::Generate`], a body with `inputs` is TGI's, any other SGLang's.
pub fn parse_request(route: Route, body: &[u8]) -> Result<ParsedRequest, RequestError> {
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let text = String::from_utf8_lossy(body);
    let value: Value = serde_json::from_str(&text)?;
    let Value::Object(obj) = value else {
        return Err(RequestError::Shape("expected a JSON object"));
    };
    let endpoint = match route {
        Route::Known(e) => e,
        Route::Generate if obj.contains_key("inputs") => Endpoint::TgiGenerate,
        Route::Generate => Endpoint::SglangGenerate,
    };
    let mut prompt = Prompt::default();
    match endpoint.family() {
        Family::OpenAi => openai::prompt(endpoint, &obj, &mut prompt),
        Family::Anthropic => anthropic::prompt(&obj, &mut prompt),
        Family::Sglang => sglang::prompt(&obj, &mut prompt),
        Family::Tgi => tgi::prompt(&obj, &mut prompt),
        Family::Ollama => ollama::prompt(endpoint, &obj, &mut prompt),
        Family::Cloudflare => cloudflare::prompt(&obj, &mut prompt),
    }
    let stream_flag = obj.get("stream").and_then(Value::as_bool);
    let stream = match endpoint {
        Endpoint::OllamaChat | Endpoint::OllamaGenerate => stream_flag != Some(false),
        Endpoint::TgiGenerateStream => true,
        _ => stream_flag.unwrap_or(false),
    };
    let model = obj.get("model").and_then(Value::as_str).map(str::to_owned);
    Ok(ParsedRequest {
        endpoint,
        prompt,
        stream,
        model,
        logprobs: wants_logprobs(&obj),
    })
}

/// `logprobs` (true or a count), `top_logprobs`, a responses-API `include`
/// of logprobs, or TGI's `parameters.top_n_tokens` / `details` of
/// `decoder_input_details`.
fn wants_logprobs(obj: &serde_json::Map<String, Value>) -> bool {
    let on = |v: Option<&Value>| match v {
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|n| n > 0.0),
        _ => false,
    };
    let params = obj.get("parameters").and_then(Value::as_object);
    on(obj.get("logprobs"))
        || on(obj.get("top_logprobs"))
        || obj
            .get("include")
            .and_then(Value::as_array)
            .is_some_and(|a| {
                a.iter()
                    .any(|i| i.as_str().is_some_and(|i| i.contains("logprobs")))
            })
        || params.is_some_and(|p| on(p.get("top_n_tokens")) || on(p.get("decoder_input_details")))
}

/// Token usage and finish reason as the upstream reported them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// All prompt tokens, cached ones included (for Anthropic: input +
    /// cache-read + cache-creation tokens).
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub finish_reason: Option<String>,
}

/// How a response body is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFormat {
    Json,
    Sse,
    Ndjson,
}

impl BodyFormat {
    /// Chooses the framing from the response's content type, falling back on
    /// what the endpoint and the request's `stream` flag imply.
    ///
    /// `text/event-stream` is SSE; `application/x-ndjson`, `application/ndjson`
    /// and `application/jsonl` are NDJSON; `application/json` (and `+json`
    /// types) is JSON, except on a streaming Ollama request, where it is
    /// NDJSON. Media types compare case-insensitively, parameters ignored.
    /// With no or an unknown type: a stream is NDJSON for Ollama and SSE for
    /// the rest; no stream is JSON.
    pub fn detect(content_type: Option<&str>, endpoint: Endpoint, stream: bool) -> BodyFormat {
        route::detect(content_type, endpoint, stream)
    }
}

/// What a decoder has read from a response so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output {
    /// The generated text, all choices in arrival order.
    pub text: String,
    pub usage: Usage,
    /// Events (SSE events, NDJSON lines, or 1 for a JSON body) decoded.
    pub events: u64,
    /// Events or bodies that could not be parsed (counted, never fatal).
    pub malformed: u64,
    /// The body or one event exceeded the decoder's buffer cap.
    pub truncated: bool,
    /// The upstream sent an error object or error event.
    pub upstream_error: bool,
    /// Texts of different choices (or blocks) arrived interleaved, so `text`
    /// shuffles their words; `by_key` holds each one whole.
    pub interleaved: bool,
    /// Each choice's (or block's) text, in first-seen order; filled only
    /// when `interleaved`, at `finish`.
    pub by_key: Vec<String>,
}

impl Output {
    /// The text detectors should read: `text`, or the choices one after the
    /// other when they arrived interleaved.
    pub fn scan_text(&self) -> std::borrow::Cow<'_, str> {
        if self.interleaved {
            std::borrow::Cow::Owned(self.by_key.join("\n"))
        } else {
            std::borrow::Cow::Borrowed(&self.text)
        }
    }
}

/// An incremental response decoder. Feed it body bytes as they arrive, in
/// chunks of any size; it never panics, whatever the bytes.
///
/// The output does not depend on how the body is split into chunks. SSE
/// events and NDJSON lines are decoded as they complete; a JSON body is
/// parsed at [`finish`](Self::finish). Text of distinct choices, content
/// blocks or batch sequences is separated by `\n`; streamed deltas of one of
/// them are concatenated as they are. Model-generated tool-call arguments
/// count as output text. The bytes held never exceed `max_buffer` (beyond
/// the per-sequence text SGLang's cumulative streams need).
///
/// Mislabelled bodies are read leniently: a "JSON" body that is really SSE or
/// concatenated JSON values is decoded as such, and JSON lines that precede
/// any SSE field are decoded as events (a plain error body answered to a
/// streaming request).
#[derive(Debug)]
pub struct ResponseDecoder {
    endpoint: Endpoint,
    max_buffer: usize,
    framer: decode::Framer,
    state: decode::State,
}

impl ResponseDecoder {
    /// `max_buffer` caps the bytes held for one event or one JSON body.
    pub fn new(endpoint: Endpoint, format: BodyFormat, max_buffer: usize) -> Self {
        ResponseDecoder {
            endpoint,
            max_buffer,
            framer: decode::Framer::new(format, max_buffer),
            state: decode::State::default(),
        }
    }

    /// Feeds decoded (not content-encoded) body bytes; appends any new output
    /// text to `out.text` and updates `out.usage`.
    pub fn push(&mut self, chunk: &[u8], out: &mut Output) {
        let ResponseDecoder {
            endpoint,
            max_buffer,
            framer,
            state,
        } = self;
        let endpoint = *endpoint;
        match framer {
            decode::Framer::Json(body) => {
                if body.push(chunk, *max_buffer) {
                    out.truncated = true;
                }
            }
            decode::Framer::Sse(sse) => {
                sse.push(chunk, &mut |f| state.frame(endpoint, f, out));
                out.truncated |= sse.truncated;
            }
            decode::Framer::Ndjson(nd) => {
                nd.push(chunk, &mut |f| state.frame(endpoint, f, out));
                out.truncated |= nd.truncated;
            }
        }
        out.interleaved |= state.seg.interleaved;
    }

    /// The body ended: flushes a final unterminated event or parses the
    /// buffered JSON body.
    ///
    /// Calling it again does nothing more.
    pub fn finish(&mut self, out: &mut Output) {
        let endpoint = self.endpoint;
        let state = &mut self.state;
        match &mut self.framer {
            decode::Framer::Json(body) => state.json_body(endpoint, body, self.max_buffer, out),
            decode::Framer::Sse(sse) => {
                sse.finish(&mut |f| state.frame(endpoint, f, out));
                out.truncated |= sse.truncated;
            }
            decode::Framer::Ndjson(nd) => {
                nd.finish(&mut |f| state.frame(endpoint, f, out));
                out.truncated |= nd.truncated;
            }
        }
        out.interleaved |= state.seg.interleaved;
        if out.interleaved {
            out.by_key = state.seg.by_key.iter().map(|(_, t)| t.clone()).collect();
        }
    }

    /// Bytes the framer holds (for tests of the memory cap).
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> usize {
        self.framer.buffered()
    }
}

/// Usage some servers report in response headers (TGI: `x-prompt-tokens`,
/// `x-generated-tokens`). Fills only fields still `None`.
/// Other endpoints: nothing.
pub fn usage_from_headers(endpoint: Endpoint, headers: &http::HeaderMap, usage: &mut Usage) {
    if endpoint.family() == Family::Tgi {
        tgi::usage_from_headers(headers, usage);
    }
}

/// An error body in a family's own JSON shape, produced by residue itself.
/// `kind` is a short machine-readable code such as `upstream_timeout`.
/// The body always names residue as the error's source.
///
/// The message reads `residue: <message>`; `None` gets the OpenAI shape. The
/// body is built with serde_json, so any message yields valid JSON.
pub fn error_body(
    family: Option<Family>,
    status: http::StatusCode,
    kind: &str,
    message: &str,
) -> Vec<u8> {
    let message = format!("residue: {message}");
    let code = status.as_u16();
    let body = match family.unwrap_or(Family::OpenAi) {
        Family::OpenAi => openai::error_body(code, kind, &message),
        Family::Anthropic => anthropic::error_body(kind, &message),
        Family::Sglang => sglang::error_body(code, kind, &message),
        Family::Tgi => tgi::error_body(kind, &message),
        Family::Ollama => ollama::error_body(&message),
        Family::Cloudflare => cloudflare::error_body(code, &message),
    };
    body.to_string().into_bytes()
}
