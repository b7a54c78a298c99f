//! Scenario files: a base configuration plus `[[variant]]` overrides, all run on the same
//! request stream.
//!
//! ```toml
//! name = "mixed"
//! seed = 42
//! [model]
//! name = "llama-3-8b"
//! dtype = "bf16"
//! [hardware]
//! gpu = "h100-sxm"
//! tp = 1
//! [engine]
//! scheduler = "chunked"
//! [workload]
//! ...
//! [[variant]]
//! name = "static"
//! engine.scheduler = "static"
//! ```
//! Unknown keys anywhere are errors; a variant may override any table but `workload` and
//! `seed` (the request stream is shared by construction).

use std::path::{Path, PathBuf};

use analysis::Slo;
use engine::eviction::EvictionKind;
use engine::scheduler::{
    AdmissionPolicy, KvAllocator, PreemptionMode, QueuePolicy, SchedulerConfig, SchedulerKind,
    VictimPolicy,
};
use serde::{Deserialize, Serialize};

use crate::catalog::{find_gpu, find_model, gpu_from_file, model_from_file, Dtype, GPUS, MODELS};
use crate::cost_model::{memory_plan, CostParams, Deployment, MemoryInputs, MemoryPlan};
use crate::workload::WorkloadConfig;

/// An error in a scenario file: one line naming the file and the key or line.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {msg}")]
pub struct ScenarioError {
    /// The scenario file.
    pub file: String,
    /// What is wrong and where.
    pub msg: String,
}

/// `[model]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Catalog name or Hugging Face id (`sim models` lists them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A Hugging Face `config.json` describing the model instead (relative to the
    /// scenario file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<PathBuf>,
    /// A GGUF Llama model file instead (relative to the scenario file): its metadata is
    /// the model, and `--backend cpu` runs its weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gguf: Option<PathBuf>,
    /// Weight format.
    #[serde(default = "default_dtype")]
    pub dtype: Dtype,
    /// KV-cache format (default: the weight format; bf16 for fp8 weights).
    #[serde(default)]
    pub kv_dtype: Option<Dtype>,
}

fn default_dtype() -> Dtype {
    Dtype::Bf16
}

/// `[hardware]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareConfig {
    /// Catalog name (`sim gpus` lists them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// A GPU described in a TOML file instead (relative to the scenario file): `name`,
    /// `memory_gib`, `bf16_tflops`, `fp8_tflops` (optional), `fp32_tflops`,
    /// `memory_bandwidth_gbs`, `interconnect_gbs`, `pcie_gbs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_file: Option<PathBuf>,
    /// Tensor-parallel degree (GPUs per pipeline stage).
    #[serde(default = "one")]
    pub tp: u32,
    /// Pipeline-parallel degree (stages of consecutive layers; `tp x pp` GPUs).
    #[serde(default = "one")]
    pub pp: u32,
}

fn one() -> u32 {
    1
}

/// `[engine]`: the serving engine's knobs, named as vLLM names them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// `static`, `continuous` or `chunked`.
    #[serde(default = "default_scheduler")]
    pub scheduler: SchedulerKind,
    /// Tokens per KV block.
    #[serde(default = "default_block_size")]
    pub block_size: u32,
    /// Most sequences per step (for `static`: the batch size).
    #[serde(default = "default_max_num_seqs")]
    pub max_num_seqs: u32,
    /// Token budget per step (default: 2048 for chunked, as vLLM's server; otherwise
    /// max(max_model_len, 2048) so that a whole prompt fits, as vLLM V0).
    #[serde(default)]
    pub max_num_batched_tokens: Option<u32>,
    /// Longest prompt + output (default: the model's context length).
    #[serde(default)]
    pub max_model_len: Option<u32>,
    /// Fraction of GPU memory the engine may use.
    #[serde(default = "default_util")]
    pub gpu_memory_utilization: f64,
    /// Memory for the CUDA context, workspaces and graphs, GiB.
    #[serde(default = "default_overhead")]
    pub runtime_overhead_gib: f64,
    /// Use exactly this many KV blocks (like vLLM's `num_gpu_blocks_override`).
    #[serde(default)]
    pub num_gpu_blocks_override: Option<u32>,
    /// Prefix caching (vLLM V1's default: on). Only requests carrying token ids (e.g. the
    /// Mooncake trace) can hit.
    #[serde(default = "yes")]
    pub enable_prefix_caching: bool,
    /// Which cached block is evicted first: `lru` (vLLM), `fifo`, `lfu`, `slru`, or
    /// `belady` (offline optimum, from the workload's future).
    #[serde(default = "default_eviction")]
    pub eviction_policy: EvictionKind,
    /// Waiting-queue order: `fcfs`, `priority`, `sjf`, `sjf-oracle`.
    #[serde(default)]
    pub queue_policy: QueuePolicy,
    /// Aging period of the SJF policies, seconds (a request's key halves per period).
    #[serde(default = "default_aging")]
    pub queue_aging_s: f64,
    /// KV reserved at admission: `optimistic` (vLLM), `full-prompt`, `worst-case` (TGI).
    #[serde(default)]
    pub admission: AdmissionPolicy,
    /// Preemption victim: `newest` (vLLM), `lowest-priority`, `fewest-computed` (SGLang).
    #[serde(default)]
    pub preemption_victim: VictimPolicy,
    /// Fraction of KV blocks kept free when admitting (vLLM V0's watermark, e.g. 0.01).
    #[serde(default)]
    pub watermark: f64,
    /// What preemption does with the victim's KV: `recompute` (vLLM V1) or `swap` (to a CPU
    /// pool of `swap_space_gib`, over PCIe; vLLM V0).
    #[serde(default)]
    pub preemption_mode: PreemptionMode,
    /// CPU swap space per GPU, GiB (vLLM's `swap_space`, default 4); used by `swap`.
    #[serde(default = "default_swap_space")]
    pub swap_space_gib: f64,
    /// A request preempted more than this many times is counted (and warned about) as a
    /// preemption storm.
    #[serde(default = "default_storm")]
    pub preemption_storm_threshold: u32,
    /// Attend to the whole context even if the model has a sliding window (vLLM's
    /// `disable_sliding_window`); by default a model's window frees the blocks outside it.
    #[serde(default)]
    pub disable_sliding_window: bool,
    /// `paged` (PagedAttention) or `contiguous` (one run of blocks per sequence, the
    /// pre-PagedAttention baseline; pair it with `admission = "worst-case"` or
    /// `"max-model-len"`, and without prefix caching or swap).
    #[serde(default)]
    pub kv_allocator: KvAllocator,
}

fn default_swap_space() -> f64 {
    4.0
}

fn default_storm() -> u32 {
    analysis::DEFAULT_STORM_THRESHOLD
}

fn default_aging() -> f64 {
    10.0
}

fn yes() -> bool {
    true
}

fn default_eviction() -> EvictionKind {
    EvictionKind::Lru
}

fn default_scheduler() -> SchedulerKind {
    SchedulerKind::Chunked
}
fn default_block_size() -> u32 {
    16
}
fn default_max_num_seqs() -> u32 {
    256
}
fn default_util() -> f64 {
    0.9
}
fn default_overhead() -> f64 {
    1.0
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            scheduler: default_scheduler(),
            block_size: default_block_size(),
            max_num_seqs: default_max_num_seqs(),
            max_num_batched_tokens: None,
            max_model_len: None,
            gpu_memory_utilization: default_util(),
            runtime_overhead_gib: default_overhead(),
            num_gpu_blocks_override: None,
            enable_prefix_caching: true,
            eviction_policy: EvictionKind::Lru,
            queue_policy: QueuePolicy::Fcfs,
            queue_aging_s: default_aging(),
            admission: AdmissionPolicy::Optimistic,
            preemption_victim: VictimPolicy::Newest,
            watermark: 0.0,
            preemption_mode: PreemptionMode::Recompute,
            swap_space_gib: default_swap_space(),
            preemption_storm_threshold: default_storm(),
            disable_sliding_window: false,
            kv_allocator: KvAllocator::Paged,
        }
    }
}

/// A whole scenario configuration (the base, or the base with one variant's overrides).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioConfig {
    /// Scenario name (default: the file stem).
    #[serde(default)]
    pub name: Option<String>,
    /// Free text.
    #[serde(default)]
    pub description: Option<String>,
    /// Seed of every random stream (`--seed` overrides it).
    #[serde(default)]
    pub seed: u64,
    /// Model and formats.
    pub model: ModelConfig,
    /// GPUs.
    pub hardware: HardwareConfig,
    /// Engine knobs.
    #[serde(default)]
    pub engine: EngineConfig,
    /// The request stream.
    pub workload: WorkloadConfig,
    /// Service-level objectives for goodput.
    #[serde(default)]
    pub slo: Slo,
    /// Cost-model efficiencies and overheads.
    #[serde(default)]
    pub cost: CostParams,
    /// Speculative decoding (`[speculative]`; absent or `method = "none"`: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpeculativeConfig>,
    /// Variants (raw override tables; resolved by [`Scenario::load`]).
    #[serde(default, skip_serializing)]
    pub variant: Vec<toml::Table>,
    /// `[sweep]`: scenario keys (dotted paths) and the values each takes; the run covers
    /// every combination, crossed with the variants ([`Scenario::sweep`]).
    #[serde(default, skip_serializing)]
    pub sweep: Option<toml::Table>,
}

/// `[speculative]`: speculative decoding, named as vLLM's `speculative_config`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeConfig {
    /// `none`, `draft-model`, `ngram` (prompt lookup) or `synthetic`.
    pub method: SpecMethod,
    /// Drafts per verify step (vLLM's `num_speculative_tokens`).
    #[serde(default = "default_spec_k")]
    pub k: u32,
    /// The draft model (`draft-model`): a catalog name...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<String>,
    /// ...or a Hugging Face `config.json` (relative to the scenario).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_config: Option<PathBuf>,
    /// Tensor parallelism of the draft model (default: the target's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_tp: Option<u32>,
    /// Real runtimes (`--backend cpu`): the draft is the target's first N layers
    /// (self-speculation), sharing its KV cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_draft_layers: Option<u32>,
    /// Synthetic acceptance: unconditional per-position rates `r1 >= r2 >= ...` (the
    /// probability that drafts 1..i are all accepted; positions past the list repeat the
    /// last conditional rate)...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptance: Option<Vec<f64>>,
    /// ...or a mean acceptance length (tokens per verify step, i.i.d. positions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_acceptance_length: Option<f64>,
    /// Shortest n-gram prompt lookup tries (vLLM's `prompt_lookup_min`).
    #[serde(default = "one")]
    pub min_n: u32,
    /// Longest n-gram (vLLM's `prompt_lookup_max`).
    #[serde(default = "default_max_n")]
    pub max_n: u32,
    /// Dynamic k: `{ disable_above = 32 }` (vLLM's `disable_by_batch_size`) or `{
    /// full_until = 8, zero_at = 64 }` (k falls linearly to 0); absent: fixed k.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_k: Option<DynamicKConfig>,
}

/// How drafts are made (`none` turns speculation off, e.g. in a baseline variant).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpecMethod {
    /// Off.
    None,
    /// A draft model.
    DraftModel,
    /// Prompt lookup.
    Ngram,
    /// Acceptance only.
    Synthetic,
}

/// `dynamic_k = { ... }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DynamicKConfig {
    /// No speculation above this many running sequences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_above: Option<u32>,
    /// Full k up to this many running sequences...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_until: Option<u32>,
    /// ...then linearly down to 0 at this many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_at: Option<u32>,
}

fn default_spec_k() -> u32 {
    4
}

fn default_max_n() -> u32 {
    4
}

/// A synthetic acceptance from `acceptance` rates or a `mean_acceptance_length` for `k`
/// drafts (exactly one; `what` prefixes errors).
pub fn acceptance_from(
    what: &str,
    rates: &Option<Vec<f64>>,
    mean: Option<f64>,
    k: u32,
) -> Result<Option<engine::spec::Acceptance>, String> {
    match (rates, mean) {
        (Some(r), None) => engine::spec::Acceptance::from_rates(r)
            .map(Some)
            .map_err(|e| format!("{what}acceptance: {e}")),
        (None, Some(m)) => engine::spec::Acceptance::from_mean_length(m, k)
            .map(Some)
            .map_err(|e| format!("{what}mean_acceptance_length: {e}")),
        (Some(_), Some(_)) => Err(format!(
            "{what}acceptance and {what}mean_acceptance_length: give one, not both"
        )),
        (None, None) => Ok(None),
    }
}

/// One variant, resolved and checked: what a run needs.
#[derive(Debug, Clone)]
pub struct Variant {
    /// Variant name.
    pub name: String,
    /// Its full configuration.
    pub config: ScenarioConfig,
    /// Model on hardware.
    pub deployment: Deployment,
    /// The memory plan.
    pub memory: MemoryPlan,
    /// The scheduler's limits.
    pub scheduler: SchedulerConfig,
    /// Speculative decoding's draft model on the same GPUs (`method = "draft-model"`).
    pub draft: Option<Deployment>,
}

/// A loaded scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Scenario name.
    pub name: String,
    /// The file it came from.
    pub path: PathBuf,
    /// The folder relative paths are resolved against.
    pub base_dir: PathBuf,
    /// Seed.
    pub seed: u64,
    /// The base configuration.
    pub base: ScenarioConfig,
    /// Variants (the base alone, named `base`, when the file has none).
    pub variants: Vec<Variant>,
    /// The `[sweep]` dimensions, in file order: a dotted key and its values (empty: no
    /// sweep).
    pub sweep: Vec<(String, Vec<toml::Value>)>,
    /// The file's table, for re-resolving it at a sweep point.
    raw: toml::Table,
    /// The seed given on the command line, if any.
    seed_override: Option<u64>,
}

impl Scenario {
    /// Checks a modified configuration (e.g. another GPU or rate for capacity planning)
    /// and computes its deployment, memory plan and limits, as for a variant of the file.
    pub fn resolve_config(
        &self,
        name: &str,
        config: ScenarioConfig,
    ) -> Result<Variant, ScenarioError> {
        config.workload.validate().map_err(|e| ScenarioError {
            file: self.path.display().to_string(),
            msg: e.to_string(),
        })?;
        resolve(name, config, &self.base_dir).map_err(|msg| ScenarioError {
            file: self.path.display().to_string(),
            msg: format!("{name}: {msg}"),
        })
    }
}

/// 1-based line and column of byte offset `at` in `src`.
fn line_col(src: &str, at: usize) -> (usize, usize) {
    let before = &src[..at.min(src.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, col)
}

/// Replaces `cost.calibration = "file.toml"` (a `sim calibrate` output, relative to the
/// scenario's folder) by that file's `[cost]` keys, under the scenario's own `[cost]` keys,
/// which win. Returns whether a file was read.
fn expand_calibration(table: &mut toml::Table, base_dir: &Path) -> Result<bool, String> {
    let Some(toml::Value::Table(cost)) = table.get_mut("cost") else {
        return Ok(false);
    };
    let Some(value) = cost.remove("calibration") else {
        return Ok(false);
    };
    let toml::Value::String(rel) = value else {
        return Err(
            "cost.calibration: expected the path of a TOML file with a [cost] table (a `sim calibrate` output)"
                .into(),
        );
    };
    let file = base_dir.join(&rel);
    let shown = file.display();
    let text = std::fs::read_to_string(&file)
        .map_err(|e| format!("cost.calibration: {shown}: cannot read: {e}"))?;
    let parsed: toml::Table = toml::from_str(&text)
        .map_err(|e| format!("cost.calibration: {shown}: {}", e.message().trim()))?;
    let Some(toml::Value::Table(from_file)) = parsed.get("cost") else {
        return Err(format!("cost.calibration: {shown}: no [cost] table"));
    };
    // Check the file's keys on their own, so that an error names the file.
    serde_path_to_error::deserialize::<_, CostParams>(toml::Value::Table(from_file.clone()))
        .map_err(|e| {
            let key = e.path().to_string();
            format!(
                "cost.calibration: {shown}: [cost] {key}: {}",
                e.into_inner().message().trim()
            )
        })?;
    let mut merged = from_file.clone();
    merge(&mut merged, cost);
    *cost = merged;
    Ok(true)
}

/// Merges `over` into `base` recursively (tables merge, other values replace).
fn merge(base: &mut toml::Table, over: &toml::Table) {
    for (k, v) in over {
        match (base.get_mut(k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

impl Scenario {
    /// Reads, parses and checks a scenario file; `seed` overrides the file's seed.
    pub fn load(path: &Path, seed: Option<u64>) -> Result<Scenario, ScenarioError> {
        let file = path.display().to_string();
        let err = |msg: String| ScenarioError {
            file: file.clone(),
            msg,
        };
        let src = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read: {e}")))?;
        let raw: toml::Table = toml::from_str(&src).map_err(|e| {
            let msg = e.message().trim().replace('\n', " ");
            match e.span() {
                Some(span) => {
                    let (line, col) = line_col(&src, span.start);
                    err(format!("line {line}, column {col}: {msg}"))
                }
                None => err(msg),
            }
        })?;
        Scenario::from_table(path, Some(&src), raw, seed)
    }

    /// [`Scenario::load`] with a calibration file (`sim run --calibration FILE`): as if
    /// the scenario's `[cost]` had `calibration = FILE`, under its own `[cost]` keys.
    pub fn load_calibrated(
        path: &Path,
        seed: Option<u64>,
        calibration: &Path,
    ) -> Result<Scenario, ScenarioError> {
        let err = |msg: String| ScenarioError {
            file: path.display().to_string(),
            msg,
        };
        let src = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read: {e}")))?;
        let mut raw: toml::Table = toml::from_str(&src).map_err(|e| err(e.to_string()))?;
        let abs =
            std::path::absolute(calibration).map_err(|e| err(format!("--calibration: {e}")))?;
        set_dotted(
            &mut raw,
            "cost.calibration",
            toml::Value::String(abs.display().to_string()),
        )
        .map_err(err)?;
        Scenario::from_table(path, None, raw, seed)
    }

    /// The scenario at one point of its sweep: the file with `overrides` (dotted keys and
    /// values) applied to its base configuration, the variants on top.
    pub fn at_point(&self, overrides: &[(String, toml::Value)]) -> Result<Scenario, ScenarioError> {
        let mut raw = self.raw.clone();
        raw.remove("sweep");
        for (key, value) in overrides {
            set_dotted(&mut raw, key, value.clone()).map_err(|msg| ScenarioError {
                file: self.path.display().to_string(),
                msg: format!("sweep: {msg}"),
            })?;
        }
        let point = overrides
            .iter()
            .map(|(k, v)| format!("{k} = {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut s =
            Scenario::from_table(&self.path, None, raw, self.seed_override).map_err(|e| {
                ScenarioError {
                    file: e.file,
                    msg: format!("sweep point ({point}): {}", e.msg),
                }
            })?;
        s.raw = self.raw.clone();
        s.sweep = self.sweep.clone();
        Ok(s)
    }

    /// Parses and checks a scenario table (`src`, the file's text, places parse errors
    /// by line).
    fn from_table(
        path: &Path,
        src: Option<&str>,
        raw: toml::Table,
        seed: Option<u64>,
    ) -> Result<Scenario, ScenarioError> {
        let file = path.display().to_string();
        let err = |msg: String| ScenarioError {
            file: file.clone(),
            msg,
        };
        let seed_override = seed;
        let file_table = raw.clone();
        let sweep = sweep_dimensions(raw.get("sweep")).map_err(err)?;
        let at_line = |e: toml::de::Error| {
            let msg = e.message().trim().replace('\n', " ");
            match e.span() {
                Some(span) if src.is_some() => {
                    let (line, col) = line_col(src.unwrap_or_default(), span.start);
                    err(format!("line {line}, column {col}: {msg}"))
                }
                _ => err(msg),
            }
        };
        let mut raw = raw;
        let base_dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        // Variants merge into the file as written: their own `cost.calibration` must not
        // lose to keys the base's calibration file brought in.
        let unexpanded = raw.clone();
        let base: ScenarioConfig = match src {
            // Without a calibration file, errors keep the file's line and column.
            Some(src) if !expand_calibration(&mut raw, &base_dir).map_err(err)? => {
                toml::from_str(src).map_err(at_line)?
            }
            _ => {
                expand_calibration(&mut raw, &base_dir).map_err(err)?;
                serde_path_to_error::deserialize(toml::Value::Table(raw.clone())).map_err(|e| {
                    let path = e.path().to_string();
                    err(format!("{path}: {}", e.into_inner().message().trim()))
                })?
            }
        };
        let name = base.name.clone().unwrap_or_else(|| {
            path.file_stem()
                .map_or_else(|| "scenario".into(), |s| s.to_string_lossy().into_owned())
        });
        let seed = seed.unwrap_or(base.seed);
        base.workload.validate().map_err(|e| err(e.to_string()))?;

        let mut variants = Vec::new();
        if base.variant.is_empty() {
            variants.push(resolve("base", base.clone(), &base_dir).map_err(err)?);
        }
        for (i, over) in base.variant.iter().enumerate() {
            let vname = match over.get("name") {
                Some(toml::Value::String(s)) if !s.trim().is_empty() => s.clone(),
                _ => {
                    return Err(err(format!(
                        "variant #{}: needs a `name` (a non-empty string)",
                        i + 1
                    )))
                }
            };
            let mut over = over.clone();
            over.remove("name");
            for forbidden in ["workload", "seed", "variant", "name", "sweep"] {
                if over.contains_key(forbidden) {
                    return Err(err(format!(
                        "variant `{vname}`: `{forbidden}` cannot be overridden (variants share one request stream)"
                    )));
                }
            }
            let mut merged = unexpanded.clone();
            merged.remove("variant");
            merged.remove("sweep");
            merge(&mut merged, &over);
            expand_calibration(&mut merged, &base_dir)
                .map_err(|m| err(format!("variant `{vname}`: {m}")))?;
            let cfg: ScenarioConfig = serde_path_to_error::deserialize(toml::Value::Table(merged))
                .map_err(|e| {
                    let path = e.path().to_string();
                    let msg = e.into_inner().message().trim().replace('\n', " ");
                    if path.is_empty() || path == "." {
                        err(format!("variant `{vname}`: {msg}"))
                    } else {
                        err(format!("variant `{vname}`: {path}: {msg}"))
                    }
                })?;
            if variants.iter().any(|v: &Variant| v.name == vname) {
                return Err(err(format!("variant `{vname}` is defined twice")));
            }
            variants.push(
                resolve(&vname, cfg, &base_dir)
                    .map_err(|m| err(format!("variant `{vname}`: {m}")))?,
            );
        }
        Ok(Scenario {
            name,
            path: path.to_path_buf(),
            base_dir,
            seed,
            base,
            variants,
            sweep,
            raw: file_table,
            seed_override,
        })
    }

    /// The swept keys, in file order.
    pub fn sweep_keys(&self) -> Vec<String> {
        self.sweep.iter().map(|(k, _)| k.clone()).collect()
    }

    /// Every point of the sweep, in order (the last key varies fastest): the dotted keys
    /// and their values at that point. One empty point without a sweep.
    pub fn sweep_points(&self) -> Vec<Vec<(String, toml::Value)>> {
        let mut points: Vec<Vec<(String, toml::Value)>> = vec![Vec::new()];
        for (key, values) in &self.sweep {
            points = points
                .into_iter()
                .flat_map(|p| {
                    values.iter().map(move |v| {
                        let mut q = p.clone();
                        q.push((key.clone(), v.clone()));
                        q
                    })
                })
                .collect();
        }
        points
    }
}

/// The `[sweep]` table as dimensions: each array leaf (at any depth, so both `"a.b" =
/// [..]` and `[sweep.a] b = [..]` work) is a dotted key and its values.
fn sweep_dimensions(
    table: Option<&toml::Value>,
) -> Result<Vec<(String, Vec<toml::Value>)>, String> {
    fn walk(
        prefix: &str,
        t: &toml::Table,
        out: &mut Vec<(String, Vec<toml::Value>)>,
    ) -> Result<(), String> {
        for (k, v) in t {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(sub) => walk(&key, sub, out)?,
                toml::Value::Array(values) if !values.is_empty() => {
                    if out.iter().any(|(k, _)| *k == key) {
                        return Err(format!("sweep.{key}: given twice"));
                    }
                    let root = key.split('.').next().unwrap_or_default();
                    if ["variant", "sweep", "name"].contains(&root) {
                        return Err(format!("sweep.{key}: `{root}` cannot be swept"));
                    }
                    out.push((key, values.clone()));
                }
                _ => {
                    return Err(format!(
                        "sweep.{key}: expected a non-empty array of the values to sweep"
                    ))
                }
            }
        }
        Ok(())
    }
    let Some(value) = table else {
        return Ok(Vec::new());
    };
    let toml::Value::Table(t) = value else {
        return Err("sweep: expected a table of keys and value arrays".into());
    };
    let mut out = Vec::new();
    walk("", t, &mut out)?;
    Ok(out)
}

/// Sets the dotted key `key` of `table` to `value`, creating tables on the way.
fn set_dotted(table: &mut toml::Table, key: &str, value: toml::Value) -> Result<(), String> {
    let mut parts: Vec<&str> = key.split('.').collect();
    let Some(last) = parts.pop() else {
        return Err("empty key".into());
    };
    let mut t = table;
    for (i, p) in parts.iter().enumerate() {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = match entry {
            toml::Value::Table(sub) => sub,
            _ => return Err(format!("{key}: `{}` is not a table", parts[..=i].join("."))),
        };
    }
    t.insert(last.to_string(), value);
    Ok(())
}

/// A catalog entry named by `keys.0` or one described in the file `keys.1` (relative to
/// `base_dir`): exactly one must be given; errors name the key.
fn catalog_or_file<T: 'static>(
    keys: (&str, &str, &str),
    (name, file): (&Option<String>, &Option<PathBuf>),
    base_dir: &Path,
    find: impl Fn(&str) -> Result<&'static T, String>,
    load: impl Fn(&Path) -> Result<&'static T, String>,
) -> Result<&'static T, String> {
    let (name_key, file_key, file_what) = keys;
    match (name, file) {
        (Some(n), None) => find(n).map_err(|e| format!("{name_key}: {e}; or give {file_key}")),
        (None, Some(path)) => load(&base_dir.join(path)).map_err(|e| format!("{file_key}: {e}")),
        (Some(_), Some(_)) => Err(format!("give {name_key} or {file_key}, not both")),
        (None, None) => Err(format!(
            "missing: give {name_key} (the catalog) or {file_key} ({file_what})"
        )),
    }
}

/// A catalog model by name, or an error listing the catalog.
fn catalog_model(n: &str) -> Result<&'static crate::catalog::ModelSpec, String> {
    find_model(n).ok_or_else(|| {
        let names: Vec<&str> = MODELS.iter().map(|m| m.name).collect();
        format!("unknown model `{n}` (known: {})", names.join(", "))
    })
}

/// Checks one configuration and computes its deployment, memory plan and scheduler limits.
fn resolve(name: &str, config: ScenarioConfig, base_dir: &Path) -> Result<Variant, String> {
    let model = match (&config.model.gguf, &config.model.name, &config.model.config) {
        (Some(path), None, None) => crate::catalog::model_from_gguf(&base_dir.join(path))
            .map_err(|e| format!("model.gguf: {e}"))?,
        (Some(_), _, _) => {
            return Err("give one of model.name, model.config and model.gguf".into());
        }
        _ => catalog_or_file(
            (
                "model.name",
                "model.config",
                "a Hugging Face config.json, or model.gguf",
            ),
            (&config.model.name, &config.model.config),
            base_dir,
            catalog_model,
            model_from_file,
        )?,
    };
    let gpu = catalog_or_file(
        (
            "hardware.gpu",
            "hardware.gpu_file",
            "a GPU described in TOML",
        ),
        (&config.hardware.gpu, &config.hardware.gpu_file),
        base_dir,
        |g| {
            find_gpu(g).ok_or_else(|| {
                let names: Vec<&str> = GPUS.iter().map(|g| g.name).collect();
                format!("unknown GPU `{g}` (known: {})", names.join(", "))
            })
        },
        gpu_from_file,
    )?;
    let tp = config.hardware.tp;
    if tp == 0 || model.heads % tp != 0 {
        return Err(format!(
            "hardware.tp: must divide the model's {} attention heads, got {tp}",
            model.heads
        ));
    }
    let e = &config.engine;
    if !(1..=1024).contains(&e.block_size) || !e.block_size.is_power_of_two() {
        return Err(format!(
            "engine.block_size: must be a power of two from 1 to 1024, got {}",
            e.block_size
        ));
    }
    if !(e.gpu_memory_utilization > 0.0 && e.gpu_memory_utilization <= 1.0) {
        return Err(format!(
            "engine.gpu_memory_utilization: must be in (0, 1], got {}",
            e.gpu_memory_utilization
        ));
    }
    if !(e.runtime_overhead_gib >= 0.0 && e.runtime_overhead_gib.is_finite()) {
        return Err(format!(
            "engine.runtime_overhead_gib: must be a non-negative number, got {}",
            e.runtime_overhead_gib
        ));
    }
    if !(0.0..0.5).contains(&e.watermark) {
        return Err(format!(
            "engine.watermark: must be a fraction in [0, 0.5), got {}",
            e.watermark
        ));
    }
    if !(e.queue_aging_s > 0.0 && e.queue_aging_s.is_finite()) {
        return Err(format!(
            "engine.queue_aging_s: must be a positive number of seconds, got {}",
            e.queue_aging_s
        ));
    }
    if !(e.swap_space_gib >= 0.0 && e.swap_space_gib.is_finite()) {
        return Err(format!(
            "engine.swap_space_gib: must be a non-negative number of GiB, got {}",
            e.swap_space_gib
        ));
    }
    if e.kv_allocator == KvAllocator::Contiguous {
        if e.enable_prefix_caching {
            return Err(
                "engine.kv_allocator: the contiguous allocator shares no blocks, so it has no prefix caching: set engine.enable_prefix_caching = false".into(),
            );
        }
        if e.preemption_mode == PreemptionMode::Swap {
            return Err(
                "engine.preemption_mode: swap needs the paged allocator (engine.kv_allocator = \"paged\")".into(),
            );
        }
    }
    if e.num_gpu_blocks_override == Some(0) {
        return Err("engine.num_gpu_blocks_override: must be at least 1".into());
    }
    config.cost.validate()?;
    let max_model_len = e.max_model_len.unwrap_or(model.max_position);
    if max_model_len == 0 {
        return Err("engine.max_model_len: must be at least 1".into());
    }
    let max_num_batched_tokens = e.max_num_batched_tokens.unwrap_or(match e.scheduler {
        SchedulerKind::Chunked => 2048,
        _ => max_model_len.max(2048),
    });
    // The KV cache stays 16-bit unless asked otherwise (vLLM's kv_cache_dtype = "auto" for
    // quantized weights), in the weights' float format for float weights.
    let kv_dtype = config.model.kv_dtype.unwrap_or(match config.model.dtype {
        d @ (Dtype::Fp32 | Dtype::Fp16 | Dtype::Bf16) => d,
        _ => Dtype::Bf16,
    });
    if !kv_dtype.is_kv_format() {
        return Err(format!(
            "model.kv_dtype: {} is a weight format; the KV cache takes fp16, bf16, fp8, int8 or fp32",
            kv_dtype.as_str()
        ));
    }
    let pp = config.hardware.pp;
    if pp == 0 || pp > model.layers {
        return Err(format!(
            "hardware.pp: must be from 1 to the model's {} layers, got {pp}",
            model.layers
        ));
    }
    let deployment = Deployment {
        model: model.clone(),
        gpu: gpu.clone(),
        tp,
        pp,
        dtype: config.model.dtype,
        kv_dtype,
    };
    let (speculative, draft) = resolve_speculative(&config, &deployment, base_dir)?;
    // A self-speculation draft is part of the target: nothing more to hold.
    let own_draft = draft.as_ref().filter(|d| {
        !(d.model.name == deployment.model.name && d.model.layers < deployment.model.layers)
    });
    let memory = memory_plan(
        &deployment,
        &MemoryInputs {
            draft_weight_bytes: own_draft.map_or(0.0, |d| d.weight_bytes_per_gpu()),
            draft_kv_bytes_per_token: own_draft.map_or(0.0, |d| d.kv_bytes_per_token()),
            gpu_memory_utilization: e.gpu_memory_utilization,
            block_size: e.block_size,
            max_num_batched_tokens,
            max_num_seqs: e.max_num_seqs,
            max_model_len,
            runtime_overhead_bytes: e.runtime_overhead_gib * 1024.0 * 1024.0 * 1024.0,
            num_gpu_blocks_override: e.num_gpu_blocks_override,
        },
    )
    .map_err(|f| f.to_string())?;
    let mut memory = memory;
    if e.preemption_mode == PreemptionMode::Swap {
        memory.swap_bytes = e.swap_space_gib * 1024.0 * 1024.0 * 1024.0;
        memory.num_cpu_blocks = (memory.swap_bytes / memory.block_bytes)
            .floor()
            .min(f64::from(u32::MAX)) as u32;
    }
    let scheduler = SchedulerConfig {
        kind: e.scheduler,
        max_num_seqs: e.max_num_seqs,
        max_num_batched_tokens,
        max_model_len,
        pool_tokens: memory.pool_tokens,
        eos_token: None,
        want_block_tables: false,
        keep_tokens: false,
        block_size: e.block_size,
        prefix_caching: e.enable_prefix_caching,
        queue: e.queue_policy,
        queue_aging_ns: (e.queue_aging_s * 1e9) as u64,
        admission: e.admission,
        victim: e.preemption_victim,
        watermark_blocks: (e.watermark * f64::from(memory.num_blocks)).ceil() as u32,
        sliding_window: if e.disable_sliding_window || e.kv_allocator == KvAllocator::Contiguous {
            None
        } else {
            model.sliding_window
        },
        speculative,
    };
    scheduler.validate().map_err(|e| e.to_string())?;
    Ok(Variant {
        name: name.to_string(),
        config,
        deployment,
        memory,
        scheduler,
        draft,
    })
}

/// `[speculative]` of one configuration: the engine's settings (acceptance per class from
/// the workload's classes) and the draft model's deployment (same GPUs and formats).
fn resolve_speculative(
    config: &ScenarioConfig,
    target: &Deployment,
    base_dir: &Path,
) -> Result<(Option<engine::spec::SpecConfig>, Option<Deployment>), String> {
    use engine::spec::{DynamicK, Method, SpecConfig};
    let Some(sp) = config.speculative.as_ref() else {
        return Ok((None, None));
    };
    let method = match sp.method {
        SpecMethod::None => return Ok((None, None)),
        SpecMethod::DraftModel => Method::DraftModel,
        SpecMethod::Ngram => Method::Ngram,
        SpecMethod::Synthetic => Method::Synthetic,
    };
    if sp.k == 0 || sp.k > engine::spec::MAX_K {
        return Err(format!(
            "speculative.k: must be from 1 to {}, got {}",
            engine::spec::MAX_K,
            sp.k
        ));
    }
    let acceptance = acceptance_from(
        "speculative.",
        &sp.acceptance,
        sp.mean_acceptance_length,
        sp.k,
    )?
    .ok_or_else(|| {
        "speculative: give acceptance (per-position rates) or mean_acceptance_length: the simulator draws acceptances from them".to_string()
    })?;
    let mut class_acceptance = Vec::new();
    for (i, c) in config.workload.classes.iter().enumerate() {
        let what = format!("workload.classes[{i}] ({}).", c.name);
        class_acceptance.push(acceptance_from(
            &what,
            &c.acceptance,
            c.mean_acceptance_length,
            sp.k,
        )?);
    }
    let dynamic = match sp.dynamic_k {
        None => DynamicK::Off,
        Some(DynamicKConfig {
            disable_above: Some(b),
            full_until: None,
            zero_at: None,
        }) => DynamicK::DisableAbove { batch: b },
        Some(DynamicKConfig {
            disable_above: None,
            full_until: Some(f),
            zero_at: Some(z),
        }) => DynamicK::Linear {
            full_until: f,
            zero_at: z,
        },
        Some(_) => return Err(
            "speculative.dynamic_k: give { disable_above = N } or { full_until = A, zero_at = B }"
                .into(),
        ),
    };
    let spec = SpecConfig {
        method,
        k: sp.k,
        acceptance,
        class_acceptance,
        ngram_min: sp.min_n,
        ngram_max: sp.max_n,
        dynamic,
    };
    spec.validate()?;
    let self_draft = match sp.self_draft_layers {
        Some(n) if n == 0 || n >= target.model.layers => {
            return Err(format!(
                "speculative.self_draft_layers: must be from 1 to {} (the target has {} layers), got {n}",
                target.model.layers - 1,
                target.model.layers
            ))
        }
        other => other,
    };
    let draft = if method == Method::DraftModel
        && sp.draft_model.is_none()
        && sp.draft_config.is_none()
        && self_draft.is_some()
    {
        // Self-speculation: the target's first layers, its weights and KV cache shared.
        let mut model = target.model.clone();
        model.layers = self_draft.unwrap_or(1);
        Some(Deployment {
            model,
            ..target.clone()
        })
    } else if method == Method::DraftModel {
        let model = catalog_or_file(
            (
                "speculative.draft_model",
                "speculative.draft_config",
                "a Hugging Face config.json",
            ),
            (&sp.draft_model, &sp.draft_config),
            base_dir,
            catalog_model,
            model_from_file,
        )?;
        let tp = sp.draft_tp.unwrap_or(target.tp);
        if tp == 0 || tp > target.tp {
            return Err(format!(
                "speculative.draft_tp: must be from 1 to the target's tp ({}), got {tp}",
                target.tp
            ));
        }
        if model.vocab != target.model.vocab {
            return Err(format!(
                "speculative.draft_model: {} has a vocabulary of {} tokens, the target {} has {}: a draft must share the target's tokenizer",
                model.name, model.vocab, target.model.name, target.model.vocab
            ));
        }
        Some(Deployment {
            model: model.clone(),
            tp,
            pp: 1,
            ..target.clone()
        })
    } else {
        // A variant that switches to n-gram keeps the base's draft keys: unused here.
        None
    };
    Ok((Some(spec), draft))
}
