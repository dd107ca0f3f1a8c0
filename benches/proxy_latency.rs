//! residue's added latency: the same fast upstream called directly, through
//! a bare residue (no detectors), and through residue in monitor mode with
//! every detector on, in one run, at a fixed request rate (open loop), in
//! rotating one-second slices so all three see the same machine noise.
//!
//! `cargo bench --bench proxy_latency` (env: RATE=1000 req/s, SECONDS=30,
//! ANSWER_BYTES=1024). Latency is measured from each request's *scheduled*
//! send time, so queueing is not hidden (no coordinated omission). Results
//! also go to `target/bench-proxy-latency.json`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn answer(bytes: usize) -> Bytes {
    let head = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":""#;
    let tail = r#""},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":200,"total_tokens":212}}"#;
    let filler = "The quick brown fox jumps over the lazy dog. ";
    let mut content = String::new();
    while head.len() + content.len() + tail.len() < bytes {
        content.push_str(filler);
    }
    content.truncate(bytes.saturating_sub(head.len() + tail.len()));
    Bytes::from(format!("{head}{content}{tail}"))
}

/// A fast upstream on its own single-threaded runtime and thread.
fn start_upstream(body: Bytes) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let _ = stream.set_nodelay(true);
                let body = body.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let body = body.clone();
                        async move {
                            let _ = req.into_body().collect().await;
                            let mut resp = Response::new(Full::new(body));
                            resp.headers_mut()
                                .insert("content-type", "application/json".parse().unwrap());
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
    });
    rx.recv().unwrap()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn main() {
    let rate = env("RATE", 1000);
    let seconds = env("SECONDS", 30);
    let answer_bytes = env("ANSWER_BYTES", 1024) as usize;
    let upstream = start_upstream(answer(answer_bytes));

    // residue, as `residue serve` runs it (its own multi-threaded runtime),
    // twice: bare, and in monitor mode with every detector on.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut running = Vec::new();
            // Dropping a `Running` shuts it down: keep them.
            let mut keep = Vec::new();
            for bare in [true, false] {
                let mut config = residue::Config::default();
                config.server.listen = "127.0.0.1:0".parse().unwrap();
                config.server.admin_listen = "127.0.0.1:0".parse().unwrap();
                config.upstream.url = format!("http://{upstream}");
                config.incidents.path = None;
                if bare {
                    config.accounting.enabled = false;
                    config.detect.ngram = false;
                    config.detect.pii = false;
                } else {
                    config.detect.canary = vec![residue::detect::canary::CanaryConfig {
                        value: "RESIDUE-CANARY-7f3a91".into(),
                        tenant: None,
                    }];
                }
                let r = residue::Residue::bind(config).await.unwrap().spawn();
                running.push((r.addr, r.metrics.clone()));
                keep.push(r);
            }
            tx.send(running).unwrap();
            std::future::pending::<()>().await;
        });
    });
    let running = rx.recv().unwrap();
    let metrics = running[1].1.clone();
    let targets = [upstream, running[0].0, running[1].0];

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (all, errors) = rt.block_on(async move {
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(256)
            .build_http();
        let prompt = Bytes::from_static(
            br#"{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a short paragraph about foxes and dogs."}]}"#,
        );
        let sinks: Vec<Arc<Mutex<Vec<f64>>>> = (0..3).map(|_| Arc::default()).collect();
        let errors: Arc<Mutex<u64>> = Arc::default();
        // Warm up every path (connections, pools, page faults).
        for target in targets {
            for _ in 0..200 {
                let req = Request::post(format!("http://{target}/v1/chat/completions"))
                    .header("content-type", "application/json")
                    .header("authorization", "Bearer sk-bench")
                    .body(Full::new(prompt.clone()))
                    .unwrap();
                let _ = client.request(req).await.unwrap().into_body().collect().await;
            }
        }
        let interval = Duration::from_secs_f64(1.0 / rate as f64);
        let start = tokio::time::Instant::now() + Duration::from_millis(50);
        let total = rate * seconds;
        let mut tasks = Vec::with_capacity(total as usize);
        for i in 0..total {
            let scheduled = start + interval * i as u32;
            tokio::time::sleep_until(scheduled).await;
            // One-second slices, rotating direct → bare → full.
            let slot = ((i / rate) % 3) as usize;
            let (target, sink) = (targets[slot], sinks[slot].clone());
            let (client, prompt, errors) = (client.clone(), prompt.clone(), errors.clone());
            tasks.push(tokio::spawn(async move {
                let req = Request::post(format!("http://{target}/v1/chat/completions"))
                    .header("content-type", "application/json")
                    .header("authorization", "Bearer sk-bench")
                    .body(Full::new(prompt))
                    .unwrap();
                let ok = match client.request(req).await {
                    Ok(resp) => resp.into_body().collect().await.is_ok(),
                    Err(_) => false,
                };
                if ok {
                    sink.lock().unwrap().push(scheduled.elapsed().as_secs_f64() * 1e6);
                } else {
                    *errors.lock().unwrap() += 1;
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        let mut all: Vec<Vec<f64>> = sinks.iter().map(|s| s.lock().unwrap().clone()).collect();
        for v in &mut all {
            v.sort_by(|a, b| a.total_cmp(b));
        }
        let errors = *errors.lock().unwrap();
        (all, errors)
    });
    let (d, b, f) = (&all[0], &all[1], &all[2]);
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    println!(
        "proxy_latency: {rate} req/s, {seconds} s (rotating 1 s slices), {answer_bytes}-byte JSON answers, {cpus} CPUs, {errors} errors"
    );
    println!(
        "{:>8} {:>10} {:>10} {:>10} {:>11} {:>11} {:>14}",
        "pct", "direct µs", "bare µs", "full µs", "bare added", "full added", "detectors add"
    );
    let mut rows = Vec::new();
    for pct in [50.0, 90.0, 99.0, 99.9] {
        let (x, y, z) = (percentile(d, pct), percentile(b, pct), percentile(f, pct));
        println!(
            "{:>8} {:>10.0} {:>10.0} {:>10.0} {:>11.0} {:>11.0} {:>14.0}",
            format!("p{pct}"),
            x,
            y,
            z,
            y - x,
            z - x,
            z - y
        );
        rows.push(serde_json::json!({
            "percentile": pct, "direct_us": x, "bare_us": y, "full_us": z,
            "bare_added_us": y - x, "full_added_us": z - x,
        }));
    }
    let scanned = metrics.scanned.with_label_values(&["openai"]).get();
    println!(
        "requests: direct {}, bare {}, full {} (full scanned {scanned})",
        d.len(),
        b.len(),
        f.len()
    );
    let report = serde_json::json!({
        "rate": rate, "seconds": seconds, "answer_bytes": answer_bytes, "cpus": cpus, "errors": errors,
        "direct": d.len(), "bare": b.len(), "full": f.len(), "scanned": scanned, "percentiles": rows,
    });
    let out =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-proxy-latency.json");
    let _ = std::fs::write(&out, serde_json::to_vec_pretty(&report).unwrap());
}
