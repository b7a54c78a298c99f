//! `sim replay`: a real run ([`crate::observed`]) replayed through the simulator, and the
//! measured figures set against the simulated ones.
//!
//! From the run comes the scenario: the model (by its Hugging Face id, from the catalog),
//! the GPU (by the device name the run reports), the engine's arguments (vLLM V1: chunked
//! prefill with `max_num_seqs`, `max_num_batched_tokens`, `max_model_len`, the block size,
//! prefix caching, `gpu_memory_utilization`, tensor parallelism), the KV blocks the engine
//! really allocated when the run records them (`num_gpu_blocks_override`), a mixture of
//! experts' data and expert parallelism (its data-parallel ranks a `[cluster]` of one
//! replica, stepping in lockstep behind least-outstanding routing), the client's cap
//! on requests in flight, and exactly its requests: each sent when the engine saw it, with
//! its prompt and output lengths (failed requests are left out and counted). The scenario
//! and its trace are written into the output folder (`replay.toml`, and `trace.csv`, or
//! `trace.jsonl` in Mooncake's format when the run names the prompt each request sent), so
//! `sim run` repeats the replay. Out: TTFT, TPOT, E2EL (mean, p50, p90, p99), queueing delay,
//! throughput and the KV capacity the memory plan predicts, each measured, simulated and
//! the signed error, as a table, `replay.csv`, and `replay.html` with the measured and
//! simulated distributions (CDFs) overlaid.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::cost_model::MemoryPlan;
use crate::driver::DriverKind;
use crate::observed::ObservedRun;
use crate::run::{run_scenario, RunOptions};
use crate::scenario::Scenario;

/// What went wrong building or running a replay.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The run does not say enough to build the scenario (with what to give instead).
    #[error("{path}: {message}")]
    Run {
        /// The run.
        path: PathBuf,
        /// What is missing.
        message: String,
    },
    /// The replay's scenario or its run failed.
    #[error(transparent)]
    Sim(#[from] crate::SimError),
    /// The replay's scenario did not load.
    #[error(transparent)]
    Scenario(#[from] crate::scenario::ScenarioError),
    /// Writing or reading the output folder failed.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
}

/// How to replay.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Output folder (the scenario, its trace, the simulated run, `replay.csv`).
    pub out_dir: PathBuf,
    /// A `sim calibrate` output whose `[cost]` the replay uses.
    pub calibration: Option<PathBuf>,
    /// Catalog model to use instead of the one the run names.
    pub model: Option<String>,
    /// Catalog GPU to use instead of the one the run names.
    pub gpu: Option<String>,
    /// A hardware file (a GPU's TOML, or a CPU profile `sim calibrate --observed` fitted
    /// to a served run) to use instead.
    pub gpu_file: Option<PathBuf>,
    /// Driver.
    pub driver: DriverKind,
    /// Where measured operator times come from.
    pub profiles: ProfileChoice,
}

/// Whether a replay prices steps from measured operator times or on the roofline.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum ProfileChoice {
    /// The profile beside an LLMServingSim run (`profiles/<GPU>/<model>/<variant>/`), if
    /// there is one; the roofline otherwise.
    #[default]
    Auto,
    /// The roofline.
    Off,
    /// This profile folder (its `meta.yaml`'s), or a folder in LLMServingSim's layout.
    From(PathBuf),
}

/// One compared figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// Metric name, e.g. `ttft_mean_ms`.
    pub metric: String,
    /// Measured on the real engine.
    pub measured: f64,
    /// Simulated.
    pub simulated: f64,
}

impl Figure {
    /// Signed relative error of the simulation, in percent (`None` when nothing was
    /// measured).
    pub fn error_pct(&self) -> Option<f64> {
        (self.measured != 0.0).then(|| (self.simulated / self.measured - 1.0) * 100.0)
    }
}

/// A finished replay.
#[derive(Debug, Clone)]
pub struct Replay {
    /// The run replayed.
    pub run: PathBuf,
    /// Catalog model and GPU it was replayed on, and the tensor parallelism.
    pub deployment: String,
    /// Requests replayed.
    pub requests: usize,
    /// Failed requests of the run, left out.
    pub failed: usize,
    /// The compared figures (`kv_blocks`: the memory plan's prediction against the
    /// engine's count).
    pub figures: Vec<Figure>,
    /// The runtime reserve (GiB) the engine's KV block count implies, which the replay used.
    pub reserve_gib: Option<f64>,
    /// How the send times were made when the run has none.
    pub note: Option<String>,
    /// The operator profile the steps were priced with (`None`: the roofline).
    pub profile: Option<PathBuf>,
}

impl Replay {
    /// The figure `metric`.
    pub fn figure(&self, metric: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.metric == metric)
    }

    /// The comparison as a text table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "replay of {} ({}): {} requests{}",
            self.run.display(),
            self.deployment,
            self.requests,
            if self.failed > 0 {
                format!(", {} failed requests left out", self.failed)
            } else {
                String::new()
            }
        );
        if let Some(n) = &self.note {
            let _ = writeln!(s, "{n}");
        }
        match &self.profile {
            Some(p) => {
                let _ = writeln!(
                    s,
                    "steps priced from measured operator times in {}",
                    p.display()
                );
            }
            None => {
                let _ = writeln!(s, "steps priced on the roofline (no operator profile)");
            }
        }
        if let Some(r) = self.reserve_gib {
            let _ = writeln!(
                s,
                "the engine's KV blocks imply a runtime reserve of {r:.3} GiB (beside weights and activations); the replay holds them"
            );
        }
        let _ = writeln!(
            s,
            "{:<22} {:>12} {:>12} {:>9}",
            "metric", "measured", "simulated", "error"
        );
        for f in &self.figures {
            let err = f
                .error_pct()
                .map_or_else(|| "-".to_string(), |e| format!("{e:+.1}%"));
            let _ = writeln!(
                s,
                "{:<22} {:>12.2} {:>12.2} {:>9}",
                f.metric, f.measured, f.simulated, err
            );
        }
        s
    }
}

/// The catalog model a run names ([`crate::catalog::find_model_by_id`]).
fn resolve_model(run: &ObservedRun, over: Option<&str>) -> Result<&'static str, ReplayError> {
    let err = |m: String| ReplayError::Run {
        path: run.path.clone(),
        message: m,
    };
    if let Some(name) = over {
        return crate::catalog::find_model(name)
            .map(|m| m.name)
            .ok_or_else(|| {
                err(format!(
                    "--model {name}: not in the catalog (`sim models` lists it)"
                ))
            });
    }
    let Some(id) = run.engine.model.as_deref() else {
        return Err(err("the run does not name its model: give --model".into()));
    };
    crate::catalog::find_model_by_id(id)
        .map(|m| m.name)
        .ok_or_else(|| {
            err(format!(
                "model `{id}` is not in the catalog: give --model (`sim models` lists them)"
            ))
        })
}

/// The catalog GPU a run names (a CUDA device name or a folder name such as `RTX4090`).
fn resolve_gpu(run: &ObservedRun, over: Option<&str>) -> Result<&'static str, ReplayError> {
    let err = |m: String| ReplayError::Run {
        path: run.path.clone(),
        message: m,
    };
    if let Some(name) = over {
        return crate::catalog::find_gpu(name)
            .map(|g| g.name)
            .ok_or_else(|| {
                err(format!(
                    "--gpu {name}: not in the catalog (`sim gpus` lists it)"
                ))
            });
    }
    let Some(name) = run.engine.gpu.as_deref() else {
        return Err(err("the run does not name its GPU: give --gpu".into()));
    };
    crate::catalog::gpu_for_device(name)
        .or_else(|| crate::catalog::find_gpu(name).map(|g| g.name))
        .ok_or_else(|| {
            err(format!(
                "GPU `{name}` is not in the catalog: give --gpu (`sim gpus` lists them)"
            ))
        })
}

/// The catalog model `run` replays (the one it names).
pub fn model_of(run: &ObservedRun) -> Result<&'static str, ReplayError> {
    resolve_model(run, None)
}

/// The catalog GPU `run` replays on (the device it names).
pub fn gpu_of(run: &ObservedRun) -> Result<&'static str, ReplayError> {
    resolve_gpu(run, None)
}

/// Replays `run` and compares: the comparison, `replay.html` and `replay.csv` in the
/// output folder.
pub fn replay(run: &ObservedRun, opts: &ReplayOptions) -> Result<Replay, ReplayError> {
    let Replayed {
        replay,
        measured,
        simulated,
    } = replay_samples(run, opts)?;
    let io = |path: &Path, err: std::io::Error| ReplayError::Io {
        path: path.to_path_buf(),
        message: err.to_string(),
    };
    let html_path = opts.out_dir.join("replay.html");
    std::fs::write(&html_path, report_html(&replay, &measured, &simulated))
        .map_err(|e| io(&html_path, e))?;
    let csv_path = opts.out_dir.join("replay.csv");
    let mut csv = String::from("metric,measured,simulated,error_pct\n");
    for f in &replay.figures {
        let _ = writeln!(
            csv,
            "{},{:.6},{:.6},{}",
            f.metric,
            f.measured,
            f.simulated,
            f.error_pct().map_or(String::new(), |e| format!("{e:.3}"))
        );
    }
    std::fs::write(&csv_path, csv).map_err(|e| io(&csv_path, e))?;
    Ok(replay)
}

/// A replay with both sides' requests: what `sim calibrate --observed` scores candidate
/// terms on.
pub(crate) struct Replayed {
    /// The comparison.
    pub replay: Replay,
    /// The run's requests that succeeded, in send order (`id` is the index).
    pub measured: Vec<Sample>,
    /// The simulated requests (`id`: the measured request it replays).
    pub simulated: Vec<Sample>,
}

/// Replays `run` (the scenario, its trace and the simulated run in the output folder) and
/// compares, keeping both sides' requests.
pub(crate) fn replay_samples(
    run: &ObservedRun,
    opts: &ReplayOptions,
) -> Result<Replayed, ReplayError> {
    let e = &run.engine;
    let model = resolve_model(run, opts.model.as_deref())?;
    let (gpu, gpu_line) = match &opts.gpu_file {
        Some(f) => {
            let abs = std::fs::canonicalize(f).map_err(|e| ReplayError::Io {
                path: f.clone(),
                message: format!("--gpu-file: {e}"),
            })?;
            let name = abs
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name, format!("gpu_file = {:?}", abs.display().to_string()))
        }
        None => {
            let g = resolve_gpu(run, opts.gpu.as_deref())?;
            (g.to_string(), format!("gpu = \"{g}\""))
        }
    };
    let gpu = gpu.as_str();
    let link = described_link(e, opts.gpu_file.is_none().then_some(gpu));
    let moe = crate::catalog::find_model(model).is_some_and(|m| m.is_moe());
    let dp = e.dp.unwrap_or(1);
    if dp > 1 && !moe {
        return Err(ReplayError::Run {
            path: run.path.clone(),
            message: format!(
                "data parallelism ({dp}) of a dense model: its engines run independently; replay one engine's run"
            ),
        });
    }
    let mut profile = find_profile(run, opts)?;
    let io = |path: &Path, err: std::io::Error| ReplayError::Io {
        path: path.to_path_buf(),
        message: err.to_string(),
    };
    std::fs::create_dir_all(&opts.out_dir).map_err(|e| io(&opts.out_dir, e))?;
    // The trace: every request that succeeded, at its send time.
    let ok: Vec<_> = run
        .requests
        .iter()
        .filter(|r| r.ok && r.output_len > 0)
        .collect();
    let failed = run.requests.len() - ok.len();
    if ok.is_empty() {
        return Err(ReplayError::Run {
            path: run.path.clone(),
            message: "no request succeeded".into(),
        });
    }
    let (sends, mut note) = send_times(run, &ok)?;
    let mut trace = String::from("arrived_at,num_prefill_tokens,num_decode_tokens\n");
    // A saturated closed loop replays as one: its clients start when they did, and every
    // later request is ready from the last client's start, sent as a slot of the
    // `max_concurrency` frees (latencies count from the send, as measured).
    let closed = e.closed_loop && e.max_concurrency.is_some();
    let cap = e.max_concurrency.unwrap_or(1).max(1) as usize;
    let last_start = sends
        .get(cap.min(sends.len()).saturating_sub(1))
        .copied()
        .unwrap_or(0.0);
    if closed && note.is_none() {
        note = Some(format!(
            "a closed loop of {} clients (each request sent as another ended): replayed as one",
            e.max_concurrency.unwrap_or(1)
        ));
    }
    // A run that names each request's prompt (`prompt_key`) replays in Mooncake's format,
    // whose 512-token blocks carry ids: requests of one prompt send the same tokens.
    let keyed = keyed(run);
    if keyed {
        trace.clear();
    }
    for (i, (r, t)) in ok.iter().zip(&sends).enumerate() {
        let t = if closed { t.min(last_start) } else { *t };
        if keyed {
            let _ = writeln!(
                trace,
                "{{\"timestamp\": {:.6}, \"input_length\": {}, \"output_length\": {}, \"hash_ids\": {:?}}}",
                t * 1e3,
                r.prompt_len,
                r.output_len,
                block_ids(r.prompt_key, i, r.prompt_len)
            );
        } else {
            let _ = writeln!(trace, "{t:.9},{},{}", r.prompt_len, r.output_len);
        }
    }
    let trace_path = opts.out_dir.join(trace_file(keyed));
    std::fs::write(&trace_path, trace).map_err(|e| io(&trace_path, e))?;
    // The memory plan's own prediction first; then, when the run records the KV blocks
    // the engine allocated, the replay holds exactly those, with the runtime reserve that
    // count implies (vLLM's profile run measured it; the plan's default is a guess).
    let path = opts.out_dir.join("replay.toml");
    std::fs::write(
        &path,
        scenario_text(run, model, &gpu_line, opts, None, profile.as_deref(), link),
    )
    .map_err(|e| io(&path, e))?;
    let mut profile_note = None;
    let loaded = match Scenario::load(&path, None) {
        // The profile found beside the run cannot price this deployment (another layout of
        // the experts, an architecture it does not time): the roofline does, and says why.
        Err(err) if profile.is_some() && matches!(opts.profiles, ProfileChoice::Auto) => {
            let why = format!(
                "the operator profile beside the run cannot price it, so the roofline does ({err})"
            );
            profile_note = Some(why);
            profile = None;
            std::fs::write(
                &path,
                scenario_text(run, model, &gpu_line, opts, None, None, link),
            )
            .map_err(|e| io(&path, e))?;
            Scenario::load(&path, None)?
        }
        r => r?,
    };
    let predicted = loaded.variants[0].memory.clone();
    let mut reserve_gib = None;
    if let Some(blocks) = e.num_gpu_blocks {
        let gib = implied_reserve(run, &predicted, blocks)?;
        reserve_gib = Some(gib);
        let text = scenario_text(
            run,
            model,
            &gpu_line,
            opts,
            Some((blocks, gib)),
            profile.as_deref(),
            link,
        );
        std::fs::write(&path, text).map_err(|e| io(&path, e))?;
    }
    let scn = Scenario::load(&path, None)?;
    let sim_dir = opts.out_dir.join("sim");
    let run_opts = RunOptions {
        out_dir: Some(sim_dir.clone()),
        driver: opts.driver,
        ..RunOptions::default()
    };
    run_scenario(&scn, &run_opts)?;
    let simulated = read_simulated(&sim_dir.join("base").join("requests.csv"))?;
    let measured: Vec<Sample> = ok
        .iter()
        .zip(&sends)
        .enumerate()
        .map(|(id, (r, &send_s))| Sample {
            id,
            send_s,
            ttft_ms: r.ttft_ms.unwrap_or(0.0),
            tpot_ms: r.tpot_ms(),
            e2el_ms: r.e2el_ms.unwrap_or(0.0),
            queue_ms: r.queue_ms,
        })
        .collect();
    // Without the run's own send times its makespan is the duration the client measured;
    // without that either, there is no measured throughput to compare.
    let measured_makespan = match (&note, e.duration_s) {
        (None, _) => Makespan::FromSends,
        (Some(_), Some(d)) => Makespan::Measured(d),
        (Some(_), None) => Makespan::Unknown,
    };
    // Every data-parallel rank is simulated (a fleet of one replica): the requests are all
    // there.
    let mut figures = compare(&measured, &simulated, measured_makespan);
    if let Some(m) = e.num_gpu_blocks {
        figures.push(Figure {
            metric: "kv_blocks".into(),
            measured: f64::from(m),
            simulated: f64::from(predicted.num_blocks),
        });
    }
    let replay = Replay {
        run: run.path.clone(),
        deployment: format!(
            "{model} on {} x {gpu}",
            e.tp.unwrap_or(1) * e.dp.unwrap_or(1)
        ),
        requests: ok.len(),
        failed,
        figures,
        reserve_gib,
        note: match (note, profile_note) {
            (Some(n), Some(p)) => Some(format!("{n}; {p}")),
            (n, p) => n.or(p),
        },
        profile,
    };
    Ok(Replayed {
        replay,
        measured,
        simulated,
    })
}

/// A run's name for folders and scenario names: its file or folder name, with anything
/// but letters, digits, `-` and `.` made `-`.
pub fn run_name(path: &Path) -> String {
    // A run file loses its extension; a folder keeps its whole name (`Llama-3.1-8B`).
    let is_file = path
        .extension()
        .is_some_and(|x| x == "json" || x == "csv" || x == "jsonl");
    let name = if is_file {
        path.file_stem()
    } else {
        path.file_name()
    };
    name.and_then(|n| n.to_str())
        .unwrap_or("run")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// The link between the GPUs as the run's hardware description gives it (LLMServingSim's
/// testbed: PCIe without NVLink), where the deployment spans GPUs: its bandwidth as the
/// collectives' share of the catalog GPU's link (`catalog_gpu`; none for a GPU file), and
/// its latency (us).
fn described_link(e: &crate::observed::ObservedEngine, catalog_gpu: Option<&str>) -> Link {
    let spans = e.tp.unwrap_or(1) * e.dp.unwrap_or(1) > 1;
    let eff = e
        .link_gbs
        .filter(|_| spans)
        .zip(catalog_gpu.and_then(crate::catalog::find_gpu))
        .map(|(gbs, g)| (gbs / (g.link_bw / 1e9)).min(1.0));
    (eff, e.link_latency_us.filter(|_| spans))
}

/// `cost.allreduce_eff` and `cost.allreduce_latency_us` of the run's link, when it says.
type Link = (Option<f64>, Option<f64>);

/// Whether the run names the prompt each request sent (so its trace carries block ids).
fn keyed(run: &ObservedRun) -> bool {
    run.requests.iter().any(|r| r.ok && r.prompt_key.is_some())
}

/// The trace's file: Mooncake's JSON lines when the run names its prompts, else Vidur's CSV.
fn trace_file(keyed: bool) -> &'static str {
    if keyed {
        "trace.jsonl"
    } else {
        "trace.csv"
    }
}

/// The ids of a prompt's 512-token blocks in the replay's Mooncake trace: from its key, so
/// requests of one prompt share them, or from its place in the trace (`i`) when it has none.
fn block_ids(key: Option<u64>, i: usize, prompt_len: u32) -> Vec<u64> {
    use std::hash::{Hash, Hasher};
    let blocks = (prompt_len as usize).div_ceil(crate::workload::MOONCAKE_BLOCK_TOKENS);
    (0..blocks)
        .map(|b| {
            let mut h = rustc_hash::FxHasher::default();
            (key.is_some(), key.unwrap_or(i as u64), b).hash(&mut h);
            h.finish()
        })
        .collect()
}

/// The replay's scenario file.
fn scenario_text(
    run: &ObservedRun,
    model: &str,
    gpu_line: &str,
    opts: &ReplayOptions,
    blocks: Option<(u32, f64)>,
    profile: Option<&Path>,
    (link_eff, link_latency): Link,
) -> String {
    let e = &run.engine;
    let mut s = deployment_text(run, model, gpu_line, blocks);
    let keyed = keyed(run);
    let _ = writeln!(
        s,
        "\n[workload]\ntrace = {{ format = \"{}\", path = \"{}\" }}",
        if keyed { "mooncake" } else { "vidur" },
        trace_file(keyed)
    );
    if let Some(c) = e.max_concurrency {
        let _ = writeln!(s, "max_in_flight = {c}");
        if let Some(g) = e.refill_gap_s.filter(|_| e.closed_loop) {
            let _ = writeln!(s, "think_time_s = {g:.6}");
        }
    }
    if e.dp.unwrap_or(1) > 1 {
        // vLLM's data-parallel ranks step in lockstep (each step's MoE layers exchange every
        // rank's tokens), and its front end sends each request to the rank with the lowest
        // score of 4 x waiting + running, which the fewest requests in flight approximates:
        // one replica whose ranks are the fleet's engines.
        let _ = writeln!(
            s,
            "\n[cluster]\nrouting = \"least-outstanding\"\n\n[cluster.pools.ranks]\nreplicas = 1"
        );
    }
    if opts.calibration.is_some()
        || profile.is_some()
        || link_eff.is_some()
        || link_latency.is_some()
    {
        let _ = writeln!(s, "\n[cost]");
    }
    if let Some(eff) = link_eff {
        let _ = writeln!(
            s,
            "# The run's GPUs are linked at {} GB/s ({}), this GPU's link at its datasheet figure.\nallreduce_eff = {eff:.6}",
            e.link_gbs.unwrap_or(0.0),
            run.path.join("config.json").display()
        );
    }
    if let Some(us) = link_latency {
        let _ = writeln!(s, "allreduce_latency_us = {us}");
    }
    if let Some(p) = profile {
        let abs = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let _ = writeln!(s, "operator_profile = {:?}", abs.display().to_string());
    }
    if let Some(cal) = &opts.calibration {
        let abs = std::fs::canonicalize(cal).unwrap_or_else(|_| cal.clone());
        let _ = writeln!(s, "calibration = {:?}", abs.display().to_string());
        if run.format == "llmservingsim" || run.format == "sim" {
            // Its timestamps are the engine's own: no front end between send and queue.
            let _ = writeln!(s, "request_overhead_ms = 0.0");
        }
    }
    s
}

/// The run's deployment as scenario tables (name, model, hardware, engine), with the KV
/// blocks the engine allocated and the reserve they imply when given. `gpu_line` names the
/// hardware (`gpu = "..."` or `gpu_file = "..."`).
fn deployment_text(
    run: &ObservedRun,
    model: &str,
    gpu_line: &str,
    blocks: Option<(u32, f64)>,
) -> String {
    let e = &run.engine;
    let mut s = String::new();
    let name = run_name(&run.path);
    let _ = writeln!(s, "# Written by `sim replay {}`.", run.path.display());
    let _ = writeln!(s, "name = \"replay-{name}\"\nseed = 0\n");
    let _ = writeln!(s, "[model]\nname = \"{model}\"\ndtype = \"bf16\"\n");
    // vLLM's data parallelism of a mixture of experts is attention data parallelism; with
    // `enable_expert_parallel` the experts are split over every GPU (EP = TP x DP), else
    // tensor-parallel over them.
    let (tp, dp) = (e.tp.unwrap_or(1), e.dp.unwrap_or(1));
    let ep = if e.expert_parallel { tp * dp } else { 1 };
    let _ = writeln!(s, "[hardware]\n{gpu_line}\ntp = {tp}");
    if dp > 1 || ep > 1 {
        let _ = writeln!(s, "dp = {dp}\nep = {ep}");
    }
    let _ = writeln!(s);
    let scheduler = e.scheduler.as_deref().unwrap_or("chunked");
    let _ = writeln!(s, "[engine]\nscheduler = {scheduler:?}");
    if let Some(v) = e.max_num_seqs {
        let _ = writeln!(s, "max_num_seqs = {v}");
    }
    if let Some(v) = e.max_num_batched_tokens {
        let _ = writeln!(s, "max_num_batched_tokens = {v}");
    }
    if e.chunked_prefill == Some(false) {
        let _ = writeln!(s, "enable_chunked_prefill = false");
    }
    if let Some(v) = e.max_model_len {
        let _ = writeln!(s, "max_model_len = {v}");
    }
    if let Some(v) = e.block_size {
        let _ = writeln!(s, "block_size = {v}");
    }
    if let Some(v) = e.gpu_memory_utilization {
        let _ = writeln!(s, "gpu_memory_utilization = {v}");
    }
    // vLLM V1 caches prefixes unless told not to.
    let _ = writeln!(
        s,
        "enable_prefix_caching = {}",
        e.prefix_caching.unwrap_or(true)
    );
    if let Some((b, reserve)) = blocks {
        let _ = writeln!(
            s,
            "# The KV blocks the engine allocated, and the reserve they imply."
        );
        let _ = writeln!(s, "num_gpu_blocks_override = {b}");
        let _ = writeln!(s, "runtime_overhead_gib = {reserve:.6}");
    }
    s
}

/// The memory plan's prediction for a run that records the KV blocks its engine allocated.
#[derive(Debug, Clone)]
pub struct MemoryCheck {
    /// The run.
    pub run: PathBuf,
    /// Blocks the engine allocated per GPU (vLLM's `num_gpu_blocks`).
    pub measured_blocks: u32,
    /// The memory plan under the defaults.
    pub predicted: MemoryPlan,
    /// The runtime reserve (GiB) that makes the plan hold exactly the engine's blocks.
    pub reserve_gib: f64,
}

impl MemoryCheck {
    /// Blocks the plan holds with a runtime reserve of `gib` instead of the default's.
    pub fn blocks_with_reserve(&self, gib: f64) -> u32 {
        let p = &self.predicted;
        let left = p.kv_budget_bytes + p.runtime_overhead_bytes - gib * GIB;
        (left / p.block_bytes).floor().max(0.0) as u32
    }
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The runtime reserve that leaves exactly `blocks` blocks (the middle of the range that
/// does) in plan `p`; an error when even no reserve leaves that many.
fn implied_reserve(run: &ObservedRun, p: &MemoryPlan, blocks: u32) -> Result<f64, ReplayError> {
    let reserve = p.gpu_mem_bytes * p.gpu_memory_utilization
        - p.weight_bytes
        - p.activation_bytes
        - (f64::from(blocks) + 0.5) * p.block_bytes;
    if reserve < 0.0 {
        return Err(ReplayError::Run {
            path: run.path.clone(),
            message: format!(
                "the engine allocated {blocks} KV blocks of {} bytes, more than the {:.2} GB the memory plan leaves after weights and activations: check the GPU's memory",
                p.block_bytes,
                (p.gpu_mem_bytes * p.gpu_memory_utilization - p.weight_bytes - p.activation_bytes) / 1e9
            ),
        });
    }
    Ok(reserve / GIB)
}

/// The memory plan of `run`'s deployment under the defaults against the KV blocks its
/// engine allocated (`None` when the run does not record them).
pub fn memory_check(run: &ObservedRun) -> Result<Option<MemoryCheck>, ReplayError> {
    let Some(blocks) = run.engine.num_gpu_blocks else {
        return Ok(None);
    };
    if blocks == 0 {
        return Err(ReplayError::Run {
            path: run.path.clone(),
            message: "the run records 0 KV blocks (num_gpu_blocks): nothing to fit".into(),
        });
    }
    let model = resolve_model(run, None)?;
    let gpu = resolve_gpu(run, None)?;
    let mut text = deployment_text(run, model, &format!("gpu = \"{gpu}\""), None);
    // Any workload: the plan depends on the deployment and the engine's limits only.
    text.push_str("\n[workload]\nnum_requests = 1\narrival = { process = \"poisson\", rate = 1.0 }\n[[workload.class]]\nname = \"c\"\nprompt = { dist = \"fixed\", value = 16 }\noutput = { dist = \"fixed\", value = 16 }\n");
    let scn = Scenario::from_text(Path::new("memory-check.toml"), &text)?;
    let predicted = scn.variants[0].memory.clone();
    let reserve_gib = implied_reserve(run, &predicted, blocks)?;
    Ok(Some(MemoryCheck {
        run: run.path.clone(),
        measured_blocks: blocks,
        predicted,
        reserve_gib,
    }))
}

/// The operator profile a replay prices steps with: the one named, or under LLMServingSim's
/// layout (`profiles/<GPU folder>/<model id>/<variant>/`, beside the GPU folders) the
/// profile of the run's model on its GPU, when one exists at its degree.
fn find_profile(run: &ObservedRun, opts: &ReplayOptions) -> Result<Option<PathBuf>, ReplayError> {
    let e = &run.engine;
    let variant = match e.dtype.as_deref() {
        Some("float16" | "half" | "fp16") => "fp16",
        _ => "bf16",
    };
    let tp = e.tp.unwrap_or(1);
    let hw = run
        .path
        .parent()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned());
    let under = |root: &Path| -> Option<PathBuf> {
        let dir = root
            .join(hw.as_deref()?)
            .join(e.model.as_deref()?)
            .join(variant);
        (dir.join("meta.yaml").is_file() && dir.join(format!("tp{tp}")).is_dir()).then_some(dir)
    };
    match &opts.profiles {
        ProfileChoice::Off => Ok(None),
        ProfileChoice::Auto if run.format == "llmservingsim" => Ok(run
            .path
            .parent()
            .and_then(Path::parent)
            .and_then(|root| under(&root.join("profiles")))),
        ProfileChoice::Auto => Ok(None),
        ProfileChoice::From(dir) if dir.join("meta.yaml").is_file() => Ok(Some(dir.clone())),
        ProfileChoice::From(dir) => under(dir).map(Some).ok_or_else(|| ReplayError::Run {
            path: run.path.clone(),
            message: format!(
                "--profiles {}: neither a profile (no meta.yaml) nor a folder holding {}/{}/{variant}/tp{tp}/",
                dir.display(),
                hw.as_deref().unwrap_or("<GPU folder>"),
                e.model.as_deref().unwrap_or("<model>")
            ),
        }),
    }
}

/// One request's figures, measured or simulated.
pub(crate) struct Sample {
    /// The request: its place among the run's requests that succeeded, in send order.
    pub id: usize,
    /// Sent (s from the run's first send).
    pub send_s: f64,
    /// Time to first token (ms).
    pub ttft_ms: f64,
    /// Time per output token after the first (ms; `None` with one output token).
    pub tpot_ms: Option<f64>,
    /// End-to-end latency (ms).
    pub e2el_ms: f64,
    /// Queueing delay (ms), where recorded.
    pub queue_ms: Option<f64>,
}

/// The simulated requests, from the replay's `requests.csv`.
fn read_simulated(path: &Path) -> Result<Vec<Sample>, ReplayError> {
    let err = |m: String| ReplayError::Io {
        path: path.to_path_buf(),
        message: m,
    };
    let mut rdr = csv::Reader::from_path(path).map_err(|e| err(e.to_string()))?;
    let h = rdr.headers().map_err(|e| err(e.to_string()))?.clone();
    let col = |n: &str| {
        h.iter()
            .position(|c| c == n)
            .ok_or_else(|| err(format!("no column {n}")))
    };
    let (id, arrival, ttft, tpot, e2el, queue, reason) = (
        col("request_id")?,
        col("arrival_s")?,
        col("ttft_ms")?,
        col("tpot_ms")?,
        col("e2el_ms")?,
        col("queue_ms")?,
        col("finish_reason")?,
    );
    let mut out = Vec::new();
    for rec in rdr.records() {
        let rec = rec.map_err(|e| err(e.to_string()))?;
        if &rec[reason] != "length" && &rec[reason] != "stop" {
            continue;
        }
        let num = |c: usize| rec[c].parse::<f64>().ok();
        let id = rec[id]
            .parse::<usize>()
            .map_err(|e| err(format!("request_id `{}`: {e}", &rec[id])))?;
        out.push(Sample {
            id,
            send_s: num(arrival).unwrap_or(0.0),
            ttft_ms: num(ttft).unwrap_or(0.0),
            tpot_ms: num(tpot),
            e2el_ms: num(e2el).unwrap_or(0.0),
            queue_ms: num(queue),
        });
    }
    Ok(out)
}

/// Means and percentiles of both sides.
/// The send time of each request of `ok` (seconds from the first), and a note when the run
/// records none and they are made: a vLLM bench run before 0.15 at rate `inf` sent every
/// request at once (its `max_concurrency` pacing them, as the scenario's `max_in_flight`
/// does); at a finite rate they are re-drawn from the client's gamma process (shape
/// `burstiness`, mean gap `1 / rate`, a fixed seed), so its latencies compare as
/// distributions, not request by request.
fn send_times(
    run: &ObservedRun,
    ok: &[&crate::observed::ObservedRequest],
) -> Result<(Vec<f64>, Option<String>), ReplayError> {
    if let Some(sends) = ok.iter().map(|r| r.send_s).collect::<Option<Vec<f64>>>() {
        return Ok((sends, None));
    }
    if run.format != "vllm-bench" {
        return Err(ReplayError::Run {
            path: run.path.clone(),
            message: "the run has no send times: replay needs them".into(),
        });
    }
    let e = &run.engine;
    let Some(rate) = e.request_rate else {
        if !e.all_at_once {
            return Err(ReplayError::Run {
                path: run.path.clone(),
                message: "the run has no send times and no request_rate: replay needs one of them"
                    .into(),
            });
        }
        return Ok((
            vec![0.0; ok.len()],
            Some(format!(
                "the run saved no send times (vLLM bench before 0.15): at request rate inf every request is sent at once{}",
                e.max_concurrency
                    .map_or(String::new(), |c| format!(", at most {c} in flight"))
            )),
        ));
    };
    use rand::SeedableRng;
    use rand_distr::Distribution;
    let shape = e.burstiness.unwrap_or(1.0);
    let gaps =
        rand_distr::Gamma::new(shape, 1.0 / (rate * shape)).map_err(|err| ReplayError::Run {
            path: run.path.clone(),
            message: format!("request_rate {rate} and burstiness {shape}: {err}"),
        })?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let mut t = 0.0;
    let sends = ok
        .iter()
        .enumerate()
        .map(|(i, _)| {
            if i > 0 {
                t += gaps.sample(&mut rng);
            }
            t
        })
        .collect();
    Ok((
        sends,
        Some(format!(
            "the run saved no send times (vLLM bench before 0.15): re-drawn at its {rate} req/s (burstiness {shape}), so latencies compare as distributions, not request by request"
        )),
    ))
}

/// What the measured throughput is computed over.
#[derive(Debug, Clone, Copy)]
enum Makespan {
    /// First send to last finish of the run's own send times.
    FromSends,
    /// The duration the client measured (s).
    Measured(f64),
    /// Neither: no measured throughput.
    Unknown,
}

fn compare(measured: &[Sample], simulated: &[Sample], makespan: Makespan) -> Vec<Figure> {
    type Pick = fn(&Sample) -> Option<f64>;
    let metrics: [(&str, Pick); 4] = [
        ("ttft", |s| Some(s.ttft_ms)),
        ("tpot", |s| s.tpot_ms),
        ("e2el", |s| Some(s.e2el_ms)),
        ("queue", |s| s.queue_ms),
    ];
    let mut figures = Vec::new();
    for (name, pick) in metrics {
        let m: Vec<f64> = measured.iter().filter_map(pick).collect();
        let s: Vec<f64> = simulated.iter().filter_map(pick).collect();
        if m.is_empty() || s.is_empty() {
            continue;
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        figures.push(Figure {
            metric: format!("{name}_mean_ms"),
            measured: mean(&m),
            simulated: mean(&s),
        });
        for p in [50.0, 90.0, 99.0] {
            figures.push(Figure {
                metric: format!("{name}_p{p:.0}_ms"),
                measured: analysis::percentile(&m, p),
                simulated: analysis::percentile(&s, p),
            });
        }
    }
    // Requests per second over the makespan (first send to last finish).
    let throughput = |v: &[Sample]| {
        let start = v.iter().map(|s| s.send_s).fold(f64::INFINITY, f64::min);
        let end = v
            .iter()
            .map(|s| s.send_s + s.e2el_ms / 1e3)
            .fold(f64::NEG_INFINITY, f64::max);
        v.len() as f64 / (end - start).max(1e-9)
    };
    let measured_throughput = match makespan {
        Makespan::FromSends => throughput(measured),
        Makespan::Measured(d) => measured.len() as f64 / d,
        Makespan::Unknown => return figures,
    };
    figures.push(Figure {
        metric: "throughput_rps".into(),
        measured: measured_throughput,
        simulated: throughput(simulated),
    });
    figures
}

/// The page of a folder of replays: one row per run (linking to its own page) with the
/// signed errors of `metrics`, and their medians. `runs` are `(name, folder, replay)`.
pub fn folder_html(runs: &[(String, String, &Replay)], metrics: &[&str]) -> String {
    let esc = |t: &str| {
        t.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    let mut h = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Replays</title><style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,td:nth-child(2){text-align:left}</style></head><body><h1>Replays</h1><p>Error of the simulation against each run, (simulated - measured) / measured.</p><table><tr><th>run</th><th>deployment</th><th>steps priced</th>",
    );
    for m in metrics {
        let _ = write!(h, "<th>{}</th>", esc(m));
    }
    h.push_str("</tr>");
    let err = |r: &Replay, m: &str| r.figure(m).and_then(Figure::error_pct);
    for (name, dir, r) in runs {
        let _ = write!(
            h,
            "<tr><td><a href=\"{}/replay.html\">{}</a></td><td>{}</td><td>{}</td>",
            esc(dir),
            esc(name),
            esc(&r.deployment),
            if r.profile.is_some() {
                "operator profile"
            } else {
                "roofline"
            }
        );
        for m in metrics {
            let cell = err(r, m).map_or_else(|| "-".to_string(), |e| format!("{e:+.1}%"));
            let _ = write!(h, "<td>{cell}</td>");
        }
        h.push_str("</tr>");
    }
    h.push_str("<tr><th>median</th><td></td><td></td>");
    for m in metrics {
        let v: Vec<f64> = runs.iter().filter_map(|(_, _, r)| err(r, m)).collect();
        let cell = if v.is_empty() {
            "-".to_string()
        } else {
            format!("{:+.1}%", analysis::median(&v))
        };
        let _ = write!(h, "<td>{cell}</td>");
    }
    h.push_str("</tr></table></body></html>\n");
    h
}

/// `replay.html`: the comparison table and the measured and simulated CDFs of TTFT, TPOT
/// and E2EL overlaid.
fn report_html(r: &Replay, measured: &[Sample], simulated: &[Sample]) -> String {
    let esc = |t: &str| {
        t.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let mut h = String::new();
    let title = format!("Replay of {}", esc(&r.run.display().to_string()));
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title><style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}td:first-child{{text-align:left}}</style></head><body><h1>{title}</h1><p>{} &mdash; {} requests{}</p><table><tr><th>metric</th><th>measured</th><th>simulated</th><th>error</th></tr>",
        esc(&r.deployment),
        r.requests,
        if r.failed > 0 { format!(", {} failed left out", r.failed) } else { String::new() }
    );
    for f in &r.figures {
        let err = f
            .error_pct()
            .map_or_else(|| "-".to_string(), |e| format!("{e:+.1}%"));
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{:.2}</td><td>{:.2}</td><td>{err}</td></tr>",
            f.metric, f.measured, f.simulated
        );
    }
    h.push_str("</table>");
    type Pick = fn(&Sample) -> Option<f64>;
    let charts: [(&str, Pick); 3] = [
        ("TTFT (ms)", |s| Some(s.ttft_ms)),
        ("TPOT (ms)", |s| s.tpot_ms),
        ("E2EL (ms)", |s| Some(s.e2el_ms)),
    ];
    for (label, pick) in charts {
        let series = |name: &str, v: &[Sample]| analysis::plots::Series {
            name: name.to_string(),
            points: analysis::plots::cdf(&v.iter().filter_map(pick).collect::<Vec<f64>>(), 400),
        };
        let chart = analysis::plots::Chart {
            title: format!("CDF of {label}"),
            x_label: label.to_string(),
            y_label: "fraction of requests".into(),
            series: vec![series("measured", measured), series("simulated", simulated)],
            ..Default::default()
        };
        h.push_str(&analysis::plots::svg(&chart, (720, 360)));
    }
    h.push_str("</body></html>\n");
    h
}
