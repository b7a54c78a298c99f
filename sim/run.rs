//! Running a scenario: every variant on the same request stream, results written to disk.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use analysis::{RunCollector, RunInfo, Summary};
use engine::block_manager::BlockManager;
use engine::eviction::EvictionKind;
use engine::scheduler::{KvAllocator, PreemptionMode, Scheduler};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use rayon::prelude::*;

use crate::catalog::Dtype;
use crate::cost_model::{CostModel, CostModelBackend};
use crate::driver::{run_to_end, DriverKind, RunStats};
use crate::scenario::{Scenario, Variant};
use crate::workload::Workload;
use crate::SimError;

/// Which backend executes the steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// The roofline cost model of the scenario's GPUs (no GPU needed).
    Model,
    /// Real kernels on the local NVIDIA GPU (synthetic weights of the scenario's model).
    Cuda,
    /// The CPU reference runtime: the weights of `model.gguf`, or synthetic weights of the
    /// scenario's model shape.
    Cpu,
}

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Where results go (`None`: nothing is written).
    pub out_dir: Option<PathBuf>,
    /// Driver.
    pub driver: DriverKind,
    /// Run only these variants (all when empty).
    pub only: Vec<String>,
    /// Show a progress bar on runs longer than a second.
    pub progress: bool,
    /// Run variants in parallel (the CUDA backend always runs them one by one).
    pub parallel: bool,
    /// Backend.
    pub backend: BackendKind,
    /// Override the workload's request count.
    pub requests: Option<u64>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            out_dir: None,
            driver: DriverKind::Actors,
            only: Vec::new(),
            progress: false,
            parallel: true,
            backend: BackendKind::Model,
            requests: None,
        }
    }
}

/// What one variant produced.
#[derive(Debug, Clone)]
pub struct VariantResult {
    /// The summary (also written as `summary.json`).
    pub summary: Summary,
    /// Driver counters.
    pub stats: RunStats,
    /// Things the user should know (leaks, rejections, adjusted trace rows).
    pub warnings: Vec<String>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SimError + '_ {
    move |source| SimError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Progress display that stays hidden for the first second of a run.
struct Progress {
    multi: MultiProgress,
    start: Instant,
    shown: Arc<AtomicBool>,
    enabled: bool,
}

impl Progress {
    fn new(enabled: bool) -> Self {
        Progress {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::hidden()),
            start: Instant::now(),
            shown: Arc::new(AtomicBool::new(false)),
            enabled,
        }
    }

    fn bar(&self, name: &str, len: Option<u64>) -> ProgressBar {
        let bar = self.multi.add(match len {
            Some(n) => ProgressBar::new(n),
            None => ProgressBar::no_length(),
        });
        let style = ProgressStyle::with_template(
            "{prefix:>12} [{bar:40}] {pos}/{len} requests ({per_sec}, {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(name.to_string());
        bar
    }

    fn tick(&self) {
        if self.enabled
            && !self.shown.load(Ordering::Relaxed)
            && self.start.elapsed() > Duration::from_secs(1)
            && !self.shown.swap(true, Ordering::Relaxed)
        {
            self.multi.set_draw_target(ProgressDrawTarget::stderr());
        }
    }
}

/// Runs one variant.
pub fn run_variant(
    scenario: &Scenario,
    variant: &Variant,
    backend_kind: BackendKind,
    driver: DriverKind,
    out_dir: Option<&Path>,
    progress: &ProgressBar,
    on_progress: &dyn Fn(),
) -> Result<VariantResult, SimError> {
    let started = Instant::now();
    let mut workload = Workload::open(&variant.config.workload, &scenario.base_dir, scenario.seed)?;
    let classes = workload.class_names();
    let mut collector = RunCollector::new(variant.config.slo.clone(), classes)
        .with_storm_threshold(variant.config.engine.preemption_storm_threshold);
    if let Some(dir) = out_dir {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        collector = collector.with_csv_files(dir)?;
        let plan_path = dir.join("plan.json");
        let plan = serde_json::json!({
            "deployment": variant.deployment,
            "memory": variant.memory,
            "engine": variant.config.engine,
            "cost": variant.config.cost,
        });
        let text = serde_json::to_string_pretty(&plan).unwrap_or_default();
        std::fs::write(&plan_path, text + "\n").map_err(io_err(&plan_path))?;
    }
    let run_err = |e: crate::driver::DriverError| SimError::Run {
        variant: variant.name.clone(),
        source: Box::new(e),
    };
    let mut sched_cfg = variant.scheduler.clone();
    let mut num_blocks = variant.memory.num_blocks;
    let backend: Box<dyn engine::backend::Backend> = match backend_kind {
        BackendKind::Model => {
            let backend = CostModelBackend::new(
                CostModel::new(variant.deployment.clone(), variant.config.cost.clone())
                    .with_block_size(variant.memory.block_size)
                    .with_sliding_window(variant.scheduler.sliding_window),
            );
            Box::new(match &variant.draft {
                Some(d) => {
                    let t = &variant.deployment.model;
                    let shares_kv = d.model.name == t.name && d.model.layers < t.layers;
                    backend.with_draft(
                        CostModel::new(d.clone(), variant.config.cost.clone())
                            .with_block_size(variant.memory.block_size),
                        shares_kv,
                    )
                }
                None => backend,
            })
        }
        BackendKind::Cuda => {
            let (rt, blocks) = cuda_runtime(variant, scenario.seed)?;
            num_blocks = blocks;
            sched_cfg.pool_tokens = u64::from(blocks) * u64::from(variant.memory.block_size);
            Box::new(kernels::cuda::CudaBackend::new(rt))
        }
        BackendKind::Cpu => {
            let (rt, blocks) = cpu_runtime(variant, scenario, scenario.seed)?;
            num_blocks = blocks;
            sched_cfg.pool_tokens = u64::from(blocks) * u64::from(variant.memory.block_size);
            Box::new(kernels::cpu::CpuBackend::new(rt))
        }
    };
    // Real runtimes read and write KV through the block tables and consume token ids.
    sched_cfg.want_block_tables = backend.needs_block_tables();
    sched_cfg.keep_tokens = backend.needs_block_tables();
    let scheduler = Scheduler::new(sched_cfg).map_err(|e| run_err(e.into()))?;
    let e = &variant.config.engine;
    let block_manager = if e.enable_prefix_caching {
        let policy = match e.eviction_policy {
            EvictionKind::Belady => belady_oracle(scenario, variant)?,
            other => other.policy(),
        };
        BlockManager::with_prefix_caching(num_blocks, e.block_size, policy)
    } else {
        BlockManager::new(num_blocks, e.block_size)
    };
    let block_manager = if e.kv_allocator == KvAllocator::Contiguous {
        block_manager.with_contiguous_allocation()
    } else {
        block_manager
    };
    let block_manager = match variant.scheduler.sliding_window {
        Some(w) => block_manager.with_sliding_window(w),
        None => block_manager,
    };
    let block_manager = if e.preemption_mode == PreemptionMode::Swap {
        // The CPU runtime caps its host pool like its KV cache: the block manager must
        // plan with the pool the runtime has.
        let cpu_blocks = match backend_kind {
            BackendKind::Cpu => variant.memory.num_cpu_blocks.min(num_blocks),
            _ => variant.memory.num_cpu_blocks,
        };
        block_manager.with_swap_space(cpu_blocks)
    } else {
        block_manager
    };
    let mut last = 0;
    let stats = run_to_end(
        driver,
        scheduler,
        block_manager,
        backend,
        &mut workload,
        &mut collector,
        &mut |ended| {
            if ended >= last + 256 {
                progress.set_position(ended);
                last = ended;
                on_progress();
            }
        },
    )
    .map_err(run_err)?;
    progress.finish_and_clear();
    let wall = started.elapsed().as_secs_f64();
    let summary = collector.finish(RunInfo {
        scenario: scenario.name.clone(),
        variant: variant.name.clone(),
        backend: match backend_kind {
            BackendKind::Model => "model".into(),
            BackendKind::Cuda => "cuda".into(),
            BackendKind::Cpu => "cpu".into(),
        },
        kv_pool_blocks: stats.pool_blocks,
        kv_blocks_in_use_at_end: stats.blocks_in_use_at_end,
        evictions: stats.evictions,
        wall_time_s: wall,
        spec: stats.spec.clone(),
    })?;
    if let Some(dir) = out_dir {
        analysis::write_summary_json(&dir.join("summary.json"), &summary)?;
        // Wall-clock figures vary run to run, so they live apart from the byte-identical
        // results.
        let timing = serde_json::json!({
            "driver": format!("{driver:?}").to_lowercase(),
            "wall_time_s": summary.wall_time_s,
            "simulated_requests_per_s": summary.sim_speed,
            "steps": stats.steps,
            "simulated_time_s": stats.end_time as f64 / 1e9,
        });
        let path = dir.join("timing.json");
        let text = serde_json::to_string_pretty(&timing).unwrap_or_default();
        std::fs::write(&path, text + "\n").map_err(io_err(&path))?;
    }
    let mut warnings = Vec::new();
    if stats.blocks_in_use_at_end > 0 {
        warnings.push(format!(
            "{}: {} KV blocks still in use after every request ended (leak)",
            variant.name, stats.blocks_in_use_at_end
        ));
    }
    if summary.num_rejected > 0 {
        warnings.push(format!(
            "{}: {} requests rejected (prompt + output longer than max_model_len {} or the KV pool)",
            variant.name, summary.num_rejected, variant.scheduler.max_model_len
        ));
    }
    if summary.num_preemption_storms > 0 {
        warnings.push(format!(
            "{}: preemption storm: {} requests were preempted more than {} times (at most {}; {} preemptions in all); the KV pool is too small for this load (raise gpu_memory_utilization, lower max_num_seqs, use worst-case admission, or add GPUs)",
            variant.name,
            summary.num_preemption_storms,
            summary.preemption_storm_threshold,
            summary.max_request_preemptions,
            summary.num_preemptions
        ));
    }
    if workload.clamped_prompts() > 0 {
        warnings.push(format!(
            "{}: {} trace rows had an empty prompt and were given 1 token",
            variant.name,
            workload.clamped_prompts()
        ));
    }
    if workload.clamped_outputs() > 0 {
        warnings.push(format!(
            "{}: {} trace rows asked for 0 output tokens and were raised to 1",
            variant.name,
            workload.clamped_outputs()
        ));
    }
    if let Some(dir) = out_dir {
        let path = dir.join("warnings.txt");
        let text: String = warnings.iter().map(|w| format!("{w}\n")).collect();
        std::fs::write(&path, text).map_err(io_err(&path))?;
    }
    Ok(VariantResult {
        summary,
        stats,
        warnings,
    })
}

/// Runs every (selected) variant of a scenario and writes `comparison.csv`.
pub fn run_scenario(
    scenario: &Scenario,
    opts: &RunOptions,
) -> Result<Vec<VariantResult>, SimError> {
    let selected: Vec<&Variant> = scenario
        .variants
        .iter()
        .filter(|v| opts.only.is_empty() || opts.only.contains(&v.name))
        .collect();
    if selected.is_empty() {
        let names: Vec<&str> = scenario.variants.iter().map(|v| v.name.as_str()).collect();
        return Err(SimError::Scenario(crate::scenario::ScenarioError {
            file: scenario.path.display().to_string(),
            msg: format!(
                "no variant named {:?} (variants: {})",
                opts.only,
                names.join(", ")
            ),
        }));
    }
    let progress = Progress::new(opts.progress);
    let expected =
        Workload::open(&scenario.base.workload, &scenario.base_dir, scenario.seed)?.expected_len();
    let bars: Vec<ProgressBar> = selected
        .iter()
        .map(|v| progress.bar(&v.name, expected))
        .collect();
    let job = |(v, bar): (&&Variant, &ProgressBar)| {
        let dir = opts.out_dir.as_ref().map(|d| d.join(&v.name));
        let mut v = (*v).clone();
        if opts.requests.is_some() {
            v.config.workload.num_requests = opts.requests;
        }
        run_variant(
            scenario,
            &v,
            opts.backend,
            opts.driver,
            dir.as_deref(),
            bar,
            &|| progress.tick(),
        )
    };
    // One GPU: real backends run the variants one after another.
    let parallel = opts.parallel && opts.backend == BackendKind::Model;
    let results: Vec<Result<VariantResult, SimError>> = if parallel {
        selected.par_iter().zip(bars.par_iter()).map(job).collect()
    } else {
        selected.iter().zip(bars.iter()).map(job).collect()
    };
    let results = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    if let Some(dir) = &opts.out_dir {
        let summaries: Vec<Summary> = results.iter().map(|r| r.summary.clone()).collect();
        analysis::write_comparison_csv(&dir.join("comparison.csv"), &summaries)?;
        // The scenario as run, for the report.
        let copy = dir.join("scenario.toml");
        std::fs::copy(&scenario.path, &copy).map_err(io_err(&copy))?;
    }
    Ok(results)
}

/// One benchmark measurement of a variant.
#[derive(Debug, Clone)]
pub struct BenchResult {
    /// Variant.
    pub variant: String,
    /// Requests simulated (completed + rejected).
    pub requests: u64,
    /// Steps simulated.
    pub steps: u64,
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// Simulated seconds.
    pub simulated_s: f64,
}

/// Runs each selected variant once, sequentially, writing nothing, and times it
/// (`sim bench`); `requests` overrides the workload's `num_requests`.
pub fn bench_scenario(
    scenario: &Scenario,
    driver: DriverKind,
    only: &[String],
    requests: Option<u64>,
) -> Result<Vec<BenchResult>, SimError> {
    let mut out = Vec::new();
    for v in scenario
        .variants
        .iter()
        .filter(|v| only.is_empty() || only.contains(&v.name))
    {
        let mut v = v.clone();
        if requests.is_some() {
            v.config.workload.num_requests = requests;
        }
        let bar = ProgressBar::hidden();
        let r = run_variant(scenario, &v, BackendKind::Model, driver, None, &bar, &|| {})?;
        out.push(BenchResult {
            variant: v.name.clone(),
            requests: r.summary.completed + r.summary.num_rejected,
            steps: r.stats.steps,
            wall_s: r.summary.wall_time_s,
            simulated_s: r.stats.end_time as f64 / 1e9,
        });
    }
    Ok(out)
}

/// Peak resident memory of this process in bytes (Linux `VmHWM`), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Belady's oracle for a variant: every request the engine will admit with its prompt
/// block hashes, from a second pass over the (deterministic) workload.
fn belady_oracle(
    scenario: &Scenario,
    variant: &Variant,
) -> Result<Box<dyn engine::eviction::EvictionPolicy>, SimError> {
    let workload = Workload::open(&variant.config.workload, &scenario.base_dir, scenario.seed)?;
    let s = &variant.scheduler;
    let mut requests = Vec::new();
    for req in workload {
        let req = req?;
        let total = u64::from(req.prompt_len) + u64::from(req.max_tokens);
        // Requests rejected on arrival never look anything up.
        if total > u64::from(s.max_model_len) || total > s.pool_tokens {
            continue;
        }
        let hashes = engine::prefix::block_hashes(&req.prompt_tokens, s.block_size);
        requests.push((req.id, req.arrival, req.prompt_len, hashes));
    }
    Ok(Box::new(engine::eviction::Belady::from_requests(
        s.block_size,
        requests,
    )))
}

/// Host memory the CPU runtime's KV cache may take (f32 K and V of every layer).
const CPU_KV_BUDGET_BYTES: u64 = 2 << 30;

/// A real runtime that cannot be built for a variant, as the run's error.
fn runtime_err(variant: &Variant, backend: &str, message: String) -> SimError {
    SimError::Run {
        variant: variant.name.clone(),
        source: Box::new(crate::driver::DriverError::Backend(
            engine::backend::BackendError {
                backend: backend.into(),
                message,
            },
        )),
    }
}

/// Builds the CPU runtime of a variant: the weights of `model.gguf`, or synthetic weights
/// of its model's shape, with the memory plan's KV pool capped at [`CPU_KV_BUDGET_BYTES`]
/// of host memory.
fn cpu_runtime(
    variant: &Variant,
    scenario: &Scenario,
    seed: u64,
) -> Result<(kernels::cpu::CpuRuntime, u32), SimError> {
    let cpu_err = |message: String| runtime_err(variant, "cpu", message);
    let d = &variant.deployment;
    if d.tp != 1 || d.pp != 1 || d.model.is_moe() {
        return Err(cpu_err(format!(
            "model {} with tp = {}, pp = {}: the CPU runtime runs dense models on one device",
            d.model.name, d.tp, d.pp
        )));
    }
    let m = &variant.memory;
    let shape = d.model.llama_shape();
    let per_block = u64::from(m.block_size)
        * 2
        * u64::from(shape.layers)
        * u64::from(shape.kv_heads * shape.head_dim)
        * 4;
    let blocks = m
        .num_blocks
        .min((CPU_KV_BUDGET_BYTES / per_block.max(1)).max(1) as u32);
    let mut rt = match &variant.config.model.gguf {
        Some(path) => {
            let g = kernels::gguf::Gguf::open(&scenario.base_dir.join(path))
                .map_err(|e| cpu_err(e.to_string()))?;
            kernels::cpu::CpuRuntime::from_gguf(&g, m.block_size, blocks)
        }
        None => kernels::cpu::CpuRuntime::synthetic(shape, seed, m.block_size, blocks),
    }
    .map_err(|e| cpu_err(e.to_string()))?;
    rt.set_sliding_window(variant.scheduler.sliding_window);
    if variant.config.engine.preemption_mode == PreemptionMode::Swap {
        // Host memory too: the swap pool is capped like the KV cache.
        rt.with_swap_space(m.num_cpu_blocks.min(blocks));
    }
    // A real draft model: self-speculation by the target's first layers (n-gram drafts
    // come from the engine).
    let spec = variant.scheduler.speculative.as_ref();
    if spec.is_some_and(|s| s.method == engine::spec::Method::DraftModel) {
        let layers = variant
            .config
            .speculative
            .as_ref()
            .and_then(|s| s.self_draft_layers)
            .ok_or_else(|| {
                cpu_err(
                    "speculative.method = \"draft-model\" on the CPU runtime drafts by self-speculation: set speculative.self_draft_layers (the target's first N layers)"
                        .into(),
                )
            })?;
        rt.set_self_speculation(Some(layers as usize));
    }
    if spec.is_some_and(|s| s.method == engine::spec::Method::Synthetic) {
        return Err(cpu_err(
            "speculative.method = \"synthetic\" has no drafts to verify: use ngram or draft-model with a real backend"
                .into(),
        ));
    }
    Ok((rt, blocks))
}

/// Builds the CUDA runtime of a variant (synthetic weights of its model) and the number of
/// KV blocks it holds: the memory plan's pool, capped by what the GPU really has free after
/// the weights, the activation peak and 1 GiB of headroom.
fn cuda_runtime(
    variant: &Variant,
    seed: u64,
) -> Result<(kernels::cuda::CudaRuntime, u32), SimError> {
    let cuda_err = |e: kernels::cuda::CudaError| runtime_err(variant, "cuda", e.to_string());
    if variant
        .scheduler
        .speculative
        .as_ref()
        .is_some_and(|s| s.method != engine::spec::Method::Ngram)
    {
        return Err(cuda_err(kernels::cuda::CudaError::Config(
            "[speculative]: the CUDA runtime verifies the engine's n-gram drafts (method = \"ngram\"); a draft model (self-speculation) runs on --backend cpu, synthetic acceptance on --backend model".into(),
        )));
    }
    if variant.deployment.pp != 1 {
        return Err(cuda_err(kernels::cuda::CudaError::Config(format!(
            "hardware.pp = {}: the CUDA backend runs on one GPU (no pipeline stages yet)",
            variant.deployment.pp
        ))));
    }
    if variant.deployment.tp != 1 {
        return Err(cuda_err(kernels::cuda::CudaError::Config(format!(
            "hardware.tp = {}: the CUDA backend runs on one GPU (tensor parallelism needs NCCL, not built yet)",
            variant.deployment.tp
        ))));
    }
    let d = &variant.deployment;
    if d.model.is_moe() {
        return Err(cuda_err(kernels::cuda::CudaError::Config(format!(
            "model {}: the CUDA runtime runs dense Llama-architecture MLPs only (no mixture of experts yet)",
            d.model.name
        ))));
    }
    if !matches!(d.dtype, Dtype::Bf16 | Dtype::Fp16) {
        return Err(cuda_err(kernels::cuda::CudaError::Config(format!(
            "model.dtype = {}: the CUDA runtime runs 16-bit weights (set model.dtype = \"bf16\")",
            d.dtype.as_str()
        ))));
    }
    let shape = variant.deployment.model.llama_shape();
    let info = kernels::cuda::probe().map_err(cuda_err)?;
    let m = &variant.memory;
    let free = info.free_mem as f64 * m.gpu_memory_utilization
        - shape.weight_bytes() as f64
        - m.activation_bytes
        - 1024.0 * 1024.0 * 1024.0;
    let fit =
        kernels::cuda::CudaRuntime::blocks_that_fit(&shape, m.block_size, free.max(0.0) as u64);
    let blocks = m.num_blocks.min(fit);
    let mut rt = kernels::cuda::CudaRuntime::synthetic(shape, seed, m.block_size, blocks)
        .map_err(cuda_err)?;
    rt.set_sliding_window(variant.scheduler.sliding_window);
    if variant.config.engine.preemption_mode == PreemptionMode::Swap {
        rt.with_swap_space(m.num_cpu_blocks).map_err(cuda_err)?;
    }
    rt.warm_up().map_err(cuda_err)?;
    Ok((rt, blocks))
}
