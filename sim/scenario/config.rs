//! The tables of a scenario file as serde types ([`ScenarioConfig`] and its `[model]`,
//! `[hardware]`, `[engine]`, `[speculative]` tables; the workload's are in
//! [`crate::workload`], `[cost]` is [`crate::cost_model::CostParams`], `[slo]` is
//! [`analysis::Slo`]). Unknown keys are errors; defaults are vLLM's.

use std::path::PathBuf;

use analysis::Slo;
use engine::eviction::EvictionKind;
use engine::scheduler::{
    AdmissionPolicy, KvAllocator, PreemptionMode, QueuePolicy, SchedulerKind, VictimPolicy,
};
use serde::{Deserialize, Serialize};

use crate::catalog::Dtype;
use crate::cost_model::CostParams;
use crate::workload::WorkloadConfig;

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
    /// Pipeline-parallel degree (stages of consecutive layers; `tp x dp x pp` GPUs).
    #[serde(default = "one")]
    pub pp: u32,
    /// Attention data-parallel ranks of a mixture of experts (each its own sequences and
    /// KV cache, attention over `tp` GPUs, the experts shared): `tp x dp` GPUs a stage.
    /// The simulation runs one rank, its MoE layers carrying every rank's tokens.
    #[serde(default = "one")]
    pub dp: u32,
    /// Expert-parallel degree: the routed experts split `ep` ways over the stage's GPUs
    /// (each expert split `tp x dp / ep` ways); must divide the experts and `tp x dp`.
    #[serde(default = "one")]
    pub ep: u32,
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
    /// What vLLM's profile run finds beside the weights and the activation peak (CUDA
    /// graphs' pool, cuBLAS and NCCL workspaces), GiB; default 0.66, fitted to the KV blocks
    /// vLLM 0.19 allocated on an RTX 4090.
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
    /// Host memory per GPU for a KV offload tier under the prefix cache, GiB (vLLM's
    /// `kv_offloading_size`, LMCache's `max_local_cpu_size`; 0: none): blocks evicted from
    /// the GPU cache stay reusable there, loaded back over PCIe instead of recomputed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kv_offload_gib: f64,
    /// When blocks are written to the tier: `write-through` (as they fill; vLLM, LMCache)
    /// or `on-evict` (when the GPU evicts them).
    #[serde(default, skip_serializing_if = "is_default")]
    pub kv_offload_store: engine::block_manager::offload::OffloadStore,
    /// Which block a full tier drops: `lru` or `arc` (the disk tier's too).
    #[serde(default, skip_serializing_if = "is_default")]
    pub kv_offload_policy: engine::block_manager::offload::OffloadPolicy,
    /// Local disk per GPU for a tier under the CPU tier, GiB (LMCache's
    /// `max_local_disk_size`; 0: none): it keeps the blocks the CPU tier drops; a hit there
    /// is read from disk, loaded over PCIe, and promoted to the CPU tier.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kv_disk_gib: f64,
    /// The disk's read bandwidth per GPU, GB/s (default 6: one NVMe PCIe 4.0 drive per
    /// GPU, as a DGX H100's eight cache drives give; a datasheet figure, not measured).
    #[serde(
        default = "default_kv_disk_gbs",
        skip_serializing_if = "is_default_kv_disk_gbs"
    )]
    pub kv_disk_gbs: f64,
    /// Static batching as Hugging Face `generate` serves a batch (the "naive" baseline):
    /// prompts padded to the batch's longest, finished members computing pad tokens
    /// until the last ends. Only with `scheduler = "static"`.
    #[serde(default)]
    pub static_padding: bool,
    /// Batches in flight at once (vLLM's `max_concurrent_batches`): under pipeline
    /// parallelism each stage runs its own micro-batch, so a new step starts once the first
    /// stage is free, from requests no step in flight holds. Default: `hardware.pp` (1
    /// with speculative decoding, the contiguous allocator or static batching, which runs
    /// one batch at a time through the stages, as Hugging Face's layer-by-layer
    /// `device_map` does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_batches: Option<u32>,
    /// TensorRT-LLM's batch waiting (`batch_wait_timeout_iters`; 0: off): while sequences
    /// decode, new prompts wait up to this many steps for more to gather. Chunked scheduler
    /// only.
    #[serde(default, skip_serializing_if = "is_default")]
    pub batch_wait_timeout_iters: u32,
    /// Split new prompts into chunks that fit a step's budget (vLLM's and TensorRT-LLM's
    /// `enable_chunked_prefill`; default on). `false`: a prompt joins a step of the chunked
    /// scheduler only whole, so `max_num_batched_tokens` must hold `max_model_len`.
    #[serde(default = "yes")]
    pub enable_chunked_prefill: bool,
    /// TensorRT-LLM's `batch_wait_max_tokens_ratio`: waiting prompts start at once when the
    /// step's tokens (theirs and one per decode) reach this share of
    /// `max_num_batched_tokens`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub batch_wait_max_tokens_ratio: f64,
    /// SGLang's `--scheduler-recv-interval` (0 and 1: off): while sequences decode, the
    /// scheduler takes in new arrivals only every this many decode steps (and after any
    /// step that prefilled, or when idle).
    #[serde(default, skip_serializing_if = "is_default")]
    pub recv_interval: u32,
    /// TensorRT-LLM's attention-DP balancing (`attention_dp_config: {enable_balance: true,
    /// timeout_iters}`; 0: off): new prompts wait until every rank has one or this many
    /// steps have passed. One rank is simulated, so the timeout (and the release when the
    /// rank has nothing to decode) is what is modelled. Needs `hardware.dp > 1`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub adp_balance_timeout_iters: u32,
    /// SGLang's `--max-prefill-tokens` with `--enable-mixed-chunk` (unset: off; chunked
    /// scheduler only): each step's decodes ride with one prefill chunk of up to
    /// `max_num_batched_tokens` (SGLang's `chunked_prefill_size`) less the decodes, and a
    /// further new prompt joins only if it fits this many tokens less the step's so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_prefill_tokens: Option<u32>,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn default_kv_disk_gbs() -> f64 {
    6.0
}

fn is_default_kv_disk_gbs(x: &f64) -> bool {
    *x == default_kv_disk_gbs()
}

fn is_default<T: Default + PartialEq>(x: &T) -> bool {
    *x == T::default()
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
/// The memory plan's runtime reserve: `sim calibrate --observed`'s fit to the KV blocks
/// vLLM 0.19 allocated (`calibration/memory-reserve.toml`; a test ties them).
fn default_overhead() -> f64 {
    0.66
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
            static_padding: false,
            max_concurrent_batches: None,
            kv_offload_gib: 0.0,
            kv_offload_store: Default::default(),
            kv_offload_policy: Default::default(),
            kv_disk_gib: 0.0,
            kv_disk_gbs: default_kv_disk_gbs(),
            batch_wait_timeout_iters: 0,
            enable_chunked_prefill: true,
            batch_wait_max_tokens_ratio: 0.0,
            recv_interval: 0,
            adp_balance_timeout_iters: 0,
            max_prefill_tokens: None,
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
    /// A fleet of replicas behind a router (`[cluster]`; absent: one engine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<super::cluster::ClusterConfig>,
    /// Variants (raw override tables; resolved by [`super::Scenario::load`]).
    #[serde(default, skip_serializing)]
    pub variant: Vec<toml::Table>,
    /// `[sweep]`: scenario keys (dotted paths) and the values each takes; the run covers
    /// every combination, crossed with the variants ([`super::Scenario::sweep`]).
    #[serde(default, skip_serializing)]
    pub sweep: Option<toml::Table>,
}

/// `[speculative]`: speculative decoding, named as vLLM's `speculative_config`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeConfig {
    /// `none`, `draft-model`, `mtp` (the model's MTP layers), `ngram` (prompt lookup) or
    /// `synthetic`.
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
    /// The model's own multi-token-prediction layers (DeepSeek-V3/R1's MTP module, Qwen3.5's
    /// `mtp_num_hidden_layers`) as the draft: vLLM's `method = "deepseek_mtp"`.
    Mtp,
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

impl SpeculativeConfig {
    /// The model's own multi-token-prediction layers drafting `k` tokens a step, each
    /// accepted with probability `acceptance` given the ones before it; every other key at
    /// its default.
    pub fn mtp(k: u32, acceptance: f64) -> Self {
        SpeculativeConfig {
            method: SpecMethod::Mtp,
            k,
            draft_model: None,
            draft_config: None,
            draft_tp: None,
            self_draft_layers: None,
            acceptance: Some(vec![acceptance]),
            mean_acceptance_length: None,
            min_n: one(),
            max_n: default_max_n(),
            dynamic_k: None,
        }
    }
}

fn default_spec_k() -> u32 {
    4
}

fn default_max_n() -> u32 {
    4
}
