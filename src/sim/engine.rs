//! The simulated engine: a paged KV pool shared by every request, and the
//! faults that read from it.
//!
//! Each request's prompt, then its answer, is written into pages taken from
//! the pool oldest first. A reused page is *not* cleared: it simply gets a
//! new owner once it is written again, and until then it still holds the
//! text of whoever wrote it last. That is the bug class the incident was
//! about; the faults below read such pages on purpose.
//!
//! Everything here is a pure function of the seed and the order of
//! requests: one `StdRng` drives every choice, and the engine is used under
//! one lock, so a replay with the same seed and request order gives the same
//! answers and the same ground truth.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::text;
use crate::rules::{PiiKind, RuleSet};
use crate::scenario::Fault;

/// A placeholder answer's stale run is at least this many words…
const MIN_RUN_WORDS: usize = 20;
/// …or this many tokens when the source text is mostly CJK.
const MIN_RUN_CJK: usize = 40;
/// And at most this many tokens.
const MAX_RUN: usize = 120;
/// Splice fragments are drawn uniformly from this many words.
pub const SPLICE_WORDS: std::ops::RangeInclusive<usize> = 8..=40;
/// Healthy answers kept for `stale_block` to hand out.
const RECENT_ANSWERS: usize = 256;

/// What the engine needs to know; see [`super::SimConfig`].
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub seed: u64,
    pub prefill_capacity_tokens: u64,
    pub kv_pages: usize,
    pub page_tokens: usize,
    pub faults: Vec<(Fault, f64)>,
}

/// One request as the engine sees it.
#[derive(Clone, Copy, Debug)]
pub struct EngineRequest<'a> {
    pub request_id: &'a str,
    pub tenant: &'a str,
    /// The prompt's text segments (system prompt, messages, …).
    pub parts: &'a [String],
}

/// Where an answer's foreign content came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leak {
    pub source_request_id: Arc<str>,
    pub source_tenant: Arc<str>,
    /// Byte span of the foreign content in the answer.
    pub span: (usize, usize),
    pub words: usize,
    /// Tenant-specific PII values (residue's rules, keywords skipped) in it.
    pub pii: usize,
}

/// One generated answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generation {
    pub text: String,
    pub fault: Option<Fault>,
    pub leak: Option<Leak>,
    pub prompt_tokens_reported: u64,
    pub prompt_tokens_real: u64,
    pub completion_tokens: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Prompt,
    Answer,
}

/// A text written into the pool: who wrote it, and its tokens.
#[derive(Debug)]
struct Content {
    id: u64,
    request_id: Arc<str>,
    tenant: Arc<str>,
    kind: Kind,
    text: String,
    tokens: Vec<Range<usize>>,
    /// An answer that itself carried another request's content (a fault):
    /// its pages stay in the pool like any other, but it is never the source
    /// of a later leak, so that the ground truth names exactly one owner.
    tainted: bool,
    /// Tokens before this index are the prompt's earlier segments (the
    /// system prompt every tenant of an app shares): in the pages, but not
    /// this tenant's own content, so never a leak's source.
    own_from: usize,
}

/// One KV page: chunk `chunk` (tokens `chunk * page_tokens ..`) of a content.
#[derive(Clone, Debug)]
struct Page {
    content: Arc<Content>,
    chunk: usize,
}

/// A run of another request's content still readable from consecutive
/// pages: tokens `tokens` of `content`.
struct Stale {
    content: Arc<Content>,
    tokens: Range<usize>,
}

/// An earlier healthy answer, for `stale_block`.
#[derive(Debug)]
struct Answered {
    request_id: Arc<str>,
    tenant: Arc<str>,
    text: String,
    /// The longest run of the asker's own words (its latest message) that
    /// the answer quotes.
    own_run: usize,
}

/// Requests the engine keeps as in flight at most.
const MAX_IN_FLIGHT: usize = 65_536;

pub struct Engine {
    config: EngineConfig,
    rng: StdRng,
    pages: Vec<Option<Page>>,
    /// The next page to (re)use: the oldest.
    cursor: usize,
    next_content: u64,
    recent: VecDeque<Answered>,
    /// Requests whose answers are still being delivered: their pages are
    /// in use, not stale, so no leak comes from those answers yet (the
    /// incident's residue was the *previous* users'). Healthy answers wait
    /// here to join `recent`.
    in_flight: HashMap<Arc<str>, Option<Answered>>,
    rules: Arc<RuleSet>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("config", &self.config)
            .field("cursor", &self.cursor)
            .finish_non_exhaustive()
    }
}

// === impl Engine ===

impl Engine {
    pub fn new(config: EngineConfig, rules: Arc<RuleSet>) -> Engine {
        Engine {
            rng: StdRng::seed_from_u64(config.seed),
            pages: vec![None; config.kv_pages.max(1)],
            cursor: 0,
            next_content: 0,
            recent: VecDeque::new(),
            in_flight: HashMap::new(),
            rules,
            config,
        }
    }

    /// Answers one request, injecting at most one fault.
    ///
    /// Fault choice: a prompt over the prefill capacity gets `placeholder`
    /// with that fault's rate (1.0 replays the incident: every such prompt);
    /// below capacity `placeholder` never applies. Otherwise one uniform
    /// draw picks among the other faults by their rates (which sum to at
    /// most 1). A fault that finds no foreign content to use falls back to a
    /// healthy answer and is not recorded.
    pub fn generate(&mut self, req: EngineRequest<'_>) -> Generation {
        let prompt = req.parts.join("\n");
        let prompt_tokens = text::tokens(&prompt);
        // Capacity is measured, and usage reported, in subword tokens, as a
        // real engine does; the pages hold words.
        let real = text::subword_count(&prompt);
        let fault = self.draw(real);
        // Stale content is read before this request writes anything.
        let mut generation = match fault {
            Some(Fault::Placeholder) => self.placeholder(req.tenant),
            Some(Fault::StaleBlock) => self.stale_block(req.tenant),
            Some(Fault::Splice) => self.splice(req),
            Some(Fault::Garbage) => Some(Generation::plain(text::garbage(&mut self.rng), fault)),
            None => None,
        }
        .unwrap_or_else(|| Generation::plain(text::healthy(req.parts, &mut self.rng), None));
        generation.prompt_tokens_real = real;
        if generation.fault == Some(Fault::Placeholder) {
            // The prompt never reached the pages: one placeholder token did.
            generation.prompt_tokens_reported = 1;
        } else {
            generation.prompt_tokens_reported = real;
            let own_from = match req.parts.split_last() {
                Some((_, earlier)) if !earlier.is_empty() => {
                    text::tokens(&earlier.join("\n")).len()
                }
                _ => 0,
            };
            self.write(req, Kind::Prompt, prompt, prompt_tokens, false, own_from);
        }
        let answer_tokens = text::tokens(&generation.text);
        generation.completion_tokens = text::subword_count(&generation.text);
        let answered = generation.fault.is_none().then(|| Answered {
            request_id: req.request_id.into(),
            tenant: req.tenant.into(),
            text: generation.text.clone(),
            own_run: text::longest_common_run(
                &generation.text,
                req.parts.last().map_or("", String::as_str),
            ),
        });
        if self.in_flight.len() >= MAX_IN_FLIGHT {
            // Deliveries nobody reported (a caller that never finishes):
            // forget them rather than grow without bound.
            self.in_flight.clear();
        }
        self.in_flight.insert(req.request_id.into(), answered);
        let tainted = generation.fault.is_some();
        self.write(
            req,
            Kind::Answer,
            generation.text.clone(),
            answer_tokens,
            tainted,
            0,
        );
        generation
    }

    /// The answer to `request_id` was delivered: its pages are stale from
    /// now on, and a healthy answer may be handed to someone else.
    pub fn finish(&mut self, request_id: &str) {
        if let Some(Some(answered)) = self.in_flight.remove(request_id) {
            if self.recent.len() == RECENT_ANSWERS {
                self.recent.pop_front();
            }
            self.recent.push_back(answered);
        }
    }

    fn draw(&mut self, prompt_tokens: u64) -> Option<Fault> {
        let rate = |f: Fault| {
            self.config
                .faults
                .iter()
                .filter(|(g, _)| *g == f)
                .map(|(_, r)| *r)
                .sum::<f64>()
        };
        let placeholder = rate(Fault::Placeholder);
        if prompt_tokens > self.config.prefill_capacity_tokens
            && placeholder > 0.0
            && self.rng.gen::<f64>() < placeholder
        {
            return Some(Fault::Placeholder);
        }
        let u: f64 = self.rng.gen();
        let mut acc = 0.0;
        for f in [Fault::StaleBlock, Fault::Splice, Fault::Garbage] {
            acc += rate(f);
            if u < acc {
                return Some(f);
            }
        }
        None
    }

    /// Writes a content into pages, oldest first, without clearing them.
    fn write(
        &mut self,
        req: EngineRequest<'_>,
        kind: Kind,
        text: String,
        tokens: Vec<Range<usize>>,
        tainted: bool,
        own_from: usize,
    ) {
        if tokens.is_empty() {
            return;
        }
        let content = Arc::new(Content {
            id: self.next_content,
            request_id: req.request_id.into(),
            tenant: req.tenant.into(),
            kind,
            text,
            tokens,
            tainted,
            own_from,
        });
        self.next_content += 1;
        let chunks = content
            .tokens
            .len()
            .div_ceil(self.config.page_tokens.max(1));
        // A content longer than the pool only leaves its tail behind.
        let skip = chunks.saturating_sub(self.pages.len());
        for chunk in skip..chunks {
            self.pages[self.cursor] = Some(Page {
                content: content.clone(),
                chunk,
            });
            self.cursor = (self.cursor + 1) % self.pages.len();
        }
    }

    /// Runs of other tenants' content still in the pool, of `kind` if given,
    /// in a stable order (oldest content first).
    fn stale(&self, tenant: &str, kind: Option<Kind>) -> Vec<Stale> {
        let mut by_content: BTreeMap<u64, (Arc<Content>, Vec<usize>)> = BTreeMap::new();
        for page in self.pages.iter().flatten() {
            let c = &page.content;
            if &*c.tenant == tenant
                || c.tainted
                || kind.is_some_and(|k| k != c.kind)
                || self.in_flight.contains_key(&c.request_id)
            {
                continue;
            }
            by_content
                .entry(c.id)
                .or_insert_with(|| (c.clone(), Vec::new()))
                .1
                .push(page.chunk);
        }
        let pt = self.config.page_tokens.max(1);
        let mut out = Vec::new();
        for (content, mut chunks) in by_content.into_values() {
            chunks.sort_unstable();
            let n = content.tokens.len();
            let mut i = 0;
            while i < chunks.len() {
                let mut j = i;
                while j + 1 < chunks.len() && chunks[j + 1] == chunks[j] + 1 {
                    j += 1;
                }
                let start = (chunks[i] * pt).max(content.own_from);
                let end = ((chunks[j] + 1) * pt).min(n);
                if start < end {
                    out.push(Stale {
                        content: content.clone(),
                        tokens: start..end,
                    });
                }
                i = j + 1;
            }
        }
        out
    }

    /// The prompt was replaced by a placeholder; the answer is decoded from
    /// whatever stale pages of another tenant the attention landed on.
    fn placeholder(&mut self, tenant: &str) -> Option<Generation> {
        let candidates: Vec<Stale> = self
            .stale(tenant, None)
            .into_iter()
            .filter(|s| s.tokens.len() >= min_run(s))
            .collect();
        let s = candidates.choose(&mut self.rng)?;
        let min = min_run(s);
        let len = self
            .rng
            .gen_range(min..=(min * 3).min(MAX_RUN).max(min))
            .min(s.tokens.len());
        let start = s.tokens.start + self.rng.gen_range(0..=s.tokens.len() - len);
        let fragment = byte_range(&s.content, start..start + len);
        let prefix = "Sure. ";
        let text = format!(
            "{prefix}{} I hope this helps.",
            &s.content.text[fragment.clone()]
        );
        let span = (prefix.len(), prefix.len() + fragment.len());
        Some(self.leaked(text, Fault::Placeholder, &s.content, span, len))
    }

    /// The answer another tenant's earlier request got, verbatim.
    fn stale_block(&mut self, tenant: &str) -> Option<Generation> {
        let candidates: Vec<&Answered> = self
            .recent
            .iter()
            .filter(|a| &*a.tenant != tenant)
            .collect();
        let a = *candidates.choose(&mut self.rng)?;
        let (text, request_id, source) = (a.text.clone(), a.request_id.clone(), a.tenant.clone());
        let words = a.own_run;
        let span = (0, text.len());
        let pii = self.pii(&text);
        Some(Generation {
            leak: Some(Leak {
                source_request_id: request_id,
                source_tenant: source,
                span,
                words,
                pii,
            }),
            ..Generation::plain(text, Some(Fault::StaleBlock))
        })
    }

    /// A healthy answer with a fragment of another tenant's earlier prompt
    /// spliced in at a word boundary.
    fn splice(&mut self, req: EngineRequest<'_>) -> Option<Generation> {
        let mut words = self.rng.gen_range(SPLICE_WORDS);
        let stale = self.stale(req.tenant, Some(Kind::Prompt));
        let mut candidates: Vec<&Stale> =
            stale.iter().filter(|s| s.tokens.len() >= words).collect();
        if candidates.is_empty() {
            // Shorter prompts only: take the longest, if long enough.
            let longest = stale.iter().max_by_key(|s| s.tokens.len())?;
            words = longest.tokens.len();
            if words < *SPLICE_WORDS.start() {
                return None;
            }
            candidates.push(longest);
        }
        let s = *candidates.choose(&mut self.rng)?;
        let start = s.tokens.start + self.rng.gen_range(0..=s.tokens.len() - words);
        let fragment = &s.content.text[byte_range(&s.content, start..start + words)];
        let healthy = text::healthy(req.parts, &mut self.rng);
        let spaces: Vec<usize> = healthy.match_indices(' ').map(|(i, _)| i + 1).collect();
        let (text, at) = match spaces.choose(&mut self.rng) {
            Some(&at) => (
                format!("{}{fragment} {}", &healthy[..at], &healthy[at..]),
                at,
            ),
            None => (format!("{healthy} {fragment}"), healthy.len() + 1),
        };
        let span = (at, at + fragment.len());
        let content = s.content.clone();
        Some(self.leaked(text, Fault::Splice, &content, span, words))
    }

    fn leaked(
        &self,
        text: String,
        fault: Fault,
        source: &Content,
        span: (usize, usize),
        words: usize,
    ) -> Generation {
        let pii = self.pii(&text[span.0..span.1]);
        Generation {
            leak: Some(Leak {
                source_request_id: source.request_id.clone(),
                source_tenant: source.tenant.clone(),
                span,
                words,
                pii,
            }),
            ..Generation::plain(text, Some(fault))
        }
    }

    /// Tenant-specific PII values in `text`, as residue's detector counts
    /// them (keyword rules name topics, not a tenant's values).
    fn pii(&self, text: &str) -> usize {
        let mut found = Vec::new();
        self.rules.find(text, &mut found);
        found.iter().filter(|m| m.kind != PiiKind::Keyword).count()
    }
}

impl Generation {
    fn plain(text: String, fault: Option<Fault>) -> Generation {
        Generation {
            text,
            fault,
            leak: None,
            prompt_tokens_reported: 0,
            prompt_tokens_real: 0,
            completion_tokens: 0,
        }
    }
}

/// The shortest stale run a placeholder answer quotes.
fn min_run(s: &Stale) -> usize {
    let t = &s.content.text;
    let cjk = s.content.tokens[s.tokens.clone()]
        .iter()
        .filter(|&r| t[r.clone()].chars().next().is_some_and(text::is_cjk))
        .count();
    if cjk * 2 > s.tokens.len() {
        MIN_RUN_CJK
    } else {
        MIN_RUN_WORDS
    }
}

/// Bytes of tokens `toks` of a content, the text between them included.
fn byte_range(c: &Content, toks: Range<usize>) -> Range<usize> {
    c.tokens[toks.start].start..c.tokens[toks.end - 1].end
}
