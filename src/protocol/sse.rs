//! An incremental Server-Sent Events framer (WHATWG "event stream
//! interpretation"), lenient where real servers are sloppy.
//!
//! Accepts bytes in chunks of any size: lines end with `\n`, `\r\n` or `\r`
//! (a `\r\n` split between two chunks is one line end); `data:` lines are
//! joined with `\n`; one space after the colon is removed; comment lines
//! (`:`…) are ignored; `event:` names the event; a blank line dispatches.
//! A leading byte order mark is skipped. Unlike the spec, an event still open
//! when the body ends *is* dispatched by [`SseFramer::finish`].
//!
//! Leniency for mislabelled bodies: until a recognised field or comment has
//! been seen, a line starting with `{` or `[` is handed over as an event on
//! its own (a plain JSON body sent as `text/event-stream`).
//!
//! Memory is capped: the open line, the event's data and its name together
//! never exceed `max` bytes. A line that would is discarded up to its end,
//! and an event that loses a line so is dropped; both set `truncated`, and a
//! dropped event surfaces as [`Frame::Overflow`] so the caller can count it.

use super::json::BOM;

/// One unit handed to the caller.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame<'a> {
    /// A complete event (SSE) or line (NDJSON); `name` is the SSE event name,
    /// empty when none was given. `data` was decoded lossily from UTF-8.
    Event { name: &'a str, data: &'a str },
    /// An event or line that exceeded the cap and was dropped.
    Overflow,
}

#[derive(Debug)]
pub(crate) struct SseFramer {
    max: usize,
    /// The current, unterminated line.
    line: Vec<u8>,
    /// The current line exceeded `max`; it is being discarded.
    line_overflow: bool,
    /// That discarded line is a comment (harmless to the event).
    overflow_is_comment: bool,
    /// The previous chunk ended in `\r`: a leading `\n` is its line end.
    skip_lf: bool,
    /// The event's data buffer, each `data:` value followed by `\n`.
    data: Vec<u8>,
    /// The event's `event:` name.
    event: String,
    /// Part of the current event was dropped for exceeding the cap.
    event_overflow: bool,
    /// Whether the first line (which may start with a BOM) was seen.
    started: bool,
    /// Some line or event exceeded the cap.
    pub(crate) truncated: bool,
    /// A recognised SSE field or comment was seen (the body *is* SSE).
    pub(crate) saw_field: bool,
}

impl SseFramer {
    /// A framer holding at most about `max` bytes per line and per event.
    pub(crate) fn new(max: usize) -> Self {
        SseFramer {
            max,
            line: Vec::new(),
            line_overflow: false,
            overflow_is_comment: false,
            skip_lf: false,
            data: Vec::new(),
            event: String::new(),
            event_overflow: false,
            started: false,
            truncated: false,
            saw_field: false,
        }
    }

    /// Bytes currently held (for tests of the memory cap).
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> usize {
        self.line.len() + self.data.len() + self.event.len()
    }

    /// Feeds a chunk; `f` is called once per dispatched event.
    pub(crate) fn push(&mut self, chunk: &[u8], f: &mut dyn FnMut(Frame<'_>)) {
        let mut rest = chunk;
        while !rest.is_empty() {
            if self.skip_lf {
                self.skip_lf = false;
                if rest[0] == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(i) => {
                    if self.line.is_empty() && !self.line_overflow && self.fits(i) {
                        // Fast path: the whole line is in this chunk.
                        self.line_done(&rest[..i], f);
                    } else {
                        self.append(&rest[..i]);
                        let line = std::mem::take(&mut self.line);
                        self.line_done(&line, f);
                        self.line = line;
                        self.line.clear();
                    }
                    self.skip_lf = rest[i] == b'\r';
                    rest = &rest[i + 1..];
                }
                None => {
                    self.append(rest);
                    break;
                }
            }
        }
    }

    /// The body ended: an unterminated last line is taken as terminated, and
    /// an event still open is dispatched.
    pub(crate) fn finish(&mut self, f: &mut dyn FnMut(Frame<'_>)) {
        if !self.line.is_empty() || self.line_overflow {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, f);
        }
        self.dispatch(f);
        self.skip_lf = false;
    }

    /// Whether `extra` more bytes of line stay within the cap.
    fn fits(&self, extra: usize) -> bool {
        self.line.len() + extra + self.data.len() + self.event.len() <= self.max
    }

    /// Adds bytes to the current line, or starts discarding it past the cap.
    fn append(&mut self, bytes: &[u8]) {
        if self.line_overflow || bytes.is_empty() {
            return;
        }
        if !self.fits(bytes.len()) {
            self.overflow_is_comment = self.line.first().or(bytes.first()) == Some(&b':');
            self.line_overflow = true;
            self.truncated = true;
            self.line = Vec::new();
            return;
        }
        self.line.extend_from_slice(bytes);
    }

    /// Interprets one complete line (without its terminator).
    fn line_done(&mut self, line: &[u8], f: &mut dyn FnMut(Frame<'_>)) {
        if self.line_overflow {
            self.line_overflow = false;
            self.started = true;
            if !self.overflow_is_comment {
                self.event_overflow = true;
                self.data = Vec::new();
            }
            return;
        }
        let mut line = line;
        if !self.started {
            self.started = true;
            line = line.strip_prefix(BOM).unwrap_or(line);
        }
        if line.is_empty() {
            self.dispatch(f);
            return;
        }
        if line[0] == b':' {
            self.saw_field = true;
            return;
        }
        if !self.saw_field && matches!(line[0], b'{' | b'[') {
            let text = String::from_utf8_lossy(line);
            f(Frame::Event {
                name: "",
                data: &text,
            });
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                self.saw_field = true;
                if self.event_overflow {
                    return;
                }
                if self.data.len() + value.len() + 1 > self.max {
                    self.event_overflow = true;
                    self.truncated = true;
                    self.data = Vec::new();
                    return;
                }
                self.data.extend_from_slice(value);
                self.data.push(b'\n');
            }
            b"event" => {
                self.saw_field = true;
                self.event = String::from_utf8_lossy(value).into_owned();
            }
            b"id" | b"retry" => self.saw_field = true,
            _ => {}
        }
    }

    /// Dispatches the open event, if any, and resets the event buffers.
    fn dispatch(&mut self, f: &mut dyn FnMut(Frame<'_>)) {
        if std::mem::take(&mut self.event_overflow) {
            f(Frame::Overflow);
        } else if !self.data.is_empty() {
            let data = self.data.strip_suffix(b"\n").unwrap_or(&self.data);
            let text = String::from_utf8_lossy(data);
            f(Frame::Event {
                name: &self.event,
                data: &text,
            });
        }
        self.data.clear();
        self.event.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames `input` pushed in the given chunks, as owned `(name, data)`
    /// pairs (`("!overflow", "")` for an overflow).
    fn frames(chunks: &[&[u8]], max: usize) -> (Vec<(String, String)>, bool) {
        let mut got = Vec::new();
        let mut sse = SseFramer::new(max);
        let mut f = |fr: Frame<'_>| match fr {
            Frame::Event { name, data } => got.push((name.to_owned(), data.to_owned())),
            Frame::Overflow => got.push(("!overflow".to_owned(), String::new())),
        };
        for c in chunks {
            sse.push(c, &mut f);
        }
        sse.finish(&mut f);
        (got, sse.truncated)
    }

    fn ev(name: &str, data: &str) -> (String, String) {
        (name.to_owned(), data.to_owned())
    }

    #[test]
    fn spec_cases() {
        let cases: &[(&str, Vec<(String, String)>)] = &[
            ("data: a\n\n", vec![ev("", "a")]),
            ("data:a\n\n", vec![ev("", "a")]),
            ("data:  two spaces\n\n", vec![ev("", " two spaces")]),
            ("data: a\ndata: b\n\n", vec![ev("", "a\nb")]),
            ("data: a\r\ndata: b\r\n\r\n", vec![ev("", "a\nb")]),
            ("data: a\rdata: b\r\r", vec![ev("", "a\nb")]),
            (": comment\ndata: x\n\n", vec![ev("", "x")]),
            ("event: ping\ndata: {}\n\n", vec![ev("ping", "{}")]),
            ("event: x\n\ndata: y\n\n", vec![ev("", "y")]),
            ("id: 1\nretry: 5\nfoo: bar\ndata: z\n\n", vec![ev("", "z")]),
            ("data\n\n", vec![ev("", "")]),
            ("data: last", vec![ev("", "last")]),
            ("data: last\n", vec![ev("", "last")]),
            ("\u{feff}data: bom\n\n", vec![ev("", "bom")]),
            ("\n\n\n", vec![]),
            ("", vec![]),
            // Lenient: JSON lines before any SSE field are events.
            ("{\"a\":1}\n[2]\n", vec![ev("", "{\"a\":1}"), ev("", "[2]")]),
            ("data: x\n{\"a\":1}\n\n", vec![ev("", "x")]),
        ];
        for (input, want) in cases {
            let (got, _) = frames(&[input.as_bytes()], 1 << 20);
            assert_eq!(&got, want, "input {input:?}");
        }
    }

    #[test]
    fn crlf_split_across_pushes_is_one_line_end() {
        let (got, _) = frames(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"], 1024);
        assert_eq!(got, vec![ev("", "a\nb")]);
    }

    #[test]
    fn long_line_is_dropped_and_flagged() {
        let big = format!("data: {}\n\ndata: ok\n\n", "x".repeat(100));
        let (got, truncated) = frames(&[big.as_bytes()], 50);
        assert!(truncated);
        assert_eq!(got, vec![ev("!overflow", ""), ev("", "ok")]);
        // A long comment does not spoil its event.
        let big = format!(":{}\ndata: ok\n\n", "x".repeat(100));
        let (got, truncated) = frames(&[big.as_bytes()], 50);
        assert!(truncated);
        assert_eq!(got, vec![ev("", "ok")]);
    }

    #[test]
    fn many_data_lines_are_capped() {
        let body = "data: 0123456789\n".repeat(20) + "\ndata: ok\n\n";
        let (got, truncated) = frames(&[body.as_bytes()], 64);
        assert!(truncated);
        assert_eq!(got, vec![ev("!overflow", ""), ev("", "ok")]);
    }
}
