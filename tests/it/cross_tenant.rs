//! Cross-tenant detection end to end: tenant A's content in tenant B's
//! answer is an incident naming A; B's own content, content A and B share,
//! and clean traffic are not.

use std::time::Duration;

use bytes::Bytes;
use residue::incident::Incident;
use std::sync::Arc;

use crate::support::{self, call, FakeUpstream, Reply};

/// The fake upstream answers with the (hex-encoded) `x-test-answer` header,
/// so each test scripts its own leaks without them being part of the
/// requester's prompt.
fn scripted() -> impl Fn(&support::Received) -> Reply + Send + Sync + 'static {
    |r| {
        let req: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        let answer = r
            .headers
            .get("x-test-answer")
            .and_then(|v| hex::decode(v.as_bytes()).ok())
            .map(|b| String::from_utf8(b).unwrap())
            .unwrap_or_else(|| "Noted.".into());
        if req["stream"].as_bool() == Some(true) {
            // Split the answer into 3-character deltas: words, values and
            // multi-byte characters all end up cut across events.
            let chars: Vec<char> = answer.chars().collect();
            let mut chunks: Vec<Bytes> = chars
                .chunks(3)
                .map(|c| {
                    let delta: String = c.iter().collect();
                    Bytes::from(format!(
                        "data: {}\n\n",
                        serde_json::json!({"choices": [{"index": 0, "delta": {"content": delta}}]})
                    ))
                })
                .collect();
            chunks.push(Bytes::from("data: [DONE]\n\n"));
            Reply::stream("text/event-stream", chunks)
        } else {
            Reply::json(serde_json::json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}]}).to_string())
        }
    }
}

async fn setup() -> (FakeUpstream, residue::Running, support::Recorder) {
    let upstream = FakeUpstream::start(scripted()).await;
    let mut config = support::config(&upstream.url());
    config.tenant.trust_header = true;
    config.incidents.raw_tenant = true;
    let (residue, recorder) = support::start(config).await;
    (upstream, residue, recorder)
}

/// Asks as `tenant`; the prompt is `user`, and the scripted answer whatever
/// follows `ANSWER:` in it (which is cut from the prompt itself).
async fn ask(
    residue: &residue::Running,
    tenant: &str,
    system: Option<&str>,
    user: &str,
    stream: bool,
) -> Bytes {
    let (user, answer) = match user.split_once("ANSWER:") {
        Some((u, a)) => (u.trim(), Some(a.trim())),
        None => (user, None),
    };
    let answer_hex = answer.map(|a| hex::encode(a.as_bytes()));
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(serde_json::json!({"role": "system", "content": s}));
    }
    messages.push(serde_json::json!({"role": "user", "content": user}));
    let body =
        serde_json::json!({"model": "m", "stream": stream, "messages": messages}).to_string();
    let mut headers = vec![("x-tenant-id", tenant)];
    if let Some(h) = &answer_hex {
        headers.push(("x-test-answer", h.as_str()));
    }
    call(residue.addr, "/v1/chat/completions", &headers, &body)
        .await
        .2
}

/// Incidents reported until `n` exchanges were scanned.
async fn incidents_after(
    recorder: &support::Recorder,
    live: &mut tokio::sync::broadcast::Receiver<Arc<Incident>>,
    n: usize,
) -> Vec<Arc<Incident>> {
    recorder.wait_for(n).await;
    let mut out = Vec::new();
    while let Ok(i) = live.try_recv() {
        out.push(i);
    }
    out
}

const A_SECRET: &str = "Our merger with Halvorsen Maritime closes on the ninth of March and the purchase price stays at four hundred million kroner until the board signs off.";

#[tokio::test]
async fn a_fifteen_word_fragment_of_another_tenants_prompt_is_caught_and_names_the_source() {
    let (_up, residue, recorder) = setup().await;
    let mut live = residue.incidents.subscribe();
    ask(
        &residue,
        "tenant-a",
        None,
        &format!("Summarise this for me: {A_SECRET}"),
        false,
    )
    .await;
    // 15 words of A's prompt, spliced into an otherwise fine answer for B.
    let fragment =
        "with Halvorsen Maritime closes on the ninth of March and the purchase price stays at";
    assert_eq!(fragment.split_whitespace().count(), 15);
    let answer =
        format!("Sure, here is a cake recipe. Note: {fragment}. Preheat the oven to 180 degrees.");
    let body = ask(
        &residue,
        "tenant-b",
        None,
        &format!("How do I bake a cake? ANSWER: {answer}"),
        false,
    )
    .await;
    // Monitor mode: the answer goes out untouched.
    assert!(String::from_utf8_lossy(&body).contains(fragment));
    let incidents = incidents_after(&recorder, &mut live, 2).await;
    let ngram: Vec<_> = incidents
        .iter()
        .filter(|i| i.detector == "cross_tenant_ngram")
        .collect();
    assert_eq!(ngram.len(), 1, "{incidents:#?}");
    let i = ngram[0];
    assert_eq!(i.tenant, "tenant-b");
    assert_eq!(i.evidence["source_tenant"], "tenant-a");
    // The verified run covers (nearly) the whole fragment.
    assert!(
        i.evidence["longest_run_tokens"].as_u64().unwrap() >= 12,
        "{}",
        i.evidence
    );
    // Offsets point into the answer text at the fragment.
    let [start, end] = [
        i.evidence["offsets"][0][0].as_u64().unwrap() as usize,
        i.evidence["offsets"][0][1].as_u64().unwrap() as usize,
    ];
    assert!(
        answer[start..end].len() >= 20 && fragment.contains(&answer[start..end]),
        "{:?}",
        &answer[start..end]
    );
    // No raw text in the incident.
    let json = serde_json::to_string(&**i).unwrap();
    assert!(
        !json.contains("Halvorsen") && !json.contains("Maritime"),
        "{json}"
    );
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn quoting_your_own_prompt_is_not_a_leak() {
    let (_up, residue, recorder) = setup().await;
    let mut live = residue.incidents.subscribe();
    ask(
        &residue,
        "tenant-a",
        None,
        "Tell me about lighthouses.",
        false,
    )
    .await;
    let quote = format!("As you wrote: {A_SECRET}");
    ask(
        &residue,
        "tenant-b",
        None,
        &format!("Check my text: {A_SECRET} ANSWER: {quote}"),
        false,
    )
    .await;
    // And again later: B's own answer, recorded as B's content, is B's too.
    ask(
        &residue,
        "tenant-b",
        None,
        &format!("Repeat that. ANSWER: {quote}"),
        false,
    )
    .await;
    let incidents = incidents_after(&recorder, &mut live, 3).await;
    assert!(incidents.is_empty(), "{incidents:#?}");
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_system_prompt_two_tenants_share_is_not_a_leak() {
    let (_up, residue, recorder) = setup().await;
    let mut live = residue.incidents.subscribe();
    let system = "You are Orbit, the support assistant of Northwind Logistics. Always answer politely, cite the shipping policy section, and never promise delivery dates you cannot check.";
    ask(
        &residue,
        "tenant-a",
        Some(system),
        "Where is my parcel?",
        false,
    )
    .await;
    let echo = format!("My instructions say: {system}");
    ask(
        &residue,
        "tenant-b",
        Some(system),
        &format!("What are your instructions? ANSWER: {echo}"),
        false,
    )
    .await;
    let incidents = incidents_after(&recorder, &mut live, 2).await;
    assert!(incidents.is_empty(), "{incidents:#?}");
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn boilerplate_many_tenants_share_is_discounted() {
    let (_up, residue, recorder) = setup().await;
    let mut live = residue.incidents.subscribe();
    let template = "Please answer in the following format: first a one line summary, then three bullet points, then a closing sentence that invites follow up questions from the reader.";
    for t in ["t1", "t2", "t3"] {
        ask(&residue, t, None, &format!("{template} Topic: tea."), false).await;
    }
    // A fourth tenant's answer echoing the template is not evidence against any of them.
    ask(
        &residue,
        "t4",
        None,
        &format!("Topic: coffee. ANSWER: OK. {template}"),
        false,
    )
    .await;
    let incidents = incidents_after(&recorder, &mut live, 4).await;
    assert!(incidents.is_empty(), "{incidents:#?}");
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn chinese_fragments_are_caught_and_chinese_own_content_is_not() {
    let (_up, residue, recorder) = setup().await;
    let mut live = residue.incidents.subscribe();
    let a_prompt = "请帮我审阅这份合同：甲方北京星河科技有限公司同意在二零二七年三月前向乙方支付全部研发费用共计八百万元人民币。";
    ask(&residue, "tenant-a", None, a_prompt, false).await;
    // 24 characters of A's prompt in B's answer.
    let fragment = "甲方北京星河科技有限公司同意在二零二七年三月前向乙方支付";
    assert!(fragment.chars().count() >= 20);
    ask(
        &residue,
        "tenant-b",
        None,
        &format!("今天天气怎么样？ANSWER: 今天晴。{fragment}。"),
        false,
    )
    .await;
    // C quotes its own Chinese prompt.
    let c_prompt = "上海的东方明珠电视塔建于一九九一年，高四百六十八米，是城市的标志性建筑之一。";
    ask(
        &residue,
        "tenant-c",
        None,
        &format!("{c_prompt} ANSWER: 您说：{c_prompt}"),
        false,
    )
    .await;
    let incidents = incidents_after(&recorder, &mut live, 3).await;
    assert_eq!(incidents.len(), 1, "{incidents:#?}");
    assert_eq!(incidents[0].detector, "cross_tenant_ngram");
    assert_eq!(incidents[0].tenant, "tenant-b");
    assert_eq!(incidents[0].evidence["source_tenant"], "tenant-a");
    assert_eq!(incidents[0].evidence["token_class"], "cjk");
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn another_tenants_pii_is_critical_own_pii_is_fine() {
    let (_up, residue, recorder) = setup().await;
    let mut live = residue.incidents.subscribe();
    let a = "Update my profile: email jane.doe@halvorsen.example, phone +44 20 7946 0958, card 4111 1111 1111 1111, resident ID 11010519491231002X.";
    ask(&residue, "tenant-a", None, a, false).await;
    // B gets A's values, written differently.
    let leaked = "Contact JANE.DOE@halvorsen.example or +44 20 7946 0958; card 4111-1111-1111-1111; ID 11010519491231002X.";
    ask(
        &residue,
        "tenant-b",
        None,
        &format!("Hi ANSWER: {leaked}"),
        false,
    )
    .await;
    // A gets its own values back: fine.
    ask(
        &residue,
        "tenant-a",
        None,
        "What is my email? ANSWER: Your email is jane.doe@halvorsen.example.",
        false,
    )
    .await;
    let incidents = incidents_after(&recorder, &mut live, 3).await;
    let pii: Vec<_> = incidents
        .iter()
        .filter(|i| i.detector == "cross_tenant_pii")
        .collect();
    let mut kinds: Vec<&str> = pii
        .iter()
        .map(|i| i.evidence["kind"].as_str().unwrap())
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        vec!["card_number", "email", "national_id", "phone"],
        "{incidents:#?}"
    );
    for i in &pii {
        assert_eq!(i.tenant, "tenant-b");
        assert_eq!(i.severity.as_str(), "critical");
        assert_eq!(i.evidence["source_tenants"][0], "tenant-a");
        let json = serde_json::to_string(&***i).unwrap();
        assert!(
            !json.contains("4111") && !json.contains("jane"),
            "raw value in incident: {json}"
        );
    }
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_fragment_and_a_card_number_split_across_sse_events_are_still_caught() {
    let (_up, residue, recorder) = setup().await;
    let mut live = residue.incidents.subscribe();
    ask(
        &residue,
        "tenant-a",
        None,
        &format!("{A_SECRET} Charge card 5500 0055 5555 5559."),
        false,
    )
    .await;
    let fragment = "the ninth of March and the purchase price stays at four hundred million kroner";
    ask(
        &residue,
        "tenant-b",
        None,
        &format!("Hello ANSWER: Fine. {fragment}. Pay with 5500 0055 5555 5559 today."),
        true,
    )
    .await;
    let incidents = incidents_after(&recorder, &mut live, 2).await;
    let detectors: Vec<&str> = incidents.iter().map(|i| i.detector).collect();
    assert!(detectors.contains(&"cross_tenant_ngram"), "{incidents:#?}");
    assert!(detectors.contains(&"cross_tenant_pii"), "{incidents:#?}");
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn canaries_fire_for_everyone_but_their_owner() {
    let upstream = FakeUpstream::start(scripted()).await;
    let mut config = support::config(&upstream.url());
    config.tenant.trust_header = true;
    config.incidents.raw_tenant = true;
    config.detect.canary = vec![
        residue::detect::canary::CanaryConfig {
            value: "HONEY-7f3a-acme".into(),
            tenant: Some("acme".into()),
        },
        residue::detect::canary::CanaryConfig {
            value: "RESIDUE-CANARY-0042".into(),
            tenant: None,
        },
    ];
    let (residue, recorder) = support::start(config).await;
    let mut live = residue.incidents.subscribe();
    ask(
        &residue,
        "acme",
        None,
        "x ANSWER: your token HONEY-7f3a-acme",
        false,
    )
    .await;
    ask(
        &residue,
        "globex",
        None,
        "x ANSWER: found HONEY-7f3a-acme and RESIDUE-CANARY-0042",
        false,
    )
    .await;
    let incidents = incidents_after(&recorder, &mut live, 2).await;
    assert_eq!(incidents.len(), 2, "{incidents:#?}");
    assert!(incidents
        .iter()
        .all(|i| i.detector == "canary" && i.tenant == "globex"));
    assert!(!serde_json::to_string(&*incidents[0])
        .unwrap()
        .contains("HONEY"));
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn store_metrics_are_exported() {
    let (_up, residue, recorder) = setup().await;
    ask(&residue, "tenant-a", None, A_SECRET, false).await;
    recorder.wait_for(1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(support::metric(residue.admin_addr, "residue_store_entries", &[]).await >= 1.0);
    assert!(support::metric(residue.admin_addr, "residue_store_bytes", &[]).await > 0.0);
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn masked_snippets_show_only_the_edges_of_a_match() {
    let upstream = FakeUpstream::start(scripted()).await;
    let mut config = support::config(&upstream.url());
    config.tenant.trust_header = true;
    config.detect.evidence = residue::detect::cross_tenant::Evidence::MaskedSnippet;
    let (residue, recorder) = support::start(config).await;
    let mut live = residue.incidents.subscribe();
    ask(
        &residue,
        "tenant-a",
        None,
        "Mail me at jane.doe@halvorsen-maritime.no please.",
        false,
    )
    .await;
    ask(
        &residue,
        "tenant-b",
        None,
        "Hi ANSWER: Try jane.doe@halvorsen-maritime.no today.",
        false,
    )
    .await;
    let incidents = incidents_after(&recorder, &mut live, 2).await;
    assert_eq!(incidents.len(), 1, "{incidents:#?}");
    let snippet = incidents[0].evidence["masked_snippets"][0]
        .as_str()
        .unwrap();
    assert_eq!(
        snippet.chars().count(),
        "jane.doe@halvorsen-maritime.no".len()
    );
    assert!(
        snippet.starts_with("ja") && snippet.ends_with("no"),
        "{snippet}"
    );
    assert!(!snippet.contains("halvorsen"), "{snippet}");
    // Tenants are hashed unless configured raw.
    assert_eq!(incidents[0].tenant.len(), 16);
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn rules_reload_when_a_file_changes() {
    let dir = std::env::temp_dir().join(format!("residue-test-{}-rules", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let repo_rules = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
    for entry in std::fs::read_dir(&repo_rules).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    let upstream = FakeUpstream::start(scripted()).await;
    let mut config = support::config(&upstream.url());
    config.tenant.trust_header = true;
    config.incidents.raw_tenant = true;
    config.detect.rules_dir = Some(dir.clone());
    let (residue, recorder) = support::start(config).await;
    let mut live = residue.incidents.subscribe();
    ask(
        &residue,
        "tenant-a",
        None,
        "Badge ZETA-7731-QX is mine.",
        false,
    )
    .await;
    ask(
        &residue,
        "tenant-b",
        None,
        "Hi ANSWER: Use ZETA-7731-QX.",
        false,
    )
    .await;
    assert!(incidents_after(&recorder, &mut live, 2).await.is_empty());

    std::fs::write(
        dir.join("badges.toml"),
        r#"
[[rule]]
id = "secret.badge"
kind = "secret"
pattern = '''\bZETA-\d{4}-[A-Z]{2}\b'''
positive = ["badge ZETA-1234-AB here", "ZETA-9999-ZZ"]
negative = ["ZETA-12-AB", "zeta-1234-ab"]
"#,
    )
    .unwrap();
    support::wait_for_metric(
        residue.admin_addr,
        "residue_rules_reloads_total",
        &[("result", "ok")],
        1.0,
    )
    .await;
    ask(
        &residue,
        "tenant-a",
        None,
        "Badge ZETA-7731-QX is mine.",
        false,
    )
    .await;
    ask(
        &residue,
        "tenant-b",
        None,
        "Hi ANSWER: Use ZETA-7731-QX.",
        false,
    )
    .await;
    let incidents = incidents_after(&recorder, &mut live, 4).await;
    assert_eq!(incidents.len(), 1, "{incidents:#?}");
    assert_eq!(incidents[0].evidence["rule"], "secret.badge");

    // A broken file keeps the rules in force.
    std::fs::write(dir.join("broken.toml"), "[[rule]]\nid = 5\n").unwrap();
    support::wait_for_metric(
        residue.admin_addr,
        "residue_rules_reloads_total",
        &[("result", "error")],
        1.0,
    )
    .await;
    ask(
        &residue,
        "tenant-b",
        None,
        "Hi ANSWER: Use ZETA-7731-QX again.",
        false,
    )
    .await;
    let incidents = incidents_after(&recorder, &mut live, 5).await;
    assert_eq!(incidents.len(), 1, "{incidents:#?}");
    residue.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_chinese_system_prompt_two_tenants_share_is_not_a_leak() {
    let (_up, residue, recorder) = setup().await;
    let mut live = residue.incidents.subscribe();
    let system = "你是星河物流的客服助手，请礼貌回答客户的问题，引用运输政策的相关条款，不要承诺无法确认的送达日期。";
    ask(
        &residue,
        "tenant-a",
        Some(system),
        "我的包裹在哪里？",
        false,
    )
    .await;
    let echo = format!("我的指令是：{system}");
    ask(
        &residue,
        "tenant-b",
        Some(system),
        &format!("你的指令是什么？ANSWER: {echo}"),
        false,
    )
    .await;
    // A third tenant with its own Chinese text, quoted back: its own.
    let own = "请把这段话翻译成英文：明天上午十点在三号会议室召开季度预算评审会议，请各部门负责人准时参加。";
    ask(
        &residue,
        "tenant-c",
        None,
        &format!("{own} ANSWER: 好的：{own}"),
        false,
    )
    .await;
    let incidents = incidents_after(&recorder, &mut live, 3).await;
    assert!(incidents.is_empty(), "{incidents:#?}");
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_leak_in_one_of_two_interleaved_choices_is_caught() {
    let fragment = "with Halvorsen Maritime closes on the ninth of March and the purchase price stays at four hundred million kroner";
    let other = "Bread needs flour water salt and yeast and about an hour of rest before it goes into a hot oven for baking";
    // An n = 2 stream alternating the two choices word by word.
    let (a, b): (Vec<&str>, Vec<&str>) =
        (fragment.split(' ').collect(), other.split(' ').collect());
    let mut events = String::new();
    for i in 0..a.len().max(b.len()) {
        for (index, words) in [(0, &a), (1, &b)] {
            if let Some(w) = words.get(i) {
                let delta = serde_json::json!({"choices": [{"index": index, "delta": {"content": format!("{w} ")}}]});
                events.push_str(&format!("data: {delta}\n\n"));
            }
        }
    }
    events.push_str("data: [DONE]\n\n");
    let upstream = FakeUpstream::start(move |r| {
        if r.headers
            .get("x-tenant-id")
            .is_some_and(|v| v == "tenant-b")
        {
            Reply::stream("text/event-stream", vec![Bytes::from(events.clone())])
        } else {
            Reply::json(r#"{"choices":[{"index":0,"message":{"content":"Noted."}}]}"#)
        }
    })
    .await;
    let mut config = support::config(&upstream.url());
    config.tenant.trust_header = true;
    config.incidents.raw_tenant = true;
    let (residue, recorder) = support::start(config).await;
    let mut live = residue.incidents.subscribe();
    ask(
        &residue,
        "tenant-a",
        None,
        &format!("Summarise: {A_SECRET}"),
        false,
    )
    .await;
    let body = serde_json::json!({"stream": true, "n": 2, "messages": [{"role": "user", "content": "Bread?"}]}).to_string();
    call(
        residue.addr,
        "/v1/chat/completions",
        &[("x-tenant-id", "tenant-b")],
        &body,
    )
    .await;
    let incidents = incidents_after(&recorder, &mut live, 2).await;
    assert_eq!(incidents.len(), 1, "{incidents:#?}");
    assert_eq!(incidents[0].detector, "cross_tenant_ngram");
    assert_eq!(incidents[0].evidence["source_tenant"], "tenant-a");
    residue.shutdown().await.unwrap();
}
