//! Running a scenario: every variant on the same request stream, results written to disk.
//!
//! In: a loaded [`Scenario`] and [`RunOptions`] (output folder, driver, backend, variants).
//! For each variant ([`run_variant`], in parallel on the cost model): the workload is
//! opened, the backend built (`backends.rs`), the scheduler and block manager configured,
//! and the driver runs them to the end while the collector records every request and step.
//! Out: per variant `requests.csv`, `steps.csv`, `summary.json`, `plan.json`,
//! `warnings.txt` and `timing.json`, and per scenario `comparison.csv` and a copy of the
//! scenario; the summaries are returned. `bench.rs` times variants without writing.

mod backends;
mod bench;
mod fleet;
mod progress;

use std::path::{Path, PathBuf};
use std::time::Instant;

use analysis::{RunCollector, RunInfo, Summary};
use engine::block_manager::BlockManager;
use engine::eviction::EvictionKind;
use engine::scheduler::{KvAllocator, PreemptionMode, Scheduler};
use indicatif::ProgressBar;
use rayon::prelude::*;

pub use backends::BackendKind;
pub use bench::{bench_scenario, peak_rss_bytes, BenchResult};

use crate::driver::{run_to_end, DriverKind, EngineParts, RunStats};
use crate::scenario::{Scenario, Variant};
use crate::workload::Workload;
use crate::SimError;
use progress::Progress;

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
    /// A fleet's own figures (`[cluster]` variants; `fleet.json`).
    pub fleet: Option<analysis::fleet::FleetSummary>,
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SimError + '_ {
    move |source| SimError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Runs one variant: its workload through the engine on the chosen backend and driver,
/// records collected (and written under `out_dir`), the summary and the warnings returned.
///
/// The files are written into `<out_dir>.partial/` and the folder renamed to `out_dir` (an
/// earlier run's folder replaced) only once the run has finished, so that a folder named
/// for a variant always holds a whole run. A run that fails leaves `<out_dir>.partial/` with
/// the error in its `FAILED` file.
pub fn run_variant(
    scenario: &Scenario,
    variant: &Variant,
    backend_kind: BackendKind,
    driver: DriverKind,
    out_dir: Option<&Path>,
    progress: &ProgressBar,
    on_progress: &dyn Fn(),
) -> Result<VariantResult, SimError> {
    let partial = match out_dir {
        Some(dir) => Some(fresh_partial(dir)?),
        None => None,
    };
    let result = run_variant_into(
        scenario,
        variant,
        backend_kind,
        driver,
        partial.as_deref(),
        progress,
        on_progress,
    );
    let (Some(dir), Some(partial)) = (out_dir, partial) else {
        return result;
    };
    match result {
        Ok(r) => {
            if dir.exists() {
                std::fs::remove_dir_all(dir).map_err(io_err(dir))?;
            }
            std::fs::rename(&partial, dir).map_err(io_err(dir))?;
            Ok(r)
        }
        Err(e) => {
            // Best effort: the run's own error is what the caller reports.
            let _ = std::fs::write(partial.join("FAILED"), format!("{e}\n"));
            Err(e)
        }
    }
}

/// `<dir>.partial`, emptied and created.
fn fresh_partial(dir: &Path) -> Result<PathBuf, SimError> {
    let mut partial = dir.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(io_err(&partial))?;
    }
    std::fs::create_dir_all(&partial).map_err(io_err(&partial))?;
    Ok(partial)
}

/// [`run_variant`] writing straight into `out_dir`.
fn run_variant_into(
    scenario: &Scenario,
    variant: &Variant,
    backend_kind: BackendKind,
    driver: DriverKind,
    out_dir: Option<&Path>,
    progress: &ProgressBar,
    on_progress: &dyn Fn(),
) -> Result<VariantResult, SimError> {
    if variant.fleet.is_some() {
        return fleet::run_fleet_variant(
            scenario,
            variant,
            backend_kind,
            driver,
            out_dir,
            progress,
            on_progress,
        );
    }
    let started = Instant::now();
    let mut workload = Workload::open(&variant.config.workload, &scenario.base_dir, scenario.seed)?;
    let classes = workload.class_names();
    let mut collector = RunCollector::new(variant.config.slo.clone(), classes)
        .with_storm_threshold(variant.config.engine.preemption_storm_threshold);
    if let Some(dir) = out_dir {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        collector = collector.with_csv_files(dir)?;
        write_plan(dir, variant)?;
    }
    let run_err = |e: crate::driver::DriverError| SimError::Run {
        variant: variant.name.clone(),
        source: Box::new(e),
    };
    let parts = engine_parts(scenario, variant, backend_kind)?;
    let mut last = 0;
    // Attention data parallelism: one rank is simulated, taking every `dp`-th request (the
    // round-robin of vLLM's and SGLang's DP front ends) and its share of a closed loop's
    // clients; its MoE layers carry every rank's tokens (the cost model's job).
    let dp = variant.deployment.parallel.dp.max(1);
    let mut client = crate::driver::Client {
        frontend_ns: variant.config.cost.request_overhead_ns(),
        serial_request_ns: variant.config.cost.frontend_serial_ns().0,
        serial_update_ns: variant.config.cost.frontend_serial_ns().1,
        seed: scenario.seed,
        ..variant.config.workload.client()
    };
    client.max_in_flight = client.max_in_flight.map(|n| n.div_ceil(dp));
    let mut rank = (&mut workload).step_by(dp as usize);
    let stats = run_to_end(
        driver,
        parts,
        &mut rank,
        client,
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
        offload: stats.offload.map(|t| {
            let bs = u64::from(variant.memory.block_size);
            (t, t.loads * bs, t.disk_loads * bs)
        }),
    })?;
    let mut summary = summary;
    if dp > 1 {
        // The deployment's rates: every rank as busy as the simulated one.
        let ranks = f64::from(dp);
        summary.request_throughput *= ranks;
        summary.output_throughput *= ranks;
        summary.total_token_throughput *= ranks;
        summary.request_goodput = summary.request_goodput.map(|g| g * ranks);
    }
    let warnings = warnings(variant, &summary, &stats, &workload);
    if let Some(dir) = out_dir {
        analysis::write_summary_json(&dir.join("summary.json"), &summary)?;
        write_timing(dir, driver, &summary, &stats)?;
        let path = dir.join("warnings.txt");
        let text: String = warnings.iter().map(|w| format!("{w}\n")).collect();
        std::fs::write(&path, text).map_err(io_err(&path))?;
    }
    Ok(VariantResult {
        summary,
        stats,
        warnings,
        fleet: None,
    })
}

/// One engine of `variant` on the chosen backend: its backend, scheduler and block manager.
pub(crate) fn engine_parts(
    scenario: &Scenario,
    variant: &Variant,
    backend_kind: BackendKind,
) -> Result<EngineParts, SimError> {
    let (backend, num_blocks) = backends::build(backend_kind, scenario, variant)?;
    let mut sched_cfg = variant.scheduler.clone();
    if backend_kind != BackendKind::Model {
        // A real runtime holds the blocks it could allocate.
        sched_cfg.pool_tokens = u64::from(num_blocks) * u64::from(variant.memory.block_size);
    }
    // Real runtimes read and write KV through the block tables and consume token ids.
    sched_cfg.want_block_tables = backend.needs_block_tables();
    sched_cfg.keep_tokens = backend.needs_block_tables();
    let scheduler = Scheduler::new(sched_cfg).map_err(|e| SimError::Run {
        variant: variant.name.clone(),
        source: Box::new(crate::driver::DriverError::Engine(e)),
    })?;
    let block_manager = block_manager(scenario, variant, num_blocks, backend_kind)?;
    Ok(EngineParts {
        scheduler,
        block_manager,
        backend,
    })
}

/// `plan.json`: the deployment, memory plan, engine and cost settings the variant runs with.
pub(crate) fn write_plan(dir: &Path, variant: &Variant) -> Result<(), SimError> {
    let plan = serde_json::json!({
        "deployment": variant.deployment,
        "memory": variant.memory,
        "engine": variant.config.engine,
        "cost": variant.config.cost,
    });
    write_json(&dir.join("plan.json"), &plan)
}

/// Writes `value` as pretty JSON and a newline.
fn write_json(path: &Path, value: &serde_json::Value) -> Result<(), SimError> {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    std::fs::write(path, text + "\n").map_err(io_err(path))
}

/// `timing.json`: wall-clock figures, which vary run to run, so they live apart from the
/// byte-identical results.
fn write_timing(
    dir: &Path,
    driver: DriverKind,
    summary: &Summary,
    stats: &RunStats,
) -> Result<(), SimError> {
    let timing = serde_json::json!({
        "driver": format!("{driver:?}").to_lowercase(),
        "wall_time_s": summary.wall_time_s,
        "simulated_requests_per_s": summary.sim_speed,
        "steps": stats.steps,
        "simulated_time_s": stats.end_time as f64 / 1e9,
    });
    write_json(&dir.join("timing.json"), &timing)
}

/// The variant's block manager: its pool, prefix caching with the eviction policy, the
/// contiguous allocator, the sliding window and the swap space, as configured.
fn block_manager(
    scenario: &Scenario,
    variant: &Variant,
    num_blocks: u32,
    backend_kind: BackendKind,
) -> Result<BlockManager, SimError> {
    let e = &variant.config.engine;
    let mut block_manager = if e.enable_prefix_caching {
        let policy = match e.eviction_policy {
            EvictionKind::Belady => belady_oracle(scenario, variant)?,
            other => other.policy(),
        };
        BlockManager::with_prefix_caching(num_blocks, e.block_size, policy)
    } else {
        BlockManager::new(num_blocks, e.block_size)
    };
    if e.kv_allocator == KvAllocator::Contiguous {
        block_manager = block_manager.with_contiguous_allocation();
    }
    if variant.memory.offload_blocks > 0 {
        if backend_kind != BackendKind::Model {
            return Err(SimError::Scenario(crate::scenario::ScenarioError {
                file: scenario.path.display().to_string(),
                msg: format!(
                    "variant `{}`: engine.kv_offload_gib: the offload tier is modelled on the cost model only (--backend model)",
                    variant.name
                ),
            }));
        }
        block_manager = block_manager
            .with_offload(
                variant.memory.offload_blocks,
                e.kv_offload_store,
                e.kv_offload_policy,
            )
            .with_disk_tier(variant.memory.disk_blocks, e.kv_offload_policy);
    }
    if let Some(w) = variant.scheduler.sliding_window {
        block_manager = block_manager.with_sliding_window(w);
    }
    // A hybrid model's sliding and linear-attention layers keep side tables.
    block_manager = block_manager.with_side_groups(variant.memory.side_groups.clone());
    if e.preemption_mode == PreemptionMode::Swap {
        // The CPU runtime caps its host pool like its KV cache: the block manager must
        // plan with the pool the runtime has.
        let cpu_blocks = match backend_kind {
            BackendKind::Cpu => variant.memory.num_cpu_blocks.min(num_blocks),
            _ => variant.memory.num_cpu_blocks,
        };
        block_manager = block_manager.with_swap_space(cpu_blocks);
    }
    Ok(block_manager)
}

/// What the user should know of a finished run: leaks, rejections, preemption storms and
/// trace rows whose lengths were adjusted.
fn warnings(
    variant: &Variant,
    summary: &Summary,
    stats: &RunStats,
    workload: &Workload,
) -> Vec<String> {
    let mut warnings = Vec::new();
    let dp = variant.deployment.parallel.dp;
    if dp > 1 {
        warnings.push(format!(
            "{}: attention data parallelism: one of the {dp} ranks was simulated (every {dp}th request, 1/{dp} of a closed loop's clients); request counts and latencies are that rank's, throughputs the deployment's ({dp} x the rank's)",
            variant.name
        ));
    }
    let has_state = variant
        .memory
        .side_groups
        .iter()
        .any(|g| matches!(g, engine::block_manager::SideGroup::State { .. }));
    if has_state && variant.config.engine.enable_prefix_caching {
        warnings.push(format!(
            "{}: {} keeps a linear-attention state per sequence, not per block: prefix caching finds no hits (as vLLM without its Mamba `align` cache mode)",
            variant.name, variant.deployment.model.name
        ));
    }
    let limit = format!("max_model_len {}", variant.scheduler.max_model_len);
    warnings.extend(outcome_warnings(
        &variant.name,
        summary,
        stats,
        workload,
        (&limit, ""),
    ));
    warnings
}

/// What a finished run's records and counters say, one engine's or a fleet's: leaks,
/// rejections (longer than `rejected.0`, with `rejected.1`'s detail after), preemption
/// storms, adjusted trace rows.
fn outcome_warnings(
    name: &str,
    summary: &Summary,
    stats: &RunStats,
    workload: &Workload,
    rejected: (&str, &str),
) -> Vec<String> {
    let mut warnings = Vec::new();
    if stats.blocks_in_use_at_end > 0 {
        warnings.push(format!(
            "{name}: {} KV blocks still in use after every request ended (leak)",
            stats.blocks_in_use_at_end
        ));
    }
    if summary.num_rejected > 0 {
        warnings.push(format!(
            "{name}: {} requests rejected (prompt + output longer than {} or the KV pool){}",
            summary.num_rejected, rejected.0, rejected.1
        ));
    }
    if summary.num_preemption_storms > 0 {
        warnings.push(format!(
            "{name}: preemption storm: {} requests were preempted more than {} times (at most {}; {} preemptions in all); the KV pool is too small for this load (raise gpu_memory_utilization, lower max_num_seqs, use worst-case admission, or add GPUs)",
            summary.num_preemption_storms,
            summary.preemption_storm_threshold,
            summary.max_request_preemptions,
            summary.num_preemptions
        ));
    }
    if workload.clamped_prompts() > 0 {
        warnings.push(format!(
            "{name}: {} trace rows had an empty prompt and were given 1 token",
            workload.clamped_prompts()
        ));
    }
    if workload.clamped_outputs() > 0 {
        warnings.push(format!(
            "{name}: {} trace rows asked for 0 output tokens and were raised to 1",
            workload.clamped_outputs()
        ));
    }
    warnings
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
                "--variant: no variant named {} (variants: {})",
                opts.only
                    .iter()
                    .map(|v| format!("`{v}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
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
