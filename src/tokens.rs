//! Counting a prompt's tokens: with the model's own `tokenizer.json` when one
//! is configured, otherwise with a documented estimate.

use std::path::Path;
use std::sync::Arc;

use crate::protocol::Prompt;

#[derive(Debug, thiserror::Error)]
#[error("cannot load tokenizer {path}: {message}")]
pub struct TokenizerError {
    pub path: String,
    pub message: String,
}

#[derive(Clone)]
pub enum TokenCounter {
    Estimate,
    Tokenizer(Arc<tokenizers::Tokenizer>),
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl TokenCounter {
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let t = tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(TokenCounter::Tokenizer(Arc::new(t)))
    }

    pub fn name(&self) -> &'static str {
        match self {
            TokenCounter::Estimate => "estimate",
            TokenCounter::Tokenizer(_) => "tokenizer",
        }
    }

    /// The prompt's token count: every part plus pretokenized ids.
    pub fn count(&self, prompt: &Prompt) -> u64 {
        prompt.pretokenized + prompt.parts.iter().map(|p| estimate_tokens(p)).sum::<u64>()
    }
}

/// The estimate used without a tokenizer.
pub fn estimate_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}
