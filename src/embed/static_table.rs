//! The static fast path: a table of one vector per vocabulary token,
//! distilled from the transformer (after Model2Vec), so that a text's vector
//! is the mean of its tokens' rows — microseconds instead of the model's
//! milliseconds, on every response.
//!
//! Distillation runs every vocabulary token through the model once, as the
//! three-token sequence `[SEP] token [CLS]` (Model2Vec's order), mean-pools
//! and normalises it, centres the rows on their mean and projects out their
//! top principal components (the model's vectors share a few large common
//! directions, "all-but-the-top"), then weights each row by its
//! frequency rank (SIF:
//! `a / (a + p(rank))`, BERT vocabularies being ordered roughly by
//! frequency), so that "the" and "of" barely move a text's vector. Special
//! and `[unused…]` tokens get zero rows. No reduction: the table keeps the model's
//! dimension, so both tiers share window code and thresholds are per tier.
//!
//! The table is cached next to the model (`residue-static.safetensors`),
//! keyed by a hash of the model's weights and tokenizer, so it is distilled
//! once per model; a folder that cannot be written keeps it in memory only.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use tokenizers::Tokenizer;

use super::{EmbedError, Embedder};

/// The cache file's name inside the model folder.
pub const CACHE_FILE: &str = "residue-static.safetensors";

/// Bumped when distillation changes, so that old caches are redone.
const VERSION: u8 = 3;

/// Model2Vec's SIF constant.
const SIF_A: f64 = 1e-4;

/// Principal components removed from the centred table (about dim/100).
const REMOVED_COMPONENTS: usize = 4;

/// Vocabulary tokens per model call while distilling.
const DISTILL_BATCH: usize = 512;

/// A distilled token table and the tokenizer that indexes it.
pub struct StaticEmbedder {
    tokenizer: Tokenizer,
    /// `vocab × dim`, row-major, SIF weights applied.
    table: Vec<f32>,
    vocab: usize,
    dim: usize,
}

impl std::fmt::Debug for StaticEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticEmbedder")
            .field("vocab", &self.vocab)
            .field("dim", &self.dim)
            .finish_non_exhaustive()
    }
}

/// A tokenizer that neither pads, truncates nor adds special tokens' room:
/// the static path reads the whole text.
pub(super) fn plain_tokenizer(from: &Tokenizer) -> Result<Tokenizer, EmbedError> {
    let mut tok = from.clone();
    tok.with_padding(None);
    tok.with_truncation(None)
        .map_err(|e| EmbedError::Tokenize(e.to_string()))?;
    Ok(tok)
}

/// Whether a vocabulary token gets a zero row: special tokens (`[CLS]`,
/// `<pad>`, …) and BERT's `[unused…]` slots carry no meaning of their own.
fn is_blank_token(token: &str, special: bool) -> bool {
    special || (token.starts_with("[unused") && token.ends_with(']'))
}

impl StaticEmbedder {
    /// Distills the table from `embedder`. Costs one model call per
    /// [`DISTILL_BATCH`] vocabulary tokens: about a minute on two cores for
    /// a 30,000-token vocabulary in a release build.
    pub fn distill(embedder: &Embedder) -> Result<StaticEmbedder, EmbedError> {
        let tokenizer = plain_tokenizer(embedder.tokenizer())?;
        let vocab = tokenizer.get_vocab_size(true);
        let dim = embedder.dimension();
        let cls = tokenizer.token_to_id("[CLS]");
        let sep = tokenizer.token_to_id("[SEP]");
        let special: std::collections::HashSet<u32> = tokenizer
            .get_added_tokens_decoder()
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| *id)
            .collect();
        let mut table = vec![0f32; vocab * dim];
        let ids: Vec<u32> = (0..vocab as u32).collect();
        for batch in ids.chunks(DISTILL_BATCH) {
            // Model2Vec's reversed `[SEP] token [CLS]` ("works better") for
            // mean-pooled models; a CLS-pooled model reads position 0, which
            // must then be `[CLS]`.
            let cls_pooled = embedder.pooling() == super::Pooling::Cls;
            let (len, seqs): (usize, Vec<u32>) = match (sep, cls) {
                (Some(s), Some(c)) if cls_pooled => {
                    (3, batch.iter().flat_map(|&id| [c, id, s]).collect())
                }
                (Some(s), Some(c)) => (3, batch.iter().flat_map(|&id| [s, id, c]).collect()),
                _ => (1, batch.to_vec()),
            };
            let n = batch.len();
            let vectors = embedder
                .forward(seqs, vec![0; n * len], vec![1; n * len], (n, len))
                .map_err(EmbedError::Forward)?;
            for (&id, v) in batch.iter().zip(vectors) {
                let blank = tokenizer
                    .id_to_token(id)
                    .is_none_or(|t| is_blank_token(&t, special.contains(&id)));
                if !blank {
                    let row = id as usize * dim;
                    table[row..row + dim].copy_from_slice(&v);
                }
            }
        }
        // The model's token vectors share one large common direction (every
        // pair of texts would look alike): centre the rows on their mean, as
        // Model2Vec's PCA does.
        let kept: Vec<usize> = (0..vocab)
            .filter(|&id| table[id * dim..(id + 1) * dim].iter().any(|&x| x != 0.0))
            .collect();
        if !kept.is_empty() {
            let mut mean = vec![0f64; dim];
            for &id in &kept {
                for (m, &x) in mean.iter_mut().zip(&table[id * dim..(id + 1) * dim]) {
                    *m += x as f64;
                }
            }
            let n = kept.len() as f64;
            for &id in &kept {
                for (x, m) in table[id * dim..(id + 1) * dim].iter_mut().zip(&mean) {
                    *x -= (m / n) as f32;
                }
            }
        }
        // Centring leaves a few dominant directions that carry frequency,
        // not meaning ("all-but-the-top", Mu & Viswanath 2018): project out
        // the top principal components.
        let components =
            top_components(&table, &kept, dim, REMOVED_COMPONENTS).map_err(EmbedError::Forward)?;
        for &id in &kept {
            let row = &mut table[id * dim..(id + 1) * dim];
            for u in &components {
                let p: f32 = row.iter().zip(u).map(|(a, b)| a * b).sum();
                row.iter_mut().zip(u).for_each(|(a, b)| *a -= p * b);
            }
        }
        // SIF weights by rank.
        let total: f64 = (0..vocab).map(|r| 1.0 / (r as f64 + 2.0)).sum();
        for (rank, row) in table.chunks_mut(dim).enumerate() {
            let p = (1.0 / (rank as f64 + 2.0)) / total;
            let w = (SIF_A / (SIF_A + p)) as f32;
            row.iter_mut().for_each(|x| *x *= w);
        }
        Ok(StaticEmbedder {
            tokenizer,
            table,
            vocab,
            dim,
        })
    }

    /// The cached table of the model in `dir` when it is current, else a
    /// fresh distillation, cached when the folder can be written.
    pub fn load_or_distill(dir: &Path, embedder: &Embedder) -> Result<StaticEmbedder, EmbedError> {
        // One distillation at a time in a process: concurrent callers (many
        // tests, say) wait and then read the first one's cache.
        static DISTILLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = DISTILLING.lock().unwrap_or_else(|p| p.into_inner());
        let key = model_key(dir)?;
        let path = dir.join(CACHE_FILE);
        match Self::load_cached(&path, &key, embedder) {
            Ok(Some(table)) => {
                tracing::info!(path = %path.display(), "Static embedding table loaded.");
                return Ok(table);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "The cached static embedding table is unreadable; distilling it again.");
            }
        }
        tracing::info!(
            model = %dir.display(),
            "Distilling the static embedding table from the model (once per model)."
        );
        let started = std::time::Instant::now();
        let table = Self::distill(embedder)?;
        tracing::info!(
            seconds = started.elapsed().as_secs_f64(),
            "Static embedding table distilled."
        );
        if let Err(e) = table.save(&path, &key) {
            tracing::warn!(error = %e, path = %path.display(), "Cannot cache the static embedding table; it is kept in memory only.");
        }
        Ok(table)
    }

    fn load_cached(
        path: &Path,
        key: &[u8; 32],
        embedder: &Embedder,
    ) -> Result<Option<StaticEmbedder>, EmbedError> {
        if !path.exists() {
            return Ok(None);
        }
        let weights_err = |message: String| EmbedError::Weights {
            path: path.to_path_buf(),
            message,
        };
        let tensors = candle_core::safetensors::load(path, &Device::Cpu)
            .map_err(|e| weights_err(e.to_string()))?;
        let stored_key = tensors
            .get("key")
            .ok_or_else(|| weights_err("no key".into()))?
            .to_vec1::<u8>()
            .map_err(|e| weights_err(e.to_string()))?;
        if stored_key.as_slice() != key.as_slice() {
            return Ok(None);
        }
        let table = tensors
            .get("table")
            .ok_or_else(|| weights_err("no table".into()))?;
        let (vocab, dim) = table.dims2().map_err(|e| weights_err(e.to_string()))?;
        let tokenizer = plain_tokenizer(embedder.tokenizer())?;
        if dim != embedder.dimension() || vocab != tokenizer.get_vocab_size(true) {
            return Ok(None);
        }
        let table = table
            .to_dtype(DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| weights_err(e.to_string()))?;
        Ok(Some(StaticEmbedder {
            tokenizer,
            table,
            vocab,
            dim,
        }))
    }

    /// Writes the table (as f16: half the bytes, far below the table's own
    /// error) with its key, through a temporary file and a rename so that a
    /// reader never sees half a file.
    fn save(&self, path: &Path, key: &[u8; 32]) -> Result<(), EmbedError> {
        let err = |message: String| EmbedError::Weights {
            path: path.to_path_buf(),
            message,
        };
        let table = Tensor::from_slice(&self.table, (self.vocab, self.dim), &Device::Cpu)
            .and_then(|t| t.to_dtype(DType::F16))
            .map_err(|e| err(e.to_string()))?;
        let key =
            Tensor::from_slice(key.as_slice(), 32, &Device::Cpu).map_err(|e| err(e.to_string()))?;
        let tensors: HashMap<String, Tensor> =
            [("table".to_string(), table), ("key".to_string(), key)].into();
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        candle_core::safetensors::save(&tensors, &tmp).map_err(|e| err(e.to_string()))?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            err(e.to_string())
        })
    }

    /// The vector's length.
    pub fn dimension(&self) -> usize {
        self.dim
    }

    /// The tokenizer the table is indexed by: no padding, no truncation.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The unit vector of a run of token ids: the mean of their rows,
    /// normalised. Ids outside the vocabulary are skipped; a run of only
    /// blank tokens gives the zero vector (similar to nothing).
    pub fn embed_ids(&self, ids: &[u32]) -> Vec<f32> {
        let mut v = vec![0f32; self.dim];
        for &id in ids {
            let id = id as usize;
            if id < self.vocab {
                let row = &self.table[id * self.dim..(id + 1) * self.dim];
                v.iter_mut().zip(row).for_each(|(a, b)| *a += b);
            }
        }
        normalize(&mut v);
        v
    }

    /// One unit vector per text (no special tokens, nothing truncated).
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        texts
            .iter()
            .map(|t| {
                let enc = self
                    .tokenizer
                    .encode_fast(*t, false)
                    .map_err(|e| EmbedError::Tokenize(e.to_string()))?;
                Ok(self.embed_ids(enc.get_ids()))
            })
            .collect()
    }
}

/// The top `k` eigenvectors of the covariance of the `kept` rows: the
/// covariance by one (optimised) matrix product, then power iteration with
/// deflation.
fn top_components(
    table: &[f32],
    kept: &[usize],
    dim: usize,
    k: usize,
) -> candle_core::Result<Vec<Vec<f32>>> {
    if kept.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<f32> = kept
        .iter()
        .flat_map(|&id| table[id * dim..(id + 1) * dim].iter().copied())
        .collect();
    let x = Tensor::from_vec(rows, (kept.len(), dim), &Device::Cpu)?;
    let cov = x.t()?.matmul(&x)?.to_vec2::<f32>()?;
    let mut cov: Vec<Vec<f64>> = cov
        .into_iter()
        .map(|r| r.into_iter().map(|v| v as f64).collect())
        .collect();
    let mut out = Vec::with_capacity(k);
    for c in 0..k {
        // A fixed, non-degenerate start: deterministic tables.
        let mut v: Vec<f64> = (0..dim)
            .map(|i| 1.0 + ((i * 7 + c * 13) % 11) as f64 / 11.0)
            .collect();
        let mut lambda = 0.0;
        for _ in 0..200 {
            let w: Vec<f64> = cov
                .iter()
                .map(|r| r.iter().zip(&v).map(|(a, b)| a * b).sum())
                .collect();
            let norm = w.iter().map(|x| x * x).sum::<f64>().sqrt();
            if norm < 1e-12 {
                break;
            }
            lambda = norm;
            v = w.into_iter().map(|x| x / norm).collect();
        }
        if lambda < 1e-12 {
            break;
        }
        // Deflate: C -= λ v vᵀ.
        for (i, r) in cov.iter_mut().enumerate() {
            for (j, x) in r.iter_mut().enumerate() {
                *x -= lambda * v[i] * v[j];
            }
        }
        out.push(v.into_iter().map(|x| x as f32).collect());
    }
    Ok(out)
}

/// Scales `v` to unit length; the zero vector stays zero.
pub(crate) fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 1e-12 && norm.is_finite() {
        v.iter_mut().for_each(|x| *x /= norm);
    } else {
        v.iter_mut().for_each(|x| *x = 0.0);
    }
}

/// What the cache is keyed by: the weights, the tokenizer and the
/// distillation's version.
fn model_key(dir: &Path) -> Result<[u8; 32], EmbedError> {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&[VERSION]);
    for file in ["model.safetensors", "tokenizer.json"] {
        let path: PathBuf = dir.join(file);
        let f = std::fs::File::open(&path).map_err(|source| EmbedError::Read {
            path: path.clone(),
            source,
        })?;
        hasher
            .update_reader(f)
            .map_err(|source| EmbedError::Read { path, source })?;
    }
    Ok(*hasher.finalize().as_bytes())
}
