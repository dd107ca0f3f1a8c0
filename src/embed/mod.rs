//! Sentence embeddings for the semantic detectors: a BERT-family
//! sentence-transformers model run with candle, batched, pooled and
//! L2-normalised so that a dot product is a cosine similarity.
//!
//! `models/fetch` installs the default model (all-MiniLM-L6-v2) into
//! `models/all-MiniLM-L6-v2/`.

pub mod chunk;
mod int8;
mod model;
mod service;
mod static_table;
pub mod window;

pub use model::{CpuPrecision, EmbedError, Embedder, Pooling};
pub use service::{BatchConfig, EmbedService, Reply, Shed};
pub use static_table::StaticEmbedder;

#[cfg(test)]
pub(crate) mod tests;
