//! Protocol adapters: one module per LLM API family.
//!
//! Each family knows the routes it owns, how to pull the prompt text out of a
//! request body, and how to pull the output text and usage out of a response
//! body — JSON, SSE or NDJSON — *incrementally*, across arbitrary chunk
//! boundaries. Nothing here does I/O; everything is a pure function of bytes,
//! so the parsers can be fuzzed and tested with hostile input.

use thiserror::Error;

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
pub fn match_route(path: &str) -> Option<Route> {
    let _ = path;
    None
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
}

#[derive(Debug, Error)]
pub enum RequestError {
    #[error("request body is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("request body has an unexpected shape: {0}")]
    Shape(&'static str),
}

/// Parses a request body for a route.
pub fn parse_request(route: Route, body: &[u8]) -> Result<ParsedRequest, RequestError> {
    let _ = (route, body);
    Err(RequestError::Shape("not implemented"))
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
    pub fn detect(content_type: Option<&str>, endpoint: Endpoint, stream: bool) -> BodyFormat {
        let _ = (content_type, endpoint, stream);
        BodyFormat::Json
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
}

/// An incremental response decoder. Feed it body bytes as they arrive, in
/// chunks of any size; it never panics, whatever the bytes.
#[derive(Debug)]
pub struct ResponseDecoder {
    endpoint: Endpoint,
    format: BodyFormat,
    max_buffer: usize,
}

impl ResponseDecoder {
    /// `max_buffer` caps the bytes held for one event or one JSON body.
    pub fn new(endpoint: Endpoint, format: BodyFormat, max_buffer: usize) -> Self {
        ResponseDecoder {
            endpoint,
            format,
            max_buffer,
        }
    }

    /// Feeds decoded (not content-encoded) body bytes; appends any new output
    /// text to `out.text` and updates `out.usage`.
    pub fn push(&mut self, chunk: &[u8], out: &mut Output) {
        let _ = (chunk, out, self.endpoint, self.format, self.max_buffer);
    }

    /// The body ended: flushes a final unterminated event or parses the
    /// buffered JSON body.
    pub fn finish(&mut self, out: &mut Output) {
        let _ = out;
    }
}

/// Usage some servers report in response headers (TGI: `x-prompt-tokens`,
/// `x-generated-tokens`). Fills only fields still `None`.
pub fn usage_from_headers(endpoint: Endpoint, headers: &http::HeaderMap, usage: &mut Usage) {
    let _ = (endpoint, headers, usage);
}

/// An error body in a family's own JSON shape, produced by residue itself.
/// `kind` is a short machine-readable code such as `upstream_timeout`.
/// The body always names residue as the error's source.
pub fn error_body(
    family: Option<Family>,
    status: http::StatusCode,
    kind: &str,
    message: &str,
) -> Vec<u8> {
    let _ = (family, status, kind);
    serde_json::json!({"error": {"message": format!("residue: {message}"), "type": kind, "source": "residue"}})
        .to_string()
        .into_bytes()
}
