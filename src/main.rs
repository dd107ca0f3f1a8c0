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
        Command::Sim(args) => sim(args),
    }
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
