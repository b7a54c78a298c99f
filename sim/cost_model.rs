//! The cost model backend: a per-operator roofline of one engine step (DESIGN §6), and the
//! memory plan that sizes the KV pool (DESIGN §5).
//!
//! Each operator of a layer costs `max(FLOPs / (peak x eff_compute), bytes / (bandwidth x
//! eff_memory)) + launch overhead`; a step is the layers' sum plus the LM head, the
//! tensor-parallel all-reduces and a per-step CPU overhead of the serving framework. The
//! efficiencies are constants here with defaults documented on [`CostParams`]; a shape-
//! dependent calibration replaces them later (DESIGN §6).

use engine::backend::{Backend, BackendError, SIM_TOKEN};
use engine::plan::{StepOutcome, StepPlan, WorkKind};
use serde::{Deserialize, Serialize};

use crate::catalog::{Dtype, Gpu, ModelSpec};

/// Efficiency factors and overheads of the cost model. Defaults come from public
/// measurements (gpt-fast, FasterTransformer, TensorRT-LLM and Vidur's profiles, see
/// `VALIDATION.md`): GEMMs reach 85% of HBM bandwidth and 75% of the tensor-core peak,
/// with compute and memory time overlapping as a soft maximum (exponent 1.5); `sim
/// calibrate` fits these three to Vidur's A100 and H100 layer profiles (4.4% median error);
/// FlashAttention-2 prefill ~50%; all-reduce efficiency and latency come from the GPU
/// catalog (fitted to Vidur's NCCL profiles), with the framework's custom all-reduce for
/// small messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CostParams {
    /// Fraction of peak FLOP/s reached by the linear layers.
    pub gemm_compute_eff: f64,
    /// Fraction of memory bandwidth reached when streaming weights.
    pub gemm_memory_eff: f64,
    /// Fraction of peak FLOP/s reached by prefill attention.
    pub attn_compute_eff: f64,
    /// Fraction of memory bandwidth reached by paged decode attention.
    pub attn_memory_eff: f64,
    /// Fraction of bandwidth reached by element-wise kernels (norms, RoPE, activation).
    pub elementwise_memory_eff: f64,
    /// Prefill attention efficiency relative to `attn_compute_eff` (default: the
    /// framework's: 1 with FlashAttention-2, lower for older kernels).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_attention_scale: Option<f64>,
    /// The serving framework whose CPU and launch overheads apply (`vllm-v1`, `vllm-v0`,
    /// `tensorrt-llm`, `hf-transformers`, `llama.cpp`); the three overheads below override
    /// its figures one by one.
    pub framework: Framework,
    /// Launch overhead per kernel, microseconds (default: the framework's).
    pub kernel_launch_us: Option<f64>,
    /// Fraction of the link bandwidth an all-reduce reaches (default: the GPU's,
    /// fitted to Vidur's NCCL profiles: 0.6 on A100 DGX, 0.8 on H100 DGX).
    pub allreduce_eff: Option<f64>,
    /// Latency of one all-reduce, microseconds (default: the GPU's, 50 on A100 DGX, 30
    /// on H100 DGX).
    pub allreduce_latency_us: Option<f64>,
    /// Overlap of compute and memory time in one kernel: `None` is the plain roofline
    /// `max(t_compute, t_memory)`; `Some(p)` is the soft maximum `(t_c^p + t_m^p)^(1/p)`,
    /// slower near the ridge point where neither bound hides the other (p = 1.5 fits
    /// Vidur's GEMM profiles).
    pub overlap_exponent: Option<f64>,
    /// Use the framework's own all-reduce kernel for messages up to 8 MiB (vLLM's and
    /// TensorRT-LLM's custom all-reduce over NVLink: ~10 us instead of NCCL's fixed cost);
    /// default: whether the framework has one.
    pub custom_allreduce: Option<bool>,
    /// Framework CPU overhead per step, microseconds (scheduling, input preparation;
    /// default: the framework's).
    pub step_overhead_us: Option<f64>,
    /// Additional CPU overhead per sequence in the step, microseconds (default: the
    /// framework's).
    pub per_seq_overhead_us: Option<f64>,
    /// Fraction of the 16-bit GEMM rate kept when weights are dequantized on the fly
    /// (weight-only int8/int4/GGUF formats: the unpacking costs ALU work in the GEMM).
    pub dequant_compute_eff: f64,
    /// Weight-streaming efficiency of 8-bit weight-only GEMV kernels relative to 16-bit
    /// ones (`gemm_memory_eff` is multiplied by it). Fitted to gpt-fast on an A100
    /// (calibration.csv V01/V02: 104.9 tok/s bf16, 155.6 int8 for Llama-2-7B).
    pub w8_memory_eff: f64,
    /// The same for sub-8-bit weights (int4 AWQ/GPTQ, 4-6-bit GGUF), fitted to V03 (196.8
    /// tok/s int4, group 32): unpacking nibbles keeps these kernels further from the
    /// bandwidth roof.
    pub w4_memory_eff: f64,
}

impl Default for CostParams {
    fn default() -> Self {
        CostParams {
            gemm_compute_eff: 0.75,
            gemm_memory_eff: 0.85,
            attn_compute_eff: 0.50,
            attn_memory_eff: 0.70,
            elementwise_memory_eff: 0.60,
            prefill_attention_scale: None,
            framework: Framework::VllmV1,
            kernel_launch_us: None,
            allreduce_eff: None,
            allreduce_latency_us: None,
            custom_allreduce: None,
            overlap_exponent: Some(1.5),
            step_overhead_us: None,
            per_seq_overhead_us: None,
            dequant_compute_eff: 0.85,
            w8_memory_eff: 0.74,
            w4_memory_eff: 0.56,
        }
    }
}

/// Serving frameworks, by their CPU-side overheads (documented estimates: step scheduling
/// and input preparation per step, per sequence, and per kernel launch; override any of
/// them in `[cost]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Framework {
    /// vLLM V1: CUDA graphs, a separate scheduling process; ~0.3 ms a step.
    #[default]
    VllmV1,
    /// vLLM V0: scheduling and input preparation in the step's critical path; ~1 ms a step
    /// and more per sequence (the overhead vLLM 0.6's multi-step scheduling attacked).
    VllmV0,
    /// TensorRT-LLM: C++ runtime with in-flight batching; ~0.1 ms a step.
    TensorrtLlm,
    /// Hugging Face transformers `generate`: eager PyTorch, no CUDA graphs; ~3 ms a step
    /// and ~10 us a kernel launch.
    HfTransformers,
    /// llama.cpp server: C++ with CUDA graphs for batch-1 decode; ~0.2 ms a step.
    #[serde(rename = "llama.cpp")]
    LlamaCpp,
    /// Early vLLM (0.1.x, mid-2023), as Splitwise measured it on 8 x H100: Ray workers,
    /// no CUDA graphs, pre-FlashAttention-2 prefill attention. Its overheads and prefill
    /// attention efficiency are fitted by `sim calibrate` to those measurements
    /// (calibration.csv V22, V23; see VALIDATION.md).
    #[serde(rename = "vllm-2023")]
    Vllm2023,
}

/// The fitted profile of [`Framework::Vllm2023`]: (step overhead, per-sequence overhead,
/// kernel launch) in microseconds and the prefill attention efficiency relative to
/// FlashAttention-2. `sim calibrate` reproduces these (a test pins them).
pub const VLLM_2023_PROFILE: (f64, f64, f64, f64) = (18_000.0, 175.0, 6.0, 0.05);

/// Fixed cost of handing a batch's hidden states to the next pipeline stage, microseconds.
pub const P2P_LATENCY_US: f64 = 10.0;

/// Largest message vLLM's custom all-reduce takes (`max_size`, 8 MiB).
pub const CUSTOM_ALLREDUCE_MAX_BYTES: f64 = 8.0 * 1024.0 * 1024.0;
/// Fixed cost of a custom (one-shot, NVLink peer-to-peer) all-reduce, microseconds.
pub const CUSTOM_ALLREDUCE_LATENCY_US: f64 = 10.0;

impl Framework {
    /// Whether the framework all-reduces small messages with its own NVLink kernel.
    pub fn has_custom_allreduce(self) -> bool {
        matches!(
            self,
            Framework::VllmV1 | Framework::VllmV0 | Framework::TensorrtLlm
        )
    }

    /// (step overhead, per-sequence overhead, kernel launch), microseconds.
    pub fn overheads_us(self) -> (f64, f64, f64) {
        match self {
            Framework::VllmV1 => (300.0, 4.0, 2.0),
            Framework::VllmV0 => (1000.0, 12.0, 2.0),
            Framework::TensorrtLlm => (100.0, 1.0, 1.5),
            Framework::HfTransformers => (3000.0, 20.0, 10.0),
            Framework::LlamaCpp => (200.0, 8.0, 3.0),
            Framework::Vllm2023 => (
                VLLM_2023_PROFILE.0,
                VLLM_2023_PROFILE.1,
                VLLM_2023_PROFILE.2,
            ),
        }
    }

    /// Prefill attention efficiency relative to `attn_compute_eff` (FlashAttention-2):
    /// 1, except for frameworks whose attention kernels predate it.
    pub fn prefill_attention_scale(self) -> f64 {
        match self {
            Framework::Vllm2023 => VLLM_2023_PROFILE.3,
            _ => 1.0,
        }
    }
}

impl CostParams {
    /// Kernel launch overhead in effect, microseconds.
    pub fn kernel_launch_us(&self) -> f64 {
        self.kernel_launch_us
            .unwrap_or(self.framework.overheads_us().2)
    }

    /// CPU overhead per step in effect, microseconds.
    pub fn step_overhead_us(&self) -> f64 {
        self.step_overhead_us
            .unwrap_or(self.framework.overheads_us().0)
    }

    /// CPU overhead per sequence in effect, microseconds.
    pub fn per_seq_overhead_us(&self) -> f64 {
        self.per_seq_overhead_us
            .unwrap_or(self.framework.overheads_us().1)
    }

    /// Rejects efficiencies outside (0, 1] and negative overheads.
    pub fn validate(&self) -> Result<(), String> {
        let effs = [
            ("cost.gemm_compute_eff", self.gemm_compute_eff),
            ("cost.gemm_memory_eff", self.gemm_memory_eff),
            ("cost.attn_compute_eff", self.attn_compute_eff),
            ("cost.attn_memory_eff", self.attn_memory_eff),
            ("cost.elementwise_memory_eff", self.elementwise_memory_eff),
            (
                "cost.prefill_attention_scale",
                self.prefill_attention_scale.unwrap_or(1.0),
            ),
            ("cost.allreduce_eff", self.allreduce_eff.unwrap_or(1.0)),
            ("cost.dequant_compute_eff", self.dequant_compute_eff),
            ("cost.w8_memory_eff", self.w8_memory_eff),
            ("cost.w4_memory_eff", self.w4_memory_eff),
        ];
        for (k, v) in effs {
            if !(v > 0.0 && v <= 1.0) {
                return Err(format!("{k}: must be in (0, 1], got {v}"));
            }
        }
        if let Some(p) = self.overlap_exponent {
            // `inf` is the plain maximum.
            if p.is_nan() || p < 1.0 {
                return Err(format!(
                    "cost.overlap_exponent: must be at least 1 (inf: the plain maximum), got {p}"
                ));
            }
        }
        let overheads = [
            ("cost.kernel_launch_us", self.kernel_launch_us()),
            (
                "cost.allreduce_latency_us",
                self.allreduce_latency_us.unwrap_or(0.0),
            ),
            ("cost.step_overhead_us", self.step_overhead_us()),
            ("cost.per_seq_overhead_us", self.per_seq_overhead_us()),
        ];
        for (k, v) in overheads {
            if !(v >= 0.0 && v.is_finite()) {
                return Err(format!("{k}: must be a non-negative number, got {v}"));
            }
        }
        Ok(())
    }
}

/// A model deployed on hardware: everything the cost and memory formulas need.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Deployment {
    /// Model shape.
    pub model: ModelSpec,
    /// GPU type.
    pub gpu: Gpu,
    /// Tensor-parallel degree (GPUs per pipeline stage).
    pub tp: u32,
    /// Pipeline-parallel degree (stages, each holding `ceil(layers / pp)` layers).
    pub pp: u32,
    /// Weight format.
    pub dtype: Dtype,
    /// KV-cache format.
    pub kv_dtype: Dtype,
}

impl Deployment {
    /// Weight bytes held by each GPU (linear layers and embeddings split over TP, norms
    /// replicated).
    pub fn weight_bytes_per_gpu(&self) -> f64 {
        let m = &self.model;
        let linear =
            f64::from(self.layers_per_stage()) * m.layer_linear_params() * self.dtype.bytes();
        let heads = if m.tied_embeddings { 1.0 } else { 2.0 };
        // Under pipeline parallelism the first stage holds the embedding and the last the
        // LM head: a stage holds at most one of them.
        let stage_heads = if self.pp > 1 { 1.0 } else { heads };
        let embeddings = stage_heads * m.embedding_params() * self.dtype.embedding_bytes();
        // Norm weights stay in 16 bits (and are negligible).
        let norms = (m.params()
            - f64::from(m.layers) * m.layer_linear_params()
            - heads * m.embedding_params())
            * 2.0;
        (linear + embeddings) / f64::from(self.tp) + norms
    }

    /// Layers of the largest pipeline stage.
    pub fn layers_per_stage(&self) -> u32 {
        self.model.layers.div_ceil(self.pp.max(1))
    }

    /// GPUs of one replica (`tp x pp`).
    pub fn num_gpus(&self) -> u32 {
        self.tp * self.pp.max(1)
    }

    /// KV heads stored on each GPU (at least one: a head is replicated when TP exceeds the
    /// KV head count).
    pub fn kv_heads_per_gpu(&self) -> u32 {
        (self.model.kv_heads / self.tp).max(1)
    }

    /// KV bytes per token on one GPU: 2 (K and V) x layers x kv_heads x head_dim x bytes.
    pub fn kv_bytes_per_token(&self) -> f64 {
        kv_cache_bytes(
            self.layers_per_stage(),
            self.kv_heads_per_gpu(),
            self.model.head_dim,
            1,
            1,
            self.kv_dtype.bytes(),
        )
    }
}

/// Bytes of a KV cache: 2 x layers x kv_heads x head_dim x tokens x sequences x bytes.
pub fn kv_cache_bytes(
    layers: u32,
    kv_heads: u32,
    head_dim: u32,
    tokens: u64,
    seqs: u64,
    bytes: f64,
) -> f64 {
    2.0 * f64::from(layers)
        * f64::from(kv_heads)
        * f64::from(head_dim)
        * tokens as f64
        * seqs as f64
        * bytes
}

/// The memory plan of one GPU (vLLM's profile run, computed instead of measured).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryPlan {
    /// Device memory.
    pub gpu_mem_bytes: f64,
    /// Fraction vLLM may use.
    pub gpu_memory_utilization: f64,
    /// Weights per GPU.
    pub weight_bytes: f64,
    /// Activation peak at `max_num_batched_tokens` (plus the logits of `max_num_seqs`).
    pub activation_bytes: f64,
    /// CUDA context, cuBLAS/NCCL workspaces, CUDA graphs.
    pub runtime_overhead_bytes: f64,
    /// What is left for the KV cache.
    pub kv_budget_bytes: f64,
    /// KV bytes per token on this GPU.
    pub kv_bytes_per_token: f64,
    /// Tokens per block.
    pub block_size: u32,
    /// Bytes per block.
    pub block_bytes: f64,
    /// Blocks in the pool.
    pub num_blocks: u32,
    /// Token slots in the pool.
    pub pool_tokens: u64,
    /// Longest sequence accepted.
    pub max_model_len: u32,
    /// Sequences of `max_model_len` tokens that fit at once.
    pub max_concurrency_at_max_len: f64,
    /// CPU swap space per GPU, bytes (0 unless preemption swaps).
    pub swap_bytes: f64,
    /// Blocks of the CPU swap pool (`floor(swap_bytes / block_bytes)`).
    pub num_cpu_blocks: u32,
}

/// Why a deployment does not fit.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitError {
    /// Weights alone exceed the usable memory.
    #[error("model does not fit: {weights_gb:.1} GB of weights per GPU ({model}, {dtype}, tp={tp}) but only {usable_gb:.1} GB usable on a {gpu} ({mem_gb:.1} GB x gpu_memory_utilization {util}); use more GPUs (hardware.tp) or a smaller dtype")]
    Weights {
        /// Model name.
        model: String,
        /// Weight dtype.
        dtype: String,
        /// TP degree.
        tp: u32,
        /// GPU name.
        gpu: String,
        /// Weights per GPU, GB.
        weights_gb: f64,
        /// Usable memory, GB.
        usable_gb: f64,
        /// Device memory, GB.
        mem_gb: f64,
        /// Utilisation.
        util: f64,
    },
    /// `num_gpu_blocks_override` asks for more blocks than the memory holds.
    #[error("engine.num_gpu_blocks_override = {blocks} blocks, but only {fit} blocks of {block_bytes} bytes fit in the {left_gb:.2} GB left for the KV cache")]
    OverrideTooLarge {
        /// Blocks asked for.
        blocks: u32,
        /// Blocks that fit.
        fit: u64,
        /// Bytes per block.
        block_bytes: f64,
        /// Memory left for the KV cache, GB.
        left_gb: f64,
    },
    /// No room for a single KV block after weights, activations and overhead.
    #[error("no memory left for the KV cache: {usable_gb:.2} GB usable - {weights_gb:.2} GB weights - {act_gb:.2} GB activations - {overhead_gb:.2} GB runtime overhead = {left_gb:.2} GB, less than one block ({block_bytes} bytes)")]
    NoKvRoom {
        /// Usable memory, GB.
        usable_gb: f64,
        /// Weights, GB.
        weights_gb: f64,
        /// Activations, GB.
        act_gb: f64,
        /// Overhead, GB.
        overhead_gb: f64,
        /// What is left, GB.
        left_gb: f64,
        /// Block size in bytes.
        block_bytes: f64,
    },
}

/// Inputs of the memory plan besides the deployment.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryInputs {
    /// Fraction of device memory to use.
    pub gpu_memory_utilization: f64,
    /// Tokens per KV block.
    pub block_size: u32,
    /// Step token budget (activation peak).
    pub max_num_batched_tokens: u32,
    /// Most sequences per step (logits buffer).
    pub max_num_seqs: u32,
    /// Longest sequence.
    pub max_model_len: u32,
    /// Runtime overhead in bytes.
    pub runtime_overhead_bytes: f64,
    /// Use exactly this many blocks instead of the computed pool.
    pub num_gpu_blocks_override: Option<u32>,
    /// Speculative decoding's draft model on the same GPU: its weights, per GPU.
    pub draft_weight_bytes: f64,
    /// And its KV per token (each block holds the draft's KV of the same tokens, as vLLM
    /// allocates it).
    pub draft_kv_bytes_per_token: f64,
}

/// Plans one GPU's memory: `blocks = floor((mem x util - weights - activations - overhead)
/// / block_bytes)` (DESIGN §5).
pub fn memory_plan(d: &Deployment, inp: &MemoryInputs) -> Result<MemoryPlan, FitError> {
    let gb = 1e9;
    let m = &d.model;
    let usable = d.gpu.mem_bytes * inp.gpu_memory_utilization;
    let weights = d.weight_bytes_per_gpu() + inp.draft_weight_bytes;
    if weights >= usable {
        return Err(FitError::Weights {
            model: if inp.draft_weight_bytes > 0.0 {
                format!("{} and its draft model", m.name)
            } else {
                m.name.into()
            },
            dtype: d.dtype.as_str().into(),
            tp: d.tp,
            gpu: d.gpu.name.into(),
            weights_gb: weights / gb,
            usable_gb: usable / gb,
            mem_gb: d.gpu.mem_bytes / gb,
            util: inp.gpu_memory_utilization,
        });
    }
    // Peak activations of one layer at the full token budget, in the activation dtype
    // (16-bit): residual + normed input, QKV, attention output, gate/up and the SwiGLU
    // product; plus fp32 logits of one token per sequence.
    let tp = f64::from(d.tp);
    let t = f64::from(inp.max_num_batched_tokens);
    let qkv = f64::from((m.heads + 2 * m.kv_heads) * m.head_dim) / tp;
    let per_token = 2.0 * f64::from(m.hidden)
        + qkv
        + f64::from(m.heads * m.head_dim) / tp
        + 3.0 * f64::from(m.intermediate) / tp * f64::from(m.experts_per_token.max(1));
    let activations =
        t * per_token * 2.0 + f64::from(inp.max_num_seqs) * f64::from(m.vocab) / tp * 4.0;
    let kv_per_token = d.kv_bytes_per_token() + inp.draft_kv_bytes_per_token;
    let block_bytes = kv_per_token * f64::from(inp.block_size);
    let left = usable - weights - activations - inp.runtime_overhead_bytes;
    let computed_blocks = if left > 0.0 {
        (left / block_bytes).floor()
    } else {
        0.0
    };
    let num_blocks = match inp.num_gpu_blocks_override {
        Some(n) if f64::from(n) > computed_blocks => {
            return Err(FitError::OverrideTooLarge {
                blocks: n,
                fit: computed_blocks as u64,
                block_bytes,
                left_gb: left / gb,
            })
        }
        Some(n) => n,
        None => {
            if computed_blocks < 1.0 {
                return Err(FitError::NoKvRoom {
                    usable_gb: usable / gb,
                    weights_gb: weights / gb,
                    act_gb: activations / gb,
                    overhead_gb: inp.runtime_overhead_bytes / gb,
                    left_gb: left / gb,
                    block_bytes,
                });
            }
            computed_blocks.min(f64::from(u32::MAX)) as u32
        }
    };
    let pool_tokens = u64::from(num_blocks) * u64::from(inp.block_size);
    Ok(MemoryPlan {
        gpu_mem_bytes: d.gpu.mem_bytes,
        gpu_memory_utilization: inp.gpu_memory_utilization,
        weight_bytes: weights,
        activation_bytes: activations,
        runtime_overhead_bytes: inp.runtime_overhead_bytes,
        kv_budget_bytes: left.max(0.0),
        kv_bytes_per_token: kv_per_token,
        block_size: inp.block_size,
        block_bytes,
        num_blocks,
        pool_tokens,
        max_model_len: inp.max_model_len,
        max_concurrency_at_max_len: pool_tokens as f64 / f64::from(inp.max_model_len),
        swap_bytes: 0.0,
        num_cpu_blocks: 0,
    })
}

/// Time, FLOPs and bytes of one step, split by operator family.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepCost {
    /// Total seconds.
    pub seconds: f64,
    /// Linear layers (all layers), seconds.
    pub linear_s: f64,
    /// Attention (all layers), seconds.
    pub attention_s: f64,
    /// Element-wise kernels, seconds.
    pub elementwise_s: f64,
    /// All-reduces, seconds.
    pub allreduce_s: f64,
    /// LM head, seconds.
    pub lm_head_s: f64,
    /// CPU overhead, seconds.
    pub overhead_s: f64,
    /// KV block transfers before the step: swap over PCIe and copy-on-write copies in HBM,
    /// seconds.
    pub kv_transfer_s: f64,
    /// FLOPs per GPU.
    pub flops: f64,
    /// HBM bytes per GPU.
    pub bytes: f64,
}

/// The cost model: predicts step durations for a deployment.
#[derive(Debug, Clone)]
pub struct CostModel {
    d: Deployment,
    p: CostParams,
    block_size: u32,
    window: Option<u32>,
}

impl CostModel {
    /// A cost model of `d` with parameters `p`.
    pub fn new(d: Deployment, p: CostParams) -> Self {
        CostModel {
            d,
            p,
            block_size: 16,
            window: None,
        }
    }

    /// Sliding-window attention: each token attends to at most `window` tokens (`None`:
    /// the whole context).
    pub fn with_sliding_window(mut self, window: Option<u32>) -> Self {
        self.window = window;
        self
    }

    /// Sum over the positions `cached + 1 ..= cached + len` of the tokens each attends to,
    /// `min(position, window)`.
    fn attended(&self, cached: u32, len: u32) -> f64 {
        let (a, b) = (f64::from(cached) + 1.0, f64::from(cached) + f64::from(len));
        let full = |lo: f64, hi: f64| (lo + hi) * (hi - lo + 1.0) / 2.0;
        match self.window.map(f64::from) {
            Some(w) if b > w => {
                if a > w {
                    w * f64::from(len)
                } else {
                    full(a, w) + (b - w) * w
                }
            }
            _ => full(a, b),
        }
    }

    /// Sets the KV block size in tokens (for swap and copy costs; default 16).
    pub fn with_block_size(mut self, block_size: u32) -> Self {
        self.block_size = block_size;
        self
    }

    /// The deployment.
    pub fn deployment(&self) -> &Deployment {
        &self.d
    }

    fn roofline(&self, flops: f64, bytes: f64, eff_c: f64, eff_m: f64, peak: f64) -> f64 {
        let (tc, tm) = (flops / (peak * eff_c), bytes / (self.d.gpu.mem_bw * eff_m));
        let t = match self.p.overlap_exponent {
            // A soft maximum: compute and memory traffic overlap imperfectly near the ridge.
            Some(p) if tc > 0.0 && tm > 0.0 => {
                let hi = tc.max(tm);
                hi * ((tc / hi).powf(p) + (tm / hi).powf(p)).powf(1.0 / p)
            }
            _ => tc.max(tm),
        };
        t + self.p.kernel_launch_us() * 1e-6
    }

    /// Time of one `m x k` by `k x n` GEMM in the deployment's weight format (the weight
    /// is the `k x n` operand), on the same roofline as the linear layers.
    pub fn gemm_s(&self, m: f64, k: f64, n: f64) -> f64 {
        let flops = 2.0 * m * k * n;
        let bytes = k * n * self.d.dtype.bytes() + m * (k + n) * 2.0;
        self.roofline(
            flops,
            bytes,
            self.p.gemm_compute_eff,
            self.p.gemm_memory_eff,
            self.d.gpu.peak_flops(self.d.dtype),
        )
    }

    /// Time of one ring all-reduce of `bytes` over `tp` GPUs.
    pub fn allreduce_s(&self, bytes: f64) -> f64 {
        let tp = f64::from(self.d.tp);
        if self.d.tp <= 1 {
            return 0.0;
        }
        let eff = self.p.allreduce_eff.unwrap_or(self.d.gpu.allreduce_eff);
        // vLLM enables its custom all-reduce over NVLink, or on two PCIe GPUs.
        let peer_to_peer = self.d.gpu.link_bw > self.d.gpu.pcie_bw || self.d.tp == 2;
        let custom = self
            .p
            .custom_allreduce
            .unwrap_or(self.p.framework.has_custom_allreduce() && peer_to_peer);
        let latency = match self.p.allreduce_latency_us {
            Some(l) => l,
            None if custom && bytes <= CUSTOM_ALLREDUCE_MAX_BYTES => CUSTOM_ALLREDUCE_LATENCY_US,
            None => self.d.gpu.allreduce_latency_us,
        };
        2.0 * (tp - 1.0) / tp * bytes / (self.d.gpu.link_bw * eff) + latency * 1e-6
    }

    /// Cost of a step of `num_seqs` sequences that computes `prefill` chunks `(cached,
    /// len)` and `decode` work `(context, queries)` (tokens attended including the new
    /// ones; 1 query for a decode, `1 + k` for a speculative verify, whose queries read
    /// the context's K and V once), taking logits at `samples` positions.
    pub fn step_cost(
        &self,
        prefill: impl Iterator<Item = (u32, u32)>,
        decode: impl Iterator<Item = (u32, u32)>,
        samples: u32,
        num_seqs: u32,
    ) -> StepCost {
        let m = &self.d.model;
        let tp = f64::from(self.d.tp);
        let wb = self.d.dtype.bytes();
        let act = 2.0; // 16-bit activations
        let kvb = self.d.kv_dtype.bytes();
        let peak = self.d.gpu.peak_flops(self.d.dtype);
        let peak16 = self.d.gpu.peak_flops(Dtype::Bf16);
        let hd = f64::from(m.head_dim);
        let heads = f64::from(m.heads) / tp;
        let kv_heads = f64::from(self.d.kv_heads_per_gpu());
        let hidden = f64::from(m.hidden);
        let inter = f64::from(m.intermediate) / tp;

        // Prefill attention: FLOPs = 4 x heads x head_dim x sum len x (cached + len / 2);
        // bytes: the chunk's Q/K/V/O plus the cached K/V read.
        let (mut pf_flops, mut pf_bytes, mut prefill_tokens) = (0.0, 0.0, 0.0);
        let window = self.window.map_or(f64::INFINITY, f64::from);
        for (cached, len) in prefill {
            let (c, l) = (f64::from(cached), f64::from(len));
            // Causal attention: the token at position p attends to min(p, window) tokens.
            pf_flops += 4.0 * heads * hd * self.attended(cached, len);
            pf_bytes += l * (2.0 * heads + 2.0 * kv_heads) * hd * act
                + c.min(window) * 2.0 * kv_heads * hd * kvb;
            prefill_tokens += l;
        }
        // Decode attention: bandwidth-bound read of every context's K and V (once for all
        // the queries of a verify step).
        let (mut dc_flops, mut dc_bytes, mut decode_tokens) = (0.0, 0.0, 0.0);
        for (ctx, queries) in decode {
            let (c, q) = (f64::from(ctx).min(window), f64::from(queries.max(1)));
            dc_flops += 4.0 * heads * hd * c * q;
            dc_bytes += c * 2.0 * kv_heads * hd * kvb;
            decode_tokens += q;
        }
        let tokens = prefill_tokens + decode_tokens;

        // Linear layers of one layer: QKV, O, gate+up, down, as (K, N, FLOP multiplier,
        // weight-read multiplier). In a mixture of experts each token runs `k` experts and
        // the step reads the weights of every expert some token picked: with uniform
        // routing, `E (1 - (1 - k/E)^T)` distinct experts for `T` tokens (2 for one decode
        // token of Mixtral, all 8 beyond a few dozen tokens). Experts are split over TP.
        let q = f64::from(m.heads * m.head_dim) / tp;
        let kv = f64::from(m.kv_heads * m.head_dim) / tp;
        let (top_k, touched) = if m.is_moe() {
            let e = f64::from(m.num_experts);
            let k = f64::from(m.experts_per_token.clamp(1, m.num_experts));
            (k, e * (1.0 - (1.0 - k / e).powf(tokens)))
        } else {
            (1.0, 1.0)
        };
        let shapes = [
            (hidden, q + 2.0 * kv, 1.0, 1.0),
            (q, hidden, 1.0, 1.0),
            (hidden, 2.0 * inter, top_k, touched),
            (inter, hidden, top_k, touched),
        ];
        let (mut lin_s, mut lin_flops, mut lin_bytes) = (0.0, 0.0, 0.0);
        let (gemm_eff, weight_mem_eff) = match self.d.dtype {
            d if !d.is_weight_only() => (self.p.gemm_compute_eff, self.p.gemm_memory_eff),
            d => (
                self.p.gemm_compute_eff * self.p.dequant_compute_eff,
                self.p.gemm_memory_eff
                    * if d.bytes() >= 1.0 {
                        self.p.w8_memory_eff
                    } else {
                        self.p.w4_memory_eff
                    },
            ),
        };
        for (k, n, runs, reads) in shapes {
            let flops = 2.0 * tokens * k * n * runs;
            let bytes = k * n * wb * reads + tokens * (k + n) * act * runs;
            lin_s += self.roofline(flops, bytes, gemm_eff, weight_mem_eff, peak);
            lin_flops += flops;
            lin_bytes += bytes;
        }
        if m.is_moe() {
            // The router: a tiny (hidden x experts) GEMM and a top-k.
            let e = f64::from(m.num_experts);
            let (flops, bytes) = (2.0 * tokens * hidden * e, hidden * e * 2.0);
            lin_s += self.roofline(flops, bytes, gemm_eff, weight_mem_eff, peak);
            lin_flops += flops;
            lin_bytes += bytes;
        }
        let mut attn_s = 0.0;
        if prefill_tokens > 0.0 {
            attn_s += self.roofline(
                pf_flops,
                pf_bytes,
                self.p.attn_compute_eff
                    * self
                        .p
                        .prefill_attention_scale
                        .unwrap_or(self.p.framework.prefill_attention_scale()),
                self.p.attn_memory_eff,
                peak16,
            );
        }
        if decode_tokens > 0.0 {
            attn_s += self.roofline(
                dc_flops,
                dc_bytes,
                self.p.attn_compute_eff,
                self.p.attn_memory_eff,
                peak16,
            );
        }
        // Two RMSNorms, RoPE, SwiGLU and two residual adds: five memory-bound kernels.
        let ew_bytes = tokens * (6.0 * hidden + 2.0 * (q + kv) + 3.0 * inter * top_k) * act;
        let ew_s = ew_bytes / (self.d.gpu.mem_bw * self.p.elementwise_memory_eff)
            + 5.0 * self.p.kernel_launch_us() * 1e-6;
        let ar_s = 2.0 * self.allreduce_s(tokens * hidden * act);

        let layers = f64::from(m.layers);
        let s = f64::from(samples);
        let vocab = f64::from(m.vocab) / tp;
        let head_flops = 2.0 * s * hidden * vocab;
        let head_bytes = hidden * vocab * self.d.dtype.embedding_bytes() + s * vocab * 4.0;
        let head_s = if samples > 0 {
            self.roofline(
                head_flops,
                head_bytes,
                self.p.gemm_compute_eff,
                self.p.gemm_memory_eff,
                peak,
            ) + self.allreduce_s(s * vocab * 4.0 / tp.max(1.0))
        } else {
            0.0
        };
        let overhead_s =
            (self.p.step_overhead_us() + self.p.per_seq_overhead_us() * f64::from(num_seqs)) * 1e-6;

        // Pipeline parallelism: a batch passes the stages one after another (the engine
        // runs one batch at a time, without vLLM's overlapping virtual engines, so each
        // GPU idles (pp - 1) / pp of the step: the bubble), and hands its hidden states on
        // between stages.
        let pp = f64::from(self.d.pp.max(1));
        let p2p_s =
            (pp - 1.0) * (tokens * hidden * act / self.d.gpu.link_bw + P2P_LATENCY_US * 1e-6);
        let overhead_s = overhead_s + p2p_s;
        let linear_s = layers * lin_s;
        let attention_s = layers * attn_s;
        let elementwise_s = layers * ew_s;
        let allreduce_s = layers * ar_s;
        StepCost {
            seconds: linear_s + attention_s + elementwise_s + allreduce_s + head_s + overhead_s,
            linear_s,
            attention_s,
            elementwise_s,
            allreduce_s,
            lm_head_s: head_s,
            overhead_s,
            kv_transfer_s: 0.0,
            flops: layers * (lin_flops + pf_flops + dc_flops) + head_flops,
            bytes: layers * (lin_bytes + pf_bytes + dc_bytes + ew_bytes) + head_bytes,
        }
    }

    /// Bytes of one KV block on one GPU.
    pub fn block_bytes_per_gpu(&self) -> f64 {
        self.d.kv_bytes_per_token() * f64::from(self.block_size)
    }

    /// Time to move KV blocks before a step: `swapped` blocks over the host link (each GPU
    /// moves its shard over its own PCIe link, in parallel) and `copied` blocks inside HBM
    /// (read + write), as vLLM's swap and copy kernels do.
    pub fn kv_transfer_s(&self, swapped: usize, copied: usize) -> f64 {
        let b = self.block_bytes_per_gpu();
        let mut t = 0.0;
        if swapped > 0 {
            t += swapped as f64 * b / self.d.gpu.pcie_bw + self.p.kernel_launch_us() * 1e-6;
        }
        if copied > 0 {
            t += 2.0 * copied as f64 * b / (self.d.gpu.mem_bw * self.p.elementwise_memory_eff)
                + self.p.kernel_launch_us() * 1e-6;
        }
        t
    }

    /// Cost of a step plan.
    pub fn plan_cost(&self, plan: &StepPlan) -> StepCost {
        if plan.work.is_empty() {
            // Only block moves (swap-outs of a step that preempted without running).
            let t = self.kv_transfer_s(
                plan.swap_in.len() + plan.swap_out.len(),
                plan.block_copies.len(),
            );
            return StepCost {
                seconds: t,
                kv_transfer_s: t,
                ..StepCost::default()
            };
        }
        let prefill = plan
            .work
            .iter()
            .filter(|w| w.kind == WorkKind::Prefill)
            .map(|w| (w.start, w.len));
        let decode = plan
            .work
            .iter()
            .filter(|w| w.kind != WorkKind::Prefill)
            .map(|w| (w.context_len(), w.len));
        let samples = plan.num_logit_rows() as u32;
        let mut c = self.step_cost(prefill, decode, samples, plan.work.len() as u32);
        c.kv_transfer_s = self.kv_transfer_s(
            plan.swap_in.len() + plan.swap_out.len(),
            plan.block_copies.len(),
        );
        c.seconds += c.kv_transfer_s;
        c
    }
}

impl CostModel {
    /// Seconds a draft model (this cost model) spends on a step of `plan`: it prefills
    /// the step's prompt chunks too (it needs their KV), and drafts the `k` tokens of each
    /// verify work in `k` autoregressive steps over the verifying sequences (step `j`
    /// decodes at context `start + 1 + j`), the first step together with the prefills.
    /// A draft that shares the target's KV (self-speculation by its first layers) has no
    /// prefill of its own (`shares_kv`). The draft's rounds run inside the engine step,
    /// so they pay the GPU work, not the step's CPU overhead again.
    pub fn draft_seconds(&self, plan: &StepPlan, shares_kv: bool) -> f64 {
        let verify: Vec<(u32, u32)> = plan
            .work
            .iter()
            .filter(|w| w.kind == WorkKind::Verify)
            .map(|w| (w.start, w.len.saturating_sub(1)))
            .collect();
        let has_prefill = !shares_kv && plan.work.iter().any(|w| w.kind == WorkKind::Prefill);
        let rounds = verify.iter().map(|&(_, k)| k).max().unwrap_or(0);
        let mut s = 0.0;
        for j in 0..rounds.max(u32::from(has_prefill)) {
            let prefill = plan
                .work
                .iter()
                .filter(|w| has_prefill && j == 0 && w.kind == WorkKind::Prefill)
                .map(|w| (w.start, w.len));
            let decode = verify
                .iter()
                .filter(|&&(_, k)| k > j)
                .map(|&(start, _)| (start + 1 + j, 1));
            let n = verify.iter().filter(|&&(_, k)| k > j).count() as u32;
            let seqs = n + if has_prefill && j == 0 {
                plan.work
                    .iter()
                    .filter(|w| w.kind == WorkKind::Prefill)
                    .count() as u32
            } else {
                0
            };
            let c = self.step_cost(prefill, decode, n, seqs);
            s += c.seconds - c.overhead_s;
        }
        s
    }
}

/// The cost model as an engine backend.
pub struct CostModelBackend {
    model: CostModel,
    /// The draft model of speculative decoding (`method = draft-model`), costed on the
    /// same GPUs before each verify, and whether it shares the target's KV.
    draft: Option<(CostModel, bool)>,
    sampled: Vec<u32>,
}

impl CostModelBackend {
    /// Wraps a cost model.
    pub fn new(model: CostModel) -> Self {
        CostModelBackend {
            model,
            draft: None,
            sampled: Vec::new(),
        }
    }

    /// Adds a draft model whose drafting time each step pays (`shares_kv`: a
    /// self-speculation draft, the target's first layers, with no prefill of its own).
    pub fn with_draft(mut self, draft: CostModel, shares_kv: bool) -> Self {
        self.draft = Some((draft, shares_kv));
        self
    }
}

impl Backend for CostModelBackend {
    fn name(&self) -> &str {
        "model"
    }

    fn execute(&mut self, plan: &StepPlan) -> Result<StepOutcome, BackendError> {
        let mut c = self.model.plan_cost(plan);
        if let Some((draft, shares_kv)) = &self.draft {
            c.seconds += draft.draft_seconds(plan, *shares_kv);
        }
        let d = &self.model.d;
        let duration = (c.seconds * 1e9).round().max(1.0) as u64;
        // Synthetic acceptance stands in for verification.
        let accepted = engine::plan::simulated_acceptances(plan);
        let samples = StepOutcome::expected_samples(plan, &accepted);
        self.sampled.clear();
        self.sampled.resize(samples, SIM_TOKEN);
        Ok(StepOutcome {
            duration,
            sampled: self.sampled.clone(),
            accepted,
            // The stages of a pipeline share the step's traffic and FLOPs.
            mbu: c.bytes / f64::from(d.pp.max(1)) / (c.seconds * d.gpu.mem_bw),
            mfu: c.flops / f64::from(d.pp.max(1)) / (c.seconds * d.gpu.peak_flops(d.dtype)),
        })
    }
}
