//! The semantic detectors: the decision on made-up vectors, fusion, the
//! plumbing on a tiny random BERT, and the acceptance cases on the
//! real all-MiniLM-L6-v2 in every tier (when `models/fetch` installed it).

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::{SemanticConfig, TierChoice};
use crate::embed::window::{Hit, QueryHits};
use crate::embed::Pooling;
use crate::hash::HashKey;
use crate::tenant::TenantSource;

fn tenant(id: &str) -> Tenant {
    Tenant {
        id: Arc::from(id),
        source: TenantSource::Header,
    }
}

fn prompt(text: &str) -> Prompt {
    Prompt {
        parts: vec![text.into()],
        pretokenized: 0,
    }
}

fn unit(v: &[f32]) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / n).collect()
}

fn hits(best: Option<(TenantKey, f32)>, own_best: f32, foreign_tenants_above: u32) -> QueryHits {
    QueryHits {
        hits: best
            .map(|(tenant, score)| Hit {
                tenant,
                record: 1,
                kind: ContentKind::Prompt,
                score,
            })
            .into_iter()
            .collect(),
        own_best,
        foreign_tenants_above,
    }
}

const T: Thresholds = Thresholds {
    leak: 0.5,
    margin: 0.15,
    relevance: 0.15,
};

// === the decision ===

#[test]
fn a_chunk_close_to_a_foreign_prompt_and_far_from_its_own_is_a_leak() {
    let answer = vec![unit(&[1.0, 0.0, 0.0])];
    let own = vec![unit(&[0.0, 1.0, 0.0])];
    let (sources, relevance) = decide(&answer, &own, &[hits(Some((7, 0.8)), -1.0, 1)], T, 3);
    assert_eq!(sources.len(), 1);
    assert_eq!(sources[0].tenant, 7);
    assert_eq!(sources[0].chunks, vec![0]);
    assert!((sources[0].own - 0.0).abs() < 1e-6);
    assert!(relevance.abs() < 1e-6);
}

#[test]
fn the_margin_and_common_topics_keep_shared_subjects_quiet() {
    let answer = vec![unit(&[1.0, 0.2, 0.0])];
    let own = vec![unit(&[1.0, 0.0, 0.0])];
    // Its own prompt is about as close as the foreign one: no leak.
    let (sources, relevance) = decide(&answer, &own, &[hits(Some((7, 0.9)), -1.0, 1)], T, 3);
    assert!(sources.is_empty(), "{sources:?}");
    assert!(relevance > 0.9);
    // An earlier prompt of its own in the window counts as its own too.
    let far = vec![unit(&[0.0, 1.0, 0.0])];
    let answer = vec![unit(&[1.0, 0.0, 0.0])];
    let (sources, _) = decide(&answer, &far, &[hits(Some((7, 0.9)), 0.85, 1)], T, 3);
    assert!(sources.is_empty(), "{sources:?}");
    // Three foreign tenants asked about it about as closely: a topic, not
    // a leak; the same three far apart point at the closest one.
    let mut topic = hits(Some((7, 0.9)), -1.0, 3);
    for (tenant, score) in [(8, 0.88), (9, 0.86)] {
        topic.hits.push(Hit {
            tenant,
            record: 2,
            kind: ContentKind::Prompt,
            score,
        });
    }
    let (sources, _) = decide(&answer, &far, &[topic.clone()], T, 3);
    assert!(sources.is_empty(), "{sources:?}");
    topic.hits[1].score = 0.7;
    topic.hits[2].score = 0.6;
    let (sources, _) = decide(&answer, &far, &[topic], T, 3);
    assert_eq!(sources.len(), 1, "{sources:?}");
    // Under the threshold: nothing.
    let (sources, _) = decide(&answer, &far, &[hits(Some((7, 0.45)), -1.0, 1)], T, 3);
    assert!(sources.is_empty(), "{sources:?}");
}

#[test]
fn chunks_pointing_at_one_tenant_make_one_source_with_its_best_score() {
    let answer = vec![
        unit(&[1.0, 0.0, 0.0]),
        unit(&[0.0, 0.0, 1.0]),
        unit(&[1.0, 0.0, 1.0]),
    ];
    let own = vec![unit(&[0.0, 1.0, 0.0])];
    let h = [
        hits(Some((7, 0.7)), -1.0, 1),
        hits(Some((9, 0.6)), -1.0, 1),
        hits(Some((7, 0.9)), -1.0, 1),
    ];
    let (sources, _) = decide(&answer, &own, &h, T, 3);
    assert_eq!(sources.len(), 2);
    assert_eq!(sources[0].tenant, 7);
    assert_eq!(sources[0].chunks, vec![0, 2]);
    assert!((sources[0].score - 0.9).abs() < 1e-6);
    assert_eq!(sources[1].tenant, 9);
}

// === fusion ===

fn finding(detector: &'static str, evidence: serde_json::Value, score: f64) -> Finding {
    Finding {
        detector,
        severity: Severity::High,
        score,
        evidence,
        spans: Vec::new(),
    }
}

#[test]
fn exact_evidence_for_the_same_source_corroborates_a_semantic_leak() {
    let mut f = vec![
        finding(
            super::super::cross_tenant::NGRAM,
            json!({"source_tenant": "aa"}),
            1.0,
        ),
        finding(LEAK, json!({"source_tenant": "aa"}), 0.6),
        finding(LEAK, json!({"source_tenant": "bb"}), 0.6),
        finding(RELEVANCE, json!({}), 0.9),
    ];
    f[0].severity = Severity::Critical;
    fuse(&mut f);
    assert_eq!(
        f[1].evidence["corroborated_by"],
        json!(["cross_tenant_ngram"])
    );
    assert_eq!(f[1].score, 1.0);
    assert_eq!(f[1].severity, Severity::Critical);
    assert!(f[2].evidence.get("corroborated_by").is_none());
    assert_eq!(f[2].score, 0.6);
    assert_eq!(f[0].evidence["semantic"], json!(LEAK));
    assert_eq!(f[3].evidence["explained_by"], json!(LEAK));
}

#[test]
fn fusion_without_semantic_findings_changes_nothing() {
    let mut f = vec![finding(
        super::super::cross_tenant::PII,
        json!({"source_tenants": ["aa"]}),
        1.0,
    )];
    let before = f.clone();
    fuse(&mut f);
    assert_eq!(f, before);
}

// === plumbing, on a tiny random model ===

fn config(dir: &std::path::Path, tier: TierChoice) -> SemanticConfig {
    SemanticConfig {
        enabled: true,
        model: dir.to_path_buf(),
        tier,
        ..SemanticConfig::default()
    }
}

fn build_with(
    dir: &std::path::Path,
    tier: TierChoice,
    rt: &tokio::runtime::Runtime,
) -> (Semantic, Metrics) {
    build_config(&config(dir, tier), rt)
}

fn build_config(config: &SemanticConfig, rt: &tokio::runtime::Runtime) -> (Semantic, Metrics) {
    let metrics = Metrics::new();
    let sem = build(
        config,
        Duration::from_secs(600),
        TenantNames::new(HashKey::new([5; 32]), true),
        rt.handle().clone(),
        &metrics,
    )
    .expect("build the semantic detectors");
    (sem, metrics)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn every_tier_runs_on_a_tiny_model_and_hostile_answers_are_no_panic() {
    let dir = crate::embed::tests::tiny_model("semantic-plumbing", Pooling::Mean);
    let rt = runtime();
    // The tiny model reads 64 positions: chunks of 96 tokens are refused.
    let too_long = build(
        &config(&dir, TierChoice::Static),
        Duration::from_secs(600),
        TenantNames::new(HashKey::new([5; 32]), true),
        rt.handle().clone(),
        &Metrics::new(),
    );
    assert!(
        matches!(too_long, Err(SemanticError::Config(_))),
        "{:?}",
        too_long.err()
    );
    for tier in [
        TierChoice::Static,
        TierChoice::Transformer,
        TierChoice::Cascade,
    ] {
        let small = SemanticConfig {
            chunk_tokens: 32,
            chunk_stride: 16,
            min_answer_tokens: 8,
            ..config(&dir, tier)
        };
        let (sem, metrics) = build_config(&small, &rt);
        let p = prompt("the cat sat on the mat . the cat sat on the mat");
        sem.record_prompt(&tenant("a"), &p);
        assert!(
            sem.window.stats().entries > 0,
            "{tier:?}: the prompt was recorded"
        );
        assert!(metrics.semantic_window_chunks.get() > 0);
        let long = "a man is eating a piece of bread . ".repeat(2000);
        for answer in [
            "",
            "a",
            "\u{0}\u{fffd}\u{202e} ][ ## ",
            "zzzz qqqq xxxx yyyy zzzz qqqq xxxx yyyy zzzz qqqq xxxx yyyy zzzz qqqq xxxx yyyy",
            long.as_str(),
        ] {
            let r = sem.check(&tenant("b"), &p, answer);
            assert!(
                r.is_ok(),
                "{tier:?} {:?}: {r:?}",
                &answer[..answer.len().min(20)]
            );
        }
        // A prompt of token ids only has no text to compare with: skipped.
        let ids_only = Prompt {
            parts: Vec::new(),
            pretokenized: 12,
        };
        assert!(sem.check(&tenant("b"), &ids_only, &long).is_err());
    }
}

#[test]
fn a_tier_without_what_it_needs_is_refused() {
    let dir = crate::embed::tests::tiny_model("semantic-missing", Pooling::Mean);
    let embedder = crate::embed::tests::load(&dir);
    let rt = runtime();
    let settings = Settings {
        tier: Tier::Cascade,
        search: T,
        confirm_leak: 0.25,
        confirm_relevance: 0.1,
        chunks: ChunkParams::default(),
        min_answer_tokens: 4,
        common_tenants: 3,
        timeout: Duration::from_secs(1),
    };
    let window = VectorWindow::new(
        embedder.dimension(),
        100,
        Duration::from_secs(60),
        crate::embed::window::Precision::I8,
    )
    .unwrap();
    let r = Semantic::new(
        settings,
        Embeddings {
            table: None,
            service: None,
            tokenizer: embedder.plain_tokenizer().unwrap(),
        },
        window,
        TenantNames::new(HashKey::new([5; 32]), false),
        rt.handle().clone(),
        Metrics::new(),
    );
    assert!(matches!(r, Err(SemanticError::Missing { .. })));
}

// === the acceptance cases, on all-MiniLM-L6-v2 ===

const A_PROMPT: &str = "Our quarterly revenue at the Lisbon bakery chain dropped after we raised croissant prices by fifteen percent. Should we roll back the price increase, or launch a loyalty card to win customers back?";

/// B's real prompt, which the engine replaced with a placeholder.
const B_PROMPT: &str = "Translate this maintenance log for the hydraulic press into German: the seal on cylinder three was replaced, the pressure test passed at two hundred bar, and the next inspection is due in June.";

/// What B got: an answer to A's question, in other words.
const B_LEAKED_ANSWER: &str = "Since sales at your Portuguese pastry shops fell once the croissants became 15% more expensive, I would not simply undo the pricing change. A rewards programme for regular buyers can bring footfall back while protecting your margin; pilot it in two stores for a month, then decide whether the higher price should stay.";

const B_HONEST_ANSWER: &str = "Wartungsprotokoll der Hydraulikpresse: Die Dichtung an Zylinder drei wurde ersetzt, die Druckprüfung wurde bei zweihundert bar bestanden, und die nächste Inspektion ist im Juni fällig.";

const UNRELATED_ANSWER: &str = "To unclog a slow kitchen drain, pour half a cup of baking soda down it, follow with a cup of white vinegar, wait fifteen minutes, and then flush the pipe with a kettle of boiling water.";

/// Ten ways of asking about one popular topic, and an honest answer to each.
const POPULAR: [(&str, &str); 10] = [
    ("How do I make a sourdough starter from scratch?", "Mix equal weights of flour and water in a jar, keep it at room temperature, and feed it fresh flour and water every day; after about a week it should bubble and smell pleasantly sour."),
    ("What's the best way to begin a sourdough starter at home?", "Combine whole wheat flour with lukewarm water, cover loosely, and discard half and refresh it daily. Within five to ten days the wild yeast will make it rise predictably."),
    ("My sourdough starter isn't rising. What am I doing wrong?", "A sluggish starter is usually too cold or underfed. Move it somewhere warmer, feed it twice a day with unbleached flour, and use filtered water if your tap water is chlorinated."),
    ("How often should I feed a sourdough starter kept on the counter?", "At room temperature a starter needs feeding once or twice a day: discard most of it and add fresh flour and water in equal weights so the yeast always has food."),
    ("Can you explain how to keep a sourdough culture alive?", "Keep the culture in a clean jar, refresh it with flour and water on a regular schedule, and store it in the fridge between bakes, feeding it weekly there."),
    ("Which flour works best for a new sourdough starter?", "Whole grain rye or whole wheat flour gets a starter going fastest because it carries more wild yeast and nutrients; you can switch to white bread flour once it is active."),
    ("How do I know when my sourdough starter is ready to bake with?", "It is ready when it reliably doubles within four to eight hours of a feeding, has lots of bubbles, and a spoonful floats in water."),
    ("Why does my sourdough starter smell like nail polish remover?", "An acetone smell means the starter is hungry. Feed it more often or at a higher ratio of fresh flour and water, and the smell will fade within a couple of days."),
    ("What ratio of flour to water should a sourdough starter have?", "Most bakers keep a starter at one hundred percent hydration, equal weights of flour and water, which is easy to stir and ferments at a steady pace."),
    ("Is it possible to revive a sourdough starter that has been in the fridge for a month?", "Yes. Pour off the dark liquid on top, discard most of the starter, and feed it at room temperature twice a day; it usually recovers within three or four days."),
];

fn real(tier: TierChoice, rt: &tokio::runtime::Runtime) -> Option<(Semantic, Metrics)> {
    let dir = crate::embed::tests::real_model()?;
    Some(build_with(&dir, tier, rt))
}

/// The tiers residue runs by default: `cascade` on the CPU, `transformer`
/// on a GPU. The static tier alone is a candidate net (see
/// `the_static_tier_points_at_the_source_of_a_paraphrased_leak`).
const TIERS: [TierChoice; 2] = [TierChoice::Cascade, TierChoice::Transformer];

fn detectors(findings: &[Finding]) -> Vec<&'static str> {
    findings.iter().map(|f| f.detector).collect()
}

/// The longest run of words two texts share, lower-cased, punctuation
/// dropped: the test's own check that the leak is not an exact one.
fn longest_shared_words(a: &str, b: &str) -> usize {
    let words = |s: &str| -> Vec<String> {
        s.split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(|w| w.to_lowercase())
            .collect()
    };
    let (a, b) = (words(a), words(b));
    let mut best = 0;
    for i in 0..a.len() {
        for j in 0..b.len() {
            let mut k = 0;
            while i + k < a.len() && j + k < b.len() && a[i + k] == b[j + k] {
                k += 1;
            }
            best = best.max(k);
        }
    }
    best
}

#[test]
fn a_paraphrase_of_another_tenants_prompt_is_a_semantic_leak_from_that_tenant() {
    assert!(longest_shared_words(A_PROMPT, B_LEAKED_ANSWER) < 8);
    let rt = runtime();
    for tier in TIERS {
        let Some((sem, _)) = real(tier, &rt) else {
            return;
        };
        sem.record_prompt(&tenant("a"), &prompt(A_PROMPT));
        sem.record_prompt(&tenant("b"), &prompt(B_PROMPT));
        let f = sem
            .check(&tenant("b"), &prompt(B_PROMPT), B_LEAKED_ANSWER)
            .expect("check");
        eprintln!(
            "{tier:?}: {:#?}",
            f.iter().map(|f| &f.evidence).collect::<Vec<_>>()
        );
        let leak = f
            .iter()
            .find(|f| f.detector == LEAK)
            .unwrap_or_else(|| panic!("{tier:?}: no semantic_leak in {f:#?}"));
        assert_eq!(leak.evidence["source_tenant"], "a", "{tier:?}");
        assert!(!leak.spans.is_empty());
        if tier == TierChoice::Cascade {
            // Once the model has embedded A's prompt, the cascade decides in
            // the model's own window.
            let deep = sem.deep.as_ref().expect("cascade keeps a model window");
            for _ in 0..200 {
                if deep.stats().entries >= 2 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(deep.stats().entries >= 2, "both prompts embedded");
            let f = sem
                .check(&tenant("b"), &prompt(B_PROMPT), B_LEAKED_ANSWER)
                .expect("check");
            let leak = f.iter().find(|f| f.detector == LEAK).expect("leak");
            assert_eq!(leak.evidence["space"], "transformer", "{f:#?}");
            assert_eq!(leak.evidence["source_tenant"], "a");
        }
        // The answer to B's own question is fine.
        let f = sem
            .check(&tenant("b"), &prompt(B_PROMPT), B_HONEST_ANSWER)
            .expect("check");
        assert!(f.is_empty(), "{tier:?}: honest answer flagged: {f:#?}");
    }
}

#[test]
fn ten_tenants_asking_about_one_popular_topic_raise_nothing() {
    let rt = runtime();
    for tier in TIERS {
        let Some((sem, _)) = real(tier, &rt) else {
            return;
        };
        for (i, (q, _)) in POPULAR.iter().enumerate() {
            sem.record_prompt(&tenant(&format!("t{i}")), &prompt(q));
        }
        for (i, (q, a)) in POPULAR.iter().enumerate() {
            let f = sem
                .check(&tenant(&format!("t{i}")), &prompt(q), a)
                .expect("check");
            assert!(f.is_empty(), "{tier:?} tenant {i}: {f:#?}");
        }
    }
}

#[test]
fn an_answer_unrelated_to_its_prompt_is_a_relevance_incident() {
    let rt = runtime();
    for tier in TIERS {
        let Some((sem, metrics)) = real(tier, &rt) else {
            return;
        };
        let q = prompt(
            "What is the capital of Australia, and why was it chosen over Sydney and Melbourne?",
        );
        sem.record_prompt(&tenant("c"), &q);
        let f = sem
            .check(&tenant("c"), &q, UNRELATED_ANSWER)
            .expect("check");
        let space = if tier == TierChoice::Transformer {
            "transformer"
        } else {
            "static"
        };
        eprintln!(
            "{tier:?}: unrelated relevance {}",
            metrics
                .semantic_relevance
                .with_label_values(&[space])
                .get_sample_sum()
        );
        assert_eq!(detectors(&f), vec![RELEVANCE], "{tier:?}: {f:#?}");
        let honest = "Canberra is the capital. It was purpose-built as a compromise, because neither Sydney nor Melbourne would accept the other as the capital when the colonies federated in 1901.";
        let f = sem.check(&tenant("c"), &q, honest).expect("check");
        assert!(f.is_empty(), "{tier:?}: honest answer flagged: {f:#?}");
        let h =
            metrics
                .semantic_relevance
                .with_label_values(&[if tier == TierChoice::Transformer {
                    "transformer"
                } else {
                    "static"
                }]);
        assert_eq!(h.get_sample_count(), 2, "{tier:?}");
    }
}

#[test]
fn the_static_tier_points_at_the_source_of_a_paraphrased_leak() {
    let rt = runtime();
    let Some((sem, _)) = real(TierChoice::Static, &rt) else {
        return;
    };
    sem.record_prompt(&tenant("a"), &prompt(A_PROMPT));
    sem.record_prompt(&tenant("b"), &prompt(B_PROMPT));
    let (f, scores) = sem
        .check_scored(&tenant("b"), &prompt(B_PROMPT), B_LEAKED_ANSWER)
        .expect("check");
    let (source, foreign, own) = scores.best_foreign.expect("a foreign candidate");
    eprintln!("static: foreign {foreign:.3}, own {own:.3}, findings {f:?}");
    assert_eq!(source, sem.names.key_of(&tenant("a")));
    assert!(foreign - own > 0.2, "foreign {foreign}, own {own}");
}
