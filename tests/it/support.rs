//! Test support: fake upstreams, a residue started in-process on
//! `127.0.0.1:0`, a plain client, and a detector that records what the
//! scanners saw.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

use residue::detect::{Detector, Finding, ScanInput};
use residue::protocol::Usage;
use residue::{Config, Residue, Running};

/// A request as the fake upstream received it.
#[derive(Clone, Debug)]
pub struct Received {
    pub uri: http::Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// What the fake upstream answers: a status, headers and body chunks sent
/// one by one, each after its delay. A gate, when set, holds every chunk
/// after the first until it is opened.
#[derive(Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: Vec<(&'static str, String)>,
    pub chunks: Vec<Bytes>,
    pub delay: Duration,
    pub gate: Option<Arc<Notify>>,
    /// Sent after the last chunk.
    pub trailers: Option<HeaderMap>,
}

impl Reply {
    pub fn json(body: impl Into<Bytes>) -> Reply {
        Reply {
            status: StatusCode::OK,
            headers: vec![("content-type", "application/json".into())],
            chunks: vec![body.into()],
            delay: Duration::ZERO,
            gate: None,
            trailers: None,
        }
    }

    pub fn stream(content_type: &str, chunks: Vec<Bytes>) -> Reply {
        Reply {
            status: StatusCode::OK,
            headers: vec![("content-type", content_type.to_string())],
            chunks,
            delay: Duration::from_millis(5),
            gate: None,
            trailers: None,
        }
    }

    pub fn header(mut self, name: &'static str, value: &str) -> Reply {
        self.headers.push((name, value.to_string()));
        self
    }
}

type Handler = Arc<dyn Fn(&Received) -> Reply + Send + Sync>;

/// A programmable upstream on a free loopback port.
pub struct FakeUpstream {
    pub addr: SocketAddr,
    pub received: Arc<Mutex<Vec<Received>>>,
    /// Set when a response body could not be delivered because the peer went
    /// away (the cancellation signal).
    pub cancelled: Arc<AtomicBool>,
    pub completed: Arc<AtomicUsize>,
}

impl FakeUpstream {
    pub async fn start(
        handler: impl Fn(&Received) -> Reply + Send + Sync + 'static,
    ) -> FakeUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handler: Handler = Arc::new(handler);
        let received = Arc::new(Mutex::new(Vec::new()));
        let cancelled = Arc::new(AtomicBool::new(false));
        let completed = Arc::new(AtomicUsize::new(0));
        let (r, c, d) = (received.clone(), cancelled.clone(), completed.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (handler, r, c, d) = (handler.clone(), r.clone(), c.clone(), d.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let (handler, r, c, d) = (handler.clone(), r.clone(), c.clone(), d.clone());
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let rec = Received {
                                uri: parts.uri,
                                headers: parts.headers,
                                body,
                            };
                            let reply = handler(&rec);
                            r.lock().unwrap().push(rec);
                            Ok::<_, Infallible>(respond(reply, c, d))
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FakeUpstream {
            addr,
            received,
            cancelled,
            completed,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn last(&self) -> Received {
        self.received
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("the upstream received a request")
    }

    pub fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }
}

type ChunkStream =
    StreamBody<futures_util::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

fn respond(
    reply: Reply,
    cancelled: Arc<AtomicBool>,
    completed: Arc<AtomicUsize>,
) -> Response<ChunkStream> {
    let (tx, mut rx) = mpsc::channel::<Frame<Bytes>>(1);
    let Reply {
        status,
        headers,
        chunks,
        delay,
        gate,
        trailers,
    } = reply;
    tokio::spawn(async move {
        for (i, chunk) in chunks.into_iter().enumerate() {
            if i > 0 {
                if let Some(gate) = &gate {
                    gate.notified().await;
                }
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
            }
            if tx.send(Frame::data(chunk)).await.is_err() {
                cancelled.store(true, Ordering::SeqCst);
                return;
            }
        }
        if let Some(trailers) = trailers {
            let _ = tx.send(Frame::trailers(trailers)).await;
        }
        // Wait until the last chunk was taken, then end the body.
        while tx.capacity() < tx.max_capacity() {
            if tx.is_closed() {
                cancelled.store(true, Ordering::SeqCst);
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(tx);
        completed.fetch_add(1, Ordering::SeqCst);
    });
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(Ok)));
    let mut resp = Response::new(StreamBody::new(
        Box::pin(stream) as futures_util::stream::BoxStream<'static, _>
    ));
    *resp.status_mut() = status;
    for (name, value) in headers {
        resp.headers_mut().insert(name, value.parse().unwrap());
    }
    resp
}

/// What a scanner saw for one exchange.
#[derive(Clone, Debug)]
pub struct Seen {
    pub request_id: String,
    pub tenant: String,
    pub tenant_source: &'static str,
    pub endpoint: &'static str,
    pub prompt: String,
    pub prompt_parts: Vec<String>,
    pub output: String,
    pub usage: Usage,
    pub status: u16,
    pub end: &'static str,
    pub counted: u64,
}

/// A detector that finds nothing and records everything.
#[derive(Clone, Default)]
pub struct Recorder(pub Arc<Mutex<Vec<Seen>>>, pub Arc<Notify>);

impl Detector for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }

    fn inspect(&self, input: &ScanInput<'_>) -> Vec<Finding> {
        let ex = input.exchange;
        self.0.lock().unwrap().push(Seen {
            request_id: ex.request_id.to_string(),
            tenant: ex.tenant.id.to_string(),
            tenant_source: ex.tenant.source.as_str(),
            endpoint: ex.endpoint.as_str(),
            prompt: ex.prompt.text(),
            prompt_parts: ex.prompt.parts.clone(),
            output: input.output.text.clone(),
            usage: input.output.usage.clone(),
            status: ex.status,
            end: ex.end.as_str(),
            counted: input.prompt_tokens,
        });
        self.1.notify_waiters();
        Vec::new()
    }
}

impl Recorder {
    /// Waits (at most 5 s) until `n` exchanges were scanned.
    pub async fn wait_for(&self, n: usize) -> Vec<Seen> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let notified = self.1.notified();
            {
                let seen = self.0.lock().unwrap();
                if seen.len() >= n {
                    return seen.clone();
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let seen = self.0.lock().unwrap();
                panic!(
                    "expected {n} scanned exchanges, saw {}: {seen:#?}",
                    seen.len()
                );
            }
        }
    }

    pub async fn one(&self) -> Seen {
        self.wait_for(1).await.remove(0)
    }
}

/// A test config: free ports, no incident file, short timeouts.
pub fn config(upstream: &str) -> Config {
    let mut c = Config::default();
    c.server.listen = "127.0.0.1:0".parse().unwrap();
    c.server.admin_listen = "127.0.0.1:0".parse().unwrap();
    c.server.drain_timeout = Duration::from_secs(5);
    c.upstream.url = upstream.to_string();
    c.upstream.response_timeout = Duration::from_secs(10);
    c.incidents.path = None;
    c
}

pub async fn start(config: Config) -> (Running, Recorder) {
    let recorder = Recorder::default();
    let residue = Residue::bind_with(config, vec![Box::new(recorder.clone())])
        .await
        .expect("residue starts");
    (residue.spawn(), recorder)
}

pub type TestClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub fn h2_client() -> TestClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// Sends a request and reads the whole answer.
pub async fn send(
    client: &TestClient,
    req: Request<Full<Bytes>>,
) -> (StatusCode, HeaderMap, Bytes) {
    let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .expect("response within 10 s")
        .expect("request succeeds");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    (parts.status, parts.headers, body)
}

/// POSTs `body` to `path` at `addr` and reads the whole answer.
pub async fn call(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, HeaderMap, Bytes) {
    let mut req =
        Request::post(format!("http://{addr}{path}")).header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    send(
        &client(),
        req.body(Full::new(Bytes::from(body.to_string()))).unwrap(),
    )
    .await
}

/// Scrapes one metric's value (summed over label sets matching `labels`).
pub async fn metric(admin: SocketAddr, name: &str, labels: &[(&str, &str)]) -> f64 {
    let (_, _, body) = send(
        &client(),
        Request::get(format!("http://{admin}/metrics"))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    let text = String::from_utf8_lossy(&body).to_string();
    let mut total = 0.0;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let base = series.split('{').next().unwrap();
        if base != name {
            continue;
        }
        if labels
            .iter()
            .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")))
        {
            total += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    total
}

/// Whether an outside program is usable. Missing → a loud skip, or a failure
/// when `RESIDUE_REQUIRE_ALL=1` (CI, after installing everything).
pub fn require_tool(what: &str, program: &str, args: &[&str]) -> bool {
    let ok = std::process::Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        if std::env::var("RESIDUE_REQUIRE_ALL").as_deref() == Ok("1") {
            panic!("{what} is required (RESIDUE_REQUIRE_ALL=1) but not available");
        }
        eprintln!("\n!!!!! SKIPPED: {what} is not available; install it or this test proves nothing !!!!!\n");
    }
    ok
}

/// Waits (at most 10 s) until a metric reaches `at_least`.
pub async fn wait_for_metric(
    admin: SocketAddr,
    name: &str,
    labels: &[(&str, &str)],
    at_least: f64,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while metric(admin, name, labels).await < at_least {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}{labels:?} did not reach {at_least} within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
