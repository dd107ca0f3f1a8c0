//! The incident replay's scorecard: the simulator's ground truth joined with
//! residue's incidents on the request id.
//!
//! What it answers: of each fault injected, how many responses residue
//! caught (any incident for that request) and with which detector; whether
//! every leak residue is expected to catch was caught — every placeholder
//! and stale-block leak, every splice of 15 words or more, and every PII
//! value crossing tenants (by `cross_tenant_pii` itself); how many clean
//! responses drew an incident (false positives); how long from the first
//! leak to the first incident on a leaked response; and, when measured,
//! residue's added latency.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::scenario::{Fault, Truth};

/// Splices at least this long (in words) must be caught.
pub const SPLICE_MIN_WORDS: usize = 15;
/// The detector that must catch every PII value crossing tenants.
pub const PII_DETECTOR: &str = "cross_tenant_pii";
/// Request ids listed per miss class (the counts are always complete).
const MAX_IDS: usize = 20;

/// An incident as residue writes it (`crate::incident::Incident`), read
/// back; fields the scorecard does not need are optional.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IncidentRecord {
    pub time: String,
    #[serde(default)]
    pub id: String,
    pub request_id: String,
    #[serde(default)]
    pub tenant: String,
    pub detector: String,
    #[serde(default)]
    pub severity: String,
    #[serde(default)]
    pub action: String,
    #[serde(default)]
    pub status: u16,
    #[serde(default)]
    pub evidence: serde_json::Value,
}

/// residue's added latency, milliseconds: its own time on a request before
/// forwarding it and before returning the response head
/// (`residue_added_latency_seconds`). Each figure is the upper bound of the
/// histogram bucket that holds the quantile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub samples: u64,
}

/// One fault's row.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FaultScore {
    pub fault: String,
    pub injected: u64,
    /// Responses with at least one incident.
    pub caught: u64,
    pub missed: u64,
    /// Responses each detector flagged (a response may count under
    /// several).
    pub by_detector: BTreeMap<String, u64>,
}

/// A class of leaks that must all be caught.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Check {
    pub total: u64,
    pub caught: u64,
    pub missed: u64,
    /// The first few missed request ids.
    pub missed_ids: Vec<String>,
}

impl Check {
    fn add(&mut self, id: &str, caught: bool) {
        self.total += 1;
        if caught {
            self.caught += 1;
        } else {
            self.missed += 1;
            if self.missed_ids.len() < MAX_IDS {
                self.missed_ids.push(id.to_string());
            }
        }
    }
}

/// Responses without any fault.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CleanScore {
    pub responses: u64,
    /// Clean responses with at least one incident.
    pub false_positives: u64,
    pub by_detector: BTreeMap<String, u64>,
    pub false_positive_ids: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Scorecard {
    pub responses: u64,
    pub incidents: u64,
    /// Incidents whose request id is in no ground-truth line (requests the
    /// simulator never answered, or another run's).
    pub incidents_unmatched: u64,
    /// Lines of either file that did not parse (replay only).
    pub bad_truth_lines: u64,
    pub bad_incident_lines: u64,
    pub faults: Vec<FaultScore>,
    /// Every response carrying another request's content.
    pub leaks: Check,
    /// Leaks residue must catch: all but splices shorter than
    /// [`SPLICE_MIN_WORDS`] without PII.
    pub expected_leaks: Check,
    pub placeholder_leaks: Check,
    /// Splices of at least [`SPLICE_MIN_WORDS`] words.
    pub long_splices: Check,
    /// Leaks with PII in them, caught by [`PII_DETECTOR`].
    pub pii_leaks: Check,
    pub clean: CleanScore,
    /// The first leaked response's time (ground truth).
    pub first_leak: Option<String>,
    /// The first incident on a leaked response.
    pub first_leak_incident: Option<String>,
    /// The time between the two, milliseconds.
    pub time_to_first_incident_ms: Option<f64>,
    pub latency: Option<LatencySummary>,
    /// See [`Scorecard::missed_leaks`].
    pub missed_leaks: u64,
    /// No expected leak missed and no false positive.
    pub passed: bool,
}

fn millis(time: &str) -> Option<f64> {
    let t = humantime::parse_rfc3339_weak(time).ok()?;
    let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
    Some(d.as_secs_f64() * 1000.0)
}

/// Scores ground truth against incidents.
pub fn score(
    truth: &[Truth],
    incidents: &[IncidentRecord],
    latency: Option<LatencySummary>,
) -> Scorecard {
    let mut by_request: HashMap<&str, Vec<&IncidentRecord>> = HashMap::new();
    for i in incidents {
        by_request.entry(i.request_id.as_str()).or_default().push(i);
    }
    let known: std::collections::HashSet<&str> =
        truth.iter().map(|t| t.request_id.as_str()).collect();
    let mut card = Scorecard {
        responses: truth.len() as u64,
        incidents: incidents.len() as u64,
        incidents_unmatched: incidents
            .iter()
            .filter(|i| !known.contains(i.request_id.as_str()))
            .count() as u64,
        latency,
        ..Scorecard::default()
    };
    let mut faults: BTreeMap<Fault, FaultScore> = Fault::ALL
        .iter()
        .map(|f| {
            (
                *f,
                FaultScore {
                    fault: f.as_str().to_string(),
                    ..FaultScore::default()
                },
            )
        })
        .collect();
    let mut first_leak: Option<(f64, &str)> = None;
    let mut first_incident: Option<(f64, &str)> = None;
    for t in truth {
        let found = by_request
            .get(t.request_id.as_str())
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let mut detectors: Vec<&str> = found.iter().map(|i| i.detector.as_str()).collect();
        detectors.sort_unstable();
        detectors.dedup();
        let caught = !detectors.is_empty();
        let id = t.request_id.as_str();
        match t.fault {
            Some(f) => {
                let row = faults.get_mut(&f).expect("every fault has a row");
                row.injected += 1;
                if caught {
                    row.caught += 1;
                } else {
                    row.missed += 1;
                }
                for d in &detectors {
                    *row.by_detector.entry(d.to_string()).or_default() += 1;
                }
            }
            None if !t.leaked => {
                card.clean.responses += 1;
                if caught {
                    card.clean.false_positives += 1;
                    if card.clean.false_positive_ids.len() < MAX_IDS {
                        card.clean.false_positive_ids.push(id.to_string());
                    }
                }
                for d in &detectors {
                    *card.clean.by_detector.entry(d.to_string()).or_default() += 1;
                }
            }
            None => {}
        }
        if !t.leaked {
            continue;
        }
        card.leaks.add(id, caught);
        // Fragments shorter than residue's guaranteed run (a short splice, or
        // a stale answer quoting few of its owner's words) are scored but
        // not required: exact matching promises runs of 12 words and more.
        let short = t.leaked_words < SPLICE_MIN_WORDS
            && matches!(t.fault, Some(Fault::Splice | Fault::StaleBlock));
        let short_splice = short && t.fault == Some(Fault::Splice);
        let expected = !short || t.leaked_pii > 0;
        if expected {
            card.expected_leaks.add(id, caught);
        }
        let pii_caught = detectors.contains(&PII_DETECTOR);
        if (expected && !caught) || (t.leaked_pii > 0 && !pii_caught) {
            card.missed_leaks += 1;
        }
        if t.fault == Some(Fault::Placeholder) {
            card.placeholder_leaks.add(id, caught);
        }
        if t.fault == Some(Fault::Splice) && !short_splice {
            card.long_splices.add(id, caught);
        }
        if t.leaked_pii > 0 {
            card.pii_leaks.add(id, pii_caught);
        }
        if let Some(ms) = millis(&t.time) {
            if first_leak.is_none_or(|(m, _)| ms < m) {
                first_leak = Some((ms, &t.time));
            }
        }
        for i in found {
            if let Some(ms) = millis(&i.time) {
                if first_incident.is_none_or(|(m, _)| ms < m) {
                    first_incident = Some((ms, &i.time));
                }
            }
        }
    }
    card.faults = faults.into_values().collect();
    card.first_leak = first_leak.map(|(_, t)| t.to_string());
    card.first_leak_incident = first_incident.map(|(_, t)| t.to_string());
    if let (Some((a, _)), Some((b, _))) = (first_leak, first_incident) {
        card.time_to_first_incident_ms = Some(b - a);
    }
    card.passed = card.missed_leaks() == 0 && card.clean.false_positives == 0;
    card
}

/// Parses JSON lines, skipping blank lines and counting the ones that do
/// not parse (garbage, a line cut by a crash).
pub fn parse_lines<T: serde::de::DeserializeOwned>(text: &str) -> (Vec<T>, u64) {
    let mut out = Vec::new();
    let mut bad = 0;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(v) => out.push(v),
            Err(_) => bad += 1,
        }
    }
    (out, bad)
}

/// Re-scores from saved files' contents: the simulator's ground truth and
/// residue's incident log, both JSON lines.
pub fn replay(truth: &str, incidents: &str, latency: Option<LatencySummary>) -> Scorecard {
    let (truth, bad_truth) = parse_lines::<Truth>(truth);
    let (incidents, bad_incidents) = parse_lines::<IncidentRecord>(incidents);
    let mut card = score(&truth, &incidents, latency);
    card.bad_truth_lines = bad_truth;
    card.bad_incident_lines = bad_incidents;
    card
}

impl Scorecard {
    /// Leaks residue was expected to catch and did not: expected leaks with
    /// no incident, and PII leaks [`PII_DETECTOR`] did not flag (each
    /// response counted once).
    pub fn missed_leaks(&self) -> usize {
        self.missed_leaks as usize
    }

    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        let verdict = if self.passed { "PASS" } else { "FAIL" };
        let _ = writeln!(s, "## residue scorecard: {verdict}\n");
        let _ = writeln!(
            s,
            "{} responses, {} incidents ({} on unknown requests).\n",
            self.responses, self.incidents, self.incidents_unmatched
        );
        if self.bad_truth_lines + self.bad_incident_lines > 0 {
            let _ = writeln!(
                s,
                "Skipped unreadable lines: {} ground truth, {} incidents.\n",
                self.bad_truth_lines, self.bad_incident_lines
            );
        }
        let _ = writeln!(s, "| fault | injected | caught | missed | by detector |");
        let _ = writeln!(s, "|---|---:|---:|---:|---|");
        for f in &self.faults {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                f.fault,
                f.injected,
                f.caught,
                f.missed,
                detectors(&f.by_detector)
            );
        }
        let _ = writeln!(s, "\n| must catch | total | caught | missed |");
        let _ = writeln!(s, "|---|---:|---:|---:|");
        for (name, c) in [
            ("placeholder leaks", &self.placeholder_leaks),
            ("splices >= 15 words", &self.long_splices),
            ("PII across tenants (cross_tenant_pii)", &self.pii_leaks),
            ("all expected leaks", &self.expected_leaks),
        ] {
            let _ = writeln!(s, "| {name} | {} | {} | {} |", c.total, c.caught, c.missed);
        }
        let _ = writeln!(
            s,
            "\nAll leaks (short splices included): {} of {} caught.",
            self.leaks.caught, self.leaks.total
        );
        let _ = writeln!(
            s,
            "\nClean responses: {}, false positives: {}{}.",
            self.clean.responses,
            self.clean.false_positives,
            if self.clean.by_detector.is_empty() {
                String::new()
            } else {
                format!(" ({})", detectors(&self.clean.by_detector))
            }
        );
        if let Some(ms) = self.time_to_first_incident_ms {
            let _ = writeln!(s, "\nFirst leak to first incident: {ms:.0} ms.");
        } else if self.first_leak.is_some() {
            let _ = writeln!(s, "\nFirst leak to first incident: no incident on a leak.");
        }
        if let Some(l) = &self.latency {
            let _ = writeln!(
                s,
                "\nresidue's added latency (its own histogram, bucket upper bounds): p50 ≤ {} ms, p99 ≤ {} ms ({} samples).",
                l.p50_ms, l.p99_ms, l.samples
            );
        }
        let mut misses = Vec::new();
        for (name, c) in [
            ("expected leak", &self.expected_leaks),
            ("PII leak", &self.pii_leaks),
        ] {
            if !c.missed_ids.is_empty() {
                misses.push(format!("{name}: {}", c.missed_ids.join(", ")));
            }
        }
        if !self.clean.false_positive_ids.is_empty() {
            misses.push(format!(
                "false positive: {}",
                self.clean.false_positive_ids.join(", ")
            ));
        }
        if !misses.is_empty() {
            let _ = writeln!(s, "\nRequests to look at:\n");
            for m in misses {
                let _ = writeln!(s, "- {m}");
            }
        }
        s
    }
}

fn detectors(map: &BTreeMap<String, u64>) -> String {
    if map.is_empty() {
        return "-".to_string();
    }
    map.iter()
        .map(|(d, n)| format!("{d} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn truth(id: &str, time: &str, fault: Option<Fault>, words: usize, pii: usize) -> Truth {
        Truth {
            time: time.to_string(),
            request_id: id.to_string(),
            tenant: "tenant-01".into(),
            endpoint: "chat".into(),
            stream: false,
            fault,
            leaked: fault.is_some_and(|f| f.leaks()),
            source_request_id: None,
            source_tenant: None,
            span: None,
            leaked_words: words,
            leaked_pii: pii,
            prompt_tokens_reported: 10,
            prompt_tokens_real: 10,
        }
    }

    fn incident(id: &str, time: &str, detector: &str) -> IncidentRecord {
        IncidentRecord {
            time: time.to_string(),
            id: format!("inc-{id}-{detector}"),
            request_id: id.to_string(),
            tenant: "abc".into(),
            detector: detector.to_string(),
            severity: "high".into(),
            action: "monitor".into(),
            status: 200,
            evidence: serde_json::Value::Null,
        }
    }

    const T0: &str = "2025-01-01T00:00:00.000Z";
    const T1: &str = "2025-01-01T00:00:01.000Z";
    const T2: &str = "2025-01-01T00:00:02.250Z";

    fn sample() -> (Vec<Truth>, Vec<IncidentRecord>) {
        let truth = vec![
            truth("clean-1", T0, None, 0, 0),
            truth("clean-2", T0, None, 0, 0),
            truth("clean-3", T0, None, 0, 0),
            truth("ph-1", T1, Some(Fault::Placeholder), 200, 2),
            truth("ph-2", T2, Some(Fault::Placeholder), 120, 0),
            truth("sp-long", T2, Some(Fault::Splice), 30, 1),
            truth("sp-short", T2, Some(Fault::Splice), 5, 0),
            truth("sp-edge", T2, Some(Fault::Splice), 15, 0),
            truth("stale", T2, Some(Fault::StaleBlock), 80, 0),
            truth("garbage", T2, Some(Fault::Garbage), 0, 0),
        ];
        let incidents = vec![
            incident("clean-2", T2, "cross_tenant_ngram"),
            incident("ph-1", T2, "cross_tenant_ngram"),
            incident("ph-1", T2, "prompt_accounting"),
            // Caught, but not by the PII detector.
            incident("sp-long", T2, "cross_tenant_ngram"),
            incident("sp-edge", "2025-01-01T00:00:02.500Z", "cross_tenant_ngram"),
            incident("stale", T2, "cross_tenant_ngram"),
            incident("garbage", T2, "prompt_accounting"),
            incident("nobody", T2, "canary"),
        ];
        (truth, incidents)
    }

    #[test]
    fn arithmetic() {
        let (t, i) = sample();
        let c = score(&t, &i, None);
        assert_eq!(c.responses, 10);
        assert_eq!(c.incidents, 8);
        assert_eq!(c.incidents_unmatched, 1);
        let ph = &c.faults[0];
        assert_eq!(
            (ph.fault.as_str(), ph.injected, ph.caught, ph.missed),
            ("placeholder", 2, 1, 1)
        );
        assert_eq!(ph.by_detector["prompt_accounting"], 1);
        let splice = c.faults.iter().find(|f| f.fault == "splice").unwrap();
        assert_eq!((splice.injected, splice.caught, splice.missed), (3, 2, 1));
        let garbage = c.faults.iter().find(|f| f.fault == "garbage").unwrap();
        assert_eq!((garbage.injected, garbage.caught), (1, 1));

        assert_eq!(
            (c.placeholder_leaks.total, c.placeholder_leaks.missed),
            (2, 1)
        );
        assert_eq!(c.placeholder_leaks.missed_ids, vec!["ph-2"]);
        // 15 words exactly counts; 5 does not.
        assert_eq!((c.long_splices.total, c.long_splices.caught), (2, 2));
        // sp-long has PII but only n-gram caught it: a PII miss.
        assert_eq!((c.pii_leaks.total, c.pii_leaks.caught), (2, 0));
        assert_eq!(c.pii_leaks.missed_ids, vec!["ph-1", "sp-long"]);
        // Leaks: ph-1, ph-2, 3 splices, stale (garbage does not leak).
        assert_eq!((c.leaks.total, c.leaks.caught), (6, 4));
        assert_eq!((c.expected_leaks.total, c.expected_leaks.missed), (5, 1));
        // ph-2 (no incident), ph-1 and sp-long (PII not flagged by the PII
        // detector).
        assert_eq!(c.missed_leaks(), 3);

        assert_eq!((c.clean.responses, c.clean.false_positives), (3, 1));
        assert_eq!(c.clean.by_detector["cross_tenant_ngram"], 1);
        assert_eq!(c.clean.false_positive_ids, vec!["clean-2"]);

        assert_eq!(c.first_leak.as_deref(), Some(T1));
        assert_eq!(c.first_leak_incident.as_deref(), Some(T2));
        assert_eq!(c.time_to_first_incident_ms, Some(1250.0));
        assert!(!c.passed);
    }

    #[test]
    fn a_clean_run_passes() {
        let truth = vec![
            truth("a", T0, None, 0, 0),
            truth("b", T1, Some(Fault::Placeholder), 50, 1),
            truth("c", T1, Some(Fault::Splice), 3, 0),
        ];
        let incidents = vec![incident("b", T2, "cross_tenant_pii")];
        let c = score(
            &truth,
            &incidents,
            Some(LatencySummary {
                p50_ms: 0.4,
                p99_ms: 1.7,
                samples: 100,
            }),
        );
        assert!(c.passed, "{c:#?}");
        assert_eq!(c.missed_leaks(), 0);
        // The short splice is a leak, missed, but not expected.
        assert_eq!((c.leaks.total, c.leaks.caught), (2, 1));
        let md = c.to_markdown();
        assert!(md.contains("PASS"));
        assert!(md.contains("p99 ≤ 1.7 ms"), "{md}");
    }

    #[test]
    fn markdown_carries_the_numbers() {
        let (t, i) = sample();
        let md = score(&t, &i, None).to_markdown();
        assert!(md.contains("FAIL"), "{md}");
        assert!(
            md.contains("| placeholder | 2 | 1 | 1 | cross_tenant_ngram 1, prompt_accounting 1 |"),
            "{md}"
        );
        assert!(
            md.contains("| splice | 3 | 2 | 1 | cross_tenant_ngram 2 |"),
            "{md}"
        );
        assert!(md.contains("| splices >= 15 words | 2 | 2 | 0 |"), "{md}");
        assert!(
            md.contains("| PII across tenants (cross_tenant_pii) | 2 | 0 | 2 |"),
            "{md}"
        );
        assert!(
            md.contains("false positives: 1 (cross_tenant_ngram 1)"),
            "{md}"
        );
        assert!(md.contains("1250 ms"), "{md}");
        assert!(md.contains("ph-2"), "{md}");
        let json = serde_json::to_value(score(&t, &i, None)).unwrap();
        assert_eq!(json["clean"]["false_positives"], 1);
        assert_eq!(json["faults"][0]["fault"], "placeholder");
    }

    #[test]
    fn replay_survives_hostile_lines() {
        let (t, i) = sample();
        let mut truth_text: String = t
            .iter()
            .map(|t| serde_json::to_string(t).unwrap() + "\n")
            .collect();
        truth_text.push_str("not json\n{\"time\": \"x\"\n\n");
        let mut inc_text = String::from("\u{feff}garbage\n{}\n[1,2]\n");
        for i in &i {
            inc_text.push_str(&serde_json::to_string(i).unwrap());
            inc_text.push('\n');
        }
        // A line cut mid-write, and a record with a wrong-typed field.
        inc_text.push_str("{\"time\":\"2025-01-01T00:00:02.000Z\",\"request_id\":\"ph-2\",\"detec");
        inc_text.push_str("\n{\"time\":1,\"request_id\":\"ph-2\",\"detector\":\"canary\"}\n");
        inc_text.push_str("\u{0}\u{1}\u{ffff}\n");
        let c = replay(&truth_text, &inc_text, None);
        assert_eq!(c.bad_truth_lines, 2);
        assert_eq!(c.bad_incident_lines, 6);
        assert_eq!(c, {
            let mut d = score(&t, &i, None);
            d.bad_truth_lines = 2;
            d.bad_incident_lines = 6;
            d
        });
        // Real incidents, as residue serialises them, parse.
        let line = r#"{"time":"2025-01-01T00:00:02.000Z","id":"inc-1","request_id":"ph-2","tenant":"t","tenant_source":"header","family":"openai","endpoint":"chat","detector":"cross_tenant_ngram","severity":"high","score":0.9,"evidence":{"run":12},"action":"monitor","status":200}"#;
        let (v, bad) = parse_lines::<IncidentRecord>(line);
        assert_eq!((v.len(), bad), (1, 0));
        // Bad timestamps do not panic; they just give no timing.
        let c = score(
            &[truth("x", "yesterday", Some(Fault::Placeholder), 20, 0)],
            &[incident("x", "soon", "canary")],
            None,
        );
        assert_eq!(c.time_to_first_incident_ms, None);
        assert_eq!(c.placeholder_leaks.caught, 1);
    }
}
