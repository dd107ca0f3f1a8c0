//! The path of one request, as named phases over plain async functions
//! (after pingora's `ProxyHttp`, without the trait):
//!
//! 1. `request_filter` — request id, tenant, route;
//! 2. `read_prompt` — on a scanned route, read the body (capped) and extract
//!    the prompt; anything else streams through untouched;
//! 3. `guard` — the optional `max-prompt-tokens` limit;
//! 4. `upstream_request` — strip hop-by-hop headers, point at the upstream;
//! 5. `send` — to the upstream, with timeouts;
//! 6. `upstream_response` — strip hop-by-hop headers, wrap the body in a tap
//!    that feeds the observer when it ends.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use prometheus::IntGauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

use crate::body::{BoxError, StreamEnd, StreamHook, TapBody};
use crate::config::{Action, ActionConfig, Config, RouteConfig};
use crate::detect::cross_tenant::CrossTenant;
use crate::detect::Finding;
use crate::enforce::{redact_json, verdict, Guard, GuardBody, OnFail, OnFindings, ScanFn, Verdict};
use crate::error::{ErrorSource, Rejection, StartError};
use crate::incident::IncidentSink;
use crate::metrics::Metrics;
use crate::observe::Scanners;
use crate::observe::{Exchange, Observer, Timings};
use crate::protocol::{self, BodyFormat, Endpoint, Family, ParsedRequest, Prompt, Route, Usage};
use crate::tenant::{Tenant, TenantResolver};
use crate::tokens::TokenCounter;
use crate::upstream::{RequestBody, Upstream};

pub type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;

/// Per-route settings, ready to use.
struct RouteRule {
    config: RouteConfig,
    counter: TokenCounter,
}

pub struct Proxy {
    upstream: Upstream,
    tenants: TenantResolver,
    observer: Observer,
    metrics: Metrics,
    routes: Vec<RouteRule>,
    max_request_bytes: usize,
    max_response_bytes: usize,
    idle_timeout: Duration,
    body_read_timeout: Duration,
    /// KiB of request bodies held at once (`server.max-buffered-bytes`).
    buffered: Arc<Semaphore>,
    actions: ActionConfig,
    hold_back_chars: usize,
    /// Tokens a streamed frame waits behind: two guaranteed runs, so that a
    /// leak of another tenant's answer (found after 24 words) is caught
    /// before its first byte goes out.
    hold_back_tokens: usize,
    /// Answers being scanned on the request path (`action.max-concurrent-scans`).
    inline_scans: Arc<Semaphore>,
    scanners: Arc<Scanners>,
    cross_tenant: Option<Arc<CrossTenant>>,
    incidents: IncidentSink,
}

/// What the request phases learned, carried to the response phases.
struct RequestCtx {
    received: Instant,
    request_id: Arc<str>,
    tenant: Tenant,
    family: Option<Family>,
    scan: Option<ScanCtx>,
    /// Time spent waiting for the client's body (not residue's latency).
    body_read: Duration,
    /// The request body's charge against `server.max-buffered-bytes`, held
    /// until the exchange ends.
    body_permit: Option<OwnedSemaphorePermit>,
    /// What to do with an answer that has findings.
    action: Action,
}

struct ScanCtx {
    endpoint: Endpoint,
    prompt: Arc<Prompt>,
    prompt_tokens: Option<u64>,
    counter: TokenCounter,
    stream: bool,
    logprobs: bool,
}

impl Proxy {
    pub fn new(
        config: &Config,
        tenants: TenantResolver,
        observer: Observer,
        scanners: Arc<Scanners>,
        metrics: Metrics,
    ) -> Result<Self, StartError> {
        let mut routes = Vec::new();
        for route in &config.routes {
            let counter = match &route.tokenizer {
                Some(path) => TokenCounter::from_file(path)?,
                None => TokenCounter::Estimate,
            };
            routes.push(RouteRule {
                config: route.clone(),
                counter,
            });
        }
        Ok(Proxy {
            upstream: Upstream::new(&config.upstream)?,
            tenants,
            observer,
            metrics,
            routes,
            max_request_bytes: config.server.max_request_bytes,
            max_response_bytes: config.observe.max_response_bytes,
            idle_timeout: config.upstream.idle_timeout,
            body_read_timeout: config.server.body_read_timeout,
            actions: config.action.clone(),
            hold_back_chars: config.action.hold_back_chars,
            hold_back_tokens: 2 * config
                .fingerprint
                .params()
                .guaranteed_run(crate::fingerprint::TokenClass::Word),
            inline_scans: Arc::new(Semaphore::new(config.action.max_concurrent_scans)),
            cross_tenant: scanners.cross_tenant.clone(),
            incidents: scanners.incidents.clone(),
            scanners,
            buffered: Arc::new(Semaphore::new(
                (config.server.max_buffered_bytes / 1024).clamp(1, Semaphore::MAX_PERMITS),
            )),
        })
    }

    /// Handles one request. Never fails: every error becomes a response in
    /// the family's shape.
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<ResponseBody>, Infallible> {
        let received = Instant::now();
        let request_id = request_id(req.headers());
        // Every log line about this request carries its id.
        let span = tracing::info_span!("request", request_id = %request_id);
        self.handle_in_span(req, received, request_id)
            .instrument(span)
            .await
    }

    async fn handle_in_span(
        self: Arc<Self>,
        req: Request<Incoming>,
        received: Instant,
        request_id: Arc<str>,
    ) -> Result<Response<ResponseBody>, Infallible> {
        let in_flight = InFlight::new(&self.metrics.in_flight);
        let tenant = self.tenants.resolve(req.headers());
        let route = protocol::match_route(req.uri().path());
        let mut ctx = RequestCtx {
            received,
            request_id,
            tenant,
            family: route.map(|r| r.family_hint()),
            scan: None,
            body_read: Duration::ZERO,
            body_permit: None,
            action: Action::Monitor,
        };
        let result = self.proxy(req, route, &mut ctx, in_flight).await;
        let family_label = ctx.family.map(|f| f.as_str()).unwrap_or("unknown");
        Ok(match result {
            Ok(resp) => resp,
            Err(rejection) => {
                self.metrics
                    .errors
                    .with_label_values(&[rejection.kind, rejection.source.as_str()])
                    .inc();
                self.metrics
                    .requests
                    .with_label_values(&[family_label, rejection.status.as_str()])
                    .inc();
                tracing::info!(
                    status = rejection.status.as_u16(),
                    kind = rejection.kind,
                    source = rejection.source.as_str(),
                    "Request answered by residue."
                );
                let mut resp = rejection.into_response(ctx.family);
                set_request_id(resp.headers_mut(), &ctx.request_id);
                set_residue_request_id(resp.headers_mut(), &ctx.request_id);
                resp.map(|b| Full::new(b).map_err(|never| match never {}).boxed_unsync())
            }
        })
    }

    async fn proxy(
        &self,
        req: Request<Incoming>,
        route: Option<Route>,
        ctx: &mut RequestCtx,
        in_flight: InFlight,
    ) -> Result<Response<ResponseBody>, Rejection> {
        let (parts, body) = req.into_parts();

        // Phase 2: on a scanned route, read the prompt; anything else streams.
        let scannable = route.is_some() && parts.method == Method::POST;
        let body: RequestBody = match (scannable, route) {
            (true, Some(route)) => {
                if let Some(reason) = unscannable_request(&parts.headers) {
                    self.metrics.unscanned.with_label_values(&[reason]).inc();
                    body.map_err(BoxError::from).boxed_unsync()
                } else {
                    let read_started = Instant::now();
                    let (bytes, permit) = self.read_body(&parts.headers, body).await?;
                    ctx.body_read = read_started.elapsed();
                    ctx.body_permit = permit;
                    self.metrics
                        .bytes
                        .with_label_values(&["request"])
                        .inc_by(bytes.len() as u64);
                    match protocol::parse_request(route, &bytes) {
                        Ok(parsed) => {
                            ctx.family = Some(parsed.endpoint.family());
                            let rule = self.rule_for(parts.uri.path(), parsed.endpoint);
                            ctx.action = self.action_for(&ctx.tenant, rule);
                            let scan = self.guard(parsed, rule).await?;
                            // Recorded now, before the answer: the engine holds
                            // this prompt from here on. Under block or redact
                            // it is recorded before forwarding, so that no
                            // queue can reorder or drop it.
                            let records =
                                self.cross_tenant.is_some() || self.scanners.semantic.is_some();
                            match ctx.action {
                                Action::Block | Action::Redact if records => {
                                    let (cross, semantic, tenant, prompt) = (
                                        self.cross_tenant.clone(),
                                        self.scanners.semantic.clone(),
                                        ctx.tenant.clone(),
                                        scan.prompt.clone(),
                                    );
                                    // The transformer tier embeds prompts
                                    // with the model: not worth a wait
                                    // before forwarding (the cascade's static
                                    // record takes about 2 ms).
                                    let (inline_semantic, later) = match semantic {
                                        Some(s)
                                            if s.tier()
                                                == crate::detect::semantic::Tier::Transformer =>
                                        {
                                            (None, Some(s))
                                        }
                                        other => (other, None),
                                    };
                                    if let Some(semantic) = later {
                                        let (tenant, prompt) =
                                            (ctx.tenant.clone(), scan.prompt.clone());
                                        drop(tokio::task::spawn_blocking(move || {
                                            semantic.record_prompt(&tenant, &prompt)
                                        }));
                                    }
                                    let _ = tokio::task::spawn_blocking(move || {
                                        if let Some(cross) = cross {
                                            cross.record_prompt(&tenant, &prompt);
                                        }
                                        if let Some(semantic) = inline_semantic {
                                            semantic.record_prompt(&tenant, &prompt);
                                        }
                                    })
                                    .await;
                                }
                                _ => self.observer.record_prompt(&ctx.tenant, &scan.prompt),
                            }
                            ctx.scan = Some(scan);
                        }
                        Err(e) => {
                            let reason = match e {
                                protocol::RequestError::Json(_) => "request_not_json",
                                protocol::RequestError::Shape(_) => "request_shape",
                            };
                            self.metrics.unscanned.with_label_values(&[reason]).inc();
                            tracing::debug!(reason, "Request forwarded unscanned.");
                        }
                    }
                    Full::new(bytes)
                        .map_err(|never| match never {})
                        .boxed_unsync()
                }
            }
            _ => {
                let reason = if route.is_some() {
                    "method"
                } else {
                    "unknown_route"
                };
                self.metrics.unscanned.with_label_values(&[reason]).inc();
                body.map_err(BoxError::from).boxed_unsync()
            }
        };

        // Phase 4: the upstream request.
        let mut upstream_req = Request::new(body);
        *upstream_req.method_mut() = parts.method;
        *upstream_req.uri_mut() = self.upstream.uri_for(parts.uri.path_and_query());
        // HTTP/2 to the upstream is chosen by ALPN (or h2c), not by the
        // client's version.
        *upstream_req.version_mut() = Version::HTTP_11;
        let mut headers = parts.headers;
        strip_hop_by_hop(&mut headers);
        if parts.version == Version::HTTP_2 {
            join_cookies(&mut headers);
        }
        headers.remove(header::HOST);
        set_request_id(&mut headers, &ctx.request_id);
        if ctx.action != Action::Monitor && ctx.scan.is_some() {
            // Blocking and redacting read the answer before the client does:
            // ask for it unencoded.
            headers.remove(header::ACCEPT_ENCODING);
        }
        *upstream_req.headers_mut() = headers;

        // Phase 5: send.
        let forwarded = Instant::now();
        let resp = self.upstream.send(upstream_req).await?;
        let response_head = Instant::now();

        // Phase 6: the response.
        let family_label = ctx.family.map(|f| f.as_str()).unwrap_or("unknown");
        self.metrics
            .upstream_ttfb
            .with_label_values(&[family_label])
            .observe(response_head.duration_since(forwarded).as_secs_f64());
        let (mut parts, body) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        // An upstream's own request id (OpenAI's `req_…`) is what its
        // support desk knows: keep it. residue's id always goes out as
        // `x-residue-request-id`, and as `x-request-id` when there is none.
        if !parts.headers.contains_key(&X_REQUEST_ID) {
            set_request_id(&mut parts.headers, &ctx.request_id);
        }
        set_residue_request_id(&mut parts.headers, &ctx.request_id);
        let status = parts.status;
        self.metrics
            .requests
            .with_label_values(&[family_label, status.as_str()])
            .inc();

        let scan = ctx.scan.take().map(|scan| {
            let mut header_usage = Usage::default();
            protocol::usage_from_headers(scan.endpoint, &parts.headers, &mut header_usage);
            PendingExchange {
                request_id: ctx.request_id.clone(),
                tenant: ctx.tenant.clone(),
                endpoint: scan.endpoint,
                prompt: scan.prompt,
                prompt_tokens: scan.prompt_tokens,
                counter: scan.counter,
                stream_requested: scan.stream,
                logprobs: scan.logprobs,
                status: status.as_u16(),
                content_type: header_str(&parts.headers, header::CONTENT_TYPE),
                content_encoding: header_str(&parts.headers, header::CONTENT_ENCODING),
                header_usage,
                received: ctx.received,
                forwarded,
                response_head,
                observer: self.observer.clone(),
                inline_scanned: false,
            }
        });
        let enforce = ctx.action != Action::Monitor && status.is_success();
        if let (true, Some(pending)) = (enforce, scan.as_ref()) {
            let format = BodyFormat::detect(
                pending.content_type.as_deref(),
                pending.endpoint,
                pending.stream_requested,
            );
            let encoded = pending
                .content_encoding
                .as_deref()
                .is_some_and(|e| !e.trim().eq_ignore_ascii_case("identity"));
            if format == BodyFormat::Json || encoded {
                let pending = scan.expect("checked above. This is a bug.");
                let _keep = (in_flight, ctx.body_permit.take());
                return self.enforce_whole(ctx, parts, body, pending).await;
            }
        }
        let hook = Box::new(ResponseHook {
            metrics: self.metrics.clone(),
            family: family_label,
            forwarded,
            capture: Vec::new(),
            captured: 0,
            total: 0,
            max_capture: if scan.is_some() {
                self.max_response_bytes
            } else {
                0
            },
            truncated: false,
            scan,
            _in_flight: in_flight,
            _body_permit: ctx.body_permit.take(),
        });
        let guard = match (&hook.scan, enforce) {
            (Some(pending), true) => Some((
                pending.logprobs,
                pending.endpoint,
                BodyFormat::detect(
                    pending.content_type.as_deref(),
                    pending.endpoint,
                    pending.stream_requested,
                ),
            )),
            _ => None,
        };
        let mut hook = hook;
        if guard.is_some() {
            if let Some(p) = hook.scan.as_mut() {
                p.inline_scanned = true;
            }
        }
        let tapped = TapBody::new(body, hook, Some(self.idle_timeout));
        let body = match (guard, &self.cross_tenant) {
            (Some((logprobs, endpoint, format)), Some(cross)) => {
                self.metrics
                    .enforced
                    .with_label_values(&[ctx.action.as_str(), "guarded_stream"])
                    .inc();
                let (cross, tenant) = (cross.clone(), ctx.tenant.clone());
                let scan: ScanFn = Arc::new(move |text: String, last: bool| {
                    cross.try_scan(&tenant, &text, last).map_err(|_| ())
                });
                let on_findings = self.on_findings(ctx, endpoint, status.as_u16());
                let (metrics, action) = (self.metrics.clone(), ctx.action);
                let on_fail: OnFail = Box::new(move |closed| {
                    let outcome = if closed { "fail_closed" } else { "fail_open" };
                    metrics
                        .enforced
                        .with_label_values(&[action.as_str(), outcome])
                        .inc();
                });
                let guard = Guard {
                    hold_back: self.hold_back_chars,
                    hold_back_tokens: self.hold_back_tokens,
                    max_text: self.max_response_bytes,
                    fail_closed: self.actions.fail_closed,
                    action: ctx.action,
                    logprobs,
                };
                GuardBody::new(tapped, endpoint, format, guard, scan, on_findings, on_fail)
                    .boxed_unsync()
            }
            _ => tapped.boxed_unsync(),
        };
        // The client's upload time is not residue's: leave it out.
        let added = forwarded
            .duration_since(ctx.received)
            .saturating_sub(ctx.body_read)
            + response_head.elapsed();
        self.metrics
            .added_latency
            .with_label_values(&[family_label])
            .observe(added.as_secs_f64());
        Ok(Response::from_parts(parts, body))
    }

    /// The action for a tenant on a route: the tenant's, else the route's,
    /// else the default.
    fn action_for(&self, tenant: &Tenant, rule: Option<&RouteRule>) -> Action {
        if let Some(t) = self
            .actions
            .tenants
            .iter()
            .find(|t| *t.tenant == *tenant.id)
        {
            return t.action;
        }
        rule.and_then(|r| r.config.action)
            .unwrap_or(self.actions.default)
    }

    /// Reports the findings of a guarded stream: as `block` when it was cut,
    /// as `redact` when they were masked (the `redacted` outcome counts once
    /// per stream).
    fn on_findings(&self, ctx: &RequestCtx, endpoint: Endpoint, status: u16) -> OnFindings {
        let incidents = self.incidents.clone();
        let metrics = self.metrics.clone();
        let probe = IncidentContext {
            request_id: ctx.request_id.clone(),
            tenant: ctx.tenant.clone(),
            endpoint,
            status,
        };
        let mut counted_redacted = false;
        Box::new(move |findings, action| {
            if action == "block" {
                metrics
                    .enforced
                    .with_label_values(&["block", "blocked"])
                    .inc();
            } else if !counted_redacted {
                counted_redacted = true;
                metrics
                    .enforced
                    .with_label_values(&["redact", "redacted"])
                    .inc();
            }
            for f in findings {
                incidents.report_for(
                    &probe.request_id,
                    &probe.tenant,
                    probe.endpoint,
                    probe.status,
                    f,
                    action,
                );
            }
        })
    }

    /// Block or redact a non-streaming answer: hold it whole, scan it off the
    /// async workers, then pass, replace or mask it.
    async fn enforce_whole(
        &self,
        ctx: &RequestCtx,
        parts: http::response::Parts,
        body: Incoming,
        pending: PendingExchange,
    ) -> Result<Response<ResponseBody>, Rejection> {
        let action = ctx.action;
        let fail = |reason: &'static str| -> Result<(), Rejection> {
            if self.actions.fail_closed {
                self.metrics
                    .enforced
                    .with_label_values(&[action.as_str(), "fail_closed"])
                    .inc();
                Err(Rejection::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "scan_unavailable",
                    ErrorSource::Internal,
                    format!(
                        "the answer could not be checked ({reason}) and action.fail-closed is set"
                    ),
                ))
            } else {
                self.metrics
                    .enforced
                    .with_label_values(&[action.as_str(), "fail_open"])
                    .inc();
                Ok(())
            }
        };
        // Read the whole answer, within the idle timeout and the scan cap.
        let mut chunks = Vec::new();
        let mut total = 0usize;
        let mut body = body;
        let mut too_large = false;
        loop {
            match tokio::time::timeout(self.idle_timeout, body.frame()).await {
                Err(_) => {
                    return Err(Rejection::new(
                        StatusCode::GATEWAY_TIMEOUT,
                        "upstream_timeout",
                        ErrorSource::Upstream,
                        format!("the upstream's answer stalled for {:?}", self.idle_timeout),
                    ))
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    return Err(Rejection::new(
                        StatusCode::BAD_GATEWAY,
                        "upstream_error",
                        ErrorSource::Upstream,
                        format!("the upstream's answer broke off: {e}"),
                    ))
                }
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        total += data.len();
                        chunks.push(data);
                        if total > self.max_response_bytes {
                            // Holding more would let one answer exhaust memory.
                            too_large = true;
                            break;
                        }
                    }
                }
            }
        }
        let bytes = concat(&chunks, total);
        self.metrics
            .bytes
            .with_label_values(&["response"])
            .inc_by(total as u64);
        let ended = Instant::now();
        let encoded = pending
            .content_encoding
            .as_deref()
            .is_some_and(|e| !e.trim().eq_ignore_ascii_case("identity"));
        let exchange = pending.into_exchange(
            vec![bytes.clone()],
            total as u64,
            too_large,
            StreamEnd::Complete,
            ended,
        );
        let respond = |parts: http::response::Parts, bytes: Bytes| {
            let mut parts = parts;
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
            Response::from_parts(
                parts,
                Full::new(bytes)
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
        };
        let permit = self.inline_scans.clone().try_acquire_owned().ok();
        let problem = if too_large {
            Some("too large to hold")
        } else if encoded {
            Some("content-encoded")
        } else if permit.is_none() {
            Some("too many scans at once")
        } else {
            None
        };
        if let Some(reason) = problem {
            fail(reason)?;
            if too_large {
                // Fail open: what was held, then the rest as it comes,
                // unscanned.
                let rest = crate::enforce::Prefixed::new(chunks, body);
                return Ok(Response::from_parts(parts, rest.boxed_unsync()));
            }
            // Fail open: pass it, and still scan it off the path.
            self.observer.submit(exchange);
            return Ok(respond(parts, bytes));
        }
        let scanners = self.scanners.clone();
        let scanned = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let (output, findings) = scanners.findings(&exchange);
            (exchange, output, findings)
        })
        .await;
        let Ok((exchange, output, findings)) = scanned else {
            fail("the scanner failed")?;
            return Ok(respond(parts, bytes));
        };
        match verdict(action, &findings) {
            Verdict::Pass => {
                self.metrics
                    .enforced
                    .with_label_values(&[action.as_str(), "pass"])
                    .inc();
                Ok(respond(parts, bytes))
            }
            Verdict::Redact(spans) => match redact_json(&bytes, &output.text, &spans) {
                Some(masked) => {
                    self.metrics
                        .enforced
                        .with_label_values(&[action.as_str(), "redacted"])
                        .inc();
                    for f in findings {
                        self.incidents.report(&exchange, f, "redact");
                    }
                    Ok(respond(parts, Bytes::from(masked)))
                }
                None => Err(self.block(&exchange, findings)),
            },
            Verdict::Block => Err(self.block(&exchange, findings)),
        }
    }

    /// Reports findings as blocked and builds the error the client gets.
    fn block(&self, exchange: &Exchange, findings: Vec<Finding>) -> Rejection {
        self.metrics
            .enforced
            .with_label_values(&["block", "blocked"])
            .inc();
        let mut ids = Vec::new();
        let mut detectors: Vec<&'static str> = Vec::new();
        for f in findings {
            if !detectors.contains(&f.detector) {
                detectors.push(f.detector);
            }
            ids.push(self.incidents.report(exchange, f, "block").id.clone());
        }
        Rejection::new(
            StatusCode::BAD_GATEWAY,
            "answer_blocked",
            ErrorSource::Upstream,
            format!(
                "the upstream's answer was withheld: {} (incident {})",
                detectors.join(", "),
                ids.join(", ")
            ),
        )
    }

    /// The `[[route]]` rule for a request: its path as sent, without a
    /// trailing `/`, or the endpoint's documented path.
    fn rule_for(&self, path: &str, endpoint: Endpoint) -> Option<&RouteRule> {
        let trimmed = path
            .strip_suffix('/')
            .filter(|p| !p.is_empty())
            .unwrap_or(path);
        let canonical = endpoint.canonical_path();
        self.routes.iter().find(|r| {
            r.config.matches(path)
                || r.config.matches(trimmed)
                || canonical.is_some_and(|c| r.config.matches(c))
        })
    }

    /// Reads a request body whole: at most `server.max-request-bytes`
    /// (→ 413), within `server.body-read-timeout` (→ 408), and charged to the
    /// `server.max-buffered-bytes` budget shared by all requests (→ 503). The
    /// permit returned holds that charge until the exchange ends.
    async fn read_body(
        &self,
        headers: &HeaderMap,
        mut body: Incoming,
    ) -> Result<(Bytes, Option<OwnedSemaphorePermit>), Rejection> {
        let too_large = || {
            Rejection::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                ErrorSource::Downstream,
                format!(
                    "the request body is larger than {} bytes (server.max-request-bytes)",
                    self.max_request_bytes
                ),
            )
        };
        if let Some(len) = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
        {
            if len > self.max_request_bytes as u64 {
                return Err(too_large());
            }
        }
        let read = async {
            let mut chunks: Vec<Bytes> = Vec::new();
            let mut total = 0usize;
            let mut permit: Option<OwnedSemaphorePermit> = None;
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| {
                    Rejection::new(
                        StatusCode::BAD_REQUEST,
                        "request_body_error",
                        ErrorSource::Downstream,
                        format!("reading the request body failed: {e}"),
                    )
                })?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                total += data.len();
                if total > self.max_request_bytes {
                    return Err(too_large());
                }
                // Charge in KiB, rounding up, as the body grows.
                let want = total.div_ceil(1024) as u32;
                let have = permit.as_ref().map_or(0, |p| p.num_permits() as u32);
                if want > have {
                    match self.buffered.clone().try_acquire_many_owned(want - have) {
                        Ok(more) => match permit.as_mut() {
                            Some(p) => p.merge(more),
                            None => permit = Some(more),
                        },
                        Err(_) => {
                            self.metrics
                                .rejected
                                .with_label_values(&["overloaded"])
                                .inc();
                            return Err(Rejection::new(
                                StatusCode::SERVICE_UNAVAILABLE,
                                "overloaded",
                                ErrorSource::Internal,
                                "too many request bytes in flight (server.max-buffered-bytes); retry shortly",
                            ));
                        }
                    }
                }
                chunks.push(data);
            }
            let bytes = concat(&chunks, total);
            Ok((bytes, permit))
        };
        match tokio::time::timeout(self.body_read_timeout, read).await {
            Ok(result) => result,
            Err(_) => Err(Rejection::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_body_timeout",
                ErrorSource::Downstream,
                format!(
                    "the request body did not arrive within {:?} (server.body-read-timeout)",
                    self.body_read_timeout
                ),
            )),
        }
    }

    /// Phase 3: counts the prompt's tokens when the route has a limit, and
    /// refuses prompts over it.
    async fn guard(
        &self,
        parsed: ParsedRequest,
        rule: Option<&RouteRule>,
    ) -> Result<ScanCtx, Rejection> {
        let counter = rule
            .map(|r| r.counter.clone())
            .unwrap_or(TokenCounter::Estimate);
        let prompt = Arc::new(parsed.prompt);
        let mut prompt_tokens = None;
        if let Some(max) = rule.and_then(|r| r.config.max_prompt_tokens) {
            let count = match &counter {
                TokenCounter::Estimate => counter.count(&prompt),
                TokenCounter::Tokenizer(_) => {
                    // A real tokenizer over a long prompt is CPU work: keep it
                    // off the async workers.
                    let (c, p) = (counter.clone(), prompt.clone());
                    tokio::task::spawn_blocking(move || c.count(&p))
                        .await
                        .unwrap_or_else(|_| crate::tokens::TokenCounter::Estimate.count(&prompt))
                }
            };
            prompt_tokens = Some(count);
            if count > max {
                self.metrics
                    .rejected
                    .with_label_values(&["prompt_too_long"])
                    .inc();
                return Err(Rejection::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "prompt_too_long",
                    ErrorSource::Downstream,
                    format!(
                        "the prompt has {count} tokens ({}); this route allows at most {max}",
                        counter.name()
                    ),
                ));
            }
        }
        Ok(ScanCtx {
            endpoint: parsed.endpoint,
            prompt,
            prompt_tokens,
            counter,
            stream: parsed.stream,
            logprobs: parsed.logprobs,
        })
    }
}

/// One buffer of `total` bytes from body chunks (no copy for one chunk).
fn concat(chunks: &[Bytes], total: usize) -> Bytes {
    match chunks {
        [] => Bytes::new(),
        [one] => one.clone(),
        _ => {
            let mut all = Vec::with_capacity(total);
            for c in chunks {
                all.extend_from_slice(c);
            }
            Bytes::from(all)
        }
    }
}

/// Why a request on a known route cannot be scanned, judged from its headers.
fn unscannable_request(headers: &HeaderMap) -> Option<&'static str> {
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
        if !ct.contains("json") {
            return Some("request_not_json");
        }
    }
    if let Some(ce) = headers.get(header::CONTENT_ENCODING) {
        if !ce.as_bytes().eq_ignore_ascii_case(b"identity") {
            return Some("request_encoded");
        }
    }
    None
}

/// An exchange waiting for its response body to end.
struct PendingExchange {
    request_id: Arc<str>,
    tenant: Tenant,
    endpoint: Endpoint,
    prompt: Arc<Prompt>,
    prompt_tokens: Option<u64>,
    counter: TokenCounter,
    stream_requested: bool,
    /// The request asked for log probabilities.
    logprobs: bool,
    status: u16,
    content_type: Option<String>,
    content_encoding: Option<String>,
    header_usage: Usage,
    received: Instant,
    forwarded: Instant,
    response_head: Instant,
    observer: Observer,
    inline_scanned: bool,
}

impl PendingExchange {
    fn into_exchange(
        self,
        body: Vec<Bytes>,
        body_bytes: u64,
        truncated: bool,
        end: StreamEnd,
        ended: Instant,
    ) -> Exchange {
        Exchange {
            request_id: self.request_id,
            tenant: self.tenant,
            endpoint: self.endpoint,
            prompt: self.prompt,
            prompt_tokens: self.prompt_tokens,
            counter: self.counter,
            stream_requested: self.stream_requested,
            status: self.status,
            content_type: self.content_type,
            content_encoding: self.content_encoding,
            header_usage: self.header_usage,
            body,
            body_bytes,
            capture_truncated: truncated,
            timings: Timings {
                received: self.received,
                forwarded: self.forwarded,
                response_head: self.response_head,
                ended,
            },
            end,
            inline_scanned: self.inline_scanned,
        }
    }
}

/// What an incident reported from the forwarding path needs to know.
struct IncidentContext {
    request_id: Arc<str>,
    tenant: Tenant,
    endpoint: Endpoint,
    status: u16,
}

/// Watches a response body: counts it, captures it (on scanned routes, up to
/// the cap) and, when it ends, hands the exchange to the observer.
struct ResponseHook {
    metrics: Metrics,
    family: &'static str,
    forwarded: Instant,
    capture: Vec<Bytes>,
    captured: usize,
    total: u64,
    max_capture: usize,
    truncated: bool,
    scan: Option<PendingExchange>,
    _in_flight: InFlight,
    _body_permit: Option<OwnedSemaphorePermit>,
}

impl StreamHook for ResponseHook {
    fn on_data(&mut self, data: &Bytes) {
        self.total += data.len() as u64;
        if self.scan.is_some() && !self.truncated {
            if self.captured + data.len() <= self.max_capture {
                self.captured += data.len();
                self.capture.push(data.clone());
            } else {
                self.truncated = true;
            }
        }
    }

    fn on_end(self: Box<Self>, end: StreamEnd, _trailers: Option<&HeaderMap>) {
        let this = *self;
        let ended = Instant::now();
        this.metrics
            .bytes
            .with_label_values(&["response"])
            .inc_by(this.total);
        this.metrics
            .upstream_duration
            .with_label_values(&[this.family])
            .observe(ended.duration_since(this.forwarded).as_secs_f64());
        this.metrics
            .stream_end
            .with_label_values(&[this.family, end.as_str()])
            .inc();
        if let Some(p) = this.scan {
            let observer = p.observer.clone();
            observer.submit(p.into_exchange(this.capture, this.total, this.truncated, end, ended));
        }
    }
}

/// Keeps `residue_in_flight_requests` right however a request ends.
struct InFlight(IntGauge);

impl InFlight {
    fn new(gauge: &IntGauge) -> Self {
        gauge.inc();
        InFlight(gauge.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Honours a sane `x-request-id`; otherwise makes one.
fn request_id(headers: &HeaderMap) -> Arc<str> {
    if let Some(v) = headers.get(&X_REQUEST_ID) {
        let b = v.as_bytes();
        if !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_graphic()) {
            if let Ok(s) = v.to_str() {
                return Arc::from(s);
            }
        }
    }
    Arc::from(format!("{:032x}", rand::random::<u128>()))
}

fn set_request_id(headers: &mut HeaderMap, id: &str) {
    if let Ok(v) = HeaderValue::from_str(id) {
        headers.insert(X_REQUEST_ID, v);
    }
}

/// HTTP/2 clients may split `cookie` into several fields; an HTTP/1.1
/// upstream expects one (RFC 9113 §8.2.3).
fn join_cookies(headers: &mut HeaderMap) {
    let cookies: Vec<&[u8]> = headers
        .get_all(header::COOKIE)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    if cookies.len() < 2 {
        return;
    }
    let joined = cookies.join(&b"; "[..]);
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, v);
    }
}

fn set_residue_request_id(headers: &mut HeaderMap, id: &str) {
    if let Ok(v) = HeaderValue::from_str(id) {
        headers.insert(HeaderName::from_static("x-residue-request-id"), v);
    }
}

fn header_str(headers: &HeaderMap, name: HeaderName) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Removes the headers that describe one connection rather than the message
/// (RFC 9110 §7.6.1), including those the `Connection` header names. `te:
/// trailers` is kept: it is end-to-end in practice (gRPC, HTTP/2). So is
/// `Trailer`, which RFC 9110 does not count as hop-by-hop and without which
/// hyper will not send the trailer fields on HTTP/1.1.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        if name != header::TE {
            headers.remove(name);
        }
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    let te_trailers = headers
        .get(header::TE)
        .map(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"))
        .unwrap_or(true);
    if !te_trailers {
        headers.remove(header::TE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_end_to_end_headers_stay() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::TE, HeaderValue::from_static("gzip"));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert("x-custom", HeaderValue::from_static("kept"));
        strip_hop_by_hop(&mut h);
        let mut names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, vec!["content-type", "x-custom"]);

        let mut h = HeaderMap::new();
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        strip_hop_by_hop(&mut h);
        assert!(h.contains_key(header::TE));
    }

    #[test]
    fn split_cookies_are_joined() {
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, HeaderValue::from_static("a=1"));
        h.append(header::COOKIE, HeaderValue::from_static("b=2"));
        join_cookies(&mut h);
        assert_eq!(h.get_all(header::COOKIE).iter().count(), 1);
        assert_eq!(h[header::COOKIE], "a=1; b=2");
    }

    #[test]
    fn request_ids_are_honoured_only_when_sane() {
        let mut h = HeaderMap::new();
        h.insert(X_REQUEST_ID, HeaderValue::from_static("abc-123"));
        assert_eq!(&*request_id(&h), "abc-123");
        h.insert(X_REQUEST_ID, HeaderValue::from_static("has space"));
        assert_ne!(&*request_id(&h), "has space");
        h.insert(
            X_REQUEST_ID,
            HeaderValue::from_str(&"a".repeat(200)).unwrap(),
        );
        assert_eq!(request_id(&h).len(), 32);
        assert_eq!(request_id(&HeaderMap::new()).len(), 32);
    }
}
