//! The vocabulary the incident replay shares: the faults the simulator
//! (`residue sim`) injects, the ground truth it writes for every response,
//! and the headers the traffic generator (`residue load`) and the simulator
//! agree on. The scorecard joins ground truth and residue's incidents on the
//! request id.
//!
//! Ground truth is a test harness's file, not residue's: it may name
//! tenants and requests, but like everything else here it holds no raw
//! prompt or answer text — spans and counts only.

use serde::{Deserialize, Serialize};

/// The header carrying the traffic generator's request id; residue honours
/// it, forwards it upstream and puts it in its incidents.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// The header naming the requesting tenant (residue's tenant header; the
/// demo runs residue with `tenant.trust-header = true`).
pub const TENANT_HEADER: &str = "x-tenant-id";

/// A fault of the simulated engine.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// A prompt over the prefill capacity is replaced by a one-token
    /// placeholder; the answer is decoded from KV pages still holding an
    /// earlier request's content; `usage.prompt_tokens` is 1.
    Placeholder,
    /// Under concurrency, a request receives the answer meant for an
    /// earlier request.
    StaleBlock,
    /// A correct answer with a fragment of another request spliced in.
    Splice,
    /// Chat-template tokens or gibberish.
    Garbage,
}

impl Fault {
    pub const ALL: [Fault; 4] = [
        Fault::Placeholder,
        Fault::StaleBlock,
        Fault::Splice,
        Fault::Garbage,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Fault::Placeholder => "placeholder",
            Fault::StaleBlock => "stale_block",
            Fault::Splice => "splice",
            Fault::Garbage => "garbage",
        }
    }

    /// Whether the fault puts another request's content into the answer.
    pub fn leaks(&self) -> bool {
        !matches!(self, Fault::Garbage)
    }
}

/// One response's ground truth: one JSON line per response the simulator
/// sent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Truth {
    /// When the response head was sent: RFC 3339, UTC, milliseconds.
    pub time: String,
    pub request_id: String,
    /// The requesting tenant (from [`TENANT_HEADER`]; `unknown` without).
    pub tenant: String,
    /// `chat`, `completions` or `generate`.
    pub endpoint: String,
    pub stream: bool,
    /// The fault injected into this response, if any.
    pub fault: Option<Fault>,
    /// Whether the answer carries another request's content.
    pub leaked: bool,
    /// Where that content came from.
    pub source_request_id: Option<String>,
    pub source_tenant: Option<String>,
    /// Byte span of the foreign content in the answer text.
    pub span: Option<(usize, usize)>,
    /// Length of the foreign content, in words (CJK characters count one
    /// each). For `stale_block`, whose whole answer is foreign but mostly
    /// template, the longest run of its owner's own words in it.
    pub leaked_words: usize,
    /// Tenant-specific PII values (residue's rules) inside the foreign
    /// content.
    pub leaked_pii: usize,
    /// What the engine reported as `prompt_tokens`, and what the prompt
    /// really held (estimate).
    pub prompt_tokens_reported: u64,
    pub prompt_tokens_real: u64,
}
