//! The engine's faults against their promises, the request parser against
//! hostile bodies, and the response bodies against residue's own decoder.

use std::sync::Arc;

use super::engine::{Engine, EngineConfig, EngineRequest, Generation, SPLICE_WORDS};
use super::*;
use crate::protocol::{BodyFormat, Output, ResponseDecoder};

// === helpers ===

fn engine(seed: u64, capacity: u64, faults: &[(Fault, f64)]) -> Engine {
    Engine::new(
        EngineConfig {
            seed,
            prefill_capacity_tokens: capacity,
            kv_pages: 256,
            page_tokens: 8,
            faults: faults.to_vec(),
        },
        Arc::new(RuleSet::builtin()),
    )
}

/// `n` words that only `tenant` ever sends: `t3w0 t3w1 …`, with a full stop
/// every 7 words so the answer has sentences to quote.
fn words(tenant: &str, n: usize) -> String {
    (0..n)
        .map(|i| {
            let w = format!("{tenant}w{i}");
            if i % 7 == 6 {
                format!("{w}.")
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One request, answered and delivered.
fn ask(e: &mut Engine, id: &str, tenant: &str, prompt: &str) -> Generation {
    let g = e.generate(EngineRequest {
        request_id: id,
        tenant,
        parts: &[prompt.to_string()],
    });
    e.finish(id);
    g
}

/// Tokens of `text` that another tenant (prefix `t<k>w`, k ≠ `own`) sent.
fn foreign_tokens(text: &str, own: &str) -> Vec<String> {
    text::tokens(text)
        .into_iter()
        .map(|r| {
            text[r]
                .trim_matches(|c: char| !c.is_alphanumeric())
                .to_string()
        })
        .filter(|t| t.starts_with('t') && t.contains('w') && !t.starts_with(&format!("{own}w")))
        .collect()
}

fn leak_text(g: &Generation) -> &str {
    let (a, b) = g.leak.as_ref().expect("a leak").span;
    &g.text[a..b]
}

// === engine ===

#[test]
fn same_seed_same_answers() {
    let faults = [
        (Fault::Placeholder, 1.0),
        (Fault::StaleBlock, 0.2),
        (Fault::Splice, 0.2),
        (Fault::Garbage, 0.1),
    ];
    let run = |seed| {
        let mut e = engine(seed, 60, &faults);
        (0..60)
            .map(|i| {
                let tenant = format!("t{}", i % 4);
                let n = if i % 5 == 4 { 80 } else { 30 + i % 20 };
                ask(&mut e, &format!("r{i}"), &tenant, &words(&tenant, n))
            })
            .collect::<Vec<_>>()
    };
    let a = run(7);
    assert_eq!(a, run(7));
    assert_ne!(a, run(8));
    for f in Fault::ALL {
        assert!(a.iter().any(|g| g.fault == Some(f)), "{f:?} never drawn");
    }
}

#[test]
fn placeholder_only_above_capacity() {
    let mut e = engine(1, 50, &[(Fault::Placeholder, 1.0)]);
    let mut sent = std::collections::HashMap::new();
    // Over capacity, but nobody else's content in the pool yet: healthy.
    let p = words("t1", 60);
    let g = ask(&mut e, "r0", "t1", &p);
    assert_eq!(g.fault, None);
    assert_eq!(g.prompt_tokens_reported, text::subword_count(&p));
    sent.insert("r0", (p, g.text));
    // Under capacity: never.
    let p = words("t2", 40);
    let g = ask(&mut e, "r1", "t2", &p);
    assert_eq!(g.fault, None);
    assert!(g.prompt_tokens_reported <= 50);
    assert_eq!(g.prompt_tokens_reported, text::subword_count(&p));
    sent.insert("r1", (p, g.text));
    for i in 0..20 {
        let p = words("t3", 51);
        let g = ask(&mut e, &format!("x{i}"), "t3", &p);
        assert_eq!(g.fault, Some(Fault::Placeholder));
        assert_eq!(
            (g.prompt_tokens_reported, g.prompt_tokens_real),
            (1, text::subword_count(&p))
        );
        let leak = g.leak.as_ref().unwrap();
        assert_ne!(&*leak.source_tenant, "t3");
        // A verbatim run of the other request's prompt or answer.
        let fragment = leak_text(&g);
        let (prompt, answer) = &sent[&*leak.source_request_id];
        assert!(
            prompt.contains(fragment) || answer.contains(fragment),
            "{fragment}"
        );
        assert!(leak.words >= 20, "{}", leak.words);
        assert_eq!(leak.words, text::count(fragment));
    }
}

#[test]
fn splice_span_is_the_foreign_fragment() {
    let mut e = engine(3, 10_000, &[(Fault::Splice, 1.0)]);
    let g = ask(&mut e, "r0", "t0", &words("t0", 60));
    assert_eq!(g.fault, None, "no foreign prompt yet");
    let mut lengths = std::collections::BTreeSet::new();
    for i in 1..200 {
        let tenant = format!("t{}", i % 3);
        let g = ask(&mut e, &format!("r{i}"), &tenant, &words(&tenant, 60));
        assert_eq!(g.fault, Some(Fault::Splice));
        let leak = g.leak.as_ref().unwrap();
        let fragment = leak_text(&g);
        let source = words(&leak.source_tenant, 60);
        assert!(source.contains(fragment), "{fragment:?} not in the prompt");
        assert!(SPLICE_WORDS.contains(&leak.words), "{}", leak.words);
        assert_eq!(leak.words, text::count(fragment));
        // At a word boundary, and nothing foreign outside the span.
        let (a, b) = leak.span;
        assert!(g.text[..a].ends_with(' ') && g.text[b..].starts_with(' '));
        let outside = format!("{} {}", &g.text[..a], &g.text[b..]);
        assert!(foreign_tokens(&outside, &tenant).is_empty(), "{}", g.text);
        lengths.insert(leak.words);
    }
    assert!(lengths.len() > 20, "lengths drawn: {lengths:?}");
}

#[test]
fn stale_block_hands_out_another_tenants_answer() {
    let mut e = engine(4, 10_000, &[(Fault::StaleBlock, 1.0)]);
    let first = ask(&mut e, "r0", "t0", &words("t0", 30));
    assert_eq!(first.fault, None, "no other tenant's answer yet");
    let again = ask(&mut e, "r1", "t0", &words("t0", 30));
    assert_eq!(again.fault, None, "own answers are not foreign");
    let g = ask(&mut e, "r2", "t1", &words("t1", 30));
    assert_eq!(g.fault, Some(Fault::StaleBlock));
    assert!(g.text == first.text || g.text == again.text);
    let leak = g.leak.unwrap();
    assert_eq!(&*leak.source_tenant, "t0");
    assert_eq!(leak.span, (0, g.text.len()));
}

#[test]
fn healthy_answers_hold_no_other_tenants_text() {
    let mut e = engine(5, 10_000, &[]);
    for i in 0..100 {
        let tenant = format!("t{}", i % 5);
        let g = ask(&mut e, &format!("r{i}"), &tenant, &words(&tenant, 10 + i));
        assert_eq!((g.fault, &g.leak), (None, &None));
        assert!(foreign_tokens(&g.text, &tenant).is_empty(), "{}", g.text);
        assert!(g.text.contains(&format!("{tenant}w0")), "{}", g.text);
    }
}

#[test]
fn garbage_is_not_a_leak() {
    let mut e = engine(6, 10_000, &[(Fault::Garbage, 1.0)]);
    for i in 0..20 {
        let tenant = format!("t{}", i % 2);
        let g = ask(&mut e, &format!("r{i}"), &tenant, &words(&tenant, 30));
        assert_eq!(g.fault, Some(Fault::Garbage));
        assert!(g.leak.is_none());
        assert!(foreign_tokens(&g.text, &tenant).is_empty(), "{}", g.text);
    }
}

#[test]
fn leaked_pii_counts_the_sources_values() {
    let mut e = engine(7, 30, &[(Fault::Placeholder, 1.0)]);
    let prompt: String = (0..30)
        .map(|i| format!("write to jane{i}@northwind-mail.com today"))
        .collect::<Vec<_>>()
        .join(" ");
    ask(&mut e, "r0", "t0", &prompt);
    let g = ask(&mut e, "r1", "t1", &words("t1", 31));
    assert_eq!(g.fault, Some(Fault::Placeholder));
    let leak = g.leak.as_ref().unwrap();
    // Whole words are cut, never an address.
    let emails = leak_text(&g).matches("@northwind-mail.com").count();
    assert!(
        leak.pii >= 1 && leak.pii == emails,
        "{leak:?} {}",
        leak_text(&g)
    );
}

#[test]
fn cjk_placeholder_runs_are_40_characters() {
    let mut e = engine(8, 30, &[(Fault::Placeholder, 1.0)]);
    let cjk: String =
        "東京都港区の顧客台帳には山田太郎様の住所と電話番号が記載されています".repeat(3);
    ask(&mut e, "r0", "t0", &cjk);
    let g = ask(&mut e, "r1", "t1", &words("t1", 31));
    let leak = g.leak.as_ref().unwrap();
    assert!(leak.words >= 40, "{}", leak.words);
    assert!(cjk.contains(leak_text(&g)));
}

#[test]
fn huge_prompts_do_not_break_the_pool() {
    let mut e = engine(9, 2048, &[(Fault::Placeholder, 1.0), (Fault::Splice, 0.5)]);
    ask(&mut e, "r0", "t0", &words("t0", 100));
    let huge = words("t1", 200_000);
    let g = ask(&mut e, "r1", "t1", &huge);
    assert_eq!(g.fault, Some(Fault::Placeholder));
    assert_eq!(g.prompt_tokens_real, text::subword_count(&huge));
    // Without the placeholder fault the huge prompt fills the pool.
    let mut e = engine(9, 2048, &[]);
    let g = ask(&mut e, "r0", "t1", &huge);
    assert_eq!(g.prompt_tokens_reported, text::subword_count(&huge));
    ask(&mut e, "r1", "t2", &words("t2", 10));
}

// === request parsing ===

#[test]
fn hostile_bodies_get_a_clear_400() {
    let nested = "[".repeat(100_000);
    let cases: &[(Endpoint, &[u8], &str)] = &[
        (Endpoint::Chat, b"", "not valid JSON"),
        (Endpoint::Chat, b"{", "not valid JSON"),
        (Endpoint::Chat, b"\xff\xfe{}", "not valid UTF-8"),
        (Endpoint::Chat, b"[]", "JSON object"),
        (Endpoint::Chat, b"{}", "`messages`"),
        (Endpoint::Chat, br#"{"messages": []}"#, "`messages`"),
        (Endpoint::Chat, br#"{"messages": "hi"}"#, "`messages`"),
        (
            Endpoint::Chat,
            br#"{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}"#,
            "`stream`",
        ),
        (Endpoint::Completions, br#"{"prompt": 7}"#, "`prompt`"),
        (Endpoint::Generate, br#"{"input_ids": [1, 2]}"#, "`text`"),
        (Endpoint::Generate, br#"{"text": ["a", "b"]}"#, "`text`"),
        (Endpoint::Generate, nested.as_bytes(), "not valid JSON"),
    ];
    for (endpoint, body, needle) in cases {
        let err = parse(*endpoint, body).expect_err("a bad request");
        assert_eq!(err.0, StatusCode::BAD_REQUEST);
        assert!(err.1.contains(needle), "{endpoint:?}: {}", err.1);
    }
    // Odd but valid shapes are answered.
    let ok = parse(
        Endpoint::Chat,
        br#"{"messages": [{"role": "user", "content": null}, 3]}"#,
    )
    .unwrap();
    assert!(ok.parts.is_empty());
}

// === response bodies through residue's decoder ===

#[test]
fn residue_decodes_every_body() {
    let mut e = engine(10, 10_000, &[]);
    let g = ask(
        &mut e,
        "r0",
        "t0",
        "东京 is big. Tell me more about it, please!",
    );
    for endpoint in [Endpoint::Chat, Endpoint::Completions, Endpoint::Generate] {
        for stream in [false, true] {
            let req = SimRequest {
                endpoint,
                parts: vec![],
                stream,
                include_usage: true,
                model: "m".into(),
            };
            let (format, body) = if stream {
                (BodyFormat::Sse, events(&req, "r0", &g).concat())
            } else {
                (BodyFormat::Json, whole(&req, "r0", &g).to_string())
            };
            let mut d = ResponseDecoder::new(endpoint.protocol(), format, 1 << 20);
            let mut out = Output::default();
            d.push(body.as_bytes(), &mut out);
            d.finish(&mut out);
            let what = format!("{endpoint:?} stream={stream}");
            assert_eq!(out.text, g.text, "{what}");
            assert_eq!(
                out.usage.prompt_tokens,
                Some(g.prompt_tokens_reported),
                "{what}"
            );
            assert_eq!(
                out.usage.completion_tokens,
                Some(g.completion_tokens),
                "{what}"
            );
            assert_eq!(out.malformed, 0, "{what}");
        }
    }
}

// === config ===

#[test]
fn fault_specs() {
    assert_eq!(parse_fault("placeholder=1"), Ok((Fault::Placeholder, 1.0)));
    assert_eq!(parse_fault("stale-block=0.1"), Ok((Fault::StaleBlock, 0.1)));
    assert_eq!(parse_fault("stale_block=0.1"), Ok((Fault::StaleBlock, 0.1)));
    for bad in [
        "splice",
        "splice=x",
        "splice=1.5",
        "leak=0.1",
        "garbage=-0.1",
    ] {
        assert!(parse_fault(bad).is_err(), "{bad}");
    }
    let config = SimConfig {
        faults: vec![
            (Fault::Placeholder, 1.0),
            (Fault::Splice, 0.6),
            (Fault::Garbage, 0.6),
            (Fault::Garbage, 0.1),
        ],
        kv_pages: 0,
        ..SimConfig::default()
    };
    let errors = config.validate();
    assert_eq!(errors.len(), 3, "{errors:?}");
}

#[test]
fn requests_still_being_delivered_are_never_a_leak_source() {
    // A pool big enough that nothing is overwritten during the test.
    let mut e = Engine::new(
        EngineConfig {
            seed: 4,
            prefill_capacity_tokens: 50,
            kv_pages: 4096,
            page_tokens: 8,
            faults: vec![(Fault::Placeholder, 1.0)],
        },
        Arc::new(RuleSet::builtin()),
    );
    // t0 asks; its answer is not delivered yet: its pages are in use.
    let prompt = words("t0", 30);
    let pending = e.generate(EngineRequest {
        request_id: "r0",
        tenant: "t0",
        parts: std::slice::from_ref(&prompt),
    });
    assert_eq!(pending.fault, None);
    for i in 0..10 {
        let g = ask(&mut e, &format!("x{i}"), "t1", &words("t1", 80));
        assert_eq!(g.fault, None, "nothing stale to leak from yet");
    }
    // Delivered: its prompt's and its answer's pages are stale now.
    e.finish("r0");
    let mut from_prompt = false;
    let mut from_answer = false;
    for i in 10..60 {
        let g = ask(&mut e, &format!("x{i}"), "t1", &words("t1", 80));
        assert_eq!(g.fault, Some(Fault::Placeholder));
        let leak = g.leak.as_ref().unwrap();
        assert_eq!(&*leak.source_tenant, "t0");
        let text = &g.text[leak.span.0..leak.span.1];
        if prompt.contains(text) {
            from_prompt = true;
        } else {
            from_answer = true;
        }
    }
    assert!(from_prompt && from_answer);
}
