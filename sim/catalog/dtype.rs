//! Numeric formats of weights and KV caches ([`Dtype`]): bytes per element (scales and
//! zero points included) and which formats hold a KV cache or dequantize in the GEMM. The
//! cost model and the memory plan read them; scenarios name them (`model.dtype`).

use serde::{Deserialize, Serialize};

/// Numeric formats of weights and KV cache.
///
/// Floats (`fp32`, `fp16`, `bf16`, `fp8`) serve both; `fp8-block`, `nvfp4` and `mxfp4` are
/// weight formats run on the tensor cores of GPUs that have them; `int8` serves both (weight-only W8A16
/// for weights); the other formats are weight formats only: `w8a8` (int8 weights and
/// activations on int8 tensor cores, SmoothQuant), `int4` AWQ/GPTQ with group size 128, 64
/// or 32 (4-bit weights, an fp16 scale and a 4-bit zero point per group, dequantized to
/// 16-bit in the GEMM), and llama.cpp's GGUF block formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Dtype {
    /// 32-bit float.
    Fp32,
    /// IEEE half.
    Fp16,
    /// bfloat16.
    Bf16,
    /// 8-bit float (E4M3); Hopper and Ada tensor cores run it at twice the 16-bit peak.
    Fp8,
    /// int8 with per-channel scales; as weights, weight-only (W8A16).
    Int8,
    /// int8 weights and activations (W8A8): int8 tensor cores at twice the 16-bit peak.
    W8a8,
    /// 4-bit AWQ/GPTQ weights, group size 128.
    Int4,
    /// 4-bit AWQ/GPTQ weights, group size 64.
    Int4G64,
    /// 4-bit AWQ/GPTQ weights, group size 32.
    Int4G32,
    /// GGUF Q4_0: blocks of 32 weights, 4 bits + an fp16 scale (18 bytes).
    #[serde(rename = "q4_0")]
    Q4_0,
    /// GGUF Q4_1: blocks of 32, 4 bits + fp16 scale and minimum (20 bytes).
    #[serde(rename = "q4_1")]
    Q4_1,
    /// GGUF Q5_K: super-blocks of 256, 5.5 bits per weight (176 bytes).
    #[serde(rename = "q5_k")]
    Q5K,
    /// GGUF Q8_0: blocks of 32, 8 bits + an fp16 scale (34 bytes).
    #[serde(rename = "q8_0")]
    Q8_0,
    /// GGUF Q4_K_M: Q4_K (4.5 bits) with Q6_K for half the attention V and FFN down
    /// tensors; 4.89 bits per weight over a Llama model, as llama.cpp reports.
    #[serde(rename = "q4_k_m")]
    Q4KM,
    /// GGUF Q6_K: super-blocks of 256, 6.5625 bits per weight (210 bytes).
    #[serde(rename = "q6_k")]
    Q6K,
    /// fp8 (E4M3) with an fp32 scale per 128 x 128 block (DeepSeek-V3's and Qwen3's FP8
    /// checkpoints, aiconfigurator's `fp8_block`); embeddings and LM head in 16 bits.
    Fp8Block,
    /// NVIDIA's NVFP4: E2M1 with an fp8 (E4M3) scale per 16 values (4.5 bits); Blackwell
    /// tensor cores run it at twice the fp8 rate, older GPUs dequantize it.
    Nvfp4,
    /// OCP MXFP4: E2M1 with a power-of-two (E8M0) scale per 32 values (4.25 bits), as
    /// gpt-oss ships its experts.
    Mxfp4,
}

impl Dtype {
    /// Every format, for listings and tests.
    pub const ALL: [Dtype; 18] = [
        Dtype::Fp32,
        Dtype::Fp16,
        Dtype::Bf16,
        Dtype::Fp8,
        Dtype::Int8,
        Dtype::W8a8,
        Dtype::Int4,
        Dtype::Int4G64,
        Dtype::Int4G32,
        Dtype::Q4_0,
        Dtype::Q4_1,
        Dtype::Q5K,
        Dtype::Q8_0,
        Dtype::Q4KM,
        Dtype::Q6K,
        Dtype::Fp8Block,
        Dtype::Nvfp4,
        Dtype::Mxfp4,
    ];

    /// Bytes per element, scales and zero points included.
    pub fn bytes(self) -> f64 {
        // AWQ/GPTQ: half a byte per weight, plus per group an fp16 scale and a 4-bit zero.
        let int4 = |group: f64| 0.5 + 2.5 / group;
        match self {
            Dtype::Fp32 => 4.0,
            Dtype::Fp16 | Dtype::Bf16 => 2.0,
            Dtype::Fp8 | Dtype::Int8 | Dtype::W8a8 => 1.0,
            Dtype::Int4 => int4(128.0),
            Dtype::Int4G64 => int4(64.0),
            Dtype::Int4G32 => int4(32.0),
            Dtype::Q4_0 => 18.0 / 32.0,
            Dtype::Q4_1 => 20.0 / 32.0,
            Dtype::Q5K => 176.0 / 256.0,
            Dtype::Q8_0 => 34.0 / 32.0,
            Dtype::Q4KM => 4.89 / 8.0,
            Dtype::Q6K => 210.0 / 256.0,
            Dtype::Fp8Block => 1.0 + 4.0 / (128.0 * 128.0),
            Dtype::Nvfp4 => 0.5 + 1.0 / 16.0,
            Dtype::Mxfp4 => 0.5 + 1.0 / 32.0,
        }
    }

    /// Whether the format is a 4-bit float (NVFP4, MXFP4): in a mixture of experts only
    /// the MLPs are stored so (gpt-oss's experts; NVIDIA's FP4 DeepSeek-R1's routed and
    /// shared experts and dense layers), the attention projections and routers in 16 bits.
    pub fn is_fp4(self) -> bool {
        matches!(self, Dtype::Nvfp4 | Dtype::Mxfp4)
    }

    /// Whether the format is fp8 (per tensor or block-scaled).
    pub fn is_fp8(self) -> bool {
        matches!(self, Dtype::Fp8 | Dtype::Fp8Block)
    }

    /// Bytes per element of the embedding and LM head: AWQ, GPTQ, int8 and fp8 schemes keep
    /// them in 16 bits (NVIDIA's ModelOpt fp8 checkpoints exclude `lm_head`, as do Neural
    /// Magic's and Qwen's, and vLLM's online fp8 quantizes linear layers only); GGUF files
    /// quantize them too.
    pub fn embedding_bytes(self) -> f64 {
        match self {
            Dtype::Int8
            | Dtype::W8a8
            | Dtype::Int4
            | Dtype::Int4G64
            | Dtype::Int4G32
            | Dtype::Fp8
            | Dtype::Fp8Block
            | Dtype::Nvfp4
            | Dtype::Mxfp4 => 2.0,
            d => d.bytes(),
        }
    }

    /// Whether the GEMM dequantizes the weights to 16 bits before multiplying (weight-only
    /// quantization): compute runs at the 16-bit rate, slowed by the unpacking.
    pub fn is_weight_only(self) -> bool {
        !matches!(
            self,
            Dtype::Fp32
                | Dtype::Fp16
                | Dtype::Bf16
                | Dtype::Fp8
                | Dtype::Fp8Block
                | Dtype::W8a8
                | Dtype::Nvfp4
                | Dtype::Mxfp4
        )
    }

    /// Whether the format can hold a KV cache (`fp32`, `fp16`, `bf16`, `fp8`, `int8`).
    pub fn is_kv_format(self) -> bool {
        matches!(
            self,
            Dtype::Fp32 | Dtype::Fp16 | Dtype::Bf16 | Dtype::Fp8 | Dtype::Int8
        )
    }

    /// Scenario spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::Fp32 => "fp32",
            Dtype::Fp16 => "fp16",
            Dtype::Bf16 => "bf16",
            Dtype::Fp8 => "fp8",
            Dtype::Int8 => "int8",
            Dtype::W8a8 => "w8a8",
            Dtype::Int4 => "int4",
            Dtype::Int4G64 => "int4-g64",
            Dtype::Int4G32 => "int4-g32",
            Dtype::Q4_0 => "q4_0",
            Dtype::Q4_1 => "q4_1",
            Dtype::Q5K => "q5_k",
            Dtype::Q8_0 => "q8_0",
            Dtype::Q4KM => "q4_k_m",
            Dtype::Q6K => "q6_k",
            Dtype::Fp8Block => "fp8-block",
            Dtype::Nvfp4 => "nvfp4",
            Dtype::Mxfp4 => "mxfp4",
        }
    }
}
