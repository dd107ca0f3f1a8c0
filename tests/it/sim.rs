//! `residue sim` over HTTP: every endpoint, streamed and not, read back
//! through residue's own decoder; the placeholder leak end to end with its
//! ground truth; hostile requests.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::{json, Value};

use residue::protocol::{BodyFormat, Endpoint, Output, ResponseDecoder};
use residue::scenario::{Fault, Truth, REQUEST_ID_HEADER, TENANT_HEADER};
use residue::sim::{self, RunningSim, SimConfig};

use crate::support::{call, client, send};

async fn start(config: SimConfig) -> RunningSim {
    sim::start(SimConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        token_delay: Duration::from_millis(1),
        ..config
    })
    .await
    .expect("the simulator starts")
}

/// Words only `tenant` sends, a full stop every 7.
fn words(tenant: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("{tenant}w{i}{}", if i % 7 == 6 { "." } else { "" }))
        .collect::<Vec<_>>()
        .join(" ")
}

fn body(path: &str, prompt: &str, stream: bool) -> Value {
    match path {
        "/v1/chat/completions" => json!({
            "model": "m", "stream": stream,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": prompt}],
        }),
        "/v1/completions" => json!({"model": "m", "stream": stream, "prompt": prompt,
                                    "stream_options": {"include_usage": true}}),
        _ => json!({"text": prompt, "stream": stream, "sampling_params": {"max_new_tokens": 64}}),
    }
}

fn endpoint(path: &str) -> Endpoint {
    match path {
        "/v1/chat/completions" => Endpoint::OpenAiChat,
        "/v1/completions" => Endpoint::OpenAiCompletions,
        _ => Endpoint::SglangGenerate,
    }
}

/// Asks as `tenant` and decodes the answer the way residue does.
async fn ask(
    sim: &RunningSim,
    path: &str,
    tenant: &str,
    id: &str,
    prompt: &str,
    stream: bool,
) -> Output {
    let (status, headers, bytes) = call(
        sim.addr,
        path,
        &[(TENANT_HEADER, tenant), (REQUEST_ID_HEADER, id)],
        &body(path, prompt, stream).to_string(),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    assert_eq!(headers[REQUEST_ID_HEADER], id);
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok());
    let format = BodyFormat::detect(content_type, endpoint(path), stream);
    assert_eq!(
        format,
        if stream {
            BodyFormat::Sse
        } else {
            BodyFormat::Json
        }
    );
    let mut decoder = ResponseDecoder::new(endpoint(path), format, 1 << 20);
    let mut out = Output::default();
    // Byte by byte for a stream: the decoder must not care how it is cut.
    if stream {
        for b in bytes.chunks(7) {
            decoder.push(b, &mut out);
        }
    } else {
        decoder.push(&bytes, &mut out);
    }
    decoder.finish(&mut out);
    assert_eq!(out.malformed, 0, "{}", String::from_utf8_lossy(&bytes));
    out
}

const PATHS: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/generate"];

#[tokio::test]
async fn streamed_and_whole_answers_decode_alike() {
    // Two simulators with one seed, asked the same things in the same order,
    // answer alike: one is asked for whole bodies, the other for streams.
    let whole = start(SimConfig {
        seed: 11,
        ..SimConfig::default()
    })
    .await;
    let streamed = start(SimConfig {
        seed: 11,
        ..SimConfig::default()
    })
    .await;
    for (i, path) in PATHS.iter().enumerate() {
        let prompt = format!("How do I repot a fern? {}", words("t1", 20 + i));
        let id = format!("req-{i}");
        let a = ask(&whole, path, "t1", &id, &prompt, false).await;
        let b = ask(&streamed, path, "t1", &id, &prompt, true).await;
        assert!(
            a.text.contains("How do I repot a fern?"),
            "{path}: {}",
            a.text
        );
        assert_eq!(a.text, b.text, "{path}");
        assert!(a.usage.prompt_tokens.is_some_and(|n| n > 20), "{path}");
        assert_eq!(a.usage.prompt_tokens, b.usage.prompt_tokens, "{path}");
        assert_eq!(
            a.usage.completion_tokens, b.usage.completion_tokens,
            "{path}"
        );
        assert_eq!(b.usage.finish_reason.as_deref(), Some("stop"), "{path}");
    }
    for (sim, stream) in [(&whole, false), (&streamed, true)] {
        let truth = sim.truth.records();
        let got: Vec<_> = truth
            .iter()
            .map(|t| {
                (
                    t.request_id.as_str(),
                    t.endpoint.as_str(),
                    t.stream,
                    t.fault,
                    t.leaked,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("req-0", "chat", stream, None, false),
                ("req-1", "completions", stream, None, false),
                ("req-2", "generate", stream, None, false),
            ]
        );
        assert!(truth.iter().all(|t| t.tenant == "t1"));
    }
    whole.shutdown().await;
    streamed.shutdown().await;
}

#[tokio::test]
async fn placeholder_leak_end_to_end() {
    let path = std::env::temp_dir().join(format!("residue-sim-truth-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let sim = start(SimConfig {
        seed: 3,
        prefill_capacity_tokens: 50,
        faults: vec![(Fault::Placeholder, 1.0)],
        truth_path: Some(path.clone()),
        ..SimConfig::default()
    })
    .await;
    let a_prompt = words("t0", 60);
    let a = ask(&sim, "/v1/chat/completions", "t0", "a-1", &a_prompt, false).await;
    // A's pages become stale once its answer was delivered (plus a grace
    // for the proxy in front to read it).
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    for (i, p) in PATHS.iter().enumerate() {
        for stream in [false, true] {
            let id = format!("b-{i}-{stream}");
            let b_prompt = words("t1", 80);
            let out = ask(&sim, p, "t1", &id, &b_prompt, stream).await;
            assert_eq!(out.usage.prompt_tokens, Some(1), "{p} {stream}");
            let truth = sim.truth.records().pop().unwrap();
            assert_eq!(
                (truth.fault, truth.leaked),
                (Some(Fault::Placeholder), true)
            );
            // Counted in subword tokens; chat adds its system prompt.
            let real = if i == 0 {
                residue::sim::text::subword_count(&format!("Be brief.\n{b_prompt}"))
            } else {
                residue::sim::text::subword_count(&b_prompt)
            };
            assert_eq!(
                (truth.prompt_tokens_reported, truth.prompt_tokens_real),
                (1, real)
            );
            assert_eq!(truth.source_tenant.as_deref(), Some("t0"));
            let (s, e) = truth.span.unwrap();
            let fragment = &out.text[s..e];
            assert!(
                a_prompt.contains(fragment) || a.text.contains(fragment),
                "{fragment}"
            );
            assert!(truth.leaked_words >= 20);
        }
    }
    sim.shutdown().await;
    let file = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<Truth> = file
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 7);
    assert!(
        !file.contains("t0w") && !file.contains("t1w"),
        "raw text in the ground truth"
    );
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn hostile_requests_get_clear_errors() {
    let sim = start(SimConfig::default()).await;
    let post = |path: &str, body: &'static [u8]| {
        Request::post(format!("http://{}{path}", sim.addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body)))
            .unwrap()
    };
    let cases = [
        (
            post("/v1/chat/completions", b"{\"messages\": ["),
            StatusCode::BAD_REQUEST,
            "JSON",
        ),
        (
            post("/v1/chat/completions", b"{\"messages\": \"\xff\"}"),
            StatusCode::BAD_REQUEST,
            "UTF-8",
        ),
        (
            post("/v1/completions", b"{}"),
            StatusCode::BAD_REQUEST,
            "prompt",
        ),
        (
            post("/generate", b"{\"sampling_params\": {}}"),
            StatusCode::BAD_REQUEST,
            "text",
        ),
        (post("/v1/models", b"{}"), StatusCode::NOT_FOUND, "no route"),
        (
            Request::get(format!("http://{}/generate", sim.addr))
                .body(Full::new(Bytes::new()))
                .unwrap(),
            StatusCode::METHOD_NOT_ALLOWED,
            "POST",
        ),
    ];
    for (req, want, needle) in cases {
        let (status, _, bytes) = send(&client(), req).await;
        let text = String::from_utf8_lossy(&bytes);
        assert_eq!(status, want, "{text}");
        let v: Value = serde_json::from_slice(&bytes).expect("a JSON error body");
        assert!(v.to_string().contains(needle), "{text}");
    }
    // A huge prompt is answered, not refused.
    let huge = words("t9", 300_000);
    let out = ask(&sim, "/generate", "t9", "huge", &huge, false).await;
    assert_eq!(
        out.usage.prompt_tokens,
        Some(residue::sim::text::subword_count(&huge))
    );
    assert_eq!(sim.truth.len(), 1, "errors write no ground truth");
    sim.shutdown().await;
}

#[test]
fn cli_refuses_bad_faults_with_the_reason() {
    let bin = env!("CARGO_BIN_EXE_residue");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(bin)
            .arg("sim")
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, err) = run(&["--fault", "leak=0.1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("unknown fault \"leak\""), "{err}");
    let (code, err) = run(&["--fault", "splice=0.7", "--fault", "garbage=0.7"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("sum to"), "{err}");
}
