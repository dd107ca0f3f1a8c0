//! An incremental newline-delimited JSON framer.
//!
//! Accepts bytes in chunks of any size and hands back one line at a time
//! (split on `\n`; a trailing `\r` and surrounding whitespace are trimmed;
//! blank lines are skipped). The last line needs no `\n`: [`LineFramer::finish`]
//! hands it over. A leading byte order mark is skipped. A line longer than
//! `max` is discarded up to its end, sets `truncated` and surfaces as
//! [`Frame::Overflow`].

use super::json::BOM;
use super::sse::Frame;

#[derive(Debug)]
pub(crate) struct LineFramer {
    max: usize,
    /// The current, unterminated line (never longer than `max`).
    line: Vec<u8>,
    /// The current line exceeded `max`; it is being discarded.
    line_overflow: bool,
    /// Whether the first line (which may start with a BOM) was seen.
    started: bool,
    /// Some line exceeded the cap.
    pub(crate) truncated: bool,
}

impl LineFramer {
    /// A framer holding at most `max` bytes of one line.
    pub(crate) fn new(max: usize) -> Self {
        LineFramer {
            max,
            line: Vec::new(),
            line_overflow: false,
            started: false,
            truncated: false,
        }
    }

    /// Bytes currently held (for tests of the memory cap).
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> usize {
        self.line.len()
    }

    /// Feeds a chunk; `f` is called once per non-blank line.
    pub(crate) fn push(&mut self, chunk: &[u8], f: &mut dyn FnMut(Frame<'_>)) {
        let mut rest = chunk;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            if self.line.is_empty() && !self.line_overflow && i <= self.max {
                self.line_done(&rest[..i], f);
            } else {
                self.append(&rest[..i]);
                let line = std::mem::take(&mut self.line);
                self.line_done(&line, f);
                self.line = line;
                self.line.clear();
            }
            rest = &rest[i + 1..];
        }
        self.append(rest);
    }

    /// The body ended: hands over a last line that had no `\n`.
    pub(crate) fn finish(&mut self, f: &mut dyn FnMut(Frame<'_>)) {
        if !self.line.is_empty() || self.line_overflow {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, f);
        }
    }

    fn append(&mut self, bytes: &[u8]) {
        if self.line_overflow || bytes.is_empty() {
            return;
        }
        if self.line.len() + bytes.len() > self.max {
            self.line_overflow = true;
            self.truncated = true;
            self.line = Vec::new();
            return;
        }
        self.line.extend_from_slice(bytes);
    }

    fn line_done(&mut self, line: &[u8], f: &mut dyn FnMut(Frame<'_>)) {
        if std::mem::take(&mut self.line_overflow) {
            self.started = true;
            f(Frame::Overflow);
            return;
        }
        let mut line = line;
        if !self.started {
            self.started = true;
            line = line.strip_prefix(BOM).unwrap_or(line);
        }
        let text = String::from_utf8_lossy(line);
        let text = text.trim();
        if !text.is_empty() {
            f(Frame::Event {
                name: "",
                data: text,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(chunks: &[&[u8]], max: usize) -> (Vec<String>, bool) {
        let mut got = Vec::new();
        let mut nd = LineFramer::new(max);
        let mut f = |fr: Frame<'_>| match fr {
            Frame::Event { data, .. } => got.push(data.to_owned()),
            Frame::Overflow => got.push("!overflow".to_owned()),
        };
        for c in chunks {
            nd.push(c, &mut f);
        }
        nd.finish(&mut f);
        (got, nd.truncated)
    }

    #[test]
    fn splits_lines() {
        let cases: &[(&[&[u8]], &[&str])] = &[
            (&[b"{}\n{}\n"], &["{}", "{}"]),
            (&[b"{}\r\n\r\n  \n{\"a\":1}"], &["{}", "{\"a\":1}"]),
            (&[b"{\"a\"", b":1}\n{", b"}"], &["{\"a\":1}", "{}"]),
            (&[b"\xEF\xBB", b"\xBF{}\n"], &["{}"]),
            (&[b""], &[]),
        ];
        for (chunks, want) in cases {
            let (got, truncated) = lines(chunks, 1024);
            assert_eq!(&got, want);
            assert!(!truncated);
        }
    }

    #[test]
    fn long_line_is_dropped_and_flagged() {
        let (got, truncated) = lines(&[b"0123456789", b"0123456789\n{}\n"], 15);
        assert!(truncated);
        assert_eq!(got, vec!["!overflow", "{}"]);
    }
}
