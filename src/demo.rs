//! `residue demo`: the incident, replayed on demand.
//!
//! Starts the faulty-engine simulator, residue in monitor mode with every
//! detector in front of it, and multi-tenant traffic through residue; shows
//! live progress; ends with the scorecard (faults injected vs caught, false
//! positives on clean answers, time to the first incident, residue's added
//! latency). Fails when an injected leak went undetected.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::config::Config;
use crate::load::{self, Corpus, LoadConfig};
use crate::scenario::Fault;
use crate::scorecard::{self, LatencySummary, Scorecard};
use crate::server::Residue;
use crate::sim::{self, SimConfig};

/// What one demo run does.
#[derive(Clone, Debug)]
pub struct DemoConfig {
    pub requests: usize,
    pub tenants: usize,
    pub concurrency: usize,
    pub seed: u64,
    /// Prompts longer than this many tokens overflow the simulated prefill.
    pub capacity_tokens: u64,
    pub over_capacity_fraction: f64,
    pub stream_fraction: f64,
    pub faults: Vec<(Fault, f64)>,
    pub corpus: Corpus,
    /// Where ground truth, incidents and the scorecard are written.
    pub out_dir: PathBuf,
    /// Draw a progress bar (off in tests).
    pub progress: bool,
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig {
            requests: 1_000,
            tenants: 12,
            concurrency: 16,
            seed: 7,
            capacity_tokens: 2_048,
            over_capacity_fraction: 0.04,
            stream_fraction: 0.5,
            faults: vec![
                (Fault::Placeholder, 1.0),
                (Fault::StaleBlock, 0.02),
                (Fault::Splice, 0.04),
                (Fault::Garbage, 0.02),
            ],
            corpus: Corpus::Builtin,
            out_dir: PathBuf::from("residue-demo"),
            progress: true,
        }
    }
}

/// The outcome of a demo run.
pub struct DemoOutcome {
    pub scorecard: Scorecard,
    pub markdown: String,
    pub elapsed: Duration,
    /// Answers residue did not scan, by reason (load shedding, unreadable
    /// bodies): counted, never waited for.
    pub not_scanned: BTreeMap<String, u64>,
    /// Answers still unscanned when the demo stopped waiting (30 s).
    pub scans_pending: u64,
    /// Requests sent, and answered with a 2xx.
    pub sent: u64,
    pub ok: u64,
}

impl DemoOutcome {
    /// Why the run does not show what it should, if it does not: a missed
    /// leak, a false positive, requests that failed, scans never done, or
    /// nothing injected at all.
    pub fn failures(&self) -> Vec<String> {
        let card = &self.scorecard;
        let mut out = Vec::new();
        if card.missed_leaks > 0 {
            out.push(format!(
                "{} injected leak(s) went undetected",
                card.missed_leaks
            ));
        }
        if card.clean.false_positives > 0 {
            out.push(format!(
                "{} clean answer(s) were flagged",
                card.clean.false_positives
            ));
        }
        if self.ok < self.sent {
            out.push(format!(
                "{} of {} requests failed",
                self.sent - self.ok,
                self.sent
            ));
        }
        if self.scans_pending > 0 {
            out.push(format!("{} answers were never scanned", self.scans_pending));
        }
        if card.leaks.total == 0 {
            out.push("no leak was injected".to_string());
        }
        out
    }
}

/// The residue configuration of the demo: monitor mode (the default), every
/// detector (the default), tenants named by the traffic's header, incidents
/// with raw tenant names (they are the demo's made-up tenants) so that the
/// scorecard can check attribution.
fn residue_config(upstream: &str, out_dir: &std::path::Path) -> anyhow::Result<Config> {
    let mut config = Config::default();
    config.server.listen = "127.0.0.1:0".parse()?;
    config.server.admin_listen = "127.0.0.1:0".parse()?;
    config.upstream.url = upstream.to_string();
    config.tenant.trust_header = true;
    config.incidents.path = Some(out_dir.join("incidents.jsonl"));
    config.incidents.raw_tenant = true;
    Ok(config)
}

/// Runs the demo.
pub async fn run(config: DemoConfig) -> anyhow::Result<DemoOutcome> {
    let started = Instant::now();
    std::fs::create_dir_all(&config.out_dir)
        .with_context(|| format!("creating {}", config.out_dir.display()))?;
    let truth_path = config.out_dir.join("truth.jsonl");
    let incidents_path = config.out_dir.join("incidents.jsonl");
    for p in [&truth_path, &incidents_path] {
        let _ = std::fs::remove_file(p);
    }

    let sim = sim::start(SimConfig {
        listen: "127.0.0.1:0".parse()?,
        seed: config.seed,
        prefill_capacity_tokens: config.capacity_tokens,
        faults: config.faults.clone(),
        truth_path: Some(truth_path.clone()),
        token_delay: Duration::from_millis(1),
        ..SimConfig::default()
    })
    .await
    .context("starting the simulator")?;

    let sim_truth = sim.truth.clone();
    let residue = Residue::bind(residue_config(
        &format!("http://{}", sim.addr),
        &config.out_dir,
    )?)
    .await
    .context("starting residue")?
    .spawn();

    // Live counts of incidents by detector, for the progress line.
    let by_detector: Arc<Mutex<BTreeMap<&'static str, u64>>> = Default::default();
    let mut live = residue.incidents.subscribe();
    let listener = {
        let by_detector = by_detector.clone();
        tokio::spawn(async move {
            loop {
                match live.recv().await {
                    Ok(incident) => {
                        *by_detector
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .entry(incident.detector)
                            .or_default() += 1;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => break,
                }
            }
        })
    };

    let bar = if config.progress {
        let bar = indicatif::ProgressBar::new(config.requests as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} requests  {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        Some(bar)
    } else {
        None
    };
    let report = {
        let bar = bar.clone();
        let (by_detector, truth) = (by_detector.clone(), sim.truth.clone());
        load::run(
            LoadConfig {
                target: format!("http://{}", residue.addr),
                tenants: config.tenants,
                seed: config.seed,
                requests: Some(config.requests),
                duration: None,
                rate: None,
                concurrency: config.concurrency,
                stream_fraction: config.stream_fraction,
                over_capacity_fraction: config.over_capacity_fraction,
                capacity_tokens: config.capacity_tokens,
                corpus: config.corpus.clone(),
                endpoints: load::ENDPOINTS.iter().map(|e| e.to_string()).collect(),
                ..LoadConfig::default()
            },
            move |p| {
                if let Some(bar) = &bar {
                    bar.set_position(p.sent);
                    let faults = truth.records().iter().filter(|t| t.fault.is_some()).count();
                    let incidents: Vec<String> = by_detector
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .iter()
                        .map(|(d, n)| format!("{d} {n}"))
                        .collect();
                    bar.set_message(format!(
                        "200s {}  faults {faults}  incidents: {}",
                        p.ok,
                        if incidents.is_empty() {
                            "none yet".to_string()
                        } else {
                            incidents.join(", ")
                        }
                    ));
                }
            },
        )
        .await
        .context("running the traffic")?
    };

    // Scans finish after the last byte went out: wait for every exchange.
    let deadline = Instant::now() + Duration::from_secs(30);
    let scans_done = || {
        counter_sum(&residue.metrics.scanned)
            + counter_sum(&residue.metrics.unscanned)
            + counter_sum(&residue.metrics.scan_dropped)
    };
    while scans_done() < report.sent && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let scans_pending = report.sent.saturating_sub(scans_done());
    if let Some(bar) = &bar {
        bar.finish();
    }

    let latency = latency_summary(&residue.metrics);
    let mut not_scanned = by_label(&residue.metrics.scan_dropped);
    for (reason, n) in by_label(&residue.metrics.unscanned) {
        *not_scanned.entry(reason).or_default() += n;
    }
    not_scanned.retain(|_, n| *n > 0);
    // Shutting residue down drains its scan and incident queues into
    // incidents.jsonl: the scorecard reads the file, every incident in it
    // (the live feed is for the progress line and may skip under load).
    residue.shutdown().await.ok();
    listener.abort();
    sim.shutdown().await;
    let truth = sim_truth.records();
    let text = std::fs::read_to_string(&incidents_path).unwrap_or_default();
    let (incidents, _bad) = scorecard::parse_lines::<scorecard::IncidentRecord>(&text);
    let card = scorecard::score(&truth, &incidents, Some(latency));
    let markdown = card.to_markdown();
    std::fs::write(
        config.out_dir.join("scorecard.json"),
        serde_json::to_vec_pretty(&card)?,
    )?;
    std::fs::write(config.out_dir.join("scorecard.md"), &markdown)?;

    Ok(DemoOutcome {
        scorecard: card,
        markdown,
        elapsed: started.elapsed(),
        not_scanned,
        scans_pending,
        sent: report.sent,
        ok: report.ok,
    })
}

/// A counter's values by its one label.
fn by_label(v: &prometheus::IntCounterVec) -> BTreeMap<String, u64> {
    use prometheus::core::Collector;
    let mut out = BTreeMap::new();
    for mf in v.collect() {
        for m in mf.get_metric() {
            let label = m
                .get_label()
                .first()
                .map(|l| l.get_value().to_string())
                .unwrap_or_default();
            *out.entry(label).or_default() += m.get_counter().get_value() as u64;
        }
    }
    out
}

fn counter_sum(v: &prometheus::IntCounterVec) -> u64 {
    by_label(v).values().sum()
}

/// residue's own added latency, p50 and p99: upper bounds of the
/// histogram's buckets.
fn latency_summary(metrics: &crate::metrics::Metrics) -> LatencySummary {
    use prometheus::core::Collector;
    let mut buckets: BTreeMap<u64, u64> = BTreeMap::new();
    let mut count = 0u64;
    for mf in metrics.added_latency.collect() {
        for m in mf.get_metric() {
            let h = m.get_histogram();
            count += h.get_sample_count();
            for b in h.get_bucket() {
                *buckets
                    .entry((b.get_upper_bound() * 1e9) as u64)
                    .or_default() += b.get_cumulative_count();
            }
        }
    }
    // The upper bound of the bucket that holds the quantile: the histogram
    // cannot say more (its first bucket is 0–50 µs).
    let quantile = |q: f64| -> f64 {
        let rank = (q * count as f64).ceil() as u64;
        buckets
            .iter()
            .find(|(_, cumulative)| **cumulative >= rank.max(1))
            .map_or(f64::INFINITY, |(upper_ns, _)| *upper_ns as f64 / 1e9)
    };
    LatencySummary {
        samples: count,
        p50_ms: if count == 0 { 0.0 } else { quantile(0.5) * 1e3 },
        p99_ms: if count == 0 {
            0.0
        } else {
            quantile(0.99) * 1e3
        },
    }
}
