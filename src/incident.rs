//! Incidents: one JSON object per line, written by a background thread.
//!
//! [`IncidentSink::report`] never waits: a full writer queue drops the
//! incident and counts it (`residue_incidents_dropped_total`), so a slow disk
//! never blocks a scanner, let alone a request. Incidents carry no raw prompt
//! or answer text, and the tenant as a keyed hash unless `raw-tenant = true`.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::SystemTime;

use serde::Serialize;
use tokio::sync::{broadcast, mpsc};

use crate::detect::{Finding, Severity};
use crate::error::StartError;
use crate::hash::HashKey;
use crate::metrics::Metrics;
use crate::observe::Exchange;
use crate::protocol::Endpoint;
use crate::tenant::Tenant;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Incident {
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    pub id: String,
    pub request_id: String,
    /// The tenant's keyed hash, or its id when `raw-tenant = true`.
    pub tenant: String,
    pub tenant_source: &'static str,
    pub family: &'static str,
    pub endpoint: &'static str,
    pub detector: &'static str,
    pub severity: Severity,
    pub score: f64,
    pub evidence: serde_json::Value,
    /// What residue did: `monitor` (the response went out untouched),
    /// `block` (the client got an error instead), `redact` (the matched
    /// spans were masked).
    pub action: &'static str,
    pub status: u16,
}

/// Where detectors' findings go.
#[derive(Clone)]
pub struct IncidentSink {
    tx: Option<mpsc::Sender<Arc<Incident>>>,
    live: broadcast::Sender<Arc<Incident>>,
    metrics: Metrics,
    key: HashKey,
    raw_tenant: bool,
    seq: Arc<AtomicU64>,
    prefix: Arc<str>,
}

impl IncidentSink {
    /// Turns a finding into an incident and hands it on: to the log, the
    /// metrics, live subscribers and the writer.
    /// `action` is what residue did about it: `monitor`, `block`, `redact`.
    pub fn report(
        &self,
        exchange: &Exchange,
        finding: Finding,
        action: &'static str,
    ) -> Arc<Incident> {
        self.report_for(
            &exchange.request_id,
            &exchange.tenant,
            exchange.endpoint,
            exchange.status,
            finding,
            action,
        )
    }

    /// [`IncidentSink::report`] without a whole exchange (a stream cut while
    /// it flowed).
    pub fn report_for(
        &self,
        request_id: &str,
        tenant: &Tenant,
        endpoint: Endpoint,
        status: u16,
        finding: Finding,
        action: &'static str,
    ) -> Arc<Incident> {
        let tenant_source = tenant.source.as_str();
        let tenant = if self.raw_tenant {
            tenant.id.to_string()
        } else {
            self.key.short_hex("tenant", tenant.id.as_bytes())
        };
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let incident = Arc::new(Incident {
            time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            id: format!("inc-{}-{n}", self.prefix),
            request_id: request_id.to_string(),
            tenant,
            tenant_source,
            family: endpoint.family().as_str(),
            endpoint: endpoint.as_str(),
            detector: finding.detector,
            severity: finding.severity,
            score: finding.score,
            evidence: finding.evidence,
            action,
            status,
        });
        self.metrics
            .incidents
            .with_label_values(&[incident.detector, incident.severity.as_str()])
            .inc();
        tracing::warn!(
            request_id = %incident.request_id,
            incident = %incident.id,
            detector = incident.detector,
            severity = incident.severity.as_str(),
            tenant = %incident.tenant,
            "Incident detected."
        );
        let _ = self.live.send(incident.clone());
        if let Some(tx) = &self.tx {
            match tx.try_send(incident.clone()) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => self
                    .metrics
                    .incidents_dropped
                    .with_label_values(&["queue_full"])
                    .inc(),
                Err(mpsc::error::TrySendError::Closed(_)) => self
                    .metrics
                    .incidents_dropped
                    .with_label_values(&["closed"])
                    .inc(),
            }
        }
        incident
    }

    /// Every incident from now on, as it is reported (for tests, tools and
    /// future push exporters). Slow subscribers miss incidents, never block.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Incident>> {
        self.live.subscribe()
    }
}

/// Opens the incident file (if any) and starts the writer thread, which
/// exits once every sink clone is dropped and the queue is drained.
pub fn start(
    path: Option<&Path>,
    queue: usize,
    raw_tenant: bool,
    key: HashKey,
    metrics: Metrics,
) -> Result<(IncidentSink, Option<JoinHandle<()>>), StartError> {
    let (live, _) = broadcast::channel(1024);
    let prefix: Arc<str> = Arc::from(format!("{:08x}", rand::random::<u32>()));
    let mut sink = IncidentSink {
        tx: None,
        live,
        metrics: metrics.clone(),
        key,
        raw_tenant,
        seq: Arc::new(AtomicU64::new(1)),
        prefix,
    };
    let Some(path) = path else {
        return Ok((sink, None));
    };
    let out: Box<dyn Write + Send> = if path == Path::new("-") {
        Box::new(std::io::stdout())
    } else {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| StartError::IncidentFile {
                path: path.display().to_string(),
                source,
            })?;
        Box::new(file)
    };
    let (tx, mut rx) = mpsc::channel::<Arc<Incident>>(queue);
    sink.tx = Some(tx);
    let handle = std::thread::Builder::new()
        .name("residue-incidents".to_string())
        .spawn(move || {
            let mut out = std::io::BufWriter::new(out);
            while let Some(first) = rx.blocking_recv() {
                let mut next = Some(first);
                // Write everything queued, then flush once.
                while let Some(incident) = next {
                    let written = serde_json::to_writer(&mut out, &*incident)
                        .map_err(std::io::Error::from)
                        .and_then(|()| out.write_all(b"\n"));
                    if written.is_err() {
                        metrics
                            .incidents_dropped
                            .with_label_values(&["io_error"])
                            .inc();
                    }
                    next = rx.try_recv().ok();
                }
                if out.flush().is_err() {
                    metrics
                        .incidents_dropped
                        .with_label_values(&["io_error"])
                        .inc();
                }
            }
            let _ = out.flush();
        })
        .expect("spawning the incident writer. This is a bug.");
    Ok((sink, Some(handle)))
}
