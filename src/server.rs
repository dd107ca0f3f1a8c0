//! Listeners: the proxy port (HTTP/1.1 and h2c) and the admin port
//! (`/metrics`, `/healthz`, `/readyz`), which tenants never reach. Graceful
//! shutdown: stop accepting, turn `/readyz` red, let in-flight streams finish
//! up to `server.drain-timeout`, then drain the scan and incident queues.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::config::Config;
use crate::detect::accounting::PromptAccounting;
use crate::detect::canary::Canaries;
use crate::detect::cross_tenant::{CrossTenant, Settings};
use crate::detect::Detector;
use crate::error::StartError;
use crate::fingerprint::Fingerprinter;
use crate::hash::HashKey;
use crate::incident::IncidentSink;
use crate::metrics::Metrics;
use crate::observe::{self, Scanners};
use crate::proxy::Proxy;
use crate::rules::RuleSet;
use crate::store::memory::MemoryStore;
use crate::store::FingerprintStore;
use crate::tenant::TenantResolver;

/// Builds the cross-tenant detectors, if any is on.
fn cross_tenant(
    config: &Config,
    key: &HashKey,
    metrics: &Metrics,
) -> Result<Option<Arc<CrossTenant>>, StartError> {
    let detect = &config.detect;
    if !detect.ngram && !detect.pii && detect.canary.is_empty() {
        return Ok(None);
    }
    let f = &config.fingerprint;
    let params = f.params();
    let rules = match &detect.rules_dir {
        Some(dir) => RuleSet::load_dir(dir).map_err(|e| crate::config::ConfigError {
            errors: e
                .errors
                .into_iter()
                .map(|e| format!("detect.rules-dir: {e}"))
                .collect(),
        })?,
        None => RuleSet::builtin(),
    };
    let canaries =
        Canaries::new(&detect.canary).map_err(|errors| crate::config::ConfigError { errors })?;
    let store: Arc<dyn FingerprintStore> = Arc::new(MemoryStore::new(f.window, f.max_bytes));
    Ok(Some(Arc::new(CrossTenant::new(
        Fingerprinter::new(key.derive_key("fingerprint"), params),
        Arc::new(rules),
        canaries,
        store,
        tokio::runtime::Handle::current(),
        key.clone(),
        Settings {
            ngram: detect.ngram,
            pii: detect.pii,
            common_tenants: f.common_tenants,
            record_answers: f.record_answers,
            evidence: detect.evidence,
            raw_tenant: config.incidents.raw_tenant,
        },
        metrics.clone(),
    ))))
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { what, addr, source })
}

/// A bound, not yet running residue.
pub struct Residue {
    proxy: Arc<Proxy>,
    listener: TcpListener,
    admin: TcpListener,
    metrics: Metrics,
    incidents: IncidentSink,
    threads: Vec<std::thread::JoinHandle<()>>,
    drain_timeout: Duration,
    header_read_timeout: Duration,
    http2_keep_alive_interval: Duration,
    /// The rules folder to watch, and whom to give reloaded rules.
    rules_reload: Option<(std::path::PathBuf, Arc<CrossTenant>)>,
}

impl Residue {
    /// Validates the config, loads tokenizers, opens the incident file,
    /// starts the scanner threads and binds both ports.
    pub async fn bind(config: Config) -> Result<Residue, StartError> {
        Residue::bind_with(config, Vec::new()).await
    }

    /// [`Residue::bind`], with extra detectors run after the built-in ones.
    pub async fn bind_with(
        config: Config,
        extra: Vec<Box<dyn Detector>>,
    ) -> Result<Residue, StartError> {
        let errors = config.validate();
        if !errors.is_empty() {
            return Err(crate::config::ConfigError { errors }.into());
        }
        let key = match &config.privacy.hash_key {
            Some(hex) => HashKey::from_hex(hex).map_err(|e| crate::config::ConfigError {
                errors: vec![format!("privacy.hash-key: {e}")],
            })?,
            None => HashKey::generate(),
        };
        let tenants = TenantResolver::new(&config.tenant, key.clone())
            .map_err(|errors| crate::config::ConfigError { errors })?;
        let metrics = Metrics::new();
        let (incidents, writer) = crate::incident::start(
            config.incidents.path.as_deref(),
            config.incidents.queue,
            config.incidents.raw_tenant,
            key.clone(),
            metrics.clone(),
        )?;
        let mut detectors: Vec<Box<dyn Detector>> = Vec::new();
        if config.accounting.enabled {
            detectors.push(Box::new(PromptAccounting::new(&config.accounting)));
        }
        let cross_tenant = cross_tenant(&config, &key, &metrics)?;
        if let Some(c) = &cross_tenant {
            metrics.rules_loaded.set(c.rules_len() as i64);
        }
        if let Some(cross) = &cross_tenant {
            detectors.push(Box::new(cross.clone()));
        }
        detectors.extend(extra);
        let semantic = if config.semantic.enabled {
            let names = crate::detect::TenantNames::new(key.clone(), config.incidents.raw_tenant);
            let (sem, ttl, runtime, m) = (
                config.semantic.clone(),
                config.fingerprint.window,
                tokio::runtime::Handle::current(),
                metrics.clone(),
            );
            // Loading the model (and, the first time, distilling its static
            // table) is blocking work.
            let built = tokio::task::spawn_blocking(move || {
                crate::detect::semantic::build(&sem, ttl, names, runtime, &m)
            })
            .await
            .expect("building the semantic detectors panicked. This is a bug.")?;
            Some(Arc::new(built))
        } else {
            None
        };
        let scanners = Arc::new(Scanners {
            detectors,
            incidents: incidents.clone(),
            metrics: metrics.clone(),
            max_response_bytes: config.observe.max_response_bytes,
            cross_tenant: cross_tenant.clone(),
            semantic,
            semantic_enforce: config.semantic.enforce,
        });
        let (observer, mut threads) = observe::start(
            config.observe.queue,
            config.observe.max_queue_bytes,
            config.observe.workers,
            scanners.clone(),
        );
        threads.extend(writer);
        let proxy = Arc::new(Proxy::new(
            &config,
            tenants,
            observer,
            scanners,
            metrics.clone(),
        )?);
        let listener = bind("the proxy listener", config.server.listen).await?;
        let admin = bind("the admin listener", config.server.admin_listen).await?;
        Ok(Residue {
            proxy,
            listener,
            admin,
            metrics,
            incidents,
            threads,
            drain_timeout: config.server.drain_timeout,
            header_read_timeout: config.server.header_read_timeout,
            http2_keep_alive_interval: config.server.http2_keep_alive_interval,
            rules_reload: match (&config.detect.rules_dir, cross_tenant) {
                (Some(dir), Some(cross)) => Some((dir.clone(), cross)),
                _ => None,
            },
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address. This is a bug.")
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
            .local_addr()
            .expect("a bound listener has an address. This is a bug.")
    }

    pub fn metrics(&self) -> Metrics {
        self.metrics.clone()
    }

    pub fn incidents(&self) -> IncidentSink {
        self.incidents.clone()
    }

    /// Serves until `shutdown` resolves, then drains.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), StartError> {
        let Residue {
            proxy,
            listener,
            admin,
            metrics,
            incidents,
            threads,
            drain_timeout,
            header_read_timeout,
            http2_keep_alive_interval,
            rules_reload,
        } = self;
        let ready = Arc::new(AtomicBool::new(true));
        let reloader =
            rules_reload.map(|(dir, cross)| tokio::spawn(watch_rules(dir, cross, metrics.clone())));
        let admin_task = tokio::spawn(serve_admin(admin, metrics, ready.clone()));

        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(http2_keep_alive_interval)
            .keep_alive_timeout(Duration::from_secs(20));
        let graceful = GracefulShutdown::new();
        // Every connection's task, so that those still open at the drain
        // deadline can be closed rather than left running.
        let mut connections = tokio::task::JoinSet::new();
        tracing::info!(listen = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), "Proxy listening.");
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let (stream, _peer) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            // Out of file descriptors and the like: back off
                            // rather than spin.
                            tracing::warn!(error = %e, "Accept failed.");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let _ = stream.set_nodelay(true);
                    let proxy = proxy.clone();
                    let service = service_fn(move |req| proxy.clone().handle(req));
                    let conn = builder.serve_connection(TokioIo::new(stream), service).into_owned();
                    let conn = graceful.watch(conn);
                    connections.spawn(async move {
                        if let Err(e) = conn.await {
                            tracing::debug!(error = %e, "Client connection ended with an error.");
                        }
                    });
                }
                // Reap finished connections so the set does not grow.
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                () = &mut shutdown => break,
            }
        }
        drop(listener);
        ready.store(false, Ordering::SeqCst);
        tracing::info!(deadline = ?drain_timeout, "Shutting down: draining in-flight requests.");
        if tokio::time::timeout(drain_timeout, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(
                open = connections.len(),
                "Drain deadline passed with requests still in flight; closing them."
            );
        }
        connections.abort_all();
        while connections.join_next().await.is_some() {}
        // The scanners stop once the last handle to their queue is gone: ours,
        // and those of connections that have now ended.
        drop(proxy);
        drop(incidents);
        let joined = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        });
        if tokio::time::timeout(Duration::from_secs(5), joined)
            .await
            .is_err()
        {
            tracing::warn!("Scan and incident queues did not drain within 5s.");
        }
        admin_task.abort();
        if let Some(r) = reloader {
            r.abort();
        }
        tracing::info!("Stopped.");
        Ok(())
    }

    /// Runs in the background; for tests, benchmarks and embedding.
    pub fn spawn(self) -> Running {
        let addr = self.local_addr();
        let admin_addr = self.admin_addr();
        let incidents = self.incidents();
        let metrics = self.metrics();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(self.run(async move {
            let _ = rx.await;
        }));
        Running {
            addr,
            admin_addr,
            incidents,
            metrics,
            stop: Some(tx),
            task,
        }
    }
}

/// A residue running in the background. Dropping it begins a graceful
/// shutdown (its stop channel closes); [`Running::shutdown`] also waits for
/// it to finish.
pub struct Running {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub incidents: IncidentSink,
    pub metrics: Metrics,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), StartError>>,
}

impl Running {
    /// Begins a graceful shutdown and waits for it to finish.
    pub async fn shutdown(mut self) -> Result<(), StartError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task)
            .await
            .unwrap_or_else(|e| panic!("residue's task panicked: {e}"))
    }
}

/// Reloads the rules folder on SIGHUP and when a file in it changes
/// (checked every 2 s). A folder that fails to load keeps the rules in force.
async fn watch_rules(dir: std::path::PathBuf, cross: Arc<CrossTenant>, metrics: Metrics) {
    fn signature(
        dir: &std::path::Path,
    ) -> Vec<(std::ffi::OsString, Option<std::time::SystemTime>, u64)> {
        let mut sig: Vec<_> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "toml"))
            .map(|e| {
                let meta = e.metadata().ok();
                (
                    e.file_name(),
                    meta.as_ref().and_then(|m| m.modified().ok()),
                    meta.map(|m| m.len()).unwrap_or(0),
                )
            })
            .collect();
        sig.sort();
        sig
    }
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut last = signature(&dir);
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        #[cfg(unix)]
        let hangup = async {
            match hup.as_mut() {
                Some(h) => {
                    h.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let hangup = std::future::pending::<()>();
        let forced = tokio::select! {
            () = hangup => true,
            _ = tick.tick() => false,
        };
        // Reading the folder is blocking I/O (a network mount can be slow):
        // off the async workers.
        let d = dir.clone();
        let Ok(now) = tokio::task::spawn_blocking(move || signature(&d)).await else {
            continue;
        };
        if !forced && now == last {
            continue;
        }
        last = now;
        let d = dir.clone();
        match tokio::task::spawn_blocking(move || RuleSet::load_dir(&d)).await {
            Ok(Ok(rules)) => {
                metrics.rules_loaded.set(rules.len() as i64);
                cross.set_rules(Arc::new(rules));
                metrics.rules_reloads.with_label_values(&["ok"]).inc();
                tracing::info!(dir = %dir.display(), "Rules reloaded.");
            }
            Ok(Err(e)) => {
                metrics.rules_reloads.with_label_values(&["error"]).inc();
                tracing::error!(dir = %dir.display(), errors = %e.errors.join("; "), "Rules not reloaded; the rules in force stay.");
            }
            Err(_) => {
                metrics.rules_reloads.with_label_values(&["error"]).inc();
            }
        }
    }
}

async fn serve_admin(listener: TcpListener, metrics: Metrics, ready: Arc<AtomicBool>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let metrics = metrics.clone();
        let ready = ready.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let resp = admin_response(req.uri().path(), &metrics, &ready);
            async move { Ok::<_, Infallible>(resp) }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn admin_response(path: &str, metrics: &Metrics, ready: &AtomicBool) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/metrics" => (
            StatusCode::OK,
            "text/plain; version=0.0.4",
            Bytes::from(metrics.render()),
        ),
        "/healthz" => (StatusCode::OK, "text/plain", Bytes::from_static(b"ok\n")),
        "/readyz" if ready.load(Ordering::SeqCst) => {
            (StatusCode::OK, "text/plain", Bytes::from_static(b"ready\n"))
        }
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            Bytes::from_static(b"draining\n"),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            Bytes::from_static(b"not found\n"),
        ),
    };
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    resp
}
