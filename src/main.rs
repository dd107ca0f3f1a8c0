use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use residue::config::{LogConfig, LogFormat};
use residue::scenario::Fault;
use residue::{Config, Residue};

/// residue: a reverse proxy for LLM endpoints that catches answers carrying
/// another tenant's data.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay the incident: a faulty engine, residue in front of it, and
    /// multi-tenant traffic; ends with the scorecard. Exits 1 when an
    /// injected leak went undetected.
    Demo(DemoArgs),
    /// Run the proxy.
    Serve(ServeArgs),
    /// Run a fake LLM server whose engine leaks between tenants on purpose,
    /// writing ground truth for every answer (incident replay).
    Sim(SimArgs),
    /// Validate a config file and print every problem found.
    CheckConfig {
        /// The TOML file to check.
        file: PathBuf,
    },
    /// Send multi-tenant traffic (for the incident replay): each tenant
    /// with its own key, text and PII, to OpenAI and SGLang endpoints.
    Load(LoadArgs),
    /// Score a replay: the simulator's ground truth against residue's
    /// incidents.
    Replay(ReplayArgs),
}

#[derive(clap::Args)]
struct DemoArgs {
    /// Requests to send.
    #[arg(long, default_value_t = 1000)]
    requests: usize,
    /// Tenants sending them.
    #[arg(long, default_value_t = 12)]
    tenants: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Seed of the traffic and of the engine's faults.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Share of prompts over the engine's prefill capacity (each becomes a
    /// placeholder leak, as in the incident).
    #[arg(long, default_value_t = 0.04)]
    over_capacity_fraction: f64,
    /// A fault and its rate (repeatable), e.g. `splice=0.04`; replaces the
    /// default mix (placeholder=1, stale_block=0.02, splice=0.04,
    /// garbage=0.02).
    #[arg(long = "fault", value_parser = residue::sim::parse_fault)]
    faults: Vec<(residue::scenario::Fault, f64)>,
    /// Prompt corpus: `builtin`, `sharegpt:FILE` or `fortunes:DIR`.
    #[arg(long, default_value = "builtin", value_parser = parse_corpus)]
    corpus: residue::load::Corpus,
    /// Folder for truth.jsonl, incidents.jsonl, scorecard.json and
    /// scorecard.md.
    #[arg(long, default_value = "residue-demo")]
    out: PathBuf,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(clap::Args)]
struct LoadArgs {
    /// Base URL to send to (residue, or the upstream directly).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    target: String,
    /// Number of tenants (`tenant-00`, `tenant-01`, …).
    #[arg(long, default_value_t = 8)]
    tenants: usize,
    /// Everything (keys, prompts, PII, request mix) follows from the seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stop after this many requests (default 100 without --duration).
    #[arg(long)]
    requests: Option<usize>,
    /// Stop after this long, e.g. `30s`, `5m`.
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<std::time::Duration>,
    /// Open loop: start this many requests per second. Without it: closed
    /// loop, --concurrency requests always in flight.
    #[arg(long)]
    rate: Option<f64>,
    /// Requests in flight (closed loop), or the most in flight (open loop).
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Share of requests asking for a streamed answer.
    #[arg(long, default_value_t = 0.5)]
    stream_fraction: f64,
    /// Share of prompts longer than --capacity-tokens.
    #[arg(long, default_value_t = 0.05)]
    over_capacity_fraction: f64,
    /// The engine's prefill capacity, in tokens.
    #[arg(long, default_value_t = 4096)]
    capacity_tokens: u64,
    /// Prompts: `builtin` (generated), `sharegpt:FILE`, `fortunes:DIR`.
    #[arg(long, default_value = "builtin", value_parser = parse_corpus)]
    corpus: residue::load::Corpus,
    /// Endpoints to use, comma-separated: chat, completions, generate.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "chat,completions,generate"
    )]
    endpoints: Vec<String>,
    /// The `model` of OpenAI requests.
    #[arg(long, default_value = "sim")]
    model: String,
    /// `max_tokens` / `max_new_tokens` of every request.
    #[arg(long, default_value_t = 128)]
    max_tokens: u32,
    /// One request's time limit.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: std::time::Duration,
    /// Print the first N planned requests as JSON lines and send nothing.
    #[arg(long, value_name = "N")]
    print: Option<u64>,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(clap::Args)]
struct ReplayArgs {
    /// Score saved files (the only mode so far).
    #[arg(long)]
    report: bool,
    /// The simulator's ground truth, JSON lines.
    #[arg(long, requires = "report")]
    truth: PathBuf,
    /// residue's incident file, JSON lines.
    #[arg(long, requires = "report")]
    incidents: PathBuf,
    /// Write the scorecard as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the scorecard as Markdown here (default: stdout).
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Exit with status 2 when a leak residue should catch was missed or a
    /// clean response drew an incident.
    #[arg(long)]
    strict: bool,
}

fn parse_corpus(s: &str) -> Result<residue::load::Corpus, String> {
    use residue::load::Corpus;
    match s.split_once(':') {
        None if s == "builtin" => Ok(Corpus::Builtin),
        Some(("sharegpt", path)) => Ok(Corpus::ShareGpt(path.into())),
        Some(("fortunes", dir)) => Ok(Corpus::Fortunes(dir.into())),
        _ => Err("one of builtin, sharegpt:FILE, fortunes:DIR".into()),
    }
}

#[derive(clap::Args)]
struct ServeArgs {
    /// TOML config file (see residue.example.toml). Flags below override it.
    #[arg(long, env = "RESIDUE_CONFIG")]
    config: Option<PathBuf>,
    /// Address clients connect to.
    #[arg(long, env = "RESIDUE_LISTEN")]
    listen: Option<SocketAddr>,
    /// The LLM server to forward to, e.g. http://127.0.0.1:8000.
    #[arg(long, env = "RESIDUE_UPSTREAM")]
    upstream: Option<String>,
    /// Address of /metrics, /healthz and /readyz; keep it away from tenants.
    #[arg(long, env = "RESIDUE_ADMIN_LISTEN")]
    admin_listen: Option<SocketAddr>,
    /// JSON-lines incident file (`-` for stdout).
    #[arg(long, env = "RESIDUE_INCIDENTS")]
    incidents: Option<PathBuf>,
    /// Log as JSON lines instead of for people.
    #[arg(long, env = "RESIDUE_LOG_JSON")]
    log_json: bool,
}

#[derive(clap::Args)]
struct SimArgs {
    /// Address to serve the fake OpenAI and SGLang endpoints on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// Seeds every choice: the same seed and request order replay the same
    /// answers and ground truth.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Prompts longer than this many tokens are where the placeholder fault
    /// strikes (the real engine's capacity was about 681,000; small keeps the
    /// demo fast).
    #[arg(long, default_value_t = 2048)]
    prefill_capacity: u64,
    /// Pages in the shared KV pool; fewer pages forget older requests sooner.
    #[arg(long, default_value_t = 4096)]
    kv_pages: usize,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16)]
    page_tokens: usize,
    /// A fault and its rate, e.g. placeholder=1 or splice=0.05; repeatable.
    /// The placeholder rate applies to over-capacity prompts only; the other
    /// rates share one draw per request and must sum to at most 1.
    #[arg(long = "fault", value_name = "NAME=RATE", value_parser = residue::sim::parse_fault)]
    faults: Vec<(Fault, f64)>,
    /// Append one ground-truth JSON line per response to this file.
    #[arg(long)]
    truth: Option<PathBuf>,
    /// Pause before each streamed chunk, e.g. 2ms.
    #[arg(long, default_value = "2ms", value_parser = humantime::parse_duration)]
    token_delay: Duration,
}

fn main() {
    if let Err(e) = run() {
        // The whole chain, without a backtrace: these are user-facing errors.
        eprintln!("residue: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file } => {
            Config::from_file(&file)?;
            println!("{}: ok", file.display());
            Ok(())
        }
        Command::Serve(args) => serve(args),
        Command::Demo(args) => demo(args),
        Command::Sim(args) => sim(args),
        Command::Load(args) => load(args),
        Command::Replay(args) => replay(args),
    }
}

fn demo(args: DemoArgs) -> anyhow::Result<()> {
    let defaults = residue::demo::DemoConfig::default();
    let config = residue::demo::DemoConfig {
        requests: args.requests,
        tenants: args.tenants,
        concurrency: args.concurrency,
        seed: args.seed,
        over_capacity_fraction: args.over_capacity_fraction,
        faults: if args.faults.is_empty() {
            defaults.faults.clone()
        } else {
            args.faults
        },
        corpus: args.corpus,
        out_dir: args.out,
        progress: !args.quiet,
        ..defaults
    };
    let out_dir = config.out_dir.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("residue-demo")
        .build()
        .context("starting the async runtime")?;
    let outcome = runtime.block_on(residue::demo::run(config))?;
    println!("\n{}", outcome.markdown);
    if !outcome.not_scanned.is_empty() {
        println!(
            "Answers residue did not scan (counted, never waited for): {:?}\n",
            outcome.not_scanned
        );
    }
    println!(
        "Done in {:.1} s. Ground truth, incidents and the scorecard are in {}/.",
        outcome.elapsed.as_secs_f64(),
        out_dir.display()
    );
    let failures = outcome.failures();
    if !failures.is_empty() {
        eprintln!("residue demo: {}", failures.join("; "));
        std::process::exit(1);
    }
    Ok(())
}

fn sim(args: SimArgs) -> anyhow::Result<()> {
    residue::telemetry::init(&LogConfig::default());
    let config = residue::sim::SimConfig {
        listen: args.listen,
        seed: args.seed,
        prefill_capacity_tokens: args.prefill_capacity,
        kv_pages: args.kv_pages,
        page_tokens: args.page_tokens,
        faults: args.faults,
        truth_path: args.truth,
        // A long-running simulator keeps its ground truth in the file only.
        keep_truth: false,
        token_delay: args.token_delay,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("residue-sim")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let sim = residue::sim::start(config).await?;
        shutdown_signal().await;
        sim.shutdown().await;
        anyhow::Ok(())
    })
}

fn load(args: LoadArgs) -> anyhow::Result<()> {
    let config = residue::load::LoadConfig {
        target: args.target,
        tenants: args.tenants,
        seed: args.seed,
        requests: args.requests.or(if args.duration.is_none() {
            Some(100)
        } else {
            None
        }),
        duration: args.duration,
        rate: args.rate,
        concurrency: args.concurrency,
        stream_fraction: args.stream_fraction,
        over_capacity_fraction: args.over_capacity_fraction,
        capacity_tokens: args.capacity_tokens,
        corpus: args.corpus,
        endpoints: args.endpoints,
        model: args.model,
        max_tokens: args.max_tokens,
        timeout: args.timeout,
    };
    if let Some(n) = args.print {
        let plan = residue::load::Plan::new(config)?;
        for i in 0..n {
            let p = plan.request(i);
            let t = &plan.tenants()[p.tenant];
            let line = serde_json::json!({
                "request_id": p.request_id, "tenant": t.id, "endpoint": p.endpoint,
                "path": p.path, "stream": p.stream, "over_capacity": p.over_capacity,
                "body": p.body,
            });
            println!("{line}");
        }
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("residue-load")
        .build()
        .context("starting the async runtime")?;
    let bar = if args.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        match config.requests {
            Some(n) => indicatif::ProgressBar::new(n as u64),
            None => indicatif::ProgressBar::new_spinner(),
        }
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let b = bar.clone();
    let report = runtime.block_on(residue::load::run(config, move |p| {
        b.set_position(p.done);
        b.set_message(format!(
            "ok {} errors {} in flight {}",
            p.ok, p.errors, p.in_flight
        ));
    }))?;
    bar.finish_and_clear();
    let q = |x| {
        report
            .latency_quantile(x)
            .map_or("-".to_string(), |v| format!("{v:.1} ms"))
    };
    println!(
        "{} sent, {} ok, {} errors in {:.1}s; status {:?}; endpoints {:?}; {} streamed, {} over capacity; latency p50 {} p99 {}",
        report.sent,
        report.ok,
        report.errors,
        report.elapsed.as_secs_f64(),
        report.status,
        report.endpoints,
        report.streamed,
        report.over_capacity,
        q(0.5),
        q(0.99),
    );
    if let Some(path) = args.json {
        std::fs::write(&path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.report, "nothing to do: pass --report");
    let read = |p: &PathBuf| {
        std::fs::read(p)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .with_context(|| format!("reading {}", p.display()))
    };
    let card = residue::scorecard::replay(&read(&args.truth)?, &read(&args.incidents)?, None);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&card)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let md = card.to_markdown();
    match &args.markdown {
        Some(path) => {
            std::fs::write(path, &md).with_context(|| format!("writing {}", path.display()))?
        }
        None => print!("{md}"),
    }
    if args.strict && !card.passed {
        std::process::exit(2);
    }
    Ok(())
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    if let Some(listen) = args.listen {
        config.server.listen = listen;
    }
    if let Some(upstream) = args.upstream {
        config.upstream.url = upstream;
    }
    if let Some(admin) = args.admin_listen {
        config.server.admin_listen = admin;
    }
    if let Some(path) = args.incidents {
        config.incidents.path = Some(path);
    }
    if args.log_json {
        config.log.format = LogFormat::Json;
    }
    residue::telemetry::init(&config.log);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("residue")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let residue = Residue::bind(config).await?;
        tracing::info!(admin = %residue.admin_addr(), "Admin listening.");
        residue.run(shutdown_signal()).await?;
        Ok(())
    })
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
