//! Configuration: one TOML file, validated in two steps (ripgrep's
//! `LowArgs → HiArgs`): serde reads the raw shape, then [`Config::validate`]
//! checks values and reports *every* problem at once, each with its field path.
//!
//! Unknown fields are errors. They are found with `serde_ignored` rather than
//! `deny_unknown_fields`, so that all of them are reported, not just the first.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::tenant::TenantConfig;

/// Every problem found in a config, in field order.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid configuration:\n  {}", .errors.join("\n  "))]
pub struct ConfigError {
    pub errors: Vec<String>,
}

impl ConfigError {
    fn one(msg: impl Into<String>) -> Self {
        ConfigError {
            errors: vec![msg.into()],
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "kebab-case")]
pub struct Config {
    pub server: ServerConfig,
    pub upstream: UpstreamConfig,
    pub tenant: TenantConfig,
    pub observe: ObserveConfig,
    pub accounting: AccountingConfig,
    pub incidents: IncidentConfig,
    pub log: LogConfig,
    pub privacy: PrivacyConfig,
    pub fingerprint: FingerprintConfig,
    pub detect: DetectConfig,
    pub semantic: SemanticConfig,
    pub action: ActionConfig,
    /// Per-route settings, matched in order; the first match wins.
    #[serde(rename = "route")]
    pub routes: Vec<RouteConfig>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, rename_all = "kebab-case")]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// After SIGTERM/SIGINT, in-flight streams get this long to finish.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Request bodies on scanned routes are read whole (the prompt is needed
    /// before forwarding); larger ones get a 413.
    pub max_request_bytes: usize,
    /// Bytes of request bodies being read at once, across all requests;
    /// past it new requests get a 503 rather than exhausting memory.
    pub max_buffered_bytes: usize,
    /// Slow-loris guard: the time a client has to send its request headers.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// The time a client has to send a request body residue must read (on
    /// scanned routes) → 408.
    #[serde(with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// HTTP/2 pings to idle client connections; a peer that stops answering
    /// is disconnected.
    #[serde(with = "humantime_serde")]
    pub http2_keep_alive_interval: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: ([127, 0, 0, 1], 8080).into(),
            admin_listen: ([127, 0, 0, 1], 9090).into(),
            drain_timeout: Duration::from_secs(30),
            max_request_bytes: 32 << 20,
            max_buffered_bytes: 512 << 20,
            header_read_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(60),
            http2_keep_alive_interval: Duration::from_secs(30),
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, rename_all = "kebab-case")]
pub struct UpstreamConfig {
    /// `http://` or `https://` base URL; the request's path and query are
    /// appended to its path.
    pub url: String,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest wait for the upstream's response headers (a non-streaming LLM
    /// answer arrives all at once, so this is generous) → 504.
    #[serde(with = "humantime_serde")]
    pub response_timeout: Duration,
    /// Longest gap between two body frames of a response; past it the
    /// response is cut off.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Idle pooled connections are closed after this long.
    #[serde(with = "humantime_serde")]
    pub pool_idle_timeout: Duration,
    /// Extra PEM CA certificates trusted for https upstreams, besides the
    /// bundled web PKI roots.
    pub ca_file: Option<PathBuf>,
    /// Speak HTTP/2 with prior knowledge (h2c) to an `http://` upstream.
    pub h2c: bool,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            url: "http://127.0.0.1:8000".to_string(),
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(120),
            pool_idle_timeout: Duration::from_secs(90),
            ca_file: None,
            h2c: false,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, rename_all = "kebab-case")]
pub struct ObserveConfig {
    /// Finished exchanges waiting to be scanned; when full, exchanges are
    /// dropped and counted (`residue_scan_dropped_total{reason="queue_full"}`),
    /// never waited for.
    pub queue: usize,
    /// Scanner threads (decoding and detectors run off the forwarding path).
    pub workers: usize,
    /// Bytes of a response kept for scanning; the rest is forwarded but not
    /// scanned (counted as truncated).
    pub max_response_bytes: usize,
    /// Bytes (prompts plus captured responses) the scan queue may hold in
    /// all; past it exchanges are dropped and counted
    /// (`reason="queue_bytes"`), so big prompts cannot exhaust memory.
    pub max_queue_bytes: usize,
}

impl Default for ObserveConfig {
    fn default() -> Self {
        ObserveConfig {
            queue: 4096,
            workers: 1,
            max_response_bytes: 8 << 20,
            max_queue_bytes: 256 << 20,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, rename_all = "kebab-case")]
pub struct AccountingConfig {
    pub enabled: bool,
    /// A 2xx whose reported prompt tokens are below this fraction of residue's
    /// count is a `prompt_accounting` incident. 0.5 leaves room for tokenizer
    /// differences (the estimate is within ±35 %) while `prompt_tokens = 1`
    /// for a long prompt is far below it.
    pub min_ratio: f64,
    /// Prompts shorter than this are not judged: chat templates and
    /// tokenizer differences dominate small counts.
    pub min_prompt_tokens: u64,
}

impl Default for AccountingConfig {
    fn default() -> Self {
        AccountingConfig {
            enabled: true,
            min_ratio: 0.5,
            min_prompt_tokens: 64,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, rename_all = "kebab-case")]
pub struct IncidentConfig {
    /// JSON-lines file incidents are appended to; `-` for stdout; unset to
    /// keep them only in metrics and logs.
    pub path: Option<PathBuf>,
    /// Incidents waiting for the writer; when full they are counted and
    /// dropped, never waited for.
    pub queue: usize,
    /// Write tenant ids as they are instead of as keyed hashes.
    pub raw_tenant: bool,
}

impl Default for IncidentConfig {
    fn default() -> Self {
        IncidentConfig {
            path: Some(PathBuf::from("residue-incidents.jsonl")),
            queue: 1024,
            raw_tenant: false,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    #[default]
    Pretty,
    Json,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, rename_all = "kebab-case")]
pub struct LogConfig {
    pub format: LogFormat,
    /// A tracing filter such as `info` or `residue=debug,hyper=warn`;
    /// `RESIDUE_LOG` overrides it.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Pretty,
            level: "info".to_string(),
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "kebab-case")]
pub struct PrivacyConfig {
    /// 64 hex characters keying every hash residue keeps. Set it (and keep it
    /// secret) for hashes that stay comparable across restarts and replicas;
    /// unset, a random key is generated at start.
    pub hash_key: Option<String>,
}

/// What residue does with an answer that has findings.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// The answer goes out untouched; incidents and metrics only.
    #[default]
    Monitor,
    /// The answer is held until scanned; a leaking answer is replaced by an
    /// error (non-streaming) or cut with an error event (streaming).
    Block,
    /// The matched spans are masked; findings without a span (prompt
    /// accounting) block.
    Redact,
}

impl Action {
    pub fn as_str(&self) -> &'static str {
        match self {
            Action::Monitor => "monitor",
            Action::Block => "block",
            Action::Redact => "redact",
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, rename_all = "kebab-case")]
pub struct ActionConfig {
    /// The action where no tenant or route says otherwise.
    pub default: Action,
    /// When blocking or redacting and residue cannot scan in time (too many
    /// answers being scanned at once, or one too large to hold), refuse the
    /// answer (503) instead of passing it unscanned. Counted either way.
    pub fail_closed: bool,
    /// Answers scanned on the request path at once; past it, fail open or
    /// closed.
    pub max_concurrent_scans: usize,
    /// Streaming: characters of the newest answer text held back unsent, so a
    /// leak detected within them is never sent. At least one guaranteed
    /// detection run (≈12 words); the default is generous.
    pub hold_back_chars: usize,
    /// Per-tenant actions (the tenant as residue resolves it), which win over
    /// routes' and the default.
    #[serde(rename = "tenant")]
    pub tenants: Vec<TenantAction>,
}

impl Default for ActionConfig {
    fn default() -> Self {
        ActionConfig {
            default: Action::Monitor,
            fail_closed: false,
            max_concurrent_scans: 64,
            hold_back_chars: 256,
            tenants: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub struct TenantAction {
    pub tenant: String,
    pub action: Action,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub struct RouteConfig {
    /// An exact path, or a prefix ending in `*`.
    pub path: String,
    /// The model's `tokenizer.json`, for exact prompt-token counts.
    pub tokenizer: Option<PathBuf>,
    /// Prompts over this many tokens are answered 413 by residue instead of
    /// being forwarded.
    pub max_prompt_tokens: Option<u64>,
    /// The action on this route (a tenant's own action wins).
    pub action: Option<Action>,
}

impl RouteConfig {
    pub fn matches(&self, path: &str) -> bool {
        match self.path.strip_suffix('*') {
            Some(prefix) => path.starts_with(prefix),
            None => path == self.path,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, rename_all = "kebab-case")]
pub struct FingerprintConfig {
    /// How long each tenant's content is remembered.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Memory cap of the in-memory store; the oldest records go first.
    pub max_bytes: usize,
    /// A shingle or value produced by this many distinct tenants inside the
    /// window is boilerplate (shared system prompts, templates, quotes), not
    /// evidence.
    pub common_tenants: u32,
    /// Record answers as well as prompts (residual KV pages hold both).
    pub record_answers: bool,
    /// Shingle length and winnowing window for words and for CJK characters;
    /// unset, the measured defaults (see the README).
    pub word_k: Option<usize>,
    pub word_w: Option<usize>,
    pub cjk_k: Option<usize>,
    pub cjk_w: Option<usize>,
}

impl FingerprintConfig {
    /// Shingle and winnowing parameters: the configured ones, the measured
    /// defaults for the rest.
    pub fn params(&self) -> crate::fingerprint::FingerprintParams {
        let d = crate::fingerprint::FingerprintParams::default();
        crate::fingerprint::FingerprintParams {
            word_k: self.word_k.unwrap_or(d.word_k),
            word_w: self.word_w.unwrap_or(d.word_w),
            cjk_k: self.cjk_k.unwrap_or(d.cjk_k),
            cjk_w: self.cjk_w.unwrap_or(d.cjk_w),
        }
    }
}

impl Default for FingerprintConfig {
    fn default() -> Self {
        FingerprintConfig {
            window: Duration::from_secs(30 * 60),
            max_bytes: 512 << 20,
            common_tenants: 3,
            record_answers: true,
            word_k: None,
            word_w: None,
            cjk_k: None,
            cjk_w: None,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, rename_all = "kebab-case")]
pub struct DetectConfig {
    /// `cross_tenant_ngram`: another tenant's text in an answer.
    pub ngram: bool,
    /// `cross_tenant_pii`: another tenant's PII values or secrets.
    pub pii: bool,
    /// PII and secret rule files; unset, the rules built into the binary.
    /// Reloaded on SIGHUP and when a file changes.
    pub rules_dir: Option<PathBuf>,
    /// What incidents may show of a match: `hashes` (offsets, lengths, rule
    /// ids) or `masked-snippet`.
    pub evidence: crate::detect::cross_tenant::Evidence,
    /// Canary strings and per-tenant honeytokens.
    pub canary: Vec<crate::detect::canary::CanaryConfig>,
}

impl Default for DetectConfig {
    fn default() -> Self {
        DetectConfig {
            ngram: true,
            pii: true,
            rules_dir: None,
            evidence: Default::default(),
            canary: Vec::new(),
        }
    }
}

/// Which embeddings the semantic detectors use; `auto` is `cascade` on the
/// CPU and `transformer` on a GPU.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum TierChoice {
    #[default]
    Auto,
    Static,
    Transformer,
    Cascade,
}

/// How the CPU runs the embedding model's matrix products: `auto` is
/// `int8` on a CPU with AVX-512 VNNI and `f32` elsewhere. `int8` without
/// VNNI runs portable loops, many times slower than `f32`; it is there for
/// tests.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum CpuPrecisionChoice {
    #[default]
    Auto,
    Int8,
    F32,
}

/// How the semantic window stores vectors.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum PrecisionChoice {
    #[default]
    I8,
    F32,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, rename_all = "kebab-case")]
pub struct SemanticConfig {
    /// The semantic detectors (`semantic_leak`, `relevance`). Off unless
    /// set: they need the model folder (`models/fetch`).
    pub enabled: bool,
    /// A sentence-transformers folder (BERT family).
    pub model: PathBuf,
    pub tier: TierChoice,
    /// Thresholds of the window's space; unset, the measured defaults of the
    /// tier (see the README).
    pub leak_threshold: Option<f32>,
    pub margin: Option<f32>,
    pub relevance_threshold: Option<f32>,
    /// `cascade`: the transformer's relevance under which a static leak
    /// candidate, and an irrelevance candidate, are confirmed.
    pub confirm_leak: Option<f32>,
    pub confirm_relevance: Option<f32>,
    /// Tokens per chunk, tokens between chunk starts, chunks per text.
    pub chunk_tokens: usize,
    pub chunk_stride: usize,
    pub max_chunks: usize,
    /// Shorter answers are not judged.
    pub min_answer_tokens: usize,
    /// Chunk vectors the window holds (for `fingerprint.window`).
    pub window_chunks: usize,
    pub precision: PrecisionChoice,
    /// The model's matrix products on the CPU (not the GPU).
    pub cpu_precision: CpuPrecisionChoice,
    /// Let semantic findings block or redact non-streamed answers under
    /// `action`; off, they are reported (monitor) only.
    pub enforce: bool,
    /// How long a scan waits for the transformer.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// The embedding service: queued requests (more are shed), requests
    /// and tokens per model call, and how long a batch waits to fill.
    pub queue: usize,
    pub max_batch_requests: usize,
    pub max_batch_tokens: usize,
    #[serde(with = "humantime_serde")]
    pub max_wait: Duration,
}

impl Default for SemanticConfig {
    fn default() -> Self {
        SemanticConfig {
            enabled: false,
            model: PathBuf::from("models/all-MiniLM-L6-v2"),
            tier: TierChoice::Auto,
            leak_threshold: None,
            margin: None,
            relevance_threshold: None,
            confirm_leak: None,
            confirm_relevance: None,
            chunk_tokens: 96,
            chunk_stride: 64,
            max_chunks: 32,
            min_answer_tokens: 16,
            window_chunks: 100_000,
            precision: PrecisionChoice::I8,
            cpu_precision: CpuPrecisionChoice::Auto,
            enforce: false,
            timeout: Duration::from_secs(2),
            queue: 1024,
            max_batch_requests: 32,
            max_batch_tokens: 8192,
            max_wait: Duration::from_millis(5),
        }
    }
}

const SECTIONS: &[&str] = &[
    "server",
    "upstream",
    "tenant",
    "observe",
    "accounting",
    "incidents",
    "log",
    "privacy",
    "fingerprint",
    "detect",
    "semantic",
    "action",
    "route",
];

impl Config {
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::one(format!("{}: {e}", path.display())))?;
        Config::from_toml(&text)
    }

    /// Parses and validates. Each top-level section is read on its own so that
    /// a type error in one does not hide the errors of the others.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let table: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError::one(e.to_string()))?;
        let mut errors = Vec::new();
        for key in table.keys() {
            if !SECTIONS.contains(&key.as_str()) {
                errors.push(format!(
                    "{key}: unknown section (expected one of {})",
                    SECTIONS.join(", ")
                ));
            }
        }
        let mut config = Config::default();
        macro_rules! section {
            ($name:literal, $field:ident) => {
                if let Some(value) = table.get($name) {
                    if let Some(v) = read_section($name, value.clone(), &mut errors) {
                        config.$field = v;
                    }
                }
            };
        }
        section!("server", server);
        section!("upstream", upstream);
        section!("tenant", tenant);
        section!("observe", observe);
        section!("accounting", accounting);
        section!("incidents", incidents);
        section!("log", log);
        section!("privacy", privacy);
        section!("fingerprint", fingerprint);
        section!("detect", detect);
        section!("semantic", semantic);
        section!("action", action);
        section!("route", routes);
        errors.extend(config.validate());
        if errors.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError { errors })
        }
    }

    /// Value checks serde cannot make. Returns every problem found.
    pub fn validate(&self) -> Vec<String> {
        let mut errors = Vec::new();
        match self.upstream.url.parse::<http::Uri>() {
            Ok(uri) => {
                if !matches!(uri.scheme_str(), Some("http") | Some("https")) {
                    errors.push(format!(
                        "upstream.url: {:?} must start with http:// or https://",
                        self.upstream.url
                    ));
                } else if uri.authority().is_none() {
                    errors.push(format!("upstream.url: {:?} has no host", self.upstream.url));
                }
                if uri.query().is_some() {
                    errors.push(format!(
                        "upstream.url: {:?} must not carry a query",
                        self.upstream.url
                    ));
                }
            }
            Err(e) => errors.push(format!(
                "upstream.url: {:?} is not a URL: {e}",
                self.upstream.url
            )),
        }
        if let Some(ca) = &self.upstream.ca_file {
            if !ca.is_file() {
                errors.push(format!(
                    "upstream.ca-file: {} is not a readable file",
                    ca.display()
                ));
            }
        }
        for (name, d) in [
            ("upstream.connect-timeout", self.upstream.connect_timeout),
            ("upstream.response-timeout", self.upstream.response_timeout),
            ("upstream.idle-timeout", self.upstream.idle_timeout),
            (
                "server.header-read-timeout",
                self.server.header_read_timeout,
            ),
        ] {
            if d.is_zero() {
                errors.push(format!("{name}: must be greater than zero"));
            }
        }
        if self.server.listen == self.server.admin_listen && self.server.listen.port() != 0 {
            errors.push(format!(
                "server.admin-listen: {} is also server.listen; tenants must not reach the admin port",
                self.server.admin_listen
            ));
        }
        if self.server.max_request_bytes == 0 {
            errors.push("server.max-request-bytes: must be greater than zero".to_string());
        }
        if self.observe.max_queue_bytes == 0 {
            errors.push("observe.max-queue-bytes: must be greater than zero".to_string());
        }
        if self.server.max_buffered_bytes < self.server.max_request_bytes {
            errors.push(format!(
                "server.max-buffered-bytes: {} is below server.max-request-bytes ({}): no request that size could ever be read",
                self.server.max_buffered_bytes, self.server.max_request_bytes
            ));
        }
        if self.observe.queue == 0 {
            errors.push("observe.queue: must be at least 1".to_string());
        }
        if self.observe.workers == 0 || self.observe.workers > 64 {
            errors.push(format!(
                "observe.workers: {} is not in 1..=64",
                self.observe.workers
            ));
        }
        if !(self.accounting.min_ratio > 0.0 && self.accounting.min_ratio <= 1.0) {
            errors.push(format!(
                "accounting.min-ratio: {} is not in (0, 1]",
                self.accounting.min_ratio
            ));
        }
        let sem = &self.semantic;
        for (name, v) in [
            ("semantic.leak-threshold", sem.leak_threshold),
            ("semantic.margin", sem.margin),
            ("semantic.relevance-threshold", sem.relevance_threshold),
            ("semantic.confirm-leak", sem.confirm_leak),
            ("semantic.confirm-relevance", sem.confirm_relevance),
        ] {
            if let Some(v) = v {
                if !(-1.0..=1.0).contains(&v) {
                    errors.push(format!("{name}: {v} is not a cosine similarity in [-1, 1]"));
                }
            }
        }
        for (name, v) in [
            ("semantic.chunk-tokens", sem.chunk_tokens),
            ("semantic.chunk-stride", sem.chunk_stride),
            ("semantic.max-chunks", sem.max_chunks),
            ("semantic.window-chunks", sem.window_chunks),
            ("semantic.queue", sem.queue),
            ("semantic.max-batch-requests", sem.max_batch_requests),
            ("semantic.max-batch-tokens", sem.max_batch_tokens),
        ] {
            if v == 0 {
                errors.push(format!("{name}: must be at least 1"));
            }
        }
        if sem.chunk_tokens > 512 {
            errors.push(format!(
                "semantic.chunk-tokens: {} is more than a BERT model reads (512)",
                sem.chunk_tokens
            ));
        }
        if sem.max_chunks > 1024 {
            errors.push(format!(
                "semantic.max-chunks: {} is more than 1024",
                sem.max_chunks
            ));
        }
        if sem.min_answer_tokens > sem.chunk_tokens {
            errors.push(format!(
                "semantic.min-answer-tokens: {} is more than semantic.chunk-tokens ({}); answers are judged by their first chunk",
                sem.min_answer_tokens, sem.chunk_tokens
            ));
        }
        if sem.chunk_stride > sem.chunk_tokens {
            errors.push(format!(
                "semantic.chunk-stride: {} is more than semantic.chunk-tokens ({}): text between chunks would never be read",
                sem.chunk_stride, sem.chunk_tokens
            ));
        }
        if sem.timeout.is_zero() {
            errors.push("semantic.timeout: must be greater than zero".to_string());
        }
        if self.incidents.queue == 0 {
            errors.push("incidents.queue: must be at least 1".to_string());
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            errors.push(format!(
                "log.level: {:?} is not a valid filter: {e}",
                self.log.level
            ));
        }
        if let Some(key) = &self.privacy.hash_key {
            if let Err(e) = crate::hash::HashKey::from_hex(key) {
                errors.push(format!("privacy.hash-key: {e}"));
            }
        }
        if self.action.max_concurrent_scans == 0 {
            errors.push("action.max-concurrent-scans: must be at least 1".to_string());
        }
        if self.action.hold_back_chars < 64 {
            errors.push(format!(
                "action.hold-back-chars: {} is too small to hold one detection run; use 64 or more",
                self.action.hold_back_chars
            ));
        }
        if self.fingerprint.window.is_zero() {
            errors.push("fingerprint.window: must be greater than zero".to_string());
        }
        if self.fingerprint.common_tenants < 2 {
            errors.push(format!(
                "fingerprint.common-tenants: {} would discount every match; use 2 or more",
                self.fingerprint.common_tenants
            ));
        }
        for (name, v, max) in [
            ("fingerprint.word-k", self.fingerprint.word_k, 32),
            ("fingerprint.word-w", self.fingerprint.word_w, 64),
            ("fingerprint.cjk-k", self.fingerprint.cjk_k, 32),
            ("fingerprint.cjk-w", self.fingerprint.cjk_w, 64),
        ] {
            if let Some(v) = v {
                if v == 0 || v > max {
                    errors.push(format!("{name}: {v} is not in 1..={max}"));
                }
            }
        }
        if let Some(dir) = &self.detect.rules_dir {
            if !dir.is_dir() {
                errors.push(format!(
                    "detect.rules-dir: {} is not a folder",
                    dir.display()
                ));
            }
        }
        if let Err(errs) = crate::detect::canary::Canaries::new(&self.detect.canary) {
            errors.extend(errs.into_iter().map(|e| format!("detect.{e}")));
        }
        for (i, route) in self.routes.iter().enumerate() {
            if !route.path.starts_with('/') {
                errors.push(format!(
                    "route[{i}].path: {:?} must start with /",
                    route.path
                ));
            }
            if let Some(t) = &route.tokenizer {
                if !t.is_file() {
                    errors.push(format!(
                        "route[{i}].tokenizer: {} is not a readable file",
                        t.display()
                    ));
                }
            }
            if route.max_prompt_tokens == Some(0) {
                errors.push(format!(
                    "route[{i}].max-prompt-tokens: must be greater than zero"
                ));
            }
        }
        errors
    }
}

/// Deserializes one section, collecting unknown fields (all of them) and
/// type errors, each with its full path. After a type error the offending
/// value is removed and the section read again, so that every bad field is
/// reported, not just the first.
fn read_section<T: serde::de::DeserializeOwned>(
    name: &str,
    mut value: toml::Value,
    errors: &mut Vec<String>,
) -> Option<T> {
    let mut unknown = Vec::new();
    for _ in 0..64 {
        unknown.clear();
        let mut note = |path: serde_ignored::Path<'_>| unknown.push(path.to_string());
        let de = serde_ignored::Deserializer::new(value.clone(), &mut note);
        let result: Result<T, _> = serde_path_to_error::deserialize(de);
        match result {
            Ok(v) => {
                for path in &unknown {
                    errors.push(format!("{name}.{path}: unknown field"));
                }
                // Even after errors: validate what was readable, so its
                // problems are reported too. The config is rejected anyway.
                return Some(v);
            }
            Err(e) => {
                let segments: Vec<serde_path_to_error::Segment> =
                    e.path().iter().cloned().collect();
                let path = e.path().to_string();
                let at = if path == "." || path.is_empty() {
                    name.to_string()
                } else if path.starts_with('[') {
                    format!("{name}{path}")
                } else {
                    format!("{name}.{path}")
                };
                let message = e.into_inner().to_string();
                // toml repeats the key at the end ("…\nin `key`"); the path says it already.
                let message = message
                    .split("\nin `")
                    .next()
                    .unwrap_or("")
                    .trim_end()
                    .to_string();
                let line = format!("{at}: {message}");
                if !errors.contains(&line) {
                    errors.push(line);
                }
                if !remove_path(&mut value, &segments) {
                    for path in &unknown {
                        errors.push(format!("{name}.{path}: unknown field"));
                    }
                    return None;
                }
            }
        }
    }
    None
}

/// Removes the value at `path` from a TOML tree; false if there is none.
fn remove_path(value: &mut toml::Value, path: &[serde_path_to_error::Segment]) -> bool {
    use serde_path_to_error::Segment;
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut cur = value;
    for seg in parents {
        cur = match (seg, cur) {
            (Segment::Map { key }, toml::Value::Table(t)) => match t.get_mut(key) {
                Some(v) => v,
                None => return false,
            },
            (Segment::Seq { index }, toml::Value::Array(a)) => match a.get_mut(*index) {
                Some(v) => v,
                None => return false,
            },
            _ => return false,
        };
    }
    match (last, cur) {
        (Segment::Map { key }, toml::Value::Table(t)) => t.remove(key).is_some(),
        (Segment::Seq { index }, toml::Value::Array(a)) if *index < a.len() => {
            // Keep indices stable for the messages: replace the element with
            // an empty table; if it is one already (it lacks required
            // fields), drop it.
            let empty = toml::Value::Table(toml::Table::new());
            if a[*index] == empty {
                a.remove(*index);
            } else {
                a[*index] = empty;
            }
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_config_is_the_default() {
        assert_eq!(Config::from_toml("").unwrap(), Config::default());
    }

    #[test]
    fn example_file_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("residue.example.toml");
        let config = Config::from_file(&path).unwrap();
        assert_eq!(config.upstream.url, "http://127.0.0.1:8000");
    }

    #[test]
    fn every_error_is_reported_with_its_path() {
        let err = Config::from_toml(
            r#"
            bogus = 1
            [server]
            listen = "127.0.0.1:1"
            lisen = "x"
            [upstream]
            url = "ftp://x"
            idle-timeout = "0s"
            connect-timeout = "soon"
            h2c = "maybe"
            [accounting]
            min-ratio = 3.0
            [observe]
            queue = "many"
            [[route]]
            path = "v1"
            max-prompt-tokens = 0
            colour = "red"
            [tenant]
            chain = ["header", "telepathy"]
            "#,
        )
        .unwrap_err();
        let all = err.errors.join("\n");
        for needle in [
            "bogus: unknown section",
            "server.lisen: unknown field",
            "upstream.url",
            "upstream.idle-timeout: must be greater than zero",
            "upstream.connect-timeout: invalid value",
            "upstream.h2c: invalid type",
            "accounting.min-ratio",
            "observe.queue",
            "route[0].path",
            "route[0].max-prompt-tokens",
            "route.0.colour: unknown field",
            "tenant.chain",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
    }

    #[test]
    fn detector_and_action_sections_report_every_error() {
        let err = Config::from_toml(
            r#"
            [fingerprint]
            word-k = 0
            common-tenants = 1
            window = "0s"
            [detect]
            evidence = "everything"
            rules-dir = "/nonexistent/rules"
            [[detect.canary]]
            value = "short"
            [action]
            default = "nuke"
            hold-back-chars = 8
            [[action.tenant]]
            tenant = "acme"
            action = "shred"
            "#,
        )
        .unwrap_err();
        let all = err.errors.join("\n");
        for needle in [
            "fingerprint.word-k",
            "fingerprint.common-tenants",
            "fingerprint.window",
            "detect.evidence",
            "detect.rules-dir",
            "detect.canary[0].value",
            "action.default",
            "action.hold-back-chars",
            "action.tenant[0].action",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
    }

    #[test]
    fn semantic_section_parses_and_reports_every_error() {
        let config = Config::from_toml(
            r#"
            [semantic]
            enabled = true
            tier = "transformer"
            cpu-precision = "f32"
            "#,
        )
        .unwrap();
        assert_eq!(config.semantic.cpu_precision, CpuPrecisionChoice::F32);
        assert_eq!(
            Config::default().semantic.cpu_precision,
            CpuPrecisionChoice::Auto
        );
        let err = Config::from_toml(
            r#"
            [semantic]
            cpu-precision = "int4"
            "#,
        )
        .unwrap_err();
        let all = err.errors.join("\n");
        assert!(all.contains("semantic.cpu-precision"), "{all}");
        let err = Config::from_toml(
            r#"
            [semantic]
            leak-threshold = 1.5
            chunk-tokens = 600
            max-chunks = 2000
            min-answer-tokens = 700
            timeout = "0s"
            "#,
        )
        .unwrap_err();
        let all = err.errors.join("\n");
        for needle in [
            "semantic.leak-threshold",
            "semantic.chunk-tokens",
            "semantic.max-chunks",
            "semantic.min-answer-tokens",
            "semantic.timeout",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
    }

    #[test]
    fn hostile_input_is_an_error_not_a_panic() {
        for text in [
            "[server",
            "server = 5",
            "[[server]]\nlisten = 1",
            "[server]\nlisten = \"not an address\"",
            "[server]\ndrain-timeout = \"forever\"",
            "[upstream]\nurl = \"\"",
            "[upstream]\nurl = \"http://\"",
            "[privacy]\nhash-key = \"00\"",
            "[log]\nlevel = \"[[[\"",
            "\u{0}",
            &"[a]\n".repeat(10_000),
        ] {
            assert!(Config::from_toml(text).is_err(), "accepted {text:?}");
        }
    }
}
