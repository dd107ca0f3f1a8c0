//! The semantic detectors: leaks the model paraphrased, and answers to a
//! question nobody asked.
//!
//! Every prompt is cut into overlapping chunks of tokens and each chunk's
//! embedding is kept, per tenant, in a [`VectorWindow`] for as long as the
//! fingerprints. Every answer is cut the same way and each chunk searched
//! against the window (one batched product per answer):
//!
//! - `semantic_leak`: an answer chunk whose nearest *foreign* prompt chunk
//!   scores at least `leak-threshold` while the requester's own prompt (this
//!   one, or its earlier ones in the window) scores at least `margin` less:
//!   the answer is about someone else's question. Only prompts are compared,
//!   so that both sides are questions; a topic many tenants ask about
//!   scores as high against the requester's own prompt as against theirs and
//!   fails the margin, and one that `common-tenants` or more foreign tenants
//!   asked about is not evidence at all.
//! - `relevance`: the answer's best chunk-to-own-prompt similarity is under
//!   `relevance-threshold`: a `200` answering nothing that was asked.
//!   Every scanned answer's similarity goes to
//!   `residue_semantic_relevance{tier}`.
//!
//! Tiers (the space vectors live in):
//! - `static`: the distilled token table ([`StaticEmbedder`]); microseconds
//!   per answer.
//! - `transformer`: the model through the [`EmbedService`]; every prompt and
//!   answer chunk goes through it.
//! - `cascade`: the static tier on everything, and the transformer re-reads
//!   only the answers the static tier flags — the answer's chunks against
//!   its own prompt — and the finding stands only when the transformer too
//!   finds the answer unrelated to its prompt. A candidate the transformer
//!   cannot confirm in time (queue full, timeout) is counted
//!   (`residue_semantic_skipped_total`), not reported.
//!
//! Findings never carry text: scores, chunk byte ranges and the source
//! tenant's key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::json;
use tokenizers::Tokenizer;

use super::{Detector, Finding, ScanInput, Severity, TenantNames};
use crate::embed::chunk::{chunks, Chunk, ChunkParams, Keep};
use crate::embed::window::VectorWindow;
use crate::embed::{EmbedError, EmbedService, StaticEmbedder};
use crate::metrics::Metrics;
use crate::protocol::Prompt;
use crate::store::{ContentKind, TenantKey};
use crate::tenant::Tenant;

pub const LEAK: &str = "semantic_leak";
pub const RELEVANCE: &str = "relevance";

/// Which embeddings the detectors use.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    Static,
    Transformer,
    Cascade,
}

impl Tier {
    pub fn as_str(&self) -> &'static str {
        match self {
            Tier::Static => "static",
            Tier::Transformer => "transformer",
            Tier::Cascade => "cascade",
        }
    }
}

/// Thresholds of one embedding space (cosine similarities).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// A foreign prompt chunk at least this similar to an answer chunk is a
    /// candidate source.
    pub leak: f32,
    /// ... when the requester's own prompt is at least this much less
    /// similar to the same answer chunk.
    pub margin: f32,
    /// An answer whose best chunk is less similar than this to its own
    /// prompt is irrelevant.
    pub relevance: f32,
}

/// Settings, already validated.
#[derive(Clone, Debug)]
pub struct Settings {
    pub tier: Tier,
    /// The thresholds of the space the window holds (static for `static`
    /// and `cascade`).
    pub search: Thresholds,
    /// The transformer's relevance bars when it confirms a cascade
    /// candidate: under `confirm_leak` a leak candidate stands (the answer
    /// is not about its own prompt), under `confirm_relevance` an
    /// irrelevance candidate does.
    pub confirm_leak: f32,
    pub confirm_relevance: f32,
    pub chunks: ChunkParams,
    /// Answers of fewer tokens are not judged ("Yes.", "Done.").
    pub min_answer_tokens: usize,
    /// A topic this many foreign tenants asked about is not evidence.
    pub common_tenants: u32,
    /// How long a scan waits for the transformer.
    pub timeout: Duration,
}

/// Where the detectors' vectors come from.
pub struct Embeddings {
    /// The static table; required by `static` and `cascade`.
    pub table: Option<Arc<StaticEmbedder>>,
    /// The transformer; required by `transformer` and `cascade`.
    pub service: Option<EmbedService>,
    /// The tokenizer chunks are cut with (no special tokens, no truncation).
    pub tokenizer: Tokenizer,
}

pub struct Semantic {
    settings: Settings,
    embeddings: Embeddings,
    window: VectorWindow,
    /// `cascade`: the transformer's vectors of prompt chunks, filled off
    /// the scanners as the model has room (a prompt it sheds is only in the
    /// static window), so that a candidate is decided in the model's space.
    deep: Option<Arc<VectorWindow>>,
    names: TenantNames,
    runtime: tokio::runtime::Handle,
    metrics: Metrics,
    next_record: AtomicU64,
}

/// Why a check could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SemanticError {
    #[error("semantic tier {tier} needs {what}")]
    Missing {
        tier: &'static str,
        what: &'static str,
    },
    #[error(transparent)]
    Embed(#[from] EmbedError),
    #[error("the transformer did not answer within {0:?}")]
    Timeout(Duration),
    #[error("semantic window: {0}")]
    Window(String),
    #[error("{0}")]
    Config(String),
}

impl SemanticError {
    fn reason(&self) -> &'static str {
        match self {
            SemanticError::Missing { .. } | SemanticError::Config(_) => "misconfigured",
            SemanticError::Embed(EmbedError::Overloaded) => "shed",
            SemanticError::Embed(EmbedError::Stopped) => "stopped",
            SemanticError::Embed(_) => "error",
            SemanticError::Timeout(_) => "timeout",
            SemanticError::Window(_) => "error",
        }
    }
}

/// The scores behind one check.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Scores {
    /// The answer's best chunk-to-own-prompt similarity (None: not judged).
    pub relevance: Option<f32>,
    /// The answer chunk with the largest foreign-minus-own margin among
    /// those with a foreign hit above the leak threshold: (source, foreign
    /// similarity, own similarity).
    pub best_foreign: Option<(TenantKey, f32, f32)>,
    /// The transformer's relevance, when the cascade asked it.
    pub transformer_relevance: Option<f32>,
}

/// A candidate source of one answer: the foreign tenant and the answer
/// chunks that point at it.
#[derive(Clone, Debug, PartialEq)]
struct Source {
    tenant: TenantKey,
    /// Indices into the answer's chunks.
    chunks: Vec<usize>,
    /// The best foreign similarity, and the requester's own similarity of
    /// that chunk.
    score: f32,
    own: f32,
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The best similarity of `a` to any of `prompt` (−1 when there is none).
fn best_against(a: &[f32], prompt: &[Vec<f32>]) -> f32 {
    prompt.iter().map(|p| dot(a, p)).fold(-1.0, f32::max)
}

/// The prompt chunks (its last ones) the cascade embeds with the model.
const DEEP_PROMPT_CHUNKS: usize = 4;

/// Foreign tenants within this much of the best one are "as close".
const COMMON_BAND: f32 = 0.05;

/// The decision, from vectors and window hits: candidate sources and the
/// answer's relevance. Pure, so it can be tested with made-up vectors.
fn decide(
    answer: &[Vec<f32>],
    prompt: &[Vec<f32>],
    hits: &[crate::embed::window::QueryHits],
    t: Thresholds,
    common_tenants: u32,
) -> (Vec<Source>, f32) {
    let relevance = answer
        .iter()
        .map(|a| best_against(a, prompt))
        .fold(-1.0, f32::max);
    let mut sources: Vec<Source> = Vec::new();
    for (i, (a, h)) in answer.iter().zip(hits).enumerate() {
        let own = best_against(a, prompt).max(h.own_best);
        let Some(best) = h.hits.first() else { continue };
        // Not distinctive: `common_tenants` foreign tenants asked about
        // this nearly as closely as the best one — a topic, not a source.
        let close = h
            .hits
            .iter()
            .filter(|x| x.score >= best.score - COMMON_BAND)
            .count();
        if common_tenants > 0 && close >= common_tenants as usize {
            continue;
        }
        if best.score < t.leak || best.score - own < t.margin {
            continue;
        }
        match sources.iter_mut().find(|s| s.tenant == best.tenant) {
            Some(s) => {
                s.chunks.push(i);
                if best.score > s.score {
                    s.score = best.score;
                    s.own = own;
                }
            }
            None => sources.push(Source {
                tenant: best.tenant,
                chunks: vec![i],
                score: best.score,
                own,
            }),
        }
    }
    sources.sort_by(|a, b| b.score.total_cmp(&a.score));
    (sources, relevance)
}

/// The measured defaults of one space (see the README's semantic section
/// and `cargo bench --bench semantic`).
pub fn default_thresholds(tier: Tier) -> Thresholds {
    match tier {
        // On ShareGPT, clean answers' best foreign-minus-own margin has p99
        // 0.37; leaked answers' p5 is 0.30. Relevance: clean p1 0.105,
        // leaked p50 0.100.
        Tier::Transformer => Thresholds {
            leak: 0.45,
            margin: 0.3,
            relevance: 0.1,
        },
        // The static space has a high floor (unrelated texts score 0.4-0.5):
        // standalone it needs high bars and still separates poorly.
        Tier::Static => Thresholds {
            leak: 0.6,
            margin: 0.2,
            relevance: 0.3,
        },
        // A net for candidates, wide on relevance: the transformer decides.
        Tier::Cascade => Thresholds {
            leak: 0.6,
            margin: 0.2,
            relevance: 0.45,
        },
    }
}

/// The transformer's bar for confirming a cascade irrelevance candidate.
pub const DEFAULT_CONFIRM_RELEVANCE: f32 = 0.1;
/// ... and of a leak candidate, looser: the static tier already found the
/// source (leaked answers' transformer relevance p95 is 0.26 on ShareGPT;
/// clean answers' p5 is 0.22).
pub const DEFAULT_CONFIRM_LEAK: f32 = 0.25;

/// Builds the detectors from their config: loads the model, picks the tier
/// (`auto`: `cascade` on the CPU, `transformer` on a GPU), distills or
/// loads the static table when the tier needs it, starts the embedding
/// service. Blocking: call it off the async workers.
pub fn build(
    config: &crate::config::SemanticConfig,
    window_ttl: Duration,
    names: TenantNames,
    runtime: tokio::runtime::Handle,
    metrics: &Metrics,
) -> Result<Semantic, SemanticError> {
    use crate::config::{CpuPrecisionChoice, PrecisionChoice, TierChoice};
    use crate::embed::CpuPrecision;
    let embedder = crate::embed::Embedder::load_as(
        &config.model,
        match config.cpu_precision {
            CpuPrecisionChoice::Auto => CpuPrecision::Auto,
            CpuPrecisionChoice::Int8 => CpuPrecision::Int8,
            CpuPrecisionChoice::F32 => CpuPrecision::F32,
        },
    )?;
    let on_gpu = embedder.device_name() != "cpu";
    let tier = match config.tier {
        TierChoice::Auto if on_gpu => Tier::Transformer,
        TierChoice::Auto | TierChoice::Cascade => Tier::Cascade,
        TierChoice::Static => Tier::Static,
        TierChoice::Transformer => Tier::Transformer,
    };
    if config.chunk_tokens + 2 > embedder.max_seq_len() {
        return Err(SemanticError::Config(format!(
            "semantic.chunk-tokens: {} tokens plus [CLS] and [SEP] is more than the model reads ({})",
            config.chunk_tokens,
            embedder.max_seq_len()
        )));
    }
    let tokenizer = embedder.plain_tokenizer()?;
    let table = match tier {
        Tier::Static | Tier::Cascade => Some(Arc::new(StaticEmbedder::load_or_distill(
            &config.model,
            &embedder,
        )?)),
        Tier::Transformer => None,
    };
    let dim = embedder.dimension();
    let service = match tier {
        Tier::Transformer | Tier::Cascade => Some(EmbedService::start(
            embedder,
            crate::embed::BatchConfig {
                queue: config.queue,
                max_batch_tokens: config.max_batch_tokens,
                max_batch_requests: config.max_batch_requests,
                max_wait: config.max_wait,
            },
            metrics,
        )),
        Tier::Static => None,
    };
    let d = default_thresholds(tier);
    let settings = Settings {
        tier,
        search: Thresholds {
            leak: config.leak_threshold.unwrap_or(d.leak),
            margin: config.margin.unwrap_or(d.margin),
            relevance: config.relevance_threshold.unwrap_or(d.relevance),
        },
        confirm_leak: config.confirm_leak.unwrap_or(DEFAULT_CONFIRM_LEAK),
        confirm_relevance: config
            .confirm_relevance
            .unwrap_or(DEFAULT_CONFIRM_RELEVANCE),
        chunks: ChunkParams {
            tokens: config.chunk_tokens,
            stride: config.chunk_stride,
            max_chunks: config.max_chunks,
        },
        min_answer_tokens: config.min_answer_tokens,
        common_tenants: 3,
        timeout: config.timeout,
    };
    let precision = match config.precision {
        PrecisionChoice::I8 => crate::embed::window::Precision::I8,
        PrecisionChoice::F32 => crate::embed::window::Precision::F32,
    };
    let window = VectorWindow::new(dim, config.window_chunks, window_ttl, precision)
        .map_err(|e| SemanticError::Window(e.to_string()))?;
    tracing::info!(
        tier = tier.as_str(),
        device = if on_gpu { "gpu" } else { "cpu" },
        "Semantic detectors on."
    );
    Semantic::new(
        settings,
        Embeddings {
            table,
            service,
            tokenizer,
        },
        window,
        names,
        runtime,
        metrics.clone(),
    )
}

impl Semantic {
    pub fn new(
        settings: Settings,
        embeddings: Embeddings,
        window: VectorWindow,
        names: TenantNames,
        runtime: tokio::runtime::Handle,
        metrics: Metrics,
    ) -> Result<Semantic, SemanticError> {
        let tier = settings.tier.as_str();
        let needs_table = matches!(settings.tier, Tier::Static | Tier::Cascade);
        let needs_model = matches!(settings.tier, Tier::Transformer | Tier::Cascade);
        if needs_table && embeddings.table.is_none() {
            return Err(SemanticError::Missing {
                tier,
                what: "the static table",
            });
        }
        if needs_model && embeddings.service.is_none() {
            return Err(SemanticError::Missing {
                tier,
                what: "the embedding model",
            });
        }
        let deep = match settings.tier {
            Tier::Cascade => Some(Arc::new(
                VectorWindow::new(
                    window.dim(),
                    window.capacity(),
                    window.ttl(),
                    window.precision(),
                )
                .map_err(|e| SemanticError::Window(e.to_string()))?,
            )),
            _ => None,
        };
        Ok(Semantic {
            settings,
            embeddings,
            window,
            deep,
            names,
            runtime,
            metrics,
            next_record: AtomicU64::new(1),
        })
    }

    pub fn tier(&self) -> Tier {
        self.settings.tier
    }

    /// `cascade`: chunk vectors the model's window holds.
    pub fn model_window_chunks(&self) -> Option<u64> {
        self.deep.as_ref().map(|d| d.stats().entries)
    }

    fn cut(&self, text: &str, keep: Keep) -> Result<Vec<Chunk>, SemanticError> {
        Ok(chunks(
            &self.embeddings.tokenizer,
            text,
            self.settings.chunks,
            keep,
        )?)
    }

    /// Vectors in the window's space.
    fn search_space(&self, text: &str, chunks: &[Chunk]) -> Result<Vec<Vec<f32>>, SemanticError> {
        match (self.settings.tier, &self.embeddings.table) {
            (Tier::Static | Tier::Cascade, Some(table)) => {
                Ok(chunks.iter().map(|c| table.embed_ids(&c.ids)).collect())
            }
            _ => self.transformer(text, chunks),
        }
    }

    /// The transformer's vectors of `chunks` of `text`, waiting at most the
    /// configured timeout.
    fn transformer(&self, text: &str, chunks: &[Chunk]) -> Result<Vec<Vec<f32>>, SemanticError> {
        let Some(service) = &self.embeddings.service else {
            return Err(SemanticError::Missing {
                tier: self.settings.tier.as_str(),
                what: "the embedding model",
            });
        };
        let texts: Vec<String> = chunks
            .iter()
            .map(|c| text.get(c.start..c.end).unwrap_or_default().to_string())
            .collect();
        let rx = service.try_submit(texts).map_err(EmbedError::from)?;
        let timeout = self.settings.timeout;
        match self
            .runtime
            .block_on(async { tokio::time::timeout(timeout, rx).await })
        {
            Ok(Ok(reply)) => Ok(reply?),
            Ok(Err(_)) => Err(EmbedError::Stopped.into()),
            Err(_) => Err(SemanticError::Timeout(timeout)),
        }
    }

    fn skipped(&self, e: &SemanticError) {
        self.metrics
            .semantic_skipped
            .with_label_values(&[e.reason()])
            .inc();
        tracing::debug!(error = %e, "A semantic check was skipped.");
    }

    /// Records a prompt's chunks as its tenant's, when the request arrives.
    pub fn record_prompt(&self, tenant: &Tenant, prompt: &Prompt) {
        if let Err(e) = self.try_record_prompt(tenant, prompt) {
            self.skipped(&e);
        }
    }

    fn try_record_prompt(&self, tenant: &Tenant, prompt: &Prompt) -> Result<(), SemanticError> {
        let text = prompt.text();
        let chunks = self.cut(&text, Keep::Tail)?;
        if chunks.is_empty() {
            return Ok(());
        }
        let vectors = self.search_space(&text, &chunks)?;
        let (chunks, vectors) = meaningful(chunks, vectors);
        if vectors.is_empty() {
            return Ok(());
        }
        let record = self.next_record.fetch_add(1, Ordering::Relaxed);
        let key = self.names.key_of(tenant);
        self.window
            .insert(key, record, ContentKind::Prompt, &vectors)
            .map_err(|e| SemanticError::Window(e.to_string()))?;
        if let (Some(deep), Some(service)) = (&self.deep, &self.embeddings.service) {
            let texts: Vec<String> = chunks
                .iter()
                .rev()
                .take(DEEP_PROMPT_CHUNKS)
                .map(|c| text.get(c.start..c.end).unwrap_or_default().to_string())
                .collect();
            match service.try_submit(texts) {
                Ok(rx) => {
                    let (deep, metrics, timeout) =
                        (deep.clone(), self.metrics.clone(), self.settings.timeout);
                    self.runtime.spawn(async move {
                        let reason = match tokio::time::timeout(timeout, rx).await {
                            Ok(Ok(Ok(v))) => {
                                match deep.insert(key, record, ContentKind::Prompt, &v) {
                                    Ok(()) => return,
                                    Err(_) => "error",
                                }
                            }
                            Ok(Ok(Err(_))) | Ok(Err(_)) => "error",
                            Err(_) => "timeout",
                        };
                        metrics.semantic_skipped.with_label_values(&[reason]).inc();
                    });
                }
                Err(shed) => self.skipped(&SemanticError::Embed(shed.into())),
            }
        }
        self.metrics
            .semantic_window_chunks
            .set(self.window.stats().entries as i64);
        Ok(())
    }

    /// Checks one answer on the blocking pool and reports what it finds as
    /// monitored: for answers whose verdict the semantic findings may not
    /// change, so that nobody waits for the model.
    #[allow(clippy::too_many_arguments)]
    pub fn check_later(
        self: &Arc<Self>,
        incidents: crate::incident::IncidentSink,
        request_id: Arc<str>,
        tenant: Tenant,
        endpoint: crate::protocol::Endpoint,
        status: u16,
        prompt: Arc<Prompt>,
        answer: String,
    ) {
        let this = self.clone();
        self.runtime
            .spawn_blocking(move || match this.check(&tenant, &prompt, &answer) {
                Ok(findings) => {
                    for f in findings {
                        incidents.report_for(&request_id, &tenant, endpoint, status, f, "monitor");
                    }
                }
                Err(e) => this.skipped(&e),
            });
    }

    /// Checks one answer against its prompt and the window.
    pub fn check(
        &self,
        tenant: &Tenant,
        prompt: &Prompt,
        answer: &str,
    ) -> Result<Vec<Finding>, SemanticError> {
        self.check_scored(tenant, prompt, answer).map(|(f, _)| f)
    }

    /// [`Semantic::check`], with the scores behind the decision (for
    /// calibration and benchmarks).
    pub fn check_scored(
        &self,
        tenant: &Tenant,
        prompt: &Prompt,
        answer: &str,
    ) -> Result<(Vec<Finding>, Scores), SemanticError> {
        let mut scores = Scores::default();
        let started = Instant::now();
        let answer_chunks = self.cut(answer, Keep::Head)?;
        let answer_tokens: usize = match answer_chunks.as_slice() {
            [] => 0,
            [one] => one.ids.len(),
            _ => usize::MAX,
        };
        if answer_tokens < self.settings.min_answer_tokens.max(1) {
            return Ok((Vec::new(), scores));
        }
        let prompt_text = prompt.text();
        let prompt_chunks = self.cut(&prompt_text, Keep::Tail)?;
        if prompt_chunks.is_empty() {
            // Token ids only: nothing to compare the answer with.
            return Err(SemanticError::Embed(EmbedError::Tokenize(
                "the prompt has no text".into(),
            )));
        }
        let answer_vecs = self.search_space(answer, &answer_chunks)?;
        let (answer_chunks, answer_vecs) = meaningful(answer_chunks, answer_vecs);
        let prompt_vecs = self.search_space(&prompt_text, &prompt_chunks)?;
        let (prompt_chunks, prompt_vecs) = meaningful(prompt_chunks, prompt_vecs);
        if answer_vecs.is_empty() || prompt_vecs.is_empty() {
            return Ok((Vec::new(), scores));
        }
        let requester = self.names.key_of(tenant);
        let hits = self
            .window
            .search(
                &answer_vecs,
                requester,
                self.settings.search.leak,
                self.settings.common_tenants.max(1) as usize + 1,
            )
            .map_err(|e| SemanticError::Window(e.to_string()))?;
        let (mut sources, relevance) = decide(
            &answer_vecs,
            &prompt_vecs,
            &hits,
            self.settings.search,
            self.settings.common_tenants,
        );
        scores.relevance = Some(relevance);
        scores.best_foreign = hits
            .iter()
            .zip(&answer_vecs)
            .filter_map(|(h, a)| {
                let best = h.hits.first()?;
                Some((
                    best.tenant,
                    best.score,
                    best_against(a, &prompt_vecs).max(h.own_best),
                ))
            })
            .max_by(|x, y| (x.1 - x.2).total_cmp(&(y.1 - y.2)));
        let space = match self.settings.tier {
            Tier::Transformer => "transformer",
            _ => "static",
        };
        self.metrics
            .semantic_relevance
            .with_label_values(&[space])
            .observe(relevance as f64);
        let mut irrelevant = relevance < self.settings.search.relevance;
        // The transformer's view, when the cascade asks for it.
        let mut confirmed: Option<f32> = None;
        // Which window found the sources.
        let mut source_space = space;
        if self.settings.tier == Tier::Cascade && (irrelevant || !sources.is_empty()) {
            match self.confirm(
                requester,
                answer,
                &answer_chunks,
                &prompt_text,
                &prompt_chunks,
                &sources,
            ) {
                Ok((r, r_leak, deep_sources)) => {
                    // The model's own window decides where it has the
                    // source; else the static source stands when the model
                    // too finds the answer off its prompt.
                    let keep_leak = !deep_sources.is_empty() || r_leak < self.settings.confirm_leak;
                    let keep_relevance = r < self.settings.confirm_relevance;
                    for (detector, had, keep) in [
                        (
                            LEAK,
                            !sources.is_empty() || !deep_sources.is_empty(),
                            keep_leak,
                        ),
                        (RELEVANCE, irrelevant, keep_relevance),
                    ] {
                        if had {
                            self.metrics
                                .semantic_confirmations
                                .with_label_values(&[
                                    detector,
                                    if keep { "confirmed" } else { "dismissed" },
                                ])
                                .inc();
                        }
                    }
                    if !deep_sources.is_empty() {
                        sources = deep_sources;
                        source_space = "transformer";
                    } else if !keep_leak {
                        sources.clear();
                    }
                    if !keep_relevance {
                        irrelevant = false;
                    }
                    confirmed = Some(r);
                    scores.transformer_relevance = Some(r);
                }
                Err(e) => {
                    self.skipped(&e);
                    sources.clear();
                    irrelevant = false;
                }
            }
        }
        let mut findings = Vec::new();
        for s in &sources {
            let spans: Vec<(usize, usize)> = s
                .chunks
                .iter()
                .map(|&i| (answer_chunks[i].start, answer_chunks[i].end))
                .collect();
            let margin = s.score - s.own;
            findings.push(Finding {
                detector: LEAK,
                severity: Severity::High,
                score: (s.score as f64).clamp(0.0, 1.0),
                evidence: json!({
                    "source_tenant": self.names.show(s.tenant),
                    "source_kind": "prompt",
                    "tier": self.settings.tier.as_str(),
                    "space": source_space,
                    "similarity": round(s.score),
                    "own_similarity": round(s.own),
                    "margin": round(margin),
                    "chunks": s.chunks.len(),
                    "answer_chunks": answer_chunks.len(),
                    "offsets": spans,
                    "transformer_relevance": confirmed.map(round),
                }),
                spans,
            });
        }
        if irrelevant {
            findings.push(Finding {
                detector: RELEVANCE,
                severity: Severity::Medium,
                score: (1.0 - relevance as f64).clamp(0.0, 1.0),
                evidence: json!({
                    "tier": self.settings.tier.as_str(),
                    "relevance": round(relevance),
                    "threshold": round(self.settings.search.relevance),
                    "answer_chunks": answer_chunks.len(),
                    "prompt_chunks": prompt_chunks.len(),
                    "transformer_relevance": confirmed.map(round),
                }),
                spans: Vec::new(),
            });
        }
        self.metrics
            .semantic_seconds
            .with_label_values(&[self.settings.tier.as_str()])
            .observe(started.elapsed().as_secs_f64());
        Ok((findings, scores))
    }

    /// The transformer's view of a cascade candidate: the relevance of the
    /// flagged answer chunks (or the answer's first ones) to the prompt's
    /// last chunks, and the sources the model's own window points at.
    fn confirm(
        &self,
        requester: TenantKey,
        answer: &str,
        answer_chunks: &[Chunk],
        prompt: &str,
        prompt_chunks: &[Chunk],
        sources: &[Source],
    ) -> Result<(f32, f32, Vec<Source>), SemanticError> {
        const MOST: usize = 4;
        let mut picked: Vec<usize> = sources
            .iter()
            .flat_map(|s| s.chunks.iter().copied())
            .collect();
        picked.sort_unstable();
        picked.dedup();
        let flagged = picked.len().min(MOST);
        let rest: Vec<usize> = (0..answer_chunks.len())
            .filter(|i| !picked.contains(i))
            .collect();
        picked.extend(rest);
        picked.truncate(MOST);
        let a: Vec<Chunk> = picked.iter().map(|&i| answer_chunks[i].clone()).collect();
        let p = &prompt_chunks[prompt_chunks.len().saturating_sub(MOST)..];
        let av = self.transformer(answer, &a)?;
        let pv = self.transformer(prompt, p)?;
        let relevance = av.iter().map(|x| best_against(x, &pv)).fold(-1.0, f32::max);
        // A leak is judged on its own chunks: an on-topic rest of the answer
        // must not vouch for a foreign paragraph.
        let leak_relevance = if flagged > 0 {
            av[..flagged]
                .iter()
                .map(|x| best_against(x, &pv))
                .fold(-1.0, f32::max)
        } else {
            relevance
        };
        let mut deep_sources = Vec::new();
        if let Some(deep) = &self.deep {
            let t = default_thresholds(Tier::Transformer);
            let hits = deep
                .search(
                    &av,
                    requester,
                    t.leak,
                    self.settings.common_tenants.max(1) as usize + 1,
                )
                .map_err(|e| SemanticError::Window(e.to_string()))?;
            let (mut found, _) = decide(&av, &pv, &hits, t, self.settings.common_tenants);
            for s in &mut found {
                s.chunks = s.chunks.iter().map(|&i| picked[i]).collect();
            }
            deep_sources = found;
        }
        Ok((relevance, leak_relevance, deep_sources))
    }
}

/// The chunks whose vectors say something: a chunk of only special or
/// unknown tokens embeds to the zero vector, similar to nothing.
fn meaningful(chunks: Vec<Chunk>, vectors: Vec<Vec<f32>>) -> (Vec<Chunk>, Vec<Vec<f32>>) {
    chunks
        .into_iter()
        .zip(vectors)
        .filter(|(_, v)| v.iter().any(|&x| x != 0.0))
        .unzip()
}

fn round(x: f32) -> f64 {
    (x as f64 * 1000.0).round() / 1000.0
}

impl Detector for Semantic {
    fn name(&self) -> &'static str {
        "semantic"
    }

    fn inspect(&self, input: &ScanInput<'_>) -> Vec<Finding> {
        if !(200..300).contains(&input.exchange.status) {
            return Vec::new();
        }
        match self.check(
            &input.exchange.tenant,
            &input.exchange.prompt,
            &input.output.scan_text(),
        ) {
            Ok(findings) => findings,
            Err(e) => {
                self.skipped(&e);
                Vec::new()
            }
        }
    }
}

/// Joins semantic and exact evidence about the same answer: a semantic leak
/// whose source an exact detector also named is corroborated (its score and
/// severity rise to the exact finding's), and both say so; an irrelevant
/// answer already explained by a leak says which.
pub fn fuse(findings: &mut [Finding]) {
    const EXACT: &[&str] = &[
        super::cross_tenant::NGRAM,
        super::cross_tenant::PII,
        super::cross_tenant::CANARY,
    ];
    let exact: HashMap<String, (Vec<&'static str>, f64, Severity)> = findings
        .iter()
        .filter(|f| EXACT.contains(&f.detector))
        .fold(HashMap::new(), |mut m, f| {
            let mut sources: Vec<String> = Vec::new();
            if let Some(s) = f.evidence.get("source_tenant").and_then(|s| s.as_str()) {
                sources.push(s.to_string());
            }
            if let Some(list) = f.evidence.get("source_tenants").and_then(|s| s.as_array()) {
                sources.extend(list.iter().filter_map(|s| s.as_str()).map(String::from));
            }
            if let Some(s) = f.evidence.get("owner").and_then(|s| s.as_str()) {
                sources.push(s.to_string());
            }
            for s in sources {
                let e = m.entry(s).or_insert((Vec::new(), 0.0, Severity::Low));
                if !e.0.contains(&f.detector) {
                    e.0.push(f.detector);
                }
                e.1 = e.1.max(f.score);
                e.2 = e.2.max(f.severity);
            }
            m
        });
    let leak_sources: Vec<String> = findings
        .iter()
        .filter(|f| f.detector == LEAK)
        .filter_map(|f| f.evidence["source_tenant"].as_str().map(String::from))
        .collect();
    for f in findings.iter_mut() {
        match f.detector {
            LEAK => {
                let source = f.evidence["source_tenant"].as_str().unwrap_or_default();
                if let Some((by, score, severity)) = exact.get(source) {
                    f.evidence["corroborated_by"] = json!(by);
                    f.score = f.score.max(*score);
                    f.severity = f.severity.max(*severity);
                }
            }
            RELEVANCE if !leak_sources.is_empty() => {
                f.evidence["explained_by"] = json!(LEAK);
            }
            d if EXACT.contains(&d) => {
                let source = f.evidence.get("source_tenant").and_then(|s| s.as_str());
                if let Some(s) = source.filter(|s| leak_sources.iter().any(|l| l == s)) {
                    let _ = s;
                    f.evidence["semantic"] = json!(LEAK);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
