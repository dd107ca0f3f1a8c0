//! The demo scenario at small scale: the faulty engine, residue in monitor
//! mode with every detector, multi-tenant traffic, and the scorecard.

use std::time::Duration;

use residue::demo::{self, DemoConfig};
use residue::scenario::Fault;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_leak_the_engine_injects_is_caught_and_clean_answers_are_not_flagged() {
    let out = std::env::temp_dir().join(format!("residue-demo-test-{}", std::process::id()));
    let config = DemoConfig {
        requests: 400,
        tenants: 8,
        concurrency: 8,
        seed: 11,
        // Enough of each fault to mean something at this size.
        over_capacity_fraction: 0.06,
        faults: vec![
            (Fault::Placeholder, 1.0),
            (Fault::StaleBlock, 0.04),
            (Fault::Splice, 0.08),
            (Fault::Garbage, 0.03),
        ],
        out_dir: out.clone(),
        progress: false,
        ..DemoConfig::default()
    };
    let outcome = tokio::time::timeout(Duration::from_secs(120), demo::run(config))
        .await
        .expect("the demo finishes")
        .expect("the demo runs");
    let card = &outcome.scorecard;
    let md = &outcome.markdown;
    assert_eq!(card.responses, 400, "{md}");
    // Every placeholder leak (the incident's own shape) caught.
    assert!(card.placeholder_leaks.total >= 5, "{md}");
    assert_eq!(card.placeholder_leaks.missed, 0, "{md}");
    // Every splice of 15 words or more caught.
    assert!(card.long_splices.total >= 5, "{md}");
    assert_eq!(card.long_splices.missed, 0, "{md}");
    // Every PII value that crossed tenants caught by the PII detector.
    assert!(card.pii_leaks.total >= 3, "{md}");
    assert_eq!(card.pii_leaks.missed, 0, "{md}");
    // No false positive on the clean answers of the run.
    assert!(card.clean.responses >= 250, "{md}");
    assert_eq!(card.clean.false_positives, 0, "{md}");
    assert_eq!(card.missed_leaks, 0, "{md}");
    assert!(card.passed, "{md}");
    // The files the README points at.
    for f in [
        "truth.jsonl",
        "incidents.jsonl",
        "scorecard.json",
        "scorecard.md",
    ] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    // Replaying the saved files scores the same leaks.
    let truth = std::fs::read_to_string(out.join("truth.jsonl")).unwrap();
    let incidents = std::fs::read_to_string(out.join("incidents.jsonl")).unwrap();
    let replayed = residue::scorecard::replay(&truth, &incidents, None);
    assert_eq!(replayed.expected_leaks.caught, card.expected_leaks.caught);
    assert_eq!(replayed.clean.false_positives, 0);
    let _ = std::fs::remove_dir_all(&out);
}
