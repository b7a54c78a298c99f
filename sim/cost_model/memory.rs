//! The memory plan of one GPU ([`memory_plan`], DESIGN §5): usable memory minus weights,
//! activation peak and runtime overhead, divided into KV blocks, as vLLM's profile run sizes
//! its pool; a deployment that does not fit is a [`FitError`] with the numbers.

use engine::block_manager::{max_side_pages, SideGroup};
use serde::Serialize;

use super::Deployment;

/// The memory plan of one GPU (vLLM's profile run, computed instead of measured).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryPlan {
    /// Device memory.
    pub gpu_mem_bytes: f64,
    /// Fraction vLLM may use.
    pub gpu_memory_utilization: f64,
    /// Weights per GPU.
    pub weight_bytes: f64,
    /// The profile run's peak: the forward pass at `max_num_batched_tokens` or the sampler
    /// over `max_num_seqs` rows, whichever is higher.
    pub activation_bytes: f64,
    /// CUDA context, cuBLAS/NCCL workspaces, CUDA graphs.
    pub runtime_overhead_bytes: f64,
    /// Bytes one sequence holds whatever its length: a hybrid model's sliding-window blocks
    /// and linear-attention state (0 for a uniform model; not in `plan.json` then). They
    /// come out of the same pool, page by page, as vLLM's hybrid allocator takes them.
    #[serde(skip_serializing_if = "is_zero")]
    pub seq_state_bytes: f64,
    /// A hybrid model's groups of sliding or linear-attention layers beside the
    /// full-attention table (what the block manager keeps side tables for).
    #[serde(skip)]
    pub side_groups: Vec<SideGroup>,
    /// The most pages one sequence's side groups hold (its window and a step's tokens, its
    /// states): `pool_tokens` leaves them out (0 for a uniform model; not in `plan.json`).
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub side_pages_per_seq: u32,
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
    /// Host memory per GPU of the KV offload tier under the prefix cache, bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub offload_bytes: f64,
    /// Blocks of the offload tier (`floor(offload_bytes / block_bytes)`).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub offload_blocks: u32,
    /// Local disk per GPU of the tier under the CPU tier, bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub disk_bytes: f64,
    /// Blocks of the disk tier (`floor(disk_bytes / block_bytes)`).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub disk_blocks: u32,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn is_zero_u32(x: &u32) -> bool {
    *x == 0
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
    /// A hybrid model's pool cannot hold one sequence's sliding windows and states beside
    /// a block of its own.
    #[error("the KV pool of {blocks} blocks ({block_bytes} bytes each) cannot hold one sequence: its sliding windows and linear-attention states take {side_pages} blocks ({side_gb:.2} GB) beside its own; give the KV cache more memory or lower engine.max_num_batched_tokens")]
    NoSeqRoom {
        /// Blocks in the pool.
        blocks: u32,
        /// Bytes per block.
        block_bytes: f64,
        /// Blocks one sequence's side groups hold.
        side_pages: u32,
        /// Those in GB.
        side_gb: f64,
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

/// Rows of the top-k/top-p sampling kernel's buffer (one per SM; 128 on an RTX 4090, 132 on
/// an H100).
const SAMPLER_ROWS: f64 = 128.0;

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
    /// Sliding layers hold every token like full attention (vLLM's
    /// `--disable-hybrid-kv-cache-manager`; `engine.disable_sliding_window`).
    pub disable_hybrid: bool,
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
    // vLLM's profile run (V1, 0.19): a forward pass over the full token budget, then the
    // sampler over `max_num_seqs` rows; the pool is what the higher of the two peaks leaves.
    // The forward peak is one layer's activations in 16 bits: residual + normed input, QKV,
    // attention output, gate/up and the SwiGLU product. The sampler's is the logits in
    // 16 bits and in fp32, the probabilities, the sampling noise (fp32 each), and the
    // top-k/top-p kernel's fp32 buffer of a row per SM (about 128).
    let tp = f64::from(d.tp);
    let t = f64::from(inp.max_num_batched_tokens);
    let qkv = f64::from((m.heads + 2 * m.kv_heads) * m.head_dim) / tp;
    // The widest MLP a token runs: its experts and the shared ones, or a dense layer's.
    let mlp_width = (f64::from(m.intermediate) * f64::from(m.experts_per_token.max(1))
        + f64::from(m.arch.shared_expert_intermediate))
    .max(f64::from(m.arch.dense_intermediate));
    let per_token = 2.0 * f64::from(m.hidden)
        + qkv
        + f64::from(m.heads * m.head_dim) / tp
        + m.mlp_matrices() * mlp_width / tp;
    let seqs = f64::from(inp.max_num_seqs);
    let vocab = f64::from(m.vocab);
    let forward = t * per_token * 2.0;
    let sampler = seqs * vocab * (2.0 + 3.0 * 4.0)
        + seqs.min(SAMPLER_ROWS) * vocab * 4.0
        + seqs * f64::from(m.hidden) * 2.0;
    let activations = forward.max(sampler);
    let kv_per_token = d.kv_bytes_per_token() + inp.draft_kv_bytes_per_token;
    let layout = d.page_layout(
        inp.block_size,
        inp.draft_kv_bytes_per_token,
        !inp.disable_hybrid,
    );
    let block_bytes = layout.page_bytes;
    // Sliding layers counted as full attention hold every token too.
    let kv_per_token = if layout.side.is_empty() && d.model.arch.sliding.is_some() {
        block_bytes / f64::from(inp.block_size)
    } else {
        kv_per_token
    };
    let seq_state = d.seq_state_bytes(inp.block_size);
    let left = usable - weights - activations - inp.runtime_overhead_bytes;
    // A block of 0 bytes (no layer whose cache grows: `ModelSpec` refuses such a model)
    // holds no blocks rather than u32::MAX of them.
    let computed_blocks = if left > 0.0 && block_bytes > 0.0 {
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
    // A step writes at most the token budget, or a whole prompt.
    let chunk = inp.max_num_batched_tokens.min(inp.max_model_len);
    let side_pages = max_side_pages(&layout.side, inp.block_size, chunk);
    if side_pages > 0 && num_blocks <= side_pages {
        return Err(FitError::NoSeqRoom {
            blocks: num_blocks,
            block_bytes,
            side_pages,
            side_gb: f64::from(side_pages) * block_bytes / gb,
        });
    }
    let pool_tokens = u64::from(num_blocks - side_pages) * u64::from(inp.block_size);
    let max_concurrency_at_max_len = if layout.side.is_empty() {
        pool_tokens as f64 / f64::from(inp.max_model_len)
    } else {
        // A decoding sequence of max length: its blocks, its windows and its states.
        let per_seq = inp.max_model_len.div_ceil(inp.block_size)
            + layout
                .side
                .iter()
                .map(|g| g.decode_pages(inp.block_size))
                .fold(0u32, u32::saturating_add);
        f64::from(num_blocks) / f64::from(per_seq.max(1))
    };
    Ok(MemoryPlan {
        gpu_mem_bytes: d.gpu.mem_bytes,
        gpu_memory_utilization: inp.gpu_memory_utilization,
        weight_bytes: weights,
        activation_bytes: activations,
        runtime_overhead_bytes: inp.runtime_overhead_bytes,
        seq_state_bytes: seq_state,
        side_groups: layout.side,
        side_pages_per_seq: side_pages,
        kv_budget_bytes: left.max(0.0),
        kv_bytes_per_token: kv_per_token,
        block_size: inp.block_size,
        block_bytes,
        num_blocks,
        pool_tokens,
        max_model_len: inp.max_model_len,
        max_concurrency_at_max_len,
        swap_bytes: 0.0,
        num_cpu_blocks: 0,
        offload_bytes: 0.0,
        offload_blocks: 0,
        disk_bytes: 0.0,
        disk_blocks: 0,
    })
}
