//! The embedding service: one model thread fed by a bounded queue, in the
//! manner of text-embeddings-inference (TEI).
//!
//! - The model runs on one dedicated std thread (`residue-embed`): candle is
//!   synchronous, and the thread keeps the forward passes off tokio and off
//!   the scanner threads.
//! - Callers put requests on a bounded queue and never wait for room:
//!   [`EmbedService::try_submit`] sheds a request when the queue is full and
//!   counts it (`residue_embed_requests_total{outcome="shed"}`), like TEI's
//!   "overloaded". [`EmbedService::embed`] is the same for async callers.
//! - The thread takes the first request (blocking), then fills the batch
//!   with queued requests until it holds `max_batch_requests` requests, the
//!   next request would take the batch past `max_batch_tokens`, or
//!   `max_wait` has passed since the first request was queued. It then runs
//!   one `Embedder::embed` for the whole batch and answers each request on
//!   its own oneshot.
//! - A request is never split: its texts go into one batch together. A
//!   request that alone passes `max_batch_tokens` runs as a batch of its
//!   own. A request that would take a batch past the budget opens the next
//!   batch.
//! - Tokens are counted exactly, with the model's own tokenizer
//!   (`Embedder::count_tokens`), on the caller's thread before queueing. A
//!   batch costs what the model computes: the embedder pads every text to
//!   the longest, so the cost is `longest × texts` (TEI's cost for padded
//!   models), not the sum.
//! - `max_wait` is residue's addition (TEI batches whatever is queued). It
//!   runs from when the first request was queued, so a request that waited
//!   behind a full batch does not wait again; once it has passed, requests
//!   already queued still join the batch, but the thread waits for no more.
//! - A request whose caller has gone (the receiver was dropped) before its
//!   batch is formed is skipped and counted as `cancelled`.
//! - Dropping every handle stops the thread: it answers the requests
//!   already queued, the batch in hand included, then ends. Receivers that
//!   outlive the thread (a panic in the model) get `EmbedError::Stopped`.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::{EmbedError, Embedder};
use crate::metrics::Metrics;

/// What a request gets back: one vector per text, in order.
pub type Reply = Result<Vec<Vec<f32>>, EmbedError>;

/// How requests are queued and batched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchConfig {
    /// The most requests waiting for the model; more are shed. At least 1.
    pub queue: usize,
    /// The most tokens in one model call, counted as `longest × texts`
    /// (padding included). A single request over it runs alone.
    pub max_batch_tokens: usize,
    /// The most requests (not texts) in one model call. At least 1.
    pub max_batch_requests: usize,
    /// How long the first request of a batch may wait for others to join.
    pub max_wait: Duration,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            queue: 1024,
            max_batch_tokens: 8192,
            max_batch_requests: 32,
            max_wait: Duration::from_millis(5),
        }
    }
}

/// Why `try_submit` did not queue a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Shed {
    /// The queue holds `BatchConfig::queue` requests already.
    #[error("the embedding queue is full")]
    QueueFull,
    /// The model thread has ended.
    #[error("the embedding service has stopped")]
    Stopped,
}

impl From<Shed> for EmbedError {
    fn from(shed: Shed) -> Self {
        match shed {
            Shed::QueueFull => EmbedError::Overloaded,
            Shed::Stopped => EmbedError::Stopped,
        }
    }
}

/// A handle on the embedding service. Cheap to clone; the model thread
/// ends when the last handle is dropped.
#[derive(Clone)]
pub struct EmbedService {
    inner: Arc<Inner>,
}

struct Inner {
    tx: SyncSender<Job>,
    /// Shared with the model thread, for counting tokens before queueing.
    embedder: Arc<Embedder>,
    metrics: Metrics,
}

/// One queued request.
struct Job {
    texts: Vec<String>,
    /// Tokens of the request's longest text.
    longest: usize,
    queued: Instant,
    reply: oneshot::Sender<Reply>,
}

/// What a batch holds when it goes to the model (for tests' hooks).
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BatchInfo {
    requests: usize,
    texts: usize,
    /// `longest × texts`.
    tokens: usize,
}

/// Called on the model thread before each model call.
type Hook = Box<dyn FnMut(BatchInfo) + Send>;

impl EmbedService {
    /// Starts the model thread and returns a handle on it. Sets
    /// `residue_embed_device{device,kernel}` to 1.
    pub fn start(embedder: Embedder, config: BatchConfig, metrics: &Metrics) -> EmbedService {
        let (service, _thread) = Self::spawn(embedder, config, metrics, None);
        service
    }

    fn spawn(
        embedder: Embedder,
        config: BatchConfig,
        metrics: &Metrics,
        hook: Option<Hook>,
    ) -> (EmbedService, JoinHandle<()>) {
        let config = BatchConfig {
            queue: config.queue.max(1),
            max_batch_requests: config.max_batch_requests.max(1),
            ..config
        };
        metrics
            .embed_device
            .with_label_values(&[&embedder.device_name(), embedder.cpu_kernel()])
            .set(1);
        let embedder = Arc::new(embedder);
        let (tx, rx) = mpsc::sync_channel(config.queue);
        let worker = Worker {
            embedder: embedder.clone(),
            rx,
            config,
            metrics: metrics.clone(),
            hook,
        };
        let thread = std::thread::Builder::new()
            .name("residue-embed".into())
            .spawn(move || worker.run())
            .expect("spawn the embedding thread");
        let service = EmbedService {
            inner: Arc::new(Inner {
                tx,
                embedder,
                metrics: metrics.clone(),
            }),
        };
        (service, thread)
    }

    /// Queues `texts` as one request and returns where its answer will
    /// come. Never waits: when the queue is full the request is shed and
    /// counted. Tokenizes the texts on the calling thread to size batches.
    ///
    /// From a std thread, wait with `blocking_recv()` (with a deadline of
    /// your own if you need one); from async code, `.await` it. A receiver
    /// whose sender is gone means the service stopped.
    pub fn try_submit(&self, texts: Vec<String>) -> Result<oneshot::Receiver<Reply>, Shed> {
        let (reply, rx) = oneshot::channel();
        let count = |outcome: &str| {
            self.inner
                .metrics
                .embed_requests
                .with_label_values(&[outcome])
                .inc()
        };
        if texts.is_empty() {
            count("ok");
            let _ = reply.send(Ok(Vec::new()));
            return Ok(rx);
        }
        let longest = texts
            .iter()
            .map(|t| self.inner.embedder.count_tokens(t))
            .max()
            .unwrap_or(0);
        let job = Job {
            texts,
            longest,
            queued: Instant::now(),
            reply,
        };
        match self.inner.tx.try_send(job) {
            Ok(()) => Ok(rx),
            Err(TrySendError::Full(_)) => {
                count("shed");
                Err(Shed::QueueFull)
            }
            Err(TrySendError::Disconnected(_)) => {
                count("stopped");
                Err(Shed::Stopped)
            }
        }
    }

    /// Embeds `texts` through the queue: one unit-length vector per text,
    /// in order. Sheds like `try_submit` (`EmbedError::Overloaded`) rather
    /// than wait for room; waits only for the answer.
    pub async fn embed(&self, texts: Vec<String>) -> Reply {
        let rx = self.try_submit(texts)?;
        rx.await.unwrap_or(Err(EmbedError::Stopped))
    }

    /// The length of every vector.
    pub fn dimension(&self) -> usize {
        self.inner.embedder.dimension()
    }

    /// Where the model runs: `cpu` or `cuda:N`.
    pub fn device_name(&self) -> String {
        self.inner.embedder.device_name()
    }
}

impl std::fmt::Debug for EmbedService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbedService")
            .field("embedder", &self.inner.embedder)
            .finish_non_exhaustive()
    }
}

/// The model thread's state.
struct Worker {
    embedder: Arc<Embedder>,
    rx: Receiver<Job>,
    config: BatchConfig,
    metrics: Metrics,
    hook: Option<Hook>,
}

impl Worker {
    fn run(mut self) {
        // A request that did not fit the last batch opens the next one.
        let mut carried: Option<Job> = None;
        loop {
            let first = match carried.take() {
                Some(job) => job,
                None => match self.rx.recv() {
                    Ok(job) => job,
                    // Every handle is gone and the queue is drained.
                    Err(_) => break,
                },
            };
            if self.cancelled(&first) {
                continue;
            }
            let deadline = first.queued + self.config.max_wait;
            let mut batch = vec![first];
            while batch.len() < self.config.max_batch_requests {
                let job = match self.rx.try_recv() {
                    Ok(job) => job,
                    Err(TryRecvError::Disconnected) => break,
                    Err(TryRecvError::Empty) => {
                        let left = deadline.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            break;
                        }
                        match self.rx.recv_timeout(left) {
                            Ok(job) => job,
                            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                                break
                            }
                        }
                    }
                };
                if self.cancelled(&job) {
                    continue;
                }
                if cost(batch.iter().chain([&job])) > self.config.max_batch_tokens {
                    carried = Some(job);
                    break;
                }
                batch.push(job);
            }
            self.run_batch(batch);
        }
    }

    /// Whether the job's caller has gone; counts it if so.
    fn cancelled(&self, job: &Job) -> bool {
        let gone = job.reply.is_closed();
        if gone {
            self.count("cancelled");
        }
        gone
    }

    fn count(&self, outcome: &str) {
        self.metrics
            .embed_requests
            .with_label_values(&[outcome])
            .inc();
    }

    fn run_batch(&mut self, batch: Vec<Job>) {
        let texts: Vec<&str> = batch
            .iter()
            .flat_map(|job| job.texts.iter().map(String::as_str))
            .collect();
        if let Some(hook) = self.hook.as_mut() {
            hook(BatchInfo {
                requests: batch.len(),
                texts: texts.len(),
                tokens: cost(batch.iter()),
            });
        }
        self.metrics.embed_batch_size.observe(texts.len() as f64);
        let result = self.embedder.embed(&texts);
        drop(texts);
        match result {
            Ok(vectors) => {
                let mut vectors = vectors.into_iter();
                for job in batch {
                    let mine: Vec<Vec<f32>> = vectors.by_ref().take(job.texts.len()).collect();
                    self.answer(job, Ok(mine));
                }
            }
            Err(e) if batch.len() == 1 => {
                let job = batch.into_iter().next().expect("one job");
                self.answer(job, Err(e));
            }
            Err(e) => {
                let e = Arc::new(e);
                for job in batch {
                    self.answer(job, Err(EmbedError::Batch(e.clone())));
                }
            }
        }
    }

    fn answer(&self, job: Job, reply: Reply) {
        // Counted before sending, so that a caller who has its answer also
        // sees it counted; a caller gone by now is counted as cancelled.
        if job.reply.is_closed() {
            self.count("cancelled");
            return;
        }
        self.count(if reply.is_ok() { "ok" } else { "error" });
        let _ = job.reply.send(reply);
    }
}

/// What the model computes for these jobs together: every text padded to
/// the longest.
fn cost<'a>(jobs: impl Iterator<Item = &'a Job>) -> usize {
    let (longest, texts) = jobs.fold((0, 0), |(longest, texts), job| {
        (longest.max(job.longest), texts + job.texts.len())
    });
    longest * texts
}

#[cfg(test)]
mod tests;
