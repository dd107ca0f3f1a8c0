//! Prometheus metrics. Every name starts with `residue_`; every label set is
//! bounded (families, status codes, detector names — never tenants, never
//! paths). Counters are touched once per request or per scan, never per byte.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// All of residue's metrics, registered in their own registry.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// Requests by family (`unknown` for unscanned routes) and status code.
    pub requests: IntCounterVec,
    /// From sending the request upstream to the end of the response body.
    pub upstream_duration: HistogramVec,
    /// From sending the request upstream to its response headers.
    pub upstream_ttfb: HistogramVec,
    /// Time residue itself spent before forwarding the request and before
    /// handing the response head back: its own added latency.
    pub added_latency: HistogramVec,
    /// Body bytes by direction (`request`, `response`).
    pub bytes: IntCounterVec,
    pub in_flight: IntGauge,
    /// Exchanges waiting for a scanner.
    pub scan_queue_depth: IntGauge,
    /// Exchanges that were not scanned, by reason (`queue_full`, `closed`).
    pub scan_dropped: IntCounterVec,
    /// Exchanges scanned, by family.
    pub scanned: IntCounterVec,
    /// Requests not scanned, by reason (`unknown_route`, `request_not_json`, …).
    pub unscanned: IntCounterVec,
    /// Responses whose body could not be fully decoded for scanning, by reason.
    pub scan_errors: IntCounterVec,
    pub incidents: IntCounterVec,
    /// Incidents that could not be written (writer queue full or I/O error).
    pub incidents_dropped: IntCounterVec,
    /// Upstream-reported prompt tokens divided by residue's own count.
    pub prompt_token_ratio: Histogram,
    /// Errors residue answered itself, by kind and source.
    pub errors: IntCounterVec,
    /// Requests residue refused before forwarding, by reason.
    pub rejected: IntCounterVec,
    /// How responses ended, by family and end (`complete`, `cancelled`, `error`).
    pub stream_end: IntCounterVec,
    pub build_info: IntGaugeVec,
    /// PII values seen in answers, by kind and owner (`requester`,
    /// `other_tenant`, `nobody`).
    pub pii_seen: IntCounterVec,
    /// Fingerprint store failures, by operation.
    pub store_errors: IntCounterVec,
    /// The fingerprint store: records, distinct hashes, approximate bytes,
    /// evictions and hashes looked up (refreshed at each scrape).
    pub store_entries: IntGauge,
    pub store_hashes: IntGauge,
    pub store_bytes: IntGauge,
    pub store_evictions: IntGauge,
    pub store_lookups: IntGauge,
    /// Answers under block or redact, by action and outcome (`pass`,
    /// `blocked`, `redacted`, `guarded_stream`, `fail_open`, `fail_closed`).
    pub enforced: IntCounterVec,
    /// Rule reloads (SIGHUP or a changed file), by result (`ok`, `error`).
    pub rules_reloads: IntCounterVec,
    /// PII and secret rules in force.
    pub rules_loaded: IntGauge,
    /// Embedding requests, by outcome (`ok`, `error`, `shed`, `stopped`,
    /// `cancelled`).
    pub embed_requests: IntCounterVec,
    /// Texts per model call of the embedding service.
    pub embed_batch_size: Histogram,
    /// The embedding model's device (`cpu`, `cuda:0`) and what runs its
    /// matrix products (`f32`, `int8-avx512-vnni`); always 1.
    pub embed_device: IntGaugeVec,
    /// Answer-to-own-prompt similarity of each scanned answer, by tier
    /// (`static`, `transformer`).
    pub semantic_relevance: HistogramVec,
    /// Semantic checks not made, by reason (`shed`, `timeout`, `stopped`,
    /// `error`: a prompt of token ids only, say).
    pub semantic_skipped: IntCounterVec,
    /// Static-tier candidates the transformer was asked to confirm, by
    /// detector and outcome (`confirmed`, `dismissed`).
    pub semantic_confirmations: IntCounterVec,
    /// Chunk vectors held by the semantic window.
    pub semantic_window_chunks: IntGauge,
    /// Time the semantic detectors took per answer, by tier.
    pub semantic_seconds: HistogramVec,
}

const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

const SIMILARITY_BUCKETS: &[f64] = &[
    -0.1, 0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
];

const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

const RATIO_BUCKETS: &[f64] = &[
    0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 5.0,
];

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
            let c = IntCounterVec::new(Opts::new(name, help), labels)
                .expect("valid metric. This is a bug.");
            r.register(Box::new(c.clone()))
                .expect("unique metric. This is a bug.");
            c
        }
        fn histogram(
            r: &Registry,
            name: &str,
            help: &str,
            labels: &[&str],
            buckets: &[f64],
        ) -> HistogramVec {
            let h = HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                labels,
            )
            .expect("valid metric. This is a bug.");
            r.register(Box::new(h.clone()))
                .expect("unique metric. This is a bug.");
            h
        }
        fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
            let g = IntGauge::new(name, help).expect("valid metric. This is a bug.");
            r.register(Box::new(g.clone()))
                .expect("unique metric. This is a bug.");
            g
        }
        let r = &registry;
        let prompt_token_ratio = Histogram::with_opts(
            HistogramOpts::new(
                "residue_prompt_token_ratio",
                "Upstream-reported prompt tokens divided by residue's own count.",
            )
            .buckets(RATIO_BUCKETS.to_vec()),
        )
        .expect("valid metric. This is a bug.");
        r.register(Box::new(prompt_token_ratio.clone()))
            .expect("unique metric. This is a bug.");
        let build_info = IntGaugeVec::new(
            Opts::new("residue_build_info", "residue's version; always 1."),
            &["version"],
        )
        .expect("valid metric. This is a bug.");
        r.register(Box::new(build_info.clone()))
            .expect("unique metric. This is a bug.");
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        let embed_batch_size = Histogram::with_opts(
            HistogramOpts::new(
                "residue_embed_batch_size",
                "Texts per model call of the embedding service.",
            )
            .buckets(BATCH_BUCKETS.to_vec()),
        )
        .expect("valid metric. This is a bug.");
        r.register(Box::new(embed_batch_size.clone()))
            .expect("unique metric. This is a bug.");
        let embed_device = IntGaugeVec::new(
            Opts::new(
                "residue_embed_device",
                "The embedding model's device and what runs its matrix products; always 1.",
            ),
            &["device", "kernel"],
        )
        .expect("valid metric. This is a bug.");
        r.register(Box::new(embed_device.clone()))
            .expect("unique metric. This is a bug.");
        Metrics {
            requests: counter(r, "residue_requests_total", "Requests by API family and status code.", &["family", "status"]),
            upstream_duration: histogram(r, "residue_upstream_duration_seconds", "From forwarding the request to the end of the upstream's response body.", &["family"], LATENCY_BUCKETS),
            upstream_ttfb: histogram(r, "residue_upstream_ttfb_seconds", "From forwarding the request to the upstream's response headers.", &["family"], LATENCY_BUCKETS),
            added_latency: histogram(r, "residue_added_latency_seconds", "Time residue itself spent on a request before forwarding it and before returning the response head.", &["family"], LATENCY_BUCKETS),
            bytes: counter(r, "residue_bytes_total", "Body bytes forwarded, by direction.", &["direction"]),
            in_flight: gauge(r, "residue_in_flight_requests", "Requests being forwarded now."),
            scan_queue_depth: gauge(r, "residue_scan_queue_depth", "Finished exchanges waiting for a scanner."),
            scan_dropped: counter(r, "residue_scan_dropped_total", "Exchanges not scanned because the scanner could not take them, by reason.", &["reason"]),
            scanned: counter(r, "residue_scanned_total", "Exchanges scanned, by API family.", &["family"]),
            unscanned: counter(r, "residue_unscanned_total", "Requests forwarded without scanning, by reason.", &["reason"]),
            scan_errors: counter(r, "residue_scan_errors_total", "Responses that could not be fully decoded for scanning, by reason.", &["reason"]),
            incidents: counter(r, "residue_incidents_total", "Incidents by detector and severity.", &["detector", "severity"]),
            incidents_dropped: counter(r, "residue_incidents_dropped_total", "Incidents that could not be written, by reason.", &["reason"]),
            prompt_token_ratio,
            errors: counter(r, "residue_errors_total", "Error responses residue produced itself, by kind and by who caused them.", &["kind", "source"]),
            rejected: counter(r, "residue_rejected_total", "Requests refused before forwarding, by reason.", &["reason"]),
            stream_end: counter(r, "residue_response_end_total", "How response bodies ended, by family and end.", &["family", "end"]),
            build_info,
            pii_seen: counter(r, "residue_pii_seen_total", "PII values and secrets seen in answers, by kind and by whose they are.", &["kind", "owner"]),
            store_errors: counter(r, "residue_store_errors_total", "Fingerprint store failures, by operation.", &["op"]),
            store_entries: gauge(r, "residue_store_entries", "Records held by the fingerprint store."),
            store_hashes: gauge(r, "residue_store_hashes", "Distinct hashes held by the fingerprint store."),
            store_bytes: gauge(r, "residue_store_bytes", "Approximate bytes held by the fingerprint store."),
            store_evictions: gauge(r, "residue_store_evictions", "Records the fingerprint store evicted since start (window or memory cap)."),
            store_lookups: gauge(r, "residue_store_lookups", "Hashes looked up in the fingerprint store since start."),
            rules_reloads: counter(r, "residue_rules_reloads_total", "Rule reloads, by result; a failed reload keeps the rules in force.", &["result"]),
            rules_loaded: gauge(r, "residue_rules_loaded", "PII and secret rules in force."),
            enforced: counter(r, "residue_enforced_total", "Answers under block or redact, by action and outcome.", &["action", "outcome"]),
            embed_requests: counter(r, "residue_embed_requests_total", "Embedding requests, by outcome; `shed` ones were refused because the queue was full.", &["outcome"]),
            embed_batch_size,
            embed_device,
            semantic_relevance: histogram(r, "residue_semantic_relevance", "Cosine similarity of each scanned answer to its own prompt, by tier.", &["tier"], SIMILARITY_BUCKETS),
            semantic_skipped: counter(r, "residue_semantic_skipped_total", "Semantic checks not made, by reason.", &["reason"]),
            semantic_confirmations: counter(r, "residue_semantic_confirmations_total", "Static-tier candidates the transformer re-read, by detector and outcome.", &["detector", "outcome"]),
            semantic_window_chunks: gauge(r, "residue_semantic_window_chunks", "Chunk vectors held by the semantic window."),
            semantic_seconds: histogram(r, "residue_semantic_seconds", "Time the semantic detectors took per answer, by tier.", &["tier"], LATENCY_BUCKETS),
            registry,
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metrics.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        buf
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
