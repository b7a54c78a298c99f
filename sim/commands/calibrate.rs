//! `sim calibrate`: the cost model's parameters fitted to measurements
//! ([`sim::cost_model::calibration`]). From operator profiles or measured GEMMs (the default:
//! Vidur's profiles in `calibration/`), or from whole steps of the CUDA runtime, measured
//! here on a GPU (`--backend cuda`) or recorded earlier (`--steps FILE --gpu G`); or with
//! `--observed` from real runs (each GPU's replay terms, and the memory plan's reserve),
//! measured deployments (aiconfigurator's `silicon.csv`), or a run `sim serve` wrote. Writes
//! the fit as a `[cost]` TOML and prints it.

use std::path::{Path, PathBuf};

use kernels::cuda::check::StepTime;
use sim::catalog::{Dtype, Gpu, ModelSpec};
use sim::cost_model::calibration::{self, steps};
use sim::cost_model::Deployment;
use sim::run::BackendKind;

/// Fit the cost model's GEMM efficiencies and the GPUs' all-reduce figures to Vidur's
/// operator profiles (a folder), or the GEMM efficiencies to measured GEMMs (a CSV with
/// columns gpu,m,k,n,ms); print and write them as a `[cost]` TOML.
#[derive(clap::Args)]
pub struct Args {
    /// Folder with the vidur_*.csv profiles, or a CSV of measured GEMMs.
    #[arg(long, default_value = "calibration")]
    pub from: PathBuf,
    /// TOML file to write (default: calibration/fitted.toml; with --backend cuda or
    /// --steps, calibration/<gpu>-cuda.toml). With --observed: the folder the fits are
    /// written into (default: calibration/).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// `cuda`: measure whole forward steps of the CUDA runtime on this machine's GPU
    /// (synthetic weights of --model) and fit the cost model to them; writes the
    /// measurements beside --out (`.steps.csv`).
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,
    /// The model shape to measure or fit (a catalog name).
    #[arg(long, default_value = "llama-3-8b")]
    pub model: String,
    /// Fit again from recorded step measurements (`batch,ctx,tokens,ms`, as
    /// --backend cuda writes them), without a GPU.
    #[arg(long)]
    pub steps: Option<PathBuf>,
    /// The GPU the steps run or ran on (catalog name): required with --steps; with
    /// --backend cuda it defaults to the catalog entry of the device found. With --observed
    /// runs: the GPU of those that name none (aiperf's, BLIS's).
    #[arg(long)]
    pub gpu: Option<String>,
    /// Fit the spread of the aiperf clients' turnaround (the rows aiperf measured), the fp8
    /// and fp4 GEMMs' weight-streaming and compute efficiencies (every engine's fp8 and
    /// NVFP4 rows of dense models), the mixture of experts' grouped-GEMM efficiency and eager prefill cost
    /// (their rows), each engine's grouped-GEMM efficiency on each GPU (its mixture-of-experts
    /// rows), then each engine's step overhead, all-reduce latency, eager step floor, fp8 and
    /// fp4 GEMM efficiencies per GPU and per-request front-end cost to measured deployments
    /// (aiconfigurator's silicon.csv),
    /// with k-fold held-out errors; writes `<out folder>/aiperf-turnaround.toml`,
    /// `fp8-memory.toml`, `fp8-gemm.toml`, `fp4-memory.toml`, `fp4-gemm.toml`,
    /// `moe-gemm.toml`, `moe-prefill.toml`, `observed-moe-<engine>.toml`,
    /// `observed-<engine>.toml` and their `.rows.csv` (every row's held-out errors; default
    /// folder: calibration/). Real runs instead (a run `sim replay` reads, or a folder of
    /// them: LLMServingSim's, `vllm bench serve` JSONs, aiperf's exports, TraceV2 or plain
    /// CSVs): each deployment's (model and GPU) GEMM and all-reduce efficiencies, step and
    /// per-sequence overheads and per-request front-end cost, fitted by replaying its runs,
    /// held out by time (each run's requests in k blocks) and by run; writes `<out
    /// folder>/replayed-<model>-<gpu>.toml` (a calibration file for `sim
    /// replay`/`run`/`plan --calibration`) and `.csv` (every run's figures); where runs record the KV blocks the engine allocated (LLMServingSim's),
    /// the memory plan's runtime reserve too (`memory-reserve.toml`). One of each may be
    /// given.
    #[arg(long, num_args = 1..)]
    pub observed: Vec<PathBuf>,
    /// With --observed runs: price every replay on the roofline, even where an operator
    /// profile lies beside a run (as `sim replay --no-profiles`).
    #[arg(long)]
    pub no_profiles: bool,
    /// With --observed runs: fit on top of this calibration file's `[cost]` (a `sim
    /// calibrate` output, such as `calibration/observed-vllm.toml`): each term starts from
    /// its value there, and the files written carry the rest of its terms.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Folds of the cross-validation (--observed).
    #[arg(long, default_value_t = 5)]
    pub folds: usize,
    /// With --observed measured deployments: fit only these stages (`aiperf-turnaround`,
    /// `allreduce-peer`, `fp8-memory`, `fp8`, `fp4-memory`, `fp4`, `moe`, `moe-prefill`, `moe-layer`, `moe-skew`, `mtp-acceptance`, `moe-engines`, `engines`; default:
    /// all, in that order). A stage left out keeps its default. The later stages run under
    /// the compiled-in turnaround spreads (`aiperf_turnaround_ms`), not ones this run fits:
    /// ship a moved spread before refitting the rest.
    #[arg(long, value_delimiter = ',', value_enum)]
    pub only: Vec<Stage>,
    /// With --observed measured deployments: fit the per-engine stages (`moe-engines`,
    /// `engines`) for these engines only (`vllm`, `sglang`, `trtllm`; default: every engine
    /// the rows name). The shared stages still fit every engine's rows.
    #[arg(long, value_delimiter = ',', value_enum)]
    pub engine: Vec<EngineName>,
    /// With --observed measured deployments: keep the per-engine stages' simulated rows in
    /// this folder and reuse them: the `moe-engines` stage's (every candidate's errors on
    /// every row, `moe-engines-<engine>.passes.csv`, reused when the rows, the terms under
    /// them and the candidates are the same) and the `engines` stage's (every row's errors
    /// under every engine cost it was simulated with, `engines-<engine>.passes.tsv`,
    /// appended as passes finish, so a stopped run keeps its work; a rerun simulates only
    /// the costs it has not seen). Delete the files after changing the simulator: its code
    /// is not part of the key.
    #[arg(long)]
    pub passes: Option<PathBuf>,
}

/// An engine whose rows the per-engine stages fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineName {
    /// vLLM.
    Vllm,
    /// SGLang.
    Sglang,
    /// TensorRT-LLM.
    Trtllm,
}

impl EngineName {
    /// The engine's name in silicon.csv's `backend` column.
    fn backend(self) -> &'static str {
        match self {
            EngineName::Vllm => "vllm",
            EngineName::Sglang => "sglang",
            EngineName::Trtllm => "trtllm",
        }
    }
}

/// A stage of `sim calibrate --observed` on measured deployments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Stage {
    /// Each engine's spread of the aiperf clients' turnaround (the rows aiperf measured).
    AiperfTurnaround,
    /// The one-shot all-reduce's cost per GPU beyond a pair.
    AllreducePeer,
    /// The fp8 GEMMs' weight-streaming efficiency.
    Fp8Memory,
    /// The fp8 GEMM efficiency.
    Fp8,
    /// The fp4 GEMMs' weight-streaming efficiency.
    Fp4Memory,
    /// The fp4 GEMM efficiency.
    Fp4,
    /// The grouped-GEMM efficiency of mixtures of experts.
    Moe,
    /// The eager launch cost of an MoE layer in a step that prefills.
    MoePrefill,
    /// The fixed cost per MoE layer of every step.
    MoeLayer,
    /// The routers' expert popularity skew.
    MoeSkew,
    /// The acceptance of multi-token-prediction drafts (the rows measured with them).
    MtpAcceptance,
    /// Each engine's grouped-GEMM efficiency, prefill floor and compute side's efficiency on
    /// each GPU, expert format and experts' shape, on its mixture-of-experts rows (a compute
    /// side offered to the formats the tensor cores take, and the TTFT's weight against the
    /// TPOT's in each choice, where an inner k-fold says so).
    MoeEngines,
    /// Each engine's step, all-reduce, eager-step and front-end costs, and its fp8, fp4 and
    /// all-reduce efficiencies per GPU.
    Engines,
}

/// Runs `sim calibrate`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    if args.backend == Some(BackendKind::Model) {
        anyhow::bail!(
            "--backend model: sim calibrate fits the cost model to measurements; --backend cuda measures the CUDA runtime, --steps FILE refits recorded steps, --from fits profiles"
        );
    }
    if !args.observed.is_empty() {
        let mut deployments = 0;
        for p in &args.observed {
            if !p.is_dir() && is_deployments_csv(p)? {
                deployments += 1;
            }
        }
        if deployments > 1 || args.observed.len() - deployments > 1 {
            anyhow::bail!(
                "--observed: give at most one run (or folder of runs) and one file of deployments (each writes its own fits; two of a kind would overwrite each other)"
            );
        }
        for path in &args.observed {
            if sim::observed::sim_run::is_sim_run(path) {
                from_served(path, &args, out)?;
            } else if path.is_dir() || !is_deployments_csv(path)? {
                from_runs(path, &args, out)?;
            } else {
                from_observed(path, &args, out)?;
            }
        }
        return Ok(());
    }
    if args.backend.is_some_and(|b| b != BackendKind::Model) || args.steps.is_some() {
        from_steps(args, out)
    } else {
        from_profiles(args, out)
    }
}

/// Fits a hardware profile of this machine and its `[cost]` to a run `sim serve` served on a
/// real runtime: writes `<out folder>/served-hardware.toml` (a `hardware.gpu_file`) and
/// `served-cost.toml` (a calibration file) for `sim replay --gpu-file ... --calibration ...`.
fn from_served(dir: &Path, args: &Args, out: &mut String) -> anyhow::Result<()> {
    use sim::cost_model::calibration::served;
    match sim::observed::sim_run::served_backend(dir).as_deref() {
        Some("cpu") | Some("cuda") => {}
        other => anyhow::bail!(
            "{}: not a run served on a real runtime (served.json's backend: {}): a profile is fitted to measured steps",
            dir.display(),
            other.unwrap_or("none")
        ),
    }
    let run = sim::observed::open(dir)?;
    let id = run.engine.model.clone().unwrap_or_default();
    let model = sim::catalog::find_model_by_id(&id)
        .or_else(|| sim::catalog::find_model(&id))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{}: model `{id}` is not in the catalog (sim models lists them)",
                dir.display()
            )
        })?;
    let block_size = run.engine.block_size.unwrap_or(16);
    let steps = served::read_steps(&dir.join("steps.csv")).map_err(anyhow::Error::msg)?;
    let fit = served::fit(model, Dtype::Bf16, block_size, &steps)
        .ok_or_else(|| anyhow::anyhow!("{}: no step with work in steps.csv", dir.display()))?;
    // Memory enough for the weights and the KV blocks the runtime held (16-bit, as the
    // cost model counts them), so that a replay holds them too.
    let blocks = f64::from(run.engine.num_gpu_blocks.unwrap_or(0));
    let per_token =
        2.0 * f64::from(model.layers) * f64::from(model.kv_heads * model.head_dim) * 2.0;
    let need = model.params() * 2.0 + blocks * f64::from(block_size) * per_token;
    let memory_gib = (need / 0.9 / f64::from(1u32 << 30)).ceil() + 2.0;
    let folder = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("calibration"));
    std::fs::create_dir_all(&folder).map_err(|e| anyhow::anyhow!("{}: {e}", folder.display()))?;
    let source = dir.display().to_string();
    let date = steps::today();
    let hw = folder.join("served-hardware.toml");
    std::fs::write(
        &hw,
        served::hardware_toml(&fit, "served-machine", &source, &date, memory_gib),
    )
    .map_err(|e| anyhow::anyhow!("{}: {e}", hw.display()))?;
    let cost = folder.join("served-cost.toml");
    std::fs::write(&cost, served::cost_toml(&fit, &source, &date))
        .map_err(|e| anyhow::anyhow!("{}: {e}", cost.display()))?;
    outln!(
        out,
        "{}: {} steps of {}: {:.1} GFLOP/s, {:.1} GB/s (weights at {:.0}%, attention at {:.0}%), step overhead {:.0} us + {:.0} us per sequence; median error {:.1}%, 90th percentile {:.1}%",
        dir.display(),
        fit.steps,
        model.name,
        fit.flops / 1e9,
        fit.bytes_per_s / 1e9,
        100.0 * fit.params.gemm_memory_eff,
        100.0 * fit.params.attn_memory_eff,
        fit.params.step_overhead_us.unwrap_or(0.0),
        fit.params.per_seq_overhead_us.unwrap_or(0.0),
        100.0 * fit.median_error,
        100.0 * fit.p90_error
    );
    outln!(out, "wrote {} and {}", hw.display(), cost.display());
    Ok(())
}

/// Whether `path` is a file of measured deployments (aiconfigurator's `silicon.csv`
/// columns) rather than a run.
fn is_deployments_csv(path: &Path) -> anyhow::Result<bool> {
    if path
        .extension()
        .is_none_or(|x| !x.eq_ignore_ascii_case("csv"))
    {
        return Ok(false);
    }
    let header = sim::observed::first_line(path)?;
    Ok(header
        .split(',')
        .any(|c| c.trim().trim_matches('"') == "silicon_ttft_ms"))
}

/// The `[cost]` table of a calibration file (`--calibration`), checked as a scenario
/// checks it.
fn base_cost(file: &Path) -> anyhow::Result<toml::Table> {
    let err = |m: String| anyhow::anyhow!("--calibration {}: {m}", file.display());
    let text = std::fs::read_to_string(file).map_err(|e| err(format!("cannot read: {e}")))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| err(e.message().trim().to_string()))?;
    let Some(toml::Value::Table(cost)) = table.get("cost") else {
        return Err(err("no [cost] table".into()));
    };
    let params: sim::cost_model::CostParams = toml::Value::Table(cost.clone())
        .try_into()
        .map_err(|e: toml::de::Error| err(format!("[cost]: {}", e.message().trim())))?;
    params.validate().map_err(|e| err(format!("[cost]: {e}")))?;
    Ok(cost.clone())
}

/// How an `--observed` run is replayed: on `gpu` where given (the one it names, or `--gpu`
/// where it names none), its steps priced from its operator profile unless `--no-profiles`.
fn replay_options(args: &Args, out_dir: &Path, gpu: Option<&str>) -> sim::replay::ReplayOptions {
    sim::replay::ReplayOptions {
        out_dir: out_dir.to_path_buf(),
        calibration: None,
        model: None,
        gpu: gpu.map(str::to_string),
        gpu_file: None,
        driver: sim::driver::DriverKind::Inline,
        profiles: if args.no_profiles {
            sim::replay::ProfileChoice::Off
        } else {
            sim::replay::ProfileChoice::Auto
        },
    }
}

/// Fits to real runs (`path`: one run, or a folder of them): the memory plan's runtime
/// reserve to the KV blocks the runs record, and each deployment's replay terms.
fn from_runs(path: &Path, args: &Args, out: &mut String) -> anyhow::Result<()> {
    if !(2..=20).contains(&args.folds) {
        anyhow::bail!("--folds: must be 2 to 20, got {}", args.folds);
    }
    let mut paths = Vec::new();
    let is_run = !path.is_dir()
        || path.join("vllm").join("meta.json").is_file()
        || sim::observed::is_aiperf_run(path);
    if is_run {
        paths.push(path.to_path_buf());
    } else {
        super::replay::runs_in(path, 0, &mut paths);
    }
    paths.sort();
    if paths.is_empty() {
        anyhow::bail!(
            "--observed {}: no run in the folder (LLMServingSim run folders, vLLM bench .json, aiperf exports, TraceV2 or plain .csv)",
            path.display()
        );
    }
    let base = match &args.calibration {
        Some(f) => base_cost(f)?,
        None => toml::Table::new(),
    };
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("calibration"));
    let mut checks = Vec::new();
    let mut groups = calibration::replayed::Deployments::new();
    // In a folder, a run that cannot be read or replayed is skipped with the reason (as
    // `sim replay` does); a run given alone is an error.
    let skip = |out: &mut String, p: &Path, why: String| -> anyhow::Result<()> {
        if is_run {
            anyhow::bail!("--observed {}: {why}", p.display());
        }
        outln!(out, "skipped {}: {why}", p.display());
        Ok(())
    };
    let check_dir = out_dir.join(".replay-check");
    for p in &paths {
        let observed = match sim::observed::open(p) {
            Ok(o) => o,
            Err(e) => {
                skip(out, p, e.to_string())?;
                continue;
            }
        };
        match sim::replay::memory_check(&observed) {
            Ok(Some(c)) => checks.push(c),
            Ok(None) => {}
            Err(sim::replay::ReplayError::Run { message, .. }) => {
                skip(out, p, message)?;
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        let model = match sim::replay::model_of(&observed) {
            Ok(m) => m,
            Err(_) => {
                let why = match &observed.engine.model {
                    Some(id) => {
                        format!("model `{id}` is not in the catalog (`sim models` lists them)")
                    }
                    None => {
                        "the run does not name its model (`sim replay --model` replays it on one)"
                            .into()
                    }
                };
                skip(out, p, why)?;
                continue;
            }
        };
        // A run that names no GPU replays on --gpu.
        let gpu = match (&observed.engine.gpu, &args.gpu) {
            (None, Some(g)) => sim::catalog::find_gpu(g).map(|g| g.name).ok_or_else(|| {
                anyhow::anyhow!("--gpu {g}: not in the catalog (`sim gpus` lists it)")
            })?,
            (named, _) => {
                match sim::replay::gpu_of(&observed) {
                    Ok(gpu) => gpu,
                    Err(_) => {
                        let why = match named {
                        Some(g) => format!("GPU `{g}` is not in the catalog: give --gpu (`sim gpus` lists them)"),
                        None => "the run does not name its GPU: give --gpu".into(),
                    };
                        skip(out, p, why)?;
                        continue;
                    }
                }
            }
        };
        // One replay under the defaults: a run the replay refuses (no send times, no
        // request that succeeded, a dense model's data parallelism) is left out here, not
        // part way through its deployment's fit.
        let checked = sim::replay::replay(&observed, &replay_options(args, &check_dir, Some(gpu)));
        let _ = std::fs::remove_dir_all(&check_dir);
        match checked {
            Ok(_) => {}
            Err(sim::replay::ReplayError::Run { message, .. }) => {
                skip(out, p, message)?;
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        // Its name in tables: the path under the folder given (the file or folder name of
        // a run given alone).
        let name = if is_run {
            sim::replay::run_name(p)
        } else {
            p.strip_prefix(path).unwrap_or(p).display().to_string()
        };
        groups
            .entry((model, gpu))
            .or_default()
            .push(calibration::replayed::FitRun {
                name,
                run: observed,
            });
    }
    std::fs::create_dir_all(&out_dir).map_err(|e| anyhow::anyhow!("{}: {e}", out_dir.display()))?;
    let source = path.display().to_string();
    match calibration::memory::fit_runtime_reserve(checks) {
        Some(fit) => {
            out.push_str(&fit.table());
            let file = out_dir.join("memory-reserve.toml");
            std::fs::write(&file, fit.toml(&source))
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            outln!(out, "wrote {}", file.display());
        }
        None => outln!(
            out,
            "no run records the KV blocks its engine allocated (vLLM's num_gpu_blocks): the memory plan's reserve is not fitted"
        ),
    }
    if groups.is_empty() {
        anyhow::bail!("--observed {}: no run could be replayed", path.display());
    }
    let fits = calibration::replayed::fit_deployments(
        &groups,
        &out_dir,
        // Each deployment replays on its own GPU.
        &replay_options(args, &out_dir, None),
        args.folds,
        &base,
    )?;
    for fit in &fits {
        out.push_str(&fit.table());
        let stem = format!("replayed-{}-{}", fit.model, fit.gpu);
        let file = out_dir.join(format!("{stem}.toml"));
        let text = fit
            .toml(&source)
            .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        std::fs::write(&file, text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        let csv = out_dir.join(format!("{stem}.csv"));
        std::fs::write(&csv, fit.csv()).map_err(|e| anyhow::anyhow!("{}: {e}", csv.display()))?;
        outln!(out, "wrote {} and {}", file.display(), csv.display());
    }
    Ok(())
}

/// Fits each engine's terms to measured deployments (aiconfigurator's rows), k-fold.
fn from_observed(path: &Path, args: &Args, out: &mut String) -> anyhow::Result<()> {
    if !(2..=20).contains(&args.folds) {
        anyhow::bail!("--folds: must be 2 to 20, got {}", args.folds);
    }
    let mut rows = sim::observed::silicon::read(path)?;
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("calibration"));
    std::fs::create_dir_all(&dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    // The kernel terms first, over every engine's rows: the all-reduce's cost per peer on
    // the dense models' rows above TP2, fp8 GEMMs on the dense models' fp8 rows, then the
    // experts' grouped GEMMs on the mixtures of experts' rows (with the fp8 fit); the
    // engines' own terms are then fitted with them.
    use sim::cost_model::calibration::efficiency::{fit_efficiency, Term};
    let mut prior = sim::cost_model::validation::silicon::EngineCost::default();
    let wanted = |s: Stage| args.only.is_empty() || args.only.contains(&s);
    if wanted(Stage::AiperfTurnaround) {
        use sim::cost_model::calibration::turnaround;
        let fits = turnaround::fit_turnaround(&rows, args.folds, &prior)?;
        for f in &fits {
            outln!(out, "{}", f.summary(args.folds));
        }
        if !fits.is_empty() {
            let file = dir.join(turnaround::FILE);
            let text = turnaround::toml(&fits, &path.display().to_string(), args.folds);
            std::fs::write(&file, text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            outln!(out, "wrote {}", file.display());
        }
    }
    for (term, stage) in [
        (Term::AllreducePeer, Stage::AllreducePeer),
        (Term::Fp8Memory, Stage::Fp8Memory),
        (Term::Fp8, Stage::Fp8),
        (Term::Fp4Memory, Stage::Fp4Memory),
        (Term::Fp4, Stage::Fp4),
        (Term::Moe, Stage::Moe),
        (Term::MoePrefill, Stage::MoePrefill),
        (Term::MoeLayer, Stage::MoeLayer),
        (Term::MoeSkew, Stage::MoeSkew),
        (Term::MtpAcceptance, Stage::MtpAcceptance),
    ] {
        if !wanted(stage) {
            continue;
        }
        let Some(f) = fit_efficiency(&rows, args.folds, term, &prior)? else {
            continue;
        };
        prior = term.cost(f.fit.value, &prior);
        outln!(out, "{}", f.summary(args.folds));
        let file = dir.join(term.file());
        std::fs::write(&file, f.toml(&path.display().to_string(), args.folds))
            .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        outln!(out, "wrote {}", file.display());
    }
    // The per-engine stages fit only the engines asked for (all by default).
    if let Some(e) = args
        .engine
        .iter()
        .find(|e| !rows.iter().any(|r| r.backend == e.backend()))
    {
        anyhow::bail!(
            "--engine {}: {} has no row of it",
            e.backend(),
            path.display()
        );
    }
    if !args.engine.is_empty() {
        rows.retain(|r| args.engine.iter().any(|e| e.backend() == r.backend));
    }
    if wanted(Stage::MoeEngines) {
        use sim::cost_model::calibration::moe_engines;
        let fits = moe_engines::fit_moe_engines(&rows, args.folds, &prior, args.passes.as_deref())?;
        out.push_str(&moe_engines::fit_table(&fits));
        for f in &fits {
            let file = dir.join(format!("observed-moe-{}.toml", f.engine));
            let text = moe_engines::fit_toml(f, &path.display().to_string(), args.folds);
            std::fs::write(&file, text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            outln!(out, "wrote {}", file.display());
            let rows_file = dir.join(format!("observed-moe-{}.rows.csv", f.engine));
            std::fs::write(&rows_file, moe_engines::fit_rows_csv(f)?)
                .map_err(|e| anyhow::anyhow!("{}: {e}", rows_file.display()))?;
            outln!(out, "wrote {}", rows_file.display());
        }
    }
    if !wanted(Stage::Engines) {
        return Ok(());
    }
    // The engines' terms are fitted on dense models: the experts' own efficiency would
    // bend them.
    let before = rows.len();
    rows.retain(|r| !r.is_moe());
    if rows.len() < before {
        outln!(
            out,
            "the engines' terms leave out {} rows of mixture-of-experts models",
            before - rows.len()
        );
    }
    let fits = sim::cost_model::calibration::observed::fit_engine_costs(
        &rows,
        args.folds,
        &prior,
        args.passes.as_deref(),
    )?;
    out.push_str(&sim::cost_model::calibration::observed::fit_table(&fits));
    for f in &fits {
        if let Some(dir) = &args.passes {
            outln!(
                out,
                "{}: {} rows simulated, {} read from {}",
                f.engine,
                f.passes.0,
                f.passes.1,
                dir.join(format!("engines-{}.passes.tsv", f.engine))
                    .display()
            );
        }
        let text = sim::cost_model::calibration::observed::fit_toml(
            f,
            &path.display().to_string(),
            args.folds,
        );
        let file = dir.join(format!("observed-{}.toml", f.engine));
        std::fs::write(&file, text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        outln!(out, "wrote {}", file.display());
        let rows_file = dir.join(format!("observed-{}.rows.csv", f.engine));
        let csv = sim::cost_model::calibration::observed::fit_rows_csv(f)?;
        std::fs::write(&rows_file, csv)
            .map_err(|e| anyhow::anyhow!("{}: {e}", rows_file.display()))?;
        outln!(out, "wrote {}", rows_file.display());
    }
    Ok(())
}

/// Fits to Vidur's profiles (a folder) or to measured GEMMs (a CSV).
fn from_profiles(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args {
        from, out: path, ..
    } = args;
    let path = path.unwrap_or_else(|| PathBuf::from("calibration/fitted.toml"));
    let fit = if from.is_file() {
        calibration::calibrate_points(&from)?
    } else {
        calibration::calibrate(&from)?
    };
    let text = calibration::fit_toml(&fit, &from.display().to_string());
    std::fs::write(&path, &text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    outln!(out, "{}", text.trim_end());
    outln!(out, "wrote {}", path.display());
    Ok(())
}

/// Measured steps, with the GPU they ran on, the device's name and where they came from.
type Measured = (Vec<StepTime>, &'static Gpu, String, String);

/// Fits to whole steps of the CUDA runtime: measured now on this machine's GPU, or read
/// from a `.steps.csv`.
fn from_steps(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args {
        out: path,
        backend,
        model,
        steps: file,
        gpu,
        ..
    } = args;
    let m = sim::catalog::find_model(&model).ok_or_else(|| {
        anyhow::anyhow!("--model: unknown model `{model}` (sim models lists them)")
    })?;
    if m.is_moe() {
        anyhow::bail!(
            "--model {model}: the CUDA runtime runs dense models; calibrate with a dense one"
        );
    }
    let (points, gpu_spec, device, source): Measured =
        match (backend.unwrap_or(BackendKind::Cuda), file) {
            (_, Some(file)) => {
                let g = gpu.as_deref().ok_or_else(|| {
                    anyhow::anyhow!("--steps: give --gpu, the catalog GPU the steps ran on")
                })?;
                let spec = gpu_of(g)?;
                (
                    steps::read_steps(&file).map_err(|e| anyhow::anyhow!(e))?,
                    spec,
                    g.to_string(),
                    format!("--steps {}", file.display()),
                )
            }
            (BackendKind::Cuda, None) => measure(m, &model, gpu.as_deref(), path.as_deref())?,
            (other, None) => anyhow::bail!(
                "--backend {other:?}: sim calibrate measures the CUDA runtime (--backend cuda), or refits recorded steps (--steps FILE)"
            ),
        };
    let path =
        path.unwrap_or_else(|| PathBuf::from(format!("calibration/{}-cuda.toml", gpu_spec.name)));
    let d = Deployment {
        parallel: Default::default(),
        model: m.clone(),
        gpu: gpu_spec.clone(),
        tp: 1,
        pp: 1,
        dtype: Dtype::Bf16,
        kv_dtype: Dtype::Bf16,
    };
    let fit = steps::fit_steps(&d, 16, &points)
        .ok_or_else(|| anyhow::anyhow!("{source}: no step measurements"))?;
    let text = steps::fit_toml(&fit, &source, &device, &steps::today(), &model);
    std::fs::write(&path, &text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    outln!(out, "{}", text.trim_end());
    outln!(out, "wrote {}", path.display());
    Ok(())
}

fn gpu_of(name: &str) -> anyhow::Result<&'static Gpu> {
    sim::catalog::find_gpu(name)
        .ok_or_else(|| anyhow::anyhow!("--gpu: unknown GPU `{name}` (sim gpus lists them)"))
}

/// Measures the step grid of `m` on this machine's GPU (`gpu`: its catalog name, default
/// the catalog entry of the device found) and writes the measurements beside `path`.
fn measure(
    m: &ModelSpec,
    model: &str,
    gpu: Option<&str>,
    path: Option<&Path>,
) -> anyhow::Result<Measured> {
    let info = kernels::cuda::probe().map_err(|e| {
        anyhow::anyhow!(
            "sim calibrate --backend cuda measures on an NVIDIA GPU and found none ({e}). On a GPU machine run: sim calibrate --backend cuda --model {model}; here, refit recorded steps with --steps FILE --gpu GPU"
        )
    })?;
    let g = match gpu {
        Some(g) => g.to_string(),
        None => sim::catalog::gpu_for_device(&info.name)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "the device `{}` is not in the GPU catalog: give --gpu (sim gpus lists them)",
                    info.name
                )
            })?
            .to_string(),
    };
    let spec = gpu_of(&g)?;
    // Weights, plus the KV of the largest grid step (128 x 2048 tokens).
    let need = m.params() * 2.0 + 128.0 * 2048.0 * 2.0 * m.kv_values_per_token();
    if (info.free_mem as f64) < need {
        anyhow::bail!(
            "{}: {:.1} GB free, the step grid of {model} needs about {:.1} GB",
            info.name,
            info.free_mem as f64 / 1e9,
            need / 1e9
        );
    }
    let decodes: Vec<(u32, u32)> = [1u32, 2, 4, 8, 16, 32, 64, 128]
        .iter()
        .flat_map(|&b| [(b, 512u32), (b, 2048)])
        .collect();
    let prefills = [128u32, 512, 1024, 2048, 4096];
    let pts = kernels::cuda::check::measure_step_grid(&m.llama_shape(), 16, &decodes, &prefills)?;
    let target = path
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(format!("calibration/{g}-cuda.toml")));
    let csv = target.with_extension("steps.csv");
    std::fs::write(&csv, steps::steps_csv(&pts))
        .map_err(|e| anyhow::anyhow!("{}: {e}", csv.display()))?;
    Ok((pts, spec, info.name, "--backend cuda".to_string()))
}
