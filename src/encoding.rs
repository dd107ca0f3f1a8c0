//! Content-encoding decoders for scanning: responses are forwarded as they
//! came and decoded on the side, push-style, chunk by chunk.
//!
//! Each coding is a writer-style decoder (`flate2::write`, brotli's
//! `DecompressorWriter`, `zstd::stream::write`) so bytes can be pushed in
//! whatever chunks the network delivers. Stacked codings are nested writers:
//! the first decoder writes straight into the next, and the last into a
//! [`Sink`] that enforces the output cap. Nothing between two stages is
//! buffered beyond the decoders' own fixed-size buffers, so a bomb at any
//! stage costs at most the cap plus a chunk.

use std::io::{self, Write};

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
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

/// More stacked codings than any real server sends. Each stage holds
/// buffers and a window (up to 8 MiB for zstd), so an unbounded list in a
/// response header would be a cheap way to make residue allocate.
pub const MAX_STACKED_ENCODINGS: usize = 4;

/// The largest zstd window accepted: 8 MiB (window log 23), the limit RFC
/// 9659 sets for `Content-Encoding: zstd`. zstd's default would let one
/// frame header demand a 128 MiB window.
const ZSTD_WINDOW_LOG_MAX: u32 = 23;

/// Size of brotli's output buffer, the unit in which it hands bytes on.
const BROTLI_BUFFER: usize = 16 * 1024;

/// A push decoder for one response's `Content-Encoding` (possibly stacked,
/// e.g. `gzip, br`).
pub struct ContentDecoder {
    max_output: usize,
    /// The first decoder to feed (the last coding applied), or the sink.
    chain: Link,
    /// Names of the codings, in decoding order, for error messages.
    outermost: &'static str,
    /// The first error, returned again by every later call: a decoder that
    /// failed part-way is in no state to take more input.
    failed: Option<EncodingError>,
    finished: bool,
}

// The decoder lives in a response body that may move between threads.
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<ContentDecoder>();
};

impl std::fmt::Debug for ContentDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContentDecoder")
            .field("max_output", &self.max_output)
            .field("outermost", &self.outermost)
            .field("failed", &self.failed)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl ContentDecoder {
    /// `None`, empty and `identity` decode to themselves. `max_output` caps the
    /// decoded bytes (a decompression bomb yields `TooLarge`, not an OOM).
    ///
    /// Names are matched case-insensitively with surrounding whitespace
    /// ignored; `x-gzip` is `gzip`, `none` and empty list items are
    /// `identity`. The list is in the order the codings were applied, so it
    /// is decoded back to front. The cap applies to identity bodies too: it
    /// bounds what the scanner holds, whatever the encoding.
    pub fn new(content_encoding: Option<&str>, max_output: usize) -> Result<Self, EncodingError> {
        let mut codings = Vec::new();
        for item in content_encoding.unwrap_or("").split(',') {
            let name = item.trim_matches(|c: char| c == ' ' || c == '\t');
            let coding = match name.to_ascii_lowercase().as_str() {
                "" | "identity" | "none" => continue,
                "gzip" | "x-gzip" => Coding::Gzip,
                "deflate" => Coding::Deflate,
                "br" => Coding::Brotli,
                "zstd" => Coding::Zstd,
                _ => return Err(EncodingError::Unsupported(clip(name))),
            };
            codings.push(coding);
        }
        if codings.len() > MAX_STACKED_ENCODINGS {
            return Err(EncodingError::Unsupported(clip(
                content_encoding.unwrap_or(""),
            )));
        }

        let mut chain = Link::Sink(Sink::new(max_output));
        // The first coding applied is the last decoded, next to the sink.
        for coding in &codings {
            chain = Link::Stage(Box::new(Stage::new(*coding, chain)?));
        }
        Ok(ContentDecoder {
            max_output,
            chain,
            outermost: codings.last().map_or("identity", |c| c.name()),
            failed: None,
            finished: false,
        })
    }

    pub fn is_identity(&self) -> bool {
        matches!(self.chain, Link::Sink(_))
    }

    /// Appends the bytes `chunk` decodes to onto `out`.
    ///
    /// On an error `out` still receives whatever was decoded before it (at
    /// most up to the cap), so a caller may scan the prefix.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) -> Result<(), EncodingError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.finished {
            let e = EncodingError::Corrupt {
                encoding: self.outermost,
                message: "data after the end of the body".to_string(),
            };
            self.failed = Some(e.clone());
            return Err(e);
        }
        let result = self.chain.write_all(chunk);
        self.settle(result, out)
    }

    /// The body ended: flushes what the decoder still holds; a truncated
    /// stream is `Corrupt`.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), EncodingError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.finished {
            return Ok(());
        }
        self.finished = true;
        let result = self.chain.finish();
        self.settle(result, out)
    }

    /// Hands the decoded bytes over and turns an I/O error into the stage
    /// and cause it came from.
    fn settle(&mut self, result: io::Result<()>, out: &mut Vec<u8>) -> Result<(), EncodingError> {
        let sink = self.chain.sink_mut();
        out.append(&mut sink.buf);
        let Err(e) = result else {
            return Ok(());
        };
        let error = if sink.overflowed {
            EncodingError::TooLarge(self.max_output)
        } else {
            // An error surfaces through every stage above the one that
            // raised it, so the innermost stage that saw one is the culprit.
            let (encoding, message) = self
                .chain
                .innermost_failure()
                .unwrap_or((self.outermost, e.to_string()));
            EncodingError::Corrupt { encoding, message }
        };
        self.failed = Some(error.clone());
        Err(error)
    }
}

/// An `Unsupported` payload: the offending name, bounded, since it comes
/// from a response header.
fn clip(s: &str) -> String {
    const MAX: usize = 64;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Coding {
    Gzip,
    Deflate,
    Brotli,
    Zstd,
}

impl Coding {
    fn name(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Deflate => "deflate",
            Coding::Brotli => "br",
            Coding::Zstd => "zstd",
        }
    }
}

/// Where a stage writes: the next stage, or the capped output.
enum Link {
    Stage(Box<Stage>),
    Sink(Sink),
}

impl Link {
    fn sink_mut(&mut self) -> &mut Sink {
        let mut link = self;
        loop {
            match link {
                Link::Sink(sink) => return sink,
                Link::Stage(stage) => link = stage.next_mut(),
            }
        }
    }

    /// Finishes every stage in decoding order: finishing one flushes its
    /// tail into the next, which is then finished in turn.
    fn finish(&mut self) -> io::Result<()> {
        let mut link = self;
        loop {
            match link {
                Link::Sink(_) => return Ok(()),
                Link::Stage(stage) => {
                    stage.finish()?;
                    link = stage.next_mut();
                }
            }
        }
    }

    fn innermost_failure(&self) -> Option<(&'static str, String)> {
        let mut found = None;
        let mut link = self;
        while let Link::Stage(stage) = link {
            if let Some(message) = &stage.failure {
                found = Some((stage.coding.name(), message.clone()));
            }
            link = stage.next_ref();
        }
        found
    }
}

impl Write for Link {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Link::Stage(stage) => stage.write(buf),
            Link::Sink(sink) => sink.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The decoded output: collects one call's bytes for [`ContentDecoder`] to
/// hand over, and refuses anything past the cap. Refusing inside `write`
/// stops a bomb while the decoder is still producing, before the bytes exist
/// anywhere else.
struct Sink {
    buf: Vec<u8>,
    total: usize,
    cap: usize,
    overflowed: bool,
}

impl Sink {
    fn new(cap: usize) -> Sink {
        Sink {
            buf: Vec::new(),
            total: 0,
            cap,
            overflowed: false,
        }
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let room = self.cap.saturating_sub(self.total);
        if room == 0 {
            self.overflowed = true;
            return Err(io::Error::other("decoded body exceeds the scan cap"));
        }
        let n = buf.len().min(room);
        self.buf.extend_from_slice(&buf[..n]);
        self.total += n;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One coding's decoder, with what it has seen.
struct Stage {
    coding: Coding,
    decoder: Decoder,
    /// Whether any input arrived. An empty body is accepted as empty for
    /// every coding: servers send `Content-Encoding: gzip` on empty 204s and
    /// HEAD-like answers, and there is nothing in them to scan.
    received: bool,
    /// The error this stage's decoder returned (its own or one from below).
    failure: Option<String>,
}

enum Decoder {
    Gzip(flate2::write::MultiGzDecoder<Link>),
    Zlib(flate2::write::ZlibDecoder<Link>),
    RawDeflate(flate2::write::DeflateDecoder<Link>),
    /// `deflate` before its first two bytes: servers send either a zlib
    /// stream (what RFC 9110 means) or raw deflate (what some old IIS and
    /// PHP setups send), and only a zlib header tells them apart.
    DeflateUndecided {
        head: Vec<u8>,
        next: Box<Link>,
    },
    // Boxed: brotli's state is large, and the enum is as big as its
    // largest variant.
    Brotli(Box<brotli::DecompressorWriter<Link>>),
    Zstd(zstd::stream::write::Decoder<'static, Link>),
}

impl Stage {
    fn new(coding: Coding, next: Link) -> Result<Stage, EncodingError> {
        let decoder = match coding {
            Coding::Gzip => Decoder::Gzip(flate2::write::MultiGzDecoder::new(next)),
            Coding::Deflate => Decoder::DeflateUndecided {
                head: Vec::with_capacity(2),
                next: Box::new(next),
            },
            Coding::Brotli => Decoder::Brotli(Box::new(brotli::DecompressorWriter::new(
                next,
                BROTLI_BUFFER,
            ))),
            Coding::Zstd => {
                let corrupt = |e: io::Error| EncodingError::Corrupt {
                    encoding: "zstd",
                    message: e.to_string(),
                };
                let mut d = zstd::stream::write::Decoder::new(next).map_err(corrupt)?;
                d.window_log_max(ZSTD_WINDOW_LOG_MAX).map_err(corrupt)?;
                Decoder::Zstd(d)
            }
        };
        Ok(Stage {
            coding,
            decoder,
            received: false,
            failure: None,
        })
    }

    fn next_mut(&mut self) -> &mut Link {
        match &mut self.decoder {
            Decoder::Gzip(d) => d.get_mut(),
            Decoder::Zlib(d) => d.get_mut(),
            Decoder::RawDeflate(d) => d.get_mut(),
            Decoder::Brotli(d) => d.get_mut(),
            Decoder::Zstd(d) => d.get_mut(),
            Decoder::DeflateUndecided { next, .. } => next,
        }
    }

    fn next_ref(&self) -> &Link {
        match &self.decoder {
            Decoder::Gzip(d) => d.get_ref(),
            Decoder::Zlib(d) => d.get_ref(),
            Decoder::RawDeflate(d) => d.get_ref(),
            Decoder::Brotli(d) => d.get_ref(),
            Decoder::Zstd(d) => d.get_ref(),
            Decoder::DeflateUndecided { next, .. } => next,
        }
    }

    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.received = true;
        let result = self.write_inner(buf);
        self.note(result)
    }

    fn write_inner(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.decoder {
            Decoder::Gzip(d) => d.write(buf),
            Decoder::Zlib(d) => d.write(buf),
            Decoder::RawDeflate(d) => d.write(buf),
            Decoder::Brotli(d) => d.write(buf),
            Decoder::Zstd(d) => d.write(buf),
            Decoder::DeflateUndecided { head, .. } => {
                let take = buf.len().min(2 - head.len());
                head.extend_from_slice(&buf[..take]);
                let &[cmf, flg] = head.as_slice() else {
                    return Ok(take);
                };
                // Swap the undecided stage out for a throwaway one to own
                // its next link; the throwaway is replaced right away.
                let throwaway = Decoder::DeflateUndecided {
                    head: Vec::new(),
                    next: Box::new(Link::Sink(Sink::new(0))),
                };
                let Decoder::DeflateUndecided { head, next } =
                    std::mem::replace(&mut self.decoder, throwaway)
                else {
                    return Err(io::Error::other("deflate stage changed under us"));
                };
                self.decoder = if is_zlib_header(cmf, flg) {
                    Decoder::Zlib(flate2::write::ZlibDecoder::new(*next))
                } else {
                    Decoder::RawDeflate(flate2::write::DeflateDecoder::new(*next))
                };
                self.write_all_inner(&head)?;
                Ok(take)
            }
        }
    }

    fn write_all_inner(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.write_inner(buf)? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => buf = &buf[n..],
            }
        }
        Ok(())
    }

    /// Flushes what the decoder holds into the next link and checks that
    /// the stream was complete.
    fn finish(&mut self) -> io::Result<()> {
        if !self.received {
            return Ok(());
        }
        let result = match &mut self.decoder {
            Decoder::Gzip(d) => d.try_finish(),
            Decoder::Zlib(d) => d.try_finish(),
            Decoder::RawDeflate(d) => d.try_finish(),
            Decoder::Brotli(d) => d.close(),
            Decoder::Zstd(d) => d.do_finish(),
            Decoder::DeflateUndecided { .. } => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "stream ends after one byte",
            )),
        };
        self.note(result).map_err(|e| {
            // Some decoders report a truncated stream as a bare EOF.
            if e.kind() == io::ErrorKind::UnexpectedEof && self.failure.is_some() {
                self.failure = Some(format!("truncated stream: {e}"));
            }
            e
        })
    }

    fn note<T>(&mut self, result: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &result {
            if self.failure.is_none() {
                self.failure = Some(e.to_string());
            }
        }
        result
    }
}

/// RFC 1950: compression method 8 (deflate) with a window of at most 32 KiB,
/// and a header checksum that makes the two bytes a multiple of 31.
fn is_zlib_header(cmf: u8, flg: u8) -> bool {
    cmf & 0x0F == 8 && cmf >> 4 <= 7 && (u16::from(cmf) << 8 | u16::from(flg)) % 31 == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, RngCore, SeedableRng};
    use std::time::{Duration, Instant};

    const CAP: usize = 1 << 20;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).expect("gzip");
        e.finish().expect("gzip")
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).expect("zlib");
        e.finish().expect("zlib")
    }

    fn raw_deflate(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).expect("deflate");
        e.finish().expect("deflate")
    }

    fn brotli(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        {
            let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
            w.write_all(data).expect("br");
        }
        out
    }

    fn zstd(data: &[u8]) -> Vec<u8> {
        zstd::stream::encode_all(data, 3).expect("zstd")
    }

    /// Text that compresses, with a stretch of noise that does not.
    fn sample() -> Vec<u8> {
        let mut data = Vec::new();
        for i in 0..400 {
            data.extend_from_slice(format!("line {i}: the quick brown fox, 你好 — ").as_bytes());
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut noise = vec![0u8; 4000];
        rng.fill_bytes(&mut noise);
        data.extend_from_slice(&noise);
        data
    }

    type Encode = fn(&[u8]) -> Vec<u8>;

    /// Every single coding: header value, encoder, the name in errors.
    const CODINGS: &[(&str, Encode, &str)] = &[
        ("gzip", gzip, "gzip"),
        ("x-gzip", gzip, "gzip"),
        ("deflate", zlib, "deflate"),
        ("deflate", raw_deflate, "deflate"),
        ("br", brotli, "br"),
        ("zstd", zstd, "zstd"),
    ];

    /// Pushes `data` in `chunk`-byte pieces and finishes.
    fn decode(
        encoding: Option<&str>,
        data: &[u8],
        chunk: usize,
        cap: usize,
    ) -> Result<Vec<u8>, EncodingError> {
        let mut d = ContentDecoder::new(encoding, cap)?;
        let mut out = Vec::new();
        for piece in data.chunks(chunk.max(1)) {
            d.push(piece, &mut out)?;
        }
        d.finish(&mut out)?;
        Ok(out)
    }

    fn corrupt_in(result: Result<Vec<u8>, EncodingError>) -> &'static str {
        match result {
            Err(EncodingError::Corrupt { encoding, .. }) => encoding,
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn round_trips_at_every_chunk_size() {
        let plain = sample();
        let identities: &[(Option<&str>, Encode)] = &[
            (None, |d| d.to_vec()),
            (Some(""), |d| d.to_vec()),
            (Some("identity"), |d| d.to_vec()),
            (Some(" None "), |d| d.to_vec()),
        ];
        let all = CODINGS
            .iter()
            .map(|(name, enc, _)| (Some(*name), *enc))
            .chain(identities.iter().copied());
        for (name, encode) in all {
            let encoded = encode(&plain);
            for chunk in [1, 2, 3, 7, 64, 1000, 4096, encoded.len()] {
                let out = decode(name, &encoded, chunk, CAP);
                assert_eq!(
                    out.as_deref(),
                    Ok(&plain[..]),
                    "{name:?} in {chunk}-byte chunks"
                );
            }
        }
    }

    #[test]
    fn names_are_case_and_space_insensitive() {
        let plain = b"hello hello hello";
        for name in [
            "GZIP",
            " gzip ",
            "\tGzip\t",
            "X-GZip",
            "gzip,",
            ", gzip",
            "identity, gzip",
        ] {
            assert_eq!(
                decode(Some(name), &gzip(plain), 5, CAP),
                Ok(plain.to_vec()),
                "{name:?}"
            );
        }
    }

    #[test]
    fn stacked_codings_decode_back_to_front() {
        let plain = sample();
        let cases: &[(&str, &[Encode])] = &[
            ("gzip, br", &[gzip, brotli]),
            ("GZIP ,\tBr", &[gzip, brotli]),
            ("deflate, zstd", &[zlib, zstd]),
            ("br, gzip", &[brotli, gzip]),
            (
                "zstd, br, gzip, deflate",
                &[zstd, brotli, gzip, raw_deflate],
            ),
            ("gzip, identity, gzip", &[gzip, gzip]),
        ];
        for (header, encoders) in cases {
            let encoded = encoders.iter().fold(plain.clone(), |data, enc| enc(&data));
            for chunk in [1, 13, 4096] {
                let out = decode(Some(header), &encoded, chunk, CAP);
                assert_eq!(
                    out.as_deref(),
                    Ok(&plain[..]),
                    "{header:?} in {chunk}-byte chunks"
                );
            }
        }
    }

    #[test]
    fn bombs_stop_at_the_cap() {
        // 100 MB of zeros, one stream per coding: each is well under 1 MB.
        let zeros = vec![0u8; 100 << 20];
        let cases: &[(&str, Encode)] = &[
            ("gzip", gzip),
            ("zstd", zstd),
            ("br", brotli),
            ("deflate", zlib),
            ("deflate", raw_deflate),
        ];
        for (name, encode) in cases {
            let bomb = encode(&zeros);
            assert!(
                bomb.len() < 1_000_000,
                "{name}: bomb is {} bytes",
                bomb.len()
            );
            let start = Instant::now();
            let mut d = ContentDecoder::new(Some(name), CAP).expect("supported");
            let mut out = Vec::new();
            let mut result = Ok(());
            for piece in bomb.chunks(16 * 1024) {
                result = d.push(piece, &mut out);
                if result.is_err() {
                    break;
                }
            }
            if result.is_ok() {
                result = d.finish(&mut out);
            }
            assert_eq!(result, Err(EncodingError::TooLarge(CAP)), "{name}");
            assert_eq!(out.len(), CAP, "{name}: output is exactly the cap");
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{name}: {:?}",
                start.elapsed()
            );
            // The decoder stays failed.
            assert_eq!(d.push(b"x", &mut out), Err(EncodingError::TooLarge(CAP)));
            assert_eq!(d.finish(&mut out), Err(EncodingError::TooLarge(CAP)));
        }
    }

    #[test]
    fn identity_is_capped_too() {
        let out = decode(None, &[b'a'; 100], 30, 64);
        assert_eq!(out, Err(EncodingError::TooLarge(64)));
        assert_eq!(decode(None, &[b'a'; 64], 30, 64), Ok(vec![b'a'; 64]));
    }

    #[test]
    fn garbage_is_corrupt() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut noise = vec![0u8; 5000];
        rng.fill_bytes(&mut noise);
        let garbage: &[&[u8]] = &[
            b"this is not compressed at all, just text",
            &noise,
            &[0xff; 64],
        ];
        for (name, _, expect) in CODINGS {
            for data in garbage {
                for chunk in [1, 4096] {
                    let got = corrupt_in(decode(Some(name), data, chunk, CAP));
                    assert_eq!(got, *expect, "{name}, {} bytes in {chunk}", data.len());
                }
            }
        }
    }

    #[test]
    fn truncated_is_corrupt() {
        let plain = sample();
        for (name, encode, expect) in CODINGS {
            let encoded = encode(&plain);
            for cut in [1, 2, 10, encoded.len() / 2, encoded.len() - 1] {
                for chunk in [1, 4096] {
                    let got = corrupt_in(decode(Some(name), &encoded[..cut], chunk, CAP));
                    assert_eq!(got, *expect, "{name} cut at {cut} in {chunk}-byte chunks");
                }
            }
        }
    }

    #[test]
    fn stacked_errors_name_the_failing_coding() {
        // The br layer is fine; what it carries is not gzip.
        let inner_garbage = brotli(b"definitely not a gzip member");
        assert_eq!(
            corrupt_in(decode(Some("gzip, br"), &inner_garbage, 3, CAP)),
            "gzip"
        );
        // The br layer itself is cut short.
        let whole = brotli(&gzip(&sample()));
        assert_eq!(
            corrupt_in(decode(Some("gzip, br"), &whole[..whole.len() / 2], 7, CAP)),
            "br"
        );
        // A truncated gzip inside an intact zstd frame.
        let g = gzip(&sample());
        let cut = zstd(&g[..g.len() - 4]);
        assert_eq!(
            corrupt_in(decode(Some("gzip, zstd"), &cut, 64, CAP)),
            "gzip"
        );
    }

    #[test]
    fn edges_of_the_stream() {
        let plain = b"some body".to_vec();
        // Empty bodies are empty for every coding (204s, HEAD-like answers).
        for (name, _, _) in CODINGS {
            assert_eq!(decode(Some(name), b"", 1, CAP), Ok(vec![]), "{name}");
        }
        assert_eq!(decode(Some("gzip, br"), b"", 1, CAP), Ok(vec![]));
        // Concatenated gzip members and zstd frames are one body.
        let two = [gzip(b"ab"), gzip(b"cd")].concat();
        assert_eq!(decode(Some("gzip"), &two, 1, CAP), Ok(b"abcd".to_vec()));
        let two = [zstd(b"ab"), zstd(b"cd")].concat();
        assert_eq!(decode(Some("zstd"), &two, 1, CAP), Ok(b"abcd".to_vec()));
        // Bytes after the end of a stream are corrupt.
        for (name, encode, expect) in CODINGS {
            let data = [encode(&plain), b"trailing junk".to_vec()].concat();
            assert_eq!(
                corrupt_in(decode(Some(name), &data, 4, CAP)),
                *expect,
                "{name}"
            );
        }
        // A zstd frame asking for a 128 MiB window is refused up front.
        let greedy = [0x28, 0xB5, 0x2F, 0xFD, 0x00, 0x88, 0x01, 0x00, 0x00];
        match decode(Some("zstd"), &greedy, 64, CAP) {
            Err(EncodingError::Corrupt { encoding, message }) => {
                assert_eq!(encoding, "zstd");
                assert!(message.contains("memory"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // Finishing twice is fine; pushing after finishing is not.
        let mut d = ContentDecoder::new(Some("gzip"), CAP).expect("supported");
        let mut out = Vec::new();
        d.push(&gzip(&plain), &mut out).expect("push");
        d.finish(&mut out).expect("finish");
        d.finish(&mut out).expect("finish again");
        assert_eq!(out, plain);
        assert!(matches!(
            d.push(b"x", &mut out),
            Err(EncodingError::Corrupt { .. })
        ));
        // Empty pushes are no-ops.
        let mut d = ContentDecoder::new(Some("br"), CAP).expect("supported");
        let mut out = Vec::new();
        d.push(b"", &mut out).expect("empty push");
        d.push(&brotli(&plain), &mut out).expect("push");
        d.push(b"", &mut out).expect("empty push");
        d.finish(&mut out).expect("finish");
        assert_eq!(out, plain);
    }

    #[test]
    fn unknown_codings_are_unsupported() {
        let cases: &[(&str, &str)] = &[
            ("compress", "compress"),
            ("x-compress", "x-compress"),
            ("sdch", "sdch"),
            ("gzip, lzma", "lzma"),
            ("gzip;q=1", "gzip;q=1"),
            ("gzip br", "gzip br"),
            (
                "gzip, gzip, gzip, gzip, gzip",
                "gzip, gzip, gzip, gzip, gzip",
            ),
        ];
        for (header, reported) in cases {
            match ContentDecoder::new(Some(header), CAP) {
                Err(EncodingError::Unsupported(s)) => assert_eq!(s, *reported, "{header:?}"),
                other => panic!("{header:?}: {other:?}"),
            }
        }
        let long = "x".repeat(10_000);
        match ContentDecoder::new(Some(&long), CAP) {
            Err(EncodingError::Unsupported(s)) => assert!(s.len() < 100),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn is_identity_only_for_identity() {
        let cases: &[(Option<&str>, bool)] = &[
            (None, true),
            (Some(""), true),
            (Some("identity"), true),
            (Some("IDENTITY , none"), true),
            (Some("gzip"), false),
            (Some("br"), false),
            (Some("zstd"), false),
            (Some("deflate"), false),
            (Some("identity, gzip"), false),
        ];
        for (header, want) in cases {
            let d = ContentDecoder::new(*header, CAP).expect("supported");
            assert_eq!(d.is_identity(), *want, "{header:?}");
        }
    }

    #[test]
    fn mangled_streams_never_panic() {
        let plain = sample();
        let mut rng = rand::rngs::StdRng::seed_from_u64(99);
        let mut encoded: Vec<(&str, Vec<u8>)> = CODINGS
            .iter()
            .map(|(name, enc, _)| (*name, enc(&plain)))
            .collect();
        encoded.push(("gzip, br", brotli(&gzip(&plain))));
        for (name, good) in &encoded {
            for _ in 0..40 {
                let mut data = good.clone();
                for _ in 0..rng.gen_range(1..8) {
                    let i = rng.gen_range(0..data.len());
                    data[i] = rng.gen();
                }
                if rng.gen_bool(0.3) {
                    data.truncate(rng.gen_range(0..data.len()));
                }
                let chunk = rng.gen_range(1..2000);
                // Any outcome but a panic is fine; a small cap exercises the
                // overflow path mid-corruption too.
                let cap = if rng.gen_bool(0.5) { CAP } else { 1000 };
                if let Ok(out) = decode(Some(name), &data, chunk, cap) {
                    assert!(out.len() <= cap);
                }
            }
        }
    }
}
