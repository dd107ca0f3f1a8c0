//! Request routing by path, and response framing by content type.

use super::{BodyFormat, Endpoint, Family, Route};

// === impl match_route ===

/// Accepts a request path; a query string, if one slipped through, is cut
/// off, and one trailing `/` is tolerated. Paths are case-sensitive.
pub(crate) fn match_route(path: &str) -> Option<Route> {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    let path = path.strip_suffix('/').unwrap_or(path);
    let known = |e| Some(Route::Known(e));
    match path {
        "/v1/chat/completions" | "/chat/completions" => known(Endpoint::OpenAiChat),
        "/v1/completions" | "/completions" => known(Endpoint::OpenAiCompletions),
        "/v1/responses" | "/responses" => known(Endpoint::OpenAiResponses),
        "/v1/messages" => known(Endpoint::AnthropicMessages),
        "/generate" => Some(Route::Generate),
        "/generate_stream" => known(Endpoint::TgiGenerateStream),
        "/api/chat" => known(Endpoint::OllamaChat),
        "/api/generate" => known(Endpoint::OllamaGenerate),
        _ => cloudflare_model(path).map(|_| Route::Known(Endpoint::CloudflareRun)),
    }
}

/// The model of a Cloudflare Workers AI path
/// (`/client/v4/accounts/{id}/ai/run/{model}` or `/ai/run/{model}`); the model
/// may contain `/` and `@` but no empty segment.
fn cloudflare_model(path: &str) -> Option<&str> {
    let model = match path.strip_prefix("/client/v4/accounts/") {
        Some(rest) => {
            let (account, rest) = rest.split_once('/')?;
            if account.is_empty() {
                return None;
            }
            rest.strip_prefix("ai/run/")?
        }
        None => path.strip_prefix("/ai/run/")?,
    };
    (!model.is_empty() && model.split('/').all(|s| !s.is_empty())).then_some(model)
}

// === impl BodyFormat::detect ===

/// See [`BodyFormat::detect`]: the media type (case-insensitive, parameters
/// ignored) decides; JSON labels on an Ollama stream mean NDJSON; without a
/// known type, the request's `stream` flag and the family decide.
pub(crate) fn detect(content_type: Option<&str>, endpoint: Endpoint, stream: bool) -> BodyFormat {
    let ollama = endpoint.family() == Family::Ollama;
    let media = content_type
        .map(|c| {
            c.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    match media.as_str() {
        "text/event-stream" => BodyFormat::Sse,
        "application/x-ndjson"
        | "application/ndjson"
        | "application/jsonl"
        | "application/x-jsonl"
        | "application/jsonlines" => BodyFormat::Ndjson,
        m if m == "application/json" || m == "text/json" || m.ends_with("+json") => {
            if ollama && stream {
                BodyFormat::Ndjson
            } else {
                BodyFormat::Json
            }
        }
        _ if !stream => BodyFormat::Json,
        _ if ollama => BodyFormat::Ndjson,
        _ => BodyFormat::Sse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Endpoint::*;

    #[test]
    fn route_table() {
        let g = Some(Route::Generate);
        let k = |e| Some(Route::Known(e));
        let cases: &[(&str, Option<Route>)] = &[
            ("/v1/chat/completions", k(OpenAiChat)),
            ("/v1/chat/completions/", k(OpenAiChat)),
            ("/v1/chat/completions?x=1", k(OpenAiChat)),
            ("/chat/completions", k(OpenAiChat)),
            ("/v1/completions", k(OpenAiCompletions)),
            ("/completions", k(OpenAiCompletions)),
            ("/v1/responses", k(OpenAiResponses)),
            ("/responses/", k(OpenAiResponses)),
            ("/v1/messages", k(AnthropicMessages)),
            ("/generate", g),
            ("/generate/", g),
            ("/generate_stream", k(TgiGenerateStream)),
            ("/api/chat", k(OllamaChat)),
            ("/api/generate", k(OllamaGenerate)),
            ("/ai/run/@cf/meta/llama-3-8b-instruct", k(CloudflareRun)),
            ("/ai/run/@cf/meta/llama-3-8b-instruct/", k(CloudflareRun)),
            (
                "/client/v4/accounts/abc123/ai/run/@cf/meta/llama-3-8b-instruct",
                k(CloudflareRun),
            ),
            (
                "/client/v4/accounts/abc/ai/run/@hf/thebloke/m",
                k(CloudflareRun),
            ),
            ("/client/v4/accounts/abc/ai/run/model", k(CloudflareRun)),
            // Negatives.
            ("/v1/models", None),
            ("/v1/chat/completionsX", None),
            ("/v1/chat/completions//", None),
            ("/V1/chat/completions", None),
            ("/api/tags", None),
            ("", None),
            ("/", None),
            ("//", None),
            ("v1/chat/completions", None),
            ("/v1/v1/chat/completions", None),
            ("/messages", None),
            ("/generate_streamX", None),
            ("/ai/run/", None),
            ("/ai/run", None),
            ("/ai/run//x", None),
            ("/client/v4/accounts//ai/run/m", None),
            ("/client/v4/accounts/abc/ai/run/", None),
            ("/client/v4/accounts/abc/ai/models/search", None),
            ("/client/v4/accounts/abc/x/ai/run/m", None),
        ];
        for (path, want) in cases {
            assert_eq!(match_route(path), *want, "path {path:?}");
        }
    }

    #[test]
    fn detect_table() {
        use BodyFormat::*;
        let cases: &[(Option<&str>, Endpoint, bool, BodyFormat)] = &[
            (Some("text/event-stream"), OpenAiChat, true, Sse),
            (
                Some("Text/Event-Stream; charset=utf-8"),
                OpenAiChat,
                false,
                Sse,
            ),
            (Some("application/x-ndjson"), OllamaChat, true, Ndjson),
            (Some("application/jsonl"), OpenAiChat, true, Ndjson),
            (Some("application/ndjson"), OllamaGenerate, false, Ndjson),
            (Some("application/json"), OpenAiChat, true, Json),
            (
                Some("APPLICATION/JSON; charset=utf-8"),
                AnthropicMessages,
                false,
                Json,
            ),
            (Some("application/problem+json"), TgiGenerate, false, Json),
            (Some("application/json"), OllamaChat, true, Ndjson),
            (
                Some("application/json; charset=utf-8"),
                OllamaGenerate,
                true,
                Ndjson,
            ),
            (Some("application/json"), OllamaChat, false, Json),
            (None, OpenAiChat, true, Sse),
            (None, TgiGenerateStream, true, Sse),
            (None, OllamaChat, true, Ndjson),
            (None, OllamaChat, false, Json),
            (None, AnthropicMessages, false, Json),
            (Some("text/plain"), CloudflareRun, true, Sse),
            (Some("text/plain"), CloudflareRun, false, Json),
            (Some(""), OllamaGenerate, true, Ndjson),
        ];
        for (ct, ep, stream, want) in cases {
            assert_eq!(detect(*ct, *ep, *stream), *want, "{ct:?} {ep:?} {stream}");
        }
    }
}
