//! Prompt accounting: compares the upstream's reported prompt tokens with
//! residue's own count of the prompt it forwarded.
//!
//! This is the exact fingerprint of the placeholder bug (sglang #30233): a
//! prompt over the prefill capacity is swapped for a one-token placeholder,
//! the request carries on, the answer comes from another request's KV pages,
//! and `usage.prompt_tokens` is 1. Also flagged: `cached_tokens` greater than
//! `prompt_tokens`, which no healthy engine reports.

use serde_json::json;

use super::{Detector, Finding, ScanInput, Severity};
use crate::config::AccountingConfig;

pub const NAME: &str = "prompt_accounting";

fn clip(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[derive(Debug, Clone)]
pub struct PromptAccounting {
    min_ratio: f64,
    min_prompt_tokens: u64,
}

impl PromptAccounting {
    pub fn new(config: &AccountingConfig) -> Self {
        PromptAccounting {
            min_ratio: config.min_ratio,
            min_prompt_tokens: config.min_prompt_tokens,
        }
    }
}

impl Detector for PromptAccounting {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inspect(&self, input: &ScanInput<'_>) -> Vec<Finding> {
        let mut findings = Vec::new();
        if !(200..300).contains(&input.exchange.status) {
            return findings;
        }
        let usage = &input.output.usage;
        let Some(reported) = usage.prompt_tokens else {
            return findings;
        };
        let counted = input.prompt_tokens;
        if counted >= self.min_prompt_tokens && counted > 0 {
            let ratio = reported as f64 / counted as f64;
            if ratio < self.min_ratio {
                // prompt_tokens of 1 or 2 for a long prompt is the placeholder
                // itself, not a tokenizer disagreement.
                let severity = if reported <= 2 {
                    Severity::Critical
                } else {
                    Severity::High
                };
                findings.push(Finding {
                    detector: NAME,
                    severity,
                    score: (1.0 - ratio / self.min_ratio).clamp(0.0, 1.0),
                    evidence: json!({
                        "reason": "reported_below_counted",
                        "reported_prompt_tokens": reported,
                        "counted_prompt_tokens": counted,
                        "ratio": ratio,
                        "min_ratio": self.min_ratio,
                        "counter": input.counter,
                        // Upstream-controlled: keep it short.
                        "finish_reason": usage.finish_reason.as_deref().map(|r| clip(r, 64)),
                    }),
                    spans: Vec::new(),
                });
            }
        }
        if let Some(cached) = usage.cached_tokens {
            if cached > reported {
                findings.push(Finding {
                    detector: NAME,
                    severity: Severity::High,
                    score: 1.0,
                    evidence: json!({
                        "reason": "cached_exceeds_prompt",
                        "reported_prompt_tokens": reported,
                        "cached_tokens": cached,
                    }),
                    spans: Vec::new(),
                });
            }
        }
        findings
    }
}
