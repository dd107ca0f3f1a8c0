//! `residue load`: multi-tenant traffic for the incident replay.
//!
//! Every tenant `tenant-NN` has its own API key, sends [`TENANT_HEADER`] and
//! a unique [`REQUEST_ID_HEADER`] (`load-<seed>-<n>`), and asks about its
//! own text with its own PII in it (see [`corpus`]). Requests go to the
//! OpenAI chat and completions endpoints and SGLang's `/generate`, streamed
//! or not, some of them over the engine's prefill capacity; every response
//! body is read to the end. Open loop (`rate`: a start every 1/rate s) or
//! closed loop (`concurrency` workers, each starting the next request when
//! its last one ends).
//!
//! [`TENANT_HEADER`]: crate::scenario::TENANT_HEADER
//! [`REQUEST_ID_HEADER`]: crate::scenario::REQUEST_ID_HEADER

pub mod corpus;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::json;

use crate::scenario::{REQUEST_ID_HEADER, TENANT_HEADER};
pub use corpus::{Corpus, Prompts, SYSTEM_PROMPT};

/// The endpoints the generator speaks, as [`crate::scenario::Truth`] names
/// them.
pub const ENDPOINTS: [&str; 3] = ["chat", "completions", "generate"];

#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Base URL, e.g. `http://127.0.0.1:8080`.
    pub target: String,
    pub tenants: usize,
    pub seed: u64,
    /// Stop after this many requests (and/or after `duration`; at least one
    /// of the two must be set).
    pub requests: Option<usize>,
    pub duration: Option<Duration>,
    /// Open loop: start this many requests per second, never more than
    /// `concurrency` in flight (a start that would exceed it waits and is
    /// counted in [`LoadReport::delayed`]). `None`: closed loop.
    pub rate: Option<f64>,
    /// Closed loop: this many requests in flight at all times.
    pub concurrency: usize,
    /// Share of requests that ask for a streamed answer.
    pub stream_fraction: f64,
    /// Share of prompts made longer than `capacity_tokens`.
    pub over_capacity_fraction: f64,
    /// The engine's prefill capacity; an over-capacity prompt has more
    /// words than this (so more tokens whatever the tokenizer).
    pub capacity_tokens: u64,
    pub corpus: Corpus,
    /// Any of [`ENDPOINTS`]; each request picks one at random.
    pub endpoints: Vec<String>,
    /// The `model` field of OpenAI requests.
    pub model: String,
    /// `max_tokens` / `max_new_tokens`.
    pub max_tokens: u32,
    /// One request's limit, head to last byte.
    pub timeout: Duration,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            target: "http://127.0.0.1:8080".into(),
            tenants: 8,
            seed: 1,
            requests: Some(100),
            duration: None,
            rate: None,
            concurrency: 8,
            stream_fraction: 0.5,
            over_capacity_fraction: 0.05,
            capacity_tokens: 4096,
            corpus: Corpus::Builtin,
            endpoints: ENDPOINTS.iter().map(|e| e.to_string()).collect(),
            model: "sim".into(),
            max_tokens: 128,
            timeout: Duration::from_secs(60),
        }
    }
}

/// Where a run stands; handed to the progress callback after every
/// response (and error).
#[derive(Clone, Debug, Serialize)]
pub struct LoadProgress {
    pub sent: u64,
    pub done: u64,
    pub ok: u64,
    pub errors: u64,
    pub in_flight: u64,
    /// The request limit, when there is one.
    pub total: Option<u64>,
    pub elapsed: Duration,
}

/// What a run did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LoadReport {
    pub sent: u64,
    /// Responses with a 2xx status whose body was read to the end.
    pub ok: u64,
    /// Responses by status code.
    pub status: BTreeMap<u16, u64>,
    /// Requests that got no complete response (connect error, reset,
    /// timeout).
    pub errors: u64,
    /// Requests sent, by endpoint.
    pub endpoints: BTreeMap<String, u64>,
    pub streamed: u64,
    pub over_capacity: u64,
    pub tenants: usize,
    /// Response body bytes read.
    pub bytes: u64,
    /// Open loop: starts that waited for a free slot.
    pub delayed: u64,
    /// Every completed response's latency (request start to last body
    /// byte), in milliseconds, sorted.
    pub latencies_ms: Vec<f64>,
    pub elapsed: Duration,
}

impl LoadReport {
    /// The `q` quantile (0..=1) of the latencies, nearest rank.
    pub fn latency_quantile(&self, q: f64) -> Option<f64> {
        quantile(&self.latencies_ms, q)
    }
}

/// Nearest-rank quantile of sorted values.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.saturating_sub(1).min(sorted.len() - 1)])
}

/// One tenant as the generator plays it.
#[derive(Clone, Debug)]
pub struct LoadTenant {
    /// `tenant-NN`.
    pub id: String,
    /// `sk-sim-…`, sent as `Authorization: Bearer`.
    pub api_key: String,
}

/// The tenants a config plays: ids zero-padded to the width of the count,
/// keys random but fixed by the seed.
pub fn tenants(tenants: usize, seed: u64) -> Vec<LoadTenant> {
    let width = tenants.saturating_sub(1).to_string().len().max(2);
    (0..tenants)
        .map(|t| {
            let mut rng = StdRng::seed_from_u64(corpus::mix(seed, t as u64, 0x004B_4559));
            let key: String = (0..32)
                .map(|_| {
                    let c = rng.gen_range(0..62u8);
                    (match c {
                        0..=9 => b'0' + c,
                        10..=35 => b'a' + c - 10,
                        _ => b'A' + c - 36,
                    }) as char
                })
                .collect();
            LoadTenant {
                id: format!("tenant-{t:0width$}"),
                api_key: format!("sk-sim-{key}"),
            }
        })
        .collect()
}

/// One planned request: everything about it follows from the seed and `n`.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    pub n: u64,
    pub request_id: String,
    pub tenant: usize,
    pub endpoint: String,
    pub stream: bool,
    pub over_capacity: bool,
    pub path: &'static str,
    pub body: serde_json::Value,
}

/// The generator's plan: tenants, prompts and per-request choices.
pub struct Plan {
    config: LoadConfig,
    tenants: Vec<LoadTenant>,
    prompts: Prompts,
}

impl Plan {
    pub fn new(config: LoadConfig) -> anyhow::Result<Plan> {
        anyhow::ensure!(config.tenants >= 1, "--tenants must be at least 1");
        anyhow::ensure!(
            config.requests.is_some() || config.duration.is_some(),
            "give a request count or a duration"
        );
        anyhow::ensure!(!config.endpoints.is_empty(), "no endpoints");
        for e in &config.endpoints {
            anyhow::ensure!(
                ENDPOINTS.contains(&e.as_str()),
                "unknown endpoint {e:?} (one of {})",
                ENDPOINTS.join(", ")
            );
        }
        anyhow::ensure!(
            (0.0..=1.0).contains(&config.stream_fraction)
                && (0.0..=1.0).contains(&config.over_capacity_fraction),
            "fractions are between 0 and 1"
        );
        if let Some(rate) = config.rate {
            anyhow::ensure!(rate > 0.0 && rate.is_finite(), "--rate must be positive");
        }
        let prompts = Prompts::new(&config.corpus, config.tenants, config.seed)?;
        Ok(Plan {
            tenants: tenants(config.tenants, config.seed),
            prompts,
            config,
        })
    }

    pub fn tenants(&self) -> &[LoadTenant] {
        &self.tenants
    }

    pub fn prompts(&self) -> &Prompts {
        &self.prompts
    }

    /// Request `n`.
    pub fn request(&self, n: u64) -> Planned {
        let c = &self.config;
        let mut rng = StdRng::seed_from_u64(corpus::mix(c.seed, n, 0x0052_4551));
        let tenant = rng.gen_range(0..c.tenants);
        let endpoint = c.endpoints[rng.gen_range(0..c.endpoints.len())].clone();
        let stream = rng.gen_bool(c.stream_fraction);
        let over_capacity = rng.gen_bool(c.over_capacity_fraction);
        let min_words = if over_capacity {
            // Words, not tokens: every word is at least one token.
            c.capacity_tokens as usize + 16
        } else {
            0
        };
        let prompt = self.prompts.prompt(tenant, n, min_words);
        let (path, mut body) = match endpoint.as_str() {
            "chat" => (
                "/v1/chat/completions",
                json!({
                    "model": c.model,
                    "messages": [
                        {"role": "system", "content": SYSTEM_PROMPT},
                        {"role": "user", "content": prompt},
                    ],
                    "max_tokens": c.max_tokens,
                    "stream": stream,
                }),
            ),
            "completions" => (
                "/v1/completions",
                json!({
                    "model": c.model,
                    "prompt": prompt,
                    "max_tokens": c.max_tokens,
                    "stream": stream,
                }),
            ),
            _ => (
                "/generate",
                json!({
                    "text": prompt,
                    "sampling_params": {"max_new_tokens": c.max_tokens},
                    "stream": stream,
                }),
            ),
        };
        if stream && path.starts_with("/v1/") {
            body["stream_options"] = json!({"include_usage": true});
        }
        Planned {
            n,
            request_id: format!("load-{}-{n}", c.seed),
            tenant,
            endpoint,
            stream,
            over_capacity,
            path,
            body,
        }
    }
}

struct Shared {
    plan: Plan,
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    started: Instant,
    deadline: Option<Instant>,
    limit: Option<u64>,
    next: AtomicU64,
    sent: AtomicU64,
    done: AtomicU64,
    ok: AtomicU64,
    errors: AtomicU64,
    report: Mutex<LoadReport>,
    progress: Box<dyn Fn(&LoadProgress) + Send + Sync>,
}

impl Shared {
    /// The next request number, or None when the run is over.
    fn take(&self) -> Option<u64> {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        match self.limit {
            Some(limit) if n >= limit => None,
            _ => Some(n),
        }
    }

    async fn one(&self, n: u64) {
        let p = self.plan.request(n);
        let tenant = &self.plan.tenants[p.tenant];
        {
            let mut r = self.report.lock().unwrap();
            r.sent += 1;
            *r.endpoints.entry(p.endpoint.clone()).or_default() += 1;
            r.streamed += u64::from(p.stream);
            r.over_capacity += u64::from(p.over_capacity);
        }
        self.sent.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let result = tokio::time::timeout(self.plan.config.timeout, self.send(&p, tenant)).await;
        let latency = start.elapsed().as_secs_f64() * 1000.0;
        {
            let mut r = self.report.lock().unwrap();
            match result {
                Ok(Ok((status, bytes))) => {
                    *r.status.entry(status).or_default() += 1;
                    r.bytes += bytes;
                    r.latencies_ms.push(latency);
                    if (200..300).contains(&status) {
                        self.ok.fetch_add(1, Ordering::Relaxed);
                        r.ok += 1;
                    }
                }
                Ok(Err(e)) => {
                    tracing::debug!(request_id = %p.request_id, error = %format!("{e:#}"), "Request failed.");
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    r.errors += 1;
                }
                Err(_) => {
                    tracing::debug!(request_id = %p.request_id, "Request timed out.");
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    r.errors += 1;
                }
            }
        }
        self.done.fetch_add(1, Ordering::Relaxed);
        (self.progress)(&self.snapshot());
    }

    async fn send(&self, p: &Planned, tenant: &LoadTenant) -> anyhow::Result<(u16, u64)> {
        let uri: Uri = format!("{}{}", self.base, p.path)
            .parse()
            .context("building the request URI")?;
        let body = serde_json::to_vec(&p.body)?;
        let req = Request::post(uri)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", tenant.api_key),
            )
            .header(TENANT_HEADER, &tenant.id)
            .header(REQUEST_ID_HEADER, &p.request_id)
            .body(Full::new(Bytes::from(body)))?;
        let resp = self.client.request(req).await.context("sending")?;
        let status = resp.status().as_u16();
        // Read every byte, streamed or not: a leak detector sees whole
        // answers only when clients take them.
        let mut body = resp.into_body();
        let mut bytes = 0u64;
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.context("reading the body")?.into_data() {
                bytes += data.len() as u64;
            }
        }
        Ok((status, bytes))
    }

    fn snapshot(&self) -> LoadProgress {
        let sent = self.sent.load(Ordering::Relaxed);
        let done = self.done.load(Ordering::Relaxed);
        LoadProgress {
            sent,
            done,
            ok: self.ok.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            in_flight: sent.saturating_sub(done),
            total: self.limit,
            elapsed: self.started.elapsed(),
        }
    }
}

/// Runs the load described by `config`, calling `progress` after every
/// finished request, and reports what happened. Errors only on a bad config
/// or corpus; failed requests are counted, not raised.
pub async fn run(
    config: LoadConfig,
    progress: impl Fn(&LoadProgress) + Send + Sync + 'static,
) -> anyhow::Result<LoadReport> {
    let base = config.target.trim_end_matches('/').to_string();
    let _: Uri = base
        .parse()
        .with_context(|| format!("--target {base:?} is not a URL"))?;
    anyhow::ensure!(
        base.starts_with("http://"),
        "--target must be an http:// URL (the generator speaks plain HTTP)"
    );
    let concurrency = config.concurrency.max(1);
    let rate = config.rate;
    let started = Instant::now();
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(concurrency)
        .build(http);
    let shared = Arc::new(Shared {
        limit: config.requests.map(|r| r as u64),
        deadline: config.duration.map(|d| started + d),
        plan: Plan::new(config)?,
        client,
        base,
        started,
        next: AtomicU64::new(0),
        sent: AtomicU64::new(0),
        done: AtomicU64::new(0),
        ok: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        report: Mutex::new(LoadReport::default()),
        progress: Box::new(progress),
    });
    let mut delayed = 0;
    match rate {
        None => {
            let workers: Vec<_> = (0..concurrency)
                .map(|_| {
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        while let Some(n) = shared.take() {
                            shared.one(n).await;
                        }
                    })
                })
                .collect();
            for w in workers {
                w.await.context("a load worker panicked")?;
            }
        }
        Some(rate) => {
            let slots = Arc::new(tokio::sync::Semaphore::new(concurrency));
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut tasks = tokio::task::JoinSet::new();
            loop {
                tick.tick().await;
                let Some(n) = shared.take() else { break };
                let permit = match slots.clone().try_acquire_owned() {
                    Ok(p) => p,
                    Err(_) => {
                        delayed += 1;
                        slots.clone().acquire_owned().await?
                    }
                };
                let shared = shared.clone();
                tasks.spawn(async move {
                    shared.one(n).await;
                    drop(permit);
                });
                while tasks.try_join_next().is_some() {}
            }
            while tasks.join_next().await.is_some() {}
        }
    }
    let mut report = std::mem::take(&mut *shared.report.lock().unwrap());
    report
        .latencies_ms
        .sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    report.delayed = delayed;
    report.tenants = shared.plan.tenants.len();
    report.elapsed = started.elapsed();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(f: impl FnOnce(&mut LoadConfig)) -> Plan {
        let mut c = LoadConfig::default();
        f(&mut c);
        Plan::new(c).unwrap()
    }

    #[test]
    fn tenants_have_distinct_keys_and_padded_ids() {
        let t = tenants(12, 5);
        assert_eq!(t[3].id, "tenant-03");
        assert_eq!(tenants(12, 5)[7].api_key, t[7].api_key);
        let keys: std::collections::HashSet<_> = t.iter().map(|t| &t.api_key).collect();
        assert_eq!(keys.len(), 12);
        assert!(t[0].api_key.starts_with("sk-sim-"));
        assert_eq!(tenants(150, 5)[7].id, "tenant-007");
    }

    #[test]
    fn plan_is_deterministic_and_mixes() {
        let a = plan(|c| c.over_capacity_fraction = 0.2);
        let b = plan(|c| c.over_capacity_fraction = 0.2);
        let mut endpoints = std::collections::BTreeMap::new();
        let (mut streams, mut over) = (0, 0);
        for n in 0..300 {
            let (x, y) = (a.request(n), b.request(n));
            assert_eq!(x, y);
            assert_eq!(x.request_id, format!("load-1-{n}"));
            *endpoints.entry(x.endpoint.clone()).or_insert(0) += 1;
            streams += usize::from(x.stream);
            if x.over_capacity {
                over += 1;
                let text = x.body.to_string();
                assert!(text.split_whitespace().count() > 4096);
            }
            if x.stream && x.endpoint != "generate" {
                assert_eq!(x.body["stream_options"]["include_usage"], true);
            }
        }
        assert_eq!(endpoints.len(), 3, "{endpoints:?}");
        assert!((100..200).contains(&streams), "{streams}");
        assert!((30..100).contains(&over), "{over}");
    }

    #[test]
    fn quantiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), Some(50.0));
        assert_eq!(quantile(&v, 0.99), Some(99.0));
        assert_eq!(quantile(&v, 1.0), Some(100.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn bad_configs_are_refused() {
        let mut c = LoadConfig {
            requests: None,
            ..LoadConfig::default()
        };
        assert!(Plan::new(c.clone()).is_err());
        c.requests = Some(1);
        c.endpoints = vec!["embeddings".into()];
        assert!(Plan::new(c).is_err());
    }
}
