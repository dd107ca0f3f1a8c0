//! Block and redact: the client never receives leaked bytes.

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Full};

use crate::support::{self, call, FakeUpstream, Reply};
use residue::config::{Action, TenantAction};

const A_PROMPT: &str = "Draft a letter: the Halvorsen Maritime merger closes on the ninth of March and the purchase price stays at four hundred million kroner. Contact jane.doe@halvorsen.example.";
const FRAGMENT: &str = "the Halvorsen Maritime merger closes on the ninth of March and the purchase price stays at four hundred million kroner";

fn chat(stream: bool, text: &str) -> String {
    serde_json::json!({"model": "m", "stream": stream, "messages": [{"role": "user", "content": text}]}).to_string()
}

/// The upstream answers tenant-b with `answer`, everyone else with "Noted.".
async fn upstream(answer: String) -> FakeUpstream {
    FakeUpstream::start(move |r| {
        let for_b = r.headers.get("x-tenant-id").map(|v| v == "tenant-b").unwrap_or(false);
        let text = if for_b { answer.clone() } else { "Noted.".to_string() };
        let req: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        if req["stream"].as_bool() == Some(true) {
            let words: Vec<String> = text.split_inclusive(' ').map(str::to_string).collect();
            let mut chunks: Vec<Bytes> = words
                .iter()
                .map(|w| Bytes::from(format!("data: {}\n\n", serde_json::json!({"choices": [{"index": 0, "delta": {"content": w}}]}))))
                .collect();
            chunks.push(Bytes::from("data: [DONE]\n\n"));
            let mut reply = Reply::stream("text/event-stream", chunks);
            reply.delay = std::time::Duration::from_millis(1);
            reply
        } else {
            Reply::json(serde_json::json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}).to_string())
        }
    })
    .await
}

fn config(upstream: &FakeUpstream, action: Action) -> residue::Config {
    let mut c = support::config(&upstream.url());
    c.tenant.trust_header = true;
    c.incidents.raw_tenant = true;
    c.action.tenants = vec![TenantAction {
        tenant: "tenant-b".into(),
        action,
    }];
    c
}

/// A chat request to residue as `tenant`.
async fn as_tenant(
    residue: &residue::Running,
    tenant: &str,
    body: &str,
) -> (StatusCode, http::HeaderMap, Bytes) {
    call(
        residue.addr,
        "/v1/chat/completions",
        &[("x-tenant-id", tenant)],
        body,
    )
    .await
}

fn lead_in() -> String {
    "Thanks for your question about baking bread at home. ".repeat(8)
}

#[tokio::test]
async fn block_replaces_a_leaking_answer_with_an_error() {
    let answer = format!("{} Also, {FRAGMENT}.", lead_in());
    let up = upstream(answer).await;
    let (residue, recorder) = support::start(config(&up, Action::Block)).await;
    let mut live = residue.incidents.subscribe();
    as_tenant(&residue, "tenant-a", &chat(false, A_PROMPT)).await;
    recorder.wait_for(1).await;
    let (status, headers, body) = as_tenant(&residue, "tenant-b", &chat(false, "Bread?")).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(headers["x-residue-error"], "answer_blocked");
    let text = String::from_utf8_lossy(&body);
    assert!(
        !text.contains("Halvorsen") && !text.contains("kroner"),
        "{text}"
    );
    let err: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cross_tenant_ngram"),
        "{err}"
    );
    let incident = live.recv().await.unwrap();
    assert_eq!(incident.action, "block");
    assert!(err["error"]["message"]
        .as_str()
        .unwrap()
        .contains(&incident.id));
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn block_cuts_a_leaking_stream_before_any_leaked_byte_is_sent() {
    let answer = format!(
        "{}Also, {FRAGMENT}. And some more text after it.",
        lead_in()
    );
    let up = upstream(answer.clone()).await;
    let (residue, recorder) = support::start(config(&up, Action::Block)).await;
    let mut live = residue.incidents.subscribe();
    as_tenant(&residue, "tenant-a", &chat(false, A_PROMPT)).await;
    recorder.wait_for(1).await;

    let req = http::Request::post(format!("http://{}/v1/chat/completions", residue.addr))
        .header("content-type", "application/json")
        .header("x-tenant-id", "tenant-b")
        .body(Full::new(Bytes::from(chat(true, "Bread?"))))
        .unwrap();
    let resp = support::client().request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let got = resp.into_body().collect().await.unwrap().to_bytes();
    let got = String::from_utf8_lossy(&got);
    // What the client read: the clean lead-in, then an error event; not one
    // word of the fragment, in the raw bytes or in the decoded text.
    let text: String = got
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert!(text.starts_with("Thanks for your question"), "{text}");
    for word in ["Halvorsen", "Maritime", "merger", "kroner"] {
        assert!(!got.contains(word), "leaked {word:?} to the client:\n{got}");
    }
    assert!(got.trim_end().ends_with('}'), "{got}");
    let last = got.trim_end().rsplit("data: ").next().unwrap();
    let err: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(err["error"]["type"], "cross_tenant_leak");
    assert!(
        !got.contains("[DONE]"),
        "a cut stream must not look complete"
    );
    let incident = live.recv().await.unwrap();
    assert_eq!(incident.action, "block");
    assert_eq!(incident.detector, "cross_tenant_ngram");
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn clean_answers_pass_block_mode_unchanged() {
    let answer = lead_in();
    let up = upstream(answer.clone()).await;
    let (residue, _) = support::start(config(&up, Action::Block)).await;
    as_tenant(&residue, "tenant-a", &chat(false, A_PROMPT)).await;
    for stream in [false, true] {
        let direct = call(
            up.addr,
            "/v1/chat/completions",
            &[("x-tenant-id", "tenant-b")],
            &chat(stream, "Bread?"),
        )
        .await;
        let proxied = as_tenant(&residue, "tenant-b", &chat(stream, "Bread?")).await;
        assert_eq!(proxied.0, StatusCode::OK);
        assert_eq!(proxied.2, direct.2, "stream={stream}");
    }
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn redact_masks_exactly_the_span() {
    let answer = "You can write to jane.doe@halvorsen.example for details.".to_string();
    let up = upstream(answer.clone()).await;
    let (residue, recorder) = support::start(config(&up, Action::Redact)).await;
    let mut live = residue.incidents.subscribe();
    as_tenant(&residue, "tenant-a", &chat(false, A_PROMPT)).await;
    recorder.wait_for(1).await;
    let (status, _, body) = as_tenant(&residue, "tenant-b", &chat(false, "Who?")).await;
    assert_eq!(status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let masked = "*".repeat("jane.doe@halvorsen.example".len());
    assert_eq!(
        v["choices"][0]["message"]["content"],
        format!("You can write to {masked} for details.")
    );
    let incident = live.recv().await.unwrap();
    assert_eq!(incident.action, "redact");
    assert_eq!(incident.detector, "cross_tenant_pii");
    residue.shutdown().await.unwrap();
}

/// A streamed chat answer as tenant-b: the raw bytes and the text the
/// client reassembles from the SSE events.
async fn stream_as_b(residue: &residue::Running, prompt: &str) -> (String, String) {
    let (status, _, body) = as_tenant(residue, "tenant-b", &chat(true, prompt)).await;
    assert_eq!(status, StatusCode::OK);
    let got = String::from_utf8_lossy(&body).into_owned();
    let text: String = got
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    (got, text)
}

#[tokio::test]
async fn redact_masks_exactly_the_span_in_a_stream() {
    let answer = format!(
        "{}You can write to jane.doe@halvorsen.example for details.",
        lead_in()
    );
    let up = upstream(answer.clone()).await;
    let (residue, recorder) = support::start(config(&up, Action::Redact)).await;
    let mut live = residue.incidents.subscribe();
    as_tenant(&residue, "tenant-a", &chat(false, A_PROMPT)).await;
    recorder.wait_for(1).await;
    let (got, text) = stream_as_b(&residue, "Who?").await;
    let masked = "*".repeat("jane.doe@halvorsen.example".len());
    assert_eq!(
        text,
        format!("{}You can write to {masked} for details.", lead_in())
    );
    assert!(!got.contains("halvorsen"), "{got}");
    assert!(
        got.ends_with("data: [DONE]\n\n"),
        "a masked stream ends normally: {got}"
    );
    let incident = live.recv().await.unwrap();
    assert_eq!(incident.action, "redact");
    assert_eq!(incident.detector, "cross_tenant_pii");
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn redact_masks_a_leaked_fragment_in_a_stream() {
    let answer = format!(
        "{}Also, {FRAGMENT}. And some more text after it.",
        lead_in()
    );
    let up = upstream(answer.clone()).await;
    let (residue, recorder) = support::start(config(&up, Action::Redact)).await;
    let mut live = residue.incidents.subscribe();
    as_tenant(&residue, "tenant-a", &chat(false, A_PROMPT)).await;
    recorder.wait_for(1).await;
    let (got, text) = stream_as_b(&residue, "Bread?").await;
    for word in ["Halvorsen", "Maritime", "merger", "purchase", "kroner"] {
        assert!(!got.contains(word), "leaked {word:?} to the client:\n{got}");
    }
    // The clean text around the fragment is there, as it was sent; the mask
    // keeps every space and the length of every word.
    assert!(text.starts_with(&format!("{}Also, ", lead_in())), "{text}");
    assert!(text.ends_with(". And some more text after it."), "{text}");
    assert_eq!(text.len(), answer.len(), "{text}");
    let unmasked = |t: &str| t.split(' ').filter(|w| !w.starts_with('*')).count();
    assert!(
        unmasked(&text) <= unmasked(&answer) - FRAGMENT.split(' ').count() + 1,
        "{text}"
    );
    assert!(got.ends_with("data: [DONE]\n\n"), "{got}");
    assert!(!got.contains("cross_tenant_leak"), "{got}");
    let incident = live.recv().await.unwrap();
    assert_eq!(incident.action, "redact");
    assert_eq!(incident.detector, "cross_tenant_ngram");
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn malformed_streams_in_redact_mode_fail_open_or_closed_as_configured() {
    // A leak, then an event that is not JSON and raw garbage, cut mid-way.
    let mut body = format!(
        "data: {}\n\n",
        serde_json::json!({"choices": [{"index": 0, "delta": {"content": "jane.doe@halvorsen.example"}}]})
    )
    .into_bytes();
    body.extend_from_slice(
        b"data: {\"choices\": [{\"delta\": {\"content\": \"x\n\ndata: \xff\xfe\"\\\r\r\n",
    );
    body.extend_from_slice(&[0x80, b'"', b'\\', b'\n', 0xc3, b'\n', b'\n']);
    let chunks: Vec<Bytes> = body.chunks(7).map(Bytes::copy_from_slice).collect();
    for fail_closed in [false, true] {
        let chunks = chunks.clone();
        let up = FakeUpstream::start(move |_| {
            let mut reply = Reply::stream("text/event-stream", chunks.clone());
            reply.delay = std::time::Duration::from_millis(1);
            reply
        })
        .await;
        let mut c = config(&up, Action::Redact);
        c.action.fail_closed = fail_closed;
        let (residue, recorder) = support::start(c).await;
        as_tenant(&residue, "tenant-a", &chat(false, A_PROMPT)).await;
        recorder.wait_for(1).await;
        let (status, _, got) = as_tenant(&residue, "tenant-b", &chat(true, "Who?")).await;
        assert_eq!(status, StatusCode::OK);
        let text = String::from_utf8_lossy(&got);
        if fail_closed {
            assert!(!text.contains("jane.doe"), "{text}");
            assert!(text.contains("cross_tenant_leak"), "{text}");
        } else {
            // Unreadable, so unchecked: passed as it came, as block mode does.
            assert_eq!(got, body, "{text}");
        }
        // Still serving.
        let (status, _, _) = as_tenant(&residue, "tenant-b", &chat(false, "Who?")).await;
        assert_eq!(status, StatusCode::OK);
        residue.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn answers_too_large_to_hold_fail_open_or_closed_as_configured() {
    let answer = lead_in();
    for fail_closed in [false, true] {
        let up = upstream(answer.clone()).await;
        let mut c = config(&up, Action::Block);
        c.observe.max_response_bytes = 64;
        c.action.fail_closed = fail_closed;
        let (residue, _) = support::start(c).await;
        let (status, _, _) = as_tenant(&residue, "tenant-b", &chat(false, "Bread?")).await;
        let outcome = if fail_closed {
            "fail_closed"
        } else {
            "fail_open"
        };
        assert_eq!(
            status,
            if fail_closed {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            }
        );
        assert_eq!(
            support::metric(
                residue.admin_addr,
                "residue_enforced_total",
                &[("outcome", outcome)]
            )
            .await,
            1.0
        );
        residue.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_retried_leak_is_blocked_again() {
    let answer = format!("{} Also, {FRAGMENT}.", lead_in());
    let up = upstream(answer).await;
    let (residue, recorder) = support::start(config(&up, Action::Block)).await;
    as_tenant(&residue, "tenant-a", &chat(false, A_PROMPT)).await;
    recorder.wait_for(1).await;
    for attempt in 0..3 {
        for stream in [false, true] {
            let (status, _, body) = as_tenant(&residue, "tenant-b", &chat(stream, "Bread?")).await;
            let text = String::from_utf8_lossy(&body);
            assert!(
                !text.contains("Halvorsen"),
                "attempt {attempt}, stream {stream}: leaked\n{text}"
            );
            if !stream {
                assert_eq!(status, StatusCode::BAD_GATEWAY);
            }
        }
    }
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_leak_of_long_tokens_is_held_back_by_tokens_not_bytes() {
    // Fifteen long identifiers: 400+ bytes, more than the 256-character
    // hold-back, but only 15 tokens.
    let ids: Vec<String> = (0..15)
        .map(|i| format!("halvorsen_maritime_ledger_entry_{i:04}_confidential"))
        .collect();
    let secret = ids.join(" ");
    let a_prompt = format!("Reconcile these entries: {secret}");
    let answer = format!("{}Here they are: {secret} and that is all.", lead_in());
    let up = upstream(answer).await;
    let (residue, recorder) = support::start(config(&up, Action::Block)).await;
    as_tenant(&residue, "tenant-a", &chat(false, &a_prompt)).await;
    recorder.wait_for(1).await;
    let (_, _, body) = as_tenant(&residue, "tenant-b", &chat(true, "Bread?")).await;
    let got = String::from_utf8_lossy(&body);
    assert!(
        !got.contains("halvorsen_maritime"),
        "leaked to the client:\n{got}"
    );
    assert!(got.contains("cross_tenant_leak"), "{got}");
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_stream_too_long_to_check_fails_closed_when_configured() {
    let answer = lead_in();
    let up = upstream(answer).await;
    let mut c = config(&up, Action::Block);
    c.observe.max_response_bytes = 200;
    c.action.fail_closed = true;
    let (residue, _) = support::start(c).await;
    let (status, _, body) = as_tenant(&residue, "tenant-b", &chat(true, "Bread?")).await;
    assert_eq!(status, StatusCode::OK);
    let got = String::from_utf8_lossy(&body);
    assert!(
        got.contains("cross_tenant_leak"),
        "a stream that cannot be checked is cut: {got}"
    );
    assert!(!got.contains("[DONE]"));
    assert_eq!(
        support::metric(
            residue.admin_addr,
            "residue_enforced_total",
            &[("outcome", "fail_closed")]
        )
        .await,
        1.0
    );
    residue.shutdown().await.unwrap();
}
