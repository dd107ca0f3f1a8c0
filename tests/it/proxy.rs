//! The forwarding path: streaming, cancellation, protocols, request ids,
//! unknown routes, the admin port and graceful shutdown.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::sync::Notify;

use crate::support::{self, call, client, send, FakeUpstream, Reply};

fn chat_stream_request() -> &'static str {
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"Count to three."}]}"#
}

/// A streaming chat request to residue at `addr`.
fn stream_request(addr: std::net::SocketAddr) -> Request<Full<Bytes>> {
    Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat_stream_request())))
        .unwrap()
}

fn chat_events(n: usize) -> Vec<Bytes> {
    (0..n)
        .map(|i| {
            Bytes::from(format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{i} \"}}}}]}}\n\n"
            ))
        })
        .collect()
}

#[tokio::test]
async fn first_sse_event_reaches_the_client_before_the_upstream_finishes() {
    let gate = Arc::new(Notify::new());
    let mut reply = Reply::stream("text/event-stream", chat_events(3));
    reply.gate = Some(gate.clone());
    let upstream = FakeUpstream::start(move |_| reply.clone()).await;
    let (residue, recorder) = support::start(support::config(&upstream.url())).await;

    let req = stream_request(residue.addr);
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    // The upstream holds every event after the first until the gate opens;
    // the gate opens only once the client has the first one. A proxy that
    // buffered would time out here.
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("the first event arrives while the upstream is still streaming")
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert!(first.starts_with(b"data: "), "{first:?}");
    assert_eq!(
        upstream.completed.load(Ordering::SeqCst),
        0,
        "upstream not finished yet"
    );
    let mut rest = first.to_vec();
    for _ in 0..10 {
        gate.notify_one();
        match tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .unwrap()
        {
            Some(f) => rest.extend_from_slice(&f.unwrap().into_data().unwrap_or_default()),
            None => break,
        }
    }
    let expected: Vec<u8> = chat_events(3).iter().flat_map(|b| b.to_vec()).collect();
    assert_eq!(rest, expected);
    assert_eq!(recorder.one().await.output, "0 1 2 ");
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_cancels_the_upstream_request() {
    let mut reply = Reply::stream("text/event-stream", chat_events(400));
    reply.delay = Duration::from_millis(20);
    let upstream = FakeUpstream::start(move |_| reply.clone()).await;
    let (residue, recorder) = support::start(support::config(&upstream.url())).await;

    let req = stream_request(residue.addr);
    let resp = client().request(req).await.unwrap();
    let mut body = resp.into_body();
    body.frame().await.unwrap().unwrap();
    drop(body);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !upstream.cancelled.load(Ordering::SeqCst) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the upstream kept streaming to nobody"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(upstream.completed.load(Ordering::SeqCst), 0);
    // The partial exchange is still scanned, and says how it ended.
    let seen = recorder.one().await;
    assert_eq!(seen.end, "cancelled");
    assert!(seen.output.starts_with("0 "), "{:?}", seen.output);
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn request_ids_are_honoured_generated_and_echoed() {
    let upstream = FakeUpstream::start(|_| Reply::json(r#"{"choices":[]}"#)).await;
    let (residue, recorder) = support::start(support::config(&upstream.url())).await;
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

    let (_, headers, _) = call(
        residue.addr,
        "/v1/chat/completions",
        &[("x-request-id", "req-42")],
        body,
    )
    .await;
    assert_eq!(headers["x-request-id"], "req-42");
    assert_eq!(upstream.last().headers["x-request-id"], "req-42");
    assert_eq!(recorder.one().await.request_id, "req-42");

    let (_, headers, _) = call(residue.addr, "/v1/chat/completions", &[], body).await;
    let generated = headers["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(generated.len(), 32);
    assert_eq!(upstream.last().headers["x-request-id"], generated.as_str());
    assert_eq!(recorder.wait_for(2).await[1].request_id, generated);
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn headers_pass_both_ways_and_hop_by_hop_headers_do_not() {
    let upstream = FakeUpstream::start(|_| {
        Reply::json("{}")
            .header("x-upstream", "yes")
            .header("set-cookie", "a=b")
    })
    .await;
    let (residue, _) = support::start(support::config(&upstream.url())).await;
    let (status, headers, _) = call(
        residue.addr,
        "/v1/whatever?x=1&y=2",
        &[
            ("x-custom", "v"),
            ("connection", "keep-alive, x-drop-me"),
            ("x-drop-me", "1"),
            ("authorization", "Bearer k"),
        ],
        "{}",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-upstream"], "yes");
    assert_eq!(headers["set-cookie"], "a=b");
    let got = upstream.last();
    assert_eq!(
        got.uri.path_and_query().unwrap().as_str(),
        "/v1/whatever?x=1&y=2"
    );
    assert_eq!(got.headers["x-custom"], "v");
    assert_eq!(got.headers["authorization"], "Bearer k");
    assert!(!got.headers.contains_key("x-drop-me"));
    assert_eq!(got.headers["host"], upstream.addr.to_string().as_str());
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn unknown_routes_and_methods_stream_through_unscanned() {
    let upstream = FakeUpstream::start(|r| {
        let mut reply = Reply::json(format!("{{\"you_sent\":{}}}", r.body.len()));
        reply.status = StatusCode::CREATED;
        reply
    })
    .await;
    let (residue, _) = support::start(support::config(&upstream.url())).await;
    let (status, _, body) = send(
        &client(),
        Request::get(format!("http://{}/v1/models", residue.addr))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(&body[..], b"{\"you_sent\":0}");
    let big = "x".repeat(100_000);
    let (_, _, body) = call(residue.addr, "/upload", &[], &big).await;
    assert_eq!(&body[..], b"{\"you_sent\":100000}");
    assert_eq!(
        support::metric(
            residue.admin_addr,
            "residue_unscanned_total",
            &[("reason", "unknown_route")]
        )
        .await,
        2.0
    );
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn http2_cleartext_clients_are_served() {
    let upstream =
        FakeUpstream::start(|_| Reply::json(r#"{"choices":[{"message":{"content":"h2 ok"}}]}"#))
            .await;
    let (residue, recorder) = support::start(support::config(&upstream.url())).await;
    let req = Request::post(format!("http://{}/v1/chat/completions", residue.addr))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            r#"{"messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap();
    let resp = support::h2_client().request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        &body[..],
        br#"{"choices":[{"message":{"content":"h2 ok"}}]}"#
    );
    assert_eq!(recorder.one().await.output, "h2 ok");
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn h2c_to_the_upstream_when_configured() {
    let upstream = FakeUpstream::start(|_| Reply::json("{}")).await;
    let mut config = support::config(&upstream.url());
    config.upstream.h2c = true;
    let (residue, _) = support::start(config).await;
    let (status, _, _) = call(residue.addr, "/anything", &[], "{}").await;
    assert_eq!(status, StatusCode::OK);
    // The fake upstream serves both; HTTP/2 requests carry no Host header
    // but an authority in the URI.
    assert_eq!(
        upstream.last().uri.authority().map(|a| a.to_string()),
        Some(upstream.addr.to_string())
    );
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn admin_port_serves_metrics_health_and_readiness() {
    let upstream = FakeUpstream::start(|_| Reply::json("{}")).await;
    let (residue, _) = support::start(support::config(&upstream.url())).await;
    call(
        residue.addr,
        "/v1/chat/completions",
        &[],
        r#"{"messages":[]}"#,
    )
    .await;
    for (path, want) in [
        ("/healthz", StatusCode::OK),
        ("/readyz", StatusCode::OK),
        ("/nope", StatusCode::NOT_FOUND),
    ] {
        let (status, _, _) = send(
            &client(),
            Request::get(format!("http://{}{path}", residue.admin_addr))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
        assert_eq!(status, want, "{path}");
    }
    assert_eq!(
        support::metric(
            residue.admin_addr,
            "residue_requests_total",
            &[("family", "openai"), ("status", "200")]
        )
        .await,
        1.0
    );
    let (_, _, text) = send(
        &client(),
        Request::get(format!("http://{}/metrics", residue.admin_addr))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    let text = String::from_utf8_lossy(&text);
    for name in [
        "residue_upstream_ttfb_seconds",
        "residue_upstream_duration_seconds",
        "residue_added_latency_seconds",
        "residue_bytes_total",
        "residue_in_flight_requests",
        "residue_scan_queue_depth",
        "residue_build_info",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics");
    }
    // The proxy port does not serve the admin endpoints: they go upstream.
    call(residue.addr, "/metrics", &[], "").await;
    assert_eq!(upstream.last().uri.path(), "/metrics");
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_lets_in_flight_streams_finish() {
    let mut reply = Reply::stream("text/event-stream", chat_events(20));
    reply.delay = Duration::from_millis(20);
    let upstream = FakeUpstream::start(move |_| reply.clone()).await;
    let (residue, _) = support::start(support::config(&upstream.url())).await;
    let addr = residue.addr;
    let req = stream_request(addr);
    let resp = client().request(req).await.unwrap();
    let reader =
        tokio::spawn(async move { resp.into_body().collect().await.map(|c| c.to_bytes()) });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stopped = tokio::spawn(residue.shutdown());
    let body = reader
        .await
        .unwrap()
        .expect("the stream completes during the drain");
    let expected: Vec<u8> = chat_events(20).iter().flat_map(|b| b.to_vec()).collect();
    assert_eq!(&body[..], &expected[..]);
    stopped.await.unwrap().unwrap();
    // New connections are refused once stopped.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn trailers_pass_through() {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-checksum", "abc123".parse().unwrap());
    let mut reply = Reply::stream(
        "application/octet-stream",
        vec![Bytes::from("part one "), Bytes::from("part two")],
    );
    reply.trailers = Some(trailers);
    let reply = reply.header("trailer", "x-checksum");
    let upstream = FakeUpstream::start(move |_| reply.clone()).await;
    let (residue, _) = support::start(support::config(&upstream.url())).await;
    for http2 in [false, true] {
        let req = Request::post(format!("http://{}/files", residue.addr))
            .header("te", "trailers")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let c = if http2 {
            support::h2_client()
        } else {
            client()
        };
        let resp = c.request(req).await.unwrap();
        let collected = resp.into_body().collect().await.unwrap();
        let got = collected.trailers().cloned();
        assert_eq!(&collected.to_bytes()[..], b"part one part two");
        assert_eq!(
            got.as_ref()
                .and_then(|t| t.get("x-checksum"))
                .map(|v| v.to_str().unwrap()),
            Some("abc123"),
            "http2={http2}"
        );
    }
    residue.shutdown().await.unwrap();
}
