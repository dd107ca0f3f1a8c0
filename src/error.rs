//! Errors residue answers itself. Each records *who* caused it (pingora's
//! `esource`): the upstream LLM, the downstream client, or residue.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use crate::protocol::{self, Family};

/// Who caused an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorSource {
    /// The upstream LLM server: refused, timed out, broke the connection.
    Upstream,
    /// The client: a body too large, a prompt over the limit, a bad request.
    Downstream,
    /// residue itself.
    Internal,
}

impl ErrorSource {
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorSource::Upstream => "upstream",
            ErrorSource::Downstream => "downstream",
            ErrorSource::Internal => "internal",
        }
    }
}

/// An error answered by residue instead of (or before) the upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub status: StatusCode,
    /// A short, stable code: `upstream_unreachable`, `upstream_timeout`,
    /// `request_too_large`, `prompt_too_long`, …; also a metric label.
    pub kind: &'static str,
    pub message: String,
    pub source: ErrorSource,
}

impl Rejection {
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        source: ErrorSource,
        message: impl Into<String>,
    ) -> Self {
        Rejection {
            status,
            kind,
            message: message.into(),
            source,
        }
    }

    /// The response: the family's own error JSON, naming residue as its
    /// author, plus `x-residue-error` headers for people reading raw traffic.
    pub fn into_response(self, family: Option<Family>) -> Response<Bytes> {
        let body = protocol::error_body(family, self.status, self.kind, &self.message);
        let mut resp = Response::new(Bytes::from(body));
        *resp.status_mut() = self.status;
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert("x-residue-error", HeaderValue::from_static(self.kind));
        h.insert(
            "x-residue-error-source",
            HeaderValue::from_static(self.source.as_str()),
        );
        resp
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, caused by {}): {}",
            self.status,
            self.kind,
            self.source.as_str(),
            self.message
        )
    }
}

/// Errors starting residue.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("cannot bind {what} on {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot open the incident file {path}: {source}")]
    IncidentFile {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tokenizer(#[from] crate::tokens::TokenizerError),
    #[error("upstream TLS: {0}")]
    Tls(String),
    #[error("semantic detectors: {0}")]
    Semantic(#[from] crate::detect::semantic::SemanticError),
}
