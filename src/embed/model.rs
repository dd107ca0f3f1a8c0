//! Loading a sentence-transformers folder and embedding batches of texts.
//!
//! The folder is what `sentence-transformers` saves and `models/fetch`
//! installs:
//!
//! - `config.json`: the BERT configuration.
//! - `tokenizer.json`: the Hugging Face tokenizer.
//! - `model.safetensors`: the weights (memory-mapped, F32).
//! - `1_Pooling/config.json`: mean or CLS pooling.
//! - `sentence_bert_config.json` (optional): `max_seq_length`, the length
//!   the model was trained to read (256 for MiniLM, half its 512 positions).
//!
//! The `Normalize` module of `modules.json` is always applied: every vector
//! comes back with unit length.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use candle_core::{DType, Device, IndexOp, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config as BertConfig};

use super::int8::{Int8Encoder, Kernel};
use tokenizers::{
    PaddingDirection, PaddingParams, PaddingStrategy, Tokenizer, TruncationDirection,
    TruncationParams, TruncationStrategy,
};

/// Why a model folder cannot be loaded or a batch cannot be embedded.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("embedding model {}: {file} is missing", .dir.display())]
    MissingFile { dir: PathBuf, file: &'static str },
    #[error("embedding model: cannot read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("embedding model: bad config {}: {message}", .path.display())]
    BadConfig { path: PathBuf, message: String },
    #[error(
        "embedding model: unsupported pooling in {}: {found}; residue supports mean or CLS pooling",
        .path.display()
    )]
    UnsupportedPooling { path: PathBuf, found: String },
    #[error("embedding model: cannot load tokenizer {}: {message}", .path.display())]
    Tokenizer { path: PathBuf, message: String },
    #[error("embedding model: cannot load weights {}: {message}", .path.display())]
    Weights { path: PathBuf, message: String },
    #[error("embedding: tokenizing the batch failed: {0}")]
    Tokenize(String),
    #[error("embedding: running the model failed: {0}")]
    Forward(#[source] candle_core::Error),
    /// The embedding service's queue was full: the request was shed, not
    /// queued.
    #[error("embedding: the queue is full; the request was shed")]
    Overloaded,
    /// The embedding service's model thread has ended.
    #[error("embedding: the embedding service has stopped")]
    Stopped,
    /// A batch the request shared with others failed; every request in it
    /// gets the same error.
    #[error("embedding: the batch failed: {0}")]
    Batch(std::sync::Arc<EmbedError>),
}

/// How the token vectors of one text become the text's vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of the token vectors, padding excluded (MiniLM, most
    /// sentence-transformers models).
    Mean,
    /// The vector of the first token, `[CLS]` (BGE, some others).
    Cls,
}

/// How the CPU runs the model's matrix products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuPrecision {
    /// int8 where the CPU has AVX-512 VNNI, f32 otherwise.
    #[default]
    Auto,
    /// candle's f32 model.
    F32,
    /// int8 always: with VNNI where the CPU has it, otherwise with plain
    /// loops (the same vectors, many times slower; for tests).
    Int8,
}

/// A loaded embedding model. Cheap to share behind an `Arc`: `embed` takes
/// `&self` and the model holds no per-call state.
pub struct Embedder {
    model: BertModel,
    /// The int8 encoder the CPU runs instead of `model`, when chosen.
    int8: Option<Int8Encoder>,
    tokenizer: Tokenizer,
    device: Device,
    pooling: Pooling,
    dimension: usize,
    max_seq_len: usize,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("device", &self.device_name())
            .field("cpu_kernel", &self.cpu_kernel())
            .field("pooling", &self.pooling)
            .field("dimension", &self.dimension)
            .field("max_seq_len", &self.max_seq_len)
            .finish_non_exhaustive()
    }
}

// === impl Embedder ===

impl Embedder {
    /// Loads the model folder on the default device: the CPU, or with the
    /// `cuda` feature the first GPU when one is usable (the CPU otherwise).
    pub fn load(dir: &Path) -> Result<Self, EmbedError> {
        Self::load_on(dir, default_device())
    }

    /// Loads the model folder on the default device; on the CPU, its
    /// matrix products run as `precision` says.
    pub fn load_as(dir: &Path, precision: CpuPrecision) -> Result<Self, EmbedError> {
        Self::load_with(dir, default_device(), precision)
    }

    /// Loads the model folder on `device`, int8 on a CPU with AVX-512 VNNI.
    pub fn load_on(dir: &Path, device: Device) -> Result<Self, EmbedError> {
        Self::load_with(dir, device, CpuPrecision::Auto)
    }

    /// Loads the model folder on `device`; on the CPU, its matrix products
    /// run as `precision` says.
    pub fn load_with(
        dir: &Path,
        device: Device,
        precision: CpuPrecision,
    ) -> Result<Self, EmbedError> {
        let config_path = require(dir, "config.json")?;
        let tokenizer_path = require(dir, "tokenizer.json")?;
        let weights_path = require(dir, "model.safetensors")?;
        let pooling_path = require(dir, "1_Pooling/config.json")?;

        let config: BertConfig = read_json(&config_path)?;
        let bad_config = |message: String| EmbedError::BadConfig {
            path: config_path.clone(),
            message,
        };
        if config.num_attention_heads == 0
            || !config
                .hidden_size
                .is_multiple_of(config.num_attention_heads)
        {
            return Err(bad_config(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                config.hidden_size, config.num_attention_heads
            )));
        }
        if config.max_position_embeddings == 0 {
            return Err(bad_config("max_position_embeddings is 0".into()));
        }

        let pooling = read_pooling(&pooling_path, config.hidden_size)?;
        let max_seq_len = max_seq_len(dir, &config)?;
        let tokenizer = load_tokenizer(&tokenizer_path, &config, max_seq_len)?;
        let vocab = tokenizer.get_vocab_size(true);
        if vocab > config.vocab_size {
            return Err(bad_config(format!(
                "the tokenizer has {vocab} tokens but vocab_size is {}",
                config.vocab_size
            )));
        }

        // SAFETY: the file is memory-mapped, and changing it in place while
        // mapped is undefined behaviour. `models/fetch` never writes into an
        // installed file: it deletes a folder that fails its checksums and
        // moves a fresh one in, which leaves an existing mapping intact.
        let vb =
            unsafe { VarBuilder::from_mmaped_safetensors(&[&weights_path], DType::F32, &device) }
                .map_err(|e| EmbedError::Weights {
                path: weights_path.clone(),
                message: e.to_string(),
            })?;
        let kernel = match precision {
            _ if !device.is_cpu() => None,
            CpuPrecision::F32 => None,
            CpuPrecision::Auto => Kernel::detect(),
            CpuPrecision::Int8 => Some(Kernel::detect().unwrap_or(Kernel::Portable)),
        };
        let int8 = kernel
            .map(|kernel| Int8Encoder::load(&vb, &config, kernel))
            .transpose()
            .map_err(|e| EmbedError::Weights {
                path: weights_path.clone(),
                message: e.to_string(),
            })?;
        let model = BertModel::load(vb, &config).map_err(|e| EmbedError::Weights {
            path: weights_path.clone(),
            message: e.to_string(),
        })?;

        let embedder = Embedder {
            model,
            int8,
            tokenizer,
            device,
            pooling,
            dimension: config.hidden_size,
            max_seq_len,
        };
        tracing::info!(
            model = %dir.display(),
            device = %embedder.device_name(),
            kernel = embedder.cpu_kernel(),
            dimension = embedder.dimension,
            max_seq_len = embedder.max_seq_len,
            pooling = ?embedder.pooling,
            "Embedding model loaded."
        );
        Ok(embedder)
    }

    /// Embeds a batch: one unit-length vector of `dimension()` floats per
    /// text, in order.
    ///
    /// Padding is masked out of both attention and pooling, so a text gets
    /// the same vector alone or in any batch. Texts longer than
    /// `max_seq_len()` tokens are truncated. On a GPU the batch is one model
    /// call, padded to its longest text. On the CPU it is cut into
    /// micro-batches of texts of about one length (longest first, at most
    /// `CPU_MICRO_BATCH_TOKENS` padded tokens each) that the rayon pool's
    /// threads take in turn: little padding, activations that stay in cache,
    /// and every core busy in the element-wise work too, not only in the
    /// matrix products.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| EmbedError::Tokenize(e.to_string()))?;
        let batch = encodings.len();
        let len = encodings.iter().map(|e| e.len()).max().unwrap_or(0);
        if len == 0 {
            // A tokenizer without special tokens and only empty texts.
            return Ok(vec![vec![0.0; self.dimension]; batch]);
        }
        // BatchLongest padding makes every encoding `len` long; this guard
        // keeps a tokenizer that pads differently from building a misshapen
        // tensor.
        if let Some(e) = encodings.iter().find(|e| e.len() != len) {
            return Err(EmbedError::Tokenize(format!(
                "the tokenizer padded to {} tokens instead of {len}",
                e.len()
            )));
        }
        // Padding is on the right: a text's tokens are the first `real` of
        // its `len`, and a micro-batch needs only its longest text's.
        let real: Vec<usize> = encodings
            .iter()
            .map(|e| e.get_attention_mask().iter().filter(|&&m| m != 0).count())
            .collect();
        if !self.device.is_cpu() || batch == 1 {
            let all: Vec<usize> = (0..batch).collect();
            return self.forward_group(&encodings, &real, &all, len);
        }

        let threads = rayon::current_num_threads().max(1);
        let groups = micro_batches(&real, threads);
        let run = |group: &[usize]| {
            let longest = group.iter().map(|&i| real[i]).max().unwrap_or(0);
            self.forward_group(&encodings, &real, group, longest.clamp(1, len))
        };
        // The groups come longest first; each thread takes the next one, so
        // the short ones even out the end.
        let next = AtomicUsize::new(0);
        let out = Mutex::new(vec![Vec::new(); batch]);
        let failed = Mutex::new(None);
        rayon::scope(|s| {
            for _ in 0..threads.min(groups.len()) {
                s.spawn(|_| loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(group) = groups.get(k) else { break };
                    match run(group) {
                        Ok(vectors) => {
                            let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
                            for (&i, v) in group.iter().zip(vectors) {
                                out[i] = v;
                            }
                        }
                        Err(e) => {
                            failed
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .get_or_insert(e);
                            break;
                        }
                    }
                });
            }
        });
        match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(e),
            None => Ok(out.into_inner().unwrap_or_else(|e| e.into_inner())),
        }
    }

    /// The model on the texts `group` of `encodings`, each cut to its first
    /// `len` tokens (its padding beyond the group's longest text); `real`
    /// holds every encoding's unpadded length.
    fn forward_group(
        &self,
        encodings: &[tokenizers::Encoding],
        real: &[usize],
        group: &[usize],
        len: usize,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        if let Some(int8) = &self.int8 {
            // Ragged: each text's real tokens only.
            let texts: Vec<_> = group
                .iter()
                .map(|&i| {
                    let e = &encodings[i];
                    (&e.get_ids()[..real[i]], &e.get_type_ids()[..real[i]])
                })
                .collect();
            return int8
                .embed(&texts, self.pooling)
                .map_err(|e| EmbedError::Forward(candle_core::Error::Msg(e)));
        }
        let n = group.len();
        let mut ids = Vec::with_capacity(n * len);
        let mut type_ids = Vec::with_capacity(n * len);
        let mut mask = Vec::with_capacity(n * len);
        for e in group.iter().map(|&i| &encodings[i]) {
            ids.extend_from_slice(&e.get_ids()[..len]);
            type_ids.extend_from_slice(&e.get_type_ids()[..len]);
            mask.extend_from_slice(&e.get_attention_mask()[..len]);
        }
        self.forward(ids, type_ids, mask, (n, len))
            .map_err(EmbedError::Forward)
    }

    /// Runs the model on token ids already laid out as `shape`
    /// (batch, length), pooled and normalised.
    pub(super) fn forward(
        &self,
        ids: Vec<u32>,
        type_ids: Vec<u32>,
        mask: Vec<u32>,
        shape: (usize, usize),
    ) -> candle_core::Result<Vec<Vec<f32>>> {
        let ids = Tensor::from_vec(ids, shape, &self.device)?;
        let type_ids = Tensor::from_vec(type_ids, shape, &self.device)?;
        let mask = Tensor::from_vec(mask, shape, &self.device)?;
        // (batch, len, hidden)
        let hidden = self.model.forward(&ids, &type_ids, Some(&mask))?;
        let pooled = match self.pooling {
            Pooling::Cls => hidden.i((.., 0))?,
            Pooling::Mean => {
                let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?; // (batch, len, 1)
                let sum = hidden.broadcast_mul(&mask)?.sum(1)?; // (batch, hidden)
                let count = mask.sum(1)?.clamp(1e-9f32, f32::MAX)?; // (batch, 1)
                sum.broadcast_div(&count)?
            }
        };
        let norm = pooled
            .sqr()?
            .sum_keepdim(1)?
            .sqrt()?
            .clamp(1e-12f32, f32::MAX)?;
        pooled.broadcast_div(&norm)?.to_vec2::<f32>()
    }

    /// How many tokens `embed` gives `text`: special tokens included,
    /// truncated to `max_seq_len()`. A text the tokenizer refuses counts as
    /// `max_seq_len()`.
    pub fn count_tokens(&self, text: &str) -> usize {
        self.tokenizer
            .encode_fast(text, true)
            .map_or(self.max_seq_len, |e| e.len())
    }

    /// The tokenizer, with the model's padding and truncation.
    pub(super) fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The model's tokenizer without padding or truncation, for cutting
    /// texts into chunks (no special tokens are added by callers).
    pub fn plain_tokenizer(&self) -> Result<Tokenizer, EmbedError> {
        super::static_table::plain_tokenizer(&self.tokenizer)
    }

    /// What runs the model's matrix products: `f32` (candle, on any
    /// device), `int8-avx512-vnni` or `int8-portable`.
    pub fn cpu_kernel(&self) -> &'static str {
        self.int8.as_ref().map_or("f32", |e| e.kernel().name())
    }

    /// Where the model runs: `cpu` or `cuda:N`.
    pub fn device_name(&self) -> String {
        device_name(&self.device)
    }

    /// The length of every vector.
    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// The most tokens of a text the model reads, special tokens included.
    pub fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    pub fn pooling(&self) -> Pooling {
        self.pooling
    }
}

/// Most padded tokens (texts x the longest text's tokens) in one CPU
/// micro-batch. Measured on all-MiniLM-L6-v2 (one thread, texts of 16 to 128
/// tokens): 128 to 512 all ran about twice as many texts per CPU-second as
/// whole batches of 32 did; 2,048 gained less than half of that.
pub(super) const CPU_MICRO_BATCH_TOKENS: usize = 256;

/// The texts, longest first, cut into micro-batches: each holds at most
/// `CPU_MICRO_BATCH_TOKENS` padded tokens (always at least one text) and at
/// most a `threads`-th of the texts, so that every thread gets work.
pub(super) fn micro_batches(real: &[usize], threads: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..real.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(real[i]));
    let most = real.len().div_ceil(threads.max(1));
    let mut groups = Vec::new();
    let mut rest = order.as_slice();
    while let Some(&first) = rest.first() {
        let n = (CPU_MICRO_BATCH_TOKENS / real[first].max(1)).clamp(1, most.min(rest.len()));
        let (group, tail) = rest.split_at(n);
        groups.push(group.to_vec());
        rest = tail;
    }
    groups
}

fn device_name(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".to_string(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

#[cfg(feature = "cuda")]
fn default_device() -> Device {
    match Device::cuda_if_available(0) {
        Ok(device) => device,
        Err(e) => {
            tracing::warn!(error = %e, "CUDA device 0 is not usable; embedding on the CPU.");
            Device::Cpu
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn default_device() -> Device {
    Device::Cpu
}

/// `dir/file`, or `MissingFile` (also when `dir` itself is missing).
fn require(dir: &Path, file: &'static str) -> Result<PathBuf, EmbedError> {
    let path = dir.join(file);
    if path.is_file() {
        Ok(path)
    } else {
        Err(EmbedError::MissingFile {
            dir: dir.to_path_buf(),
            file,
        })
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, EmbedError> {
    let text = std::fs::read_to_string(path).map_err(|source| EmbedError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| EmbedError::BadConfig {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// `1_Pooling/config.json`, as sentence-transformers writes it. Exactly one
/// mode must be on, and it must be mean or CLS.
#[derive(serde::Deserialize)]
struct PoolingConfig {
    word_embedding_dimension: Option<usize>,
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
}

fn read_pooling(path: &Path, hidden_size: usize) -> Result<Pooling, EmbedError> {
    let c: PoolingConfig = read_json(path)?;
    if let Some(dim) = c.word_embedding_dimension {
        if dim != hidden_size {
            return Err(EmbedError::BadConfig {
                path: path.to_path_buf(),
                message: format!(
                    "word_embedding_dimension {dim} differs from the model's hidden_size {hidden_size}"
                ),
            });
        }
    }
    let modes = [
        ("cls_token", c.pooling_mode_cls_token),
        ("mean_tokens", c.pooling_mode_mean_tokens),
        ("max_tokens", c.pooling_mode_max_tokens),
        ("mean_sqrt_len_tokens", c.pooling_mode_mean_sqrt_len_tokens),
        ("weightedmean_tokens", c.pooling_mode_weightedmean_tokens),
        ("lasttoken", c.pooling_mode_lasttoken),
    ];
    let on: Vec<&str> = modes
        .iter()
        .filter(|(_, on)| *on)
        .map(|(name, _)| *name)
        .collect();
    match on.as_slice() {
        ["mean_tokens"] => Ok(Pooling::Mean),
        ["cls_token"] => Ok(Pooling::Cls),
        [] => Err(EmbedError::UnsupportedPooling {
            path: path.to_path_buf(),
            found: "no pooling mode is on".into(),
        }),
        modes => Err(EmbedError::UnsupportedPooling {
            path: path.to_path_buf(),
            found: format!("pooling_mode_{}", modes.join(" + pooling_mode_")),
        }),
    }
}

/// `min(max_seq_length, max_position_embeddings)`: sentence-transformers
/// truncates to `max_seq_length` (`sentence_bert_config.json`), and no
/// model can read past its position embeddings.
fn max_seq_len(dir: &Path, config: &BertConfig) -> Result<usize, EmbedError> {
    #[derive(serde::Deserialize)]
    struct SentenceBertConfig {
        max_seq_length: Option<usize>,
    }
    let path = dir.join("sentence_bert_config.json");
    let positions = config.max_position_embeddings;
    if !path.is_file() {
        return Ok(positions);
    }
    let c: SentenceBertConfig = read_json(&path)?;
    match c.max_seq_length {
        Some(0) => Err(EmbedError::BadConfig {
            path,
            message: "max_seq_length is 0".into(),
        }),
        Some(n) => Ok(n.min(positions)),
        None => Ok(positions),
    }
}

/// The folder's tokenizer with its saved padding and truncation replaced:
/// pad each batch to its longest text (a `Fixed(128)` saved in the file
/// would waste work on short texts and cut nothing), and truncate to what
/// the model reads (a saved 128 would cut MiniLM's 256 in half).
fn load_tokenizer(
    path: &Path,
    config: &BertConfig,
    max_seq_len: usize,
) -> Result<Tokenizer, EmbedError> {
    let error = |message: String| EmbedError::Tokenizer {
        path: path.to_path_buf(),
        message,
    };
    let mut tokenizer = Tokenizer::from_file(path).map_err(|e| error(e.to_string()))?;
    // Keep the file's pad token when it names one (XLM-R pads with `<pad>`
    // = 1); otherwise pad with the config's `pad_token_id`. Padded positions
    // are masked, so the id only has to be a valid one. Padding goes on the
    // right whatever the file says: a text's tokens then keep positions
    // 0.. in any batch, and `[CLS]` stays at position 0 for CLS pooling.
    let padding = match tokenizer.get_padding() {
        Some(saved) => PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            direction: PaddingDirection::Right,
            pad_to_multiple_of: None,
            ..saved.clone()
        },
        None => {
            let pad_id = u32::try_from(config.pad_token_id)
                .map_err(|_| error(format!("pad_token_id {} is too large", config.pad_token_id)))?;
            PaddingParams {
                strategy: PaddingStrategy::BatchLongest,
                pad_id,
                pad_token: tokenizer
                    .id_to_token(pad_id)
                    .unwrap_or_else(|| "[PAD]".to_string()),
                ..PaddingParams::default()
            }
        }
    };
    tokenizer.with_padding(Some(padding));
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length: max_seq_len,
            strategy: TruncationStrategy::LongestFirst,
            stride: 0,
            direction: TruncationDirection::Right,
        }))
        .map_err(|e| error(e.to_string()))?;
    Ok(tokenizer)
}
