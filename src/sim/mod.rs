//! `residue sim`: a fake LLM server whose engine has switchable faults, for
//! replaying the incident (an engine answering tenant B from KV pages still
//! holding tenant A's prompt, every response a 200 OK) and scoring residue
//! against ground truth.
//!
//! It speaks OpenAI chat and completions and SGLang's native `/generate`,
//! streamed and not. Answers come from [`engine::Engine`]; for every
//! response one [`Truth`] record says what fault, if any, was injected and
//! where the foreign content sits in the answer. The records are kept in
//! memory ([`TruthLog`]) and, when configured, appended as JSON lines to a
//! file. They never hold prompt or answer text.

pub mod engine;
pub mod text;

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use crate::protocol::{self, Route};
use crate::rules::RuleSet;
use crate::scenario::{Fault, Truth, REQUEST_ID_HEADER, TENANT_HEADER};
use engine::{Engine, EngineConfig, EngineRequest, Generation};

/// Request bodies above this are refused (a 681,000-token prompt is a few
/// MiB).
const MAX_BODY: usize = 64 << 20;
/// How long in-flight responses may take to finish once shutdown begins.
const DRAIN: Duration = Duration::from_secs(5);

/// How to run the simulator.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub listen: SocketAddr,
    /// Seeds every choice the engine makes: same seed, same request order,
    /// same answers.
    pub seed: u64,
    /// Prompts longer than this (in words, CJK characters one each) are
    /// where the `placeholder` fault strikes. The real engine's was about
    /// 681,000 tokens; a small default keeps the demo fast.
    pub prefill_capacity_tokens: u64,
    /// Pages in the shared KV pool, and tokens per page.
    pub kv_pages: usize,
    pub page_tokens: usize,
    /// Faults and their rates in `0..=1`. `placeholder`'s rate is the chance
    /// per over-capacity prompt; the others share one draw per request, so
    /// their rates must sum to at most 1.
    pub faults: Vec<(Fault, f64)>,
    /// Ground truth, written as JSON lines (the file is started afresh).
    pub truth_path: Option<PathBuf>,
    /// Also keep every record in memory ([`TruthLog::records`]), for an
    /// in-process caller (the demo, tests). Off, memory stays flat however
    /// long the simulator runs.
    pub keep_truth: bool,
    /// Pause before each streamed chunk.
    pub token_delay: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            seed: 0,
            prefill_capacity_tokens: 2048,
            kv_pages: 4096,
            page_tokens: 16,
            faults: Vec::new(),
            truth_path: None,
            keep_truth: true,
            token_delay: Duration::from_millis(2),
        }
    }
}

impl SimConfig {
    /// Every problem with the config, one line each.
    pub fn validate(&self) -> Vec<String> {
        let mut errors = Vec::new();
        if self.kv_pages == 0 {
            errors.push("kv-pages must be at least 1".to_string());
        }
        if self.page_tokens == 0 {
            errors.push("page-tokens must be at least 1".to_string());
        }
        let mut seen = Vec::new();
        let mut shared = 0.0;
        for (fault, rate) in &self.faults {
            if !(0.0..=1.0).contains(rate) {
                errors.push(format!(
                    "fault {}: rate {rate} is not in 0..=1",
                    fault.as_str()
                ));
            }
            if seen.contains(fault) {
                errors.push(format!("fault {}: given more than once", fault.as_str()));
            }
            seen.push(*fault);
            if *fault != Fault::Placeholder {
                shared += rate;
            }
        }
        if shared > 1.0 + 1e-9 {
            errors.push(format!(
                "the rates of stale_block, splice and garbage sum to {shared}, more than 1"
            ));
        }
        errors
    }
}

/// Parses a `--fault` value: `name=rate`, e.g. `placeholder=0.05` or
/// `stale-block=0.1` (`_` and `-` both accepted), rate in `0..=1`.
pub fn parse_fault(spec: &str) -> Result<(Fault, f64), String> {
    let (name, rate) = spec
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=RATE, got {spec:?}"))?;
    let fault = Fault::ALL
        .into_iter()
        .find(|f| f.as_str() == name.trim().replace('-', "_"))
        .ok_or_else(|| {
            let names: Vec<&str> = Fault::ALL.iter().map(Fault::as_str).collect();
            format!("unknown fault {name:?}; one of {}", names.join(", "))
        })?;
    let rate: f64 = rate
        .trim()
        .parse()
        .map_err(|_| format!("rate {rate:?} is not a number"))?;
    if !(0.0..=1.0).contains(&rate) {
        return Err(format!("rate {rate} is not in 0..=1"));
    }
    Ok((fault, rate))
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("invalid simulator config:\n  {}", .0.join("\n  "))]
    Config(Vec<String>),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot open the ground-truth file {path}: {source}")]
    Truth {
        path: PathBuf,
        source: std::io::Error,
    },
}

// === impl TruthLog ===

/// Every ground-truth record so far; cheap to clone.
///
/// A `std::sync::Mutex`, not Tokio's: nothing awaits while it is held. The
/// file write under it is one small line per response.
#[derive(Clone, Debug, Default)]
pub struct TruthLog(Arc<Mutex<TruthState>>);

#[derive(Debug, Default)]
struct TruthState {
    records: Vec<Truth>,
    keep: bool,
    /// Responses with an injected fault, and with a leak.
    faults: u64,
    leaks: u64,
    file: Option<std::fs::File>,
}

impl TruthLog {
    fn open(path: Option<&std::path::Path>, keep: bool) -> Result<TruthLog, SimError> {
        // One run per file: request ids repeat across runs with one seed, so
        // appending would make a replay join two runs.
        let file = match path {
            Some(p) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .write(true)
                    .truncate(true)
                    .open(p)
                    .map_err(|source| SimError::Truth {
                        path: p.to_owned(),
                        source,
                    })?,
            ),
            None => None,
        };
        Ok(TruthLog(Arc::new(Mutex::new(TruthState {
            records: Vec::new(),
            keep,
            faults: 0,
            leaks: 0,
            file,
        }))))
    }

    fn push(&self, truth: Truth) {
        let mut st = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = &mut st.file {
            let mut line = serde_json::to_vec(&truth).expect("a Truth serialises. This is a bug.");
            line.push(b'\n');
            if let Err(e) = f.write_all(&line) {
                tracing::warn!(error = %e, "Cannot write ground truth.");
            }
        }
        st.faults += u64::from(truth.fault.is_some());
        st.leaks += u64::from(truth.leaked);
        if st.keep {
            st.records.push(truth);
        }
    }

    /// Responses so far with an injected fault, and with a leak: cheap, for
    /// progress lines.
    pub fn counts(&self) -> (u64, u64) {
        let st = self.0.lock().unwrap_or_else(|e| e.into_inner());
        (st.faults, st.leaks)
    }

    /// A copy of every record so far, in the order responses were sent
    /// (none unless `keep_truth`).
    pub fn records(&self) -> Vec<Truth> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .records
            .clone()
    }

    pub fn len(&self) -> usize {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .records
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// === impl RunningSim ===

/// A simulator serving in the background. Dropping it stops it (in-flight
/// responses get a few seconds); [`RunningSim::shutdown`] also waits.
#[derive(Debug)]
pub struct RunningSim {
    pub addr: SocketAddr,
    pub truth: TruthLog,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningSim {
    /// Stops accepting, lets in-flight responses finish (up to 5 s), and
    /// waits for that.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

/// Binds `config.listen` and serves in the background.
pub async fn start(config: SimConfig) -> Result<RunningSim, SimError> {
    let errors = config.validate();
    if !errors.is_empty() {
        return Err(SimError::Config(errors));
    }
    let truth = TruthLog::open(config.truth_path.as_deref(), config.keep_truth)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| SimError::Bind {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| SimError::Bind {
        addr: config.listen,
        source,
    })?;
    let engine = Engine::new(
        EngineConfig {
            seed: config.seed,
            prefill_capacity_tokens: config.prefill_capacity_tokens,
            kv_pages: config.kv_pages,
            page_tokens: config.page_tokens,
            faults: config.faults.clone(),
        },
        Arc::new(RuleSet::builtin()),
    );
    let sim = Arc::new(Sim {
        engine: Mutex::new(engine),
        truth: truth.clone(),
        token_delay: config.token_delay,
        next_id: AtomicU64::new(0),
    });
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(serve(listener, sim, stopped));
    tracing::info!(%addr, "Simulator listening.");
    Ok(RunningSim {
        addr,
        truth,
        stop: Some(stop),
        task,
    })
}

async fn serve(listener: TcpListener, sim: Arc<Sim>, stopped: oneshot::Receiver<()>) {
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let sim = sim.clone();
                let service = service_fn(move |req| handle(sim.clone(), req));
                let conn = builder.serve_connection(TokioIo::new(stream), service).into_owned();
                let conn = graceful.watch(conn);
                connections.spawn(async move {
                    let _ = conn.await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            // A stop message or a dropped handle.
            _ = &mut stopped => break,
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(DRAIN, graceful.shutdown()).await;
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

// === request handling ===

/// How long after delivering an answer its pages become stale. Long enough
/// that the proxy in front has recorded the answer when a later request is
/// answered from its pages: at 25 ms, a loaded two-core CI machine
/// occasionally scanned the leaking answer on one scanner thread before
/// another had recorded its source, and a must-catch splice went unseen.
/// (That race is residue's, on real engines too: a leak whose source is
/// still being scanned is missed. It is listed in the README.)
const DELIVERED_GRACE: Duration = Duration::from_millis(250);

struct Sim {
    engine: Mutex<Engine>,
    truth: TruthLog,
    token_delay: Duration,
    next_id: AtomicU64,
}

type Body = BoxBody<Bytes, Infallible>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completions,
    Generate,
}

impl Endpoint {
    fn from_path(path: &str) -> Option<Endpoint> {
        match path.strip_suffix('/').unwrap_or(path) {
            "/v1/chat/completions" => Some(Endpoint::Chat),
            "/v1/completions" => Some(Endpoint::Completions),
            "/generate" => Some(Endpoint::Generate),
            _ => None,
        }
    }

    fn as_str(&self) -> &'static str {
        match self {
            Endpoint::Chat => "chat",
            Endpoint::Completions => "completions",
            Endpoint::Generate => "generate",
        }
    }

    fn protocol(&self) -> protocol::Endpoint {
        match self {
            Endpoint::Chat => protocol::Endpoint::OpenAiChat,
            Endpoint::Completions => protocol::Endpoint::OpenAiCompletions,
            Endpoint::Generate => protocol::Endpoint::SglangGenerate,
        }
    }
}

/// A request the simulator will answer.
#[derive(Debug)]
struct SimRequest {
    endpoint: Endpoint,
    parts: Vec<String>,
    stream: bool,
    include_usage: bool,
    model: String,
}

/// A client error: status and message.
#[derive(Debug)]
struct BadRequest(StatusCode, String);

fn bad(message: impl Into<String>) -> BadRequest {
    BadRequest(StatusCode::BAD_REQUEST, message.into())
}

async fn handle(sim: Arc<Sim>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let endpoint = Endpoint::from_path(req.uri().path());
    let (parts, body) = req.into_parts();
    let parsed = match endpoint {
        None => Err(BadRequest(
            StatusCode::NOT_FOUND,
            format!("no route for {}", parts.uri.path()),
        )),
        Some(_) if parts.method != Method::POST => Err(BadRequest(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} needs POST", parts.uri.path()),
        )),
        Some(endpoint) => match Limited::new(body, MAX_BODY).collect().await {
            Ok(body) => parse(endpoint, &body.to_bytes()),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(BadRequest(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body over {MAX_BODY} bytes"),
            )),
            Err(e) => Err(bad(format!("cannot read the request body: {e}"))),
        },
    };
    let request = match parsed {
        Ok(r) => r,
        Err(BadRequest(status, message)) => {
            return Ok(error(endpoint.unwrap_or(Endpoint::Chat), status, &message))
        }
    };
    let request_id = header_str(&parts.headers, REQUEST_ID_HEADER).map_or_else(
        || format!("sim-{}", sim.next_id.fetch_add(1, Ordering::Relaxed)),
        str::to_owned,
    );
    let tenant = header_str(&parts.headers, TENANT_HEADER).unwrap_or("unknown");
    // The engine is synchronous and takes a lock; a huge prompt must not
    // hold an async worker (or, in the demo, residue's own runtime) while it
    // is tokenised.
    let (generation, request) = {
        let (sim, request_id, tenant) = (sim.clone(), request_id.clone(), tenant.to_owned());
        match tokio::task::spawn_blocking(move || {
            let g = sim
                .engine
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .generate(EngineRequest {
                    request_id: &request_id,
                    tenant: &tenant,
                    parts: &request.parts,
                });
            (g, request)
        })
        .await
        {
            Ok(done) => done,
            Err(_) => {
                return Ok(error(
                    endpoint.unwrap_or(Endpoint::Chat),
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the simulated engine failed",
                ))
            }
        }
    };
    sim.truth
        .push(truth(&request, &request_id, tenant, &generation));
    // Once the answer was delivered (and a proxy in front had a moment to
    // read it), its pages are stale: a later fault may leak from them.
    let finish = {
        let (sim, id) = (sim.clone(), request_id.clone());
        move || {
            tokio::spawn(async move {
                tokio::time::sleep(DELIVERED_GRACE).await;
                sim.engine
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .finish(&id);
            });
        }
    };
    let mut resp = if request.stream {
        streamed(&request, &request_id, &generation, sim.token_delay, finish)
    } else {
        let body = whole(&request, &request_id, &generation);
        finish();
        json_response(StatusCode::OK, body)
    };
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        resp.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    Ok(resp)
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// Validates a body strictly (unlike residue, which reads what it can): a
/// malformed request gets a 400 that says what is wrong.
fn parse(endpoint: Endpoint, body: &[u8]) -> Result<SimRequest, BadRequest> {
    let text = std::str::from_utf8(body)
        .map_err(|e| bad(format!("request body is not valid UTF-8: {e}")))?;
    let value: Value = serde_json::from_str(text)
        .map_err(|e| bad(format!("request body is not valid JSON: {e}")))?;
    let Value::Object(obj) = &value else {
        return Err(bad("request body must be a JSON object"));
    };
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("`stream` must be a boolean")),
    };
    match endpoint {
        Endpoint::Chat => match obj.get("messages") {
            Some(Value::Array(m)) if !m.is_empty() => {}
            _ => return Err(bad("`messages` must be a non-empty array")),
        },
        Endpoint::Completions => {
            if !obj.get("prompt").is_some_and(Value::is_string) {
                return Err(bad("`prompt` must be a string"));
            }
        }
        Endpoint::Generate => {
            if !obj.get("text").is_some_and(Value::is_string) {
                return Err(bad(
                    "`text` must be a string (batches and `input_ids` are not simulated)",
                ));
            }
        }
    }
    let prompt = protocol::parse_request(Route::Known(endpoint.protocol()), body)
        .map_err(|e| bad(e.to_string()))?
        .prompt;
    let include_usage = obj
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let model = obj
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("residue-sim")
        .to_owned();
    Ok(SimRequest {
        endpoint,
        parts: prompt.parts,
        stream,
        include_usage,
        model,
    })
}

fn truth(req: &SimRequest, request_id: &str, tenant: &str, g: &Generation) -> Truth {
    Truth {
        time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        request_id: request_id.to_owned(),
        tenant: tenant.to_owned(),
        endpoint: req.endpoint.as_str().to_owned(),
        stream: req.stream,
        fault: g.fault,
        leaked: g.leak.is_some(),
        source_request_id: g.leak.as_ref().map(|l| l.source_request_id.to_string()),
        source_tenant: g.leak.as_ref().map(|l| l.source_tenant.to_string()),
        span: g.leak.as_ref().map(|l| l.span),
        leaked_words: g.leak.as_ref().map_or(0, |l| l.words),
        leaked_pii: g.leak.as_ref().map_or(0, |l| l.pii),
        prompt_tokens_reported: g.prompt_tokens_reported,
        prompt_tokens_real: g.prompt_tokens_real,
    }
}

// === response bodies ===

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn usage(g: &Generation) -> Value {
    json!({
        "prompt_tokens": g.prompt_tokens_reported,
        "completion_tokens": g.completion_tokens,
        "total_tokens": g.prompt_tokens_reported + g.completion_tokens,
    })
}

fn meta_info(id: &str, g: &Generation, completion_tokens: u64, done: bool) -> Value {
    let mut m = json!({
        "id": id,
        "prompt_tokens": g.prompt_tokens_reported,
        "completion_tokens": completion_tokens,
        "cached_tokens": 0,
    });
    if done {
        m["finish_reason"] = json!({"type": "stop"});
    }
    m
}

/// A non-streamed answer.
fn whole(req: &SimRequest, id: &str, g: &Generation) -> Value {
    match req.endpoint {
        Endpoint::Chat => json!({
            "id": format!("chatcmpl-{id}"),
            "object": "chat.completion",
            "created": unix_now(),
            "model": req.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": g.text},
                "finish_reason": "stop",
            }],
            "usage": usage(g),
        }),
        Endpoint::Completions => json!({
            "id": format!("cmpl-{id}"),
            "object": "text_completion",
            "created": unix_now(),
            "model": req.model,
            "choices": [{"index": 0, "text": g.text, "finish_reason": "stop"}],
            "usage": usage(g),
        }),
        Endpoint::Generate => json!({
            "text": g.text,
            "meta_info": meta_info(id, g, g.completion_tokens, true),
        }),
    }
}

/// The SSE events of a streamed answer, `[DONE]` included.
fn events(req: &SimRequest, id: &str, g: &Generation) -> Vec<String> {
    let pieces = text::pieces(&g.text);
    let created = unix_now();
    let mut out = Vec::with_capacity(pieces.len() + 4);
    match req.endpoint {
        Endpoint::Chat | Endpoint::Completions => {
            let (object, id) = if req.endpoint == Endpoint::Chat {
                ("chat.completion.chunk", format!("chatcmpl-{id}"))
            } else {
                ("text_completion", format!("cmpl-{id}"))
            };
            let chunk = |choice: Value| {
                json!({"id": id, "object": object, "created": created, "model": req.model,
                       "choices": [choice]})
            };
            let piece = |content: &str, finish: Option<&str>| match req.endpoint {
                Endpoint::Chat => {
                    json!({"index": 0, "delta": {"content": content}, "finish_reason": finish})
                }
                _ => json!({"index": 0, "text": content, "finish_reason": finish}),
            };
            if req.endpoint == Endpoint::Chat {
                out.push(chunk(
                    json!({"index": 0, "delta": {"role": "assistant", "content": ""},
                                      "finish_reason": null}),
                ));
            }
            out.extend(pieces.iter().map(|p| chunk(piece(p, None))));
            out.push(chunk(match req.endpoint {
                Endpoint::Chat => json!({"index": 0, "delta": {}, "finish_reason": "stop"}),
                _ => piece("", Some("stop")),
            }));
            if req.include_usage {
                out.push(json!({"id": id, "object": object, "created": created,
                                "model": req.model, "choices": [], "usage": usage(g)}));
            }
        }
        Endpoint::Generate => {
            // SGLang streams the cumulative text so far.
            let mut so_far = String::new();
            for (i, p) in pieces.iter().enumerate() {
                so_far.push_str(p);
                let done = i + 1 == pieces.len();
                // Tokens so far, as the engine counts them; the last event
                // carries the whole answer's count.
                let tokens = if done {
                    g.completion_tokens
                } else {
                    text::subword_count(&so_far)
                };
                out.push(json!({"text": so_far, "meta_info": meta_info(id, g, tokens, done)}));
            }
            if pieces.is_empty() {
                out.push(json!({"text": "", "meta_info": meta_info(id, g, 0, true)}));
            }
        }
    }
    let mut out: Vec<String> = out.into_iter().map(|e| format!("data: {e}\n\n")).collect();
    out.push("data: [DONE]\n\n".to_string());
    out
}

fn streamed(
    req: &SimRequest,
    id: &str,
    g: &Generation,
    delay: Duration,
    finish: impl FnOnce() + Send + 'static,
) -> Response<Body> {
    let events = events(req, id, g);
    let (tx, mut rx) = mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        for event in events {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if tx.send(Bytes::from(event)).await.is_err() {
                // The client went away.
                break;
            }
        }
        finish();
    });
    let stream = futures_util::stream::poll_fn(move |cx| {
        rx.poll_recv(cx)
            .map(|o| o.map(|b| Ok::<_, Infallible>(Frame::data(b))))
    });
    let mut resp = Response::new(StreamBody::new(stream).boxed());
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

fn json_response(status: StatusCode, body: Value) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// An error in the endpoint family's shape (OpenAI's or SGLang's).
fn error(endpoint: Endpoint, status: StatusCode, message: &str) -> Response<Body> {
    let body = match endpoint {
        Endpoint::Generate => json!({
            "object": "error",
            "message": message,
            "type": "BadRequestError",
            "code": status.as_u16(),
        }),
        _ => json!({"error": {
            "message": message,
            "type": "invalid_request_error",
            "param": null,
            "code": status.as_u16(),
        }}),
    };
    json_response(status, body)
}

#[cfg(test)]
mod tests;
