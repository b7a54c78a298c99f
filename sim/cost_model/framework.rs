//! Serving frameworks ([`Framework`]) as the cost model sees them: the CPU time each spends
//! per step, per sequence and per kernel launch, whether it has its own all-reduce kernel for
//! small messages, and the efficiency of its prefill attention. `vllm-2023` is a profile
//! fitted by `sim calibrate` (see [`crate::cost_model::calibration`]).

use serde::{Deserialize, Serialize};

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

/// Largest message vLLM's custom all-reduce takes (`max_size`, 8 MiB).
pub const CUSTOM_ALLREDUCE_MAX_BYTES: f64 = 8.0 * 1024.0 * 1024.0;
/// Fixed cost of a custom (one-shot, NVLink peer-to-peer) all-reduce over a pair of GPUs,
/// microseconds (each GPU beyond adds `cost.allreduce_peer_us`).
pub const CUSTOM_ALLREDUCE_LATENCY_US: f64 = 10.0;
/// The most GPUs a custom all-reduce takes (vLLM's `_SUPPORTED_WORLD_SIZES`: 2, 4, 6, 8).
pub const CUSTOM_ALLREDUCE_MAX_GPUS: u32 = 8;

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
