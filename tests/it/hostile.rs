//! Hostile and broken input, from clients and from upstreams: residue never
//! panics, never alters what it forwards, and answers its own errors in the
//! family's shape, naming itself.

use std::io::Write;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;

use crate::support::{self, call, client, send, FakeUpstream, Reply};

const CHAT: &str = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
const ANSWER: &str = r#"{"choices":[{"index":0,"message":{"content":"Grüße aus 東京"}}],"usage":{"prompt_tokens":3}}"#;

#[tokio::test]
async fn malformed_and_non_json_requests_are_forwarded_untouched() {
    let upstream = FakeUpstream::start(|_| Reply::json("{}")).await;
    let (residue, _) = support::start(support::config(&upstream.url())).await;
    let bodies: Vec<Vec<u8>> = vec![
        b"{\"messages\": [".to_vec(),
        b"not json at all".to_vec(),
        b"".to_vec(),
        b"[1,2,3]".to_vec(),
        vec![b'{', b'"', 0xff, 0xfe, b'"', b':', b'1', b'}'],
        format!("{}{}", "[".repeat(5_000), "]".repeat(5_000)).into_bytes(),
    ];
    for body in &bodies {
        let req = Request::post(format!("http://{}/v1/chat/completions", residue.addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.clone())))
            .unwrap();
        let (status, _, _) = send(&client(), req).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(&upstream.last().body[..], &body[..]);
    }
    // Wrong content type: not parsed at all.
    let req = Request::post(format!("http://{}/v1/chat/completions", residue.addr))
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from(CHAT)))
        .unwrap();
    let (status, _, _) = send(&client(), req).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&upstream.last().body[..], CHAT.as_bytes());
    // Invalid UTF-8 inside a JSON string is read lossily (and scanned); the
    // rest cannot be read as a request and is counted by reason.
    for (reason, want) in [("request_not_json", 5.0), ("request_shape", 1.0)] {
        let got = support::metric(
            residue.admin_addr,
            "residue_unscanned_total",
            &[("reason", reason)],
        )
        .await;
        assert_eq!(got, want, "{reason}");
    }
    residue.shutdown().await.unwrap();
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn brotli(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
        w.write_all(data).unwrap();
    }
    out
}

fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).unwrap()
}

#[tokio::test]
async fn encoded_responses_are_forwarded_as_they_came_and_decoded_for_scanning() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("gzip", gzip(ANSWER.as_bytes())),
        ("br", brotli(ANSWER.as_bytes())),
        ("zstd", zstd(ANSWER.as_bytes())),
    ];
    for (encoding, encoded) in cases {
        let chunks: Vec<Bytes> = encoded.chunks(5).map(Bytes::copy_from_slice).collect();
        let reply = Reply::stream("application/json", chunks).header("content-encoding", encoding);
        let upstream = FakeUpstream::start(move |_| reply.clone()).await;
        let (residue, recorder) = support::start(support::config(&upstream.url())).await;
        let (status, headers, body) = call(
            residue.addr,
            "/v1/chat/completions",
            &[("accept-encoding", encoding)],
            CHAT,
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["content-encoding"], encoding);
        assert_eq!(&body[..], &encoded[..], "{encoding}: forwarded bytes");
        let seen = recorder.one().await;
        assert_eq!(seen.output, "Grüße aus 東京", "{encoding}");
        assert_eq!(seen.usage.prompt_tokens, Some(3));
        residue.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn broken_responses_are_forwarded_unchanged() {
    let bodies: Vec<(&str, &str, Vec<u8>, &str)> = vec![
        ("application/json", "identity", b"{\"choices\": [".to_vec(), "malformed"),
        ("text/event-stream", "identity", vec![b'd', b'a', b't', b'a', b':', b' ', 0xff, 0xc3, b'\n', b'\n'], "malformed"),
        ("text/event-stream", "identity", b"data: {\"choices\":[{\"delta\":{\"content\":5}}]}\n\ndata: [DONE]\n\ndata: garbage\n\n".to_vec(), "malformed"),
        ("application/json", "gzip", b"this is not gzip".to_vec(), "corrupt_encoding"),
        ("application/json", "compress", b"lzw?".to_vec(), "unsupported_encoding"),
    ];
    for (ct, encoding, bytes, reason) in bodies {
        let reply = Reply::stream(ct, vec![Bytes::from(bytes.clone())])
            .header("content-encoding", encoding);
        let upstream = FakeUpstream::start(move |_| reply.clone()).await;
        let (residue, recorder) = support::start(support::config(&upstream.url())).await;
        let (status, _, body) = call(residue.addr, "/v1/chat/completions", &[], CHAT).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(&body[..], &bytes[..]);
        recorder.one().await;
        let counted = support::metric(
            residue.admin_addr,
            "residue_scan_errors_total",
            &[("reason", reason)],
        )
        .await;
        assert_eq!(counted, 1.0, "{ct} {encoding}: {reason} not counted");
        residue.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn oversize_bodies_get_a_clear_413() {
    let upstream = FakeUpstream::start(|_| Reply::json("{}")).await;
    let mut config = support::config(&upstream.url());
    config.server.max_request_bytes = 1_000;
    let (residue, _) = support::start(config).await;
    let big = serde_json::json!({"messages": [{"role": "user", "content": "x".repeat(5_000)}]})
        .to_string();
    let (status, headers, body) = call(residue.addr, "/v1/chat/completions", &[], &big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(headers["x-residue-error"], "request_too_large");
    let err: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        err["error"]["message"],
        "residue: the request body is larger than 1000 bytes (server.max-request-bytes)"
    );
    assert_eq!(upstream.count(), 0);
    // Chunked (no content-length) is capped too.
    let stream =
        futures_util::stream::iter((0..10).map(|_| {
            Ok::<_, std::io::Error>(hyper::body::Frame::data(Bytes::from(vec![b' '; 500])))
        }));
    let req = Request::post(format!("http://{}/api/chat", residue.addr))
        .header("content-type", "application/json")
        .body(http_body_util::StreamBody::new(stream))
        .unwrap();
    let resp = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http()
        .request(req)
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn upstream_refused_is_502_and_timeout_is_504_in_each_family_shape() {
    // A port with nothing behind it.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let (residue, _) = support::start(support::config(&format!("http://{closed}"))).await;
    let (status, headers, body) =
        call(residue.addr, "/v1/messages", &[], r#"{"messages":[]}"#).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(headers["x-residue-error-source"], "upstream");
    let err: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(err["type"], "error", "anthropic shape: {err}");
    assert_eq!(err["error"]["type"], "upstream_unreachable");
    assert_eq!(err["error"]["source"], "residue");
    let (status, _, body) = call(residue.addr, "/api/chat", &[], r#"{"messages":[]}"#).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    let err: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(
        err["error"].as_str().unwrap().starts_with("residue: "),
        "ollama shape: {err}"
    );
    residue.shutdown().await.unwrap();

    // An upstream that accepts and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let mut config = support::config(&format!("http://{silent_addr}"));
    config.upstream.response_timeout = Duration::from_millis(300);
    let (residue, _) = support::start(config).await;
    let (status, headers, body) = call(residue.addr, "/v1/chat/completions", &[], CHAT).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(headers["x-residue-error"], "upstream_timeout");
    let err: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        err["error"]["type"], "upstream_timeout",
        "openai shape: {err}"
    );
    assert_eq!(err["error"]["source"], "residue");
    let (status, _, body) = call(
        residue.addr,
        "/client/v4/accounts/a/ai/run/@cf/m",
        &[],
        r#"{"prompt":"x"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    let err: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(err["success"], false, "cloudflare shape: {err}");
    residue.shutdown().await.unwrap();
    hold.abort();
}

#[tokio::test]
async fn a_stalled_stream_is_cut_after_the_idle_timeout() {
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let mut reply = Reply::stream(
        "text/event-stream",
        vec![Bytes::from("data: {}\n\n"), Bytes::from("data: {}\n\n")],
    );
    reply.gate = Some(gate.clone());
    let upstream = FakeUpstream::start(move |_| reply.clone()).await;
    let mut config = support::config(&upstream.url());
    config.upstream.idle_timeout = Duration::from_millis(200);
    let (residue, recorder) = support::start(config).await;
    let req = Request::post(format!("http://{}/v1/chat/completions", residue.addr))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(r#"{"stream":true,"messages":[]}"#)))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let result = tokio::time::timeout(
        Duration::from_secs(5),
        http_body_util::BodyExt::collect(resp.into_body()),
    )
    .await
    .expect("cut off well before 5 s");
    assert!(
        result.is_err(),
        "a cut stream must not look complete to the client"
    );
    assert_eq!(recorder.one().await.end, "idle_timeout");
    residue.shutdown().await.unwrap();
}
