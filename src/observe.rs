//! The observer pipeline: finished exchanges go over a bounded queue to
//! scanner threads, off the forwarding path.
//!
//! The forwarding path only ever calls [`Observer::submit`], which never
//! waits: a full queue drops the exchange and counts it
//! (`residue_scan_dropped_total{reason="queue_full"}`). Scanner threads are
//! plain `std::thread`s (as TEI runs its model): decoding and counting tokens
//! is CPU work that must not sit on the async workers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::body::StreamEnd;
use crate::detect::{Detector, Finding, ScanInput};
use crate::encoding::ContentDecoder;
use crate::incident::IncidentSink;
use crate::metrics::Metrics;
use crate::protocol::{BodyFormat, Endpoint, Output, Prompt, ResponseDecoder, Usage};
use crate::tenant::Tenant;
use crate::tokens::TokenCounter;

/// When the phases of one exchange happened.
#[derive(Clone, Copy, Debug)]
pub struct Timings {
    /// The request head arrived.
    pub received: Instant,
    /// residue sent the request upstream.
    pub forwarded: Instant,
    /// The upstream's response head arrived.
    pub response_head: Instant,
    /// The response body ended (or the client went away).
    pub ended: Instant,
}

/// One finished request/response pair, as handed to the scanners.
#[derive(Debug)]
pub struct Exchange {
    pub request_id: Arc<str>,
    pub tenant: Tenant,
    pub endpoint: Endpoint,
    pub prompt: Arc<Prompt>,
    /// residue's count of the prompt's tokens, when the request path already
    /// needed it (the `max-prompt-tokens` guard).
    pub prompt_tokens: Option<u64>,
    /// Which counter to use: the route's tokenizer, or the estimate.
    pub counter: TokenCounter,
    pub stream_requested: bool,
    pub status: u16,
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    /// Usage the upstream reported in headers (TGI).
    pub header_usage: Usage,
    /// The response body as it was forwarded (still content-encoded), frame
    /// by frame, up to `observe.max-response-bytes`.
    pub body: Vec<Bytes>,
    /// Bytes forwarded, including any past the capture cap.
    pub body_bytes: u64,
    pub capture_truncated: bool,
    pub timings: Timings,
    pub end: StreamEnd,
    /// The cross-tenant detectors already ran while the answer streamed
    /// (block mode); they skip it here.
    pub inline_scanned: bool,
}

impl Exchange {
    /// The bytes this exchange holds while queued: what the byte budget
    /// charges.
    pub fn held_bytes(&self) -> usize {
        let prompt: usize = self.prompt.parts.iter().map(|p| p.len()).sum();
        let body: usize = self.body.iter().map(|b| b.len()).sum();
        prompt + body
    }
}

/// The handle the forwarding path holds.
#[derive(Clone)]
pub struct Observer {
    tx: mpsc::Sender<(Job, usize)>,
    /// Whether prompts are recorded at request time (cross-tenant detection on).
    record_prompts: bool,
    metrics: Metrics,
    budget: Arc<ByteBudget>,
}

/// Bytes held by queued exchanges, against a cap.
struct ByteBudget {
    held: AtomicUsize,
    max: usize,
}

impl ByteBudget {
    fn try_take(&self, n: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + n <= self.max).then_some(held + n)
            })
            .is_ok()
    }

    fn give_back(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Work for the scanner threads, in arrival order.
pub enum Job {
    /// A prompt to record as its tenant's content, sent when the request
    /// arrives: a leak into an answer that ends before this request's does
    /// is then still caught.
    Prompt { tenant: Tenant, prompt: Arc<Prompt> },
    /// A finished exchange to scan.
    Exchange(Box<Exchange>),
}

impl Observer {
    /// Queues a prompt for recording (when cross-tenant detection is on).
    /// Never waits.
    pub fn record_prompt(&self, tenant: &Tenant, prompt: &Arc<Prompt>) {
        if !self.record_prompts {
            return;
        }
        let bytes: usize = prompt.parts.iter().map(|p| p.len()).sum();
        self.send(
            Job::Prompt {
                tenant: tenant.clone(),
                prompt: prompt.clone(),
            },
            bytes,
        );
    }

    /// Queues an exchange for scanning. Never waits: a full queue, or one
    /// holding `observe.max-queue-bytes` already, drops it and counts it.
    pub fn submit(&self, exchange: Exchange) {
        let bytes = exchange.held_bytes();
        self.send(Job::Exchange(Box::new(exchange)), bytes);
    }

    fn send(&self, job: Job, bytes: usize) {
        if !self.budget.try_take(bytes) {
            self.metrics
                .scan_dropped
                .with_label_values(&["queue_bytes"])
                .inc();
            return;
        }
        // Counted before sending, so that a fast scanner's decrement can never
        // come first and take the gauge below zero.
        self.metrics.scan_queue_depth.inc();
        let reason = match self.tx.try_send((job, bytes)) {
            Ok(()) => return,
            Err(mpsc::error::TrySendError::Full(_)) => "queue_full",
            Err(mpsc::error::TrySendError::Closed(_)) => "closed",
        };
        self.metrics.scan_queue_depth.dec();
        self.budget.give_back(bytes);
        self.metrics.scan_dropped.with_label_values(&[reason]).inc();
    }
}

/// What the scanners need besides the exchange.
pub struct Scanners {
    pub detectors: Vec<Box<dyn Detector>>,
    pub incidents: IncidentSink,
    pub metrics: Metrics,
    pub max_response_bytes: usize,
    /// Records prompts (`Job::Prompt`); also among `detectors`.
    pub cross_tenant: Option<Arc<crate::detect::cross_tenant::CrossTenant>>,
    /// The semantic detectors: record prompts, and run after the others so
    /// that their findings are fused with the exact ones.
    pub semantic: Option<Arc<crate::detect::semantic::Semantic>>,
    /// Whether semantic findings may block or redact; if not, the enforcing
    /// path reports them as monitored.
    pub semantic_enforce: bool,
}

/// Starts `workers` scanner threads. They exit once every [`Observer`] clone
/// is dropped and the queue is drained. `max_bytes` caps what queued
/// exchanges may hold in all.
pub fn start(
    queue: usize,
    max_bytes: usize,
    workers: usize,
    scanners: Arc<Scanners>,
) -> (Observer, Vec<JoinHandle<()>>) {
    let (tx, rx) = mpsc::channel::<(Job, usize)>(queue);
    let record_prompts = scanners.cross_tenant.is_some() || scanners.semantic.is_some();
    let budget = Arc::new(ByteBudget {
        held: AtomicUsize::new(0),
        max: max_bytes,
    });
    // A std mutex around the receiver makes the channel multi-consumer: one
    // worker waits in `blocking_recv` while holding it, the others wait for the
    // lock; nothing async happens while it is held.
    let rx = Arc::new(Mutex::new(rx));
    let handles = (0..workers)
        .map(|i| {
            let rx = rx.clone();
            let scanners = scanners.clone();
            let budget = budget.clone();
            std::thread::Builder::new()
                .name(format!("residue-scan-{i}"))
                .spawn(move || loop {
                    let next = {
                        let mut rx = match rx.lock() {
                            Ok(rx) => rx,
                            Err(poisoned) => poisoned.into_inner(),
                        };
                        rx.blocking_recv()
                    };
                    let Some((job, bytes)) = next else { break };
                    scanners.metrics.scan_queue_depth.dec();
                    // A bug in one detector must not end scanning for good:
                    // count it and go on with the next exchange.
                    let scanned =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &job {
                            Job::Exchange(exchange) => scanners.scan(exchange),
                            Job::Prompt { tenant, prompt } => {
                                if let Some(cross) = &scanners.cross_tenant {
                                    cross.record_prompt(tenant, prompt);
                                }
                                if let Some(semantic) = &scanners.semantic {
                                    semantic.record_prompt(tenant, prompt);
                                }
                            }
                        }));
                    drop(job);
                    budget.give_back(bytes);
                    if scanned.is_err() {
                        scanners
                            .metrics
                            .scan_errors
                            .with_label_values(&["panic"])
                            .inc();
                        tracing::error!(
                            "A scanner panicked; the exchange was not scanned. This is a bug."
                        );
                    }
                })
                .expect("spawning a scanner thread. This is a bug.")
        })
        .collect();
    let metrics = scanners.metrics.clone();
    (
        Observer {
            tx,
            record_prompts,
            metrics,
            budget,
        },
        handles,
    )
}

/// Decodes a captured response body into its output text and usage.
/// Content-encoding problems are reported, and what was decoded is kept.
pub fn decode_output(exchange: &Exchange, max_bytes: usize) -> (Output, Option<&'static str>) {
    let mut output = Output::default();
    let format = BodyFormat::detect(
        exchange.content_type.as_deref(),
        exchange.endpoint,
        exchange.stream_requested,
    );
    let mut decoder = ResponseDecoder::new(exchange.endpoint, format, max_bytes);
    let mut problem = None;
    match ContentDecoder::new(exchange.content_encoding.as_deref(), max_bytes) {
        Ok(mut content) if !content.is_identity() => {
            let mut buf = Vec::new();
            for chunk in &exchange.body {
                buf.clear();
                if let Err(e) = content.push(chunk, &mut buf) {
                    decoder.push(&buf, &mut output);
                    problem = Some(encoding_problem(&e));
                    break;
                }
                decoder.push(&buf, &mut output);
            }
            if problem.is_none() {
                buf.clear();
                if let Err(e) = content.finish(&mut buf) {
                    problem = Some(encoding_problem(&e));
                }
                decoder.push(&buf, &mut output);
            }
        }
        Ok(_) => {
            for chunk in &exchange.body {
                decoder.push(chunk, &mut output);
            }
        }
        Err(e) => problem = Some(encoding_problem(&e)),
    }
    decoder.finish(&mut output);
    fill_missing(&mut output.usage, &exchange.header_usage);
    (output, problem)
}

fn fill_missing(usage: &mut Usage, from_headers: &Usage) {
    if usage.prompt_tokens.is_none() {
        usage.prompt_tokens = from_headers.prompt_tokens;
    }
    if usage.completion_tokens.is_none() {
        usage.completion_tokens = from_headers.completion_tokens;
    }
}

fn encoding_problem(e: &crate::encoding::EncodingError) -> &'static str {
    match e {
        crate::encoding::EncodingError::Unsupported(_) => "unsupported_encoding",
        crate::encoding::EncodingError::Corrupt { .. } => "corrupt_encoding",
        crate::encoding::EncodingError::TooLarge(_) => "too_large",
    }
}

impl Scanners {
    /// Scans one exchange: decode, count, run every detector, emit incidents.
    pub fn scan(&self, exchange: &Exchange) {
        self.run_detectors(exchange, true, |finding| {
            self.incidents.report(exchange, finding, "monitor");
        });
    }

    /// Decodes an exchange and runs every detector over it. Blocking and
    /// redacting call this on the request path (off the async workers) and
    /// decide before anything is sent; it returns the findings that decide,
    /// and reports the ones that may not (semantic findings unless
    /// `semantic.enforce`) as monitored.
    pub fn findings(&self, exchange: &Exchange) -> (Output, Vec<Finding>) {
        let mut findings = Vec::new();
        let output = self.run_detectors(exchange, self.semantic_enforce, |f| findings.push(f));
        // Semantic findings that may not decide are not waited for: they are
        // checked and reported off the path.
        if let (Some(semantic), false) = (&self.semantic, self.semantic_enforce) {
            if (200..300).contains(&exchange.status) {
                semantic.check_later(
                    self.incidents.clone(),
                    exchange.request_id.clone(),
                    exchange.tenant.clone(),
                    exchange.endpoint,
                    exchange.status,
                    exchange.prompt.clone(),
                    output.scan_text().into_owned(),
                );
            }
        }
        (output, findings)
    }

    /// Decodes, counts and runs every detector, handing each finding to
    /// `each`. Without semantic detectors a detector's findings go out as
    /// soon as it returns them; with them, every finding waits for the
    /// semantic ones, so that both can be fused.
    fn run_detectors(
        &self,
        exchange: &Exchange,
        with_semantic: bool,
        mut each: impl FnMut(Finding),
    ) -> Output {
        let family = exchange.endpoint.family().as_str();
        let (output, problem) = decode_output(exchange, self.max_response_bytes);
        if let Some(reason) = problem {
            self.metrics.scan_errors.with_label_values(&[reason]).inc();
        }
        if exchange.capture_truncated || output.truncated {
            self.metrics
                .scan_errors
                .with_label_values(&["truncated"])
                .inc();
        }
        if output.malformed > 0 {
            self.metrics
                .scan_errors
                .with_label_values(&["malformed"])
                .inc();
        }
        let prompt_tokens = exchange
            .prompt_tokens
            .unwrap_or_else(|| exchange.counter.count(&exchange.prompt));
        if let Some(reported) = output.usage.prompt_tokens {
            if prompt_tokens > 0 && (200..300).contains(&exchange.status) {
                self.metrics
                    .prompt_token_ratio
                    .observe(reported as f64 / prompt_tokens as f64);
            }
        }
        let input = ScanInput {
            exchange,
            output: &output,
            prompt_tokens,
            counter: exchange.counter.name(),
        };
        match self.semantic.as_ref().filter(|_| with_semantic) {
            None => {
                for detector in &self.detectors {
                    detector.inspect(&input).into_iter().for_each(&mut each);
                }
            }
            Some(semantic) => {
                let mut findings: Vec<Finding> = Vec::new();
                for detector in &self.detectors {
                    findings.extend(detector.inspect(&input));
                }
                findings.extend(semantic.inspect(&input));
                crate::detect::semantic::fuse(&mut findings);
                findings.into_iter().for_each(&mut each);
            }
        }
        self.metrics.scanned.with_label_values(&[family]).inc();
        output
    }
}
