//! `sim serve`: an OpenAI-compatible HTTP server on the engine's own scheduler,
//! block-manager and worker actors, so that the code that is simulated also serves, and
//! clients written for vLLM (the `openai` package, `vllm bench serve`, GuideLLM, AIPerf)
//! drive either.
//!
//! In: a scenario variant and a backend. With a real backend (`cpu` with a GGUF's weights,
//! `cuda`) steps really run and are committed at the wall-clock time they end; with the
//! cost model (`model`) each step lasts what the cost model predicts for the scenario's
//! GPU, optionally faster than real time (`time_scale`). Out: HTTP responses (`http.rs`;
//! each request's events made text by `session.rs`, its stop strings found by `stop.rs`),
//! live metrics (`metrics.rs`), and the run's records as `sim run` writes them
//! (`requests.csv`, `steps.csv`, `plan.json`, and `summary.json` once the server stops),
//! so that `sim replay` reads a served run like any other.
//!
//! Threads: the engine loop (`engine_loop.rs`) runs on its own actix system, stepping
//! while work exists; the HTTP server runs on a tokio runtime beside it; they talk through
//! channels only.

pub mod api;
mod engine_loop;
mod http;
pub mod metrics;
mod session;
mod stop;
pub mod text;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use analysis::{RunCollector, RunInfo, Summary};
use tokio::sync::{mpsc, oneshot};

use crate::run::BackendKind;
use crate::scenario::{Scenario, Variant};
use crate::SimError;
use engine_loop::{Clock, LoopParts};
use text::Text;

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The variant served (its model, GPU and engine settings).
    pub variant: Variant,
    /// Backend that executes the steps.
    pub backend: BackendKind,
    /// Address to listen on (port 0: any free port).
    pub addr: SocketAddr,
    /// The cost model's time runs this many times faster than the wall clock (model
    /// backend only).
    pub time_scale: f64,
    /// Where the records go (`None`: nowhere).
    pub out_dir: Option<PathBuf>,
    /// The model's name in the API (`/v1/models`, the `model` field).
    pub model_name: String,
    /// Most requests in flight; more are refused with 429.
    pub max_concurrency: usize,
    /// Stop on Ctrl-C or SIGTERM (the command line); tests stop with [`Server::stop`].
    pub handle_signals: bool,
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    http: Option<std::thread::JoinHandle<Result<(), SimError>>>,
    engine: Option<std::thread::JoinHandle<Result<Summary, SimError>>>,
}

/// Errors of a server that could not start or stopped badly.
fn serve_err(msg: impl Into<String>) -> SimError {
    SimError::Serve(msg.into())
}

/// The served model's tokenizer: the GGUF's when the variant names one.
fn text_of(scenario: &Scenario, variant: &Variant) -> Result<Text, SimError> {
    match &variant.config.model.gguf {
        Some(path) => {
            let path = scenario.base_dir.join(path);
            let g = kernels::gguf::Gguf::open(&path)
                .map_err(|e| serve_err(format!("{}: {e}", path.display())))?;
            let t = kernels::tokenizer::Tokenizer::from_gguf(&g)
                .map_err(|e| serve_err(format!("{}: {e}", path.display())))?;
            Ok(Text::Gguf(Box::new(t)))
        }
        None => Ok(Text::Synthetic),
    }
}

/// The scenario a lone GGUF file is served with: its weights and tokenizer, the engine's
/// defaults (`max_model_len`: the model's unless given), `gpu` for the cost model, and a
/// calibration file if given.
pub fn gguf_scenario(
    path: &std::path::Path,
    gpu: &str,
    max_model_len: Option<u32>,
    calibration: Option<&std::path::Path>,
) -> Result<Scenario, SimError> {
    let abs = std::path::absolute(path).map_err(crate::run::io_err(path))?;
    if !abs.is_file() {
        return Err(serve_err(format!("{}: no such file", path.display())));
    }
    let stem = abs
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let mut engine = String::new();
    if let Some(m) = max_model_len {
        engine = format!("max_model_len = {m}\n");
    }
    let mut cost = String::new();
    if let Some(c) = calibration {
        let c = std::path::absolute(c).map_err(crate::run::io_err(c))?;
        cost = format!("[cost]\ncalibration = {:?}\n", c.display().to_string());
    }
    let text = format!(
        "name = {name:?}\n[model]\ngguf = {path:?}\n[hardware]\ngpu = {gpu:?}\n[engine]\n{engine}\
         [workload]\nnum_requests = 1\narrival = {{ process = \"poisson\", rate = 1 }}\n\
         [[workload.class]]\nname = \"served\"\nprompt = {{ dist = \"fixed\", value = 1 }}\n\
         output = {{ dist = \"fixed\", value = 1 }}\n{cost}",
        name = format!("serve-{stem}"),
        path = abs.display().to_string(),
    );
    Ok(Scenario::from_text(&abs, &text)?)
}

/// The records of a served run (written where `out_dir` says, as `sim run` writes them).
fn collector_of(opts: &ServeOptions) -> Result<RunCollector, SimError> {
    let v = &opts.variant;
    let collector = RunCollector::new(v.config.slo.clone(), vec!["served".into()])
        .with_storm_threshold(v.config.engine.preemption_storm_threshold);
    Ok(match &opts.out_dir {
        Some(dir) => collector.with_csv_files(dir)?,
        None => collector,
    })
}

/// Starts a server: binds the address, builds the engine (errors come back here), and
/// returns once both are ready.
pub fn start(scenario: &Scenario, opts: ServeOptions) -> Result<Server, SimError> {
    if !(opts.time_scale.is_finite() && opts.time_scale > 0.0) {
        return Err(serve_err(format!(
            "--time-scale: must be a positive number, got {}",
            opts.time_scale
        )));
    }
    if opts.time_scale != 1.0 && opts.backend != BackendKind::Model {
        return Err(serve_err(
            "--time-scale: only the cost model's time can be scaled (--backend model); real backends run at the wall clock's pace",
        ));
    }
    if opts.variant.fleet.is_some() {
        return Err(serve_err(
            "the variant has a [cluster]: sim serve serves one engine (serve each replica, or a variant without [cluster])",
        ));
    }
    if opts.variant.deployment.parallel.dp > 1 {
        return Err(serve_err(
            "hardware.dp > 1: sim serve serves one engine (one attention-DP rank); set dp = 1",
        ));
    }
    let text = text_of(scenario, &opts.variant)?;
    let listener = std::net::TcpListener::bind(opts.addr).map_err(|e| {
        serve_err(format!(
            "--host/--port: cannot listen on {}: {e}",
            opts.addr
        ))
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| serve_err(format!("{}: {e}", opts.addr)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| serve_err(format!("{}: {e}", opts.addr)))?;
    // Records: as `sim run` writes a variant's.
    if let Some(dir) = &opts.out_dir {
        std::fs::create_dir_all(dir).map_err(crate::run::io_err(dir))?;
        crate::run::write_plan(dir, &opts.variant)?;
    }
    let metrics = Arc::new(Mutex::new(metrics::Metrics::default()));
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let engine = {
        let scenario = scenario.clone();
        let opts = opts.clone();
        let metrics = metrics.clone();
        let eos = text.eos();
        std::thread::Builder::new()
            .name("sim-engine".into())
            .spawn(move || -> Result<Summary, SimError> {
                // Real runtimes stop at the model's end-of-sequence token.
                let mut variant = opts.variant.clone();
                let eos = if opts.backend == BackendKind::Model {
                    None
                } else {
                    eos
                };
                variant.scheduler.eos_token = eos;
                let built = crate::run::engine_parts(&scenario, &variant, opts.backend)
                    .and_then(|p| Ok((p, collector_of(&opts)?)));
                let (parts, collector) = match built {
                    Ok(p) => {
                        let _ = ready_tx.send(Ok(()));
                        p
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        let _ = ready_tx.send(Err(e));
                        return Err(serve_err(msg));
                    }
                };
                let clock = Clock::new(if opts.backend == BackendKind::Model {
                    opts.time_scale
                } else {
                    1.0
                });
                let started = std::time::Instant::now();
                let system = actix::System::new();
                let end = system
                    .block_on(engine_loop::run(LoopParts {
                        parts,
                        cmds: cmd_rx,
                        clock,
                        simulated: opts.backend == BackendKind::Model,
                        eos,
                        metrics,
                        collector,
                    }))
                    .map_err(|e| SimError::Run {
                        variant: opts.variant.name.clone(),
                        source: Box::new(e),
                    })?;
                let summary = end.collector.finish(RunInfo {
                    scenario: scenario.name.clone(),
                    variant: opts.variant.name.clone(),
                    backend: format!("{:?}", opts.backend).to_lowercase(),
                    kv_pool_blocks: end.pool_blocks,
                    kv_blocks_in_use_at_end: end.blocks_in_use,
                    evictions: end.evictions,
                    wall_time_s: started.elapsed().as_secs_f64(),
                    spec: Vec::new(),
                    offload: None,
                })?;
                if let Some(dir) = &opts.out_dir {
                    analysis::write_summary_json(&dir.join("summary.json"), &summary)?;
                    let served = serde_json::json!({
                        "model": opts.model_name,
                        "backend": format!("{:?}", opts.backend).to_lowercase(),
                        "time_scale": opts.time_scale,
                        "address": addr.to_string(),
                        "engine_time_s": end.end as f64 / 1e9,
                    });
                    let path = dir.join("served.json");
                    std::fs::write(&path, format!("{served:#}\n"))
                        .map_err(crate::run::io_err(&path))?;
                }
                Ok(summary)
            })
            .map_err(|e| serve_err(format!("cannot start the engine thread: {e}")))?
    };
    match ready_rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            let _ = engine.join();
            return Err(e);
        }
        Err(_) => {
            return Err(match engine.join() {
                Ok(Err(e)) => e,
                _ => serve_err("the engine thread ended before it was ready"),
            })
        }
    }
    let state = Arc::new(http::AppState::new(
        cmd_tx,
        text,
        opts.model_name.clone(),
        opts.variant.scheduler.max_model_len,
        opts.variant.scheduler.pool_tokens,
        metrics,
        opts.max_concurrency,
        opts.backend == BackendKind::Model,
    ));
    let (stop_tx, stop_rx) = oneshot::channel();
    let signals = opts.handle_signals;
    let http = std::thread::Builder::new()
        .name("sim-http".into())
        .spawn(move || -> Result<(), SimError> {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|e| serve_err(format!("cannot start the HTTP runtime: {e}")))?;
            rt.block_on(http::serve(listener, state, stop_rx, signals))
                .map_err(|e| serve_err(format!("HTTP server on {addr}: {e}")))
        })
        .map_err(|e| serve_err(format!("cannot start the HTTP thread: {e}")))?;
    Ok(Server {
        addr,
        stop: Some(stop_tx),
        http: Some(http),
        engine: Some(engine),
    })
}

impl Server {
    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server (requests in flight are aborted) and returns the run's summary.
    pub fn stop(mut self) -> Result<Summary, SimError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.join()
    }

    /// Waits until the server stops (a signal, with `handle_signals`), then returns the
    /// run's summary.
    pub fn wait(mut self) -> Result<Summary, SimError> {
        self.join()
    }

    fn join(&mut self) -> Result<Summary, SimError> {
        let http = self.http.take().map(|h| h.join());
        let engine = self.engine.take().map(|h| h.join());
        if let Some(Ok(Err(e))) = http {
            return Err(e);
        }
        match engine {
            Some(Ok(r)) => r,
            _ => Err(serve_err("the engine thread panicked")),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
            let _ = self.join();
        }
    }
}
