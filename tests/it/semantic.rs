//! The semantic detectors end to end, with the real all-MiniLM-L6-v2 in
//! the default (`auto`: cascade on the CPU) tier: a paraphrased leak is an
//! incident naming its source; with `semantic.enforce` under `block` it is
//! refused; the answer itself is never altered in monitor mode.

use std::path::PathBuf;
use std::sync::Arc;

use residue::incident::Incident;

use crate::support::{self, call, FakeUpstream, Reply};

const A_PROMPT: &str = "Our quarterly revenue at the Lisbon bakery chain dropped after we raised croissant prices by fifteen percent. Should we roll back the price increase, or launch a loyalty card to win customers back?";
const B_PROMPT: &str = "Translate this maintenance log for the hydraulic press into German: the seal on cylinder three was replaced, the pressure test passed at two hundred bar, and the next inspection is due in June.";
const LEAKED: &str = "Since sales at your Portuguese pastry shops fell once the croissants became 15% more expensive, I would not simply undo the pricing change. A rewards programme for regular buyers can bring footfall back while protecting your margin; pilot it in two stores for a month, then decide whether the higher price should stay.";
const A_ANSWER: &str = "Before rolling the price back, compare how many regulars you lost with the margin the higher price brings in; a loyalty card often wins them back more cheaply than a price cut.";

fn model() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/all-MiniLM-L6-v2");
    let ok = dir.join("model.safetensors").is_file();
    if !ok {
        if std::env::var("RESIDUE_REQUIRE_ALL").as_deref() == Ok("1") {
            panic!("all-MiniLM-L6-v2 is required (RESIDUE_REQUIRE_ALL=1) but missing; run models/fetch");
        }
        eprintln!("\n!!!!! SKIPPED: all-MiniLM-L6-v2 is not installed; run models/fetch or this test proves nothing !!!!!\n");
    }
    ok.then_some(dir)
}

/// The upstream answers tenant-a honestly and gives tenant-b the answer to
/// tenant-a's question (the placeholder incident).
fn upstream() -> impl Fn(&support::Received) -> Reply + Send + Sync + 'static {
    |r| {
        let b = r
            .headers
            .get("x-tenant-id")
            .is_some_and(|v| v.as_bytes() == b"tenant-b");
        let answer = if b { LEAKED } else { A_ANSWER };
        Reply::json(
            serde_json::json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}],
                "usage": {"prompt_tokens": 40, "completion_tokens": 60}})
            .to_string(),
        )
    }
}

async fn ask(residue: &residue::Running, tenant: &str, text: &str) -> (u16, String) {
    let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": text}]})
        .to_string();
    let (status, _, body) = call(
        residue.addr,
        "/v1/chat/completions",
        &[("x-tenant-id", tenant)],
        &body,
    )
    .await;
    (status.as_u16(), String::from_utf8_lossy(&body).into_owned())
}

async fn start(dir: PathBuf, enforce: bool) -> (FakeUpstream, residue::Running, support::Recorder) {
    start_with(dir, enforce, enforce).await
}

async fn start_with(
    dir: PathBuf,
    enforce: bool,
    block: bool,
) -> (FakeUpstream, residue::Running, support::Recorder) {
    let upstream = FakeUpstream::start(upstream()).await;
    let mut config = support::config(&upstream.url());
    config.tenant.trust_header = true;
    config.incidents.raw_tenant = true;
    config.semantic.enabled = true;
    config.semantic.model = dir;
    // Other tests share these two cores: a slow confirmation must not be
    // dropped as a timeout here.
    config.semantic.timeout = std::time::Duration::from_secs(60);
    config.semantic.enforce = enforce;
    if block {
        config.action.default = residue::config::Action::Block;
    }
    let (residue, recorder) = support::start(config).await;
    (upstream, residue, recorder)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paraphrased_leak_is_an_incident_naming_its_source_and_the_answer_is_untouched() {
    let Some(dir) = model() else { return };
    let (_up, residue, recorder) = start(dir, false).await;
    let mut live = residue.incidents.subscribe();
    let (status, _) = ask(&residue, "tenant-a", A_PROMPT).await;
    assert_eq!(status, 200);
    let (status, body) = ask(&residue, "tenant-b", B_PROMPT).await;
    assert_eq!(status, 200);
    assert!(
        body.contains("rewards programme"),
        "monitor mode alters nothing"
    );
    recorder.wait_for(2).await;
    let incident = wait_for_detector(&mut live, "semantic_leak").await;
    assert_eq!(incident.tenant, "tenant-b");
    assert_eq!(incident.evidence["source_tenant"], "tenant-a");
    assert_eq!(incident.action, "monitor");
    // No text of either prompt or answer in the incident.
    let json = serde_json::to_string(&*incident).unwrap();
    assert!(
        !json.contains("croissant") && !json.contains("Lisbon"),
        "{json}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_enforce_a_semantic_leak_is_blocked() {
    let Some(dir) = model() else { return };
    let (_up, residue, _recorder) = start(dir, true).await;
    let mut live = residue.incidents.subscribe();
    let (status, body) = ask(&residue, "tenant-a", A_PROMPT).await;
    assert_eq!(status, 200, "{body}");
    // Under block, prompts are recorded before forwarding: no wait needed.
    let (status, body) = ask(&residue, "tenant-b", B_PROMPT).await;
    assert_ne!(status, 200, "{body}");
    assert!(!body.contains("rewards programme"));
    let incident = wait_for_detector(&mut live, "semantic_leak").await;
    assert_eq!(incident.action, "block");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_block_without_enforce_a_semantic_leak_passes_and_is_reported() {
    let Some(dir) = model() else { return };
    let (_up, residue, _recorder) = start_with(dir, false, true).await;
    let mut live = residue.incidents.subscribe();
    assert_eq!(ask(&residue, "tenant-a", A_PROMPT).await.0, 200);
    let (status, body) = ask(&residue, "tenant-b", B_PROMPT).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("rewards programme"));
    // Checked off the path, after the answer went out.
    let incident = wait_for_detector(&mut live, "semantic_leak").await;
    assert_eq!(incident.action, "monitor");
    assert_eq!(incident.evidence["source_tenant"], "tenant-a");
}

async fn wait_for_detector(
    live: &mut tokio::sync::broadcast::Receiver<Arc<Incident>>,
    detector: &str,
) -> Arc<Incident> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut others = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, live.recv()).await {
            Ok(Ok(i)) if i.detector == detector => return i,
            Ok(Ok(i)) => others.push(i),
            other => panic!("no {detector} incident ({other:?}); others: {others:#?}"),
        }
    }
}
